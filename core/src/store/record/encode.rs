//! Encoding a record: a caller's message (a [`Message`], or one entry of an
//! [`EncodedBatch`](super::EncodedBatch) whose properties arrive already in the
//! stored encoding) into RocketMQ's layout with the log-assigned fields left
//! zero, and [`Encoded::stamp`], which fills them in under the log's lock.

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

use super::{
    CRC32_PROPERTY_LEN, MAX_PROPERTIES_LEN, MAX_TOPIC_LEN, MESSAGE_MAGIC_CODE, MIN_RECORD_LEN,
    Message, NAME_VALUE_SEPARATOR, POS_QUEUE_OFFSET, POS_SYS_FLAG, PROPERTY_SEPARATOR, RecordError,
    crc32, property, sys_flag,
};
use crate::error::{Error, Result};

/// The fields of a record that only the log knows, filled in under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub queue_offset: u64,
    pub phys_offset: u64,
    pub store_timestamp: i64,
}

/// Partial CRCs of the bytes of a large record that do not change at stamping.
#[derive(Debug, Clone)]
struct PieceCrcs {
    /// CRC of bytes `[0, 20)` (before QUEUEOFFSET).
    head: crc32fast::Hasher,
    /// CRC of bytes `[36, store_ts_at)` (SYSFLAG .. BORNHOST).
    mid: crc32fast::Hasher,
    /// CRC of bytes `[store_ts_at + 8, len - CRC32_PROPERTY_LEN)`.
    tail: crc32fast::Hasher,
}

/// A record encoded by [`encode`] whose log-assigned fields are still zero.
/// A record above [`DIRECT_CRC_MAX`] carries partial CRCs of the bytes that do not
/// change, so [`Encoded::stamp`] costs O(log len) instead of a pass over the body
/// while the log's lock is held; a smaller one carries none (computing them was a
/// second CRC pass over every small record that stamping never used).
#[derive(Debug, Clone)]
pub struct Encoded {
    len: usize,
    store_ts_at: usize,
    pieces: Option<Box<PieceCrcs>>,
}

impl Encoded {
    /// Encoded length of the record in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes queue offset, physical offset and store timestamp into `record`
    /// (the bytes [`encode`] produced) and then the `__CRC32#` value over
    /// `[0, len - CRC32_PROPERTY_LEN)`, which now includes those fields.
    pub fn stamp(&self, record: &mut [u8], stamp: &Stamp) -> Result<(), RecordError> {
        if record.len() != self.len {
            return Err(RecordError::Truncated {
                needed: self.len,
                available: record.len(),
            });
        }
        let mut offsets = [0u8; 16];
        offsets[..8].copy_from_slice(&stamp.queue_offset.to_be_bytes());
        offsets[8..].copy_from_slice(&stamp.phys_offset.to_be_bytes());
        let ts = stamp.store_timestamp.to_be_bytes();
        record[POS_QUEUE_OFFSET..POS_SYS_FLAG].copy_from_slice(&offsets);
        record[self.store_ts_at..self.store_ts_at + 8].copy_from_slice(&ts);

        // Up to a few KiB, hashing the stamped record again is cheaper than two
        // `combine`s of the pre-computed pieces (GF(2) matrix work: ~15 % of all
        // instructions of a 100 B batch append); above that, combining keeps the
        // work under the append lock independent of the size.
        let crc = match &self.pieces {
            Some(p) => {
                let mut crc = p.head.clone();
                crc.update(&offsets);
                crc.combine(&p.mid);
                crc.update(&ts);
                crc.combine(&p.tail);
                crc
            }
            None => {
                let mut h = crc32fast::Hasher::new();
                h.update(&record[..self.len - CRC32_PROPERTY_LEN]);
                h
            }
        };
        write_crc_digits(&mut record[self.len - 11..self.len - 1], java_crc(crc));
        Ok(())
    }
}

/// Records up to this size get their `__CRC32#` by hashing the stamped bytes, larger
/// ones by combining CRCs computed before the append lock (see [`Encoded::stamp`]).
const DIRECT_CRC_MAX: usize = 4096;

/// RocketMQ's `UtilAll.crc32`: the CRC32 with the sign bit cleared.
fn java_crc(h: crc32fast::Hasher) -> u32 {
    h.finalize() & 0x7FFF_FFFF
}

fn write_crc_digits(out: &mut [u8], crc: u32) {
    let mut v = crc;
    for b in out.iter_mut().rev() {
        *b = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

fn host_len(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 8,
        SocketAddr::V6(_) => 20,
    }
}

pub(crate) fn put_host(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => out.extend_from_slice(&ip.octets()),
        IpAddr::V6(ip) => out.extend_from_slice(&ip.octets()),
    }
    out.extend_from_slice(&i32::from(addr.port()).to_be_bytes());
}

fn check_property_text(s: &str, what: &str) -> Result<()> {
    if s.bytes()
        .any(|b| b == NAME_VALUE_SEPARATOR || b == PROPERTY_SEPARATOR)
    {
        return Err(Error::InvalidMessage(format!(
            "property {what} {s:?} contains a reserved separator byte (0x01 or 0x02)"
        )));
    }
    Ok(())
}

/// A record's properties as the caller has them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Props<'a> {
    /// Name/value pairs, checked and joined by the encoder.
    Pairs(&'a [(String, String)]),
    /// Already `name\x01value\x02…`, and checked by
    /// [`super::batch::is_plain_properties`]: copied through as they are.
    Encoded(&'a [u8]),
}

/// What a record is made of, borrowed from whatever the caller holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub flag: i32,
    pub body: &'a [u8],
    pub properties: Props<'a>,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: &'a SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

impl<'a> Parts<'a> {
    pub(crate) fn of(msg: &'a Message) -> Parts<'a> {
        Parts {
            topic: &msg.topic,
            queue_id: msg.queue_id,
            flag: msg.flag,
            body: &msg.body,
            properties: Props::Pairs(&msg.properties),
            sys_flag: msg.sys_flag,
            born_timestamp: msg.born_timestamp,
            born_host: &msg.born_host,
            reconsume_times: msg.reconsume_times,
            prepared_transaction_offset: msg.prepared_transaction_offset,
        }
    }
}

impl Parts<'_> {
    /// About the encoded length (exact for IPv4 hosts), without the checks: for
    /// sizing a batch's buffer once instead of growing it record by record.
    pub(crate) fn size_hint(&self) -> usize {
        let props = match self.properties {
            Props::Pairs(pairs) => pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum(),
            Props::Encoded(raw) => raw.len(),
        };
        MIN_RECORD_LEN + self.body.len() + self.topic.len() + props + CRC32_PROPERTY_LEN
    }
}

/// Length of the properties section including the `__CRC32#` property.
fn properties_len(props: Props<'_>) -> Result<usize> {
    let mut len = CRC32_PROPERTY_LEN;
    match props {
        Props::Pairs(pairs) => {
            for (k, v) in pairs {
                if k.is_empty() {
                    return Err(Error::InvalidMessage("empty property name".into()));
                }
                if k == property::CRC32 {
                    return Err(Error::InvalidMessage(format!(
                        "property {} is reserved for the store",
                        property::CRC32
                    )));
                }
                check_property_text(k, "name")?;
                check_property_text(v, "value")?;
                len += k.len() + v.len() + 2;
            }
        }
        Props::Encoded(raw) => len += raw.len(),
    }
    if len > MAX_PROPERTIES_LEN {
        return Err(Error::InvalidMessage(format!(
            "properties take {len} bytes encoded; the maximum is {MAX_PROPERTIES_LEN}"
        )));
    }
    Ok(len)
}

/// Encoded size of `msg` when stored by a broker at `store_host`.
pub fn encoded_len(msg: &Message, store_host: &SocketAddr) -> Result<usize> {
    parts_len(&Parts::of(msg), store_host).map(|(len, _)| len)
}

/// The record length and the properties section's length.
fn parts_len(p: &Parts<'_>, store_host: &SocketAddr) -> Result<(usize, usize)> {
    if p.topic.is_empty() || p.topic.len() > MAX_TOPIC_LEN {
        return Err(Error::InvalidMessage(format!(
            "topic is {} bytes; it must be 1..={MAX_TOPIC_LEN}",
            p.topic.len()
        )));
    }
    if p.queue_id > i32::MAX as u32 {
        return Err(Error::InvalidMessage(format!(
            "queue id {} exceeds {}",
            p.queue_id,
            i32::MAX
        )));
    }
    if p.body.len() > i32::MAX as usize {
        return Err(Error::MessageTooLarge {
            size: p.body.len(),
            max: i32::MAX as usize,
        });
    }
    let props_len = properties_len(p.properties)?;
    let len = MIN_RECORD_LEN - 16
        + host_len(p.born_host)
        + host_len(store_host)
        + p.body.len()
        + p.topic.len()
        + props_len;
    if len > i32::MAX as usize {
        return Err(Error::MessageTooLarge {
            size: len,
            max: i32::MAX as usize,
        });
    }
    Ok((len, props_len))
}

/// Appends the record for `msg` to `out`, with QUEUEOFFSET, PHYSICALOFFSET,
/// STORETIMESTAMP and the `__CRC32#` value left as zeros for [`Encoded::stamp`].
pub fn encode(msg: &Message, store_host: &SocketAddr, out: &mut Vec<u8>) -> Result<Encoded> {
    encode_parts(&Parts::of(msg), store_host, out)
}

/// [`encode`] of borrowed parts.
pub(crate) fn encode_parts(
    p: &Parts<'_>,
    store_host: &SocketAddr,
    out: &mut Vec<u8>,
) -> Result<Encoded> {
    let (len, props_len) = parts_len(p, store_host)?;
    let start = out.len();
    out.reserve(len);
    let mut sys = p.sys_flag & !(sys_flag::BORNHOST_V6_FLAG | sys_flag::STOREHOSTADDRESS_V6_FLAG);
    if p.born_host.is_ipv6() {
        sys |= sys_flag::BORNHOST_V6_FLAG;
    }
    if store_host.is_ipv6() {
        sys |= sys_flag::STOREHOSTADDRESS_V6_FLAG;
    }
    out.extend_from_slice(&(len as i32).to_be_bytes());
    out.extend_from_slice(&MESSAGE_MAGIC_CODE.to_be_bytes());
    out.extend_from_slice(&(crc32(p.body) as i32).to_be_bytes());
    out.extend_from_slice(&(p.queue_id as i32).to_be_bytes());
    out.extend_from_slice(&p.flag.to_be_bytes());
    out.extend_from_slice(&[0u8; 16]); // queue offset, physical offset
    out.extend_from_slice(&sys.to_be_bytes());
    out.extend_from_slice(&p.born_timestamp.to_be_bytes());
    put_host(out, p.born_host);
    let store_ts_at = out.len() - start;
    out.extend_from_slice(&[0u8; 8]); // store timestamp
    put_host(out, store_host);
    out.extend_from_slice(&p.reconsume_times.to_be_bytes());
    out.extend_from_slice(&p.prepared_transaction_offset.to_be_bytes());
    out.extend_from_slice(&(p.body.len() as i32).to_be_bytes());
    out.extend_from_slice(p.body);
    out.push(p.topic.len() as u8);
    out.extend_from_slice(p.topic.as_bytes());
    out.extend_from_slice(&(props_len as i16).to_be_bytes());
    match p.properties {
        Props::Pairs(pairs) => {
            for (k, v) in pairs {
                out.extend_from_slice(k.as_bytes());
                out.push(NAME_VALUE_SEPARATOR);
                out.extend_from_slice(v.as_bytes());
                out.push(PROPERTY_SEPARATOR);
            }
        }
        Props::Encoded(raw) => out.extend_from_slice(raw),
    }
    out.extend_from_slice(property::CRC32.as_bytes());
    out.push(NAME_VALUE_SEPARATOR);
    out.extend_from_slice(b"0000000000");
    out.push(PROPERTY_SEPARATOR);
    debug_assert_eq!(out.len() - start, len);

    let pieces = (len > DIRECT_CRC_MAX).then(|| {
        let rec = &out[start..];
        let hasher = |r: Range<usize>| {
            let mut h = crc32fast::Hasher::new();
            h.update(&rec[r]);
            h
        };
        Box::new(PieceCrcs {
            head: hasher(0..POS_QUEUE_OFFSET),
            mid: hasher(POS_SYS_FLAG..store_ts_at),
            tail: hasher(store_ts_at + 8..len - CRC32_PROPERTY_LEN),
        })
    });
    Ok(Encoded {
        len,
        store_ts_at,
        pieces,
    })
}
