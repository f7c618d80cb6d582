//! What the routing over broker groups costs: sends and POP + ack straight on a local
//! broker, and through a `Cluster` of two local brokers (routes from their own topic
//! tables), interleaved rounds, medians printed.
//!
//! `cargo run -p rocketgate-native --example cluster_overhead [messages per round]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    Broker, BrokerSettings, MessagingApi, PopRequest, QueueChoice, SystemClock, TopicConfig,
};
use rocketgate_core::store::{FlushMode, Message, Store, StoreDeps, StoreSettings};
use rocketgate_native::cluster::{BrokerAddr, Cluster, ClusterSettings, MemberRoutes};

fn open(port: u16, dir: &std::path::Path) -> Arc<Broker> {
    let settings = StoreSettings {
        segment_size: 64 << 20,
        store_host: ([127, 0, 0, 1], port).into(),
        flush: FlushMode::Async {
            interval: Duration::from_millis(200),
        },
        ..StoreSettings::default()
    };
    let (store, _) = Store::open(dir, settings, StoreDeps::fixed_usage(0.1)).expect("store");
    Arc::new(
        Broker::open(
            Arc::new(store),
            BrokerSettings::default(),
            Arc::new(SystemClock),
        )
        .expect("broker"),
    )
}

/// Messages per second of `n` sends and then `n` POP + ack through `api`.
async fn round<A: MessagingApi>(api: &A, topic: &str, n: usize) -> (f64, f64) {
    let body = vec![b'x'; 128];
    let t = Instant::now();
    for _ in 0..n {
        api.send(
            Message::new(topic, 0, body.clone()),
            QueueChoice::RoundRobin,
        )
        .await
        .expect("send");
    }
    let sends = n as f64 / t.elapsed().as_secs_f64();
    api.sync_visible().await;
    let t = Instant::now();
    let mut got = 0;
    while got < n {
        let popped = api
            .pop(PopRequest {
                group: "bench".into(),
                topic: topic.into(),
                filter: Filter::all(),
                max_messages: 32,
                invisible: Duration::from_secs(60),
                wait: Duration::from_millis(100),
            })
            .await
            .expect("pop");
        for p in &popped {
            api.ack(&p.receipt.to_string()).await.expect("ack");
        }
        got += popped.len();
    }
    (sends, n as f64 / t.elapsed().as_secs_f64())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000);
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let a = open(20101, dirs[0].path());
    let b = open(20102, dirs[1].path());
    let routes = Arc::new(MemberRoutes::new());
    routes.add("broker-a", "127.0.0.1:20101", a.clone());
    routes.add("broker-b", "127.0.0.1:20102", b.clone());
    let r = routes.clone();
    let cluster = Cluster::start(routes, ClusterSettings::default(), move |x: &BrokerAddr| {
        let m = r.member(&x.addr);
        async move { m.ok_or(rocketgate_core::Error::ShutDown) }
    })
    .await;
    a.create_topic(TopicConfig::new("direct", 8))
        .await
        .expect("topic");
    cluster
        .create_topic(TopicConfig::new("routed", 4))
        .await
        .expect("topic");
    let (mut ds, mut dp, mut cs, mut cp) = (vec![], vec![], vec![], vec![]);
    for _ in 0..5 {
        let (s, p) = round(a.as_ref(), "direct", n).await;
        ds.push(s);
        dp.push(p);
        let (s, p) = round(&cluster, "routed", n).await;
        cs.push(s);
        cp.push(p);
    }
    let (ds, dp, cs, cp) = (
        median(&mut ds),
        median(&mut dp),
        median(&mut cs),
        median(&mut cp),
    );
    println!("{n} messages per round, 5 rounds interleaved, medians (msgs/s):");
    println!(
        "send       direct {ds:>9.0}   cluster of 2 {cs:>9.0}   ratio {:.2}",
        cs / ds
    );
    println!(
        "pop + ack  direct {dp:>9.0}   cluster of 2 {cp:>9.0}   ratio {:.2}",
        cp / dp
    );
}
