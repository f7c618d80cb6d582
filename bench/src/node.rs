//! An in-process node for the native benchmarks: a store, a broker, a NameServer,
//! the native door and the registrar that announces its topics (`bench native`
//! without `--namesrv`, and the `--sink` variant's registration).

use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};
use rocketgate_namesrv::{NameServer, NamesrvSettings};
use rocketgate_native::{Server, ServerSettings};
use rocketgate_remoting::protocol::WireTopicConfig as WireTopic;
use rocketgate_remoting::{BrokerIdentity, Registrar};

pub(crate) struct Node {
    pub(crate) namesrv: String,
    pub(crate) _handles: Vec<Box<dyn std::any::Any + Send>>,
}

pub(crate) async fn start_node(dir: &std::path::Path) -> anyhow::Result<Node> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let opts = StoreSettings {
        flush: FlushMode::Async {
            interval: Duration::from_millis(500),
        },
        store_host: addr,
        ..StoreSettings::default()
    };
    let (store, _) = Store::open(dir, opts, StoreDeps::fixed_usage(0.1))?;
    let broker = Arc::new(Broker::open(
        Arc::new(store),
        BrokerSettings::default(),
        Arc::new(SystemClock),
    )?);
    let (ns, ns_addr) =
        NameServer::bind("127.0.0.1:0".parse()?, NamesrvSettings::default()).await?;
    let ns = ns.spawn();
    let b = broker.clone();
    let topics = move || {
        b.route_snapshot()
            .into_iter()
            .map(|t| {
                let mut w = WireTopic::new(t.name, t.write_queues);
                w.read_queue_nums = t.read_queues;
                w.perm = u32::from(t.perm.0);
                w
            })
            .collect::<Vec<_>>()
    };
    let registrar = registrar(addr, ns_addr, Arc::new(topics));
    let settings = ServerSettings {
        store_host: addr,
        ..ServerSettings::default()
    };
    let (server, _) = Server::from_listener(listener, broker.clone(), settings)?;
    let server = server
        .on_topics_changed(Arc::new(registrar.trigger()))
        .spawn();
    Ok(Node {
        namesrv: ns_addr.to_string(),
        _handles: vec![
            Box::new(server),
            Box::new(registrar),
            Box::new(ns),
            Box::new(broker),
        ],
    })
}

/// Registers the bench's one broker (`broker-a` at `addr`) with the NameServer.
pub(crate) fn registrar(
    addr: std::net::SocketAddr,
    ns_addr: std::net::SocketAddr,
    topics: Arc<dyn rocketgate_remoting::TopicSource>,
) -> rocketgate_remoting::RegistrarHandle {
    let identity = BrokerIdentity {
        cluster: "DefaultCluster".into(),
        name: "broker-a".into(),
        id: 0,
        addr: addr.to_string(),
        ha_addr: String::new(),
    };
    Registrar::new(
        identity,
        vec![ns_addr.to_string()],
        Duration::from_secs(30),
        topics,
    )
    .spawn()
}
