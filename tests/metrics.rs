//! `/metrics` and `$SYS/#` through the binary, with real clients: after traffic
//! through every door (mosquitto_pub/sub, curl, a WebSocket client, our native
//! client) the counters, histograms and gauges of docs/metrics.md moved by what
//! was sent; MQTT clients read `$SYS/…` as Mosquitto serves it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Starts a standalone node on free ports with `env`; returns it and its
/// listeners (`door -> addr`), read from its "listening" lines.
fn standalone(data: &str, env: &[(&str, &str)]) -> (Reaped, HashMap<String, String>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    c.args(["standalone", "--data-dir", data])
        .args(["--namesrv", "0", "--native", "0", "--mqtt", "0"])
        .args(["--http", "0", "--ws", "0"])
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = Reaped(c.spawn().unwrap());
    let mut doors = HashMap::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains(" ready") {
            break;
        }
        if let Some((door, addr)) = line
            .strip_prefix("rocketgate: ")
            .and_then(|l| l.split_once(" listening on "))
        {
            doors.insert(door.to_string(), addr.to_string());
        }
    }
    (child, doors)
}

/// Kills the child when dropped (also when a test fails): an orphaned node or
/// mosquitto_sub would hold the test's output pipe open.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

fn sigterm(child: &mut Child) {
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}

fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap_or(0), body.to_owned())
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of the series `series` (name and labels exactly as rendered).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn scrape(http: &str) -> String {
    let (code, body) = curl(&[&format!("http://{http}/metrics")]);
    assert_eq!(code, 200);
    body
}

#[test]
fn every_door_moves_its_metrics() {
    use rocketgate_native::client::{ClientSettings, Message, Producer, PullConsumer};
    use tokio_tungstenite::tungstenite::{self, Message as Frame};

    let d = tempfile::tempdir().unwrap();
    let (mut node, doors) = standalone(d.path().to_str().unwrap(), &[]);
    let http = doors["http"].clone();
    let mqtt_port = doors["mqtt"].rsplit(':').next().unwrap().to_owned();

    // MQTT: a subscriber stays connected, 3 publishes of 1+2+3 payload bytes.
    let mut sub = Reaped(
        Command::new("mosquitto_sub")
            .args([
                "-p",
                &mqtt_port,
                "-t",
                "metered/#",
                "-q",
                "1",
                "-i",
                "metrics-sub",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut got = BufReader::new(sub.stdout.take().unwrap()).lines();
    let mut got = std::iter::from_fn(move || got.next().map(|l| l.unwrap()));
    wait_for("the MQTT session", || {
        value(&scrape(&http), "rocketgate_mqtt_sessions{state=\"online\"}") == Some(1.0)
    });
    let mut publisher = Command::new("mosquitto_pub")
        .args(["-p", &mqtt_port, "-t", "metered/m", "-q", "1", "-l"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = publisher.stdin.take().unwrap();
        stdin.write_all(b"a\nbb\nccc\n").unwrap();
    }
    assert!(publisher.wait().unwrap().success());
    for want in ["a", "bb", "ccc"] {
        assert_eq!(got.next().unwrap(), want);
    }

    // HTTP: one publish, one receive (left un-acked: POP in flight).
    let (code, _) = curl(&[
        "--data-binary",
        "from http",
        &format!("http://{http}/v1/topics/metered/messages"),
    ]);
    assert_eq!(code, 201);
    assert_eq!(got.next().unwrap(), "from http");
    let (code, body) = curl(&[&format!(
        "http://{http}/v1/groups/popper/topics/metered/messages?max=1&wait_ms=2000"
    )]);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("receipt_handle"), "{body}");

    // WebSocket: a publish, and a subscription that receives it.
    let (mut ws, _) = tungstenite::connect(format!("ws://{}/v1/ws", doors["ws"])).unwrap();
    ws.send(Frame::text(
        r#"{"op":"subscribe","req":"s","id":"w1","topic":"metered","group":"wsg","start":"earliest","credit":100}"#,
    ))
    .unwrap();
    ws.send(Frame::text(
        r#"{"op":"publish","req":"p","topic":"metered","body":"from ws"}"#,
    ))
    .unwrap();
    let mut ws_messages = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ws_messages == 0 {
        assert!(
            Instant::now() < deadline,
            "no message frame on the WebSocket"
        );
        if let Frame::Text(t) = ws.read().unwrap() {
            assert!(!t.contains("\"error\""), "{t}");
            if t.contains("\"type\":\"message\"") {
                ws_messages += 1;
            }
        }
    }
    assert_eq!(got.next().unwrap(), "from ws");

    // Native: a single send, a batch of 3, and a pull of everything.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let pulled = rt.block_on(async {
        let settings = || ClientSettings::new([doors["namesrv"].clone()]);
        let p = Producer::start(settings(), "metrics-p").await.unwrap();
        p.send(Message::new("metered", "native1")).await.unwrap();
        let batch = ["b1", "b22", "b333"]
            .iter()
            .map(|b| Message::new("metered", *b))
            .collect();
        let sent = p.send_batch(batch).await.unwrap();
        assert_eq!(sent.len(), 3);
        let c = PullConsumer::start(settings(), "native-readers")
            .await
            .unwrap();
        let queues = c.queues("metered").await.unwrap();
        c.assign(queues, "*").await.unwrap();
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while n < 10 && Instant::now() < deadline {
            n += c.poll(Duration::from_secs(1)).await.unwrap().len();
        }
        n
    });
    // 3 MQTT + 1 HTTP + 1 WebSocket + 1 + 3 native.
    assert_eq!(pulled, 9);

    let mut text = String::new();
    wait_for("every door's counters", || {
        text = scrape(&http);
        let has = |s: &str, v: f64| value(&text, s) == Some(v);
        has("rocketgate_messages_in_total{protocol=\"mqtt\",topic=\"metered\"}", 3.0)
            && has("rocketgate_bytes_in_total{protocol=\"mqtt\",topic=\"metered\"}", 6.0)
            && has("rocketgate_messages_in_total{protocol=\"http\",topic=\"metered\"}", 1.0)
            && has("rocketgate_messages_in_total{protocol=\"ws\",topic=\"metered\"}", 1.0)
            && has("rocketgate_bytes_in_total{protocol=\"ws\",topic=\"metered\"}", 7.0)
            // The batch counts its 3 messages (it counted none before).
            && has("rocketgate_messages_in_total{protocol=\"native\",topic=\"metered\"}", 4.0)
            && has("rocketgate_bytes_in_total{protocol=\"native\",topic=\"metered\"}", 16.0)
            // The subscriber got all 9 (the 3 native ones after the scrape began, maybe).
            && has("rocketgate_messages_out_total{protocol=\"mqtt\"}", 9.0)
            && has("rocketgate_messages_out_total{protocol=\"http\",topic=\"metered\"}", 1.0)
            && value(&text, "rocketgate_messages_out_total{protocol=\"ws\",topic=\"metered\"}")
                >= Some(1.0)
            && has("rocketgate_messages_out_total{protocol=\"native\",topic=\"metered\"}", 9.0)
    });
    let at_least = |s: &str, v: f64| {
        let got = value(&text, s);
        assert!(got >= Some(v), "{s} = {got:?}, want >= {v}\n{text}");
    };
    // Bytes out: MQTT payloads; stored records elsewhere (larger than bodies).
    at_least(
        "rocketgate_bytes_out_total{protocol=\"mqtt\"}",
        6.0 + 9.0 + 7.0 + 16.0,
    );
    at_least(
        "rocketgate_bytes_out_total{protocol=\"native\",topic=\"metered\"}",
        38.0,
    );
    for door in ["mqtt", "http", "ws", "native"] {
        at_least(
            &format!("rocketgate_publish_duration_seconds_count{{protocol=\"{door}\"}}"),
            1.0,
        );
        at_least(
            &format!(
                "rocketgate_publish_duration_seconds_bucket{{protocol=\"{door}\",le=\"+Inf\"}}"
            ),
            1.0,
        );
        at_least(
            &format!("rocketgate_delivery_latency_seconds_count{{protocol=\"{door}\"}}"),
            1.0,
        );
    }
    // One store append per publish call (a batch is one), and flush rounds.
    let publishes: f64 = ["mqtt", "http", "ws", "native"]
        .iter()
        .filter_map(|d| {
            value(
                &text,
                &format!("rocketgate_publish_duration_seconds_count{{protocol=\"{d}\"}}"),
            )
        })
        .sum();
    at_least("rocketgate_store_append_duration_seconds_count", publishes);
    at_least("rocketgate_store_flush_duration_seconds_count", 1.0);
    at_least(
        "rocketgate_receive_duration_seconds_count{protocol=\"http\"}",
        1.0,
    );
    // Gauges sampled at scrape time.
    assert_eq!(
        value(&text, "rocketgate_pop_inflight{group=\"popper\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            "rocketgate_consumer_lag{group=\"popper\",topic=\"metered\"}"
        ),
        Some(9.0),
        "{text}"
    );
    at_least("rocketgate_mqtt_sessions{state=\"online\"}", 1.0);
    at_least("rocketgate_disk_free_bytes", 1.0);
    at_least("rocketgate_disk_total_bytes", 1.0);
    at_least("rocketgate_store_size_bytes", 9.0 * 100.0);
    // (The native client's runtime is gone: its connection closed.)
    for door in ["mqtt", "ws", "http"] {
        at_least(
            &format!("rocketgate_connections{{protocol=\"{door}\"}}"),
            1.0,
        );
    }
    // A histogram's buckets are cumulative and end at its count.
    let count = value(&text, "rocketgate_store_append_duration_seconds_count").unwrap();
    let inf = value(
        &text,
        "rocketgate_store_append_duration_seconds_bucket{le=\"+Inf\"}",
    );
    assert_eq!(inf, Some(count), "{text}");

    // The MQTT session ends with its connection: the gauge goes back to 0.
    let _ = sub.kill();
    let _ = sub.wait();
    wait_for("the MQTT session to end", || {
        value(&scrape(&http), "rocketgate_mqtt_sessions{state=\"online\"}") == Some(0.0)
    });
    drop(ws);
    sigterm(&mut node);
}

/// Lines `topic payload` from `mosquitto_sub -v`, on a channel.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

fn mosquitto_sub(port: &str, args: &[&str]) -> Reaped {
    Reaped(
        Command::new("mosquitto_sub")
            .args(["-p", port, "-v"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Waits for `topic value` on `rx`, returning the lines seen until then.
fn wait_line(rx: &mpsc::Receiver<String>, want: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l == want => return seen,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no {want:?}; saw {seen:?}"),
        }
    }
}

#[test]
fn sys_topics_follow_the_clients_and_stay_out_of_wildcards() {
    let d = tempfile::tempdir().unwrap();
    let (mut node, doors) = standalone(
        d.path().to_str().unwrap(),
        &[("ROCKETGATE_MQTT__SYS_INTERVAL", "500ms")],
    );
    let port = doors["mqtt"].rsplit(':').next().unwrap().to_owned();

    // A `#` subscriber (MQTT-4.7.2-1: `$` topics are not matched by it).
    let mut all = mosquitto_sub(&port, &["-t", "#"]);
    let all_rx = lines_of(&mut all);
    // Retained-like: a new subscriber gets every value at once.
    let mut sys = mosquitto_sub(&port, &["-t", "$SYS/broker/#"]);
    let sys_rx = lines_of(&mut sys);
    let first = wait_line(&sys_rx, "$SYS/broker/version rocketgate version 0.1.0");
    let _ = first;
    // The two subscribers are connected.
    wait_line(&sys_rx, "$SYS/broker/clients/connected 2");
    // A third client connects: the count follows within an interval or two...
    let mut third = mosquitto_sub(&port, &["-t", "other"]);
    wait_line(&sys_rx, "$SYS/broker/clients/connected 3");
    // ... and goes back when it leaves.
    let _ = third.kill();
    let _ = third.wait();
    wait_line(&sys_rx, "$SYS/broker/clients/connected 2");
    // Messages received count PUBLISHes.
    let out = Command::new("mosquitto_pub")
        .args(["-p", &port, "-t", "plain/x", "-q", "1", "-m", "hi"])
        .output()
        .unwrap();
    assert!(out.status.success());
    wait_line(&sys_rx, "$SYS/broker/messages/received 1");
    let seen = wait_line(&sys_rx, "$SYS/broker/publish/messages/received 1");
    let _ = seen;
    // One-shot readers (-C 1) get a value at once, uptime too.
    let up = Command::new("mosquitto_sub")
        .args([
            "-p",
            &port,
            "-t",
            "$SYS/broker/uptime",
            "-C",
            "1",
            "-W",
            "5",
        ])
        .output()
        .unwrap();
    let up = String::from_utf8_lossy(&up.stdout);
    assert!(up.trim().ends_with(" seconds"), "{up:?}");

    // Publishing into $SYS is refused (3.1.1: acknowledged and dropped).
    let _ = Command::new("mosquitto_pub")
        .args([
            "-p",
            &port,
            "-t",
            "$SYS/broker/uptime",
            "-q",
            "1",
            "-m",
            "forged",
        ])
        .output()
        .unwrap();
    let _ = all.kill();
    let _ = all.wait();
    let all_lines: Vec<String> = all_rx.try_iter().collect();
    assert!(
        all_lines.contains(&"plain/x hi".to_owned()),
        "{all_lines:?}"
    );
    assert!(
        all_lines.iter().all(|l| !l.starts_with('$')),
        "a # subscriber got $SYS: {all_lines:?}"
    );
    let _ = sys.kill();
    let _ = sys.wait();
    let rest: Vec<String> = sys_rx.try_iter().collect();
    assert!(!rest.iter().any(|l| l.contains("forged")), "{rest:?}");
    sigterm(&mut node);
}

#[test]
fn sys_interval_zero_turns_sys_off() {
    let d = tempfile::tempdir().unwrap();
    let (mut node, doors) = standalone(
        d.path().to_str().unwrap(),
        &[("ROCKETGATE_MQTT__SYS_INTERVAL", "0s")],
    );
    let port = doors["mqtt"].rsplit(':').next().unwrap().to_owned();
    let out = Command::new("mosquitto_sub")
        .args(["-p", &port, "-t", "$SYS/#", "-C", "1", "-W", "2"])
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    sigterm(&mut node);
}

/// With auth on, `$SYS` is read only by users whose rules allow subscribing to it.
#[test]
fn sys_is_read_only_by_users_the_acl_allows() {
    use rocketgate_auth::{Action, Rule, UserEntry, UserFile, store};

    let d = tempfile::tempdir().unwrap();
    let mut users = UserFile::default();
    users.upsert(UserEntry {
        name: "ops".into(),
        password: store::hash_password(b"ops-pw"),
        rules: vec![Rule::allow(&[Action::Subscribe], &["$SYS/#"])],
        ..UserEntry::default()
    });
    users.upsert(UserEntry {
        name: "device".into(),
        password: store::hash_password(b"device-pw"),
        rules: vec![Rule::allow(&[Action::Publish, Action::Subscribe], &["a/#"])],
        ..UserEntry::default()
    });
    users.save(&d.path().join("users.toml")).unwrap();
    let (mut node, doors) = standalone(
        d.path().to_str().unwrap(),
        &[
            ("ROCKETGATE_AUTH__ENABLED", "true"),
            ("ROCKETGATE_MQTT__SYS_INTERVAL", "500ms"),
        ],
    );
    let port = doors["mqtt"].rsplit(':').next().unwrap().to_owned();
    let read = |user: &str, pw: &str| {
        let out = Command::new("mosquitto_sub")
            .args(["-p", &port, "-u", user, "-P", pw])
            .args(["-t", "$SYS/broker/version", "-C", "1", "-W", "3"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(read("ops", "ops-pw").trim(), "rocketgate version 0.1.0");
    assert_eq!(
        read("device", "device-pw"),
        "",
        "a user without the rule read $SYS"
    );
    sigterm(&mut node);
}
