//! Hostile or broken clients get an error response or a closed connection; everyone else
//! keeps being served. Each case ends with a good request on a fresh connection.

mod common;

use std::net::SocketAddr;

use common::*;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rocketgate_namesrv::NamesrvSettings;
use rocketgate_remoting::code::response;
use rocketgate_remoting::protocol::{RegisterBrokerBody, TopicConfigWrapper, WireTopicConfig};
use rocketgate_remoting::{RemotingCommand, code::request, protocol};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A NameServer with one broker hosting topic `T`, registered over `keep` (kept open).
async fn served() -> (rocketgate_namesrv::NameServerHandle, SocketAddr, TcpStream) {
    let (ns, addr) = start(NamesrvSettings::default()).await;
    let body = RegisterBrokerBody {
        topic_config_serialize_wrapper: TopicConfigWrapper {
            topic_config_table: [("T".to_string(), WireTopicConfig::new("T", 4))].into(),
            ..Default::default()
        },
        ..Default::default()
    };
    let reg = RemotingCommand {
        version: 475,
        ..RemotingCommand::request(request::REGISTER_BROKER, 1)
    }
    .with_field("brokerName", "broker-a")
    .with_field("brokerAddr", "127.0.0.1:10911")
    .with_field("clusterName", "DefaultCluster")
    .with_field("brokerId", 0)
    .with_body(protocol::to_json(&body));
    let mut keep = TcpStream::connect(addr).await.unwrap();
    assert_eq!(call_on(&mut keep, &reg).await.code, response::SUCCESS);
    (ns, addr, keep)
}

async fn still_serving(addr: SocketAddr) {
    assert_eq!(brokers_in_route(addr, "T").await, ["broker-a"]);
}

async fn closed_by_server(stream: &mut TcpStream) {
    assert!(
        read_response(stream).await.is_none(),
        "expected the server to close"
    );
}

#[tokio::test]
async fn random_bytes_close_that_connection_only() {
    let (_ns, addr, _keep) = served().await;
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..5 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // First byte >= 0x02 makes the length prefix > 16 MiB: rejected at once.
        let mut junk: Vec<u8> = (0..512).map(|_| rng.random()).collect();
        junk[0] = rng.random_range(0x02..=0xff);
        s.write_all(&junk).await.unwrap();
        closed_by_server(&mut s).await;
        still_serving(addr).await;
    }
}

#[tokio::test]
async fn truncated_frame_then_close() {
    let (_ns, addr, _keep) = served().await;
    let mut frame = bytes::BytesMut::new();
    rocketgate_remoting::codec::encode(&route_request("T"), &mut frame).unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&frame[..frame.len() / 2]).await.unwrap();
    // A half frame held open does not block anyone else.
    still_serving(addr).await;
    s.shutdown().await.unwrap();
    closed_by_server(&mut s).await;
    still_serving(addr).await;
}

#[tokio::test]
async fn two_gib_length_prefix_is_refused_without_waiting_for_it() {
    let (_ns, addr, _keep) = served().await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[0x80, 0, 0, 0, 0, 0, 0, 2, b'{', b'}'])
        .await
        .unwrap();
    closed_by_server(&mut s).await;
    still_serving(addr).await;
}

#[tokio::test]
async fn malformed_header_closes_the_connection() {
    let (_ns, addr, _keep) = served().await;
    for frame in [
        &[0, 0, 0, 7, 0, 0, 0, 3, b'{', b'x', b'['][..], // bad JSON
        &[0, 0, 0, 6, 9, 0, 0, 2, b'{', b'}'][..],       // unknown serialize type
        &[0, 0, 0, 6, 0, 0, 0, 99, b'{', b'}'][..],      // header longer than the frame
        &[0, 0, 0, 9, 1, 0, 0, 5, 0, 105, 0, 1, 0x91][..], // binary header cut short
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(frame).await.unwrap();
        closed_by_server(&mut s).await;
        still_serving(addr).await;
    }
}

#[tokio::test]
async fn unknown_code_gets_an_error_response_and_the_connection_stays_usable() {
    let (_ns, addr, _keep) = served().await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let r = call_on(&mut s, &RemotingCommand::request(9999, 42)).await;
    assert_eq!(r.code, response::REQUEST_CODE_NOT_SUPPORTED);
    assert_eq!(r.opaque, 42);
    assert!(r.is_response());
    assert!(r.remark.unwrap().contains("9999"));
    // Same connection, good request.
    let ok = call_on(&mut s, &route_request("T")).await;
    assert_eq!(ok.code, response::SUCCESS);
    still_serving(addr).await;
}

#[tokio::test]
async fn missing_fields_and_bad_bodies_are_error_responses() {
    let (_ns, addr, _keep) = served().await;
    let no_topic = call(
        addr,
        &RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 1),
    )
    .await;
    assert_eq!(no_topic.code, response::SYSTEM_ERROR);
    let bad_body = RemotingCommand {
        version: 475,
        ..RemotingCommand::request(request::REGISTER_BROKER, 2)
    }
    .with_field("brokerName", "x")
    .with_field("brokerAddr", "1.2.3.4:5")
    .with_field("clusterName", "c")
    .with_field("brokerId", 0)
    .with_body(&b"{not json"[..]);
    assert_eq!(call(addr, &bad_body).await.code, response::SYSTEM_ERROR);
    let bad_crc = bad_body.clone().with_field("bodyCrc32", 12345);
    let r = call(addr, &bad_crc).await;
    assert_eq!(r.remark.as_deref(), Some("crc32 not match"));
    let unknown = call(addr, &route_request("nope")).await;
    assert_eq!(unknown.code, response::TOPIC_NOT_EXIST);
    assert!(unknown.remark.unwrap().contains("nope"));
    still_serving(addr).await;
}
