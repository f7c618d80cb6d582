//! Publishing: one message whose body is the request body byte for byte, or a
//! JSON batch stored contiguously in one queue.

use rocketgate_core::clock::now_ms;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use rocketgate_core::broker::{DelayLimits, DelayRequest, MessagingApi, QueueChoice, SendResult};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::property;
use serde::{Deserialize, Serialize};

use crate::access::Caller;
use crate::error::{Error, Result};
use crate::wire::{self, JsonArray, Path, Query, RawBody};
use crate::{Ctx, Peer};

/// Query parameters of `POST /v1/topics/{topic}/messages`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PublishQuery {
    /// The message tag (MQTT topic `orders/a/b` = topic `orders`, tag `a/b`).
    #[param(min_length = 1)]
    pub tag: Option<String>,
    /// Comma-separated business keys (lookup by key finds the message).
    pub keys: Option<String>,
    /// A delay: a number of seconds (`60`) or a duration (`30s`, `1m30s`); at most
    /// 3 days. At most one of `delay`, `delay_level`, `deliver_at`.
    pub delay: Option<String>,
    /// A delay level of the broker's table (`1`..`18` by default: 1s 5s 10s 30s 1m ... 2h).
    pub delay_level: Option<String>,
    /// Deliver at this time (unix ms, not in the past, at most 3 days ahead).
    pub deliver_at: Option<i64>,
    /// Messages with the same key go to the same queue, in order.
    #[param(min_length = 1)]
    pub sharding_key: Option<String>,
    /// This queue id (not with `sharding_key`).
    pub queue: Option<u32>,
    /// `begin`: store a transactional half message (see `/v1/transactions`).
    #[param(pattern = "^begin$")]
    pub transaction: Option<String>,
    /// The producer group of a transactional message.
    pub producer_group: Option<String>,
}

/// Where a published message went.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Published {
    pub msg_id: String,
    pub topic: String,
    pub queue_id: u32,
    /// Absent for a transactional publish (known once committed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_offset: Option<u64>,
    /// Transactional publishes only: commit or roll back with this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction_id: Option<String>,
}

impl From<SendResult> for Published {
    fn from(r: SendResult) -> Self {
        Published {
            msg_id: r.append.msg_id,
            topic: r.topic,
            queue_id: r.queue_id,
            queue_offset: Some(r.append.queue_offset),
            transaction_id: None,
        }
    }
}

/// The delay property a publish asks for, if any. One way to say it: `delay` (a
/// bare number is seconds, as a `curl` user reads `delay=60`; or a duration),
/// `delay_level` (a level of the table, only when asked for by name) or
/// `deliver_at` (unix ms). Anything the broker cannot honour exactly — a level
/// outside the table, a delay beyond the maximum, a time in the past — is refused
/// with the reason, never clamped.
fn delay_property(
    limits: &DelayLimits,
    q: &PublishQuery,
    now_ms: i64,
) -> Result<Option<(&'static str, String)>> {
    let given = [
        ("delay", q.delay.is_some()),
        ("delay_level", q.delay_level.is_some()),
        ("deliver_at", q.deliver_at.is_some()),
    ];
    let mut named = given.iter().filter(|(_, set)| *set).map(|(n, _)| *n);
    let Some(field) = named.next() else {
        return Ok(None);
    };
    if let Some(other) = named.next() {
        return Err(Error::bad(
            other,
            format!(
                "give one of `delay`, `delay_level` and `deliver_at`, not `{field}` and `{other}`"
            ),
        ));
    }
    let request = if let Some(d) = q.delay.as_deref() {
        DelayRequest::After(parse_delay(d)?)
    } else if let Some(l) = q.delay_level.as_deref() {
        DelayRequest::Level(
            l.trim()
                .parse()
                .map_err(|_| Error::bad("delay_level", format!("{l:?} is not a level number")))?,
        )
    } else {
        DelayRequest::At(q.deliver_at.unwrap_or_default())
    };
    limits.property(request, now_ms).map_err(|e| match e {
        rocketgate_core::Error::InvalidArgument(reason) => Error::bad(field, reason),
        other => Error::Core(other),
    })
}

/// `delay=`: whole seconds, or a duration such as `30s`, `1m30s`, `2h`.
fn parse_delay(d: &str) -> Result<std::time::Duration> {
    let d = d.trim();
    if let Ok(secs) = d.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(secs));
    }
    humantime::parse_duration(d).map_err(|_| {
        Error::bad(
            "delay",
            format!(
                "{d:?} is neither a number of seconds (`60`) nor a duration (`30s`, \
                 `1m30s`); a delay level is `delay_level=`"
            ),
        )
    })
}

pub(crate) fn queue_choice(
    sharding_key: Option<String>,
    queue: Option<u32>,
) -> Result<QueueChoice> {
    match (sharding_key, queue) {
        (Some(_), Some(_)) => Err(Error::bad(
            "sharding_key",
            "give `sharding_key` or `queue`, not both",
        )),
        (Some(k), None) if k.is_empty() => Err(Error::bad("sharding_key", "is empty")),
        (Some(k), None) => Ok(QueueChoice::ShardingKey(k)),
        (None, Some(q)) => Ok(QueueChoice::Queue(q)),
        (None, None) => Ok(QueueChoice::RoundRobin),
    }
}

/// The HTTP door publishes to user topics only: retry, dead-letter and other
/// broker-owned topics are written by the broker (re-send dead letters through
/// `/v1/groups/{group}/dlq/resend`).
fn check_user_topic(topic: &str) -> Result<()> {
    if rocketgate_core::broker::schedule::is_system_topic(topic) {
        return Err(Error::Core(rocketgate_core::Error::NoPermission {
            topic: topic.to_owned(),
            operation: "write",
        }));
    }
    Ok(())
}

/// A core message with the mapping every door shares: tag, keys, properties, body.
fn message(
    topic: &str,
    tag: Option<String>,
    keys: Vec<String>,
    properties: Vec<(String, String)>,
    body: bytes::Bytes,
    peer: std::net::SocketAddr,
) -> Result<Message> {
    let mut m = Message::new(topic, 0, body);
    m.born_timestamp = now_ms();
    m.born_host = peer;
    match tag {
        Some(t) if t.is_empty() => return Err(Error::bad("tag", "is empty")),
        Some(t) if t.bytes().any(|b| b < 0x20) => {
            return Err(Error::bad("tag", "contains control characters"));
        }
        Some(t) => m = m.with_tags(t),
        None => {}
    }
    if !keys.is_empty() {
        m = m.with_keys(keys);
    }
    for (k, v) in properties {
        m.insert_property(k, v);
    }
    Ok(m)
}

/// `POST /v1/topics/{topic}/messages`
pub async fn publish<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
    ConnectInfo(Peer { addr: peer, .. }): ConnectInfo<Peer>,
    Query(q): Query<PublishQuery>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<(StatusCode, axum::Json<Published>)> {
    let started = Instant::now();
    check_user_topic(&topic)?;
    let keys = q
        .keys
        .as_deref()
        .map(wire::parse_keys)
        .transpose()?
        .unwrap_or_default();
    let mut props = wire::header_properties(&headers)?;
    if let Some(p) = delay_property(&ctx.api.delay_limits(), &q, now_ms())? {
        props.push((p.0.to_owned(), p.1));
    }
    let choice = queue_choice(q.sharding_key, q.queue)?;
    let size = body.len();
    let msg = message(&topic, q.tag, keys, props, body, peer)?;
    let published = match q.transaction.as_deref() {
        None => Published::from(ctx.api.send(msg, choice).await?),
        Some("begin") => begin_transaction(&ctx, q.producer_group, msg, choice).await?,
        Some(other) => {
            return Err(Error::bad(
                "transaction",
                format!("{other:?}: the only value is `begin`"),
            ));
        }
    };
    ctx.meters.published(&topic, 1, size, started);
    Ok((StatusCode::CREATED, axum::Json(published)))
}

/// One entry of a batch publish.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchEntry {
    pub body: String,
    /// `utf8` (default) or `base64`.
    #[serde(default)]
    #[schema(pattern = "^(utf8|text|base64)$")]
    pub body_encoding: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub keys: Vec<String>,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// Query parameters of a batch publish.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct BatchQuery {
    /// The whole batch goes to this key's queue.
    #[param(min_length = 1)]
    pub sharding_key: Option<String>,
    /// This queue id (not with `sharding_key`).
    pub queue: Option<u32>,
}

/// The answer to a batch publish.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchPublished {
    pub messages: Vec<Published>,
}

/// `POST /v1/topics/{topic}/messages/batch`
pub async fn publish_batch<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
    ConnectInfo(Peer { addr: peer, .. }): ConnectInfo<Peer>,
    Query(q): Query<BatchQuery>,
    caller: Option<axum::Extension<Caller>>,
    JsonArray(entries): JsonArray<BatchEntry>,
) -> Result<(StatusCode, axum::Json<BatchPublished>)> {
    let started = Instant::now();
    check_user_topic(&topic)?;
    if entries.is_empty() {
        return Err(Error::bad("body", "the batch is empty"));
    }
    // Each message's `topic/tag` is checked here (the access layer leaves batches
    // to this), all before anything is stored: a batch is stored whole or not at all.
    if let Some(axum::Extension(caller)) = &caller {
        allow_batch_tags(caller, &topic, &entries)?;
    }
    let mut messages = Vec::with_capacity(entries.len());
    let mut size = 0;
    for (i, e) in entries.into_iter().enumerate() {
        let field = format!("[{i}].body");
        let body = wire::decode_body(&e.body, e.body_encoding.as_deref(), &field)?;
        for k in &e.keys {
            if k.is_empty() || k.contains(char::is_whitespace) {
                return Err(Error::bad(format!("[{i}].keys"), format!("bad key {k:?}")));
            }
        }
        for (k, v) in &e.properties {
            wire::check_property(k, v)?;
        }
        size += body.len();
        let props = e.properties.into_iter().collect();
        messages.push(message(&topic, e.tag, e.keys, props, body, peer)?);
    }
    let n = messages.len();
    let choice = queue_choice(q.sharding_key, q.queue)?;
    let sent = ctx.api.send_batch(messages, choice).await?;
    ctx.meters.published(&topic, n, size, started);
    Ok((
        StatusCode::CREATED,
        axum::Json(BatchPublished {
            messages: sent.into_iter().map(Published::from).collect(),
        }),
    ))
}

/// Every message of a batch may be published on `topic/tag` (`topic` without a tag).
fn allow_batch_tags(caller: &Caller, topic: &str, entries: &[BatchEntry]) -> Result<()> {
    for (i, e) in entries.iter().enumerate() {
        let name = match e.tag.as_deref() {
            Some(tag) if !tag.is_empty() => format!("{topic}/{tag}"),
            _ => topic.to_owned(),
        };
        if !caller.grant.may_publish(&name) {
            metrics::counter!("rocketgate_acl_denied_total", "door" => "http", "action" => "publish")
                .increment(1);
            tracing::info!(user = %caller.user, %name, index = i, "HTTP batch denied by the ACL");
            return Err(Error::Forbidden {
                reason: format!(
                    "user {:?} is not allowed publishing to {name} (message [{i}] of the batch; nothing was stored)",
                    caller.user
                ),
            });
        }
    }
    Ok(())
}

/// Stores a transactional half message of `producer_group`. It gets a
/// `UNIQ_KEY`, so the `msg_id` answered now is the one consumers see after the
/// commit; `queue_offset` is unknown until then.
async fn begin_transaction<B: MessagingApi>(
    ctx: &Ctx<B>,
    producer_group: Option<String>,
    mut msg: Message,
    choice: QueueChoice,
) -> Result<Published> {
    let group = producer_group
        .filter(|g| !g.is_empty())
        .ok_or_else(|| Error::bad("producer_group", "required with `transaction=begin`"))?;
    let uniq = rocketgate_core::store::record::unique_id();
    msg.insert_property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq.clone());
    let half = ctx.api.send_half(&group, msg, choice).await?;
    Ok(Published {
        msg_id: uniq,
        topic: half.sent.topic,
        queue_id: half.sent.queue_id,
        queue_offset: None,
        transaction_id: Some(half.transaction.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_seconds_durations_levels_or_times() {
        let limits = rocketgate_core::broker::DelaySettings::default().limits();
        let now = 1_700_000_000_000;
        let ask = |delay: Option<&str>, level: Option<&str>, at: Option<i64>| {
            let q = PublishQuery {
                delay: delay.map(str::to_owned),
                delay_level: level.map(str::to_owned),
                deliver_at: at,
                ..PublishQuery::default()
            };
            delay_property(&limits, &q, now)
        };
        let refused = |r: Result<Option<(&'static str, String)>>| match r {
            Err(e) => e.to_string(),
            Ok(p) => panic!("accepted: {p:?}"),
        };
        // A bare number is seconds, never a level.
        assert_eq!(
            ask(Some("60"), None, None).unwrap(),
            Some(("TIMER_DELAY_MS", "60000".into()))
        );
        assert_eq!(ask(Some("0"), None, None).unwrap(), None);
        assert_eq!(
            ask(Some("1m30s"), None, None).unwrap(),
            Some(("TIMER_DELAY_MS", "90000".into()))
        );
        assert_eq!(
            ask(None, Some("3"), None).unwrap(),
            Some(("DELAY", "3".into()))
        );
        assert_eq!(
            ask(None, None, Some(now + 5_000)).unwrap(),
            Some(("TIMER_DELIVER_MS", (now + 5_000).to_string()))
        );
        assert!(refused(ask(Some("soon"), None, None)).starts_with("delay: "));
        assert!(refused(ask(None, Some("19"), None)).contains("levels are 1..18"));
        assert!(refused(ask(None, Some("x"), None)).starts_with("delay_level: "));
        assert!(refused(ask(None, None, Some(now - 1))).contains("in the past"));
        assert!(refused(ask(Some("4d"), None, None)).contains("exceeds the maximum"));
        assert!(refused(ask(Some("1s"), None, Some(now))).contains("not `delay` and"));
        assert!(refused(ask(Some("1s"), Some("1"), None)).starts_with("delay_level: "));
    }
}
