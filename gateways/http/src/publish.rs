//! Publishing: one message whose body is the request body byte for byte, or a
//! JSON batch stored contiguously in one queue.

use rocketgate_core::clock::now_ms;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use rocketgate_core::broker::{MessagingApi, QueueChoice, SendResult};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::property;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::wire::{self, Json, Path, Query, RawBody};
use crate::{Ctx, Peer};

/// Query parameters of `POST /v1/topics/{topic}/messages`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishQuery {
    pub tag: Option<String>,
    /// Comma-separated business keys (lookup by key finds the message).
    pub keys: Option<String>,
    /// A delay level (`1`..`18`: 1s 5s 10s 30s 1m ... 2h) or a duration (`30s`, `1m30s`).
    pub delay: Option<String>,
    /// Deliver at this time (unix ms).
    pub deliver_at: Option<i64>,
    /// Messages with the same key go to the same queue, in order.
    pub sharding_key: Option<String>,
    /// This queue id.
    pub queue: Option<u32>,
    /// `begin`: store a transactional half message (see `/v1/transactions`).
    pub transaction: Option<String>,
    /// The producer group of a transactional message.
    pub producer_group: Option<String>,
}

/// Where a published message went.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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

/// The delay property a publish asks for, if any.
fn delay_property(
    delay: Option<&str>,
    deliver_at: Option<i64>,
) -> Result<Option<(&'static str, String)>> {
    match (delay, deliver_at) {
        (Some(_), Some(_)) => Err(Error::bad(
            "delay",
            "give `delay` or `deliver_at`, not both",
        )),
        (None, None) => Ok(None),
        (None, Some(at)) if at <= 0 => Err(Error::bad("deliver_at", "must be a unix time in ms")),
        (None, Some(at)) => Ok(Some((property::TIMER_DELIVER_MS, at.to_string()))),
        (Some(d), None) => {
            if let Ok(level) = d.parse::<u32>() {
                return Ok((level > 0).then(|| (property::DELAY_TIME_LEVEL, level.to_string())));
            }
            let dur = humantime::parse_duration(d).map_err(|_| {
                Error::bad(
                    "delay",
                    format!("{d:?} is neither a delay level (1..18) nor a duration like `30s`"),
                )
            })?;
            Ok((!dur.is_zero()).then(|| (property::TIMER_DELAY_MS, dur.as_millis().to_string())))
        }
    }
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
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
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
    if let Some(p) = delay_property(q.delay.as_deref(), q.deliver_at)? {
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
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchEntry {
    pub body: String,
    /// `utf8` (default) or `base64`.
    #[serde(default)]
    pub body_encoding: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub keys: Vec<String>,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// Query parameters of a batch publish.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchQuery {
    pub sharding_key: Option<String>,
    pub queue: Option<u32>,
}

/// The answer to a batch publish.
#[derive(Debug, Serialize, Deserialize)]
pub struct BatchPublished {
    pub messages: Vec<Published>,
}

/// `POST /v1/topics/{topic}/messages/batch`
pub async fn publish_batch<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(topic): Path<String>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    Query(q): Query<BatchQuery>,
    Json(entries): Json<Vec<BatchEntry>>,
) -> Result<(StatusCode, axum::Json<BatchPublished>)> {
    let started = Instant::now();
    check_user_topic(&topic)?;
    if entries.is_empty() {
        return Err(Error::bad("body", "the batch is empty"));
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
    fn delays_are_levels_or_durations() {
        assert_eq!(
            delay_property(Some("3"), None).unwrap(),
            Some(("DELAY", "3".into()))
        );
        assert_eq!(delay_property(Some("0"), None).unwrap(), None);
        assert_eq!(
            delay_property(Some("1m30s"), None).unwrap(),
            Some(("TIMER_DELAY_MS", "90000".into()))
        );
        assert_eq!(
            delay_property(None, Some(1_700_000_000_000)).unwrap(),
            Some(("TIMER_DELIVER_MS", "1700000000000".into()))
        );
        assert!(delay_property(Some("soon"), None).is_err());
        assert!(delay_property(Some("1s"), Some(5)).is_err());
        assert!(delay_property(None, Some(-1)).is_err());
    }
}
