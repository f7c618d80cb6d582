//! The on-disk message record: RocketMQ's message layout (magic v1), byte for
//! byte, so the native gateway can hand stored bytes to RocketMQ clients
//! unchanged. This module owns encoding a caller's [`Message`], stamping the
//! fields only the log knows (offsets, store time, record CRC), decoding a
//! [`RecordView`] over stored bytes without copying, and the offset message id.
//! It does no I/O. The layout, the blank filler and the `__CRC32#` decision are
//! written down in `docs/storage-format.md`.
//!
//! Decoding never panics: every length is checked against the buffer and
//! failures are a [`RecordError`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;

mod batch;
mod encode;
mod msg_id;
pub use batch::{
    BatchSent, EncodedBatch, EncodedEntry, Placed, PlainBatch, is_plain_properties,
    parse_properties,
};
use encode::put_host;
pub use encode::{Encoded, Stamp, encode, encoded_len};
pub(crate) use encode::{Parts, Props, encode_parts};
pub use msg_id::{decode_msg_id, encode_msg_id, push_msg_id, unique_id, unique_id_at};

pub use crate::error::RecordError;
use crate::error::Result;

/// MAGICCODE of a message record (`0xDAA320A7`).
pub const MESSAGE_MAGIC_CODE: i32 = 0xDAA3_20A7_u32 as i32;
/// MAGICCODE of the blank filler that pads the end of a segment (`0xCBD43194`).
pub const BLANK_MAGIC_CODE: i32 = 0xCBD4_3194_u32 as i32;
/// Bytes a segment always keeps free for a blank filler (TOTALSIZE + MAGICCODE):
/// a record fits only if `len + END_FILE_MIN_BLANK_LENGTH <= remaining`.
pub const END_FILE_MIN_BLANK_LENGTH: usize = 8;
/// Longest topic: its length is one byte on disk, and RocketMQ caps it at 127.
pub const MAX_TOPIC_LEN: usize = 127;
/// Longest encoded properties (including the `__CRC32#` property): an i16 length.
pub const MAX_PROPERTIES_LEN: usize = i16::MAX as usize;
/// Separates a property name from its value.
pub const NAME_VALUE_SEPARATOR: u8 = 0x01;
/// Ends each property.
pub const PROPERTY_SEPARATOR: u8 = 0x02;
/// Length of the `__CRC32#` property the store appends last:
/// name (8) + separator (1) + 10 decimal digits + separator (1).
pub const CRC32_PROPERTY_LEN: usize = property::CRC32.len() + 1 + 10 + 1;

/// Offsets of the fixed fields (the host fields move the rest, see [`RecordView`]).
const POS_QUEUE_OFFSET: usize = 20;
const POS_SYS_FLAG: usize = 36;
const POS_BORN_HOST: usize = 48;
/// Size of a record with IPv4 hosts, empty body, empty topic, no properties.
pub const MIN_RECORD_LEN: usize = 91;

/// RocketMQ `MessageSysFlag` bits.
pub mod sys_flag {
    pub const COMPRESSED: i32 = 1;
    pub const MULTI_TAGS: i32 = 1 << 1;
    pub const TRANSACTION_NOT_TYPE: i32 = 0;
    pub const TRANSACTION_PREPARED_TYPE: i32 = 1 << 2;
    pub const TRANSACTION_COMMIT_TYPE: i32 = 2 << 2;
    pub const TRANSACTION_ROLLBACK_TYPE: i32 = 3 << 2;
    /// Mask of the two transaction-type bits.
    pub const TRANSACTION_TYPE_MASK: i32 = 3 << 2;
    pub const BORNHOST_V6_FLAG: i32 = 1 << 4;
    pub const STOREHOSTADDRESS_V6_FLAG: i32 = 1 << 5;

    /// The transaction type bits of a sys flag.
    pub fn transaction_type(flag: i32) -> i32 {
        flag & TRANSACTION_TYPE_MASK
    }
}

/// Well-known property names (RocketMQ `MessageConst`).
pub mod property {
    pub const KEYS: &str = "KEYS";
    pub const TAGS: &str = "TAGS";
    pub const WAIT_STORE_MSG_OK: &str = "WAIT";
    pub const DELAY_TIME_LEVEL: &str = "DELAY";
    pub const RETRY_TOPIC: &str = "RETRY_TOPIC";
    pub const REAL_TOPIC: &str = "REAL_TOPIC";
    pub const REAL_QUEUE_ID: &str = "REAL_QID";
    pub const TRANSACTION_PREPARED: &str = "TRAN_MSG";
    pub const PRODUCER_GROUP: &str = "PGROUP";
    pub const MIN_OFFSET: &str = "MIN_OFFSET";
    pub const MAX_OFFSET: &str = "MAX_OFFSET";
    pub const BUYER_ID: &str = "BUYER_ID";
    pub const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
    pub const RECONSUME_TIME: &str = "RECONSUME_TIME";
    pub const UNIQ_CLIENT_MESSAGE_ID_KEYIDX: &str = "UNIQ_KEY";
    pub const MAX_RECONSUME_TIMES: &str = "MAX_RECONSUME_TIMES";
    pub const CONSUME_START_TIMESTAMP: &str = "CONSUME_START_TIME";
    pub const TRANSACTION_PREPARED_QUEUE_OFFSET: &str = "TRAN_PREPARED_QUEUE_OFFSET";
    pub const TRANSACTION_CHECK_TIMES: &str = "TRANSACTION_CHECK_TIMES";
    pub const CHECK_IMMUNITY_TIME_IN_SECONDS: &str = "CHECK_IMMUNITY_TIME_IN_SECONDS";
    pub const CORRELATION_ID: &str = "CORRELATION_ID";
    pub const MESSAGE_REPLY_TO_CLIENT: &str = "REPLY_TO_CLIENT";
    pub const MESSAGE_TTL: &str = "TTL";
    pub const MESSAGE_TYPE: &str = "MSG_TYPE";
    pub const SHARDING_KEY: &str = "__SHARDINGKEY";
    pub const START_DELIVER_TIME: &str = "__STARTDELIVERTIME";
    pub const TIMER_DELAY_SEC: &str = "TIMER_DELAY_SEC";
    pub const TIMER_DELAY_MS: &str = "TIMER_DELAY_MS";
    pub const TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
    pub const TRACE_SWITCH: &str = "TRACE_ON";
    /// Whole-record checksum the store appends as the last property (RocketMQ 5).
    pub const CRC32: &str = "__CRC32#";
    /// Separates several keys inside the `KEYS` property.
    pub const KEY_SEPARATOR: &str = " ";
}

/// A message as a producer hands it to the store. The store fills in queue
/// offset, physical offset, store time, store host and the record CRC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    /// Chosen by the caller (round-robin, sharding key...). At most `i32::MAX`.
    pub queue_id: u32,
    pub flag: i32,
    pub body: Bytes,
    /// In order; names are unique (see [`Message::insert_property`]). Names and
    /// values must not contain the bytes 0x01 or 0x02.
    pub properties: Vec<(String, String)>,
    /// RocketMQ sys flag; the two host-v6 bits are set by the encoder from the
    /// actual addresses.
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

impl Message {
    /// A message with no properties, born now-unknown (timestamp 0) at `0.0.0.0:0`.
    pub fn new(topic: impl Into<String>, queue_id: u32, body: impl Into<Bytes>) -> Self {
        Message {
            topic: topic.into(),
            queue_id,
            flag: 0,
            body: body.into(),
            properties: Vec::new(),
            sys_flag: 0,
            born_timestamp: 0,
            born_host: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        }
    }

    /// The value of property `name`.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Sets property `name`, replacing an existing value in place.
    pub fn insert_property(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let (name, value) = (name.into(), value.into());
        match self.properties.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value,
            None => self.properties.push((name, value)),
        }
    }

    /// Removes property `name`, returning its value.
    pub fn remove_property(&mut self, name: &str) -> Option<String> {
        let i = self.properties.iter().position(|(k, _)| k == name)?;
        Some(self.properties.remove(i).1)
    }

    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.insert_property(name, value);
        self
    }

    pub fn with_tags(self, tags: impl Into<String>) -> Self {
        self.with_property(property::TAGS, tags)
    }

    /// Sets `KEYS` to the keys joined by a space (RocketMQ's key separator).
    pub fn with_keys<I, S>(self, keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let joined: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_owned()).collect();
        self.with_property(property::KEYS, joined.join(property::KEY_SEPARATOR))
    }

    pub fn tags(&self) -> Option<&str> {
        self.property(property::TAGS)
    }

    /// The business keys of `KEYS`, split on spaces.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        split_keys(self.property(property::KEYS))
    }
}

/// The `name\x01value` items of a properties section in stored order (an item
/// without a `\x01` is skipped; a value keeps any further `\x01`), as
/// `split('\x02')` then `split_once('\x01')` would give them. Scans the bytes:
/// every delivery reads its record's properties, and `str`'s char searcher
/// spent more on setting up each tiny search than on searching (~10 % of a
/// broker forwarding small QoS 0 publishes). Both separators are ASCII, so
/// every cut falls on a char boundary.
#[derive(Clone, Debug)]
pub struct Properties<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Properties<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<(&'a str, &'a str)> {
        while !self.rest.is_empty() {
            let bytes = self.rest.as_bytes();
            let end = bytes
                .iter()
                .position(|&b| b == PROPERTY_SEPARATOR)
                .unwrap_or(bytes.len());
            let item = &self.rest[..end];
            self.rest = self.rest.get(end + 1..).unwrap_or("");
            if let Some(eq) = item.bytes().position(|b| b == NAME_VALUE_SEPARATOR) {
                return Some((&item[..eq], &item[eq + 1..]));
            }
        }
        None
    }
}

fn split_keys(keys: Option<&str>) -> impl Iterator<Item = &str> {
    keys.unwrap_or("")
        .split(property::KEY_SEPARATOR)
        .filter(|k| !k.is_empty())
}

/// CRC32 of `bytes` as RocketMQ stores it (BODYCRC and `__CRC32#`).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes) & 0x7FFF_FFFF
}

/// What a header at some position holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A message record of `size` bytes.
    Message { size: u32 },
    /// An end-of-segment filler of `size` bytes.
    Blank { size: u32 },
    /// TOTALSIZE and MAGICCODE are both zero: nothing was ever written here.
    Zero,
}

/// Reads TOTALSIZE and MAGICCODE at the start of `bytes`. Checks only that the
/// size is plausible for its kind; it does not look at the rest.
pub fn read_header(bytes: &[u8]) -> Result<Header, RecordError> {
    let total = read_i32(bytes, 0)?;
    let magic = read_i32(bytes, 4)?;
    match magic {
        MESSAGE_MAGIC_CODE if total >= MIN_RECORD_LEN as i32 => {
            Ok(Header::Message { size: total as u32 })
        }
        BLANK_MAGIC_CODE if total >= END_FILE_MIN_BLANK_LENGTH as i32 => {
            Ok(Header::Blank { size: total as u32 })
        }
        MESSAGE_MAGIC_CODE | BLANK_MAGIC_CODE => Err(RecordError::BadTotalSize(total.into())),
        0 if total == 0 => Ok(Header::Zero),
        other => Err(RecordError::BadMagic(other as u32)),
    }
}

/// Writes a blank filler header of `size` bytes (the rest of the segment).
pub fn write_blank(out: &mut [u8; 8], size: u32) {
    out[..4].copy_from_slice(&(size as i32).to_be_bytes());
    out[4..].copy_from_slice(&BLANK_MAGIC_CODE.to_be_bytes());
}

fn read_bytes<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], RecordError> {
    b.get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or(RecordError::Truncated {
            needed: at + N,
            available: b.len(),
        })
}

fn read_i32(b: &[u8], at: usize) -> Result<i32, RecordError> {
    read_bytes::<4>(b, at).map(i32::from_be_bytes)
}

/// A zero-copy view over one stored message record. Construct with
/// [`RecordView::parse`] (structure only) or [`decode`] (structure + checksums).
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
    store_ts_at: usize,
    body: (usize, usize),
    /// Topic and properties, UTF-8-checked once by `parse` (property lookups on the
    /// dispatch and delivery paths used to re-check the whole section every time).
    topic: &'a str,
    props: &'a str,
}

/// A stored record's STORETIMESTAMP (ms) without parsing the rest (the delivery
/// latency metric reads it per message); `None` when the bytes are too short.
pub fn store_timestamp_of(bytes: &[u8]) -> Option<i64> {
    let sys = i32::from_be_bytes(bytes.get(POS_SYS_FLAG..POS_SYS_FLAG + 4)?.try_into().ok()?);
    let at = POS_BORN_HOST
        + if sys & sys_flag::BORNHOST_V6_FLAG != 0 {
            20
        } else {
            8
        };
    Some(i64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

impl<'a> RecordView<'a> {
    /// Parses the record at the start of `bytes` (which may continue past it):
    /// magic, every length against TOTALSIZE and the buffer, UTF-8 of topic and
    /// properties. Does not check CRCs (see [`RecordView::verify`]).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, RecordError> {
        let total = match read_header(bytes)? {
            Header::Message { size } => size as usize,
            Header::Blank { .. } => return Err(RecordError::BadMagic(BLANK_MAGIC_CODE as u32)),
            Header::Zero => return Err(RecordError::BadMagic(0)),
        };
        if bytes.len() < total {
            return Err(RecordError::Truncated {
                needed: total,
                available: bytes.len(),
            });
        }
        let b = &bytes[..total];
        let sys = read_i32(b, POS_SYS_FLAG)?;
        let born_len = if sys & sys_flag::BORNHOST_V6_FLAG != 0 {
            20
        } else {
            8
        };
        let store_len = if sys & sys_flag::STOREHOSTADDRESS_V6_FLAG != 0 {
            20
        } else {
            8
        };
        let store_ts_at = POS_BORN_HOST + born_len;
        let body_len_at = store_ts_at + 8 + store_len + 4 + 8;
        let body_len = read_i32(b, body_len_at)?;
        let body_start = body_len_at + 4;
        if body_len < 0 || body_len as usize > total.saturating_sub(body_start) {
            return Err(RecordError::BadLength {
                field: "body",
                len: body_len.into(),
            });
        }
        let body_end = body_start + body_len as usize;
        let topic_len = *b.get(body_end).ok_or(RecordError::Truncated {
            needed: body_end + 1,
            available: total,
        })? as usize;
        let topic_start = body_end + 1;
        let props_len_at = topic_start + topic_len;
        let props_len = read_bytes::<2>(b, props_len_at).map(i16::from_be_bytes)?;
        let props_start = props_len_at + 2;
        if props_len < 0 {
            return Err(RecordError::BadLength {
                field: "properties",
                len: props_len.into(),
            });
        }
        let props_end = props_start + props_len as usize;
        if props_end != total {
            return Err(RecordError::SizeMismatch {
                fields_end: props_end,
                total_size: total,
            });
        }
        let topic = std::str::from_utf8(&b[topic_start..props_len_at])
            .map_err(|_| RecordError::NotUtf8("topic"))?;
        let props = std::str::from_utf8(&b[props_start..props_end])
            .map_err(|_| RecordError::NotUtf8("properties"))?;
        Ok(RecordView {
            bytes: b,
            store_ts_at,
            body: (body_start, body_end),
            topic,
            props,
        })
    }

    /// Checks BODYCRC, and the `__CRC32#` property when the record has one.
    pub fn verify(&self) -> Result<(), RecordError> {
        let stored = self.body_crc();
        let computed = crc32(self.body());
        if stored != computed {
            return Err(RecordError::BodyCrc { stored, computed });
        }
        if let Some(stored) = self.stored_record_crc() {
            let computed = crc32(&self.bytes[..self.bytes.len() - CRC32_PROPERTY_LEN]);
            if stored != computed {
                return Err(RecordError::RecordCrc { stored, computed });
            }
        }
        Ok(())
    }

    /// The same verdict as [`verify`](Self::verify) in one pass where possible:
    /// the `__CRC32#` property covers every byte before it, the body and BODYCRC
    /// included, so when it is there the body's own CRC adds nothing. Records
    /// without it (written by other brokers) get the body CRC. What every read
    /// of a stored record runs (docs/reliability.md has the cost).
    pub fn verify_once(&self) -> Result<(), RecordError> {
        match self.stored_record_crc() {
            Some(stored) => {
                let computed = crc32(&self.bytes[..self.bytes.len() - CRC32_PROPERTY_LEN]);
                if stored != computed {
                    return Err(RecordError::RecordCrc { stored, computed });
                }
                Ok(())
            }
            None => self.verify(),
        }
    }

    /// [`verify`](Self::verify), and the `__CRC32#` property must be present:
    /// every record this store writes has it, so recovery uses this.
    pub fn verify_strict(&self) -> Result<(), RecordError> {
        if self.stored_record_crc().is_none() {
            return Err(RecordError::MissingRecordCrc);
        }
        self.verify()
    }

    /// The `__CRC32#` value if the properties end with a well-formed one.
    pub fn stored_record_crc(&self) -> Option<u32> {
        let props = self.properties_raw();
        let tail = props.get(props.len().checked_sub(CRC32_PROPERTY_LEN)?..)?;
        let (name, rest) = tail.split_at(property::CRC32.len());
        if name != property::CRC32.as_bytes()
            || rest[0] != NAME_VALUE_SEPARATOR
            || rest[11] != PROPERTY_SEPARATOR
        {
            return None;
        }
        let digits = &rest[1..11];
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let v = digits
            .iter()
            .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
        u32::try_from(v).ok()
    }

    /// The whole record, as stored.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    fn i32_at(&self, at: usize) -> i32 {
        // In bounds: parse checked that the fixed part lies inside the record.
        i32::from_be_bytes(self.bytes[at..at + 4].try_into().unwrap_or_default())
    }

    fn i64_at(&self, at: usize) -> i64 {
        i64::from_be_bytes(self.bytes[at..at + 8].try_into().unwrap_or_default())
    }

    fn host_at(&self, at: usize, v6: bool) -> SocketAddr {
        let b = self.bytes;
        if v6 {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[at..at + 16]);
            let port = self.i32_at(at + 16);
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port as u16)
        } else {
            let ip = Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
            SocketAddr::new(IpAddr::V4(ip), self.i32_at(at + 4) as u16)
        }
    }

    pub fn total_size(&self) -> u32 {
        self.bytes.len() as u32
    }
    pub fn body_crc(&self) -> u32 {
        self.i32_at(8) as u32
    }
    pub fn queue_id(&self) -> i32 {
        self.i32_at(12)
    }
    pub fn flag(&self) -> i32 {
        self.i32_at(16)
    }
    pub fn queue_offset(&self) -> i64 {
        self.i64_at(POS_QUEUE_OFFSET)
    }
    pub fn phys_offset(&self) -> i64 {
        self.i64_at(28)
    }
    pub fn sys_flag(&self) -> i32 {
        self.i32_at(POS_SYS_FLAG)
    }
    pub fn born_timestamp(&self) -> i64 {
        self.i64_at(40)
    }
    pub fn born_host(&self) -> SocketAddr {
        self.host_at(
            POS_BORN_HOST,
            self.sys_flag() & sys_flag::BORNHOST_V6_FLAG != 0,
        )
    }
    pub fn store_timestamp(&self) -> i64 {
        self.i64_at(self.store_ts_at)
    }
    pub fn store_host(&self) -> SocketAddr {
        let v6 = self.sys_flag() & sys_flag::STOREHOSTADDRESS_V6_FLAG != 0;
        self.host_at(self.store_ts_at + 8, v6)
    }
    fn after_store_host(&self) -> usize {
        // RECONSUMETIMES sits right before PREPARED_TRANSACTION_OFFSET and BODYLENGTH.
        self.body.0 - 4 - 8 - 4
    }
    pub fn reconsume_times(&self) -> i32 {
        self.i32_at(self.after_store_host())
    }
    pub fn prepared_transaction_offset(&self) -> i64 {
        self.i64_at(self.after_store_host() + 4)
    }
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[self.body.0..self.body.1]
    }
    pub fn topic(&self) -> &'a str {
        self.topic
    }
    /// The encoded properties section (`name\x01value\x02...`).
    pub fn properties_raw(&self) -> &'a [u8] {
        self.props.as_bytes()
    }
    /// All properties in stored order, including the store's `__CRC32#`.
    pub fn properties(&self) -> Properties<'a> {
        Properties { rest: self.props }
    }
    pub fn property(&self, name: &str) -> Option<&'a str> {
        self.properties().find(|(k, _)| *k == name).map(|(_, v)| v)
    }
    /// Several properties in one pass over the section (the dispatcher needs three
    /// of every record; three `property` calls were three scans).
    pub fn properties_named<const N: usize>(&self, names: [&str; N]) -> [Option<&'a str>; N] {
        let mut out = [None; N];
        let mut left = N;
        for (k, v) in self.properties() {
            if let Some(i) = names.iter().position(|n| *n == k)
                && out[i].is_none()
            {
                out[i] = Some(v);
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        out
    }
    pub fn tags(&self) -> Option<&'a str> {
        self.property(property::TAGS)
    }
    pub fn keys(&self) -> impl Iterator<Item = &'a str> + use<'a> {
        split_keys(self.property(property::KEYS))
    }

    /// The message a producer would have sent, without the store's `__CRC32#`
    /// (re-appending it, e.g. to a retry topic, gets a fresh one).
    pub fn to_message(&self) -> Message {
        let host_bits = sys_flag::BORNHOST_V6_FLAG | sys_flag::STOREHOSTADDRESS_V6_FLAG;
        Message {
            topic: self.topic().to_owned(),
            queue_id: self.queue_id().max(0) as u32,
            flag: self.flag(),
            body: Bytes::copy_from_slice(self.body()),
            properties: self
                .properties()
                .filter(|(k, _)| *k != property::CRC32)
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            sys_flag: self.sys_flag() & !host_bits,
            born_timestamp: self.born_timestamp(),
            born_host: self.born_host(),
            reconsume_times: self.reconsume_times(),
            prepared_transaction_offset: self.prepared_transaction_offset(),
        }
    }
}

/// Parses and verifies (body CRC, and `__CRC32#` when present) the record at the
/// start of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<RecordView<'_>, RecordError> {
    let view = RecordView::parse(bytes)?;
    view.verify()?;
    Ok(view)
}

#[cfg(test)]
mod tests;
