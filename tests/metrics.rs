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
    standalone_with(&["--data-dir", data], env)
}

/// [`standalone`] with more arguments (`args` include `--data-dir`).
fn standalone_with(args: &[&str], env: &[(&str, &str)]) -> (Reaped, HashMap<String, String>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    c.env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .arg("standalone")
        .args(args)
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
            // Counted per core topic (by door only before).
            && has("rocketgate_messages_out_total{protocol=\"mqtt\",topic=\"metered\"}", 9.0)
            && has("rocketgate_messages_out_total{protocol=\"http\",topic=\"metered\"}", 1.0)
            && value(&text, "rocketgate_messages_out_total{protocol=\"ws\",topic=\"metered\"}")
                >= Some(1.0)
            && has("rocketgate_messages_out_total{protocol=\"native\",topic=\"metered\"}", 9.0)
    });
    let at_least = |s: &str, v: f64| {
        let got = value(&text, s);
        assert!(got >= Some(v), "{s} = {got:?}, want >= {v}\n{text}");
    };
    // Bytes out: MQTT payloads (exactly what was sent); stored records
    // elsewhere (larger than bodies).
    assert_eq!(
        value(
            &text,
            "rocketgate_bytes_out_total{protocol=\"mqtt\",topic=\"metered\"}"
        ),
        Some(6.0 + 9.0 + 7.0 + 16.0),
        "{text}"
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

/// The sum of `rocketgate_delivery_latency_seconds_count` of the MQTT door.
fn mqtt_deliveries(text: &str) -> f64 {
    value(
        text,
        "rocketgate_delivery_latency_seconds_count{protocol=\"mqtt\"}",
    )
    .unwrap_or(0.0)
}

/// MQTT deliveries are counted per core topic (plain, shared, resent), and
/// shared deliveries and resends at a session's resume are delivery-latency
/// samples like plain ones: mosquitto clients and a rumqttc client that leaves
/// its QoS 1 messages un-acked and comes back.
#[test]
fn mqtt_deliveries_are_counted_per_topic_and_every_path_samples_latency() {
    let d = tempfile::tempdir().unwrap();
    let (mut node, doors) = standalone(d.path().to_str().unwrap(), &[]);
    let http = doors["http"].clone();
    let port = doors["mqtt"].rsplit(':').next().unwrap().to_owned();

    let mut shared = mosquitto_sub(&port, &["-t", "$share/workers/jobs/#", "-q", "1"]);
    let shared_rx = lines_of(&mut shared);
    let mut plain = mosquitto_sub(&port, &["-t", "news/#", "-q", "1"]);
    let plain_rx = lines_of(&mut plain);
    wait_for("two MQTT sessions", || {
        value(&scrape(&http), "rocketgate_mqtt_sessions{state=\"online\"}") == Some(2.0)
    });
    let before = mqtt_deliveries(&scrape(&http));
    let publish = |topic: &str, lines: &str| {
        use std::io::Write;
        let mut p = Command::new("mosquitto_pub")
            .args(["-p", &port, "-t", topic, "-q", "1", "-l"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
        assert!(p.wait().unwrap().success());
    };
    // Probes until each subscription is in place (a SUBSCRIBE is not visible
    // from outside); whatever of them arrives is counted below like the rest.
    let mut seen: Vec<String> = Vec::new();
    for (topic, rx) in [("jobs/p", &shared_rx), ("news/p", &plain_rx)] {
        let deadline = Instant::now() + Duration::from_secs(20);
        'probing: loop {
            assert!(Instant::now() < deadline, "{topic}: never subscribed");
            publish(topic, "probe\n");
            while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
                seen.push(l);
                if seen.last().is_some_and(|l| l.starts_with(topic)) {
                    break 'probing;
                }
            }
        }
    }
    publish("jobs/a", "j1\nj22\nj333\n");
    publish("news/x", "n1\nn22\n");
    seen.extend(wait_line(&shared_rx, "jobs/a j333"));
    seen.push("jobs/a j333".into());
    seen.extend(wait_line(&plain_rx, "news/x n22"));
    seen.push("news/x n22".into());
    // What the clients got, per core topic: (messages, payload bytes).
    let got = |core: &str| {
        let of: Vec<&String> = seen
            .iter()
            .filter(|l| l.starts_with(&format!("{core}/")))
            .collect();
        let bytes: usize = of
            .iter()
            .map(|l| l.split_once(' ').map_or(0, |(_, p)| p.len()))
            .sum();
        (of.len() as f64, bytes as f64)
    };
    let (jobs, news) = (got("jobs"), got("news"));
    assert!(jobs.0 >= 4.0 && news.0 >= 3.0, "{seen:?}");
    let mut text = String::new();
    wait_for("per-topic MQTT out counters", || {
        text = scrape(&http);
        let has = |s: &str, v: f64| value(&text, s) == Some(v);
        has(
            "rocketgate_messages_out_total{protocol=\"mqtt\",topic=\"jobs\"}",
            jobs.0,
        ) && has(
            "rocketgate_bytes_out_total{protocol=\"mqtt\",topic=\"jobs\"}",
            jobs.1,
        ) && has(
            "rocketgate_messages_out_total{protocol=\"mqtt\",topic=\"news\"}",
            news.0,
        ) && has(
            "rocketgate_bytes_out_total{protocol=\"mqtt\",topic=\"news\"}",
            news.1,
        )
    });
    // Every delivery a sample, the shared ones too (only the plain ones before).
    assert_eq!(mqtt_deliveries(&text), before + jobs.0 + news.0, "{text}");
    let _ = shared.kill();
    let _ = plain.kill();

    // A persistent session takes two QoS 1 messages and does not ack them; it
    // comes back and both are resent (DUP): two more samples, two more out.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let port: u16 = port.parse().unwrap();
    let connect = || {
        let mut o = rumqttc::MqttOptions::new("resumer", "127.0.0.1", port);
        o.set_clean_session(false)
            .set_manual_acks(true)
            .set_keep_alive(Duration::from_secs(30));
        rumqttc::AsyncClient::new(o, 10)
    };
    // The PUBLISHes an event loop gets until it has `n`.
    async fn publishes(ev: &mut rumqttc::EventLoop, n: usize) -> Vec<rumqttc::Publish> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while got.len() < n {
            let e = tokio::time::timeout_at(deadline, ev.poll())
                .await
                .expect("the PUBLISHes in time")
                .expect("connected");
            if let rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) = e {
                got.push(p);
            }
        }
        got
    }
    let first = rt.block_on(async {
        let (client, mut ev) = connect();
        client
            .subscribe("resume/#", rumqttc::QoS::AtLeastOnce)
            .await
            .unwrap();
        loop {
            if let Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))) = ev.poll().await {
                break;
            }
        }
        publish("resume/x", "r1\nr2\n");
        publishes(&mut ev, 2).await
        // (Dropped un-acked: the connection closes.)
    });
    assert!(first.iter().all(|p| !p.dup), "{first:?}");
    let mut text = scrape(&http);
    let at_leave = mqtt_deliveries(&text);
    assert_eq!(at_leave, before + jobs.0 + news.0 + 2.0, "{text}");
    let again = rt.block_on(async {
        let (_client, mut ev) = connect();
        publishes(&mut ev, 2).await
    });
    assert!(again.iter().all(|p| p.dup), "resent: {again:?}");
    let payloads: Vec<&[u8]> = again.iter().map(|p| &p.payload[..]).collect();
    assert_eq!(payloads, [&b"r1"[..], b"r2"]);
    wait_for("the resends' samples and counts", || {
        text = scrape(&http);
        mqtt_deliveries(&text) == at_leave + 2.0
            && value(
                &text,
                "rocketgate_messages_out_total{protocol=\"mqtt\",topic=\"resume\"}",
            ) == Some(4.0)
    });
    sigterm(&mut node);
}

/// The replication stream's byte counters: a master ships its whole log to a
/// new slave, which receives and applies every byte of it; each side's count
/// matches the log's end once the slave caught up.
#[test]
fn replication_bytes_are_counted_on_master_and_slave() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Outside the ephemeral range: no other test is handed it before the master binds it.
    let ha = format!("127.0.0.1:{}", rocketgate_testkit::net::free_port());
    let secret = ("ROCKETGATE_HA__SECRET", "metrics-test");
    let started = Instant::now();
    let (mut master, m) = standalone_with(
        &["--data-dir", dirs.0.path().to_str().unwrap(), "--ha", &ha],
        &[secret],
    );
    let (mut slave, s) = standalone_with(
        &[
            "--data-dir",
            dirs.1.path().to_str().unwrap(),
            "--broker-id",
            "7",
            "--ha-master",
            &ha,
        ],
        &[secret, ("ROCKETGATE_BROKER__NAMESRV_ADDRS", &m["namesrv"])],
    );
    for i in 0..20 {
        let (code, body) = curl(&[
            "--data-binary",
            &format!("replicated message {i}"),
            &format!("http://{}/v1/topics/shipped/messages", m["http"]),
        ]);
        assert_eq!(code, 201, "{body}");
    }
    let (mut mt, mut st) = (String::new(), String::new());
    wait_for("the slave to catch up, counted on both sides", || {
        mt = scrape(&m["http"]);
        st = scrape(&s["http"]);
        let end = value(&mt, "rocketgate_store_written_offset");
        end.is_some_and(|e| e > 20.0 * 20.0)
            && value(
                &mt,
                "rocketgate_replication_shipped_bytes_total{slave=\"7\"}",
            ) == end
            && value(&st, "rocketgate_replication_received_bytes_total") == end
            && value(&st, "rocketgate_replication_applied_bytes_total") == end
    });
    for (text, name) in [
        (&mt, "rocketgate_replication_shipped_bytes_total"),
        (&st, "rocketgate_replication_applied_bytes_total"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} counter")), "{text}");
    }
    // Every replicated message is one lag sample on the slave (the 20 sent, and
    // whatever the master stored besides), none older than the master (+1 ms: the
    // store timestamp is whole ms); the master appends nothing replicated and has
    // no such histogram.
    let waited = started.elapsed().as_secs_f64() + 0.001;
    let lag = "rocketgate_replication_message_lag_seconds";
    assert!(st.contains(&format!("# TYPE {lag} histogram")), "{st}");
    let count = value(&st, &format!("{lag}_count")).unwrap_or(0.0);
    let sum = value(&st, &format!("{lag}_sum")).unwrap_or(-1.0);
    assert!(count >= 20.0, "{count} lag samples for 20 messages:\n{st}");
    assert!(
        sum >= 0.0 && sum / count <= waited,
        "mean lag {} s, yet the master started {waited:.3} s ago:\n{st}",
        sum / count
    );
    assert_eq!(
        value(&st, &format!("{lag}_bucket{{le=\"+Inf\"}}")),
        Some(count),
        "{st}"
    );
    assert!(!mt.contains(lag), "a master shows no replicated lag:\n{mt}");
    let (code, cluster) = curl(&[&format!("http://{}/v1/cluster", s["http"])]);
    assert_eq!(code, 200, "{cluster}");
    assert!(
        cluster.contains("\"message_lag_p99_ms\":"),
        "the slave's p99 beside its lag bytes: {cluster}"
    );
    sigterm(&mut slave);
    sigterm(&mut master);
}
