//! Opt-in interop check with the published rocketmq-client-rust (a RocketMQ client written
//! by others, speaking remoting):
//!
//! 1. it fetches routes from an in-process rocketgate NameServer with two registered
//!    brokers (and sees one leave);
//! 2. against a whole in-process rocketgate node (NameServer + broker + native server),
//!    its producer sends 1,000 messages with tags and keys and its push consumer receives
//!    all 1,000 with the right bodies, tags and keys, and sends to a topic nobody created
//!    (through the default topic route TBW102);
//! 3. `failover` (issue #28): across a `kill -9` of a controlled master, its producer
//!    keeps sending and lands on the new master; nothing acknowledged is lost
//!    ([`failover`]);
//! 4. `acl` (issue #26): with its ACL hook against a node with authentication on
//!    ([`acl`]).
//!
//! Scenarios are chosen by argument (`routes`, `produce`, `failover`, `acl`; none: all).
//! Run with `scripts/interop-rocketmq-client-rust`; it is not in the default suite because
//! the client pulls ~280 crates (a cold build took 47 min on 2 cores). The failover and
//! ACL scenarios start the built `rocketgate` binary (`$ROCKETGATE_BIN`, else
//! `target/debug/rocketgate`).
mod acl;
mod failover;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketgate_core::broker::{
    Broker, BrokerSettings, MessagingApi, SystemClock, TopicConfig as CoreTopic, TopicKind,
};
use rocketgate_core::store::{Store, StoreDeps, StoreSettings};
use rocketgate_namesrv::{NameServer, NamesrvSettings};
use rocketgate_native::{Server, ServerSettings};
use rocketgate_remoting::protocol::WireTopicConfig;
use rocketgate_remoting::{BrokerIdentity, Registrar};
use rocketmq_client_rust::{
    ClientRuntime, ClientRuntimeConfig, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    DefaultMQProducer, DefaultMQPushConsumer, MQPushConsumer, MessageListenerConcurrently,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

const MESSAGES: usize = 1000;
const TOPIC: &str = "InteropTopic";
/// Never created: the first send goes through the default topic route `TBW102`.
const NEW_TOPIC: &str = "InteropNewTopic";

fn identity(name: &str, addr: String) -> BrokerIdentity {
    BrokerIdentity {
        cluster: "DefaultCluster".into(),
        name: name.into(),
        id: 0,
        addr,
        ha_addr: String::new(),
    }
}

async fn routes_only(rt: Arc<ClientRuntime>) {
    let (ns, addr) = NameServer::bind("127.0.0.1:0".parse().unwrap(), NamesrvSettings::default())
        .await
        .unwrap();
    let ns = ns.spawn();
    let topics = || vec![WireTopicConfig::new("TopicTest", 4)];
    let a = Registrar::new(
        identity("broker-a", "127.0.0.1:10911".into()),
        vec![addr.to_string()],
        Duration::from_secs(30),
        Arc::new(topics),
    )
    .spawn();
    let b = Registrar::new(
        identity("broker-b", "127.0.0.1:10921".into()),
        vec![addr.to_string()],
        Duration::from_secs(30),
        Arc::new(topics),
    )
    .spawn();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut producer = DefaultMQProducer::builder(rt)
        .producer_group("probe_group".to_string())
        .name_server_addr(addr.to_string())
        .build();
    producer.start().await.expect("producer start");
    let t = Instant::now();
    let queues = producer.fetch_publish_message_queues("TopicTest").await;
    println!(
        "route fetch took {:?}: {} queues",
        t.elapsed(),
        queues.as_ref().map_or(0, Vec::len)
    );
    let queues = queues.expect("route of TopicTest");
    assert_eq!(queues.len(), 8, "4 queues on each of 2 brokers");

    a.stop().await;
    let queues = producer
        .fetch_publish_message_queues("TopicTest")
        .await
        .expect("route after broker-a left");
    assert_eq!(queues.len(), 4);
    let missing = producer.fetch_publish_message_queues("NoSuchTopic").await;
    assert!(missing.is_err());
    println!("ROUTES OK");
    producer.shutdown().await;
    b.stop().await;
    ns.stop().await;
}

type Seen = Arc<Mutex<HashMap<String, (Option<String>, Option<String>)>>>;

struct Collect(Seen);

impl MessageListenerConcurrently for Collect {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        let mut seen = self.0.lock().unwrap();
        for m in msgs {
            let body = m
                .body()
                .map(|b| String::from_utf8_lossy(&b).to_string())
                .unwrap_or_default();
            let tag = m.get_tags().map(|t| t.as_str().to_owned());
            let keys = m
                .properties()
                .iter()
                .find(|(k, _)| k.as_str() == "KEYS")
                .map(|(_, v)| v.as_str().to_owned());
            seen.insert(body, (tag, keys));
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

async fn produce_and_consume(rt: Arc<ClientRuntime>) {
    // A whole node in-process, as `rocketgate standalone` wires it.
    let dir = std::env::temp_dir().join(format!("rocketgate-interop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broker_addr = listener.local_addr().unwrap();
    let store_opts = StoreSettings {
        segment_size: 64 << 20,
        store_host: broker_addr,
        ..StoreSettings::default()
    };
    let (store, _) = Store::open(&dir, store_opts, StoreDeps::fixed_usage(0.1)).unwrap();
    let broker = Arc::new(
        Broker::open(
            Arc::new(store),
            BrokerSettings::default(),
            Arc::new(SystemClock),
        )
        .unwrap(),
    );
    // Retries come back through the delay levels, as in `rocketgate standalone`.
    broker.spawn_delay_delivery();
    broker.create_topic(CoreTopic::new(TOPIC, 4)).await.unwrap();
    let (ns, ns_addr) =
        NameServer::bind("127.0.0.1:0".parse().unwrap(), NamesrvSettings::default())
            .await
            .unwrap();
    let ns = ns.spawn();
    let b = broker.clone();
    let topics = move || {
        // With TBW102, as `rocketgate standalone` registers it (auto-create is on).
        b.route_snapshot()
            .into_iter()
            .map(|t| {
                let mut w = WireTopicConfig::new(t.name, t.write_queues);
                w.read_queue_nums = t.read_queues;
                w.perm = u32::from(t.perm.0);
                w
            })
            .collect::<Vec<_>>()
    };
    let registrar = Registrar::new(
        identity("broker-a", broker_addr.to_string()),
        vec![ns_addr.to_string()],
        Duration::from_secs(30),
        Arc::new(topics),
    )
    .spawn();
    let settings = ServerSettings {
        store_host: broker_addr,
        ..ServerSettings::default()
    };
    let (server, _) = Server::from_listener(listener, broker.clone(), settings).unwrap();
    let server = server
        .on_topics_changed(Arc::new(registrar.trigger()))
        .spawn();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut producer = DefaultMQProducer::builder(rt.clone())
        .producer_group("interop_producers".to_string())
        .name_server_addr(ns_addr.to_string())
        .build();
    producer.start().await.expect("producer start");
    for i in 0..MESSAGES {
        let tag = if i % 2 == 0 { "TagA" } else { "TagB" };
        let message = Message::builder()
            .topic(TOPIC)
            .tags(tag)
            .keys(vec![format!("key-{i}")])
            .body_slice(format!("body-{i}").as_bytes())
            .build_unchecked();
        producer
            .send_with_timeout(message, 5000)
            .await
            .expect("send");
    }
    println!("SENT {MESSAGES}");

    // No route for NEW_TOPIC: the client takes TBW102's, and the send creates the topic.
    let first = Message::builder()
        .topic(NEW_TOPIC)
        .tags("TagA")
        .body_slice("first".as_bytes())
        .build_unchecked();
    producer
        .send_with_timeout(first, 5000)
        .await
        .expect("send to a topic nobody created");
    let created = broker
        .topic_snapshot(TopicKind::User)
        .iter()
        .any(|t| t.name == NEW_TOPIC);
    assert!(
        created,
        "{NEW_TOPIC} was not auto-created by the first send"
    );
    println!("SENT to {NEW_TOPIC} with no prior creation (default topic route TBW102)");

    let seen: Seen = Arc::default();
    let mut consumer = DefaultMQPushConsumer::builder(rt.clone())
        .consumer_group("interop_consumers".to_string())
        .name_server_addr(ns_addr.to_string())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .consume_message_batch_max_size(16)
        .build();
    consumer.subscribe(TOPIC, "*").await.expect("subscribe");
    consumer.register_message_listener_concurrently(Collect(seen.clone()));
    consumer.start().await.expect("consumer start");
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.lock().unwrap().len() < MESSAGES {
        assert!(
            Instant::now() < deadline,
            "only {} of {MESSAGES} consumed",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen = seen.lock().unwrap().clone();
    for i in 0..MESSAGES {
        let (tag, keys) = seen
            .get(&format!("body-{i}"))
            .unwrap_or_else(|| panic!("body-{i} missing"));
        let want = if i % 2 == 0 { "TagA" } else { "TagB" };
        assert_eq!(tag.as_deref(), Some(want), "tag of body-{i}");
        assert_eq!(
            keys.as_deref(),
            Some(format!("key-{i}").as_str()),
            "keys of body-{i}"
        );
    }
    println!("CONSUMED {MESSAGES} with bodies, tags and keys intact");
    consumer.shutdown().await;
    producer.shutdown().await;
    server.stop().await;
    registrar.stop().await;
    ns.stop().await;
    let _ = broker.close();
    let _ = std::fs::remove_dir_all(&dir);
}

const SCENARIOS: [&str; 4] = ["routes", "produce", "failover", "acl"];

#[tokio::main]
async fn main() {
    let mut chosen: Vec<String> = std::env::args().skip(1).collect();
    if chosen.is_empty() {
        chosen = SCENARIOS.iter().map(|s| s.to_string()).collect();
    }
    if let Some(bad) = chosen.iter().find(|c| !SCENARIOS.contains(&c.as_str())) {
        eprintln!("unknown scenario {bad:?}; choose from {SCENARIOS:?}");
        std::process::exit(2);
    }
    // Sized as for 8 cores: on a 2-core box the default blocking capacity is too small
    // for 1,000 queued consume tasks ("runtime.capacity.exhausted").
    let owner = RuntimeOwner::plan(RuntimeConfig::for_parallelism("probe", 8))
        .unwrap()
        .build()
        .unwrap();
    let telemetry = rocketmq_observability::install_global(
        &rocketmq_observability::TelemetryBootstrapConfig::default(),
    )
    .unwrap();
    let rt = ClientRuntime::try_new(
        owner.root_context().component("client"),
        ClientRuntimeConfig::default(),
        telemetry.handle(),
    )
    .unwrap();
    for c in &chosen {
        println!("== {c}");
        let r = match c.as_str() {
            "routes" => {
                routes_only(rt.clone()).await;
                Ok(())
            }
            "produce" => {
                produce_and_consume(rt.clone()).await;
                Ok(())
            }
            "failover" => failover::run(rt.clone()).await,
            _ => acl::run(rt.clone()).await,
        };
        if let Err(e) = r {
            eprintln!("{c} FAILED: {e:#}");
            std::process::exit(1);
        }
    }
    println!("INTEROP OK ({})", chosen.join(", "));
    std::process::exit(0);
}
