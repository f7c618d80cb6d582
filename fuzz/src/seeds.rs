//! Seed inputs for each target, made with the real encoders so the fuzzer starts
//! from valid inputs and mutates from there (`cargo run -p rocketgate-fuzz --bin
//! seeds` writes them into `fuzz/corpus/<target>/`; the replay test runs them too).

use bytes::{Bytes, BytesMut};
use mqttbytes::QoS;
use mqttbytes::v5;
use rocketgate_core::store::record::{self, Message, Stamp};
use rocketgate_remoting::{FrameCodec, RemotingCommand};

use crate::STORE_HOST;

/// `(target, seeds)` for every target.
pub fn all() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        ("remoting_decode", remoting()),
        (
            "auth",
            remoting().into_iter().map(|s| s[1..].to_vec()).collect(),
        ),
        ("mqtt_codec", mqtt_codec()),
        ("mqtt_session", mqtt_session()),
        ("ws_json", ws_json()),
        ("http_json", http_json()),
        ("sql92", sql92()),
        ("record", records()),
        ("recovery", recovery()),
    ]
}

fn remoting() -> Vec<Vec<u8>> {
    let codec = FrameCodec::new(64 * 1024);
    let commands = [
        RemotingCommand::request(10, 1)
            .with_field("topic", "orders")
            .with_field("queueId", 0)
            .with_body(Bytes::from_static(b"hello")),
        RemotingCommand::request(105, 2).with_remark("route"),
        RemotingCommand::request(34, 3)
            .with_field("AccessKey", "ak")
            .with_field("Signature", "c2ln"),
    ];
    commands
        .iter()
        .map(|c| {
            let mut out = BytesMut::new();
            codec.encode(c, &mut out).expect("encode a seed frame");
            let mut seed = vec![7u8];
            seed.extend_from_slice(&out);
            seed
        })
        .collect()
}

fn v5_packets() -> Vec<v5::Packet> {
    let mut connect = v5::Connect::new("seed");
    connect.keep_alive = 30;
    let mut publish = v5::Publish::new("a/b", QoS::AtLeastOnce, b"payload".to_vec());
    publish.pkid = 1;
    publish.properties = Some(v5::PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(60),
        topic_alias: Some(1),
        response_topic: None,
        correlation_data: None,
        user_properties: vec![("k".into(), "v".into())],
        subscription_identifiers: Vec::new(),
        content_type: Some("text/plain".into()),
    });
    vec![
        v5::Packet::Connect(connect),
        v5::Packet::Publish(publish),
        v5::Packet::Subscribe(v5::Subscribe::new("a/+/c", QoS::AtLeastOnce)),
        v5::Packet::PubAck(v5::PubAck::new(1)),
        v5::Packet::PingReq,
        v5::Packet::Unsubscribe(v5::Unsubscribe::new("a/#")),
        v5::Packet::Disconnect(v5::Disconnect::new()),
    ]
}

fn encode_v5(packets: &[v5::Packet]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for p in packets {
        let _ = match p {
            v5::Packet::Connect(c) => c.write(&mut out),
            v5::Packet::Publish(c) => c.write(&mut out),
            v5::Packet::Subscribe(c) => c.write(&mut out),
            v5::Packet::PubAck(c) => c.write(&mut out),
            v5::Packet::PingReq => v5::PingReq.write(&mut out),
            v5::Packet::Unsubscribe(c) => c.write(&mut out),
            v5::Packet::Disconnect(c) => c.write(&mut out),
            _ => Ok(0),
        };
    }
    out.to_vec()
}

fn v4_stream() -> Vec<u8> {
    use mqttbytes::v4;
    let mut out = BytesMut::new();
    let _ = v4::Connect::new("seed").write(&mut out);
    let mut p = v4::Publish::new("a/b", QoS::AtLeastOnce, b"x".to_vec());
    p.pkid = 2;
    let _ = p.write(&mut out);
    let _ = v4::Subscribe::new("a/#", QoS::AtMostOnce).write(&mut out);
    let _ = v4::PingReq.write(&mut out);
    let _ = v4::Disconnect.write(&mut out);
    out.to_vec()
}

fn mqtt_codec() -> Vec<Vec<u8>> {
    let v5 = encode_v5(&v5_packets());
    let v4 = v4_stream();
    vec![
        [&[0x01 | (3 << 1), 200][..], &v5].concat(),
        [&[64 << 1, 200][..], &v4].concat(),
        [&[0x01, 1][..], &v5].concat(),
        [&[0x01 | (4 << 1), 200][..], &auth_packets()].concat(),
    ]
}

/// AUTH packets (MQTT 5 enhanced authentication; `mqttbytes` has no encoder for
/// them): a SCRAM continue with method, data, reason string and a user property,
/// a re-authentication, and the two-byte success form.
fn auth_packets() -> Vec<u8> {
    let mut props = Vec::new();
    for (id, v) in [
        (0x15u8, &b"SCRAM-SHA-256"[..]),
        (0x16, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"),
        (0x1F, b"why"),
    ] {
        props.push(id);
        props.extend_from_slice(&(v.len() as u16).to_be_bytes());
        props.extend_from_slice(v);
    }
    props.extend_from_slice(&[0x26, 0, 1, b'k', 0, 1, b'v']);
    let mut out = Vec::new();
    for reason in [0x18u8, 0x19] {
        out.push(0xF0);
        out.push((2 + props.len()) as u8);
        out.push(reason);
        out.push(props.len() as u8);
        out.extend_from_slice(&props);
    }
    out.extend_from_slice(&[0xF0, 0x00]);
    out
}

fn mqtt_session() -> Vec<Vec<u8>> {
    // After the CONNECT the target sends itself: the rest of a session.
    let v5 = encode_v5(&v5_packets()[1..]);
    let mut v4 = v4_stream();
    // Drop the v4 CONNECT (its length is the second byte + 2).
    v4.drain(..usize::from(v4[1]) + 2);
    vec![
        [&[0x01 | (5 << 1)][..], &v5].concat(),
        [&[0x00][..], &v4].concat(),
        // AUTH on a connection that did not use enhanced authentication: DISCONNECT 0x82.
        [&[0x01][..], &auth_packets()].concat(),
    ]
}

fn ws_json() -> Vec<Vec<u8>> {
    [
        r#"{"op":"subscribe","req":1,"topic":"orders","group":"g","start":"earliest"}"#,
        r#"{"op":"publish","req":2,"topic":"orders","body":"aGk=","body_encoding":"base64","tag":"t","keys":["k"]}"#,
        r#"{"op":"ack","req":3,"subscription":"s1","handle":"h"}"#,
        r#"{"op":"credit","req":4,"subscription":"s1","credit":10}"#,
        r#"{"op":"auth","req":5,"token":"abc"}"#,
        r#"{"op":"unsubscribe","req":6,"subscription":"s1"}"#,
        r#"[1,2,3]"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fn http_json() -> Vec<Vec<u8>> {
    [
        r#"[{"body":"hello","tag":"t","keys":["a","b"],"properties":{"color":"red"}},{"body":"aGk=","body_encoding":"base64"}]"#,
        r#"{"name":"orders","queues":8,"perm":"rw"}"#,
        r#"{"handles":["h1","h2"]}"#,
        r#"{"handle":"h","invisible_secs":30}"#,
        r#"{"topic":"orders","to":"earliest"}"#,
        r#"{"max_reconsume_times":3,"consume_order":"fifo"}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fn sql92() -> Vec<Vec<u8>> {
    [
        "a > 5 AND b = 'x'\0a=7\nb=x",
        "TAGS IN ('t1', 't2') OR NOT (c BETWEEN 1 AND 10)\0TAGS=t1\nc=3",
        "a IS NOT NULL AND d LIKE 'ab%'\0a=1\nd=abc",
        "((((a = 1))))\0a=1",
        "t1 || t2\0TAGS=t2",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fn encoded(msg: &Message, phys: u64, qoff: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let enc = record::encode(msg, &STORE_HOST, &mut out).expect("encode a seed record");
    enc.stamp(
        &mut out,
        &Stamp {
            queue_offset: qoff,
            phys_offset: phys,
            store_timestamp: 1_700_000_000_000 + qoff as i64,
        },
    )
    .expect("stamp a seed record");
    out
}

fn records() -> Vec<Vec<u8>> {
    let a = Message::new("orders", 1, &b"first body"[..])
        .with_tags("t1")
        .with_keys(["k1", "k2"])
        .with_property("color", "red");
    let b = Message::new("empty", 0, Bytes::new());
    vec![
        encoded(&a, 0, 0),
        encoded(&b, 4096, 3),
        b"orders\0a body".to_vec(),
    ]
}

fn recovery() -> Vec<Vec<u8>> {
    let mut log = Vec::new();
    for i in 0..3u64 {
        let m = Message::new("orders", 0, format!("message {i}").into_bytes()).with_tags("t");
        let rec = encoded(&m, log.len() as u64, i);
        log.extend_from_slice(&rec);
    }
    let whole = log.clone();
    // A torn tail: the last record cut in half.
    let torn = whole[..whole.len() - 20].to_vec();
    // A flipped bit in the second record's body.
    let mut flipped = whole.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x10;
    vec![whole, torn, flipped]
}
