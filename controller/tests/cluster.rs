//! Three controllers in one process on loopback, brokers played by `ControllerClient`s:
//! leader election, registration and heartbeats, automatic election of an in-sync slave,
//! redirects from a follower, and state kept across a restart of all three. (The
//! process-level runs, with kill -9, are in the binary's `tests/controller.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rocketgate_controller::wire::{field, request, response};
use rocketgate_controller::{Controller, ControllerClient, ControllerSettings, Heartbeat};
use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::client::Link;

/// A port outside the kernel's ephemeral range, so no other test's `bind(0)` is
/// handed it before the process this test starts binds it.
fn free_port() -> u16 {
    rocketgate_testkit::net::free_port()
}

async fn start_all(dir: &Path, peers: &BTreeMap<u64, String>) -> Vec<Controller> {
    let mut out = Vec::new();
    for id in peers.keys() {
        let mut s = ControllerSettings::new(*id, peers.clone(), dir.join(format!("c{id}")));
        s.broker_timeout = Duration::from_millis(1500);
        out.push(Controller::start(s).await.unwrap());
    }
    out
}

async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn client_leader(ctrls: &[Controller]) -> u64 {
    ctrls[0].raft().metrics().borrow().current_leader.unwrap()
}

/// A broker that heartbeats every 300 ms while `on`.
fn beat(client: Arc<ControllerClient>, hb: Heartbeat, on: Arc<AtomicBool>) {
    tokio::spawn(async move {
        loop {
            if on.load(Ordering::Relaxed) {
                let _ = client.heartbeat(&hb).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_elect_register_fail_over_redirect_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
    let addrs: Vec<String> = peers.values().cloned().collect();
    let ctrls = start_all(dir.path(), &peers).await;
    let client = Arc::new(ControllerClient::new(addrs.clone()));

    // A leader, agreed by all.
    let leader = wait_for("a leader", async || {
        let ls: Vec<_> = ctrls
            .iter()
            .map(|c| c.raft().metrics().borrow().current_leader)
            .collect();
        (ls[0].is_some() && ls.iter().all(|l| *l == ls[0])).then(|| ls[0].unwrap())
    })
    .await;

    // Three brokers register; the first becomes master at epoch 1.
    let hb = |id: u64, off: i64| Heartbeat {
        group: "g".into(),
        id,
        addr: format!("127.0.0.1:{}", 20000 + id),
        ha_addr: format!("127.0.0.1:{}", 21000 + id),
        max_offset: off,
        epoch: 0,
    };
    let first = client.register(&hb(0, 100)).await.unwrap();
    assert_eq!((first.master_id, first.master_epoch), (Some(0), 1));
    client.register(&hb(1, 90)).await.unwrap();
    let info = client.register(&hb(2, 95)).await.unwrap();
    assert_eq!(info.master_id, Some(0));
    assert_eq!(info.replicas.len(), 3);

    // The master takes 1 (not 2) into the in-sync set; a stale epoch is refused.
    let stale = client
        .alter_sync_set("g", 0, 0, 1, BTreeSet::from([0, 1]))
        .await;
    assert!(
        matches!(
            stale,
            Err(rocketgate_controller::Error::Rejected {
                code: response::CONTROLLER_FENCED_MASTER_EPOCH,
                ..
            })
        ),
        "{stale:?}"
    );
    let info = client
        .alter_sync_set("g", 0, 1, 1, BTreeSet::from([0, 1]))
        .await
        .unwrap();
    assert_eq!(
        (info.sync_state_set.clone(), info.sync_state_set_epoch),
        (BTreeSet::from([0, 1]), 2)
    );

    // A follower redirects to the leader.
    let follower = peers.iter().find(|(id, _)| **id != leader).unwrap().1;
    let link = Link::connect(follower, Duration::from_secs(2), None)
        .await
        .unwrap();
    let r = link
        .call(
            RemotingCommand::request(request::CONTROLLER_GET_REPLICA_INFO, 0)
                .with_field(field::BROKER_NAME, "g"),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    assert_eq!(r.code, response::CONTROLLER_NOT_LEADER);
    assert_eq!(
        r.field(field::LEADER_ADDRESS),
        Some(peers[&leader].as_str())
    );

    // All three heartbeat; then the master goes silent: 1 (in sync, smaller offset) is
    // elected, never 2 (more data, out of sync).
    let on: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
    for (id, off) in [(0u64, 100i64), (1, 90), (2, 95)] {
        beat(client.clone(), hb(id, off), on[id as usize].clone());
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        client.replica_info("g").await.unwrap().master_id,
        Some(0),
        "a beating master stays"
    );
    on[0].store(false, Ordering::Relaxed);
    let info = wait_for("a new master", async || {
        client
            .replica_info("g")
            .await
            .ok()
            .filter(|i| i.master_id != Some(0))
    })
    .await;
    assert_eq!((info.master_id, info.master_epoch), (Some(1), 2));
    assert_eq!(info.sync_state_set, BTreeSet::from([1]));
    assert_eq!(info.master_address.as_deref(), Some("127.0.0.1:20001"));
    assert_eq!(info.master_ha_address.as_deref(), Some("127.0.0.1:21001"));

    // The old master comes back with its old epoch: the answer tells it who is master now.
    let back = client
        .heartbeat(&Heartbeat {
            epoch: 1,
            ..hb(0, 100)
        })
        .await
        .unwrap();
    assert_eq!((back.master_id, back.master_epoch), (Some(1), 2));
    // ... and as a former master it cannot change the in-sync set any more.
    let fenced = client
        .alter_sync_set("g", 0, 1, 3, BTreeSet::from([0]))
        .await;
    assert!(
        matches!(
            fenced,
            Err(rocketgate_controller::Error::Rejected {
                code: response::CONTROLLER_INVALID_MASTER,
                ..
            })
        ),
        "{fenced:?}"
    );

    // Bad input gets a clear refusal, never a panic or a hang.
    let leader_addr = &peers[&client_leader(&ctrls)];
    let link = Link::connect(leader_addr, Duration::from_secs(2), None)
        .await
        .unwrap();
    let ask = async |cmd: RemotingCommand| link.call(cmd, Duration::from_secs(2)).await.unwrap();
    let r = ask(
        RemotingCommand::request(request::CONTROLLER_REGISTER_BROKER, 0)
            .with_field(field::BROKER_ID, 1),
    )
    .await;
    assert_eq!(r.code, response::CONTROLLER_INVALID_REQUEST);
    assert!(r.remark.unwrap().contains("brokerName"));
    let r = ask(RemotingCommand::request(request::BROKER_HEARTBEAT, 0)
        .with_field(field::BROKER_NAME, "g")
        .with_field(field::BROKER_ID, "one")
        .with_field(field::BROKER_ADDRESS, "x:1"))
    .await;
    assert_eq!(r.code, response::CONTROLLER_INVALID_REQUEST);
    let r = ask(RemotingCommand::request(request::RAFT_VOTE, 0).with_body(&b"{not json"[..])).await;
    assert_eq!(r.code, response::CONTROLLER_INVALID_REQUEST);
    let r = ask(
        RemotingCommand::request(request::CONTROLLER_GET_REPLICA_INFO, 0)
            .with_field(field::BROKER_NAME, "nope"),
    )
    .await;
    assert_eq!(r.code, response::CONTROLLER_BROKER_METADATA_NOT_EXIST);
    let r = ask(RemotingCommand::request(4242, 0)).await;
    assert_eq!(
        r.code,
        rocketgate_remoting::code::response::REQUEST_CODE_NOT_SUPPORTED
    );

    // Manual switchover is refused towards an out-of-sync broker.
    let r = client.elect("g", Some(2)).await;
    assert!(
        matches!(
            r,
            Err(rocketgate_controller::Error::Rejected {
                code: response::CONTROLLER_ELECT_MASTER_FAILED,
                ..
            })
        ),
        "{r:?}"
    );
    let status = client.status().await.unwrap();
    assert_eq!(status.groups.len(), 1);
    assert_eq!(status.controllers.len(), 3);

    // Restart all three: the state survives.
    for c in ctrls {
        c.shutdown().await;
    }
    for o in &on {
        o.store(false, Ordering::Relaxed);
    }
    let ctrls = start_all(dir.path(), &peers).await;
    let fresh = ControllerClient::new(addrs);
    let info = wait_for("the state after a restart", async || {
        fresh.replica_info("g").await.ok()
    })
    .await;
    assert_eq!(
        (info.master_id, info.master_epoch, info.sync_state_set_epoch),
        (Some(1), 2, 3)
    );
    assert_eq!(info.replicas.len(), 3);
    for c in ctrls {
        c.shutdown().await;
    }
}
