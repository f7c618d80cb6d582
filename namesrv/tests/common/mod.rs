//! A minimal remoting client for the NameServer tests: one request per fresh connection.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use rocketgate_namesrv::{NameServer, NameServerHandle, NamesrvSettings};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::protocol::{self, TopicRouteData};
use rocketgate_remoting::{FrameCodec, RemotingCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const TIMEOUT: Duration = Duration::from_secs(5);

pub async fn start(settings: NamesrvSettings) -> (NameServerHandle, SocketAddr) {
    let (ns, addr) = NameServer::bind("127.0.0.1:0".parse().unwrap(), settings)
        .await
        .unwrap();
    (ns.spawn(), addr)
}

pub fn short_expiry() -> NamesrvSettings {
    NamesrvSettings {
        scan_interval: Duration::from_millis(100),
        broker_expiry: Duration::from_millis(500),
        ..Default::default()
    }
}

/// Sends `cmd` on `stream` and reads its response.
pub async fn call_on(stream: &mut TcpStream, cmd: &RemotingCommand) -> RemotingCommand {
    let codec = FrameCodec::default();
    let mut out = BytesMut::new();
    codec.encode(cmd, &mut out).unwrap();
    stream.write_all(&out).await.unwrap();
    read_response(stream)
        .await
        .expect("connection closed before the response")
}

/// The next frame, or `None` when the peer closed the connection.
pub async fn read_response(stream: &mut TcpStream) -> Option<RemotingCommand> {
    let codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Some(r) = codec.decode(&mut buf).unwrap() {
                return Some(r);
            }
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("no response in time")
}

pub async fn call(addr: SocketAddr, cmd: &RemotingCommand) -> RemotingCommand {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    call_on(&mut stream, cmd).await
}

pub fn route_request(topic: &str) -> RemotingCommand {
    RemotingCommand {
        version: 475,
        ..RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 1)
    }
    .with_field("topic", topic)
}

/// The route of `topic`, `None` on TOPIC_NOT_EXIST.
pub async fn route(addr: SocketAddr, topic: &str) -> Option<TopicRouteData> {
    let r = call(addr, &route_request(topic)).await;
    match r.code {
        response::SUCCESS => Some(protocol::from_json(&r.body).unwrap()),
        response::TOPIC_NOT_EXIST => None,
        other => panic!("unexpected response {other}: {:?}", r.remark),
    }
}

/// Broker names in the route of `topic`, sorted.
pub async fn brokers_in_route(addr: SocketAddr, topic: &str) -> Vec<String> {
    let Some(r) = route(addr, topic).await else {
        return Vec::new();
    };
    let mut names: Vec<String> = r.broker_datas.into_iter().map(|b| b.broker_name).collect();
    let queues: Vec<String> = r
        .queue_datas
        .iter()
        .map(|q| q.broker_name.clone())
        .collect();
    names.sort();
    let mut q = queues;
    q.sort();
    assert_eq!(names, q, "broker datas and queue datas disagree");
    names
}

/// Polls `f` until it returns true or [`TIMEOUT`] passes.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
