//! Opt-in interop check: the published rocketmq-client-rust (a RocketMQ client written
//! by others, speaking remoting)
//! fetches routes from an in-process rocketgate NameServer with two registered brokers.
//! Run with `scripts/interop-rocketmq-client-rust`; it is not in the default suite because
//! the client pulls ~280 crates (a cold build took 47 min on 2 cores).
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocketgate_namesrv::{NameServer, NamesrvSettings};
use rocketgate_native::protocol::TopicConfig;
use rocketgate_native::{BrokerIdentity, Registrar};
use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig, DefaultMQProducer};
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

#[tokio::main]
async fn main() {
    let (ns, addr) = NameServer::bind("127.0.0.1:0".parse().unwrap(), NamesrvSettings::default())
        .await
        .unwrap();
    let ns = ns.spawn();
    let identity = |name: &str, port: u16| BrokerIdentity {
        cluster: "DefaultCluster".into(),
        name: name.into(),
        id: 0,
        addr: format!("127.0.0.1:{port}"),
        ha_addr: String::new(),
    };
    let topics = || vec![TopicConfig::new("TopicTest", 4)];
    let a = Registrar::new(identity("broker-a", 10911), vec![addr.to_string()], Duration::from_secs(30), Arc::new(topics)).spawn();
    let b = Registrar::new(identity("broker-b", 10921), vec![addr.to_string()], Duration::from_secs(30), Arc::new(topics)).spawn();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let owner = RuntimeOwner::plan(RuntimeConfig { thread_name: "probe".into(), ..Default::default() })
        .unwrap()
        .build()
        .unwrap();
    let telemetry = rocketmq_observability::install_global(&rocketmq_observability::TelemetryBootstrapConfig::default()).unwrap();
    let rt = ClientRuntime::try_new(owner.root_context().component("client"), ClientRuntimeConfig::default(), telemetry.handle()).unwrap();
    let mut producer = DefaultMQProducer::builder(rt.clone())
        .producer_group("probe_group".to_string())
        .name_server_addr(addr.to_string())
        .build();
    producer.start().await.expect("producer start");
    let t = Instant::now();
    let queues = producer.fetch_publish_message_queues("TopicTest").await;
    println!("route fetch took {:?}: {queues:#?}", t.elapsed());
    let queues = queues.expect("route of TopicTest");
    assert_eq!(queues.len(), 8, "4 queues on each of 2 brokers");

    a.stop().await;
    let queues = producer.fetch_publish_message_queues("TopicTest").await.expect("route after broker-a left");
    println!("after broker-a stopped: {} queues: {queues:?}", queues.len());
    assert_eq!(queues.len(), 4);

    let missing = producer.fetch_publish_message_queues("NoSuchTopic").await;
    println!("unknown topic: {missing:?}");
    assert!(missing.is_err());
    println!("INTEROP OK");
    producer.shutdown().await;
    b.stop().await;
    ns.stop().await;
    std::process::exit(0);
}
