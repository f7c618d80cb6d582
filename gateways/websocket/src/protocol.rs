//! The `/v1/ws` JSON protocol: parsing client requests and building server
//! frames. Pure (no sockets, no broker); `docs/websocket.md` is the reference.
//!
//! Every client frame is a JSON object with an `op` and an optional `req` (any
//! JSON value) that the server echoes in the answer or error it causes.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rocketgate_core::broker::filter::FilterType;
use rocketgate_core::broker::{ConsumeMode, DelayRequest, Delivered, SendResult};
use rocketgate_core::store::record::encode_msg_id;
use rocketgate_core::store::record::property;
use rocketgate_core::store::{Message, RecordView};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// A request that could not be understood.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BadRequest {
    pub req: Option<Value>,
    pub code: &'static str,
    pub message: String,
}

/// One client request with its request id.
#[derive(Debug)]
pub(crate) struct Envelope {
    pub req: Option<Value>,
    pub request: Request,
}

#[derive(Debug)]
pub(crate) enum Request {
    Auth { token: String },
    Subscribe(Subscribe),
    Unsubscribe { id: String },
    Ack(AckTarget),
    Nack { target: AckTarget, delay_ms: u64 },
    Credit { id: String, n: u64 },
    Publish(Box<Publish>),
    Ping,
}

/// Where a subscription starts when its group has no committed progress: the
/// oldest stored message unless it says otherwise, as on every door
/// (docs/broker.md, "Where a new group starts").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Start {
    Latest,
    #[default]
    Earliest,
    /// This queue offset in every queue (clamped to what exists).
    Offset(u64),
    /// The first message stored at or after this time (ms since the epoch).
    Timestamp(i64),
}

#[derive(Debug, Clone)]
pub(crate) struct Subscribe {
    pub id: String,
    pub topic: String,
    pub group: String,
    pub mode: ConsumeMode,
    pub filter_type: FilterType,
    pub filter: String,
    pub start: Start,
    pub credit: u64,
    pub invisible_ms: Option<u64>,
    /// `"order": "fifo"`: the (clustering) group is an ordered (FIFO) group.
    pub fifo: bool,
}

/// What an `ack` or `nack` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AckTarget {
    /// One delivery, by the `receipt` of its `message` frame.
    Receipt(String),
    /// Every delivery of subscription `id` on `queue_id` up to and including `offset`.
    UpTo {
        id: String,
        queue_id: u32,
        offset: u64,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Publish {
    pub message: Message,
    pub sharding_key: Option<String>,
    /// Checked against the broker's limits when the publish runs (it needs them).
    pub delay: Option<DelayRequest>,
}

#[derive(Deserialize)]
struct RawSubscribe {
    id: String,
    topic: String,
    group: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    filter: Option<String>,
    #[serde(default)]
    filter_type: Option<String>,
    #[serde(default)]
    start: Option<Value>,
    #[serde(default)]
    credit: Option<u64>,
    #[serde(default)]
    invisible_ms: Option<u64>,
    #[serde(default)]
    order: Option<String>,
}

#[derive(Deserialize)]
struct RawAck {
    #[serde(default)]
    receipt: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    queue_id: Option<u32>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    delay_ms: Option<u64>,
}

#[derive(Deserialize)]
struct RawCredit {
    id: String,
    n: u64,
}

#[derive(Deserialize)]
struct RawId {
    id: String,
}

#[derive(Deserialize)]
struct RawAuth {
    token: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Keys {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct RawPublish {
    topic: String,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    keys: Option<Keys>,
    #[serde(default)]
    properties: Option<BTreeMap<String, String>>,
    body: String,
    #[serde(default)]
    encoding: Option<String>,
    #[serde(default)]
    sharding_key: Option<String>,
    /// Deliver this many ms after the store (the core's `TIMER_DELAY_MS`).
    #[serde(default)]
    delay_ms: Option<u64>,
    /// Deliver at this unix time in ms (the core's `TIMER_DELIVER_MS`).
    #[serde(default)]
    deliver_at: Option<i64>,
}

/// Parses one text frame.
pub(crate) fn parse(text: &str) -> Result<Envelope, BadRequest> {
    let value: Value = serde_json::from_str(text).map_err(|e| BadRequest {
        req: None,
        code: "invalid_json",
        message: format!("the frame is not JSON: {e}"),
    })?;
    let Value::Object(obj) = value else {
        return Err(BadRequest {
            req: None,
            code: "bad_request",
            message: "a request is a JSON object with an \"op\"".into(),
        });
    };
    let req = obj.get("req").cloned();
    let bad = |code: &'static str, message: String| BadRequest {
        req: req.clone(),
        code,
        message,
    };
    let op = match obj.get("op") {
        Some(Value::String(op)) => op.clone(),
        Some(_) => return Err(bad("bad_request", "\"op\" must be a string".into())),
        None => return Err(bad("missing_field", "missing field `op`".into())),
    };
    let value = Value::Object(obj);
    let request = match op.as_str() {
        "auth" => {
            let a: RawAuth = typed(&op, value).map_err(|(c, m)| bad(c, m))?;
            Request::Auth { token: a.token }
        }
        "subscribe" => Request::Subscribe(
            subscribe(typed(&op, value).map_err(|(c, m)| bad(c, m))?)
                .map_err(|m| bad("bad_request", m))?,
        ),
        "unsubscribe" => {
            let r: RawId = typed(&op, value).map_err(|(c, m)| bad(c, m))?;
            Request::Unsubscribe { id: r.id }
        }
        "ack" | "nack" => {
            let r: RawAck = typed(&op, value).map_err(|(c, m)| bad(c, m))?;
            let delay_ms = r.delay_ms.unwrap_or(0);
            if delay_ms > MAX_HOLD_MS {
                return Err(bad(
                    "bad_request",
                    format!("delay_ms {delay_ms} is above {MAX_HOLD_MS} (12 h)"),
                ));
            }
            let target = ack_target(r).map_err(|m| bad("missing_field", m))?;
            if op == "ack" {
                Request::Ack(target)
            } else {
                Request::Nack { target, delay_ms }
            }
        }
        "credit" => {
            let r: RawCredit = typed(&op, value).map_err(|(c, m)| bad(c, m))?;
            Request::Credit { id: r.id, n: r.n }
        }
        "publish" => {
            let r: RawPublish = typed(&op, value).map_err(|(c, m)| bad(c, m))?;
            Request::Publish(Box::new(publish(r).map_err(|m| bad("bad_request", m))?))
        }
        "ping" => Request::Ping,
        other => {
            return Err(bad(
                "unknown_op",
                format!(
                    "unknown op {other:?}; known: subscribe, unsubscribe, ack, nack, credit, publish, ping, auth"
                ),
            ));
        }
    };
    Ok(Envelope { req, request })
}

fn typed<T: for<'de> Deserialize<'de>>(
    op: &str,
    value: Value,
) -> Result<T, (&'static str, String)> {
    serde_json::from_value(value).map_err(|e| {
        let m = e.to_string();
        let code = if m.starts_with("missing field") {
            "missing_field"
        } else {
            "bad_request"
        };
        (code, format!("{op}: {m}"))
    })
}

/// The longest nack delay or invisible time a client may ask for (12 h).
pub(crate) const MAX_HOLD_MS: u64 = 12 * 3600 * 1000;

fn subscribe(r: RawSubscribe) -> Result<Subscribe, String> {
    valid_id(&r.id)?;
    if let Some(ms) = r.invisible_ms
        && !(1000..=MAX_HOLD_MS).contains(&ms)
    {
        return Err(format!(
            "invisible_ms {ms}: use 1000 (1 s) to {MAX_HOLD_MS} (12 h)"
        ));
    }
    let mode = match r.mode.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("clustering") => ConsumeMode::Clustering,
        Some("broadcasting") => ConsumeMode::Broadcasting,
        Some(m) => {
            return Err(format!(
                "mode {m:?}: use \"clustering\" or \"broadcasting\""
            ));
        }
    };
    let filter_type = match r
        .filter_type
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("tag") => FilterType::Tag,
        Some("sql92") | Some("sql") => FilterType::Sql92,
        Some(t) => return Err(format!("filter_type {t:?}: use \"tag\" or \"sql92\"")),
    };
    let start = match r.start {
        None | Some(Value::Null) => Start::Earliest,
        Some(Value::String(s)) if s == "latest" => Start::Latest,
        // A bare number is a time, as `start=<ms>` on HTTP and MQTT.
        Some(Value::Number(n)) => Start::Timestamp(
            n.as_i64()
                .ok_or("start as a number is a time in ms since the epoch")?,
        ),
        Some(Value::String(s)) if s == "earliest" => Start::Earliest,
        Some(Value::Object(o)) if o.len() == 1 && o.contains_key("offset") => Start::Offset(
            o["offset"]
                .as_u64()
                .ok_or("start.offset must be a non-negative integer")?,
        ),
        Some(Value::Object(o)) if o.len() == 1 && o.contains_key("timestamp") => Start::Timestamp(
            o["timestamp"]
                .as_i64()
                .ok_or("start.timestamp must be an integer (ms since the epoch)")?,
        ),
        Some(other) => {
            return Err(format!(
                "start {other}: use \"earliest\", \"latest\", a time in ms, {{\"offset\": N}} or {{\"timestamp\": MS}}"
            ));
        }
    };
    let fifo = match r.order.as_deref() {
        None | Some("concurrent") => false,
        Some("fifo") if mode == ConsumeMode::Clustering => true,
        Some("fifo") => {
            return Err(
                "order \"fifo\" is for clustering groups (a broadcasting member gets each queue in order)"
                    .into(),
            );
        }
        Some(o) => return Err(format!("order {o:?}: use \"fifo\" or \"concurrent\"")),
    };
    Ok(Subscribe {
        id: r.id,
        topic: r.topic,
        group: r.group,
        mode,
        filter_type,
        filter: r.filter.unwrap_or_else(|| "*".into()),
        start,
        credit: r.credit.unwrap_or(0),
        invisible_ms: r.invisible_ms,
        fifo,
    })
}

/// Subscription ids name a broadcasting member (offsets `group@id`) and appear
/// inside receipts, so they keep to RocketMQ's name characters.
pub(crate) fn valid_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 64 {
        return Err(format!("subscription id {id:?} must be 1 to 64 characters"));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
    {
        return Err(format!(
            "subscription id {id:?} contains {c:?}; use letters, digits, '_' and '-'"
        ));
    }
    Ok(())
}

fn ack_target(r: RawAck) -> Result<AckTarget, String> {
    match (r.receipt, r.id, r.queue_id, r.offset) {
        (Some(receipt), ..) => Ok(AckTarget::Receipt(receipt)),
        (None, Some(id), Some(queue_id), Some(offset)) => Ok(AckTarget::UpTo {
            id,
            queue_id,
            offset,
        }),
        _ => Err(
            "missing field `receipt` (or `id`, `queue_id` and `offset` to ack up to an offset)"
                .into(),
        ),
    }
}

/// True for property names a client may not set: RocketMQ's system properties
/// (all-uppercase names and `__`-prefixed ones) and the MQTT door's `mqtt.*`.
pub(crate) fn is_reserved_property(name: &str) -> bool {
    let all_upper = name.chars().any(|c| c.is_ascii_uppercase())
        && !name.chars().any(|c| c.is_ascii_lowercase());
    all_upper || name.starts_with("__") || name.starts_with("mqtt.")
}

/// True for properties shown to a consumer under `properties`: everything but
/// the store's system properties (tag and keys have their own fields).
fn is_user_property(name: &str) -> bool {
    name.starts_with("mqtt.") || !is_reserved_property(name)
}

fn publish(r: RawPublish) -> Result<Publish, String> {
    let body = match r.encoding.as_deref() {
        None | Some("utf8") | Some("text") => bytes::Bytes::from(r.body.into_bytes()),
        Some("base64") => bytes::Bytes::from(
            BASE64
                .decode(r.body.as_bytes())
                .map_err(|e| format!("body is not valid base64: {e}"))?,
        ),
        Some(e) => return Err(format!("encoding {e:?}: use \"utf8\" or \"base64\"")),
    };
    let mut message = Message::new(r.topic, 0, body);
    if let Some(tag) = r.tag.filter(|t| !t.is_empty()) {
        message = message.with_tags(tag);
    }
    let keys: Vec<String> = match r.keys {
        None => Vec::new(),
        Some(Keys::One(s)) => s
            .split(' ')
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect(),
        Some(Keys::Many(v)) => v,
    };
    if let Some(k) = keys.iter().find(|k| k.is_empty() || k.contains(' ')) {
        return Err(format!(
            "key {k:?}: keys are non-empty and contain no space"
        ));
    }
    if !keys.is_empty() {
        message = message.with_keys(keys);
    }
    for (name, value) in r.properties.unwrap_or_default() {
        if name.is_empty() || is_reserved_property(&name) {
            return Err(format!(
                "property {name:?} is reserved (all-uppercase, \"__\" and \"mqtt.\" names belong to the broker)"
            ));
        }
        message = message.with_property(name, value);
    }
    let delay = match (r.delay_ms, r.deliver_at) {
        (Some(_), Some(_)) => return Err("give delay_ms or deliver_at, not both".into()),
        (None, None) => None,
        (Some(ms), None) => Some(DelayRequest::After(Duration::from_millis(ms))),
        (None, Some(at)) if at <= 0 => return Err("deliver_at must be a unix time in ms".into()),
        (None, Some(at)) => Some(DelayRequest::At(at)),
    };
    Ok(Publish {
        message,
        sharding_key: r.sharding_key,
        delay,
    })
}

fn with_req(mut obj: Map<String, Value>, req: &Option<Value>) -> String {
    if let Some(r) = req {
        obj.insert("req".into(), r.clone());
    }
    Value::Object(obj).to_string()
}

fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `{"type":"error", ...}`.
pub(crate) fn error_frame(
    req: &Option<Value>,
    code: &str,
    message: &str,
    subscription: Option<&str>,
) -> String {
    let mut m = object(json!({"type": "error", "code": code, "message": message}));
    if let Some(s) = subscription {
        m.insert("subscription".into(), Value::String(s.to_owned()));
    }
    with_req(m, req)
}

pub(crate) fn pong_frame(req: &Option<Value>) -> String {
    with_req(object(json!({"type": "pong"})), req)
}

pub(crate) fn authenticated_frame(req: &Option<Value>) -> String {
    with_req(object(json!({"type": "authenticated"})), req)
}

pub(crate) fn subscribed_frame(
    req: &Option<Value>,
    id: &str,
    credit: u64,
    resumed: bool,
) -> String {
    with_req(
        object(json!({"type": "subscribed", "id": id, "credit": credit, "resumed": resumed})),
        req,
    )
}

pub(crate) fn unsubscribed_frame(req: &Option<Value>, id: &str) -> String {
    with_req(object(json!({"type": "unsubscribed", "id": id})), req)
}

pub(crate) fn send_result_frame(req: &Option<Value>, sent: &SendResult) -> String {
    with_req(
        object(json!({
            "type": "send_result",
            "msg_id": sent.append.msg_id,
            "topic": sent.topic,
            "queue_id": sent.queue_id,
            "queue_offset": sent.append.queue_offset,
            "store_timestamp": sent.append.store_timestamp,
        })),
        req,
    )
}

/// A `message` frame for one delivery.
pub(crate) fn message_frame(
    subscription: &str,
    delivered: &Delivered,
    receipt: &str,
    attempt: u32,
) -> Result<String, String> {
    let view =
        RecordView::parse(&delivered.record).map_err(|e| format!("unreadable record: {e}"))?;
    let msg_id = match view.property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX) {
        Some(id) => id.to_owned(),
        None => encode_msg_id(view.store_host(), view.phys_offset() as u64),
    };
    let properties: Map<String, Value> = view
        .properties()
        .filter(|(k, _)| is_user_property(k))
        .map(|(k, v)| (k.to_owned(), Value::String(v.to_owned())))
        .collect();
    let keys: Vec<&str> = view.keys().collect();
    let (body, encoding) = match std::str::from_utf8(view.body()) {
        Ok(s) => (s.to_owned(), "utf8"),
        Err(_) => (BASE64.encode(view.body()), "base64"),
    };
    Ok(json!({
        "type": "message",
        "subscription": subscription,
        "msg_id": msg_id,
        "topic": view.topic(),
        "queue_id": delivered.queue_id,
        "queue_offset": delivered.queue_offset,
        "tag": view.tags(),
        "keys": keys,
        "properties": properties,
        "body": body,
        "encoding": encoding,
        "receipt": receipt,
        "attempt": attempt,
        "reconsume_times": view.reconsume_times(),
        "born_timestamp": view.born_timestamp(),
        "store_timestamp": view.store_timestamp(),
    })
    .to_string())
}

/// An error frame's code and message for a core error.
pub(crate) fn error_code(e: &rocketgate_core::Error) -> (&'static str, String) {
    use rocketgate_core::Error as E;
    let code = match e {
        E::TopicNotFound { .. } => "topic_not_found",
        E::NoPermission { .. } => "forbidden",
        E::InvalidFilter(_) => "invalid_filter",
        E::InvalidName(_)
        | E::InvalidTopicName { .. }
        | E::InvalidArgument(_)
        | E::InvalidMessage(_)
        | E::DelayTooLong { .. } => "bad_request",
        E::MessageTooLarge { .. } => "message_too_large",
        E::InvalidReceiptHandle { .. } => "invalid_receipt",
        E::StaleReceiptHandle { .. } => "stale_receipt",
        E::GroupModeConflict { .. } => "group_mode_conflict",
        E::QueueNotFound { .. } => "queue_not_found",
        E::DiskFull { .. }
        | E::FlushTimeout { .. }
        | E::FlushFailed(_)
        | E::ShutDown
        | E::ReplicationTimeout { .. }
        | E::NoInSyncReplica { .. }
        | E::ReadOnlyReplica { .. }
        | E::NotLeader { .. } => "unavailable",
        _ => "internal",
    };
    (code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replication_refusals_are_unavailable() {
        use rocketgate_core::Error as E;
        let e = E::NotLeader {
            reason: "this broker's master lease expired 2s ago; not taking writes".into(),
        };
        assert_eq!(error_code(&e), ("unavailable", e.to_string()));
        let e = E::ReadOnlyReplica {
            master: "m:10912".into(),
        };
        assert_eq!(error_code(&e).0, "unavailable");
    }

    #[test]
    fn bad_frames_get_their_code_and_request_id() {
        assert_eq!(parse("not json").unwrap_err().code, "invalid_json");
        assert_eq!(parse("[1]").unwrap_err().code, "bad_request");
        let e = parse(r#"{"op":"fly","req":7}"#).unwrap_err();
        assert_eq!((e.code, e.req), ("unknown_op", Some(json!(7))));
        let e = parse(r#"{"op":"subscribe","req":"a","id":"s","group":"g"}"#).unwrap_err();
        assert_eq!(e.code, "missing_field");
        assert!(e.message.contains("topic"), "{}", e.message);
        assert_eq!(parse(r#"{"req":1}"#).unwrap_err().code, "missing_field");
        assert_eq!(parse(r#"{"op":"ack"}"#).unwrap_err().code, "missing_field");
        let e = parse(r#"{"op":"subscribe","id":"a:b","topic":"t","group":"g"}"#).unwrap_err();
        assert_eq!(e.code, "bad_request");
    }

    #[test]
    fn subscribe_defaults_and_starts() {
        let Request::Subscribe(s) =
            parse(r#"{"op":"subscribe","id":"s1","topic":"t","group":"g"}"#)
                .unwrap()
                .request
        else {
            panic!()
        };
        assert_eq!(
            (s.mode, s.filter_type, s.filter.as_str(), s.start, s.credit),
            (
                ConsumeMode::Clustering,
                FilterType::Tag,
                "*",
                Start::Earliest,
                0
            )
        );
        for (start, want) in [
            (r#""earliest""#, Start::Earliest),
            (r#""latest""#, Start::Latest),
            ("1700000000000", Start::Timestamp(1_700_000_000_000)),
            (r#"{"offset":5}"#, Start::Offset(5)),
            (
                r#"{"timestamp":1700000000000}"#,
                Start::Timestamp(1_700_000_000_000),
            ),
        ] {
            let text = format!(
                r#"{{"op":"subscribe","id":"s1","topic":"t","group":"g","mode":"broadcasting","start":{start}}}"#
            );
            let Request::Subscribe(s) = parse(&text).unwrap().request else {
                panic!()
            };
            assert_eq!((s.start, s.mode), (want, ConsumeMode::Broadcasting));
        }
        assert!(
            parse(r#"{"op":"subscribe","id":"s","topic":"t","group":"g","start":"middle"}"#)
                .is_err()
        );
    }

    #[test]
    fn publish_maps_tag_keys_properties_and_base64() {
        let text = r#"{"op":"publish","topic":"t","tag":"a/b","keys":"k1 k2","properties":{"region":"eu"},"body":"aGk=","encoding":"base64"}"#;
        let Request::Publish(p) = parse(text).unwrap().request else {
            panic!()
        };
        assert_eq!(p.message.tags(), Some("a/b"));
        assert_eq!(p.message.keys().collect::<Vec<_>>(), ["k1", "k2"]);
        assert_eq!(p.message.property("region"), Some("eu"));
        assert_eq!(&p.message.body[..], b"hi");
        for name in [
            "KEYS",
            "UNIQ_KEY",
            "__STARTDELIVERTIME",
            "TIMER_DELAY_MS",
            "mqtt.qos",
            "__CRC32#",
        ] {
            let text = format!(
                r#"{{"op":"publish","topic":"t","body":"x","properties":{{"{name}":"1"}}}}"#
            );
            assert_eq!(parse(&text).unwrap_err().code, "bad_request", "{name}");
        }
        assert!(parse(r#"{"op":"publish","topic":"t","body":"!!","encoding":"base64"}"#).is_err());
    }

    #[test]
    fn publish_delay_ms_or_deliver_at() {
        let delayed = |text: &str| match parse(text).map(|e| e.request) {
            Ok(Request::Publish(p)) => Ok(p.delay),
            Ok(_) => panic!("not a publish"),
            Err(e) => Err(e.code),
        };
        assert_eq!(
            delayed(r#"{"op":"publish","topic":"t","body":"x","delay_ms":1500}"#),
            Ok(Some(DelayRequest::After(Duration::from_millis(1500))))
        );
        assert_eq!(
            delayed(r#"{"op":"publish","topic":"t","body":"x","deliver_at":1764468000000}"#),
            Ok(Some(DelayRequest::At(1_764_468_000_000)))
        );
        assert_eq!(
            delayed(r#"{"op":"publish","topic":"t","body":"x","delay_ms":0}"#),
            Ok(Some(DelayRequest::After(Duration::ZERO)))
        );
        assert_eq!(
            delayed(r#"{"op":"publish","topic":"t","body":"x"}"#),
            Ok(None)
        );
        for bad in [
            r#"{"op":"publish","topic":"t","body":"x","delay_ms":5,"deliver_at":9}"#,
            r#"{"op":"publish","topic":"t","body":"x","deliver_at":-1}"#,
            r#"{"op":"publish","topic":"t","body":"x","delay_ms":-1}"#,
            r#"{"op":"publish","topic":"t","body":"x","delay_ms":"1s"}"#,
        ] {
            assert_eq!(delayed(bad), Err("bad_request"), "{bad}");
        }
    }

    #[test]
    fn acks_by_receipt_or_up_to_an_offset() {
        let Request::Ack(t) = parse(r#"{"op":"ack","receipt":"r"}"#).unwrap().request else {
            panic!()
        };
        assert_eq!(t, AckTarget::Receipt("r".into()));
        let Request::Nack { target, delay_ms } =
            parse(r#"{"op":"nack","id":"s","queue_id":1,"offset":9,"delay_ms":50}"#)
                .unwrap()
                .request
        else {
            panic!()
        };
        assert_eq!(
            (target, delay_ms),
            (
                AckTarget::UpTo {
                    id: "s".into(),
                    queue_id: 1,
                    offset: 9
                },
                50
            )
        );
    }
}
