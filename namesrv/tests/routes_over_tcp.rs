//! Two NameServers, brokers registering with both through the real Registrar, and clients
//! fetching routes over TCP.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::protocol::{
    self, RegisterBrokerBody, TopicConfigWrapper, WireTopicConfig,
};
use rocketgate_remoting::{BrokerIdentity, Registrar, RegistrarHandle, RemotingCommand};
use tokio::net::TcpStream;

fn broker(name: &str, port: u16, namesrvs: &[std::net::SocketAddr]) -> RegistrarHandle {
    let identity = BrokerIdentity {
        cluster: "DefaultCluster".into(),
        name: name.into(),
        id: 0,
        addr: format!("127.0.0.1:{port}"),
        ha_addr: format!("127.0.0.1:{}", port + 1),
    };
    let topics = || vec![WireTopicConfig::new("T", 4)];
    Registrar::new(
        identity,
        namesrvs.iter().map(|a| a.to_string()).collect(),
        Duration::from_millis(200),
        Arc::new(topics),
    )
    .spawn()
}

async fn both_see(ns: &[std::net::SocketAddr], expected: &[&str]) -> bool {
    for &a in ns {
        if brokers_in_route(a, "T").await != expected {
            return false;
        }
    }
    true
}

#[tokio::test]
async fn brokers_join_and_leave_the_routes_of_every_namesrv() {
    let (ns1, a1) = start(short_expiry()).await;
    let (ns2, a2) = start(short_expiry()).await;
    let ns = [a1, a2];

    let broker_a = broker("broker-a", 10911, &ns);
    let broker_b = broker("broker-b", 10921, &ns);
    eventually("both brokers in both routes", || {
        both_see(&ns, &["broker-a", "broker-b"])
    })
    .await;
    let seen = route(a1, "T").await.unwrap();
    assert!(
        seen.queue_datas
            .iter()
            .all(|q| q.write_queue_nums == 4 && q.perm == 6)
    );
    let a = seen
        .broker_datas
        .iter()
        .find(|b| b.broker_name == "broker-a")
        .unwrap();
    assert_eq!(a.broker_addrs[&0], "127.0.0.1:10911");

    // Clean stop: unregistered from both before stop() returns.
    broker_a.stop().await;
    for a in ns {
        assert_eq!(brokers_in_route(a, "T").await, ["broker-b"]);
    }

    // Crash: the connections drop without an unregister; both NameServers notice.
    let broker_a = broker("broker-a", 10911, &ns);
    eventually("broker-a back", || both_see(&ns, &["broker-a", "broker-b"])).await;
    broker_a.abort().await;
    eventually("crashed broker-a gone", || both_see(&ns, &["broker-b"])).await;

    broker_b.stop().await;
    for a in ns {
        assert!(
            route(a, "T").await.is_none(),
            "no live broker: TOPIC_NOT_EXIST"
        );
    }
    ns1.stop().await;
    ns2.stop().await;
}

fn register(name: &str, addr: &str, topic: &str) -> RemotingCommand {
    let body = RegisterBrokerBody {
        topic_config_serialize_wrapper: TopicConfigWrapper {
            topic_config_table: [(topic.to_string(), WireTopicConfig::new(topic, 4))].into(),
            ..Default::default()
        },
        ..Default::default()
    };
    RemotingCommand {
        version: 475,
        ..RemotingCommand::request(request::REGISTER_BROKER, 9)
    }
    .with_field("brokerName", name)
    .with_field("brokerAddr", addr)
    .with_field("clusterName", "DefaultCluster")
    .with_field("haServerAddr", "")
    .with_field("brokerId", 0)
    .with_body(Bytes::from(protocol::to_json(&body)))
}

#[tokio::test]
async fn silent_broker_with_an_open_connection_expires() {
    let (ns, addr) = start(short_expiry()).await;
    let live = broker("broker-b", 10921, &[addr]);
    // broker-c registers once and then says nothing, its connection left open (a hung
    // process or a partition, not a crash).
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let r = call_on(&mut silent, &register("broker-c", "127.0.0.1:10931", "T")).await;
    assert_eq!(r.code, response::SUCCESS);
    eventually("both registered", || async {
        brokers_in_route(addr, "T").await == ["broker-b", "broker-c"]
    })
    .await;

    eventually("silent broker-c expired", || async {
        brokers_in_route(addr, "T").await == ["broker-b"]
    })
    .await;
    // ... and the NameServer closed its connection.
    assert!(read_response(&mut silent).await.is_none());

    live.stop().await;
    ns.stop().await;
}

#[tokio::test]
async fn registrar_keeps_trying_until_a_namesrv_comes_up() {
    // Reserve a port, release it, start the broker first, then the NameServer there.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let b = broker("broker-a", 10911, &[addr]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ns, bound) = rocketgate_namesrv::NameServer::bind(addr, short_expiry())
        .await
        .unwrap();
    assert_eq!(bound, addr);
    let ns = ns.spawn();
    eventually("broker registered after back-off", || async {
        brokers_in_route(addr, "T").await == ["broker-a"]
    })
    .await;
    b.stop().await;
    ns.stop().await;
}
