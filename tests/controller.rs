//! Issue #28, the controller (items 1, 2 and the controller half of 6), through the real
//! binary: three `rocketgate controller` processes on loopback; brokers are played by
//! `ControllerClient`s speaking the controller protocol (the broker's own heartbeat sender
//! is the next step). kill -9 of the Raft leader during an election, a restart of all
//! three, a follower's redirect, the admin CLI, unclean election, and a controller
//! embedded in a NameServer.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rocketgate_controller::wire::{ReplicaInfo, Status, field, request, response};
use rocketgate_controller::{ControllerClient, Heartbeat};
use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::client::Link;

/// A port outside the kernel's ephemeral range, so no other test's `bind(0)` is
/// handed it before the process this test starts binds it.
fn free_port() -> u16 {
    rocketgate_testkit::net::free_port()
}

/// Short timings so a failover takes seconds: a master silent 1.5 s is replaced.
fn with_timings(c: &mut Command) -> &mut Command {
    c.env("ROCKETGATE_CONTROLLER__BROKER_TIMEOUT", "1500ms")
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .env("ROCKETGATE_CONTROLLER__HEARTBEAT_INTERVAL", "300ms")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
}

/// A controller process; killed (SIGKILL) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn controller(id: u64, peers: &str, dir: &Path, unclean: bool) -> Proc {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    with_timings(&mut c)
        .env(
            "ROCKETGATE_CONTROLLER__ALLOW_UNCLEAN_ELECTION",
            unclean.to_string(),
        )
        .args([
            "controller",
            "--id",
            &id.to_string(),
            "--peers",
            peers,
            "--data-dir",
        ])
        .arg(dir.join(format!("c{id}")));
    Proc(c.spawn().unwrap())
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rocketgate"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

async fn wait_for<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn hb(id: u64, max_offset: i64) -> Heartbeat {
    Heartbeat {
        group: "broker-a".into(),
        id,
        addr: format!("127.0.0.1:{}", 30000 + id),
        ha_addr: String::new(),
        max_offset,
        epoch: 0,
    }
}

/// A broker heartbeating every 300 ms while `on` (its own client: a broker process).
fn beat(addrs: &[String], hb: Heartbeat, on: Arc<AtomicBool>) {
    let client = ControllerClient::new(addrs.to_vec());
    tokio::spawn(async move {
        loop {
            if on.load(Ordering::Relaxed) {
                let _ = client.heartbeat(&hb).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
}

/// The controller the cluster agrees leads: (id, address). Every controller that answers
/// must name the same leader, and that one must say it leads (right after start two can
/// briefly both believe they lead, in different terms).
async fn leader(client: &ControllerClient, addrs: &[String]) -> (u64, String) {
    wait_for("a controller leader", 30, async || {
        let mut named = BTreeSet::new();
        let mut leading = None;
        for a in addrs {
            if let Ok(m) = client.metadata(a).await {
                named.insert(m.leader_id);
                if m.is_leader {
                    leading = Some((m.id, a.clone()));
                }
            }
        }
        let (id, addr) = leading?;
        (named.len() == 1 && named.contains(&Some(id))).then_some((id, addr))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_sync_slave_is_elected_though_the_raft_leader_is_killed_mid_election_and_state_survives_a_restart()
 {
    let dir = tempfile::tempdir().unwrap();
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut procs: Vec<Option<Proc>> = (1..=3)
        .map(|id| Some(controller(id, &peers, dir.path(), false)))
        .collect();
    let client = ControllerClient::new(addrs.clone());
    let (leader_id, leader_addr) = leader(&client, &addrs).await;

    // Three brokers register; the first is master at epoch 1. The master takes broker 1
    // into its in-sync set; broker 2 stays out (it lags).
    let first = client.register(&hb(0, 1000)).await.unwrap();
    assert_eq!((first.master_id, first.master_epoch), (Some(0), 1));
    client.register(&hb(1, 900)).await.unwrap();
    client.register(&hb(2, 950)).await.unwrap();
    let info = client
        .alter_sync_set("broker-a", 0, 1, 1, BTreeSet::from([0, 1]))
        .await
        .unwrap();
    assert_eq!(info.sync_state_set, BTreeSet::from([0, 1]));

    // A follower redirects to the leader.
    let follower = addrs.iter().find(|a| **a != leader_addr).unwrap();
    let link = Link::connect(follower, Duration::from_secs(2), None)
        .await
        .unwrap();
    let r = link
        .call(
            RemotingCommand::request(request::CONTROLLER_GET_REPLICA_INFO, 0)
                .with_field(field::BROKER_NAME, "broker-a"),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    assert_eq!(r.code, response::CONTROLLER_NOT_LEADER);
    assert_eq!(r.field(field::LEADER_ADDRESS), Some(leader_addr.as_str()));

    let on: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::new(AtomicBool::new(true))).collect();
    for (id, off) in [(0u64, 1000i64), (1, 900), (2, 950)] {
        beat(&addrs, hb(id, off), on[id as usize].clone());
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The admin CLI shows the group, every broker alive.
    let out = cli(&[
        "controller",
        "status",
        "--controllers",
        &addrs.join(";"),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Status = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status.controllers.len(), 3);
    let g = &status.groups[0];
    assert_eq!((g.info.master_id, g.info.master_epoch), (Some(0), 1));
    assert!(g.replica_status.iter().all(|r| r.alive), "{g:?}");

    // The master stops heartbeating, and the Raft leader is killed before the controllers
    // decide: the next leader (after its own grace of one broker_timeout) elects the
    // in-sync slave 1, never 2, at epoch 2.
    on[0].store(false, Ordering::Relaxed);
    procs[leader_id as usize - 1] = None;
    let info: ReplicaInfo = wait_for("the new master", 30, async || {
        client
            .replica_info("broker-a")
            .await
            .ok()
            .filter(|i| i.master_id != Some(0))
    })
    .await;
    assert_eq!(
        (info.master_id, info.master_epoch),
        (Some(1), 2),
        "{info:?}"
    );
    assert_eq!(info.sync_state_set, BTreeSet::from([1]));
    assert_eq!(info.master_address.as_deref(), Some("127.0.0.1:30001"));
    let (new_leader, _) = leader(&client, &addrs).await;
    assert_ne!(new_leader, leader_id);

    // A manual election towards the out-of-sync broker is refused (CLI exit code != 0).
    let out = cli(&[
        "controller",
        "elect",
        "--controllers",
        &addrs.join(";"),
        "--group",
        "broker-a",
        "--broker-id",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in-sync set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Restart all three (kill -9): epochs and sets survive.
    for o in &on {
        o.store(false, Ordering::Relaxed);
    }
    procs.clear();
    let _procs: Vec<Proc> = (1..=3)
        .map(|id| controller(id, &peers, dir.path(), false))
        .collect();
    let fresh = ControllerClient::new(addrs.clone());
    let info = wait_for("the state after a restart", 30, async || {
        fresh.replica_info("broker-a").await.ok()
    })
    .await;
    assert_eq!(
        (info.master_id, info.master_epoch, info.sync_state_set_epoch),
        (Some(1), 2, 3),
        "{info:?}"
    );
    assert_eq!(info.sync_state_set, BTreeSet::from([1]));
    assert_eq!(info.replicas.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_controller_in_a_namesrv_elects_outside_the_set_only_when_unclean_is_allowed() {
    for unclean in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
        with_timings(&mut c)
            .env(
                "ROCKETGATE_CONTROLLER__ALLOW_UNCLEAN_ELECTION",
                unclean.to_string(),
            )
            .args([
                "namesrv",
                "--listen",
                "0",
                "--controller",
                "--controller-peers",
            ])
            .arg(format!("1={addr}"))
            .arg("--data-dir")
            .arg(dir.path());
        let _ns = Proc(c.spawn().unwrap());
        let addrs = vec![addr.clone()];
        let client = ControllerClient::new(addrs.clone());
        leader(&client, &addrs).await;
        client.register(&hb(0, 10)).await.unwrap();
        client.register(&hb(1, 10)).await.unwrap();
        let on0 = Arc::new(AtomicBool::new(true));
        let on1 = Arc::new(AtomicBool::new(true));
        beat(&addrs, hb(0, 10), on0.clone());
        beat(&addrs, hb(1, 10), on1.clone());
        tokio::time::sleep(Duration::from_millis(800)).await;
        // Broker 1 never joined the in-sync set; the master goes silent.
        on0.store(false, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(4000)).await;
        let info = client.replica_info("broker-a").await.unwrap();
        if unclean {
            assert_eq!(
                (info.master_id, info.master_epoch),
                (Some(1), 2),
                "{info:?}"
            );
        } else {
            assert_eq!(
                (info.master_id, info.master_epoch),
                (Some(0), 1),
                "{info:?}"
            );
        }
        on1.store(false, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_with_controller_addresses_registers_and_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _ctrl = controller(1, &format!("1={addr}"), dir.path(), false);
    let http = format!("127.0.0.1:{}", free_port());
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    with_timings(&mut c)
        .env("ROCKETGATE_CONTROLLER__ADDRESSES", &addr)
        .env("ROCKETGATE_BROKER__ID", "1")
        .env("ROCKETGATE_HA__SECRET", "s3cret")
        .args(["standalone", "--data-dir"])
        .arg(dir.path().join("node"))
        .args([
            "--namesrv",
            "0",
            "--native",
            "0",
            "--mqtt",
            "0",
            "--http",
            &http,
            "--ws",
            "0",
            "--ha",
            "0",
        ]);
    let _node = Proc(c.spawn().unwrap());
    let client = ControllerClient::new(vec![addr.clone()]);
    let status = wait_for("the broker's registration", 30, async || {
        client.status().await.ok().filter(|s| {
            s.groups
                .iter()
                .any(|g| g.replica_status.iter().any(|r| r.alive))
        })
    })
    .await;
    let g = &status.groups[0];
    assert_eq!(g.info.broker_name, "broker-a");
    assert_eq!((g.info.master_id, g.info.master_epoch), (Some(1), 1));
    let r = &g.replica_status[0];
    assert!(
        r.address.starts_with("127.0.0.1:") && !r.address.ends_with(":0"),
        "{r:?}"
    );
    // It keeps heartbeating: still alive after twice the broker timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = client.status().await.unwrap();
    let r = &status.groups[0].replica_status[0];
    assert!(r.alive, "{r:?}");
    assert!(r.last_heartbeat_ms_ago.unwrap() < 1500, "{r:?}");
    // The broker learned its epoch from the first answer and reports it back.
    assert_eq!(r.epoch, Some(1), "{r:?}");

    // `rocketgate admin switchover` through the node: the controllers and the group
    // come from its settings; the answer names the master and the new epoch.
    let server = format!("http://{http}");
    let refused = cli(&[
        "admin",
        "--server",
        &server,
        "switchover",
        "--broker-id",
        "7",
    ]);
    assert_eq!(refused.status.code(), Some(1), "not a broker of the group");
    let out = cli(&[
        "admin",
        "--server",
        &server,
        "--json",
        "switchover",
        "--broker-id",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // The controllers' own JSON (RocketMQ's field names). Broker 1 is the only one:
    // it stays master, at the epoch the controllers answer with.
    assert_eq!(v["brokerName"], "broker-a", "{v}");
    assert_eq!(v["masterId"], 1, "{v}");
    assert!(v["masterEpoch"].as_u64().unwrap() >= 1, "{v}");
    // Named explicitly, without asking the node (its table).
    let out = cli(&[
        "admin",
        "--server",
        "http://127.0.0.1:1",
        "switchover",
        "--controllers",
        &addr,
        "--group",
        "broker-a",
        "--broker-id",
        "1",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("master") && text.contains("epoch"), "{text}");
    // No controller at that address: unreachable (3).
    let out = cli(&[
        "admin",
        "switchover",
        "--controllers",
        &format!("127.0.0.1:{}", free_port()),
        "--group",
        "broker-a",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 (rcgen), as PEM files in `dir`:
/// `ca.pem`, `server.pem`, `server.key`.
fn test_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "controller test CA");
    std::fs::write(dir.join("ca.pem"), ca.self_signed(&ca_key).unwrap().pem()).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("server.pem"), server.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
}

/// `tls.controller` + `controller.ca`: three controllers elect a leader over TLS
/// between themselves; the CLI and a `ControllerClient` with the CA reach them, a
/// client without it gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_talk_tls_with_each_other_brokers_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    test_pki(dir.path());
    let file = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers = format!(
        "1=127.0.0.1:{},2=127.0.0.1:{},3=127.0.0.1:{}",
        ports[0], ports[1], ports[2]
    );
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let tls_env = [
        ("ROCKETGATE_TLS__CONTROLLER", "true".to_owned()),
        ("ROCKETGATE_TLS__CERT", file("server.pem")),
        ("ROCKETGATE_TLS__KEY", file("server.key")),
        ("ROCKETGATE_CONTROLLER__CA", file("ca.pem")),
    ];
    let _procs: Vec<Proc> = (1..=3)
        .map(|id| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
            with_timings(&mut c)
                .envs(tls_env.iter().map(|(k, v)| (k, v)))
                .args(["controller", "--id", &id.to_string(), "--peers", &peers])
                .arg("--data-dir")
                .arg(dir.path().join(format!("c{id}")));
            Proc(c.spawn().unwrap())
        })
        .collect();

    // A client with the CA: a leader was elected (Raft between the three over TLS).
    let client = ControllerClient::new(addrs.clone())
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(5))
        .with_tls(rocketgate_tls::Dialer::new(&dir.path().join("ca.pem")).unwrap());
    let status = wait_for("a leader over TLS", 60, async || client.status().await.ok()).await;
    assert_eq!(status.controllers.len(), 3);

    // The CLI with `controller.ca` answers; without it, no controller answers.
    let status_cli = |ca: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
        c.args(["controller", "status", "--controllers", &addrs.join(";")])
            .env("RUST_LOG", "warn");
        if let Some(ca) = ca {
            c.env("ROCKETGATE_CONTROLLER__CA", ca);
        }
        c.output().unwrap()
    };
    let out = status_cli(Some(&file("ca.pem")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("leader: controller"));
    let out = status_cli(None);
    assert!(!out.status.success(), "a plain client must not be answered");
    let plain = ControllerClient::new(addrs.clone())
        .with_timeouts(Duration::from_secs(1), Duration::from_secs(2));
    assert!(plain.status().await.is_err());
}
