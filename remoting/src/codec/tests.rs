use bytes::BytesMut;
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::*;

/// GET_ROUTEINFO_BY_TOPIC for `TopicTest`, opaque 3, version 401, as a Java 4.9.4 client
/// writes it with a JSON header.
fn java_json_route_request() -> Vec<u8> {
    let header = br#"{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":3,"serializeTypeCurrentRPC":"JSON","version":401}"#;
    let mut f = Vec::new();
    f.extend_from_slice(&(4 + header.len() as u32).to_be_bytes());
    f.extend_from_slice(&(header.len() as u32).to_be_bytes()); // type byte 0 = JSON
    f.extend_from_slice(header);
    f
}

/// The same request with a ROCKETMQ binary header, byte by byte.
#[rustfmt::skip]
const BINARY_ROUTE_REQUEST: &[u8] = &[
    0x00, 0x00, 0x00, 0x2d,             // total = 45
    0x01, 0x00, 0x00, 0x29,             // type 1 (ROCKETMQ), header length 41
    0x00, 0x69,                         // code 105
    0x00,                               // language JAVA
    0x01, 0x91,                         // version 401
    0x00, 0x00, 0x00, 0x03,             // opaque 3
    0x00, 0x00, 0x00, 0x00,             // flag 0 (request)
    0x00, 0x00, 0x00, 0x00,             // remark length 0
    0x00, 0x00, 0x00, 0x14,             // ext fields length 20
    0x00, 0x05, b't', b'o', b'p', b'i', b'c',
    0x00, 0x00, 0x00, 0x09, b'T', b'o', b'p', b'i', b'c', b'T', b'e', b's', b't',
];

fn route_request(serialize_type: SerializeType) -> RemotingCommand {
    RemotingCommand {
        code: 105,
        language: LanguageCode::Java,
        version: 401,
        opaque: 3,
        serialize_type,
        ..Default::default()
    }
    .with_field("topic", "TopicTest")
}

fn decode_all(bytes: &[u8]) -> Result<Option<RemotingCommand>, CodecError> {
    decode(&mut BytesMut::from(bytes))
}

#[test]
fn decodes_java_json_fixture() {
    let cmd = decode_all(&java_json_route_request()).unwrap().unwrap();
    assert_eq!(cmd, route_request(SerializeType::Json));
    assert!(!cmd.is_response() && !cmd.is_oneway());
}

#[test]
fn decodes_binary_fixture() {
    let cmd = decode_all(BINARY_ROUTE_REQUEST).unwrap().unwrap();
    assert_eq!(cmd, route_request(SerializeType::RocketMq));
}

#[test]
fn encodes_both_fixtures_byte_for_byte() {
    let mut out = BytesMut::new();
    encode(&route_request(SerializeType::Json), &mut out).unwrap();
    assert_eq!(&out[..], &java_json_route_request()[..]);

    let mut out = BytesMut::new();
    encode(&route_request(SerializeType::RocketMq), &mut out).unwrap();
    assert_eq!(&out[..], BINARY_ROUTE_REQUEST);
}

#[test]
fn round_trips_response_with_remark_and_body() {
    for st in [SerializeType::Json, SerializeType::RocketMq] {
        let req = route_request(st);
        let resp = RemotingCommand::response_to(&req, 17)
            .with_remark("No topic route info in name server for the topic: TopicTest \"x\" ü")
            .with_field("k", "v")
            .with_body(&b"\x00\x01body"[..]);
        let mut buf = BytesMut::new();
        encode(&resp, &mut buf).unwrap();
        let back = decode(&mut buf).unwrap().unwrap();
        assert!(buf.is_empty());
        assert_eq!(back, resp);
        assert!(back.is_response());
        assert_eq!(back.opaque, 3);
    }
}

#[test]
fn every_prefix_is_incomplete_and_untouched() {
    for frame in [java_json_route_request(), BINARY_ROUTE_REQUEST.to_vec()] {
        for n in 0..frame.len() {
            let mut buf = BytesMut::from(&frame[..n]);
            assert!(decode(&mut buf).unwrap().is_none(), "prefix {n}");
            assert_eq!(&buf[..], &frame[..n]);
        }
    }
}

#[test]
fn back_to_back_frames_decode_one_at_a_time() {
    let mut buf = BytesMut::new();
    buf.extend_from_slice(BINARY_ROUTE_REQUEST);
    buf.extend_from_slice(&java_json_route_request());
    buf.extend_from_slice(&BINARY_ROUTE_REQUEST[..10]);
    let a = decode(&mut buf).unwrap().unwrap();
    let b = decode(&mut buf).unwrap().unwrap();
    assert_eq!(a.serialize_type, SerializeType::RocketMq);
    assert_eq!(b.serialize_type, SerializeType::Json);
    assert!(decode(&mut buf).unwrap().is_none());
    assert_eq!(buf.len(), 10);
}

#[test]
fn huge_length_prefix_is_rejected_before_buffering() {
    let err = decode_all(&[0x80, 0, 0, 0]).unwrap_err();
    assert!(
        matches!(
            err,
            CodecError::FrameTooLarge {
                len: 0x8000_0000,
                ..
            }
        ),
        "{err}"
    );
    let small = FrameCodec::new(100);
    let err = small
        .decode(&mut BytesMut::from(&[0, 0, 0, 101][..]))
        .unwrap_err();
    assert!(matches!(
        err,
        CodecError::FrameTooLarge { len: 101, max: 100 }
    ));
}

#[test]
fn malformed_frames_are_typed_errors() {
    let err = decode_all(&[0, 0, 0, 2, 0, 0]).unwrap_err();
    assert!(matches!(err, CodecError::FrameTooShort { len: 2 }));

    let err = decode_all(&[0, 0, 0, 6, 0, 0, 0, 9, b'{', b'}']).unwrap_err();
    assert!(matches!(
        err,
        CodecError::HeaderOutOfBounds { header_len: 9, .. }
    ));

    let err = decode_all(&[0, 0, 0, 6, 7, 0, 0, 2, b'{', b'}']).unwrap_err();
    assert!(matches!(err, CodecError::UnknownSerializeType(7)));

    let err = decode_all(&[0, 0, 0, 7, 0, 0, 0, 3, b'{', b'x', b'[']).unwrap_err();
    assert!(matches!(err, CodecError::JsonHeader(_)));

    let mut truncated_ext = BINARY_ROUTE_REQUEST.to_vec();
    truncated_ext[28] = 0x15; // ext length 21 but only 20 bytes follow
    let err = decode_all(&truncated_ext).unwrap_err();
    assert!(matches!(err, CodecError::BinaryHeader { .. }));
}

#[test]
fn json_header_is_read_liberally() {
    // Bare keys, single quotes, a numeric language, non-string ext values, unknown fields.
    let header = br#"{code:34,'language':9,"opaque":11,"flag":2,"extFields":{0:'zero',"n":5,"b":true,"z":null},"whatever":[1,2]}"#;
    let mut f = Vec::new();
    f.extend_from_slice(&(4 + header.len() as u32 + 3).to_be_bytes());
    f.extend_from_slice(&(header.len() as u32).to_be_bytes());
    f.extend_from_slice(header);
    f.extend_from_slice(b"abc");
    let cmd = decode_all(&f).unwrap().unwrap();
    assert_eq!(cmd.code, 34);
    assert_eq!(cmd.language, LanguageCode::Go);
    assert!(cmd.is_oneway());
    assert_eq!(cmd.field("0"), Some("zero"));
    assert_eq!(cmd.field("n"), Some("5"));
    assert_eq!(cmd.field("b"), Some("true"));
    assert_eq!(cmd.field("z"), None);
    assert_eq!(&cmd.body[..], b"abc");
}

#[test]
fn codes_too_wide_for_binary_fall_back_to_json() {
    let pop = RemotingCommand {
        code: 200050,
        serialize_type: SerializeType::RocketMq,
        ..Default::default()
    };
    let mut buf = BytesMut::new();
    encode(&pop, &mut buf).unwrap();
    assert_eq!(buf[4], 0, "JSON type byte");
    assert_eq!(decode(&mut buf).unwrap().unwrap().code, 200050);
}

/// Drains `buf` through the decoder; must never panic, whatever the bytes, and whatever
/// it accepts must survive a re-encode (the same property as the fuzz target).
fn drain(codec: &FrameCodec, buf: &mut BytesMut) {
    while let Ok(Some(cmd)) = codec.decode(buf) {
        let mut again = BytesMut::new();
        if codec.encode(&cmd, &mut again).is_ok() {
            assert_eq!(codec.decode(&mut again).unwrap().unwrap(), cmd);
        }
    }
}

#[test]
fn random_and_mutated_input_never_panics() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let codec = FrameCodec::new(64 * 1024);
    let valid = [java_json_route_request(), BINARY_ROUTE_REQUEST.to_vec()];
    for _ in 0..20_000 {
        let mut bytes: Vec<u8> = match rng.random_range(0..3) {
            0 => (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
            _ => {
                let mut v = valid[rng.random_range(0..2)].clone();
                for _ in 0..rng.random_range(1..4) {
                    let i = rng.random_range(0..v.len());
                    v[i] = rng.random();
                }
                if rng.random_bool(0.5) {
                    // Keep the prefix consistent so the header parsers see the damage.
                    let total = (v.len() - 4) as u32;
                    v[..4].copy_from_slice(&total.to_be_bytes());
                }
                v
            }
        };
        let cut = rng.random_range(0..=bytes.len());
        bytes.truncate(cut);
        drain(&codec, &mut BytesMut::from(&bytes[..]));
    }
}
