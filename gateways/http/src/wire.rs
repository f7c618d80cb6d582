//! What travels over HTTP: the JSON shape of a delivered message (with its
//! binary-safe body encoding), user properties from `x-rg-prop-*` headers, and
//! extractors that turn axum's rejections into this crate's JSON errors.

use std::collections::BTreeMap;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use rocketgate_core::broker::Delivered;
use rocketgate_core::store::RecordView;
use rocketgate_core::store::record::{encode_msg_id, property};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Prefix of the request headers that carry user properties.
pub const PROPERTY_HEADER_PREFIX: &str = "x-rg-prop-";

/// How message bodies are written in JSON answers (`?encoding=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `body` is the text when the bytes are valid UTF-8 (`body_encoding: "utf8"`),
    /// else standard base64 (`body_encoding: "base64"`).
    #[default]
    Auto,
    /// Always base64, whatever the bytes.
    Base64,
}

/// A body as JSON: text or base64, saying which.
pub fn encode_body(body: &[u8], encoding: Encoding) -> (String, &'static str) {
    match (encoding, std::str::from_utf8(body)) {
        (Encoding::Auto, Ok(text)) => (text.to_owned(), "utf8"),
        _ => (BASE64.encode(body), "base64"),
    }
}

/// The body of a batch entry: `body_encoding` is `utf8` (default) or `base64`.
pub fn decode_body(body: &str, encoding: Option<&str>, field: &str) -> Result<Bytes> {
    match encoding.unwrap_or("utf8") {
        "utf8" | "text" => Ok(Bytes::copy_from_slice(body.as_bytes())),
        "base64" => BASE64
            .decode(body)
            .map(Bytes::from)
            .map_err(|e| Error::bad(field, format!("not valid base64: {e}"))),
        other => Err(Error::bad(
            format!("{field}_encoding"),
            format!("{other:?} is not `utf8` or `base64`"),
        )),
    }
}

/// One message as a consumer sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct MessageJson {
    /// `UNIQ_KEY` when the producer set one, else the offset message id.
    pub msg_id: String,
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    /// Every property except `TAGS`, `KEYS` and the store's `__CRC32#`.
    pub properties: BTreeMap<String, String>,
    pub body: String,
    /// `utf8` or `base64`: how to read `body`.
    #[schema(pattern = "^(utf8|base64)$")]
    pub body_encoding: String,
    pub born_timestamp: i64,
    pub store_timestamp: i64,
    pub born_host: String,
    pub reconsume_times: i32,
    /// Receive and stream only: what acks this delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_handle: Option<String>,
    /// Receive and stream only: 1 on the first delivery, raised on each redelivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_attempt: Option<u32>,
    /// Receive and stream only: when (unix ms) the message reappears without an ack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invisible_until: Option<i64>,
}

impl MessageJson {
    pub fn from_record(record: &[u8], queue_id: u32, encoding: Encoding) -> Result<MessageJson> {
        let view = RecordView::parse(record).map_err(rocketgate_core::Error::from)?;
        let msg_id = view
            .property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            .map(str::to_owned)
            .unwrap_or_else(|| encode_msg_id(view.store_host(), view.phys_offset() as u64));
        let properties = view
            .properties()
            .filter(|(k, _)| ![property::TAGS, property::KEYS, property::CRC32].contains(k))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let (body, body_encoding) = encode_body(view.body(), encoding);
        Ok(MessageJson {
            msg_id,
            topic: view.topic().to_owned(),
            queue_id,
            queue_offset: view.queue_offset().max(0) as u64,
            tag: view.tags().map(str::to_owned),
            keys: view.keys().map(str::to_owned).collect(),
            properties,
            body,
            body_encoding: body_encoding.to_owned(),
            born_timestamp: view.born_timestamp(),
            store_timestamp: view.store_timestamp(),
            born_host: view.born_host().to_string(),
            reconsume_times: view.reconsume_times(),
            receipt_handle: None,
            delivery_attempt: None,
            invisible_until: None,
        })
    }

    pub fn from_delivered(d: &Delivered, encoding: Encoding) -> Result<MessageJson> {
        Self::from_record(&d.record, d.queue_id, encoding)
    }
}

/// RocketMQ's system property names (and prefixes) a user may not set.
const RESERVED: &[&str] = &[
    property::TAGS,
    property::KEYS,
    property::WAIT_STORE_MSG_OK,
    property::DELAY_TIME_LEVEL,
    property::RETRY_TOPIC,
    property::REAL_TOPIC,
    property::REAL_QUEUE_ID,
    property::TRANSACTION_PREPARED,
    property::PRODUCER_GROUP,
    property::MIN_OFFSET,
    property::MAX_OFFSET,
    property::BUYER_ID,
    property::ORIGIN_MESSAGE_ID,
    property::RECONSUME_TIME,
    property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    property::MAX_RECONSUME_TIMES,
    property::CONSUME_START_TIMESTAMP,
    property::TRANSACTION_PREPARED_QUEUE_OFFSET,
    property::TRANSACTION_CHECK_TIMES,
    property::CHECK_IMMUNITY_TIME_IN_SECONDS,
    property::CORRELATION_ID,
    property::MESSAGE_REPLY_TO_CLIENT,
    property::MESSAGE_TTL,
    property::MESSAGE_TYPE,
    property::SHARDING_KEY,
    property::START_DELIVER_TIME,
    property::TRACE_SWITCH,
    property::CRC32,
];

/// True for names a user property may not have. Compared case-insensitively:
/// HTTP header names arrive lowercased, and `tags` next to `TAGS` would only confuse.
pub fn is_reserved_property(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    RESERVED.contains(&upper.as_str())
        || upper.starts_with("TIMER_")
        || upper.starts_with("__")
        || upper.starts_with("MQTT.")
        || upper.starts_with("TRAN_")
}

/// Checks one user property.
pub fn check_property(name: &str, value: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::bad("properties", "a property name is empty"));
    }
    if is_reserved_property(name) {
        return Err(Error::ReservedProperty {
            name: name.to_owned(),
        });
    }
    let bad = |s: &str| s.bytes().any(|b| b == 0x01 || b == 0x02);
    if bad(name) || bad(value) {
        return Err(Error::bad(
            format!("properties.{name}"),
            "names and values must not contain the bytes 0x01 or 0x02",
        ));
    }
    Ok(())
}

/// The user properties of `x-rg-prop-<name>` headers (names lowercased, as HTTP has them).
pub fn header_properties(headers: &HeaderMap) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let Some(prop) = name.as_str().strip_prefix(PROPERTY_HEADER_PREFIX) else {
            continue;
        };
        let value = std::str::from_utf8(value.as_bytes())
            .map_err(|_| Error::bad(format!("header {name}"), "not valid UTF-8"))?;
        check_property(prop, value)?;
        out.push((prop.to_owned(), value.to_owned()));
    }
    Ok(out)
}

/// Keys given comma-separated; each must be free of spaces (RocketMQ separates
/// keys with a space inside the `KEYS` property).
pub fn parse_keys(keys: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for k in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        if k.contains(char::is_whitespace) {
            return Err(Error::bad("keys", format!("key {k:?} contains whitespace")));
        }
        out.push(k.to_owned());
    }
    Ok(out)
}

// ---- extractors: axum's, with this crate's JSON errors ----

/// Query parameters; a bad one is a 400 naming it.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e| Error::bad("query", e.body_text()))
    }
}

/// Path parameters.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Path(p.0))
            .map_err(|e| Error::bad("path", e.body_text()))
    }
}

/// A JSON object body. Only an object: serde would also fill a struct from an
/// array of its fields in order (`[null, null]`), which no client means.
pub struct Json<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self> {
        json_of_shape(req, state, "a JSON object", serde_json::Value::is_object)
            .await
            .map(Json)
    }
}

/// A JSON array body (batch publish).
pub struct JsonArray<T>(pub Vec<T>);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonArray<T> {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self> {
        json_of_shape(req, state, "a JSON array", serde_json::Value::is_array)
            .await
            .map(JsonArray)
    }
}

/// Reads a JSON body (content type and size as axum's `Json` checks them) of the
/// shape `is_shape` accepts.
async fn json_of_shape<T: DeserializeOwned, S: Send + Sync>(
    req: Request,
    state: &S,
    shape: &str,
    is_shape: fn(&serde_json::Value) -> bool,
) -> Result<T> {
    let limit = body_limit(&req);
    let value = match axum::Json::<serde_json::Value>::from_request(req, state).await {
        Ok(j) => j.0,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(Error::TooLarge { max: limit });
        }
        Err(e) => return Err(Error::bad("body", e.body_text())),
    };
    if !is_shape(&value) {
        return Err(Error::bad("body", format!("must be {shape}")));
    }
    serde_json::from_value(value).map_err(|e| Error::bad("body", e.to_string()))
}

/// The raw request body, byte for byte.
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self> {
        let limit = body_limit(&req);
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(RawBody(b)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(Error::TooLarge { max: limit })
            }
            Err(e) => Err(Error::bad("body", e.body_text())),
        }
    }
}

/// The body limit in force, which the router puts in the request extensions.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

fn body_limit(req: &Request) -> usize {
    req.extensions()
        .get::<BodyLimit>()
        .map_or(0, |BodyLimit(n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_text_when_they_can_be() {
        assert_eq!(encode_body(b"hi", Encoding::Auto), ("hi".into(), "utf8"));
        assert_eq!(
            encode_body(b"hi", Encoding::Base64),
            ("aGk=".into(), "base64")
        );
        assert_eq!(
            encode_body(&[0xff, 0], Encoding::Auto),
            ("/wA=".into(), "base64")
        );
        assert_eq!(
            &decode_body("/wA=", Some("base64"), "b").unwrap()[..],
            [0xff, 0]
        );
        assert!(decode_body("!!", Some("base64"), "b").is_err());
        assert!(decode_body("x", Some("hex"), "b").is_err());
    }

    #[test]
    fn reserved_names_are_refused_in_any_case() {
        for name in [
            "TAGS",
            "keys",
            "Uniq_Key",
            "TIMER_DELAY_MS",
            "__STARTDELIVERTIME",
            "mqtt.qos",
            "DELAY",
        ] {
            assert!(is_reserved_property(name), "{name}");
        }
        for name in ["region", "price", "content-type", "delayed"] {
            assert!(!is_reserved_property(name), "{name}");
        }
    }

    #[test]
    fn keys_split_on_commas() {
        assert_eq!(parse_keys("a, b,,c").unwrap(), ["a", "b", "c"]);
        assert!(parse_keys("a b").is_err());
    }
}
