//! Unit tests of the record codec: round trips, limits, bit flips, message ids.

use super::*;
use crate::Error;

fn v4(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn sample() -> Message {
    let mut m = Message::new("TopicTest", 3, &b"hello world"[..])
        .with_tags("TagA")
        .with_keys(["order-1", "user-9"])
        .with_property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "7F0000010001")
        .with_property("region", "eu");
    m.flag = 7;
    m.sys_flag = sys_flag::MULTI_TAGS | sys_flag::TRANSACTION_PREPARED_TYPE;
    m.born_timestamp = 1_700_000_000_123;
    m.born_host = v4("10.1.2.3:50123");
    m.reconsume_times = 2;
    m.prepared_transaction_offset = 4242;
    m
}

fn encode_stamped(m: &Message, store: SocketAddr, stamp: Stamp) -> Vec<u8> {
    let mut buf = Vec::new();
    let enc = encode(m, &store, &mut buf).unwrap();
    assert_eq!(enc.len(), buf.len());
    assert_eq!(encoded_len(m, &store).unwrap(), buf.len());
    enc.stamp(&mut buf, &stamp).unwrap();
    buf
}

const STAMP: Stamp = Stamp {
    queue_offset: 17,
    phys_offset: 65_536,
    store_timestamp: 1_700_000_000_456,
};

fn assert_round_trip(m: &Message, store: SocketAddr) {
    let buf = encode_stamped(m, store, STAMP);
    let view = decode(&buf).unwrap();
    view.verify_strict().unwrap();
    assert_eq!(view.total_size() as usize, buf.len());
    assert_eq!(view.queue_offset(), 17);
    assert_eq!(view.phys_offset(), 65_536);
    assert_eq!(view.store_timestamp(), 1_700_000_000_456);
    assert_eq!(view.store_host(), store);
    assert_eq!(view.born_host(), m.born_host);
    assert_eq!(view.body_crc(), crc32(&m.body));
    assert_eq!(view.to_message(), *m);
    assert_eq!(view.as_bytes(), &buf[..]);
}

#[test]
fn magic_codes_match_rocketmq() {
    assert_eq!(MESSAGE_MAGIC_CODE, -626_843_481);
    assert_eq!(BLANK_MAGIC_CODE, -875_286_124);
    assert_eq!(CRC32_PROPERTY_LEN, 20);
}

#[test]
fn round_trip_ipv4() {
    let m = sample();
    assert_round_trip(&m, v4("192.168.0.1:10911"));
    let buf = encode_stamped(&m, v4("192.168.0.1:10911"), STAMP);
    let view = decode(&buf).unwrap();
    assert_eq!(view.topic(), "TopicTest");
    assert_eq!(view.tags(), Some("TagA"));
    assert_eq!(view.keys().collect::<Vec<_>>(), ["order-1", "user-9"]);
    assert_eq!(view.property("region"), Some("eu"));
    assert_eq!(view.queue_id(), 3);
    assert_eq!(view.flag(), 7);
    assert_eq!(view.reconsume_times(), 2);
    assert_eq!(view.prepared_transaction_offset(), 4242);
    assert_eq!(
        sys_flag::transaction_type(view.sys_flag()),
        sys_flag::TRANSACTION_PREPARED_TYPE
    );
    assert_eq!(view.sys_flag() & sys_flag::BORNHOST_V6_FLAG, 0);
    // The CRC property is last and is what verify checks.
    let (k, v) = view.properties().last().unwrap();
    assert_eq!(k, property::CRC32);
    assert_eq!(v.len(), 10);
    assert_eq!(
        view.stored_record_crc(),
        Some(crc32(&buf[..buf.len() - CRC32_PROPERTY_LEN]))
    );
}

#[test]
fn round_trip_ipv6_hosts() {
    let mut m = sample();
    m.born_host = "[2001:db8::1]:4000".parse().unwrap();
    assert_round_trip(&m, "[fe80::2]:10911".parse().unwrap());
    let buf = encode_stamped(&m, "[fe80::2]:10911".parse().unwrap(), STAMP);
    let view = decode(&buf).unwrap();
    assert_ne!(view.sys_flag() & sys_flag::BORNHOST_V6_FLAG, 0);
    assert_ne!(view.sys_flag() & sys_flag::STOREHOSTADDRESS_V6_FLAG, 0);
    // Mixed: v4 born host, v6 store host.
    m.born_host = v4("1.2.3.4:5");
    assert_round_trip(&m, "[::1]:9".parse().unwrap());
}

#[test]
fn round_trip_empty_body_and_binary_body() {
    let mut m = Message::new("t", 0, Bytes::new());
    assert_round_trip(&m, v4("127.0.0.1:1"));
    m.body = Bytes::from_static(&[0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28]);
    assert_round_trip(&m, v4("127.0.0.1:1"));
}

#[test]
fn max_size_properties_fit_and_one_more_byte_does_not() {
    let store = v4("127.0.0.1:1");
    // name "p" + 0x01 + value + 0x02 + the 20-byte CRC property = i16::MAX.
    let value_len = MAX_PROPERTIES_LEN - CRC32_PROPERTY_LEN - 3;
    let m = Message::new("t", 0, &b"x"[..]).with_property("p", "v".repeat(value_len));
    assert_round_trip(&m, store);
    let too_big = Message::new("t", 0, &b"x"[..]).with_property("p", "v".repeat(value_len + 1));
    assert!(matches!(
        encode(&too_big, &store, &mut Vec::new()),
        Err(Error::InvalidMessage(_))
    ));
}

#[test]
fn invalid_messages_are_errors_not_truncation() {
    let store = v4("127.0.0.1:1");
    let long_topic = Message::new("t".repeat(128), 0, Bytes::new());
    assert!(encode(&long_topic, &store, &mut Vec::new()).is_err());
    let ok_topic = Message::new("t".repeat(127), 0, Bytes::new());
    assert_round_trip(&ok_topic, store);
    for bad in [
        Message::new("", 0, Bytes::new()),
        Message::new("t", 0, Bytes::new()).with_property("a\u{1}b", "v"),
        Message::new("t", 0, Bytes::new()).with_property("a", "v\u{2}"),
        Message::new("t", 0, Bytes::new()).with_property(property::CRC32, "0"),
        Message::new("t", u32::MAX, Bytes::new()),
    ] {
        assert!(encode(&bad, &store, &mut Vec::new()).is_err(), "{bad:?}");
    }
}

#[test]
fn any_flipped_bit_is_detected() {
    let buf = encode_stamped(&sample(), v4("127.0.0.1:10911"), STAMP);
    for byte in 0..buf.len() {
        for bit in 0..8 {
            let mut b = buf.clone();
            b[byte] ^= 1 << bit;
            let ok = RecordView::parse(&b).and_then(|v| v.verify_strict());
            assert!(
                ok.is_err(),
                "flip of bit {bit} in byte {byte} went unnoticed"
            );
        }
    }
}

#[test]
fn headers() {
    let mut blank = [0u8; 8];
    write_blank(&mut blank, 4096);
    assert_eq!(read_header(&blank), Ok(Header::Blank { size: 4096 }));
    assert_eq!(read_header(&[0; 8]), Ok(Header::Zero));
    assert!(read_header(&[0; 7]).is_err());
    assert!(matches!(
        read_header(&[0, 0, 0, 1, 1, 2, 3, 4]),
        Err(RecordError::BadMagic(_))
    ));
    let buf = encode_stamped(&sample(), v4("127.0.0.1:1"), STAMP);
    assert_eq!(
        read_header(&buf),
        Ok(Header::Message {
            size: buf.len() as u32
        })
    );
}

#[test]
fn msg_id_round_trip() {
    let host = v4("192.168.1.20:10911");
    let id = encode_msg_id(host, 0x1234_5678_9ABC);
    assert_eq!(id, "C0A8011400002A9F0000123456789ABC");
    assert_eq!(decode_msg_id(&id).unwrap(), (host, 0x1234_5678_9ABC));
    assert_eq!(
        decode_msg_id(&id.to_lowercase()).unwrap(),
        (host, 0x1234_5678_9ABC)
    );
    let v6: SocketAddr = "[2001:db8::7]:10911".parse().unwrap();
    let id6 = encode_msg_id(v6, 42);
    assert_eq!(id6.len(), 56);
    assert_eq!(decode_msg_id(&id6).unwrap(), (v6, 42));
    for bad in [
        "",
        "XYZ",
        &id[1..],
        "G0A8011400002A9F0000123456789ABC",
        "é0A8011400002A9F0000123456789AB",
    ] {
        assert!(decode_msg_id(bad).is_err(), "{bad}");
    }
}

#[test]
fn message_property_helpers() {
    let mut m = Message::new("t", 0, Bytes::new()).with_tags("A");
    m.insert_property(property::TAGS, "B");
    assert_eq!(m.tags(), Some("B"));
    assert_eq!(m.properties.len(), 1);
    assert_eq!(m.keys().count(), 0);
    assert_eq!(m.remove_property(property::TAGS).as_deref(), Some("B"));
    assert_eq!(m.tags(), None);
}

fn joined(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(NAME_VALUE_SEPARATOR);
        out.extend_from_slice(v.as_bytes());
        out.push(PROPERTY_SEPARATOR);
    }
    out
}

#[test]
fn pre_encoded_properties_make_the_same_record_as_pairs() {
    let store = v4("127.0.0.1:10911");
    // Small (CRC of the stamped bytes) and large (combined piece CRCs) records.
    for body_len in [11, 6000] {
        let mut m = sample();
        m.body = Bytes::from(vec![7u8; body_len]);
        let raw = joined(&m.properties);
        assert!(is_plain_properties(&raw, &[]));
        let stamp = Stamp {
            queue_offset: 9,
            phys_offset: 1 << 33,
            store_timestamp: 1_700_000_000_999,
        };
        let from_pairs = encode_stamped(&m, store, stamp);
        let mut parts = Parts::of(&m);
        parts.properties = Props::Encoded(&raw);
        let mut from_raw = Vec::new();
        let enc = encode_parts(&parts, &store, &mut from_raw).unwrap();
        enc.stamp(&mut from_raw, &stamp).unwrap();
        assert_eq!(from_raw, from_pairs, "body of {body_len} bytes");
        let view = decode(&from_raw).unwrap();
        view.verify_strict().unwrap();
        assert_eq!(view.to_message(), m);
    }
}

#[test]
fn plain_properties_are_exactly_the_encoder_form() {
    let plain = |s: &[u8]| is_plain_properties(s, &[property::DELAY_TIME_LEVEL]);
    assert!(plain(b""));
    assert!(plain(
        b"TAGS\x01a\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02e\x01\x02"
    ));
    assert!(plain("r\u{1}\u{e9}t\u{e9}\u{2}".as_bytes()));
    // Each of these is parsed the general way instead.
    assert!(!plain(b"TAGS\x01a"), "no final separator");
    assert!(!plain(b"TAGS\x01a\x02TAGS\x01b\x02"), "a repeated name");
    assert!(!plain(b"\x01a\x02"), "an empty name");
    assert!(!plain(b"junk\x02TAGS\x01a\x02"), "an item without a value");
    assert!(!plain(b"A\x011\x012\x02"), "two name/value separators");
    assert!(!plain(b"__CRC32#\x01123\x02"), "the store's own property");
    assert!(!plain(b"DELAY\x013\x02"), "a reserved name");
    assert!(!plain(b"A\x01\xff\x02"), "not UTF-8");
    let many: Vec<u8> = (0..40)
        .flat_map(|i| format!("p{i}\x01v\x02").into_bytes())
        .collect();
    assert!(
        !plain(&many),
        "more properties than the duplicate check handles"
    );
}

#[test]
fn properties_parse_like_java() {
    let raw = "x\u{2}A\u{1}1\u{1}2\u{2}B\u{1}2\u{2}C\u{1}\u{2}B\u{1}3";
    assert_eq!(
        parse_properties(raw),
        vec![("B".into(), "3".into()), ("C".into(), String::new())]
    );
}

#[test]
fn batch_ids_are_the_offset_ids_joined() {
    let sent = BatchSent {
        topic: "t".into(),
        queue_id: 1,
        store_host: v4("10.0.0.1:10911"),
        store_timestamp: 1,
        records: vec![
            Placed {
                phys_offset: 0,
                size: 100,
                queue_offset: 5,
            },
            Placed {
                phys_offset: 100,
                size: 50,
                queue_offset: 6,
            },
        ],
    };
    let ids = format!(
        "{},{}",
        encode_msg_id(sent.store_host, 0),
        encode_msg_id(sent.store_host, 100)
    );
    assert_eq!(sent.joined_msg_ids(','), ids);
    assert_eq!(sent.msg_id(1), Some(encode_msg_id(sent.store_host, 100)));
    assert_eq!(sent.end_offset(), 150);
}

#[test]
fn properties_split_as_the_separators_say() {
    let cases = [
        "",
        "\u{2}",
        "\u{2}\u{2}",
        "TAGS\u{1}a\u{2}",
        "TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}",
        "TAGS\u{1}a\u{2}KEYS\u{1}k",
        "no-value\u{2}x\u{1}y\u{2}",
        "\u{1}empty-name\u{2}",
        "a\u{1}\u{2}",
        "a\u{1}b\u{1}c\u{2}",
        "ünï\u{1}cødé ✓\u{2}名前\u{1}値\u{2}",
        "a\u{1}b\u{2}\u{2}c\u{1}d",
    ];
    let record = encode_stamped(&sample(), v4("127.0.0.1:10911"), STAMP);
    for raw in cases {
        let view = RecordView {
            props: raw,
            ..RecordView::parse(&record).unwrap()
        };
        let expected: Vec<(&str, &str)> = raw
            .split('\u{2}')
            .filter_map(|item| item.split_once('\u{1}'))
            .collect();
        assert_eq!(view.properties().collect::<Vec<_>>(), expected, "{raw:?}");
    }
}
