//! How messages travel in remoting commands, shared by the broker server and the client:
//! the `properties` string of a send header, the batch body of `SEND_BATCH_MESSAGE`
//! (Java's `MessageDecoder.encodeMessages`), and records in a pull/query body (the
//! stored layout, parsed with the core's [`RecordView`]).
//!
//! Decoding never panics: lengths are checked against the buffer.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use rocketgate_core::store::RecordView;
use rocketgate_core::store::record::{EncodedEntry, parse_properties, property};

/// Separates a property name from its value.
pub const NAME_VALUE_SEPARATOR: char = '\u{1}';
/// Ends each property.
pub const PROPERTY_SEPARATOR: char = '\u{2}';

/// `name\u1value\u2…`, Java's `messageProperties2String`.
pub fn encode_properties<'a>(props: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut s = String::new();
    for (k, v) in props {
        s.push_str(k);
        s.push(NAME_VALUE_SEPARATOR);
        s.push_str(v);
        s.push(PROPERTY_SEPARATOR);
    }
    s
}

/// Java's `string2messageProperties`: items that are not exactly `name\u1value` are
/// skipped, later duplicates win. Order is kept (first occurrence). (The core's
/// [`parse_properties`], so the broker's general path and this agree.)
pub fn decode_properties(s: &str) -> Vec<(String, String)> {
    parse_properties(s)
}

/// One message of a batch body: what a producer sets (flag, body, properties).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEntry {
    pub flag: i32,
    pub body: Bytes,
    pub properties: Vec<(String, String)>,
}

/// Why a batch body does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed batch body at byte {at}: {what}")]
pub struct BatchError {
    pub at: usize,
    pub what: &'static str,
}

/// Appends one batch entry: TOTALSIZE, MAGICCODE (0), BODYCRC (0), FLAG, BODY (len + bytes),
/// PROPERTIES (i16 len + bytes).
pub fn encode_batch_entry(flag: i32, body: &[u8], properties: &str, out: &mut BytesMut) {
    let props = properties.as_bytes();
    let size = 4 + 4 + 4 + 4 + 4 + body.len() + 2 + props.len();
    out.reserve(size);
    out.put_i32(size as i32);
    out.put_i32(0);
    out.put_i32(0);
    out.put_i32(flag);
    out.put_i32(body.len() as i32);
    out.put_slice(body);
    out.put_i16(props.len() as i16);
    out.put_slice(props);
}

/// [`encode_batch_entry`] with the properties written by `properties` straight
/// into `out` (their length is filled in after).
pub fn encode_batch_entry_with(
    flag: i32,
    body: &[u8],
    out: &mut BytesMut,
    properties: impl FnOnce(&mut BytesMut),
) {
    let start = out.len();
    out.reserve(4 * 5 + body.len() + 2 + 96);
    out.put_i32(0); // TOTALSIZE, below
    out.put_i32(0);
    out.put_i32(0);
    out.put_i32(flag);
    out.put_i32(body.len() as i32);
    out.put_slice(body);
    let props_at = out.len();
    out.put_i16(0); // properties length, below
    properties(out);
    let props_len = out.len() - props_at - 2;
    let total = out.len() - start;
    out[props_at..props_at + 2].copy_from_slice(&(props_len as i16).to_be_bytes());
    out[start..start + 4].copy_from_slice(&(total as i32).to_be_bytes());
}

/// Splits a `SEND_BATCH_MESSAGE` body into its messages, properties decoded.
pub fn decode_batch(body: &Bytes) -> Result<Vec<BatchEntry>, BatchError> {
    decode_batch_encoded(body)?
        .into_iter()
        .map(|e| {
            let props = std::str::from_utf8(&e.properties).map_err(|_| BatchError {
                at: 0,
                what: "properties are not UTF-8",
            })?;
            Ok(BatchEntry {
                flag: e.flag,
                body: e.body,
                properties: decode_properties(props),
            })
        })
        .collect()
}

/// Splits a `SEND_BATCH_MESSAGE` body into its messages without looking inside
/// the properties: body and properties are slices of `body` (no copy), for the
/// core's [`EncodedBatch`](rocketgate_core::store::record::EncodedBatch), which
/// checks them.
pub fn decode_batch_encoded(body: &Bytes) -> Result<Vec<EncodedEntry>, BatchError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let b = body.as_ref();
    let i32_at = |pos: usize| -> Option<i32> {
        b.get(pos..pos + 4)
            .map(|s| i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    };
    while at < b.len() {
        let err = |what| BatchError { at, what };
        let total = i32_at(at).ok_or(err("truncated size"))?;
        if total < 22 || at + total as usize > b.len() {
            return Err(err("impossible total size"));
        }
        let end = at + total as usize;
        let flag = i32_at(at + 12).ok_or(err("truncated flag"))?;
        let body_len = i32_at(at + 16).ok_or(err("truncated body length"))?;
        let body_start = at + 20;
        if body_len < 0 || body_start + body_len as usize + 2 > end {
            return Err(err("body length does not fit"));
        }
        let body_end = body_start + body_len as usize;
        let props_len = i16::from_be_bytes([b[body_end], b[body_end + 1]]);
        let props_start = body_end + 2;
        if props_len < 0 || props_start + props_len as usize != end {
            return Err(err("properties length does not fit"));
        }
        if out.is_empty() {
            // Entries are usually alike: size the list from the first one.
            out.reserve(b.len() / total as usize);
        }
        out.push(EncodedEntry {
            flag,
            body: body.slice(body_start..body_end),
            properties: body.slice(props_start..end),
        });
        at = end;
    }
    Ok(out)
}

/// A message as a consumer receives it: decoded from a stored record of a pull or query
/// body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// The producer's `UNIQ_KEY` when it set one, else [`ReceivedMessage::offset_msg_id`].
    pub msg_id: String,
    /// Store host + commit-log offset (what `VIEW_MESSAGE_BY_ID` takes).
    pub offset_msg_id: String,
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub commit_log_offset: u64,
    pub flag: i32,
    pub sys_flag: i32,
    pub body: Bytes,
    /// Every property, including `TAGS` and `KEYS`.
    pub properties: BTreeMap<String, String>,
    pub born_timestamp: i64,
    pub store_timestamp: i64,
    pub born_host: SocketAddr,
    pub store_host: SocketAddr,
    /// How often it was delivered before (0 on the first delivery).
    pub reconsume_times: i32,
}

impl ReceivedMessage {
    pub fn tag(&self) -> Option<&str> {
        self.properties.get(property::TAGS).map(String::as_str)
    }

    /// The `KEYS` property split on spaces.
    pub fn keys(&self) -> Vec<&str> {
        self.properties
            .get(property::KEYS)
            .map(|k| k.split(' ').filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    }

    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    /// The topic a retried message was first sent to (`RETRY_TOPIC`), else its topic.
    pub fn origin_topic(&self) -> &str {
        self.property(property::RETRY_TOPIC).unwrap_or(&self.topic)
    }

    /// Decodes one record. `bytes` must hold exactly the record or more.
    pub fn from_record(bytes: &Bytes) -> Result<(ReceivedMessage, usize), String> {
        let view = RecordView::parse(bytes).map_err(|e| e.to_string())?;
        let len = view.total_size() as usize;
        let properties: BTreeMap<String, String> = view
            .properties()
            .filter(|(k, _)| *k != property::CRC32)
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let offset_msg_id = rocketgate_core::store::record::encode_msg_id(
            view.store_host(),
            view.phys_offset() as u64,
        );
        let msg_id = properties
            .get(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            .cloned()
            .unwrap_or_else(|| offset_msg_id.clone());
        Ok((
            ReceivedMessage {
                msg_id,
                offset_msg_id,
                topic: view.topic().to_owned(),
                queue_id: view.queue_id().max(0) as u32,
                queue_offset: view.queue_offset().max(0) as u64,
                commit_log_offset: view.phys_offset().max(0) as u64,
                flag: view.flag(),
                sys_flag: view.sys_flag(),
                body: bytes.slice_ref(view.body()),
                properties,
                born_timestamp: view.born_timestamp(),
                store_timestamp: view.store_timestamp(),
                born_host: view.born_host(),
                store_host: view.store_host(),
                reconsume_times: view.reconsume_times(),
            },
            len,
        ))
    }

    /// Decodes every record of a pull or query body (records back to back).
    pub fn decode_all(body: &Bytes) -> Result<Vec<ReceivedMessage>, String> {
        let mut out = Vec::new();
        let mut rest = body.clone();
        while !rest.is_empty() {
            let (m, len) = Self::from_record(&rest)?;
            out.push(m);
            rest = rest.slice(len..);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_round_trip_like_java() {
        let s = encode_properties([("TAGS", "a"), ("KEYS", "k1 k2")]);
        assert_eq!(s, "TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}");
        assert_eq!(
            decode_properties(&s),
            vec![("TAGS".into(), "a".into()), ("KEYS".into(), "k1 k2".into())]
        );
        // Malformed items are skipped, as Java does.
        assert_eq!(
            decode_properties("x\u{2}A\u{1}1\u{1}2\u{2}B\u{1}2"),
            vec![("B".into(), "2".into())]
        );
    }

    #[test]
    fn batch_round_trips_and_rejects_garbage() {
        let mut buf = BytesMut::new();
        encode_batch_entry(0, b"one", "TAGS\u{1}t\u{2}", &mut buf);
        encode_batch_entry(7, b"", "", &mut buf);
        let body = buf.freeze();
        let got = decode_batch(&body).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].body.as_ref(), b"one");
        assert_eq!(got[0].properties, vec![("TAGS".into(), "t".into())]);
        assert_eq!(got[1].flag, 7);
        for cut in 1..body.len() {
            let _ = decode_batch(&body.slice(..cut)); // never panics
        }
        assert!(decode_batch(&body.slice(..body.len() - 1)).is_err());
        assert!(decode_batch(&Bytes::from_static(&[0, 0, 0, 99, 1])).is_err());
    }
}
