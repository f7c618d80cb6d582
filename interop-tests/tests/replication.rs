//! A broker group as two OS processes on loopback (issue #27, docs/replication.md):
//! a sync master and a slave hold byte-identical commit logs, the slave's doors serve
//! what was replicated and refuse writes, sync sends fail clearly without an in-sync
//! slave and succeed once it is back, a bogus replication client is refused, and
//! `kill -9` of the master loses no acknowledged message.
//!
//! `RG_HA_KILL_CYCLES=N` runs the master-crash test for N cycles (default 3).

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use interop_tests::doors::{create_topic, curl, native_config};
use interop_tests::{Node, wait_for};
use rocketgate_native::client::{Message as NativeMessage, Producer};
use rocketgate_remoting::ha::{Frame, Hello, RefuseCode, VERSION, VERSION_1};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "group-secret";

fn master_env() -> Vec<(&'static str, String)> {
    vec![
        ("ROCKETGATE_HA__MODE", "sync".into()),
        ("ROCKETGATE_HA__SECRET", SECRET.into()),
        ("ROCKETGATE_HA__SYNC_TIMEOUT", "2s".into()),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms".into()),
    ]
}

fn start(env: &[(&'static str, String)]) -> anyhow::Result<Node> {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Node::start_with_env(&env)
}

fn start_master() -> anyhow::Result<Node> {
    start(&master_env())
}

/// A slave of `master`, registered with the master's NameServer too (so the route
/// lists `{0: master, 1: slave}`).
fn start_slave(master: &Node) -> anyhow::Result<Node> {
    start(&[
        ("ROCKETGATE_BROKER__ID", "1".into()),
        ("ROCKETGATE_HA__MASTER", master.addr("ha").to_string()),
        ("ROCKETGATE_HA__SECRET", SECRET.into()),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms".into()),
        (
            "ROCKETGATE_BROKER__NAMESRV_ADDRS",
            master.addr("namesrv").to_string(),
        ),
    ])
}

/// One HTTP publish: (status, JSON body).
fn http_send(node: &Node, topic: &str, body: &str) -> anyhow::Result<(u16, Value)> {
    let url = format!("http://{}/v1/topics/{topic}/messages", node.addr("http"));
    let (status, text) = curl(&["--data-binary", body, &url])?;
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Ok((status, json))
}

/// Waits until a sync send through the master succeeds (the slave is in sync).
fn wait_in_sync(master: &Node) -> anyhow::Result<()> {
    wait_for(
        "the slave to be in sync",
        Duration::from_secs(60),
        || match http_send(master, "probe", "probe") {
            Ok((201, _)) => Some(()),
            _ => None,
        },
    )
}

/// The commit log's segment files: (name, bytes).
fn commit_log(node: &Node) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let dir = node.data_dir().join("commitlog");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        out.push((
            e.file_name().to_string_lossy().into_owned(),
            std::fs::read(e.path())?,
        ));
    }
    out.sort();
    Ok(out)
}

/// Whether the log `after` still holds every byte `before` had written (up to its last
/// non-zero byte per segment file): what was stored is unchanged. The log itself goes
/// on growing meanwhile — the MQTT door appends its liveness entries every second.
fn keeps(before: &[(String, Vec<u8>)], after: &[(String, Vec<u8>)]) -> bool {
    before.iter().all(|(name, old)| {
        let end = old.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        after
            .iter()
            .find(|(n, _)| n == name)
            .is_some_and(|(_, new)| new.len() >= end && new[..end] == old[..end])
    })
}

/// Waits until both logs are the same files with the same bytes.
fn wait_identical(master: &Node, slave: &Node) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (m, s) = (commit_log(master)?, commit_log(slave)?);
        if m == s {
            return Ok(());
        }
        if Instant::now() > deadline {
            let names =
                |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
            let differ = m
                .iter()
                .zip(&s)
                .find_map(|((_, a), (_, b))| a.iter().zip(b).position(|(x, y)| x != y));
            bail!(
                "commit logs differ: master {:?}, slave {:?}, first differing byte {differ:?}",
                names(&m),
                names(&s)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Receives every message of `topic` for `group` over HTTP (acking each batch) until
/// `want` distinct bodies arrived.
fn http_receive_all(
    node: &Node,
    group: &str,
    topic: &str,
    want: usize,
) -> anyhow::Result<BTreeSet<String>> {
    let base = format!("http://{}", node.addr("http"));
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.len() < want {
        if Instant::now() > deadline {
            bail!("received {} of {want} over HTTP", seen.len());
        }
        let url = format!("{base}/v1/groups/{group}/topics/{topic}/messages?max=32&wait_ms=1000");
        let (status, text) = curl(&[&url])?;
        if status != 200 {
            bail!("receive on {topic}: HTTP {status}: {text}");
        }
        let v: Value = serde_json::from_str(&text)?;
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let mut handles = Vec::new();
        for m in &msgs {
            seen.insert(m["body"].as_str().unwrap_or_default().to_string());
            handles.push(m["receipt_handle"].clone());
        }
        if !handles.is_empty() {
            let body = serde_json::json!({ "receipt_handles": handles }).to_string();
            let (status, text) = curl(&[
                "-H",
                "content-type: application/json",
                "--data-binary",
                &body,
                &format!("{base}/v1/groups/{group}/acks"),
            ])?;
            if status != 200 {
                bail!("ack: HTTP {status}: {text}");
            }
        }
    }
    Ok(seen)
}

/// Publishes `bodies` with `mosquitto_pub -l` (one QoS 1 PUBLISH per line, one
/// connection); fails unless every one was acknowledged.
fn mqtt_publish_lines(node: &Node, topic: &str, bodies: &[String]) -> anyhow::Result<()> {
    let addr = node.addr("mqtt");
    let mut child = Command::new("mosquitto_pub")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-V", "mqttv5", "-q", "1", "-t", topic, "-l"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running mosquitto_pub (scripts/install-test-deps installs it)")?;
    {
        let mut stdin = child.stdin.take().context("stdin")?;
        for b in bodies {
            writeln!(stdin, "{b}")?;
        }
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "mosquitto_pub failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// One QoS 1 publish with `mosquitto_pub -d`: (exit success, stdout + stderr).
fn mosquitto_pub_once(node: &Node, version: &str, topic: &str, body: &str) -> (bool, String) {
    let addr = node.addr("mqtt");
    let out = Command::new("mosquitto_pub")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["-V", version, "-q", "1", "-d", "-t", topic, "-m", body])
        .output()
        .expect("mosquitto_pub");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Sends `bodies` through the native door, 16 at a time.
async fn native_send_all(node: &Node, topic: &str, bodies: Vec<String>) -> anyhow::Result<()> {
    let producer = Arc::new(Producer::start(native_config(node), "repl-producers").await?);
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in bodies.chunks(bodies.len().div_ceil(16)) {
        let producer = producer.clone();
        let chunk = chunk.to_vec();
        let topic = topic.to_string();
        tasks.spawn(async move {
            for b in chunk {
                producer
                    .send(NativeMessage::new(topic.clone(), b.into_bytes()))
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_messages_through_three_doors_are_byte_identical_on_the_slave() {
    let master = start_master().expect("master");
    let slave = start_slave(&master).expect("slave");
    wait_in_sync(&master).expect("in sync");
    let topic = "replicated";
    create_topic(&master, topic, 4).await.expect("topic");

    // A subscriber on the slave's MQTT door sees what is replicated.
    let (n_mqtt, n_http, n_native) = (3334, 3333, 3333);
    let sub = Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &slave.addr("mqtt").port().to_string(),
        ])
        .args([
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            &format!("{topic}/#"),
            "-t",
            topic,
        ])
        .args(["-C", &(n_mqtt + n_http + n_native).to_string(), "-W", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub");
    std::thread::sleep(Duration::from_millis(500));

    let mqtt: Vec<String> = (0..n_mqtt).map(|i| format!("mqtt-{i}")).collect();
    mqtt_publish_lines(&master, topic, &mqtt).expect("MQTT QoS 1 publishes");
    let url = format!(
        "http://{}/v1/topics/{topic}/messages/batch",
        master.addr("http")
    );
    for chunk in (0..n_http).collect::<Vec<_>>().chunks(500) {
        let batch: Vec<Value> = chunk
            .iter()
            .map(|i| serde_json::json!({ "body": format!("http-{i}") }))
            .collect();
        let (status, text) = curl(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            &Value::Array(batch).to_string(),
            &url,
        ])
        .unwrap();
        assert_eq!(status, 201, "{text}");
    }
    let native: Vec<String> = (0..n_native).map(|i| format!("native-{i}")).collect();
    native_send_all(&master, topic, native)
        .await
        .expect("native sends");

    wait_identical(&master, &slave).expect("identical logs");

    // The slave's doors serve them: HTTP receive (POP) …
    let got = tokio::task::block_in_place(|| {
        http_receive_all(&slave, "on-slave", topic, n_mqtt + n_http + n_native)
    })
    .expect("HTTP receive on the slave");
    for prefix in ["mqtt", "http", "native"] {
        let n = got.iter().filter(|b| b.starts_with(prefix)).count();
        assert!(n >= 3333, "{n} {prefix} messages received on the slave");
    }
    // … and an MQTT subscription.
    let out = tokio::task::block_in_place(|| sub.wait_with_output()).expect("mosquitto_sub");
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(
        lines,
        n_mqtt + n_http + n_native,
        "MQTT deliveries on the slave"
    );

    // Writes to the slave are refused at its doors, naming the master.
    let (status, body) = http_send(&slave, topic, "to-the-slave").unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "read_only_replica", "{body}");
    let text = body["error"]["message"].as_str().unwrap_or_default();
    assert!(text.contains(&master.addr("ha").to_string()), "{text}");
    // MQTT 5: PUBACK 0x80 with the reason; 3.1.1: no PUBACK, the connection closed.
    let (_, out) = mosquitto_pub_once(&slave, "mqttv5", "replicated/x", "to-the-slave");
    assert!(out.contains("RC:128"), "{out}");
    assert!(out.contains("read-only slave"), "{out}");
    let (ok, out) = mosquitto_pub_once(&slave, "mqttv311", "replicated/x", "to-the-slave");
    assert!(!ok && !out.contains("received PUBACK"), "{out}");
    // And nothing of it reached the slave's log (still the master's bytes).
    wait_identical(&master, &slave).expect("identical logs after the refusals");
}

/// MQTT 5 server redirection (#27 item 6, docs/mqtt.md "Server redirection"): a
/// slave started with `mqtt.server_reference` naming the master's MQTT door sends a
/// paho v5 publisher there with DISCONNECT 0x9C, the publish is acknowledged by the
/// master and replicated; a persistent session asked of the slave gets CONNACK 0x9C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slaves_mqtt_door_sends_v5_publishers_to_the_master() {
    let master = start_master().expect("master");
    let reference = master.addr("mqtt").to_string();
    let slave = start(&[
        ("ROCKETGATE_BROKER__ID", "1".into()),
        ("ROCKETGATE_HA__MASTER", master.addr("ha").to_string()),
        ("ROCKETGATE_HA__SECRET", SECRET.into()),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms".into()),
        ("ROCKETGATE_MQTT__SERVER_REFERENCE", reference.clone()),
    ])
    .expect("slave");
    wait_in_sync(&master).expect("in sync");
    create_topic(&master, "redir", 1).await.expect("topic");
    wait_identical(&master, &slave).expect("the topic on the slave");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/mqtt_redirect.py");
    let addr = slave.addr("mqtt");
    let out = tokio::task::block_in_place(|| {
        Command::new("python3")
            .args([
                script,
                &addr.ip().to_string(),
                &addr.port().to_string(),
                "redir/x",
            ])
            .output()
            .expect("python3 with paho-mqtt")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert_eq!(text.trim(), format!("ok {reference}"));
    // What the master took reaches the slave's log; nothing of the refused one.
    wait_identical(&master, &slave).expect("identical logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_sends_fail_without_the_slave_and_succeed_after_it_catches_up() {
    let master = start_master().expect("master");
    let mut slave = start_slave(&master).expect("slave");
    wait_in_sync(&master).expect("in sync");
    for i in 0..50 {
        let (status, body) = http_send(&master, "orders", &format!("before-{i}")).unwrap();
        assert_eq!(status, 201, "{body}");
    }

    slave.kill9().expect("kill the slave");
    // Never an ack while the slave is away: HTTP 503 replication_timeout, native
    // SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT.
    let (status, body) = wait_for("a refused sync send", Duration::from_secs(10), || {
        let r = http_send(&master, "orders", "while-away").ok()?;
        (r.0 != 201).then_some(r)
    })
    .unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "replication_timeout", "{body}");
    let producer = Producer::start(native_config(&master), "repl-p")
        .await
        .unwrap();
    let e = producer
        .send(NativeMessage::new("orders", b"native-while-away".to_vec()))
        .await
        .expect_err("a native sync send without a slave");
    // SLAVE_NOT_AVAILABLE (11) or FLUSH_SLAVE_TIMEOUT (12), as RocketMQ's SYNC_MASTER.
    assert!(
        matches!(e.code(), Some(11) | Some(12)),
        "the native error says why: {e:?}"
    );
    for i in 0..5 {
        let (status, _) = http_send(&master, "orders", &format!("away-{i}")).unwrap();
        assert_eq!(status, 503);
    }
    let (_, out) = mosquitto_pub_once(&master, "mqttv5", "orders/x", "mqtt-while-away");
    assert!(out.contains("RC:128") && out.contains("in-sync"), "{out}");
    let (ok, out) = mosquitto_pub_once(&master, "mqttv311", "orders/x", "mqtt-while-away");
    assert!(!ok && !out.contains("received PUBACK"), "{out}");

    // Back: it catches up (also the 'maybe' messages in the master's log), and sync
    // sends are acknowledged again.
    slave.restart().expect("restart the slave");
    wait_in_sync(&master).expect("in sync again");
    let (status, body) = http_send(&master, "orders", "after").unwrap();
    assert_eq!(status, 201, "{body}");
    let (ok, out) = mosquitto_pub_once(&master, "mqttv5", "orders/x", "mqtt-after");
    assert!(ok && out.contains("RC:0"), "{out}");
    producer
        .send(NativeMessage::new("orders", b"native-after".to_vec()))
        .await
        .expect("a native sync send with the slave back");
    producer.shutdown().await;
    wait_identical(&master, &slave).expect("identical logs after the catch-up");
}

/// Opens the master's replication port and sends `bytes`; the frames it answers.
async fn ha_exchange(node: &Node, bytes: &[u8]) -> Vec<Frame> {
    let mut s = tokio::net::TcpStream::connect(node.addr("ha"))
        .await
        .unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    let mut frames = Vec::new();
    let mut at = 0;
    while let Ok(Some((f, n))) = Frame::decode(&buf[at..]) {
        frames.push(f);
        at += n;
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bogus_replication_clients_are_refused_and_change_nothing() {
    let master = start_master().expect("master");
    let before = commit_log(&master).unwrap();
    let hello_v = |version: u16, secret: &str, log_end: u64| {
        let mut out = Vec::new();
        Frame::Hello(Hello {
            version,
            broker_id: 1,
            log_end,
            segment_size: 8 << 20,
            group: "broker-a".into(),
            secret: secret.as_bytes().to_vec(),
            // Outside controller mode: no epochs, the rules without them.
            epoch: 0,
            epochs: vec![],
        })
        .encode(&mut out);
        out
    };
    let hello = |secret: &str, log_end: u64| hello_v(VERSION, secret, log_end);
    let refusal = |frames: Vec<Frame>| match frames.first() {
        Some(Frame::Refuse { code, .. }) => *code,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refusal(ha_exchange(&master, &hello("wrong", 0)).await),
        RefuseCode::Secret
    );
    assert_eq!(
        refusal(ha_exchange(&master, &hello(SECRET, 1 << 40)).await),
        RefuseCode::BeyondEnd
    );
    assert_eq!(
        refusal(ha_exchange(&master, b"\x16\x03\x01 garbage that is no frame").await),
        RefuseCode::Protocol
    );
    assert!(
        keeps(&before, &commit_log(&master).unwrap()),
        "the refused clients changed nothing in the log"
    );
    // Admitted (the right secret, protocol version 1 as slaves without epochs speak
    // it: answered in version 1), then it claims an offset beyond the master's end:
    // dropped; a sync send is still not acknowledged on its word.
    let mut bytes = hello_v(VERSION_1, SECRET, 0);
    Frame::Ack { log_end: 1 << 40 }.encode(&mut bytes);
    let frames = ha_exchange(&master, &bytes).await;
    assert!(
        matches!(
            frames.first(),
            Some(Frame::Welcome {
                version: VERSION_1,
                ..
            })
        ),
        "{frames:?}"
    );
    assert!(
        frames.iter().any(|f| matches!(
            f,
            Frame::Refuse {
                code: RefuseCode::BeyondEnd,
                ..
            }
        )),
        "{frames:?}"
    );
    let (status, body) = http_send(&master, "t", "no-slave").unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "replication_timeout");
    let log = std::fs::read_to_string(master.data_dir().join("../node.log")).unwrap_or_default();
    assert!(log.contains("refused a slave"), "refusals are logged");
}

/// A TCP proxy between slave and master that the test can cut: while cut, no byte
/// crosses (a black hole, as a partition looks to both ends) and new connections
/// wait; healed, bytes flow again.
struct Partition {
    addr: std::net::SocketAddr,
    cut: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Partition {
    async fn start(upstream: std::net::SocketAddr) -> Partition {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c = cut.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    return;
                };
                let cut = c.clone();
                tokio::spawn(async move {
                    while cut.load(Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    let a = tokio::spawn(pipe(dr, uw, cut.clone()));
                    let b = tokio::spawn(pipe(ur, dw, cut));
                    let _ = tokio::join!(a, b);
                });
            }
        });
        Partition { addr, cut, task }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while cut.load(std::sync::atomic::Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = match tokio::time::timeout(Duration::from_millis(50), from.read(&mut buf)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => n,
        };
        if cut.load(std::sync::atomic::Ordering::Acquire) {
            // Lost in the partition.
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A slave that reaches its master through `proxy`.
fn start_slave_via(master: &Node, proxy: std::net::SocketAddr) -> anyhow::Result<Node> {
    start(&[
        ("ROCKETGATE_BROKER__ID", "1".into()),
        ("ROCKETGATE_HA__MASTER", proxy.to_string()),
        ("ROCKETGATE_HA__SECRET", SECRET.into()),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms".into()),
        (
            "ROCKETGATE_BROKER__NAMESRV_ADDRS",
            master.addr("namesrv").to_string(),
        ),
    ])
}

fn cluster(node: &Node) -> Value {
    let (status, text) = curl(&[&format!("http://{}/v1/cluster", node.addr("http"))]).unwrap();
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_fails_sync_sends_in_time_and_the_slave_catches_up_after_the_heal() {
    let master = start_master().expect("master");
    let proxy = Partition::start(master.addr("ha")).await;
    let slave = start_slave_via(&master, proxy.addr).expect("slave");
    wait_in_sync(&master).expect("in sync");
    let view = cluster(&master);
    let r = &view["replication"];
    assert_eq!(r["role"], "master", "{view}");
    assert_eq!(r["mode"], "sync");
    assert_eq!(r["slaves"][0]["in_sync"], true, "{view}");
    assert_eq!(cluster(&slave)["replication"]["role"], "slave");

    proxy.set_cut(true);
    let started = Instant::now();
    let (status, body) =
        tokio::task::block_in_place(|| http_send(&master, "orders", "cut-off")).unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "replication_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "answered after {:?} (ha.sync_timeout is 2s)",
        started.elapsed()
    );

    proxy.set_cut(false);
    tokio::task::block_in_place(|| wait_in_sync(&master)).expect("in sync after the heal");
    tokio::task::block_in_place(|| wait_identical(&master, &slave)).expect("caught up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_replication_goes_on_through_a_partition_and_shows_its_lag() {
    let master = start(&[
        ("ROCKETGATE_HA__SECRET", SECRET.into()),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms".into()),
    ])
    .expect("master");
    let proxy = Partition::start(master.addr("ha")).await;
    let slave = start_slave_via(&master, proxy.addr).expect("slave");
    tokio::task::block_in_place(|| {
        wait_for("the slave to join", Duration::from_secs(30), || {
            let v = cluster(&master);
            (v["replication"]["slaves"].as_array().map_or(0, Vec::len) == 1).then_some(())
        })
    })
    .unwrap();
    proxy.set_cut(true);
    for i in 0..20 {
        let (status, body) =
            tokio::task::block_in_place(|| http_send(&master, "events", &format!("e-{i}")))
                .unwrap();
        assert_eq!(status, 201, "async sends go on: {body}");
    }
    // While cut off, the slave is behind (the master's view may already have dropped it).
    let metrics = curl(&[&format!("http://{}/metrics", master.addr("http"))])
        .unwrap()
        .1;
    assert!(
        metrics.contains("rocketgate_replication_in_sync_slaves"),
        "{metrics}"
    );
    proxy.set_cut(false);
    tokio::task::block_in_place(|| wait_identical(&master, &slave))
        .expect("caught up after the heal");
    let view = tokio::task::block_in_place(|| {
        wait_for("a caught-up slave", Duration::from_secs(30), || {
            let v = cluster(&master);
            (v["replication"]["slaves"][0]["lag_bytes"] == 0).then_some(v)
        })
    })
    .unwrap();
    assert_eq!(view["replication"]["mode"], "async", "{view}");
    // Polled: the master may append a topic-table snapshot between two reads, so a
    // caught-up slave can be a record behind for a moment.
    let metrics = tokio::task::block_in_place(|| {
        wait_for("a lag of 0 in /metrics", Duration::from_secs(30), || {
            let m = curl(&[&format!("http://{}/metrics", master.addr("http"))])
                .unwrap()
                .1;
            m.contains("rocketgate_replication_lag_bytes{slave=\"1\"} 0")
                .then_some(m)
        })
    })
    .unwrap();
    assert!(
        metrics.contains("rocketgate_replication_lag_ms"),
        "{metrics}"
    );
}

/// One HTTP publish from a plain thread: `Some(true)` acknowledged (201), `Some(false)`
/// answered otherwise (not acknowledged: 'maybe' if the master stored it), `None` no
/// answer (the master died under it: 'maybe' too).
fn send_from_thread(http: std::net::SocketAddr, body: &str) -> Option<bool> {
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
        .args(["--data-binary", body])
        .arg(format!("http://{http}/v1/topics/ledger/messages"))
        .output()
        .ok()?;
    let code = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match code.as_str() {
        "201" => Some(true),
        "000" | "" => None,
        _ => Some(false),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_a_sync_master_loses_no_acknowledged_message() {
    let cycles: usize = std::env::var("RG_HA_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut master = start_master().expect("master");
    let slave = start_slave(&master).expect("slave");
    tokio::task::block_in_place(|| wait_in_sync(&master)).expect("in sync");
    let mut acked: Vec<String> = Vec::new();
    let mut maybe = 0usize;
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for cycle in 0..cycles {
        let http = master.addr("http");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let senders: Vec<_> = (0..4)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let (mut ok, mut unknown) = (Vec::new(), 0usize);
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        let id = format!("c{cycle}-t{t}-{n}");
                        match send_from_thread(http, &id) {
                            Some(true) => ok.push(id),
                            _ => unknown += 1,
                        }
                        n += 1;
                    }
                    (ok, unknown)
                })
            })
            .collect();
        // A random moment: 300..1300 ms into the load.
        let at = 300 + (rocketgate_base::clock::now_ms() as u64 * 7919 % 1000);
        tokio::time::sleep(Duration::from_millis(at)).await;
        master.kill9().expect("kill -9 the master");
        stop.store(true, std::sync::atomic::Ordering::Release);
        for s in senders {
            let (ok, unknown) = s.join().unwrap();
            acked.extend(ok);
            maybe += unknown;
        }
        // Every acknowledged message is on the slave: read them through its door.
        let got = tokio::task::block_in_place(|| {
            let base = format!("http://{}", slave.addr("http"));
            let mut new = BTreeSet::new();
            loop {
                let url = format!(
                    "{base}/v1/groups/ledger-check/topics/ledger/messages?max=32&wait_ms=1500"
                );
                let (status, text) = curl(&[&url])?;
                if status == 404 && seen.is_empty() && new.is_empty() && acked.is_empty() {
                    return anyhow::Ok(new);
                }
                if status != 200 {
                    bail!("receive on the slave: HTTP {status}: {text}");
                }
                let v: Value = serde_json::from_str(&text)?;
                let msgs = v["messages"].as_array().cloned().unwrap_or_default();
                if msgs.is_empty() {
                    return Ok(new);
                }
                let mut handles = Vec::new();
                for m in &msgs {
                    new.insert(m["body"].as_str().unwrap_or_default().to_string());
                    handles.push(m["receipt_handle"].clone());
                }
                let body = serde_json::json!({ "receipt_handles": handles }).to_string();
                curl(&[
                    "-H",
                    "content-type: application/json",
                    "--data-binary",
                    &body,
                    &format!("{base}/v1/groups/ledger-check/acks"),
                ])?;
            }
        })
        .expect("reading the slave");
        seen.extend(got);
        let missing: Vec<&String> = acked.iter().filter(|id| !seen.contains(*id)).collect();
        assert!(
            missing.is_empty(),
            "cycle {cycle}: {} of {} acknowledged messages are not on the slave, e.g. {:?}",
            missing.len(),
            acked.len(),
            &missing[..missing.len().min(5)]
        );
        eprintln!(
            "cycle {cycle}: killed after {at} ms; {} acknowledged so far, all on the slave; {maybe} unacknowledged ('maybe')",
            acked.len()
        );
        master.restart().expect("restart the master");
        tokio::task::block_in_place(|| wait_in_sync(&master)).expect("in sync again");
    }
    assert!(!acked.is_empty(), "the load acknowledged nothing");
}

/// Waits until `node` shows `group`'s committed offsets over `topic` summing to
/// `total` (`GET /v1/groups/{group}`).
fn wait_committed(node: &Node, group: &str, topic: &str, total: u64) -> anyhow::Result<()> {
    let url = format!("http://{}/v1/groups/{group}", node.addr("http"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, text) = curl(&[&url])?;
        let sum: u64 = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["progress"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|p| p["topic"] == topic)
            .filter_map(|p| p["committed"].as_u64())
            .sum();
        if status == 200 && sum == total {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{group} on {topic}: committed {sum}, want {total} (HTTP {status}: {text})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Receives (and acks) from `node` over HTTP until a receive comes back empty.
fn drain(node: &Node, group: &str, topic: &str, max_total: usize) -> anyhow::Result<Vec<String>> {
    let base = format!("http://{}", node.addr("http"));
    let mut got = Vec::new();
    while got.len() < max_total {
        // Receive no more than is taken: a message received and dropped would stay in
        // flight (its POP state travels to a slave) until its invisible time.
        let max = (max_total - got.len()).min(32);
        let url =
            format!("{base}/v1/groups/{group}/topics/{topic}/messages?max={max}&wait_ms=1500");
        let (status, text) = curl(&[&url])?;
        if status != 200 {
            bail!("receive: HTTP {status}: {text}");
        }
        let v: Value = serde_json::from_str(&text)?;
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        if msgs.is_empty() {
            break;
        }
        let mut handles = Vec::new();
        for m in msgs.iter().take(max_total - got.len()) {
            got.push(m["body"].as_str().unwrap_or_default().to_string());
            handles.push(m["receipt_handle"].clone());
        }
        let body = serde_json::json!({ "receipt_handles": handles }).to_string();
        curl(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
            &format!("{base}/v1/groups/{group}/acks"),
        ])?;
    }
    Ok(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_moves_to_the_slave_while_the_master_is_down_and_back_losing_nothing() {
    let mut master = start_master().expect("master");
    let slave = start_slave(&master).expect("slave");
    tokio::task::block_in_place(|| wait_in_sync(&master)).expect("in sync");
    let topic = "moving";
    create_topic(&master, topic, 2).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..100 {
        let id = format!("m-{i}");
        let (status, body) =
            tokio::task::block_in_place(|| http_send(&master, topic, &id)).unwrap();
        assert_eq!(status, 201, "{body}");
        acked.push(id);
    }
    let mut seen: Vec<String> = Vec::new();
    seen.extend(tokio::task::block_in_place(|| drain(&master, "mover", topic, 40)).unwrap());
    assert_eq!(seen.len(), 40);

    // The group's offsets reach the slave through the log (within ~1 s + the lag).
    tokio::task::block_in_place(|| wait_committed(&slave, "mover", topic, 40))
        .expect("the master's offsets on the slave");
    master.kill9().expect("kill -9 the master");
    // The consumer goes on at the slave's door from the master's offsets: the 60 it
    // had not had, none of the 40 again.
    let on_slave = tokio::task::block_in_place(|| drain(&slave, "mover", topic, 1000)).unwrap();
    let again: Vec<&String> = on_slave.iter().filter(|m| seen.contains(m)).collect();
    assert!(
        again.is_empty(),
        "the slave redelivered {} of the 40 acknowledged on the master: {again:?}",
        again.len()
    );
    assert_eq!(on_slave.len(), 60, "the slave delivered {on_slave:?}");
    seen.extend(on_slave);

    master.restart().expect("restart the master");
    tokio::task::block_in_place(|| wait_in_sync(&master)).expect("in sync again");
    // What the group committed on the slave goes back to the master with the stream.
    tokio::task::block_in_place(|| wait_committed(&master, "mover", topic, 100))
        .expect("the slave's positions on the master");
    for i in 100..150 {
        let id = format!("m-{i}");
        let (status, body) =
            tokio::task::block_in_place(|| http_send(&master, topic, &id)).unwrap();
        assert_eq!(status, 201, "{body}");
        acked.push(id);
    }
    // Back at the master: from where the group got to on the slave.
    seen.extend(tokio::task::block_in_place(|| drain(&master, "mover", topic, 1000)).unwrap());
    let set: BTreeSet<&String> = seen.iter().collect();
    let lost: Vec<&String> = acked.iter().filter(|id| !set.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "lost {} acknowledged messages: {lost:?}",
        lost.len()
    );
    assert_eq!(
        seen.len(),
        set.len(),
        "{} deliveries of {} distinct messages: the moves redelivered some",
        seen.len(),
        set.len()
    );
}

/// The replication channel over TLS (`tls.ha` on the master, `ha.master_ca` on the
/// slave): a slave that trusts the master's CA follows it (sync sends succeed, the logs
/// are byte-identical); a slave speaking plain TCP to the TLS port, and one trusting
/// another CA, are never admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_over_tls_admits_only_a_slave_that_trusts_the_masters_ca() {
    let certs = tempfile::tempdir().unwrap();
    let pki = interop_tests::pki::Pki::new(certs.path(), "client").unwrap();
    let mut menv = master_env();
    menv.push(("ROCKETGATE_TLS__HA", "true".into()));
    menv.push((
        "ROCKETGATE_TLS__CERT",
        pki.path("server.pem").display().to_string(),
    ));
    menv.push((
        "ROCKETGATE_TLS__KEY",
        pki.path("server.key").display().to_string(),
    ));
    let master = start(&menv).expect("master with TLS on the replication port");
    let slave_env = |ca: Option<&str>| {
        let mut env = vec![
            ("ROCKETGATE_BROKER__ID", "1".to_string()),
            ("ROCKETGATE_HA__MASTER", master.addr("ha").to_string()),
            ("ROCKETGATE_HA__SECRET", SECRET.into()),
            ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms".into()),
        ];
        if let Some(ca) = ca {
            env.push((
                "ROCKETGATE_HA__MASTER_CA",
                pki.path(ca).display().to_string(),
            ));
        }
        env
    };
    // Plain TCP against the TLS port, and TLS trusting the wrong CA: not admitted.
    let plain = start(&slave_env(None)).expect("plain slave");
    let wrong = start(&slave_env(Some("wrong-ca.pem"))).expect("wrong-CA slave");
    std::thread::sleep(Duration::from_secs(2));
    let view = cluster(&master);
    assert_eq!(
        view["replication"]["slaves"].as_array().map_or(0, Vec::len),
        0,
        "{view}"
    );
    let (status, body) = tokio::task::block_in_place(|| http_send(&master, "tls", "x")).unwrap();
    assert_eq!(status, 503, "a sync send without an admitted slave: {body}");
    drop((plain, wrong));

    let slave = start(&slave_env(Some("ca.pem"))).expect("slave trusting the CA");
    tokio::task::block_in_place(|| wait_in_sync(&master)).expect("in sync over TLS");
    for i in 0..50 {
        let (status, body) =
            tokio::task::block_in_place(|| http_send(&master, "tls", &format!("m-{i}"))).unwrap();
        assert_eq!(status, 201, "{body}");
    }
    tokio::task::block_in_place(|| wait_identical(&master, &slave)).expect("identical logs");
}

/// One HTTP receive of up to 32 messages invisible for `invisible_ms`, waiting up to
/// `wait_ms`: (body, receipt handle) each.
fn http_receive(
    node: &Node,
    group: &str,
    topic: &str,
    invisible_ms: u64,
    wait_ms: u64,
) -> anyhow::Result<Vec<(String, Value)>> {
    let url = format!(
        "http://{}/v1/groups/{group}/topics/{topic}/messages?max=32&wait_ms={wait_ms}&invisible_ms={invisible_ms}",
        node.addr("http")
    );
    let (status, text) = curl(&[&url])?;
    if status != 200 {
        bail!("receive: HTTP {status}: {text}");
    }
    let v: Value = serde_json::from_str(&text)?;
    Ok(v["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m["body"].as_str().unwrap_or_default().to_string(),
                m["receipt_handle"].clone(),
            )
        })
        .collect())
}

fn http_ack(node: &Node, group: &str, handles: Vec<Value>) -> anyhow::Result<()> {
    let body = serde_json::json!({ "receipt_handles": handles }).to_string();
    let (status, text) = curl(&[
        "-H",
        "content-type: application/json",
        "--data-binary",
        &body,
        &format!("http://{}/v1/groups/{group}/acks", node.addr("http")),
    ])?;
    if status != 200 {
        bail!("ack: HTTP {status}: {text}");
    }
    Ok(())
}

/// POP state goes through the log: an HTTP group receives 64 of 100 messages on the
/// master (two receives of 32) and acks two of every three (out of order, so the
/// committed offset alone would send the acked ones again), the master is killed, and
/// the group goes on at the slave's door: the 36 never received at once, the 22 unacked
/// ones only after their invisible time, none of the 42 acked ones again.
///
/// The master writes its POP state at most once a second, so the slave may first see
/// the state after the first receive only (32 in flight). 22 in flight is the state
/// after the acks and nothing before it: that is what the test waits for before the
/// kill (with every other one acked it waited for 32, and a CI run killed the master
/// when only the first receive had reached the slave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_group_continues_on_the_slave_with_its_acks_and_in_flight_messages() {
    const INVISIBLE_MS: u64 = 10_000;
    let mut master = start_master().expect("master");
    let slave = start_slave(&master).expect("slave");
    tokio::task::block_in_place(|| wait_in_sync(&master)).expect("in sync");
    let (topic, group) = ("popped", "poppers");
    create_topic(&master, topic, 1).await.unwrap();
    for i in 0..100 {
        let (status, body) =
            tokio::task::block_in_place(|| http_send(&master, topic, &format!("m-{i}"))).unwrap();
        assert_eq!(status, 201, "{body}");
    }
    let index = |b: &str| -> usize { b.trim_start_matches("m-").parse().unwrap() };
    let mut received = Vec::new();
    while received.len() < 64 {
        received.extend(
            tokio::task::block_in_place(|| http_receive(&master, group, topic, INVISIBLE_MS, 1000))
                .unwrap(),
        );
    }
    let received_at = Instant::now();
    assert_eq!(received.len(), 64);
    let (acked, held): (Vec<_>, Vec<_>) =
        received.into_iter().partition(|(b, _)| index(b) % 3 != 0);
    tokio::task::block_in_place(|| {
        http_ack(
            &master,
            group,
            acked.iter().map(|(_, h)| h.clone()).collect(),
        )
    })
    .unwrap();

    // The slave holds the group's 22 in-flight messages once the POP record written
    // after the acks is there.
    let metrics = format!("http://{}/metrics", slave.addr("http"));
    let line = format!(
        "rocketgate_pop_inflight{{group=\"{group}\"}} {}",
        held.len()
    );
    tokio::task::block_in_place(|| {
        wait_for(
            "the POP state on the slave",
            Duration::from_secs(20),
            || {
                let (_, text) = curl(&[&metrics]).ok()?;
                text.lines().any(|l| l == line).then_some(())
            },
        )
    })
    .expect("POP state reaches the slave");
    master.kill9().expect("kill -9 the master");

    // At once: the 36 never received; none of the acked, none still invisible.
    let mut first = Vec::new();
    loop {
        let batch =
            tokio::task::block_in_place(|| http_receive(&slave, group, topic, 60_000, 0)).unwrap();
        if batch.is_empty() {
            break;
        }
        first.extend(batch);
    }
    assert!(
        received_at.elapsed() < Duration::from_millis(INVISIBLE_MS),
        "too slow to tell in-flight from visible"
    );
    let mut got: Vec<usize> = first.iter().map(|(b, _)| index(b)).collect();
    got.sort();
    assert_eq!(got, (64..100).collect::<Vec<_>>(), "at once on the slave");
    tokio::task::block_in_place(|| {
        http_ack(
            &slave,
            group,
            first.iter().map(|(_, h)| h.clone()).collect(),
        )
    })
    .unwrap();

    // After their invisible time: the 22 held ones, as second deliveries.
    let mut again = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while again.len() < held.len() && Instant::now() < deadline {
        again.extend(
            tokio::task::block_in_place(|| http_receive(&slave, group, topic, 60_000, 2000))
                .unwrap(),
        );
    }
    assert!(received_at.elapsed() >= Duration::from_millis(INVISIBLE_MS - 1000));
    let mut got: Vec<usize> = again.iter().map(|(b, _)| index(b)).collect();
    got.sort();
    let mut want: Vec<usize> = held.iter().map(|(b, _)| index(b)).collect();
    want.sort();
    assert_eq!(got, want, "the in-flight ones, once each; no acked one");
    tokio::task::block_in_place(|| {
        http_ack(
            &slave,
            group,
            again.iter().map(|(_, h)| h.clone()).collect(),
        )
    })
    .unwrap();
    let rest =
        tokio::task::block_in_place(|| http_receive(&slave, group, topic, 60_000, 1500)).unwrap();
    assert!(rest.is_empty(), "nothing more: {rest:?}");
}

/// `rocketgate admin group delete` against the master of a broker group: the slave
/// agrees through the replicated log (its offsets and view of the group go), a delete
/// sent to the slave is refused (it is the master's change), and a consumer of that
/// name on the master starts again at the earliest message, not at the old offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_deleted_on_the_master_is_gone_on_the_slave_too() {
    let master = start_master().expect("master");
    let slave = start_slave(&master).expect("slave");
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        wait_in_sync(&master)?;
        for i in 0..5 {
            let (status, v) = http_send(&master, "ledger", &format!("l{i}"))?;
            anyhow::ensure!(status == 201, "send: {status} {v}");
        }
        assert_eq!(drain(&master, "billing", "ledger", 5)?.len(), 5);
        wait_committed(&slave, "billing", "ledger", 5)?;
        let admin = |node: &Node, args: &[&str]| -> anyhow::Result<std::process::Output> {
            Ok(Command::new(interop_tests::binary()?)
                .arg("admin")
                .args(["--server", &format!("http://{}", node.addr("http"))])
                .args(args)
                .output()?)
        };
        let refused = admin(&slave, &["group", "delete", "billing", "--force"])?;
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("read_only_replica"), "{stderr}");
        let done = admin(
            &master,
            &["--json", "group", "delete", "billing", "--force"],
        )?;
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
        let v: Value = serde_json::from_slice(&done.stdout)?;
        assert!(v["offsets"].as_u64().unwrap_or(0) >= 1, "{v}");
        let on_slave = format!("http://{}/v1/groups/billing", slave.addr("http"));
        wait_for(
            "the slave to forget the group",
            Duration::from_secs(30),
            || match curl(&[&on_slave]) {
                Ok((404, _)) => Some(()),
                _ => None,
            },
        )?;
        let again = drain(&master, "billing", "ledger", 5)?;
        assert_eq!(again.len(), 5, "from the earliest message again: {again:?}");
        Ok(())
    })
    .unwrap();
}
