//! MQTT PUBLISH <-> core message, per the one mapping (`topic.rs`): topic `T/rest`
//! is core topic `T` (escaped when `T` is no plain core name) + tag `rest`; user
//! properties travel as message properties under their own names (reserved
//! names are dropped); MQTT fields travel as `mqtt.*` properties.

use std::borrow::Cow;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::{BufMut, Bytes, BytesMut};
use mqttbytes::QoS;
use mqttbytes::v5::{Publish, PublishProperties};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::{NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, property};

use crate::topic;

pub const P_QOS: &str = "mqtt.qos";
pub const P_CLIENT: &str = "mqtt.client";
pub const P_RETAIN: &str = "mqtt.retain";
pub const P_CONTENT_TYPE: &str = "mqtt.content_type";
pub const P_RESPONSE_TOPIC: &str = "mqtt.response_topic";
pub const P_CORRELATION: &str = "mqtt.correlation_data";
pub const P_PAYLOAD_FORMAT: &str = "mqtt.payload_format";
pub const P_EXPIRY_AT: &str = "mqtt.expiry_at";
/// A PUBLISH's user properties as a JSON list of `[name, value]` pairs, kept when
/// message properties cannot carry them exactly: a name given twice, a reserved
/// or empty name, or a separator character (MQTT-3.3.2-17/18: all of them, in
/// order). The ones that can be are message properties as well, for the other
/// doors (a repeated name with its last value).
pub const P_USER_PROPERTIES: &str = "mqtt.user_properties";
/// The MQTT first level of a message whose core topic is a shortened escaped
/// name ([`topic::is_shortened`]), which cannot be decoded.
pub const P_FIRST_LEVEL: &str = "mqtt.first_level";

/// The most bytes of a topic name kept in a message: the tag (and the first
/// level of a shortened core topic) are message properties, which the core
/// stores in at most 32,767 bytes; 1 KiB of those is left for the others.
pub const MAX_STORED_NAME: usize = rocketgate_core::store::record::MAX_PROPERTIES_LEN - 1024;

/// True for property names a user may not set: RocketMQ's system properties
/// (all-uppercase names such as `TAGS`, `KEYS`, `UNIQ_KEY`, `__STARTDELIVERTIME`)
/// and the `mqtt.` namespace.
pub fn is_reserved(name: &str) -> bool {
    // On bytes where that is the same (every delivery asks this of its record's
    // property names): an ASCII letter is one byte and never part of another char.
    let lowercase = |name: &str| match name.is_ascii() {
        true => name.bytes().any(|b| b.is_ascii_lowercase()),
        false => name.chars().any(char::is_lowercase),
    };
    name.starts_with("mqtt.") || (name.bytes().any(|b| b.is_ascii_uppercase()) && !lowercase(name))
}

fn storable(s: &str) -> bool {
    !s.contains(['\u{1}', '\u{2}'])
}

/// The prefix of a delayed publish: `$delayed/<seconds>/<topic name>` is stored as
/// `<topic name>` and delivered `<seconds>` later (EMQX's convention).
pub const DELAYED_PREFIX: &str = "$delayed/";

/// Splits `$delayed/<seconds>/<name>` into the delay in seconds and the real topic
/// name; `Ok(None)` for any other name.
pub fn delayed(name: &str) -> Result<Option<(u32, &str)>, Refused> {
    let Some(rest) = name.strip_prefix(DELAYED_PREFIX) else {
        return Ok(None);
    };
    let bad = || Refused {
        code: 0x90,
        reason: format!(
            "{name:?}: a delayed publish is $delayed/<seconds>/<topic>, seconds a whole number"
        ),
    };
    let (secs, real) = rest.split_once('/').ok_or_else(bad)?;
    if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) || real.is_empty() {
        return Err(bad());
    }
    let secs: u32 = secs.parse().map_err(|_| bad())?;
    Ok(Some((secs, real)))
}

/// A publish the core cannot take, and the v5 reason for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// MQTT 5 reason code (PUBACK / PUBREC).
    pub code: u8,
    pub reason: String,
}

pub use rocketgate_core::clock::now_ms;

/// The core message of a PUBLISH whose topic is resolved (`name`).
pub fn to_core(
    name: &str,
    p: &Publish,
    client_id: &str,
    peer: std::net::SocketAddr,
    now: i64,
) -> Result<Message, Refused> {
    let delay = delayed(name)?;
    let name = delay.map_or(name, |(_, real)| real);
    if delay.is_some() && p.retain {
        return Err(Refused {
            code: 0x83,
            reason: "a delayed publish cannot be retained".into(),
        });
    }
    let (core_topic, tag) = split_checked(name)?;
    let kept = topic::is_shortened(&core_topic).then(|| topic::split(name).0);
    let mut m = Message::new(core_topic, 0, p.payload.clone());
    m.born_timestamp = now;
    m.born_host = peer;
    if let Some(tag) = tag {
        m = m.with_tags(tag);
    }
    if let Some(level) = kept {
        m.insert_property(P_FIRST_LEVEL, level);
    }
    m.insert_property(P_QOS, (p.qos as u8).to_string());
    if let Some((secs, _)) = delay.filter(|(secs, _)| *secs > 0) {
        m.insert_property(
            rocketgate_core::store::record::property::TIMER_DELAY_MS,
            (u64::from(secs) * 1000).to_string(),
        );
    }
    if storable(client_id) {
        m.insert_property(P_CLIENT, client_id);
    }
    if p.retain {
        m.insert_property(P_RETAIN, "1");
    }
    if let Some(props) = &p.properties {
        if props.payload_format_indicator == Some(1) {
            if std::str::from_utf8(&p.payload).is_err() {
                return Err(Refused {
                    code: 0x99,
                    reason: "payload format indicator says UTF-8 but the payload is not".into(),
                });
            }
            m.insert_property(P_PAYLOAD_FORMAT, "1");
        }
        if let Some(secs) = props.message_expiry_interval {
            m.insert_property(P_EXPIRY_AT, (now + i64::from(secs) * 1000).to_string());
        }
        if let Some(ct) = props.content_type.as_deref().filter(|s| storable(s)) {
            m.insert_property(P_CONTENT_TYPE, ct);
        }
        if let Some(rt) = props.response_topic.as_deref() {
            if topic::check_name(rt).is_err() {
                return Err(Refused {
                    code: 0x82,
                    reason: format!("response topic {rt:?} is not a topic name"),
                });
            }
            if storable(rt) {
                m.insert_property(P_RESPONSE_TOPIC, rt);
            }
        }
        if let Some(cd) = &props.correlation_data {
            m.insert_property(P_CORRELATION, B64.encode(cd));
        }
        let plain =
            |k: &str, v: &str| !is_reserved(k) && !k.is_empty() && storable(k) && storable(v);
        let ups = &props.user_properties;
        let exact = ups
            .iter()
            .enumerate()
            .all(|(i, (k, v))| plain(k, v) && !ups[..i].iter().any(|(seen, _)| seen == k));
        if !exact {
            // JSON escapes the separators, so the list is always storable.
            if let Ok(list) = serde_json::to_string(ups) {
                m.insert_property(P_USER_PROPERTIES, list);
            }
        }
        for (k, v) in ups {
            if plain(k, v) {
                m.insert_property(k.clone(), v.clone());
            }
        }
    }
    Ok(m)
}

/// A topic name as core topic ([`topic::core_of`]) and tag, both storable. What
/// it refuses is a name MQTT allows but this broker does not take (0x90).
fn split_checked(name: &str) -> Result<(Cow<'_, str>, Option<&str>), Refused> {
    if topic::is_sys(name) {
        return Err(Refused {
            code: 0x90,
            reason: "$SYS/ topics are the broker's own; clients cannot publish to them".into(),
        });
    }
    let (level, tag) = topic::split(name);
    if !storable(name) {
        return Err(Refused {
            code: 0x90,
            reason: "topic contains control characters 0x01/0x02".into(),
        });
    }
    let core_topic = topic::core_of(level);
    let kept = if topic::is_shortened(&core_topic) {
        level.len()
    } else {
        0
    };
    if tag.map_or(0, str::len) + kept > MAX_STORED_NAME {
        return Err(Refused {
            code: 0x90,
            reason: format!(
                "topic name of {} bytes: this broker stores names of up to {MAX_STORED_NAME} bytes",
                name.len()
            ),
        });
    }
    Ok((core_topic, tag))
}

/// Whether [`to_core`] would give this publish only the plain properties of
/// [`write_plain_properties`]: no v5 properties, not retained, not delayed (a
/// device's usual publish). Such a publish is stored without a `Message` (a
/// `String` per property name and value) in between. Returns the length of the
/// core topic at the start of `p.topic`; `None` when the publish needs
/// [`to_core`].
pub fn plain_core_len(p: &Publish) -> Option<Result<usize, Refused>> {
    if p.retain || p.properties.is_some() || p.topic.starts_with(DELAYED_PREFIX) {
        return None;
    }
    match split_checked(&p.topic) {
        Ok((Cow::Borrowed(core), _)) => Some(Ok(core.len())),
        // An escaped core topic is not a prefix of the name: a `Message` it is.
        Ok((Cow::Owned(_), _)) => None,
        Err(r) => Some(Err(r)),
    }
}

/// The properties [`to_core`] gives a publish that [`plain_core_len`] accepts,
/// in the stored encoding (`name\x01value\x02…`), at the end of `out`. `name`
/// is its topic name and `core_len` the length of its core topic.
pub fn write_plain_properties(
    name: &str,
    core_len: usize,
    qos: QoS,
    client_id: &str,
    out: &mut BytesMut,
) {
    let mut put = |name: &str, value: &str| {
        out.extend_from_slice(name.as_bytes());
        out.put_u8(NAME_VALUE_SEPARATOR);
        out.extend_from_slice(value.as_bytes());
        out.put_u8(PROPERTY_SEPARATOR);
    };
    if name.len() > core_len {
        // `T/rest`: tag `rest` (`T/` has the empty tag, as in `topic::split`).
        put(property::TAGS, &name[core_len + 1..]);
    }
    put(P_QOS, ["0", "1", "2"][qos as usize]);
    if storable(client_id) {
        put(P_CLIENT, client_id);
    }
}

/// What the gateway reads from a stored message's properties.
#[derive(Debug, Default)]
pub struct Meta<'a> {
    /// The QoS it was published with (none: it came from another door).
    pub qos: Option<QoS>,
    /// The MQTT client that published it.
    pub origin: Option<&'a str>,
    /// Published with the retain flag.
    pub retain: bool,
    pub expiry_at: Option<i64>,
    /// It has properties a v5 delivery carries (user properties, content type,
    /// response topic, correlation data, payload format).
    pub v5_properties: bool,
}

/// What delivery to a 3.1.1 session needs of a stored message (its [`Meta`] and
/// where its payload is), worked out once per batch by the router instead of by
/// every session it goes to (in a fan-out to a thousand sessions, each parsed
/// every record's properties: `read_meta` was 12.5 % of the broker).
#[derive(Debug, Clone)]
pub struct Head {
    pub qos: Option<QoS>,
    pub retain: bool,
    pub expiry_at: Option<i64>,
    /// A v5 session must parse the record for its properties ([`Meta::v5_properties`]).
    pub v5_properties: bool,
    /// Byte ranges in the record.
    origin: Option<(u32, u32)>,
    body: (u32, u32),
}

impl Head {
    /// `view` is a parse of `record`.
    pub fn of(record: &[u8], view: &rocketgate_core::store::RecordView<'_>) -> Option<Head> {
        let base = record.as_ptr() as usize;
        let range = |s: &[u8]| -> Option<(u32, u32)> {
            let start = (s.as_ptr() as usize).checked_sub(base)?;
            let end = start.checked_add(s.len())?;
            (end <= record.len()).then_some((u32::try_from(start).ok()?, u32::try_from(end).ok()?))
        };
        let meta = read_meta(view.properties(), None);
        Some(Head {
            qos: meta.qos,
            retain: meta.retain,
            expiry_at: meta.expiry_at,
            v5_properties: meta.v5_properties,
            origin: match meta.origin {
                Some(o) => Some(range(o.as_bytes())?),
                None => None,
            },
            body: range(view.body())?,
        })
    }

    /// The publishing client (`record` is the one this head was made of).
    pub fn origin<'a>(&self, record: &'a [u8]) -> Option<&'a str> {
        let (a, b) = self.origin?;
        std::str::from_utf8(record.get(a as usize..b as usize)?).ok()
    }

    /// The payload, a slice of `record`.
    pub fn body(&self, record: &Bytes) -> Bytes {
        record.slice(self.body.0 as usize..self.body.1 as usize)
    }
}

/// Reads the mqtt properties; with `props_out`, also builds the v5 PUBLISH
/// properties (user properties = every non-reserved property).
pub fn read_meta<'a>(
    props: impl Iterator<Item = (&'a str, &'a str)>,
    mut props_out: Option<&mut PublishProperties>,
) -> Meta<'a> {
    let mut meta = Meta::default();
    let mut exact_list = None;
    for (k, v) in props {
        match k {
            P_QOS => {
                meta.qos = match v {
                    "0" => Some(QoS::AtMostOnce),
                    "1" => Some(QoS::AtLeastOnce),
                    "2" => Some(QoS::ExactlyOnce),
                    _ => None,
                }
            }
            P_CLIENT => meta.origin = Some(v),
            P_RETAIN => meta.retain = v == "1",
            P_EXPIRY_AT => meta.expiry_at = v.parse().ok(),
            _ => {
                let given = matches!(
                    k,
                    P_CONTENT_TYPE
                        | P_RESPONSE_TOPIC
                        | P_CORRELATION
                        | P_PAYLOAD_FORMAT
                        | P_USER_PROPERTIES
                ) || !is_reserved(k);
                meta.v5_properties |= given;
                let Some(out) = props_out.as_deref_mut().filter(|_| given) else {
                    continue;
                };
                match k {
                    P_CONTENT_TYPE => out.content_type = Some(v.to_owned()),
                    P_RESPONSE_TOPIC => out.response_topic = Some(v.to_owned()),
                    P_CORRELATION => out.correlation_data = B64.decode(v).ok().map(Bytes::from),
                    P_PAYLOAD_FORMAT => out.payload_format_indicator = v.parse().ok(),
                    P_USER_PROPERTIES => exact_list = serde_json::from_str(v).ok(),
                    _ if is_reserved(k) => {}
                    _ => out.user_properties.push((k.to_owned(), v.to_owned())),
                }
            }
        }
    }
    if let (Some(out), Some(list)) = (props_out, exact_list) {
        out.user_properties = list;
    }
    meta
}

/// Empty v5 publish properties.
pub fn empty_props() -> PublishProperties {
    PublishProperties {
        payload_format_indicator: None,
        message_expiry_interval: None,
        topic_alias: None,
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
        subscription_identifiers: Vec::new(),
        content_type: None,
    }
}

/// True when `p` has nothing to encode (a v5 PUBLISH then carries an empty
/// property list).
pub fn no_properties(p: &PublishProperties) -> bool {
    p.payload_format_indicator.is_none()
        && p.message_expiry_interval.is_none()
        && p.topic_alias.is_none()
        && p.response_topic.is_none()
        && p.correlation_data.is_none()
        && p.user_properties.is_empty()
        && p.subscription_identifiers.is_empty()
        && p.content_type.is_none()
}

/// Seconds left until `expiry_at` (None: no expiry); `Err(())` when expired.
pub fn remaining_expiry(expiry_at: Option<i64>, now: i64) -> Result<Option<u32>, ()> {
    match expiry_at {
        None => Ok(None),
        Some(at) if at <= now => Err(()),
        Some(at) => Ok(Some(
            ((at - now + 999) / 1000).min(i64::from(u32::MAX)) as u32
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names() {
        for n in [
            "TAGS",
            "KEYS",
            "UNIQ_KEY",
            "__STARTDELIVERTIME",
            "__CRC32#",
            "TIMER_X",
            "mqtt.qos",
            "ÜBER_X",
        ] {
            assert!(is_reserved(n), "{n}");
        }
        for n in ["color", "Color", "x-Trace", "a1", "Überall", "ÜÖ", "DAßX"] {
            assert!(!is_reserved(n), "{n}");
        }
    }

    #[test]
    fn round_trip_of_v5_fields() {
        let mut p = Publish::new("sensors/room1/temp", QoS::AtLeastOnce, "21.5");
        let mut props = empty_props();
        props.content_type = Some("text/plain".into());
        props.response_topic = Some("replies/1".into());
        props.correlation_data = Some(Bytes::from_static(b"\x00\x01id"));
        props.payload_format_indicator = Some(1);
        props.message_expiry_interval = Some(60);
        props.user_properties = vec![("color".into(), "red".into()), ("TAGS".into(), "x".into())];
        p.properties = Some(props);
        let peer = "127.0.0.1:1".parse().unwrap();
        let m = to_core("sensors/room1/temp", &p, "c1", peer, 1000).unwrap();
        assert_eq!(m.topic, "sensors");
        assert_eq!(m.tags(), Some("room1/temp"));
        assert_eq!(m.property("color"), Some("red"));
        assert_eq!(m.property(P_EXPIRY_AT), Some("61000"));
        let mut out = empty_props();
        let meta = read_meta(
            m.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            Some(&mut out),
        );
        assert_eq!(meta.qos, Some(QoS::AtLeastOnce));
        assert_eq!(meta.origin, Some("c1"));
        assert_eq!(out.content_type.as_deref(), Some("text/plain"));
        assert_eq!(out.correlation_data.as_deref(), Some(&b"\x00\x01id"[..]));
        // A reserved name is no message property of its own (the user's `TAGS`
        // is not the tag), but MQTT subscribers get every user property back, in
        // order (MQTT-3.3.2-17/18).
        assert_eq!(m.property("TAGS"), Some("room1/temp"));
        assert_eq!(
            out.user_properties,
            vec![
                ("color".to_string(), "red".to_string()),
                ("TAGS".to_string(), "x".to_string())
            ]
        );
        assert_eq!(remaining_expiry(meta.expiry_at, 31_000), Ok(Some(30)));
        assert!(remaining_expiry(meta.expiry_at, 61_000).is_err());
    }

    #[test]
    fn user_properties_keep_order_and_repeated_names() {
        let peer = "127.0.0.1:1".parse().unwrap();
        let ups = |list: &[(&str, &str)]| {
            let mut p = Publish::new("a/b", QoS::AtLeastOnce, "x");
            let mut props = empty_props();
            props.user_properties = list
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            p.properties = Some(props);
            let m = to_core("a/b", &p, "c", peer, 0).unwrap();
            let mut out = empty_props();
            read_meta(
                m.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                Some(&mut out),
            );
            (m, out.user_properties)
        };
        let given = [("k", "2"), ("a", "1"), ("k", "1"), ("sep", "x\u{1}y")];
        let (m, back) = ups(&given);
        let want: Vec<(String, String)> = given
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(back, want);
        // The other doors see the plain ones (a repeated name with its last value).
        assert_eq!(m.property("k"), Some("1"));
        assert_eq!(m.property("sep"), None);
        // Distinct plain names need no list: stored as they are.
        let (m, back) = ups(&[("b", "1"), ("a", "2")]);
        assert_eq!(m.property(P_USER_PROPERTIES), None);
        assert_eq!(
            back,
            vec![("b".into(), "1".into()), ("a".into(), "2".into())]
        );
    }

    #[test]
    fn delayed_prefix_sets_the_delay_and_strips_itself() {
        let peer = "127.0.0.1:1".parse().unwrap();
        let name = "$delayed/15/sensors/room1/temp";
        let p = Publish::new(name, QoS::AtLeastOnce, "x");
        let m = to_core(name, &p, "c", peer, 0).unwrap();
        assert_eq!(m.topic, "sensors");
        assert_eq!(m.tags(), Some("room1/temp"));
        assert_eq!(m.property("TIMER_DELAY_MS"), Some("15000"));
        let m = to_core("$delayed/0/sensors", &p, "c", peer, 0).unwrap();
        assert_eq!((m.topic.as_str(), m.tags()), ("sensors", None));
        assert_eq!(m.property("TIMER_DELAY_MS"), None);
        for bad in [
            "$delayed/x/sensors",
            "$delayed/15",
            "$delayed/15/",
            "$delayed//sensors",
            "$delayed/-1/sensors",
            "$delayed/99999999999/sensors",
        ] {
            assert_eq!(
                to_core(bad, &p, "c", peer, 0).unwrap_err().code,
                0x90,
                "{bad}"
            );
        }
        let mut retained = Publish::new(name, QoS::AtLeastOnce, "x");
        retained.retain = true;
        assert_eq!(
            to_core(name, &retained, "c", peer, 0).unwrap_err().code,
            0x83
        );
    }

    #[test]
    fn any_first_level_is_stored_under_its_escaped_core_topic() {
        let peer = "127.0.0.1:1".parse().unwrap();
        let p = Publish::new("my topic/x", QoS::AtLeastOnce, "x");
        let m = to_core("my topic/x", &p, "c", peer, 0).unwrap();
        assert_eq!(
            (m.topic.as_str(), m.tags()),
            ("%MQTT%my%20topic", Some("x"))
        );
        assert_eq!(m.property(P_FIRST_LEVEL), None, "decodable: nothing kept");
        let long = format!("{}/x", "é".repeat(100));
        let p = Publish::new(long.clone(), QoS::AtLeastOnce, "x");
        let m = to_core(&long, &p, "c", peer, 0).unwrap();
        assert!(topic::is_shortened(&m.topic), "{}", m.topic);
        assert_eq!(m.property(P_FIRST_LEVEL), Some("é".repeat(100).as_str()));
    }

    #[test]
    fn names_the_broker_does_not_take_are_refused_with_a_reason() {
        let peer = "127.0.0.1:1".parse().unwrap();
        let too_long = format!("a/{}", "b".repeat(MAX_STORED_NAME + 1));
        for name in ["$SYS/broker/uptime", "$SYS", too_long.as_str(), "t/a\u{1}b"] {
            let p = Publish::new(name, QoS::AtLeastOnce, "x");
            let e = to_core(name, &p, "c", peer, 0).unwrap_err();
            assert_eq!(e.code, 0x90, "{name}");
            assert!(!e.reason.is_empty());
        }
        let fits = format!("a/{}", "b".repeat(MAX_STORED_NAME));
        let p = Publish::new(fits.clone(), QoS::AtLeastOnce, "x");
        assert!(to_core(&fits, &p, "c", peer, 0).is_ok());
        let p = Publish::new("$SYSTEM/x", QoS::AtLeastOnce, "x");
        assert!(to_core("$SYSTEM/x", &p, "c", peer, 0).is_ok());
    }

    #[test]
    fn plain_properties_are_what_to_core_gives_and_stored_as_they_are() {
        use rocketgate_core::broker::SEND_TIME_PROPERTIES;
        use rocketgate_core::store::record::{is_plain_properties, parse_properties};
        let peer = "127.0.0.1:1".parse().unwrap();
        for name in ["sensors/room1/temp", "sensors", "sensors/", "a/b/c/d"] {
            for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
                for client in ["dev-1", "", "bad\u{1}id"] {
                    let p = Publish::new(name, qos, "x");
                    let core_len = plain_core_len(&p).unwrap().unwrap();
                    let m = to_core(name, &p, client, peer, 0).unwrap();
                    assert_eq!(&name[..core_len], m.topic);
                    let mut out = BytesMut::new();
                    write_plain_properties(name, core_len, qos, client, &mut out);
                    assert!(
                        is_plain_properties(&out, &SEND_TIME_PROPERTIES),
                        "{name} {client:?}"
                    );
                    let parsed = parse_properties(std::str::from_utf8(&out).unwrap());
                    assert_eq!(parsed, m.properties, "{name} {qos:?} {client:?}");
                }
            }
        }
    }

    #[test]
    fn only_plain_publishes_take_the_plain_way() {
        let mut retained = Publish::new("t/x", QoS::AtLeastOnce, "x");
        retained.retain = true;
        assert!(plain_core_len(&retained).is_none());
        let delayed = Publish::new("$delayed/5/t/x", QoS::AtLeastOnce, "x");
        assert!(plain_core_len(&delayed).is_none());
        let mut with_props = Publish::new("t/x", QoS::AtLeastOnce, "x");
        with_props.properties = Some(empty_props());
        assert!(plain_core_len(&with_props).is_none());
        let escaped = Publish::new("bad topic/x", QoS::AtLeastOnce, "x");
        assert!(plain_core_len(&escaped).is_none());
        let sys = Publish::new("$SYS/x", QoS::AtLeastOnce, "x");
        assert_eq!(plain_core_len(&sys).unwrap().unwrap_err().code, 0x90);
        let control = Publish::new("t/a\u{2}b", QoS::AtLeastOnce, "x");
        assert_eq!(plain_core_len(&control).unwrap().unwrap_err().code, 0x90);
    }
}
