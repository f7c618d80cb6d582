//! Cluster-mode doors (issue #29), real processes on loopback: two broker groups
//! (`broker-a`: a standalone node with the NameServer; `broker-b`: `rocketgate broker`)
//! and two proxies (`rocketgate proxy --namesrv …`: MQTT, HTTP and WebSocket doors with
//! no store of their own). Clients are third-party where the door has them
//! (`mosquitto_pub`/`mosquitto_sub`, `curl`) and our native client.
//!
//! - A topic created through a proxy has queues on both broker groups; an MQTT
//!   subscriber on proxy 2 receives every message published through proxy 1 by MQTT,
//!   HTTP, WebSocket and the native client, and both groups stored some of them.
//! - An HTTP consumer group read through both proxies gets each message once.
//! - A persistent MQTT session made on proxy 1 survives `kill -9` of proxy 1: the device
//!   reconnects to proxy 2 and gets every message published while it was away; a
//!   retained message set through proxy 1 reaches a new subscriber on proxy 2; the will of
//!   a device cut off with proxy 1 is published (through proxy 2).
//! - `kill -9` of one group's master: HTTP sends through a proxy keep being acknowledged
//!   (on the other group) within 2 s, and after the group restarts every acknowledged
//!   message is read back.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use interop_tests::Node;
use interop_tests::cluster::{Cluster, PROXY_DOORS, stored_on};
use interop_tests::doors::{Door, Outgoing, create_topic, curl};

/// The tests of this file run one at a time: four processes each.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn body(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}-{i}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_door_through_one_proxy_reaches_a_subscriber_on_the_other() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::start()?;
    c.topic("orders", 4).await?;

    let mut sub = Door::Mqtt.receiver(&c.p2, "orders", "unused").await?;
    let mut sent = BTreeSet::new();
    for door in [Door::Mqtt, Door::Http, Door::Ws, Door::Native] {
        for i in 0..6 {
            let mut m = Outgoing::sample("orders");
            m.body = body(&format!("{door}"), i);
            door.publish(&c.p1, &m).await?;
            sent.insert(m.body);
        }
    }
    let mut got = BTreeSet::new();
    while got.len() < sent.len() {
        let m = sub
            .next(Duration::from_secs(20))
            .await
            .with_context(|| format!("received {} of {}", got.len(), sent.len()))?;
        got.insert(m.body);
    }
    assert_eq!(got, sent);
    sub.close().await;
    let (on_a, on_b) = (stored_on(&c.a, "orders")?, stored_on(&c.b, "orders")?);
    assert_eq!(on_a + on_b, sent.len() as u64);
    assert!(
        on_a > 0 && on_b > 0,
        "sends spread over both groups: {on_a} / {on_b}"
    );

    // An HTTP consumer group read through both proxies: each message once.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < sent.len() && Instant::now() < deadline {
        for p in [&c.p1, &c.p2] {
            let mut r = Door::Http.receiver(p, "orders", "billing").await?;
            if let Ok(m) = r.next(Duration::from_millis(500)).await {
                seen.push(m.body);
            }
        }
    }
    let unique: BTreeSet<Vec<u8>> = seen.iter().cloned().collect();
    assert_eq!(unique, sent, "every message reached the HTTP group");
    assert_eq!(seen.len(), sent.len(), "no message twice");
    Ok(())
}

/// `mosquitto_sub` with a persistent session (MQTT 5, session expiry 1 h, clean start
/// off) that exits after `count` messages or `wait` without one.
fn persistent_sub(node: &Node, client_id: &str, count: usize, wait: u64) -> Command {
    let addr = node.addr("mqtt");
    let mut cmd = Command::new("mosquitto_sub");
    cmd.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-V", "mqttv5", "-q", "1", "-c", "-i", client_id])
        .args(["-x", "3600", "-t", "devices/#", "-F", "%p"])
        .args(["-C", &count.to_string(), "-W", &wait.to_string()]);
    cmd
}

fn mqtt_pub(node: &Node, topic: &str, payload: &str, retain: bool) -> anyhow::Result<()> {
    let addr = node.addr("mqtt");
    let mut cmd = Command::new("mosquitto_pub");
    cmd.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-V", "mqttv5", "-q", "1", "-t", topic, "-m", payload]);
    if retain {
        cmd.arg("-r");
    }
    let out = cmd.output().context("running mosquitto_pub")?;
    if !out.status.success() {
        bail!("mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_persistent_session_moves_to_the_other_proxy_after_kill_9() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::start()?;
    c.topic("devices", 2).await?;

    // The session is made on proxy 1 (one message exchanged, so it is surely stored).
    let first = persistent_sub(&c.p1, "dev-42", 1, 20)
        .spawn()
        .context("mosquitto_sub")?;
    std::thread::sleep(Duration::from_millis(500));
    mqtt_pub(&c.p1, "devices/42/hello", "hello", false)?;
    let out = first.wait_with_output()?;
    assert!(out.status.success(), "the first session got its message");

    // While the device is away: ten messages and a retained one, through proxy 1.
    for i in 0..10 {
        mqtt_pub(&c.p1, "devices/42/cmd", &format!("cmd-{i}"), false)?;
    }
    mqtt_pub(&c.p1, "devices/42/config", "retained-config", true)?;
    // Another device, connected through proxy 1 with a will, and a watcher of the will's
    // topic on proxy 2: the will must be published when proxy 1 dies (by the proxy that
    // takes over its doors' sessions), as a broker publishes it when a device is cut off.
    let (p1, p2) = (c.p1.addr("mqtt"), c.p2.addr("mqtt"));
    let mut willing = Command::new("mosquitto_sub")
        .args(["-h", &p1.ip().to_string(), "-p", &p1.port().to_string()])
        .args(["-V", "mqttv5", "-i", "dev-99", "-t", "devices/99/in"])
        .args([
            "--will-topic",
            "devices/99/status",
            "--will-payload",
            "gone",
        ])
        .args(["--will-qos", "1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("mosquitto_sub with a will")?;
    let watcher = Command::new("mosquitto_sub")
        .args(["-h", &p2.ip().to_string(), "-p", &p2.port().to_string()])
        .args(["-V", "mqttv5", "-q", "1", "-t", "devices/99/status"])
        .args(["-C", "1", "-W", "40"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("mosquitto_sub watching the will")?;
    std::thread::sleep(Duration::from_secs(1));
    c.p1.kill9()?;

    // The device comes back on proxy 2: its session, its subscription, its messages.
    let out = persistent_sub(&c.p2, "dev-42", 11, 30).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let got: BTreeSet<&str> = text.lines().collect();
    for i in 0..10 {
        assert!(
            got.contains(format!("cmd-{i}").as_str()),
            "cmd-{i} missing: {text}"
        );
    }
    assert!(got.contains("retained-config"), "retained message: {text}");

    // A new subscriber on proxy 2 gets the retained message set through proxy 1.
    let addr = c.p2.addr("mqtt");
    let out = Command::new("mosquitto_sub")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args([
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            "devices/42/config",
            "-C",
            "1",
            "-W",
            "10",
        ])
        .output()?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "retained-config"
    );

    // The will of the device cut off with proxy 1 reached the watcher on proxy 2.
    let will = watcher.wait_with_output()?;
    let _ = willing.kill();
    let _ = willing.wait();
    assert_eq!(
        String::from_utf8_lossy(&will.stdout).trim(),
        "gone",
        "the will"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_move_to_the_other_group_when_a_master_dies() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::start()?;
    c.topic("ledger", 2).await?;

    let acked: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (acked, stop) = (acked.clone(), stop.clone());
        let url = format!("http://{}/v1/topics/ledger/messages", c.p1.addr("http"));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let body = format!("m-{i}");
                i += 1;
                let out = Command::new("curl")
                    .args([
                        "-sS",
                        "--max-time",
                        "10",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code}",
                    ])
                    .args(["--data-binary", &body, &url])
                    .output();
                if let Ok(o) = out
                    && String::from_utf8_lossy(&o.stdout).trim() == "201"
                {
                    acked.lock().unwrap().push((Instant::now(), body));
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let killed = Instant::now();
    c.b.kill9()?;
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::SeqCst);
    sender.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    let first_after = acked
        .iter()
        .map(|(t, _)| *t)
        .find(|t| *t > killed)
        .context("no send acknowledged after the kill")?;
    assert!(
        first_after - killed < Duration::from_secs(2),
        "sends resumed {:?} after the kill",
        first_after - killed
    );

    // broker-b back: every acknowledged message is read back through a proxy.
    c.b.restart()?;
    let want: BTreeSet<String> = acked.into_iter().map(|(_, b)| b).collect();
    let mut got = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut r = Door::Http.receiver(&c.p2, "ledger", "audit").await?;
    while got.len() < want.len() && Instant::now() < deadline {
        if let Ok(m) = r.next(Duration::from_secs(2)).await {
            got.insert(String::from_utf8_lossy(&m.body).to_string());
        }
    }
    let lost: Vec<&String> = want.difference(&got).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged messages lost: {lost:?}",
        lost.len()
    );
    Ok(())
}

/// A broker whose native door enforces TLS: a proxy with `proxy.broker_ca` reaches it;
/// one without answers 503 and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_talks_tls_to_brokers_that_enforce_it() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir()?;
    let pki = interop_tests::pki::Pki::new(dir.path(), "unused")?;
    let mut env = pki.env();
    env.push(("ROCKETGATE_TLS__NATIVE".into(), "enforcing".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let a = Node::start_with_env(&env)?;
    let ns = a.addr("namesrv").to_string();
    let ca = pki.path("ca.pem").display().to_string();
    let tls = Node::launch(
        &["proxy", "--namesrv", &ns],
        &PROXY_DOORS,
        &[("ROCKETGATE_PROXY__BROKER_CA", &ca)],
    )?;
    let plain = Node::launch(&["proxy", "--namesrv", &ns], &PROXY_DOORS, &[])?;

    create_topic(&tls, "secure", 2).await?;
    let url = |n: &Node| format!("http://{}/v1/topics/secure/messages", n.addr("http"));
    let (status, text) = curl(&["--data-binary", "over tls", &url(&tls)])?;
    assert_eq!(status, 201, "{text}");
    let (status, text) = curl(&["--data-binary", "in the clear", &url(&plain)])?;
    assert_eq!(status, 503, "a plain proxy cannot reach the broker: {text}");
    assert_eq!(stored_on(&a, "secure")?, 1);
    Ok(())
}
