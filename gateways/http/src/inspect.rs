//! What operators, `rocketgate admin` and the dashboard ask a node (docs/http.md,
//! "Operations API"): `/healthz` and `/readyz`, a topic's per-queue status, a
//! group's progress and who consumes, who is connected through which door, a
//! message search with body previews, the MQTT sessions (and kicking one), and
//! the effective configuration.
//!
//! Only the HTTP mapping lives here. What the HTTP door cannot know itself (the
//! other doors' connections, the NameServer registration, the configuration's
//! sources) comes from the node through [`Probe`](crate::Probe)'s optional
//! methods, which the binary implements; HTTP POP consumers are remembered here
//! ([`PopConsumers`]). Every answer is a named serde struct.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rocketgate_core::broker::MessagingApi;
use rocketgate_core::sync::lock;
use serde::{Deserialize, Serialize};

use crate::Ctx;
use crate::admin::QueueJson;
use crate::error::{Error, Result};
use crate::wire::{Encoding, MessageJson, Path, Query};

// ---- types the node fills in (through `Probe`) ----

/// One readiness condition (`GET /readyz`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ReadyCheck {
    /// `store`, `disk`, `namesrv`, `doors`, `shutdown`, …
    pub name: String,
    pub ok: bool,
    /// What was found (why not ready, when not).
    pub detail: String,
}

/// Who is connected through which door (`GET /v1/connections`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ConnectionJson {
    /// `mqtt`, `websocket`, `http` (POP consumers seen recently) or `native`.
    pub door: String,
    /// MQTT client id, native client id (`ip@pid…`), HTTP: the client address.
    pub client_id: String,
    /// The client's address, where known.
    pub remote: Option<String>,
    /// Consumer groups it consumes as.
    pub groups: Vec<String>,
    /// Subscriptions (MQTT filters, `topic` or `topic:expression`).
    pub subscriptions: Vec<String>,
    /// Since when (unix ms), where known.
    pub since_ms: Option<i64>,
    /// Last heard of (unix ms), where known.
    pub last_seen_ms: Option<i64>,
    /// The authenticated user, where known.
    pub user: Option<String>,
}

/// One MQTT subscription.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct MqttSubscriptionJson {
    pub filter: String,
    pub qos: u8,
}

/// An MQTT session (`GET /v1/mqtt/sessions`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct MqttSessionJson {
    pub client_id: String,
    pub connected: bool,
    /// Clean start / clean session of the connection (while connected).
    pub clean_start: Option<bool>,
    /// Seconds the session outlives its connection; `null`: never expires.
    pub expiry_secs: Option<u32>,
    pub subscriptions: Vec<MqttSubscriptionJson>,
    /// Messages sent and not acknowledged yet.
    pub inflight: usize,
    /// A will is waiting (offline sessions).
    pub will_pending: bool,
    /// While connected: the client's address, since when (unix ms), 4 = 3.1.1 or 5.
    pub remote: Option<String>,
    pub since_ms: Option<i64>,
    pub protocol_version: Option<u8>,
    pub user: Option<String>,
}

/// `GET /v1/mqtt/sessions`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct MqttSessions {
    pub sessions: Vec<MqttSessionJson>,
}

/// The answer of `DELETE /v1/mqtt/sessions/{client_id}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct KickJson {
    pub client_id: String,
    /// A connection was closed (MQTT 5: DISCONNECT 0x98 Administrative action).
    pub disconnected: bool,
    /// The session was dropped too (`?discard=true`).
    pub discarded: bool,
}

/// What a kick found.
#[derive(Debug, Clone, PartialEq)]
pub enum KickOutcome {
    /// This node runs no MQTT door.
    NoMqtt,
    NotFound,
    Done(KickJson),
}

/// A future the node answers with.
pub type Answer<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One effective setting and where it came from (`GET /v1/config`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SettingJson {
    /// Dotted key, as in the TOML file and `ROCKETGATE_SECTION__KEY`.
    pub key: String,
    /// The value (`"<redacted>"` for secrets).
    pub value: serde_json::Value,
    /// `default`, `file <path>`, `env ROCKETGATE_…` or `flag --…`.
    pub source: String,
}

/// `GET /v1/config`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ConfigJson {
    pub settings: Vec<SettingJson>,
}

// ---- HTTP POP consumers ----

/// HTTP POP consumers are not connections: each receive may come from anywhere.
/// The door remembers who received as which group in the last
/// [`POP_SEEN_FOR_MS`], by (group, topic, client address).
#[derive(Debug, Default)]
pub struct PopConsumers(Mutex<HashMap<PopKey, PopSeen>>);

/// (group, topic, client address)
type PopKey = (String, String, IpAddr);
/// (last remote address with port, first seen ms, last seen ms)
type PopSeen = (String, i64, i64);

/// How long an HTTP consumer is listed after its last receive.
pub const POP_SEEN_FOR_MS: i64 = 5 * 60 * 1000;
/// At most this many remembered (group, topic, address) triples.
const POP_SEEN_MAX: usize = 10_000;

impl PopConsumers {
    /// A receive (or stream) by `remote` as `group` on `topic`.
    pub(crate) fn seen(&self, group: &str, topic: &str, remote: std::net::SocketAddr) {
        let now = rocketgate_core::clock::now_ms();
        let mut map = lock(&self.0);
        if map.len() >= POP_SEEN_MAX {
            map.retain(|_, (_, _, last)| now - *last < POP_SEEN_FOR_MS);
            if map.len() >= POP_SEEN_MAX {
                return;
            }
        }
        let e = map
            .entry((group.to_owned(), topic.to_owned(), remote.ip()))
            .or_insert_with(|| (remote.to_string(), now, now));
        e.0 = remote.to_string();
        e.2 = now;
    }

    /// Forgets the consumers of a deleted group.
    fn forget_group(&self, group: &str) {
        lock(&self.0).retain(|(g, _, _), _| g != group);
    }

    fn list(&self) -> Vec<ConnectionJson> {
        let now = rocketgate_core::clock::now_ms();
        let mut by_ip: BTreeMap<IpAddr, ConnectionJson> = BTreeMap::new();
        let mut map = lock(&self.0);
        map.retain(|_, (_, _, last)| now - *last < POP_SEEN_FOR_MS);
        for ((group, topic, ip), (remote, since, last)) in map.iter() {
            let c = by_ip.entry(*ip).or_insert_with(|| ConnectionJson {
                door: "http".into(),
                client_id: ip.to_string(),
                remote: Some(remote.clone()),
                groups: Vec::new(),
                subscriptions: Vec::new(),
                since_ms: Some(*since),
                last_seen_ms: Some(*last),
                user: None,
            });
            if !c.groups.contains(group) {
                c.groups.push(group.clone());
            }
            if !c.subscriptions.contains(topic) {
                c.subscriptions.push(topic.clone());
            }
            c.since_ms = c.since_ms.min(Some(*since));
            c.last_seen_ms = c.last_seen_ms.max(Some(*last));
        }
        by_ip.into_values().collect()
    }
}

// ---- health ----

/// `GET /healthz`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Healthz {
    pub status: String,
}

/// `GET /healthz`: 200 while the process serves HTTP.
pub async fn healthz<B: MessagingApi + 'static>(
    State(_ctx): State<Arc<Ctx<B>>>,
) -> axum::Json<Healthz> {
    axum::Json(Healthz {
        status: "ok".into(),
    })
}

/// `GET /readyz`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Readyz {
    /// `ready` or `not_ready`.
    pub status: String,
    pub checks: Vec<ReadyCheck>,
    /// The names of the checks that failed.
    pub not_ready: Vec<String>,
}

/// The checks of `/readyz`: the door's own (store writable, disk, shutting down)
/// and the node's ([`Probe::checks`](crate::Probe::checks): NameServer registration, doors listening).
pub(crate) fn ready_checks<B>(ctx: &Ctx<B>) -> Vec<ReadyCheck> {
    let check = |name: &str, ok: bool, detail: String| ReadyCheck {
        name: name.into(),
        ok,
        detail,
    };
    let mut checks = Vec::new();
    // A proxy has no store: its readiness is its doors and its view of the cluster.
    if let Some(s) = ctx.probe.status() {
        checks.extend([
            // The door starts after the store has recovered; it can still stop taking writes.
            check(
                "store",
                s.writes_stopped.is_none(),
                match &s.writes_stopped {
                    None => format!("recovered, written up to {}", s.log_written),
                    Some(why) => format!("writes are stopped until a restart: {why}"),
                },
            ),
            check(
                "disk",
                !s.disk_full(),
                format!(
                    "usage {:.1}% (hard limit {:.1}%)",
                    s.disk_usage * 100.0,
                    s.disk_hard_ratio * 100.0
                ),
            ),
        ]);
    }
    checks.extend(ctx.probe.checks());
    let stopping = *ctx.shutdown.borrow();
    checks.push(check(
        "shutdown",
        !stopping,
        if stopping { "shutting down" } else { "running" }.into(),
    ));
    checks
}

/// `GET /readyz`: 200 when every check passes, else 503; both list the checks.
pub async fn readyz<B: MessagingApi + 'static>(State(ctx): State<Arc<Ctx<B>>>) -> Response {
    let checks = ready_checks(&ctx);
    let not_ready: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.clone())
        .collect();
    let ok = not_ready.is_empty();
    let body = Readyz {
        status: if ok { "ready" } else { "not_ready" }.into(),
        checks,
        not_ready,
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

// ---- topics and groups ----

/// `GET /v1/topics/{topic}/status`
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopicStatus {
    pub topic: String,
    pub queues: Vec<QueueJson>,
    /// Messages stored over all queues (max - min).
    pub messages: u64,
    /// The newest store time over all queues (unix ms).
    pub last_store_ms: Option<i64>,
}

/// `GET /v1/topics/{topic}/status`: per queue the min/max offset and last store time.
pub async fn topic_status<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
) -> Result<axum::Json<TopicStatus>> {
    let queues: Vec<QueueJson> = ctx
        .api
        .queue_stats(&topic)
        .await?
        .into_iter()
        .map(|q| QueueJson {
            queue_id: q.queue_id,
            min_offset: q.min_offset,
            max_offset: q.max_offset,
            last_store_ms: q.last_store_ms,
        })
        .collect();
    Ok(axum::Json(TopicStatus {
        messages: queues.iter().map(|q| q.max_offset - q.min_offset).sum(),
        last_store_ms: queues.iter().filter_map(|q| q.last_store_ms).max(),
        topic,
        queues,
    }))
}

/// One queue of a group's progress.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct QueueLag {
    pub topic: String,
    pub queue_id: u32,
    /// One past the newest message of the queue.
    pub broker_offset: u64,
    /// The group's committed offset (next to consume); `null`: never committed.
    pub consumer_offset: Option<u64>,
    pub lag: u64,
    /// Store time (unix ms) of the queue's newest message.
    pub last_store_ms: Option<i64>,
}

/// `GET /v1/groups/{group}/progress`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct GroupProgress {
    pub group: String,
    /// Total lag over every queue.
    pub lag: u64,
    pub queues: Vec<QueueLag>,
    /// Who consumes as the group, through which door, with when it was last heard of.
    pub consumers: Vec<ConnectionJson>,
}

/// `GET /v1/groups/{group}/progress`: lag per topic and queue, and the consumers.
pub async fn group_progress<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
) -> Result<axum::Json<GroupProgress>> {
    let info = ctx.api.group_info(&group).await?;
    let mut last_store: HashMap<String, HashMap<u32, Option<i64>>> = HashMap::new();
    for p in &info.progress {
        if !last_store.contains_key(&p.topic) {
            let stats = ctx.api.queue_stats(&p.topic).await.unwrap_or_default();
            last_store.insert(
                p.topic.clone(),
                stats
                    .into_iter()
                    .map(|q| (q.queue_id, q.last_store_ms))
                    .collect(),
            );
        }
    }
    let queues: Vec<QueueLag> = info
        .progress
        .iter()
        .map(|p| QueueLag {
            topic: p.topic.clone(),
            queue_id: p.queue_id,
            broker_offset: p.max_offset,
            consumer_offset: p.committed,
            lag: p.lag,
            last_store_ms: last_store
                .get(&p.topic)
                .and_then(|m| m.get(&p.queue_id).copied().flatten()),
        })
        .collect();
    let consumers = group_connections_of(&ctx, &group).await?;
    Ok(axum::Json(GroupProgress {
        lag: queues.iter().map(|q| q.lag).sum(),
        group,
        queues,
        consumers,
    }))
}

/// `GET /v1/connections` and `GET /v1/groups/{group}/connections`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Connections {
    pub connections: Vec<ConnectionJson>,
}

/// Every connection the node knows of: the node's ([`Probe::connections`](crate::Probe::connections):
/// MQTT, WebSocket, native) and this door's POP consumers.
async fn all_connections<B: MessagingApi + 'static>(ctx: &Ctx<B>) -> Vec<ConnectionJson> {
    let mut out = ctx.probe.connections();
    // Native clients: the live members of every group (heartbeats).
    if let Ok(groups) = ctx.api.groups().await {
        for g in groups {
            if let Ok(info) = ctx.api.group_info(&g).await {
                for m in &info.members {
                    out.push(native_member(&g, m));
                }
            }
        }
    }
    out.extend(ctx.pop_consumers.list());
    merge_native(out)
}

fn native_member(group: &str, m: &rocketgate_core::broker::MemberInfo) -> ConnectionJson {
    ConnectionJson {
        door: "native".into(),
        client_id: m.member.clone(),
        remote: m.member.split('@').next().map(str::to_owned),
        groups: vec![group.to_owned()],
        subscriptions: m
            .subscriptions
            .iter()
            .map(|s| {
                if s.expression.is_empty() || s.expression == "*" {
                    s.topic.clone()
                } else {
                    format!("{}:{}", s.topic, s.expression)
                }
            })
            .collect(),
        since_ms: None,
        last_seen_ms: Some(m.last_seen_ms),
        user: None,
    }
}

/// One entry per native client over all its groups.
fn merge_native(list: Vec<ConnectionJson>) -> Vec<ConnectionJson> {
    let mut out: Vec<ConnectionJson> = Vec::with_capacity(list.len());
    for c in list {
        if c.door == "native"
            && let Some(prev) = out
                .iter_mut()
                .find(|p| p.door == "native" && p.client_id == c.client_id)
        {
            for g in c.groups {
                if !prev.groups.contains(&g) {
                    prev.groups.push(g);
                }
            }
            for s in c.subscriptions {
                if !prev.subscriptions.contains(&s) {
                    prev.subscriptions.push(s);
                }
            }
            prev.last_seen_ms = prev.last_seen_ms.max(c.last_seen_ms);
            continue;
        }
        out.push(c);
    }
    out
}

async fn group_connections_of<B: MessagingApi + 'static>(
    ctx: &Ctx<B>,
    group: &str,
) -> Result<Vec<ConnectionJson>> {
    let all = all_connections(ctx).await;
    Ok(all
        .into_iter()
        .filter(|c| c.groups.iter().any(|g| g == group))
        .collect())
}

/// `GET /v1/connections`: who is connected, through which door.
pub async fn connections<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
) -> axum::Json<Connections> {
    axum::Json(Connections {
        connections: all_connections(&ctx).await,
    })
}

/// `GET /v1/groups/{group}/connections`: who consumes as the group.
pub async fn group_connections<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
) -> Result<axum::Json<Connections>> {
    // An unknown group is a 404, as for its description.
    ctx.api.group_info(&group).await?;
    Ok(axum::Json(Connections {
        connections: group_connections_of(&ctx, &group).await?,
    }))
}

// ---- group deletion ----

/// Query of `DELETE /v1/groups/{group}`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeleteGroupQuery {
    /// Delete even while the group has consumers (native members, MQTT shared
    /// subscriptions, WebSocket subscriptions, HTTP consumers seen in the last 5
    /// minutes); one that consumes again starts the group anew.
    #[serde(default)]
    pub force: bool,
    /// Delete the group's dead-letter topic `%DLQ%<group>` too (kept by default).
    #[serde(default)]
    pub dlq: bool,
}

/// `DELETE /v1/groups/{group}`: what went.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct GroupDeletedJson {
    pub group: String,
    /// Committed queue offsets dropped (the group's and its broadcasting members').
    pub offsets: usize,
    /// POP queue states (cursor, in-flight messages) dropped.
    pub pop_queues: usize,
    /// Consumers connected when it was deleted (only with `force`).
    pub consumers: usize,
    /// Topics deleted: `%RETRY%<group>`, and `%DLQ%<group>` with `dlq=true`.
    pub topics: Vec<String>,
}

/// `DELETE /v1/groups/{group}?force=&dlq=`: deletes a consumer group (its settings,
/// offsets, POP state, retry topic; the DLQ on request). 409 `group_in_use` while
/// it has consumers on any door, unless `force`.
pub async fn delete_group<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Query(q): Query<DeleteGroupQuery>,
) -> Result<axum::Json<GroupDeletedJson>> {
    rocketgate_core::broker::schedule::validate_group(&group).map_err(|e| Error::Core(e.into()))?;
    let consumers = group_connections_of(&ctx, &group).await?;
    if !consumers.is_empty() && !q.force {
        let names: Vec<String> = consumers
            .iter()
            .map(|c| format!("{} {}", c.door, c.client_id))
            .collect();
        return Err(Error::Core(rocketgate_core::Error::GroupInUse {
            group,
            members: consumers.len(),
            names: names.join(", "),
        }));
    }
    let how = rocketgate_core::broker::GroupDeletion {
        force: q.force,
        dead_letters: q.dlq,
    };
    let deleted = ctx.api.delete_group(&group, how).await?;
    ctx.pop_consumers.forget_group(&group);
    Ok(axum::Json(GroupDeletedJson {
        group: deleted.group,
        offsets: deleted.offsets,
        pop_queues: deleted.pop_queues,
        consumers: consumers.len().max(deleted.members),
        topics: deleted.topics,
    }))
}

// ---- message search ----

/// Query of `GET /v1/messages`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    /// The topic (required).
    #[param(required = true, min_length = 1)]
    pub topic: Option<String>,
    /// A business key (`KEYS`) or unique key; not with `begin`/`end`.
    #[param(min_length = 1)]
    pub key: Option<String>,
    /// Stored at or after (unix ms).
    pub begin: Option<i64>,
    /// Stored at or before (unix ms).
    pub end: Option<i64>,
    /// At most this many (default 32, at most 1024).
    #[param(minimum = 1, maximum = 1024)]
    pub limit: Option<usize>,
    /// Body bytes shown (default 256; 0: the whole body).
    pub preview: Option<usize>,
    /// `auto` (default) or `base64`.
    #[serde(default)]
    #[param(inline)]
    pub encoding: Encoding,
}

/// One found message with a body preview.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct FoundMessage {
    #[serde(flatten)]
    pub message: MessageJson,
    /// The whole body's size in bytes.
    pub body_size: usize,
    /// `body` holds only the first `preview` bytes.
    pub body_truncated: bool,
}

/// `GET /v1/messages`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct SearchResult {
    pub topic: String,
    pub messages: Vec<FoundMessage>,
}

/// `GET /v1/messages?topic=T&key=K` (newest first) or `&begin=MS&end=MS` (oldest first).
pub async fn search<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Query(q): Query<SearchQuery>,
) -> Result<axum::Json<SearchResult>> {
    let topic = match q.topic.as_deref() {
        None | Some("") => return Err(Error::bad("topic", "required")),
        Some(t) => t.to_owned(),
    };
    let limit = q.limit.unwrap_or(32);
    if limit == 0 || limit > 1024 {
        return Err(Error::bad("limit", "must be between 1 and 1024"));
    }
    let preview = match q.preview {
        None => 256,
        Some(0) => usize::MAX,
        Some(n) => n,
    };
    let found = match (q.key.as_deref(), q.begin, q.end) {
        (Some(""), _, _) => return Err(Error::bad("key", "is empty")),
        (Some(key), None, None) => ctx.api.messages_by_key(&topic, key, limit).await?,
        (None, begin, end) if begin.is_some() || end.is_some() => {
            let (begin, end) = (begin.unwrap_or(0), end.unwrap_or(i64::MAX));
            if begin > end {
                return Err(Error::bad("begin", "is after end"));
            }
            ctx.api.messages_by_time(&topic, begin, end, limit).await?
        }
        (Some(_), _, _) => return Err(Error::bad("key", "give `key` or a time range, not both")),
        (None, _, _) => return Err(Error::bad("key", "give `key` or `begin`/`end`")),
    };
    let mut messages = Vec::with_capacity(found.len());
    for d in &found {
        let mut m = MessageJson::from_delivered(d, q.encoding)?;
        let view = d.view()?;
        let body = view.body();
        let truncated = body.len() > preview;
        if truncated {
            let (text, enc) = crate::wire::encode_body(&body[..preview], q.encoding);
            // (A cut inside a UTF-8 character makes the preview base64.)
            m.body = text;
            m.body_encoding = enc.into();
        }
        messages.push(FoundMessage {
            message: m,
            body_size: body.len(),
            body_truncated: truncated,
        });
    }
    Ok(axum::Json(SearchResult { topic, messages }))
}

// ---- MQTT sessions ----

/// `GET /v1/mqtt/sessions`: every session, connected or offline.
pub async fn mqtt_sessions<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
) -> Result<axum::Json<MqttSessions>> {
    match ctx.probe.mqtt_sessions() {
        Some(sessions) => Ok(axum::Json(MqttSessions { sessions })),
        None => Err(no_mqtt()),
    }
}

fn no_mqtt() -> Error {
    Error::NotFound {
        what: "MQTT door on this node".into(),
    }
}

/// Query of `DELETE /v1/mqtt/sessions/{client_id}`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct KickQuery {
    /// Drop the session too (subscriptions, offsets, pending will).
    #[serde(default)]
    pub discard: bool,
}

/// `DELETE /v1/mqtt/sessions/{client_id}`: disconnect the client (MQTT 5:
/// reason 0x98 Administrative action); `?discard=true` drops the session too.
pub async fn kick_mqtt<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(client_id): Path<String>,
    Query(q): Query<KickQuery>,
) -> Result<axum::Json<KickJson>> {
    match ctx.probe.kick_mqtt(&client_id, q.discard).await {
        KickOutcome::Done(k) => Ok(axum::Json(k)),
        KickOutcome::NotFound => Err(Error::NotFound {
            what: format!("MQTT session {client_id:?}"),
        }),
        KickOutcome::NoMqtt => Err(no_mqtt()),
    }
}

// ---- configuration ----

/// `GET /v1/config`: the effective settings and where each came from, secrets redacted.
pub async fn config<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
) -> Result<axum::Json<ConfigJson>> {
    match ctx.probe.config() {
        Some(settings) => Ok(axum::Json(ConfigJson { settings })),
        None => Err(Error::NotFound {
            what: "configuration (this server was built without one)".into(),
        }),
    }
}
