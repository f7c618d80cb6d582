//! Messages whose properties arrive already in the stored encoding
//! (`name\x01value\x02…`): what a RocketMQ producer puts on the wire, in a send
//! header or in each entry of a batch body. The store copies such properties
//! into the record as they are, once [`is_plain_properties`] says they are
//! exactly what the encoder would have written, instead of building a `String`
//! per name and value and joining them again (the largest per-message cost of a
//! batch of small messages through the native door).

use std::net::SocketAddr;

use bytes::Bytes;

use super::{
    Message, NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, encode_msg_id, property, push_msg_id,
};

/// One message of an [`EncodedBatch`]: what a producer chooses per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedEntry {
    pub flag: i32,
    pub body: Bytes,
    /// `name\x01value\x02…` as the producer sent it (not yet checked).
    pub properties: Bytes,
}

/// Messages for one topic that share the fields a send header carries once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedBatch {
    pub topic: String,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: i32,
    pub entries: Vec<EncodedEntry>,
}

impl EncodedBatch {
    /// Entry `i` as a [`Message`] with its properties parsed the way Java's
    /// `string2messageProperties` does (malformed items skipped, a repeated name
    /// keeps its last value); for callers that need the general path.
    pub fn message(&self, i: usize, queue_id: u32) -> Option<crate::Result<Message>> {
        let e = self.entries.get(i)?;
        Some(
            std::str::from_utf8(&e.properties)
                .map(|props| {
                    let mut m = Message::new(self.topic.clone(), queue_id, e.body.clone());
                    m.flag = e.flag;
                    m.properties = parse_properties(props);
                    m.sys_flag = self.sys_flag;
                    m.born_timestamp = self.born_timestamp;
                    m.born_host = self.born_host;
                    m.reconsume_times = self.reconsume_times;
                    m
                })
                .map_err(|_| {
                    crate::Error::InvalidMessage("message properties are not UTF-8".into())
                }),
        )
    }

    /// Every entry as a [`Message`] (see [`EncodedBatch::message`]).
    pub fn messages(&self, queue_id: u32) -> crate::Result<Vec<Message>> {
        (0..self.entries.len())
            .filter_map(|i| self.message(i, queue_id))
            .collect()
    }
}

/// An [`EncodedBatch`] whose every entry's properties passed
/// [`is_plain_properties`]: the proof the store's append takes, so a caller that
/// checked (with its own reserved names) does not pay for a second scan.
#[derive(Debug, Clone, Copy)]
pub struct PlainBatch<'a>(&'a EncodedBatch);

impl<'a> PlainBatch<'a> {
    /// `None` unless every entry is plain and names none of `reserved`.
    pub fn check(batch: &'a EncodedBatch, reserved: &[&str]) -> Option<PlainBatch<'a>> {
        batch
            .entries
            .iter()
            .all(|e| is_plain_properties(&e.properties, reserved))
            .then_some(PlainBatch(batch))
    }

    pub fn batch(&self) -> &'a EncodedBatch {
        self.0
    }
}

/// Java's `string2messageProperties`: items that are not exactly `name\x01value`
/// (or have an empty name) are skipped; a repeated name keeps its last value at
/// the place of its first occurrence.
pub fn parse_properties(s: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for item in s.split(PROPERTY_SEPARATOR as char) {
        let mut nv = item.split(NAME_VALUE_SEPARATOR as char);
        let (Some(n), Some(v), None) = (nv.next(), nv.next(), nv.next()) else {
            continue;
        };
        if n.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(k, _)| k == n) {
            Some(slot) => slot.1 = v.to_owned(),
            None => out.push((n.to_owned(), v.to_owned())),
        }
    }
    out
}

/// Most properties one message may carry and still be copied through (more go
/// the general way; the duplicate check below is quadratic in this).
const MAX_PLAIN_PROPERTIES: usize = 32;

/// Whether `raw` is exactly what the encoder would write for the pairs
/// [`parse_properties`] finds in it — valid UTF-8, every item `name\x01value\x02`
/// with a non-empty name, no name twice, no `__CRC32#` (the store's own) — and
/// names none of `reserved`. Such bytes can be stored as they are.
pub fn is_plain_properties(raw: &[u8], reserved: &[&str]) -> bool {
    if raw.is_empty() {
        return true;
    }
    if raw.last() != Some(&PROPERTY_SEPARATOR) || std::str::from_utf8(raw).is_err() {
        return false;
    }
    let mut names: [&[u8]; MAX_PLAIN_PROPERTIES] = [&[]; MAX_PLAIN_PROPERTIES];
    let mut count = 0;
    // One pass over the bytes (the split-and-search version was ~4 % of a
    // broker storing small MQTT publishes): `start` is where the current item
    // began, `eq` where its name ends.
    let (mut start, mut eq) = (0, None);
    for (i, &b) in raw.iter().enumerate() {
        if b == NAME_VALUE_SEPARATOR {
            if eq.is_some() {
                return false; // a second separator: the value holds one
            }
            eq = Some(i);
        } else if b == PROPERTY_SEPARATOR {
            let Some(e) = eq else {
                return false; // an item without a value
            };
            let name = &raw[start..e];
            if name.is_empty()
                || count == MAX_PLAIN_PROPERTIES
                || name == property::CRC32.as_bytes()
                || reserved.iter().any(|r| r.as_bytes() == name)
                || names[..count].contains(&name)
            {
                return false;
            }
            names[count] = name;
            count += 1;
            (start, eq) = (i + 1, None);
        }
    }
    true
}

/// Where one message of a batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placed {
    pub phys_offset: u64,
    pub size: u32,
    pub queue_offset: u64,
}

/// Where a batch landed: one queue of one topic, records in order. Message ids
/// are made on demand (a `String` per message was a cost of its own).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchSent {
    pub topic: String,
    pub queue_id: u32,
    pub store_host: SocketAddr,
    pub store_timestamp: i64,
    pub records: Vec<Placed>,
}

impl BatchSent {
    /// The offset message id of record `i`.
    pub fn msg_id(&self, i: usize) -> Option<String> {
        let p = self.records.get(i)?;
        Some(encode_msg_id(self.store_host, p.phys_offset))
    }

    /// Every offset message id, joined by `sep` (a batch send response's `msgId`).
    pub fn joined_msg_ids(&self, sep: char) -> String {
        let mut out = String::with_capacity(self.records.len() * 33);
        for (i, p) in self.records.iter().enumerate() {
            if i > 0 {
                out.push(sep);
            }
            push_msg_id(&mut out, self.store_host, p.phys_offset);
        }
        out
    }

    /// End of the last record (what a durability wait needs).
    pub fn end_offset(&self) -> u64 {
        self.records
            .last()
            .map_or(0, |p| p.phys_offset + u64::from(p.size))
    }
}
