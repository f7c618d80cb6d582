//! `rocketgate bench proxy`: what it costs the MQTT door to reach its broker through
//! the broker API over the native door (`RemoteBroker`, a proxy node's way, issue #29)
//! instead of in-process, in one run. One process holds a broker with its native
//! server, an MQTT door over the broker itself (`local`) and an MQTT door over a
//! `RemoteBroker` connected to that native server (`proxy`); the MQTT generator
//! (`rocketgate bench mqtt`, same flags) runs against each in turn, `--runs` times,
//! and the medians and their ratio are printed.
//!
//! Everything shares the machine: broker, both doors and the generator. In a real
//! deployment the proxy is another process (often another host), which adds the
//! network but takes the doors' CPU off the broker's.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};
use rocketgate_native::client::{RemoteBroker, RemoteSettings};

use crate::mqtt::{self, MqttBenchArgs};

#[derive(Debug, Args)]
pub struct ProxyBenchArgs {
    /// Measured runs per door, alternating local and proxy.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Runtime worker threads of the node (broker, native server, both doors).
    #[arg(long, default_value_t = 2)]
    pub node_threads: usize,
    /// Scratch directory (emptied before and after).
    #[arg(long, default_value = "bench-data")]
    pub dir: std::path::PathBuf,
    /// The generator's flags (`--broker` is set to each door in turn).
    #[command(flatten)]
    pub mqtt: MqttBenchArgs,
}

struct Node {
    local: std::net::SocketAddr,
    proxy: std::net::SocketAddr,
    doors: (
        rocketgate_mqtt::Handle<Broker>,
        rocketgate_mqtt::Handle<RemoteBroker>,
    ),
    native: rocketgate_native::ServerHandle,
    broker: Arc<Broker>,
    store: Arc<Store>,
}

async fn node(dir: &std::path::Path) -> anyhow::Result<Node> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let native_addr = listener.local_addr()?;
    let opts = StoreSettings {
        segment_size: 256 << 20,
        store_host: native_addr,
        flush: FlushMode::Async {
            interval: Duration::from_millis(500),
        },
        ..StoreSettings::default()
    };
    let store = Arc::new(Store::open(&dir.join("store"), opts, StoreDeps::fixed_usage(0.1))?.0);
    let broker = Arc::new(Broker::open(
        store.clone(),
        BrokerSettings::default(),
        Arc::new(SystemClock),
    )?);
    let (server, _) = rocketgate_native::Server::from_listener(
        listener,
        broker.clone(),
        rocketgate_native::ServerSettings {
            store_host: native_addr,
            ..rocketgate_native::ServerSettings::default()
        },
    )?;
    let native = server.spawn();
    let remote =
        Arc::new(RemoteBroker::connect(RemoteSettings::new(native_addr.to_string())).await?);
    let any = "127.0.0.1:0".parse()?;
    let (l, local) = rocketgate_mqtt::Server::bind(
        any,
        broker.clone(),
        rocketgate_mqtt::Settings::new(dir.join("mqtt-local")),
    )
    .await?;
    let (p, proxy) = rocketgate_mqtt::Server::bind(
        any,
        remote,
        rocketgate_mqtt::Settings::new(dir.join("mqtt-proxy")),
    )
    .await?;
    Ok(Node {
        local,
        proxy,
        doors: (l.spawn(), p.spawn()),
        native,
        broker,
        store,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub fn run(args: ProxyBenchArgs) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.node_threads.max(1))
        .enable_all()
        .build()?;
    let node = rt.block_on(node(&args.dir))?;
    println!(
        "proxy bench: MQTT door over the broker in-process at {}, over RemoteBroker at {}",
        node.local, node.proxy
    );
    let mut figures: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for run in 0..args.runs.max(1) {
        for (i, (name, addr)) in [("local", node.local), ("proxy", node.proxy)]
            .into_iter()
            .enumerate()
        {
            let mut m = args.mqtt.clone();
            m.broker = addr;
            let r = mqtt::measure(&m)?;
            let rate = r.received as f64 / r.seconds;
            let p99 = r
                .latencies
                .map(|l| l.p99.as_secs_f64() * 1e3)
                .unwrap_or(0.0);
            println!(
                "  run {} {name:>5}: delivered {rate:.0} msgs/s, published {:.0} msgs/s, p99 {p99:.2} ms",
                run + 1,
                r.published as f64 / r.seconds
            );
            figures[i].0.push(rate);
            figures[i].1.push(p99);
        }
    }
    let [(lr, lp), (pr, pp)] = figures;
    let (lr, lp, pr, pp) = (median(lr), median(lp), median(pr), median(pp));
    println!(
        "median: local {lr:.0} msgs/s p99 {lp:.2} ms; proxy {pr:.0} msgs/s p99 {pp:.2} ms; \
         throughput {:.2}x, p99 {:.2}x",
        if lr > 0.0 { pr / lr } else { 0.0 },
        if lp > 0.0 { pp / lp } else { 0.0 },
    );
    rt.block_on(async {
        node.doors.1.stop().await;
        node.doors.0.stop().await;
        node.native.stop().await;
    });
    let (b, s) = (node.broker, node.store);
    b.close()?;
    drop(b);
    s.close()?;
    let _ = std::fs::remove_dir_all(&args.dir);
    Ok(())
}
