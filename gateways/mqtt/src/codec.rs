//! Framing and version handling on top of the `mqttbytes` codec.
//!
//! The connection works with one packet model, `mqttbytes::v5`, for both protocol
//! versions: MQTT 3.1.1 packets are read with the `v4` codec and lifted into v5
//! values (no properties, success reasons), and v5 values are lowered to v4 on the
//! way out.
//!
//! Gaps of `mqttbytes` 0.6 are covered here: AUTH (enhanced authentication,
//! `codec/auth.rs`) is read and written without it; a v5 DISCONNECT with a
//! remaining length of 0 or 1 (both legal) is read without its codec, and the
//! frame is checked against the size limit before anything is consumed, so an
//! oversize packet is reported as such rather than as garbage; a v5 CONNACK
//! always carries its property length; and what the codec reads without
//! complaint but MQTT requires refusing (fixed-header flags, contradicting
//! CONNECT flags, reserved subscription-option bits) is refused (`check_wire`).

use bytes::{Buf, BufMut, BytesMut};
use mqttbytes::v5::{self, Packet};
use mqttbytes::{QoS, v4};

use crate::outgoing::Outgoing;

mod auth;

pub use auth::{AuthPacket, CONTINUE, REAUTHENTICATE, SUCCESS};

/// What [`read_frame`] takes off the wire: a packet of the `mqttbytes` model, or
/// an AUTH, which that model lacks.
// The packet is kept unboxed, as `read` returns it (no allocation per packet on
// the hot path); the rare AUTH is boxed so a frame is no larger than a packet.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Packet(Packet),
    Auth(Box<AuthPacket>),
}

/// The protocol version of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V4,
    V5,
}

/// Why the bytes received cannot be a packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("packet of {size} bytes is larger than the maximum of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("malformed packet: {0}")]
    Malformed(String),
    #[error("unsupported protocol: {0}")]
    Protocol(String),
}

fn malformed(e: mqttbytes::Error) -> CodecError {
    CodecError::Malformed(format!("{e:?}"))
}

/// Reads the protocol level of a CONNECT at the start of `buf` (after framing):
/// `Ok(None)` when more bytes are needed.
pub fn peek_connect_level(buf: &[u8]) -> Result<Option<u8>, CodecError> {
    let Some((header_len, _)) = fixed_header(buf)? else {
        return Ok(None);
    };
    if buf[0] >> 4 != 1 {
        return Err(CodecError::Protocol(
            "the first packet must be CONNECT".into(),
        ));
    }
    let rest = &buf[header_len..];
    if rest.len() < 2 {
        return Ok(None);
    }
    let name_len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
    if rest.len() < 2 + name_len + 1 {
        return Ok(None);
    }
    let name = &rest[2..2 + name_len];
    if name != b"MQTT" && name != b"MQIsdp" {
        return Err(CodecError::Protocol(format!(
            "protocol name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(Some(rest[2 + name_len]))
}

/// The fixed header at the start of `buf`: `(header length, remaining length)`,
/// or `None` when it is not complete yet.
fn fixed_header(buf: &[u8]) -> Result<Option<(usize, usize)>, CodecError> {
    let mut len = 0usize;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((2 + i, len)));
        }
    }
    Err(CodecError::Malformed(
        "remaining length longer than 4 bytes".into(),
    ))
}

/// Takes one whole packet off the front of `buf`, AUTH included (v5; in 3.1.1
/// packet type 15 is reserved: a protocol error). `Ok(None)`: not complete yet.
pub fn read_frame(
    version: Version,
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Frame>, CodecError> {
    if version == Version::V5 && buf.first().is_some_and(|b| b >> 4 == 15) {
        let Some((header_len, remaining)) = fixed_header(buf)? else {
            return Ok(None);
        };
        let size = header_len + remaining;
        if size > max {
            return Err(CodecError::TooLarge { size, max });
        }
        if buf.len() < size {
            buf.reserve(size - buf.len());
            return Ok(None);
        }
        check_wire(version, &buf[..size], header_len)?;
        let p = auth::read(&buf[header_len..size]);
        buf.advance(size);
        return p.map(|p| Some(Frame::Auth(Box::new(p))));
    }
    read(version, buf, max).map(|p| p.map(Frame::Packet))
}

/// Takes a PUBACK or PUBCOMP in its short form (packet id only: remaining
/// length 2, the form of every successful acknowledgement without properties,
/// in both versions) off the front of `buf`: `Some((packet id, is PUBCOMP))`.
/// Anything else, a partial packet included, is left for [`read_frame`].
///
/// The hot path of QoS 1 fan-out: a thousand subscribers acknowledge every
/// message, and through [`read`] each acknowledgement was framed twice, split
/// into its own `Bytes`, lifted from v4 and matched as a whole `Packet`
/// (~34 % of the broker's CPU at 1 → 1,000, docs/benchmarks.md). What `read`
/// checks of these two bytes is checked here too: the fixed-header flags
/// (MQTT-3.4.1, 3.7.1: 0) by taking only the exact first bytes `0x40` and
/// `0x70`, and the size limit (`max`).
pub fn take_short_ack(buf: &mut BytesMut, max: usize) -> Option<(u16, bool)> {
    let &[first, 2, hi, lo, ..] = &buf[..] else {
        return None;
    };
    let comp = match first {
        0x40 => false,
        0x70 => true,
        _ => return None,
    };
    if max < 4 {
        return None;
    }
    buf.advance(4);
    Some((u16::from_be_bytes([hi, lo]), comp))
}

/// Appends an AUTH packet (v5 only).
pub fn write_auth(p: &AuthPacket, out: &mut BytesMut) -> Result<(), CodecError> {
    auth::write(p, out)
}

/// Takes one whole packet off the front of `buf` (`Ok(None)`: not complete yet);
/// AUTH is refused here, [`read_frame`] reads it.
pub fn read(
    version: Version,
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Packet>, CodecError> {
    let Some((header_len, remaining)) = fixed_header(buf)? else {
        return Ok(None);
    };
    let size = header_len + remaining;
    if size > max {
        return Err(CodecError::TooLarge { size, max });
    }
    if buf.len() < size {
        buf.reserve(size - buf.len());
        return Ok(None);
    }
    let kind = buf[0] >> 4;
    check_wire(version, &buf[..size], header_len)?;
    if kind == 14 && remaining <= 1 {
        let reason = if remaining == 1 { buf[header_len] } else { 0 };
        buf.advance(size);
        let mut d = v5::Disconnect::new();
        d.reason_code = disconnect_reason(reason)?;
        return Ok(Some(Packet::Disconnect(d)));
    }
    if kind == 15 {
        return Err(CodecError::Protocol(match version {
            Version::V4 => "packet type 15 (AUTH) does not exist in MQTT 3.1.1".into(),
            Version::V5 => "AUTH where it is not read".into(),
        }));
    }
    if kind == 10 && version == Version::V5 {
        // Read here: mqttbytes 0.6's v5 UNSUBSCRIBE reader has a stray `dbg!` that
        // prints every packet id to the broker's stderr.
        let unsubscribe = read_unsubscribe_v5(&buf[header_len..size])?;
        buf.advance(size);
        return Ok(Some(Packet::Unsubscribe(unsubscribe)));
    }
    match version {
        Version::V5 => v5::read(buf, max).map(Some).map_err(malformed),
        Version::V4 => v4::read(buf, max).map(|p| Some(lift(p))).map_err(malformed),
    }
}

/// The variable header and payload of a v5 UNSUBSCRIBE: packet id, properties (user
/// properties only), then one or more UTF-8 filters, as `mqttbytes` would return them.
fn read_unsubscribe_v5(body: &[u8]) -> Result<v5::Unsubscribe, CodecError> {
    let bad = |why: &str| CodecError::Malformed(format!("UNSUBSCRIBE: {why}"));
    let mut r = body;
    let take = |r: &mut &[u8], n: usize| -> Result<Vec<u8>, CodecError> {
        if r.len() < n {
            return Err(CodecError::Malformed("UNSUBSCRIBE: cut short".into()));
        }
        let (a, b) = r.split_at(n);
        *r = b;
        Ok(a.to_vec())
    };
    let string = |r: &mut &[u8]| -> Result<String, CodecError> {
        let len = take(r, 2)?;
        let bytes = take(r, usize::from(u16::from_be_bytes([len[0], len[1]])))?;
        String::from_utf8(bytes)
            .map_err(|_| CodecError::Malformed("UNSUBSCRIBE: a string is not UTF-8".into()))
    };
    let pkid = take(&mut r, 2)?;
    let pkid = u16::from_be_bytes([pkid[0], pkid[1]]);
    let mut props_len = 0usize;
    for i in 0.. {
        if i == 4 {
            return Err(bad("property length longer than 4 bytes"));
        }
        let b = take(&mut r, 1)?[0];
        props_len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            break;
        }
    }
    let mut props = &take(&mut r, props_len)?[..];
    let mut user_properties = Vec::new();
    while !props.is_empty() {
        match take(&mut props, 1)?[0] {
            0x26 => {
                let k = string(&mut props)?;
                let v = string(&mut props)?;
                user_properties.push((k, v));
            }
            other => return Err(bad(&format!("property {other:#04x} is not allowed"))),
        }
    }
    let mut filters = Vec::with_capacity(1);
    while !r.is_empty() {
        filters.push(string(&mut r)?);
    }
    Ok(v5::Unsubscribe {
        pkid,
        filters,
        properties: (props_len > 0).then_some(v5::UnsubscribeProperties { user_properties }),
    })
}

/// What `mqttbytes` reads without complaint but MQTT requires the server to
/// refuse: fixed-header flags other than the packet type's (MQTT-3.8.1-1,
/// 3.10.1-1, 3.6.1-1, 3.14.1-1, 3.15.1-1: malformed), CONNECT flags that contradict each
/// other (MQTT-3.1.2-3, 3.1.2-11..15, 3.1.2-22), and reserved bits or Retain
/// Handling 3 in SUBSCRIBE options (MQTT-3.8.3-4 of 3.1.1, 3.8.3-5 of 5.0).
/// `packet` is one whole packet, its variable header at `header_len`.
fn check_wire(version: Version, packet: &[u8], header_len: usize) -> Result<(), CodecError> {
    let kind = packet[0] >> 4;
    let flags = packet[0] & 0x0F;
    let want = match kind {
        1 | 4 | 5 | 7 | 12 | 14 | 15 => Some(0),
        6 | 8 | 10 => Some(0b0010),
        _ => None,
    };
    if let Some(w) = want
        && flags != w
    {
        return Err(CodecError::Malformed(format!(
            "fixed header flags {flags:#06b} of packet type {kind}"
        )));
    }
    let body = &packet[header_len..];
    match kind {
        1 => check_connect_flags(body),
        3 if version == Version::V5 => check_publish_properties(flags, body),
        8 => check_subscribe_options(version, body),
        _ => Ok(()),
    }
}

/// A PUBLISH from a client must not carry a Subscription Identifier (MQTT-3.3.4-6:
/// a protocol error). Refused here, before `mqttbytes` reads the properties: it
/// counts each identifier's type byte twice, so after several identifiers it stops
/// early and reads the properties' last bytes as payload (found by the `mqtt_codec`
/// fuzz target). Anything malformed is left for the codec to report.
fn check_publish_properties(flags: u8, body: &[u8]) -> Result<(), CodecError> {
    let u16_at = |at: usize| -> Option<usize> {
        Some(usize::from(u16::from_be_bytes([
            *body.get(at)?,
            *body.get(at + 1)?,
        ])))
    };
    let Some(topic_len) = u16_at(0) else {
        return Ok(());
    };
    let mut at = 2 + topic_len + if (flags >> 1) & 0x03 > 0 { 2 } else { 0 };
    // The property length (a variable byte integer).
    let mut len = 0usize;
    for i in 0..4 {
        let Some(&b) = body.get(at) else {
            return Ok(());
        };
        at += 1;
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            break;
        }
    }
    let end = (at + len).min(body.len());
    while at < end {
        let step = match body[at] {
            0x0b => {
                return Err(CodecError::Protocol(
                    "a PUBLISH from a client carries a Subscription Identifier (MQTT-3.3.4-6)"
                        .into(),
                ));
            }
            0x01 => 1,
            0x02 => 4,
            0x23 => 2,
            0x03 | 0x08 | 0x09 => match u16_at(at + 1) {
                Some(n) => 2 + n,
                None => return Ok(()),
            },
            0x26 => match u16_at(at + 1).and_then(|k| Some((k, u16_at(at + 3 + k)?))) {
                Some((k, v)) => 2 + k + 2 + v,
                None => return Ok(()),
            },
            _ => return Ok(()),
        };
        at += 1 + step;
    }
    Ok(())
}

fn check_connect_flags(body: &[u8]) -> Result<(), CodecError> {
    if body.len() < 2 {
        return Ok(()); // too short: the codec reports it
    }
    let name_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let (Some(&level), Some(&flags)) = (body.get(2 + name_len), body.get(3 + name_len)) else {
        return Ok(());
    };
    let bad = |why: &str| {
        Err(CodecError::Malformed(format!(
            "CONNECT flags {flags:#010b}: {why}"
        )))
    };
    if flags & 0x01 != 0 {
        return bad("the reserved flag is set");
    }
    let will = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    if !will && (will_qos != 0 || will_retain) {
        return bad("will QoS or will retain without the will flag");
    }
    if will_qos == 3 {
        return bad("will QoS 3");
    }
    if level == 4 && flags & 0x40 != 0 && flags & 0x80 == 0 {
        return bad("a password without a user name");
    }
    Ok(())
}

fn check_subscribe_options(version: Version, body: &[u8]) -> Result<(), CodecError> {
    let mut at = 2; // packet identifier
    if version == Version::V5 {
        let mut len = 0usize;
        for i in 0..4 {
            let Some(&b) = body.get(at) else {
                return Ok(());
            };
            at += 1;
            len |= usize::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                break;
            }
        }
        at += len;
    }
    while at + 2 <= body.len() {
        let n = usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
        at += 2 + n;
        let Some(&opts) = body.get(at) else {
            return Ok(());
        };
        at += 1;
        let reserved = match version {
            Version::V4 => opts & 0xFC,
            Version::V5 => opts & 0xC0,
        };
        if reserved != 0 {
            return Err(CodecError::Malformed(format!(
                "reserved bits set in subscription options {opts:#010b}"
            )));
        }
        if version == Version::V5 && (opts >> 4) & 0x03 == 3 {
            return Err(CodecError::Protocol("retain handling 3".into()));
        }
    }
    Ok(())
}

fn disconnect_reason(code: u8) -> Result<v5::DisconnectReasonCode, CodecError> {
    // The codec's own conversion, through a minimal encoded packet.
    let mut b = BytesMut::from(&[0xE0u8, 2, code, 0][..]);
    match v5::read(&mut b, 16) {
        Ok(Packet::Disconnect(d)) => Ok(d.reason_code),
        _ => Err(CodecError::Malformed(format!(
            "DISCONNECT reason code {code:#04x}"
        ))),
    }
}

/// A v4 packet as the v5 model.
fn lift(p: v4::Packet) -> Packet {
    match p {
        v4::Packet::Connect(c) => {
            let mut out = v5::Connect::new(c.client_id);
            out.protocol = mqttbytes::Protocol::V4;
            out.keep_alive = c.keep_alive;
            out.clean_session = c.clean_session;
            out.last_will = c.last_will.map(|w| v5::LastWill {
                topic: w.topic,
                message: w.message,
                qos: w.qos,
                retain: w.retain,
                properties: None,
            });
            out.login = c.login.map(|l| v5::Login {
                username: l.username,
                password: l.password,
            });
            Packet::Connect(out)
        }
        v4::Packet::Publish(p) => Packet::Publish(v5::Publish {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            topic: p.topic,
            pkid: p.pkid,
            properties: None,
            payload: p.payload,
        }),
        v4::Packet::PubAck(a) => Packet::PubAck(v5::PubAck::new(a.pkid)),
        v4::Packet::PubRec(a) => Packet::PubRec(v5::PubRec::new(a.pkid)),
        v4::Packet::PubRel(a) => Packet::PubRel(v5::PubRel::new(a.pkid)),
        v4::Packet::PubComp(a) => Packet::PubComp(v5::PubComp::new(a.pkid)),
        v4::Packet::Subscribe(s) => Packet::Subscribe(v5::Subscribe {
            pkid: s.pkid,
            filters: s
                .filters
                .into_iter()
                .map(|f| v5::SubscribeFilter::new(f.path, f.qos))
                .collect(),
            properties: None,
        }),
        v4::Packet::Unsubscribe(u) => Packet::Unsubscribe(v5::Unsubscribe {
            pkid: u.pkid,
            filters: u.topics,
            properties: None,
        }),
        v4::Packet::PingReq => Packet::PingReq,
        v4::Packet::PingResp => Packet::PingResp,
        v4::Packet::Disconnect => Packet::Disconnect(v5::Disconnect::new()),
        v4::Packet::ConnAck(_) => Packet::PingResp, // never sent by a client; rejected upstream
        v4::Packet::SubAck(_) => Packet::PingResp,
        v4::Packet::UnsubAck(_) => Packet::PingResp,
    }
}

/// Appends `packet` to `out`, encoded for `version`. Packets a v4 connection has
/// no counterpart for (a server DISCONNECT) are skipped.
pub fn write(version: Version, packet: &Packet, out: &mut BytesMut) -> Result<(), CodecError> {
    let r = match version {
        Version::V5 => match packet {
            // mqttbytes omits the (mandatory) property length when there are none.
            Packet::ConnAck(p) if p.properties.is_none() => {
                let mut p = p.clone();
                p.properties = Some(v5::ConnAckProperties::new());
                p.write(out)
            }
            Packet::ConnAck(p) => p.write(out),
            Packet::Publish(p) => p.write(out),
            Packet::PubAck(p) => p.write(out),
            Packet::PubRec(p) => p.write(out),
            Packet::PubRel(p) => p.write(out),
            Packet::PubComp(p) => p.write(out),
            Packet::SubAck(p) => p.write(out),
            Packet::UnsubAck(p) => p.write(out),
            Packet::PingResp => v5::PingResp.write(out),
            Packet::Disconnect(p) => p.write(out),
            other => {
                return Err(CodecError::Protocol(format!(
                    "server never sends {other:?}"
                )));
            }
        },
        Version::V4 => match packet {
            Packet::ConnAck(p) => {
                v4::ConnAck::new(v4_connack_code(p.code), p.session_present).write(out)
            }
            Packet::Publish(p) => v4::Publish {
                dup: p.dup,
                qos: p.qos,
                retain: p.retain,
                topic: p.topic.clone(),
                pkid: p.pkid,
                payload: p.payload.clone(),
            }
            .write(out),
            Packet::PubAck(p) => v4::PubAck::new(p.pkid).write(out),
            Packet::PubRec(p) => v4::PubRec::new(p.pkid).write(out),
            Packet::PubRel(p) => v4::PubRel::new(p.pkid).write(out),
            Packet::PubComp(p) => v4::PubComp::new(p.pkid).write(out),
            Packet::SubAck(p) => v4::SubAck::new(
                p.pkid,
                p.return_codes
                    .iter()
                    .map(|c| match c {
                        v5::SubscribeReasonCode::QoS0 => {
                            v4::SubscribeReasonCode::Success(QoS::AtMostOnce)
                        }
                        v5::SubscribeReasonCode::QoS1 => {
                            v4::SubscribeReasonCode::Success(QoS::AtLeastOnce)
                        }
                        v5::SubscribeReasonCode::QoS2 => {
                            v4::SubscribeReasonCode::Success(QoS::ExactlyOnce)
                        }
                        _ => v4::SubscribeReasonCode::Failure,
                    })
                    .collect(),
            )
            .write(out),
            Packet::UnsubAck(p) => v4::UnsubAck::new(p.pkid).write(out),
            Packet::PingResp => v4::PingResp.write(out),
            Packet::Disconnect(_) => return Ok(()),
            other => {
                return Err(CodecError::Protocol(format!(
                    "server never sends {other:?}"
                )));
            }
        },
    };
    r.map(|_| ()).map_err(malformed)
}

/// `p` without the server's reason string and user properties: what is sent when
/// they would make the packet larger than the client's Maximum Packet Size.
pub fn without_diagnostics(p: &Packet) -> Packet {
    let mut p = p.clone();
    macro_rules! strip {
        ($props:expr) => {
            if let Some(props) = $props.as_mut() {
                props.reason_string = None;
                props.user_properties.clear();
            }
        };
    }
    match &mut p {
        Packet::ConnAck(a) => strip!(a.properties),
        Packet::PubAck(a) => strip!(a.properties),
        Packet::PubRec(a) => strip!(a.properties),
        Packet::PubRel(a) => strip!(a.properties),
        Packet::PubComp(a) => strip!(a.properties),
        Packet::SubAck(a) => strip!(a.properties),
        Packet::UnsubAck(a) => strip!(a.properties),
        Packet::Disconnect(d) => strip!(d.properties),
        _ => {}
    }
    p
}

/// Appends one PUBLISH (the hot path: no packet enum). An outgoing PUBLISH as
/// a session holds it: 3.1.1, and v5 without properties (an empty property
/// list), straight from its parts; v5 with properties through mqttbytes.
pub fn write_outgoing(
    version: Version,
    p: &Outgoing,
    out: &mut BytesMut,
) -> Result<(), CodecError> {
    match version {
        Version::V5 if p.properties.is_some() => {
            p.to_publish().write(out).map(|_| ()).map_err(malformed)
        }
        _ => publish_plain(version, p, out),
    }
}

/// The bytes [`write_outgoing`] appends for `p` (at most; for the client's
/// maximum packet size).
pub fn outgoing_len(version: Version, p: &Outgoing) -> usize {
    match version {
        Version::V5 if p.properties.is_some() => p.to_publish().len() + 5,
        _ => plain_remaining(version, p) + 5,
    }
}

fn plain_remaining(version: Version, p: &Outgoing) -> usize {
    2 + p.topic.len()
        + if p.qos != QoS::AtMostOnce { 2 } else { 0 }
        + usize::from(version == Version::V5)
        + p.payload.len()
}

/// A PUBLISH without properties straight from its parts: every delivery to a
/// 3.1.1 client goes through here (through [`write`] it was first cloned into
/// mqttbytes' v4 type, its topic copied), and every v5 one without properties
/// (an empty property list after the packet id). Checked before anything is
/// written, so a refused packet leaves `out` as it was.
fn publish_plain(version: Version, p: &Outgoing, out: &mut BytesMut) -> Result<(), CodecError> {
    let with_id = p.qos != QoS::AtMostOnce;
    if with_id && p.pkid == 0 {
        return Err(CodecError::Malformed(
            "QoS 1/2 publish without a packet id".into(),
        ));
    }
    let Ok(topic_len) = u16::try_from(p.topic.len()) else {
        return Err(CodecError::Malformed(
            "topic name longer than 65,535 bytes".into(),
        ));
    };
    let remaining = plain_remaining(version, p);
    if remaining > MAX_REMAINING {
        return Err(CodecError::TooLarge {
            size: remaining,
            max: MAX_REMAINING,
        });
    }
    out.reserve(5 + remaining);
    out.put_u8(0x30 | u8::from(p.dup) << 3 | (p.qos as u8) << 1 | u8::from(p.retain));
    let mut x = remaining;
    loop {
        let byte = (x % 128) as u8;
        x /= 128;
        if x == 0 {
            out.put_u8(byte);
            break;
        }
        out.put_u8(byte | 0x80);
    }
    out.put_u16(topic_len);
    out.extend_from_slice(p.topic.as_bytes());
    if with_id {
        out.put_u16(p.pkid);
    }
    if version == Version::V5 {
        out.put_u8(0); // no properties
    }
    out.extend_from_slice(&p.payload);
    Ok(())
}

/// The largest remaining length a packet can announce (four length bytes).
const MAX_REMAINING: usize = 268_435_455;

fn v4_connack_code(code: v5::ConnectReturnCode) -> v4::ConnectReturnCode {
    use v4::ConnectReturnCode as C4;
    use v5::ConnectReturnCode as C5;
    match code {
        C5::Success => C4::Success,
        C5::UnsupportedProtocolVersion => C4::RefusedProtocolVersion,
        C5::ClientIdentifierNotValid => C4::BadClientId,
        C5::BadUserNamePassword => C4::BadUserNamePassword,
        C5::NotAuthorized => C4::NotAuthorized,
        _ => C4::ServiceUnavailable,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_v5_unsubscribe_reads_as_mqttbytes_writes_it() {
        use super::*;
        let mut u = v5::Unsubscribe::new("a/+/b");
        u.filters.push("c/#".into());
        u.pkid = 7;
        u.properties = Some(v5::UnsubscribeProperties {
            user_properties: vec![("k".into(), "v".into())],
        });
        for case in [u.clone(), v5::Unsubscribe::new("x")] {
            let mut wire = BytesMut::new();
            case.write(&mut wire).unwrap();
            match read(Version::V5, &mut wire, 1024).unwrap() {
                Some(Packet::Unsubscribe(back)) => assert_eq!(back, case),
                other => panic!("{other:?}"),
            }
            assert!(wire.is_empty());
        }
        // A property UNSUBSCRIBE may not carry, a filter that is not UTF-8, a cut string.
        for bad in [
            &[0xA2, 6, 0, 1, 2, 0x0b, 1, 0][..],
            &[0xA2, 6, 0, 1, 0, 0, 1, 0xff][..],
            &[0xA2, 5, 0, 1, 0, 0, 9][..],
        ] {
            let mut wire = BytesMut::from(bad);
            assert!(
                matches!(
                    read(Version::V5, &mut wire, 1024),
                    Err(CodecError::Malformed(_))
                ),
                "{bad:02x?}"
            );
        }
    }

    use super::*;

    fn outgoing(topic: &str, qos: QoS, pkid: u16, payload: &[u8]) -> Outgoing {
        Outgoing {
            topic: topic.into(),
            payload: bytes::Bytes::copy_from_slice(payload),
            properties: None,
            pkid,
            qos,
            retain: false,
            dup: false,
        }
    }

    /// The short-form acknowledgements are taken as `read` reads them, one at a
    /// time off the front; everything else (a longer v5 form, other flags, a
    /// partial packet, a limit below 4 bytes) is left where it was for `read`.
    #[test]
    fn short_acks_are_taken_as_read_reads_them() {
        for version in [Version::V4, Version::V5] {
            let mut wire = BytesMut::new();
            v5::PubAck::new(513).write(&mut wire).unwrap();
            v5::PubComp::new(7).write(&mut wire).unwrap();
            for (pkid, comp) in [(513, false), (7, true)] {
                let mut copy = wire.clone();
                match read(version, &mut copy, 1024).unwrap() {
                    Some(Packet::PubAck(a)) => assert!(!comp && a.pkid == pkid),
                    Some(Packet::PubComp(c)) => assert!(comp && c.pkid == pkid),
                    other => panic!("{other:?}"),
                }
                assert_eq!(take_short_ack(&mut wire, 1024), Some((pkid, comp)));
                assert_eq!(wire, copy, "the same bytes are consumed");
            }
            assert!(wire.is_empty());
        }
        let mut with_reason = BytesMut::new();
        let mut a = v5::PubAck::new(9);
        a.reason = v5::PubAckReason::NoMatchingSubscribers;
        a.write(&mut with_reason).unwrap();
        for left in [
            &with_reason[..],
            &[0x41, 2, 0, 1][..], // reserved flags set: malformed, for `read` to say
            &[0x62, 2, 0, 1][..], // PUBREL
            &[0x40, 2, 0][..],    // not all there yet
            &[0x40][..],
            &[][..],
        ] {
            let mut buf = BytesMut::from(left);
            assert_eq!(take_short_ack(&mut buf, 1024), None, "{left:02x?}");
            assert_eq!(&buf[..], left);
        }
        let mut buf = BytesMut::from(&[0x40, 2, 0, 1][..]);
        assert_eq!(take_short_ack(&mut buf, 3), None, "over the size limit");
        assert!(matches!(
            read(Version::V4, &mut buf, 3),
            Err(CodecError::TooLarge { .. })
        ));
    }

    /// 3.1.1, and v5 without properties (an empty property list): the bytes
    /// mqttbytes would write, within `outgoing_len`, and they read back.
    #[test]
    fn a_publish_without_properties_is_encoded_as_mqttbytes_encodes_it() {
        let long = "x".repeat(300);
        for version in [Version::V4, Version::V5] {
            for (qos, pkid, topic, payload) in [
                (QoS::AtMostOnce, 0, "a/b", vec![]),
                (QoS::AtLeastOnce, 7, "sensors/room-1/temp", b"21.5".to_vec()),
                (QoS::ExactlyOnce, 65535, "t", vec![0xAB; 200]),
                (QoS::AtLeastOnce, 1, long.as_str(), vec![1; 20_000]),
            ] {
                for (dup, retain) in [(false, false), (true, true)] {
                    let mut p = outgoing(topic, qos, pkid, &payload);
                    p.dup = dup;
                    p.retain = retain;
                    let mut ours = BytesMut::new();
                    write_outgoing(version, &p, &mut ours).unwrap();
                    let mut theirs = BytesMut::new();
                    if version == Version::V4 {
                        let mut m = v4::Publish::new(topic, qos, payload.clone());
                        (m.pkid, m.dup, m.retain) = (pkid, dup, retain);
                        m.write(&mut theirs).unwrap();
                    } else {
                        let mut m = v5::Publish::new(topic, qos, payload.clone());
                        (m.pkid, m.dup, m.retain) = (pkid, dup, retain);
                        m.write(&mut theirs).unwrap();
                    }
                    let case = format!("{version:?} {qos:?} {pkid} {} {dup} {retain}", topic.len());
                    assert_eq!(ours, theirs, "{case}");
                    assert!(outgoing_len(version, &p) >= ours.len(), "{case}");
                    // And it reads back as the same publish.
                    let back = read(version, &mut ours, 1 << 20).unwrap().unwrap();
                    assert!(
                        matches!(back, Packet::Publish(b) if b.pkid == pkid && b.topic == topic
                            && b.payload[..] == payload[..] && b.properties.is_none()),
                        "{case}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_v5_publish_is_encoded_with_its_properties() {
        let mut p = outgoing("a/b", QoS::AtLeastOnce, 3, b"hi");
        let mut props = crate::message::empty_props();
        props.content_type = Some("text/plain".into());
        p.properties = Some(Box::new(props));
        let mut out = BytesMut::new();
        write_outgoing(Version::V5, &p, &mut out).unwrap();
        let back = read(Version::V5, &mut out, 1 << 20).unwrap().unwrap();
        assert!(
            matches!(back, Packet::Publish(b) if b.pkid == 3 && b.topic == "a/b"
            && b.properties.as_ref().and_then(|p| p.content_type.as_deref()) == Some("text/plain"))
        );
    }

    #[test]
    fn a_v4_publish_that_cannot_be_encoded_leaves_the_buffer_alone() {
        let mut out = BytesMut::from(&b"before"[..]);
        let p = outgoing("t", QoS::AtLeastOnce, 0, &[1]); // packet id 0
        assert!(write_outgoing(Version::V4, &p, &mut out).is_err());
        let p = outgoing(&"x".repeat(70_000), QoS::AtMostOnce, 0, &[1]);
        assert!(write_outgoing(Version::V4, &p, &mut out).is_err());
        assert_eq!(&out[..], b"before");
    }

    #[test]
    fn short_v5_disconnects_are_read() {
        let mut b = BytesMut::from(&[0xE0u8, 0][..]);
        let p = read(Version::V5, &mut b, 100).unwrap().unwrap();
        assert!(
            matches!(p, Packet::Disconnect(d) if d.reason_code == v5::DisconnectReasonCode::NormalDisconnection)
        );
        let mut b = BytesMut::from(&[0xE0u8, 1, 4][..]);
        let p = read(Version::V5, &mut b, 100).unwrap().unwrap();
        assert!(
            matches!(p, Packet::Disconnect(d) if d.reason_code == v5::DisconnectReasonCode::DisconnectWithWillMessage)
        );
        assert!(b.is_empty());
    }

    #[test]
    fn partial_and_oversize_frames() {
        let mut b = BytesMut::from(&[0x30u8][..]);
        assert_eq!(read(Version::V4, &mut b, 100).unwrap(), None);
        let mut b = BytesMut::from(&[0x30u8, 0xff, 0x7f][..]);
        assert!(matches!(
            read(Version::V4, &mut b, 100),
            Err(CodecError::TooLarge { .. })
        ));
        let mut b = BytesMut::from(&[0x30u8, 0xff, 0xff, 0xff, 0xff, 0x01][..]);
        assert!(matches!(
            read(Version::V4, &mut b, 100),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn what_mqttbytes_takes_but_mqtt_forbids_is_refused() {
        let read4 = |b: &[u8]| read(Version::V4, &mut BytesMut::from(b), 1024);
        let read5 = |b: &[u8]| read(Version::V5, &mut BytesMut::from(b), 1024);
        let malformed =
            |r: Result<Option<Packet>, CodecError>| matches!(r, Err(CodecError::Malformed(_)));
        // SUBSCRIBE / UNSUBSCRIBE / PUBREL / DISCONNECT with other fixed-header flags.
        assert!(malformed(read4(&[0x80, 6, 0, 1, 0, 1, b'a', 1])));
        assert!(malformed(read4(&[0xA0, 5, 0, 1, 0, 1, b'a'])));
        assert!(malformed(read4(&[0x60, 2, 0, 1])));
        assert!(malformed(read4(&[0xE1, 0])));
        assert!(malformed(read5(&[0xE2, 0])));
        // Reserved bits in subscription options; retain handling 3 (v5).
        assert!(malformed(read4(&[0x82, 6, 0, 1, 0, 1, b'a', 0x05])));
        assert!(malformed(read5(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 0xC1])));
        assert!(matches!(
            read5(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x31]),
            Err(CodecError::Protocol(_))
        ));
        assert!(
            read5(&[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x2D])
                .unwrap()
                .is_some()
        );
        // CONNECT: reserved flag, will QoS/retain without a will, a password without a user.
        let connect = |flags: u8| {
            let mut b = vec![
                0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 4, flags, 0, 30, 0, 0,
            ];
            b[1] = (b.len() - 2) as u8;
            read4(&b)
        };
        assert!(connect(0x02).unwrap().is_some());
        for bad in [0x03, 0x0A, 0x22, 0x42] {
            assert!(malformed(connect(bad)), "{bad:#x}");
        }
    }

    #[test]
    fn connect_level_is_peeked() {
        let mut c = v5::Connect::new("x");
        c.protocol = mqttbytes::Protocol::V4;
        let mut b = BytesMut::new();
        c.write(&mut b).unwrap();
        assert_eq!(peek_connect_level(&b).unwrap(), Some(4));
        assert_eq!(peek_connect_level(&b[..3]).unwrap(), None);
        assert!(peek_connect_level(&[0x30, 0]).is_err());
    }

    /// Random bodies behind every packet type, for both versions: the codec answers
    /// with a packet or an error, never a panic.
    #[test]
    fn random_packets_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..200_000u32 {
            let kind = (next() % 16) as u8;
            let flags = (next() % 16) as u8;
            let len = (next() % 40) as usize;
            let mut b = BytesMut::with_capacity(len + 12);
            // Half of the CONNECTs start like real ones, to get past the protocol name.
            let prefix: &[u8] = if kind == 1 && i % 4 < 2 {
                if i % 4 == 0 {
                    b"\x00\x04MQTT\x05"
                } else {
                    b"\x00\x04MQTT\x04"
                }
            } else {
                b""
            };
            let flags = if kind == 1 { 0 } else { flags };
            b.extend_from_slice(&[(kind << 4) | flags, (prefix.len() + len) as u8]);
            b.extend_from_slice(prefix);
            for _ in 0..len {
                b.extend_from_slice(&[(next() % 256) as u8]);
            }
            let version = if i % 2 == 0 { Version::V4 } else { Version::V5 };
            let r = std::panic::catch_unwind(move || {
                let mut b = b;
                let _ = read(version, &mut b, 1024);
                let _ = peek_connect_level(&b);
            });
            assert!(r.is_ok(), "panicked on packet type {kind} ({i})");
        }
    }
}
