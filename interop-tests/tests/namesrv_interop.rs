//! NameServer interop with byte-exact Java RocketMQ traffic.
//!
//! The request fixtures below are written by hand from what Java RocketMQ 4.9 / 5.x send
//! (fastjson headers, `RocketMQSerializable` binary headers, `RegisterBrokerBody` JSON), and
//! the responses are read back with plain byte slicing, not with our codec, so a bug shared
//! by our encoder and decoder cannot hide here.
//!
//! The published `rocketmq-client-rust` 1.0.0 was run against our NameServer once and
//! worked, but it takes ~47 min to build here, so it is not a dependency: see
//! `docs/namesrv.md` ("Interop").

use std::net::SocketAddr;

use rocketgate_namesrv::{NameServer, NameServerHandle, NamesrvSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `RegisterBrokerBody.encode(false)` of a Java 4.9 broker hosting `TopicTest` (4 queues).
const JAVA_REGISTER_BODY: &str = r#"{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":2,"timestamp":1700000000000},"topicConfigTable":{"TopicTest":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4}}}}"#;

/// The header a Java 4.9.3 broker sends with it; `bodyCrc32` is `UtilAll.crc32(body)`
/// (CRC-32 with bit 31 cleared) of the body above.
const JAVA_REGISTER_HEADER: &str = r#"{"code":103,"extFields":{"bodyCrc32":"567853781","brokerAddr":"192.168.0.10:10911","brokerId":"0","brokerName":"broker-a","clusterName":"DefaultCluster","compressed":"false","haServerAddr":"192.168.0.10:10912"},"flag":0,"language":"JAVA","opaque":1,"serializeTypeCurrentRPC":"JSON","version":399}"#;

/// `GET_ROUTEINFO_BY_TOPIC` from a Java 4.9.3 client (`MQVersion` ordinal 399).
const JAVA_493_ROUTE_HEADER: &str = r#"{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":2,"serializeTypeCurrentRPC":"JSON","version":399}"#;

/// The same from a Java 5.1 client (ordinal 459), which reads standard JSON.
const JAVA_5_ROUTE_HEADER: &str = r#"{"code":105,"extFields":{"topic":"TopicTest"},"flag":0,"language":"JAVA","opaque":3,"serializeTypeCurrentRPC":"JSON","version":459}"#;

/// What Java's NameServer answers a pre-4.9.4 client: fastjson with bare numeric keys.
const ROUTE_FASTJSON: &str = r#"{"brokerDatas":[{"brokerAddrs":{0:"192.168.0.10:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}"#;

/// What it answers a 4.9.4+ client: the same, standard JSON.
const ROUTE_STANDARD: &str = r#"{"brokerDatas":[{"brokerAddrs":{"0":"192.168.0.10:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}"#;

/// `GET_ROUTEINFO_BY_TOPIC` for `TopicTest` with a ROCKETMQ binary header
/// (`-Drocketmq.serialize.type=ROCKETMQ`), opaque 4, version 399.
#[rustfmt::skip]
const BINARY_ROUTE_REQUEST: &[u8] = &[
    0x00, 0x00, 0x00, 0x2d,  0x01, 0x00, 0x00, 0x29,
    0x00, 0x69,  0x00,  0x01, 0x8f,  0x00, 0x00, 0x00, 0x04,  0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x14,
    0x00, 0x05, b't', b'o', b'p', b'i', b'c',
    0x00, 0x00, 0x00, 0x09, b'T', b'o', b'p', b'i', b'c', b'T', b'e', b's', b't',
];

fn json_frame(header: &str, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&((4 + header.len() + body.len()) as u32).to_be_bytes());
    f.extend_from_slice(&(header.len() as u32).to_be_bytes());
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(body);
    f
}

/// One raw response frame: (serialize type, header bytes, body bytes).
async fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>, Vec<u8>) {
    let total = s.read_u32().await.unwrap() as usize;
    let word = s.read_u32().await.unwrap();
    let mut rest = vec![0; total - 4];
    s.read_exact(&mut rest).await.unwrap();
    let header_len = (word & 0xFF_FFFF) as usize;
    let body = rest.split_off(header_len);
    ((word >> 24) as u8, rest, body)
}

/// A Java JSON response header's `code`, `flag` and `opaque`.
fn json_header_fields(header: &[u8]) -> (i64, i64, i64) {
    let v: serde_json_shim::Value = serde_json_shim::from_slice(header);
    (v.int("code"), v.int("flag"), v.int("opaque"))
}

/// The few lines of JSON field extraction these tests need, without pulling in our codec.
mod serde_json_shim {
    pub struct Value(String);
    pub fn from_slice(b: &[u8]) -> Value {
        Value(String::from_utf8(b.to_vec()).unwrap())
    }
    impl Value {
        pub fn int(&self, key: &str) -> i64 {
            let pat = format!("\"{key}\":");
            let at = self
                .0
                .find(&pat)
                .unwrap_or_else(|| panic!("{key} in {}", self.0))
                + pat.len();
            let digits: String = self.0[at..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            digits.parse().unwrap()
        }
    }
}

async fn namesrv_with_java_broker() -> (NameServerHandle, SocketAddr, TcpStream) {
    let (ns, addr) = NameServer::bind("127.0.0.1:0".parse().unwrap(), NamesrvSettings::default())
        .await
        .unwrap();
    let ns = ns.spawn();
    let mut broker = TcpStream::connect(addr).await.unwrap();
    broker
        .write_all(&json_frame(
            JAVA_REGISTER_HEADER,
            JAVA_REGISTER_BODY.as_bytes(),
        ))
        .await
        .unwrap();
    let (kind, header, _) = read_frame(&mut broker).await;
    assert_eq!(kind, 0, "a JSON request gets a JSON response");
    assert_eq!(
        json_header_fields(&header),
        (0, 1, 1),
        "SUCCESS, response flag, opaque 1"
    );
    (ns, addr, broker)
}

#[tokio::test]
async fn java_4_9_3_client_gets_fastjson_route() {
    let (ns, addr, _broker) = namesrv_with_java_broker().await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(&json_frame(JAVA_493_ROUTE_HEADER, b""))
        .await
        .unwrap();
    let (kind, header, body) = read_frame(&mut client).await;
    assert_eq!(kind, 0);
    assert_eq!(json_header_fields(&header), (0, 1, 2));
    assert_eq!(String::from_utf8(body).unwrap(), ROUTE_FASTJSON);
    ns.stop().await;
}

#[tokio::test]
async fn java_5_client_gets_standard_json_route() {
    let (ns, addr, _broker) = namesrv_with_java_broker().await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(&json_frame(JAVA_5_ROUTE_HEADER, b""))
        .await
        .unwrap();
    let (_, header, body) = read_frame(&mut client).await;
    assert_eq!(json_header_fields(&header), (0, 1, 3));
    assert_eq!(String::from_utf8(body).unwrap(), ROUTE_STANDARD);
    ns.stop().await;
}

#[tokio::test]
async fn binary_header_client_gets_binary_response() {
    let (ns, addr, _broker) = namesrv_with_java_broker().await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(BINARY_ROUTE_REQUEST).await.unwrap();
    let (kind, header, body) = read_frame(&mut client).await;
    assert_eq!(kind, 1, "ROCKETMQ request gets a ROCKETMQ response");
    assert_eq!(&header[0..2], &[0, 0], "code SUCCESS");
    assert_eq!(&header[5..9], &[0, 0, 0, 4], "opaque 4");
    assert_eq!(&header[9..13], &[0, 0, 0, 1], "response flag");
    assert_eq!(String::from_utf8(body).unwrap(), ROUTE_FASTJSON);
    ns.stop().await;
}

#[tokio::test]
async fn java_broker_connection_close_removes_its_route() {
    let (ns, addr, broker) = namesrv_with_java_broker().await;
    drop(broker);
    let mut client = TcpStream::connect(addr).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        client
            .write_all(&json_frame(JAVA_5_ROUTE_HEADER, b""))
            .await
            .unwrap();
        let (_, header, _) = read_frame(&mut client).await;
        if json_header_fields(&header).0 == 17 {
            break; // TOPIC_NOT_EXIST
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "route never went away"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    ns.stop().await;
}
