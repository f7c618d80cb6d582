//! Measures the controller's part of a failover: from the moment a master stops
//! heartbeating to the moment the controllers' answer names a new master. Three
//! controllers in this process on loopback, three brokers played by heartbeating clients
//! (every 500 ms, the default `controller.heartbeat_interval`).
//!
//! ```sh
//! cargo run --release -p rocketgate-controller --example failover -- [CYCLES] [BROKER_TIMEOUT_MS] [kill-leader]
//! ```
//! With `kill-leader`, the controller leader is shut down at the same moment as the
//! master falls silent (and started again after the election).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rocketgate_controller::{Controller, ControllerClient, ControllerSettings, Heartbeat};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cycles: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    let timeout = Duration::from_millis(args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3000));
    let kill_leader = args.iter().any(|a| a == "kill-leader");
    let dir = tempfile::tempdir().unwrap();
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
    let settings = |id: u64| {
        let mut s = ControllerSettings::new(id, peers.clone(), dir.path().join(format!("c{id}")));
        s.broker_timeout = timeout;
        s
    };
    let mut ctrls: BTreeMap<u64, Controller> = BTreeMap::new();
    for id in peers.keys() {
        ctrls.insert(*id, Controller::start(settings(*id)).await.unwrap());
    }
    let addrs: Vec<String> = peers.values().cloned().collect();
    let client = ControllerClient::new(addrs.clone())
        .with_timeouts(Duration::from_millis(500), Duration::from_secs(30));
    let on: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
    for id in 0..3u64 {
        let c = ControllerClient::new(addrs.clone())
            .with_timeouts(Duration::from_millis(500), Duration::from_millis(500));
        let on = on[id as usize].clone();
        let hb = Heartbeat {
            group: "g".into(),
            id,
            addr: format!("127.0.0.1:{}", 40000 + id),
            ha_addr: String::new(),
            max_offset: 0,
            epoch: 0,
        };
        client.register(&hb).await.unwrap();
        tokio::spawn(async move {
            loop {
                if on.load(Ordering::Relaxed) {
                    let _ = c.heartbeat(&hb).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    let mut took = Vec::new();
    for cycle in 0..cycles {
        // Everyone in sync, then the master falls silent.
        let info = client.replica_info("g").await.unwrap();
        let master = info.master_id.unwrap();
        client
            .alter_sync_set(
                "g",
                master,
                info.master_epoch,
                info.sync_state_set_epoch,
                BTreeSet::from([0, 1, 2]),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let t0 = Instant::now();
        on[master as usize].store(false, Ordering::Relaxed);
        let mut killed = None;
        if kill_leader {
            let leader = ctrls
                .values()
                .find_map(|c| c.raft().metrics().borrow().current_leader)
                .unwrap();
            ctrls.remove(&leader).unwrap().shutdown().await;
            killed = Some(leader);
        }
        let new = loop {
            if let Ok(i) = client.replica_info("g").await
                && i.master_id != Some(master)
            {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let dt = t0.elapsed();
        took.push(dt);
        println!(
            "cycle {cycle}: master {master} -> {:?} at epoch {} in {dt:?}",
            new.master_id, new.master_epoch
        );
        on[master as usize].store(true, Ordering::Relaxed);
        if let Some(id) = killed {
            ctrls.insert(id, Controller::start(settings(id)).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    took.sort();
    let pct = |p: f64| {
        took[((took.len() as f64 * p).ceil() as usize)
            .saturating_sub(1)
            .min(took.len() - 1)]
    };
    println!(
        "broker_timeout {timeout:?}{}: {} failovers, min {:?} p50 {:?} p99 {:?} max {:?}",
        if kill_leader {
            " + controller leader killed"
        } else {
            ""
        },
        took.len(),
        took[0],
        pct(0.5),
        pct(0.99),
        took[took.len() - 1]
    );
    for (_, c) in ctrls {
        c.shutdown().await;
    }
}
