//! Administration: topics, consumer groups and their offsets, dead letters,
//! message lookup, broker and cluster information.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use rocketgate_core::broker::schedule;
use rocketgate_core::broker::{
    DeadLetters, Delayed, GroupInfo, MessagingApi, OffsetReset, Perm, Resolution, TopicConfig,
    TopicKind, TransactionHandle,
};
use serde::{Deserialize, Serialize};

use crate::consume::{self, ReplayQuery};
use crate::error::{Error, Result};
use crate::publish::Published;
use crate::wire::{Encoding, Json, MessageJson, Path, Query};
use crate::{Ctx, NodeStatus, ReplicationStatus};

/// A topic as the admin API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct TopicJson {
    pub name: String,
    pub read_queues: u32,
    pub write_queues: u32,
    /// `rw`, `r`, `w` or `-`.
    #[schema(pattern = "^(rw|r|w|-)$")]
    pub perm: String,
    pub system: bool,
}

/// `GET /v1/topics`
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopicList {
    pub topics: Vec<TopicJson>,
}

/// `GET /v1/topics/{topic}`: the topic with its per-queue offsets.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopicDetail {
    #[serde(flatten)]
    pub topic: TopicJson,
    pub queues: Vec<QueueJson>,
}

fn perm_name(p: Perm) -> String {
    match (p.is_readable(), p.is_writable()) {
        (true, true) => "rw",
        (true, false) => "r",
        (false, true) => "w",
        (false, false) => "-",
    }
    .into()
}

fn parse_perm(s: &str) -> Result<Perm> {
    match s {
        "rw" | "6" => Ok(Perm::READ_WRITE),
        "r" | "4" => Ok(Perm::READ),
        "w" | "2" => Ok(Perm::WRITE),
        "-" | "0" => Ok(Perm(0)),
        other => Err(Error::bad(
            "perm",
            format!("{other:?} is not rw, r, w or -"),
        )),
    }
}

impl From<&TopicConfig> for TopicJson {
    fn from(t: &TopicConfig) -> Self {
        TopicJson {
            name: t.name.clone(),
            read_queues: t.read_queues,
            write_queues: t.write_queues,
            perm: perm_name(t.perm),
            system: t.is_system(),
        }
    }
}

/// Body of `POST /v1/topics`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTopic {
    #[schema(pattern = "^[A-Za-z0-9%|_-]{1,127}$")]
    pub name: String,
    /// Read and write queues (default 4).
    #[serde(default)]
    pub queues: Option<u32>,
    /// `rw` (default), `r`, `w` or `-`.
    #[serde(default)]
    #[schema(pattern = "^(rw|r|w|-|6|4|2|0)$")]
    pub perm: Option<String>,
}

/// `POST /v1/topics`
pub async fn create_topic<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Json(body): Json<CreateTopic>,
) -> Result<(StatusCode, axum::Json<TopicJson>)> {
    schedule::validate_user_topic(&body.name).map_err(|e| Error::bad("name", e.to_string()))?;
    let mut config = TopicConfig::new(body.name, body.queues.unwrap_or(4));
    if let Some(p) = body.perm.as_deref() {
        config = config.with_perm(parse_perm(p)?);
    }
    let created = ctx.api.create_topic(config).await?;
    Ok((StatusCode::CREATED, axum::Json(TopicJson::from(&created))))
}

/// Body of `PATCH /v1/topics/{topic}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateTopic {
    #[serde(default)]
    pub read_queues: Option<u32>,
    #[serde(default)]
    pub write_queues: Option<u32>,
    /// `rw`, `r`, `w` or `-`.
    #[serde(default)]
    #[schema(pattern = "^(rw|r|w|-|6|4|2|0)$")]
    pub perm: Option<String>,
}

/// `PATCH /v1/topics/{topic}`
pub async fn update_topic<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
    Json(body): Json<UpdateTopic>,
) -> Result<axum::Json<TopicJson>> {
    let mut config = ctx.api.topic(&topic).await?;
    if let Some(n) = body.read_queues {
        config.read_queues = n;
    }
    if let Some(n) = body.write_queues {
        config.write_queues = n;
    }
    if let Some(p) = body.perm.as_deref() {
        config.perm = parse_perm(p)?;
    }
    let updated = ctx.api.update_topic(config).await?;
    Ok(axum::Json(TopicJson::from(&updated)))
}

/// Query of `GET /v1/topics`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListTopics {
    /// `user` (default), `system` or `all`.
    #[param(pattern = "^(user|system|all)$")]
    pub kind: Option<String>,
}

/// `GET /v1/topics`
pub async fn list_topics<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Query(q): Query<ListTopics>,
) -> Result<axum::Json<TopicList>> {
    let kind = match q.kind.as_deref().unwrap_or("user") {
        "user" => TopicKind::User,
        "system" => TopicKind::System,
        "all" => TopicKind::All,
        other => {
            return Err(Error::bad(
                "kind",
                format!("{other:?} is not user, system or all"),
            ));
        }
    };
    let topics: Vec<TopicJson> = ctx
        .api
        .topics(kind)
        .await?
        .iter()
        .map(TopicJson::from)
        .collect();
    Ok(axum::Json(TopicList { topics }))
}

/// `GET /v1/topics/{topic}`
pub async fn describe_topic<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
) -> Result<axum::Json<TopicDetail>> {
    let config = ctx.api.topic(&topic).await?;
    Ok(axum::Json(TopicDetail {
        topic: TopicJson::from(&config),
        queues: queue_stats(&ctx, &topic).await?,
    }))
}

/// Per-queue offsets of a topic.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueJson {
    pub queue_id: u32,
    pub min_offset: u64,
    pub max_offset: u64,
    pub last_store_ms: Option<i64>,
}

async fn queue_stats<B: MessagingApi>(ctx: &Ctx<B>, topic: &str) -> Result<Vec<QueueJson>> {
    Ok(ctx
        .api
        .queue_stats(topic)
        .await?
        .into_iter()
        .map(|q| QueueJson {
            queue_id: q.queue_id,
            min_offset: q.min_offset,
            max_offset: q.max_offset,
            last_store_ms: q.last_store_ms,
        })
        .collect())
}

/// `DELETE /v1/topics/{topic}`
pub async fn delete_topic<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
) -> Result<Response> {
    ctx.api.topic(&topic).await?;
    ctx.api.delete_topic(&topic).await?;
    Ok(consume::no_content())
}

/// Body of `POST /v1/groups/{group}/offsets/reset`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetOffsets {
    #[schema(pattern = "^[A-Za-z0-9%|_-]{1,127}$")]
    pub topic: String,
    /// `earliest`, `latest` or `timestamp`.
    #[schema(pattern = "^(earliest|latest|timestamp)$")]
    pub to: String,
    /// With `to: "timestamp"`: the first message stored at or after this unix ms.
    #[serde(default)]
    pub timestamp_ms: Option<i64>,
}

/// Where a reset put a group, per queue.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OffsetsReset {
    pub topic: String,
    pub offsets: Vec<QueueOffset>,
}

/// One queue's new offset.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueOffset {
    pub queue_id: u32,
    pub offset: u64,
}

/// `POST /v1/groups/{group}/offsets/reset`
pub async fn reset_offsets<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Json(body): Json<ResetOffsets>,
) -> Result<axum::Json<OffsetsReset>> {
    let to = match (body.to.as_str(), body.timestamp_ms) {
        ("earliest", None) => OffsetReset::Earliest,
        ("latest", None) => OffsetReset::Latest,
        ("timestamp", Some(ts)) => OffsetReset::Timestamp(ts),
        ("timestamp", None) => {
            return Err(Error::bad(
                "timestamp_ms",
                "required with `to: \"timestamp\"`",
            ));
        }
        ("earliest" | "latest", Some(_)) => {
            return Err(Error::bad("timestamp_ms", "only with `to: \"timestamp\"`"));
        }
        (other, _) => {
            return Err(Error::bad(
                "to",
                format!("{other:?} is not earliest, latest or timestamp"),
            ));
        }
    };
    let moved = ctx.api.reset_offset(&group, "", &body.topic, to).await?;
    let offsets = moved
        .into_iter()
        .map(|(queue_id, offset)| QueueOffset { queue_id, offset })
        .collect();
    Ok(axum::Json(OffsetsReset {
        topic: body.topic,
        offsets,
    }))
}

/// `GET /v1/groups/{group}/dlq`: the group's dead letters, by offset.
pub async fn list_dead_letters<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Query(q): Query<ReplayQuery>,
) -> Result<axum::Json<consume::Replay>> {
    schedule::validate_group(&group).map_err(|e| Error::bad("group", e.to_string()))?;
    let dlq = schedule::dlq_topic(&group);
    match consume::read_queue(&ctx, dlq, 0, &q).await {
        // No dead letter yet: the topic is created with the first one.
        Err(Error::Core(rocketgate_core::Error::TopicNotFound { .. })) => {
            Ok(axum::Json(consume::Replay {
                status: "no_new_message".into(),
                messages: Vec::new(),
                next_offset: 0,
                min_offset: 0,
                max_offset: 0,
            }))
        }
        r => Ok(axum::Json(r?)),
    }
}

/// Body of `POST /v1/groups/{group}/dlq/resend`: one `offset`, or `all`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resend {
    #[serde(default)]
    pub offset: Option<u64>,
    #[serde(default)]
    pub all: bool,
}

/// Dead letters sent back, where each went.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Resent {
    pub resent: Vec<Published>,
}

/// `POST /v1/groups/{group}/dlq/resend`: back to the original topic.
pub async fn resend_dead_letters<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Json(body): Json<Resend>,
) -> Result<axum::Json<Resent>> {
    let which = match (body.offset, body.all) {
        (Some(o), false) => DeadLetters::One(o),
        (None, true) => DeadLetters::All,
        _ => return Err(Error::bad("offset", "give `offset` or `all: true`")),
    };
    let sent = ctx.api.resend_dead_letters(&group, which).await;
    let sent = match sent {
        Err(rocketgate_core::Error::TopicNotFound { .. }) => {
            return Err(Error::MessageNotFound {
                what: format!("in the dead-letter queue of group {group:?}"),
            });
        }
        r => r?,
    };
    let resent: Vec<Published> = sent.into_iter().map(Published::from).collect();
    Ok(axum::Json(Resent { resent }))
}

/// `GET /v1/broker`: this broker.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BrokerInfo {
    pub broker_name: String,
    pub cluster: String,
    pub version: &'static str,
    pub uptime_ms: u64,
    pub user_topics: usize,
    /// The local store; `null` on a proxy (no store of its own).
    pub store: Option<NodeStatus>,
    pub max_message_size: usize,
    /// This node's broker group; `null` when it does not replicate.
    pub replication: Option<ReplicationStatus>,
}

/// `GET /v1/broker`
pub async fn broker_info<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
) -> Result<axum::Json<BrokerInfo>> {
    let status: Option<NodeStatus> = ctx.probe.status();
    let topics = ctx.api.topics(TopicKind::User).await?.len();
    Ok(axum::Json(BrokerInfo {
        broker_name: ctx.settings.broker_name.clone(),
        cluster: ctx.settings.cluster.clone(),
        version: env!("CARGO_PKG_VERSION"),
        uptime_ms: ctx.started.elapsed().as_millis() as u64,
        user_topics: topics,
        store: status,
        max_message_size: ctx.settings.max_body,
        replication: ctx.probe.replication(),
    }))
}

/// `GET /v1/cluster`: brokers and clusters as a NameServer knows them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClusterInfo {
    /// The NameServer that answered.
    pub namesrv: String,
    /// Cluster name to the names of its brokers.
    pub clusters: BTreeMap<String, Vec<String>>,
    pub brokers: Vec<BrokerAddrs>,
    /// This node's broker group: role, in-sync set, per-slave offset and lag
    /// (`null` when it does not replicate).
    pub replication: Option<ReplicationStatus>,
}

/// One broker group and its addresses.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BrokerAddrs {
    pub broker_name: String,
    pub cluster: String,
    /// Broker id (`0` = master) to its native address.
    pub addrs: BTreeMap<String, String>,
}

/// `GET /v1/cluster`: brokers and clusters as the NameServer knows them.
pub async fn cluster_info<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
) -> Result<axum::Json<ClusterInfo>> {
    let (addr, info) = crate::cluster::query(
        &ctx.settings.namesrv_addrs,
        ctx.settings.namesrv_tls.as_ref(),
    )
    .await?;
    let clusters = info
        .cluster_addr_table
        .iter()
        .map(|(c, names)| (c.clone(), names.iter().cloned().collect()))
        .collect();
    let brokers = info
        .broker_addr_table
        .values()
        .map(|b| BrokerAddrs {
            broker_name: b.broker_name.clone(),
            cluster: b.cluster.clone(),
            addrs: b
                .broker_addrs
                .iter()
                .map(|(id, a)| (id.to_string(), a.clone()))
                .collect(),
        })
        .collect();
    Ok(axum::Json(ClusterInfo {
        namesrv: addr.to_string(),
        clusters,
        brokers,
        replication: ctx.probe.replication(),
    }))
}

// ---- groups ----

/// `GET /v1/groups`
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GroupList {
    pub groups: Vec<String>,
}

/// `GET /v1/groups`
pub async fn list_groups<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
) -> Result<axum::Json<GroupList>> {
    let groups = ctx.api.groups().await?;
    Ok(axum::Json(GroupList { groups }))
}

/// A consumer group: members, settings, progress and lag.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GroupJson {
    pub group: String,
    /// `CLUSTERING` or `BROADCASTING` as its members last said; `null` for a group
    /// never seen in a heartbeat (HTTP consumers send none).
    pub mode: Option<&'static str>,
    /// Failed deliveries retried before the DLQ (the group's own, else the broker's).
    pub max_reconsume_times: u32,
    /// An ordered (FIFO) group.
    pub fifo: bool,
    /// Live members of native and MQTT consumers.
    pub members: Vec<MemberJson>,
    pub progress: Vec<ProgressJson>,
    /// The sum of `progress[].lag`.
    pub lag: u64,
}

/// A live member of a group.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MemberJson {
    pub member: String,
    pub subscriptions: Vec<SubscriptionJson>,
    /// Broker clock (unix ms) of its last heartbeat.
    pub last_seen_ms: i64,
}

/// What a member subscribed to.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SubscriptionJson {
    pub topic: String,
    pub filter_type: &'static str,
    pub expression: String,
}

/// How far a group got in one queue.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProgressJson {
    pub topic: String,
    pub queue_id: u32,
    /// The next offset to consume; `null`: never committed.
    pub committed: Option<u64>,
    pub max_offset: u64,
    pub lag: u64,
}

fn group_json(g: &GroupInfo) -> GroupJson {
    GroupJson {
        group: g.group.clone(),
        mode: g.mode.map(|m| m.as_str()),
        max_reconsume_times: g.max_reconsume_times,
        fifo: g.fifo,
        members: g
            .members
            .iter()
            .map(|m| MemberJson {
                member: m.member.clone(),
                subscriptions: m
                    .subscriptions
                    .iter()
                    .map(|s| SubscriptionJson {
                        topic: s.topic.clone(),
                        filter_type: s.filter_type.as_str(),
                        expression: s.expression.clone(),
                    })
                    .collect(),
                last_seen_ms: m.last_seen_ms,
            })
            .collect(),
        progress: g
            .progress
            .iter()
            .map(|p| ProgressJson {
                topic: p.topic.clone(),
                queue_id: p.queue_id,
                committed: p.committed,
                max_offset: p.max_offset,
                lag: p.lag,
            })
            .collect(),
        lag: g.progress.iter().map(|p| p.lag).sum::<u64>(),
    }
}

/// `GET /v1/groups/{group}`
pub async fn describe_group<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
) -> Result<axum::Json<GroupJson>> {
    let info = ctx.api.group_info(&group).await?;
    Ok(axum::Json(group_json(&info)))
}

/// Body of `PATCH /v1/groups/{group}`: the group's own settings.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupSettings {
    /// Failed deliveries retried before a message goes to `%DLQ%<group>`; `null`
    /// returns to the broker's `broker.max_reconsume_times`; absent: unchanged.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, maximum = 64)]
    pub max_reconsume_times: Option<Option<u32>>,
    /// An ordered (FIFO) group (`true`) or a concurrent one (`false`); absent:
    /// unchanged.
    pub fifo: Option<bool>,
}

/// A field that may be `null`: `Some(None)` when it is, `None` (by
/// `#[serde(default)]`) when it is absent.
fn present<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<u32>>, D::Error> {
    Ok(Some(Option::deserialize(d)?))
}

/// `PATCH /v1/groups/{group}`: change the group's own settings (kept across
/// restarts); answers with the group's description.
pub async fn update_group<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Json(body): Json<GroupSettings>,
) -> Result<axum::Json<GroupJson>> {
    if body
        .max_reconsume_times
        .flatten()
        .is_some_and(|n| n > MAX_RECONSUME_TIMES_LIMIT)
    {
        return Err(Error::bad(
            "max_reconsume_times",
            format!("at most {MAX_RECONSUME_TIMES_LIMIT}"),
        ));
    }
    if let Some(max) = body.max_reconsume_times {
        ctx.api.set_max_reconsume_times(&group, max).await?;
    }
    if let Some(fifo) = body.fifo {
        ctx.api.set_fifo(&group, fifo).await?;
    }
    let info = ctx.api.group_info(&group).await?;
    Ok(axum::Json(group_json(&info)))
}

/// RocketMQ caps a group's retries at 16 delay levels past the first; a larger
/// number is almost certainly a typo (and would keep a poison message for days).
const MAX_RECONSUME_TIMES_LIMIT: u32 = 64;

/// Samples consumer lag into `rocketgate_consumer_lag{group,topic}` (at scrape
/// time). Both labels are capped ([`rocketgate_core::labels`]): groups and topics
/// past the cap are summed under `other`.
pub(crate) async fn record_lag<B: MessagingApi>(ctx: &Ctx<B>) {
    let Ok(groups) = ctx.api.groups().await else {
        return;
    };
    let mut lags: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for group in groups {
        let Ok(info) = ctx.api.group_info(&group).await else {
            continue;
        };
        let g = rocketgate_core::labels::group(&group);
        for p in &info.progress {
            *lags
                .entry((g.clone(), rocketgate_core::labels::topic(&p.topic)))
                .or_default() += p.lag;
        }
    }
    for ((group, topic), lag) in lags {
        let labels = [("group", group), ("topic", topic)];
        metrics::gauge!("rocketgate_consumer_lag", &labels).set(lag as f64);
    }
}

// ---- lookup ----

/// Query of `GET /v1/messages/{msg_id}`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LookupQuery {
    /// `auto` (default) or `base64`.
    #[serde(default)]
    #[param(inline)]
    pub encoding: Encoding,
}

/// `GET /v1/messages/{msg_id}`: by offset message id or the producer's unique key.
pub async fn message_by_id<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(msg_id): Path<String>,
    Query(q): Query<LookupQuery>,
) -> Result<axum::Json<MessageJson>> {
    let d = ctx.api.message_by_id(&msg_id).await?;
    Ok(axum::Json(MessageJson::from_delivered(&d, q.encoding)?))
}

/// Query of `GET /v1/topics/{topic}/messages`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FindQuery {
    /// A business key (`KEYS`) or unique key; not with `begin_ms`/`end_ms`.
    #[param(min_length = 1)]
    pub key: Option<String>,
    /// Stored at or after (unix ms).
    pub begin_ms: Option<i64>,
    /// Stored at or before (unix ms).
    pub end_ms: Option<i64>,
    /// At most this many (default 32).
    #[param(minimum = 1, maximum = 1024)]
    pub max: Option<usize>,
    /// `auto` (default) or `base64`.
    #[serde(default)]
    #[param(inline)]
    pub encoding: Encoding,
}

/// `GET /v1/topics/{topic}/messages?key=…` (newest first) or `?begin_ms=…&end_ms=…`
/// (oldest first).
pub async fn messages_by_key<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
    Query(q): Query<FindQuery>,
) -> Result<axum::Json<consume::Messages>> {
    let max = q.max.unwrap_or(32);
    if max == 0 || max > 1024 {
        return Err(Error::bad("max", "must be between 1 and 1024"));
    }
    let found = match (q.key.as_deref(), q.begin_ms, q.end_ms) {
        (Some(""), _, _) => return Err(Error::bad("key", "is empty")),
        (Some(key), None, None) => ctx.api.messages_by_key(&topic, key, max).await?,
        (None, begin, end) if begin.is_some() || end.is_some() => {
            let (begin, end) = (begin.unwrap_or(0), end.unwrap_or(i64::MAX));
            if begin > end {
                return Err(Error::bad("begin_ms", "is after end_ms"));
            }
            ctx.api.messages_by_time(&topic, begin, end, max).await?
        }
        (Some(_), _, _) => {
            return Err(Error::bad("key", "give `key` or a time range, not both"));
        }
        (None, _, _) => {
            return Err(Error::bad("key", "give `key` or `begin_ms`/`end_ms`"));
        }
    };
    let messages = found
        .iter()
        .map(|d| MessageJson::from_delivered(d, q.encoding))
        .collect::<Result<_>>()?;
    Ok(axum::Json(consume::Messages { messages }))
}

// ---- delayed messages ----

/// A delayed message not delivered yet, as the admin API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct DelayedJson {
    /// The id the publish answered; `DELETE /v1/delayed/{msg_id}` cancels it.
    pub msg_id: String,
    /// The producer's `UNIQ_KEY`, when it set one (cancel takes it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uniq_key: Option<String>,
    pub topic: String,
    pub queue_id: u32,
    /// When it is due (unix ms, broker clock).
    pub deliver_at: i64,
    pub store_timestamp: i64,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    pub body_size: usize,
}

impl From<Delayed> for DelayedJson {
    fn from(d: Delayed) -> Self {
        DelayedJson {
            msg_id: d.msg_id,
            uniq_key: d.uniq_key,
            topic: d.topic,
            queue_id: d.queue_id,
            deliver_at: d.deliver_at_ms,
            store_timestamp: d.store_timestamp,
            tag: d.tags,
            keys: d.keys,
            body_size: d.body_size,
        }
    }
}

/// Query of `GET /v1/topics/{topic}/delayed`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DelayedQuery {
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 10_000)]
    pub max: Option<usize>,
}

/// `GET /v1/topics/{topic}/delayed`
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DelayedList {
    pub topic: String,
    /// Soonest first.
    pub delayed: Vec<DelayedJson>,
}

/// `GET /v1/topics/{topic}/delayed`: pending delayed messages, soonest first.
pub async fn list_delayed<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
    Query(q): Query<DelayedQuery>,
) -> Result<axum::Json<DelayedList>> {
    let max = q.max.unwrap_or(100);
    if max == 0 || max > 10_000 {
        return Err(Error::bad("max", "must be between 1 and 10000"));
    }
    let delayed: Vec<DelayedJson> = ctx
        .api
        .delayed(&topic, max)
        .await?
        .into_iter()
        .map(DelayedJson::from)
        .collect();
    Ok(axum::Json(DelayedList { topic, delayed }))
}

/// `DELETE /v1/delayed/{id}`: the message is never delivered, also after a
/// restart; answers what was cancelled.
pub async fn cancel_delayed<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(id): Path<String>,
) -> Result<axum::Json<DelayedJson>> {
    Ok(axum::Json(ctx.api.cancel_delayed(&id).await?.into()))
}

// ---- transactions ----

/// How a transaction ended; where the message went when committed.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TransactionEnd {
    pub transaction_id: String,
    /// `committed` or `rolled_back`.
    #[schema(pattern = "^(committed|rolled_back)$")]
    pub status: String,
    /// Committed only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Committed only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_id: Option<u32>,
    /// Committed only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_offset: Option<u64>,
}

async fn end<B: MessagingApi>(
    ctx: &Ctx<B>,
    id: &str,
    resolution: Resolution,
) -> Result<axum::Json<TransactionEnd>> {
    let handle: TransactionHandle = id.parse()?;
    let sent = ctx.api.end_transaction(&handle, resolution).await?;
    Ok(axum::Json(match sent {
        Some(r) => TransactionEnd {
            transaction_id: id.to_owned(),
            status: "committed".into(),
            topic: Some(r.topic),
            queue_id: Some(r.queue_id),
            queue_offset: Some(r.append.queue_offset),
        },
        None => TransactionEnd {
            transaction_id: id.to_owned(),
            status: "rolled_back".into(),
            topic: None,
            queue_id: None,
            queue_offset: None,
        },
    }))
}

/// `POST /v1/transactions/{id}/commit`: the half message becomes visible.
pub async fn commit<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(id): Path<String>,
) -> Result<axum::Json<TransactionEnd>> {
    end(&ctx, &id, Resolution::Commit).await
}

/// `POST /v1/transactions/{id}/rollback`: the half message is dropped.
pub async fn rollback<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(id): Path<String>,
) -> Result<axum::Json<TransactionEnd>> {
    end(&ctx, &id, Resolution::Rollback).await
}
