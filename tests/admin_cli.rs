//! `rocketgate admin …` against one running standalone node (auth off): every
//! command as a table and as `--json`, checked against what the node holds, and
//! the exit codes scripts rely on (docs/operations.md): 1 bad arguments, 2 not
//! found, 3 unreachable. Forbidden (4) is in `admin_cli_auth.rs` (a node with
//! authentication on). Also the operations endpoints the CLI does not print in
//! full (`/readyz`'s 200, the MQTT kick's DISCONNECT 0x98 seen by mosquitto_sub).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The node, killed when the test ends, also when it panics.
struct Node {
    child: Child,
    http: String,
    mqtt: String,
    ws: String,
    _dir: tempfile::TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    // Past the hard ratio a store refuses appends: how full this machine's disk
    // happens to be must not decide a test (tests/reliability.rs covers a full disk).
    c.env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1");
    c
}

fn start() -> Node {
    start_with(&[])
}

/// A node with extra command-line flags.
fn start_with(extra: &[&str]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocketgate.toml");
    std::fs::write(&file, "[broker]\nmax_reconsume_times = 7\n").unwrap();
    let mut child = bin()
        .args(["standalone", "--data-dir"])
        .arg(dir.path())
        .arg("--config")
        .arg(&file)
        .args([
            "--namesrv",
            "0",
            "--native",
            "0",
            "--mqtt",
            "0",
            "--http",
            "0",
            "--ws",
            "0",
        ])
        .args(extra)
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        // A secret `admin config` must not show.
        .env("ROCKETGATE_AUTH__JWT_SECRET", "hunter2-jwt")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut http, mut mqtt, mut ws) = (String::new(), String::new(), String::new());
    for line in lines {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("rocketgate: http listening on ") {
            http = a.to_owned();
        }
        if let Some(a) = line.strip_prefix("rocketgate: mqtt listening on ") {
            mqtt = a.to_owned();
        }
        if let Some(a) = line.strip_prefix("rocketgate: ws listening on ") {
            ws = a.to_owned();
        }
        if line.contains("standalone ready") {
            break;
        }
    }
    assert!(
        !http.is_empty() && !mqtt.is_empty(),
        "the node announced its doors"
    );
    Node {
        child,
        http,
        mqtt,
        ws,
        _dir: dir,
    }
}

impl Node {
    /// `rocketgate admin --server … ARGS`
    fn admin(&self, args: &[&str]) -> Output {
        bin()
            .arg("admin")
            .args(["--server", &format!("http://{}", self.http)])
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs a command that must succeed; its table output.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.admin(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Runs a command with `--json` that must succeed; its JSON.
    fn json(&self, args: &[&str]) -> Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = self.ok(&a);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    }

    /// Runs a command that must fail with `code`; its stderr.
    fn fails(&self, code: i32, args: &[&str]) -> String {
        let out = self.admin(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        stderr
    }

    fn post(&self, path: &str, body: &Value) {
        let out = Command::new("curl")
            .args(["-sf", "-H", "content-type: application/json", "-d"])
            .arg(body.to_string())
            .arg(format!("http://{}{path}", self.http))
            .output()
            .unwrap();
        assert!(out.status.success(), "POST {path}: {:?}", out);
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let out = Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}"])
            .arg(format!("http://{}{path}", self.http))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (
            code.parse().unwrap(),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }
}

#[test]
fn every_admin_command_against_a_running_node() {
    let node = start();

    // ---- health ----
    assert_eq!(
        node.get("/healthz"),
        (200, serde_json::json!({"status": "ok"}))
    );
    // Ready once the first registration with the NameServer was taken.
    let started = Instant::now();
    let ready = loop {
        let (status, ready) = node.get("/readyz");
        if status == 200 {
            break ready;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{status} {ready}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let checks: Vec<&str> = ready["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for c in ["store", "disk", "namesrv", "doors", "shutdown"] {
        assert!(checks.contains(&c), "{ready}");
    }
    let t = node.ok(&["health"]);
    assert!(t.contains("namesrv") && t.contains("ok"), "{t}");
    assert_eq!(node.json(&["health"])["readyz"]["status"], "ready");

    // ---- broker, cluster, replica ----
    assert!(node.ok(&["broker", "status"]).contains("broker-a"));
    let b = node.json(&["broker", "status"]);
    assert_eq!(b["broker_name"], "broker-a");
    let c = node.json(&["cluster", "list"]);
    assert_eq!(c["brokers"][0]["broker_name"], "broker-a", "{c}");
    let t = node.ok(&["cluster", "list"]);
    assert!(t.contains("DefaultCluster") && t.contains("master"), "{t}");
    let r = node.json(&["replica", "status"]);
    assert!(r.is_null() || r["role"] == "master", "{r}");
    node.ok(&["replica", "status"]);

    // ---- topics ----
    let created = node.json(&["topic", "create", "Orders", "--queues", "2"]);
    assert_eq!(created["read_queues"], 2);
    node.fails(1, &["topic", "create", "Orders"]); // 409: it exists
    assert!(node.ok(&["topic", "create", "Scratch"]).contains("Scratch"));
    let list = node.json(&["topic", "list"]);
    let names: Vec<&str> = list["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"Orders") && names.contains(&"Scratch"),
        "{list}"
    );
    assert!(node.ok(&["topic", "list"]).contains("Orders"));
    let updated = node.json(&["topic", "update", "Scratch", "--perm", "r"]);
    assert_eq!(updated["perm"], "r");
    node.fails(1, &["topic", "update", "Scratch"]); // nothing to change
    assert!(
        node.ok(&["topic", "update", "Scratch", "--perm", "rw"])
            .contains("rw")
    );
    assert!(node.ok(&["topic", "delete", "Scratch"]).contains("deleted"));
    node.fails(2, &["topic", "delete", "Scratch"]);
    let route = node.json(&["topic", "route", "Orders"]);
    assert_eq!(route["brokers"][0]["write_queues"], 2);
    assert!(node.ok(&["topic", "route", "Orders"]).contains("broker-a"));

    // ---- send, status, message get/query ----
    let before = now_ms();
    let sent = node.json(&[
        "send", "--topic", "Orders", "--keys", "order-1", "--tag", "new", "hello",
    ]);
    let id = sent["msg_id"].as_str().unwrap().to_owned();
    assert!(
        node.ok(&["send", "--topic", "Orders", "--keys", "order-2", "world"])
            .contains("msg_id")
    );
    let st = node.json(&["topic", "status", "Orders"]);
    assert_eq!(st["messages"], 2, "{st}");
    assert_eq!(st["queues"].as_array().unwrap().len(), 2);
    assert!(st["last_store_ms"].as_i64().unwrap() >= before);
    assert!(
        node.ok(&["topic", "status", "Orders"])
            .contains("MAX OFFSET")
    );
    let m = node.json(&["message", "get", &id]);
    assert_eq!(m["body"], "hello");
    assert_eq!(m["tag"], "new");
    assert!(node.ok(&["message", "get", &id]).contains("hello"));
    let q = node.json(&["message", "query", "--topic", "Orders", "--key", "order-2"]);
    assert_eq!(q["messages"][0]["body"], "world", "{q}");
    assert_eq!(q["messages"][0]["body_size"], 5);
    assert!(
        node.ok(&["message", "query", "--topic", "Orders", "--key", "order-1"])
            .contains("hello")
    );
    let begin = before.to_string();
    let q = node.json(&["message", "query", "--topic", "Orders", "--begin", &begin]);
    assert_eq!(q["messages"].as_array().unwrap().len(), 2, "{q}");
    let later = (now_ms() + 60_000).to_string();
    let q = node.json(&["message", "query", "--topic", "Orders", "--begin", &later]);
    assert_eq!(q["messages"].as_array().unwrap().len(), 0, "{q}");
    let queue = sent["queue_id"].to_string();
    let q = node.json(&[
        "message", "query", "--topic", "Orders", "--queue", &queue, "--offset", "0",
    ]);
    assert!(
        q["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["body"] == "hello"),
        "{q}"
    );
    // Body previews are cut to `preview` bytes.
    let (_, p) = node.get("/v1/messages?topic=Orders&key=order-1&preview=2");
    assert_eq!(p["messages"][0]["body"], "he");
    assert_eq!(p["messages"][0]["body_truncated"], true);

    // ---- groups: consume, progress, connections, offsets ----
    assert!(
        node.json(&["group", "create", "billing", "--max-reconsume-times", "3"])["max_reconsume_times"]
            == 3
    );
    let got = node.json(&[
        "consume",
        "--group",
        "billing",
        "--topic",
        "Orders",
        "--max",
        "1",
        "--wait-ms",
        "2000",
    ]);
    assert_eq!(got["messages"].as_array().unwrap().len(), 1, "{got}");
    let g = node.json(&["group", "list"]);
    assert!(
        g["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "billing"),
        "{g}"
    );
    assert!(node.ok(&["group", "list"]).contains("billing"));
    let p = node.json(&["group", "progress", "billing"]);
    assert_eq!(p["group"], "billing");
    let http = p["consumers"].as_array().unwrap();
    assert!(
        http.iter().any(|c| c["door"] == "http"),
        "the HTTP consumer is listed: {p}"
    );
    assert!(
        node.ok(&["group", "progress", "billing"])
            .contains("total lag")
    );
    let cs = node.json(&["group", "connections", "billing"]);
    assert_eq!(cs["connections"][0]["door"], "http", "{cs}");
    assert!(
        node.ok(&["group", "connections", "billing"])
            .contains("http")
    );
    node.fails(2, &["group", "progress", "no-such-group"]);
    assert!(node.json(&["group", "update", "billing", "--fifo", "true"])["fifo"] == true);
    // An HTTP consumer of billing was seen just now: refused (409 group_in_use).
    let e = node.fails(1, &["group", "delete", "billing"]);
    assert!(e.contains("group_in_use") && e.contains("http"), "{e}");
    let reset = node.json(&[
        "offset",
        "reset",
        "--group",
        "billing",
        "--topic",
        "Orders",
        "--to-time",
        &begin,
    ]);
    assert_eq!(reset["offsets"].as_array().unwrap().len(), 2, "{reset}");
    assert!(
        node.ok(&[
            "offset", "reset", "--group", "billing", "--topic", "Orders", "--to", "latest"
        ])
        .contains("OFFSET")
    );
    let p = node.json(&["group", "progress", "billing"]);
    assert_eq!(p["lag"], 0, "reset to latest: {p}");

    // ---- MQTT sessions and connections, kick ----
    let (host, port) = node.mqtt.rsplit_once(':').unwrap();
    // Bounded by `timeout`: it ends even when the test panics before the kick.
    let sub = Command::new("timeout")
        .args([
            "20",
            "mosquitto_sub",
            "-V",
            "5",
            "-h",
            host,
            "-p",
            port,
            "-i",
            "dev-1",
            "-c",
            "-x",
            "600",
            "-q",
            "1",
            "-t",
            "Orders/#",
            "-d",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("mosquitto_sub (scripts/install-test-deps)");
    let started = Instant::now();
    let sessions = loop {
        let s = node.json(&["mqtt", "sessions"]);
        if s["sessions"][0]["subscriptions"][0]["filter"] == "Orders/#" {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no session: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let s = &sessions["sessions"][0];
    assert_eq!(s["client_id"], "dev-1");
    assert_eq!(s["connected"], true);
    assert_eq!(s["protocol_version"], 5);
    assert_eq!(s["expiry_secs"], 600);
    assert!(node.ok(&["mqtt", "sessions"]).contains("dev-1"));
    let all = node.json(&["connections"]);
    let doors: Vec<&str> = all["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["door"].as_str().unwrap())
        .collect();
    assert!(doors.contains(&"mqtt") && doors.contains(&"http"), "{all}");
    assert!(node.ok(&["connections"]).contains("dev-1"));
    // A WebSocket subscriber is listed while it holds its subscription.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut socket = rt.block_on(async {
        use futures_util::{SinkExt, StreamExt};
        let (mut s, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", node.ws))
            .await
            .unwrap();
        let sub = r#"{"op":"subscribe","req":"s","id":"tab1","topic":"Orders","group":"console"}"#;
        s.send(tokio_tungstenite::tungstenite::Message::text(sub))
            .await
            .unwrap();
        let reply = s.next().await.unwrap().unwrap().into_text().unwrap();
        assert!(reply.contains("subscribed"), "{reply}");
        s
    });
    let cs = node.json(&["group", "connections", "console"]);
    assert_eq!(cs["connections"][0]["door"], "websocket", "{cs}");
    assert_eq!(cs["connections"][0]["subscriptions"][0], "Orders");
    rt.block_on(socket.close(None)).unwrap();
    let started = Instant::now();
    while node.json(&["group", "connections", "console"])["connections"] != serde_json::json!([]) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the closed socket stays listed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let kicked = node.json(&["mqtt", "kick", "dev-1"]);
    assert_eq!(kicked["disconnected"], true);
    assert_eq!(kicked["discarded"], false);
    let out = sub.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        log.contains("Received DISCONNECT (152)"),
        "0x98 Administrative action: {log}"
    );
    let s = node.json(&["mqtt", "sessions"]);
    assert_eq!(
        s["sessions"][0]["connected"], false,
        "the session stays: {s}"
    );
    assert!(
        node.ok(&["mqtt", "kick", "dev-1", "--discard"])
            .contains("discarded")
    );
    assert_eq!(
        node.json(&["mqtt", "sessions"])["sessions"],
        serde_json::json!([])
    );
    node.fails(2, &["mqtt", "kick", "dev-1"]);

    // ---- dead letters (none yet: nothing failed) ----
    let d = node.json(&["dlq", "list", "billing"]);
    assert_eq!(d["messages"], serde_json::json!([]));
    node.ok(&["dlq", "list", "billing"]);
    node.fails(2, &["dlq", "resend", "billing", "--all"]);
    // A group that gives up at once: a nacked message is a dead letter.
    node.json(&["group", "create", "fragile", "--max-reconsume-times", "0"]);
    node.json(&["topic", "create", "Jobs", "--queues", "1"]);
    for body in ["job-1", "job-2"] {
        node.json(&["send", "--topic", "Jobs", body]);
    }
    let got = node.json(&[
        "consume",
        "--group",
        "fragile",
        "--topic",
        "Jobs",
        "--no-ack",
        "--wait-ms",
        "2000",
    ]);
    let handles: Vec<Value> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["receipt_handle"].clone())
        .collect();
    assert_eq!(handles.len(), 2, "{got}");
    node.post(
        "/v1/groups/fragile/nacks",
        &serde_json::json!({ "receipt_handles": handles }),
    );
    // The next receive moves them to the dead-letter queue instead of delivering them.
    let again = node.json(&[
        "consume",
        "--group",
        "fragile",
        "--topic",
        "Jobs",
        "--wait-ms",
        "500",
    ]);
    assert_eq!(again["messages"], serde_json::json!([]), "{again}");
    let started = Instant::now();
    loop {
        let d = node.json(&["dlq", "list", "fragile"]);
        if d["messages"].as_array().unwrap().len() == 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no dead letters: {d}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(node.ok(&["dlq", "list", "fragile"]).contains("job-1"));
    let one = node.json(&["dlq", "resend", "fragile", "--offset", "0"]);
    assert_eq!(one["resent"].as_array().unwrap().len(), 1, "{one}");
    let all = node.ok(&["dlq", "resend", "fragile", "--all"]);
    assert_eq!(all.matches("Jobs").count(), 2, "both resent: {all}");
    let st = node.json(&["topic", "status", "Jobs"]);
    assert_eq!(st["messages"], 5, "2 sent + 3 resent: {st}");

    // ---- group delete ----
    // `fragile` consumed over HTTP just now: in use, unless forced.
    let e = node.fails(1, &["group", "delete", "fragile"]);
    assert!(e.contains("group_in_use"), "{e}");
    let d = node.json(&["group", "delete", "fragile", "--force"]);
    assert_eq!(d["group"], "fragile", "{d}");
    assert!(d["consumers"].as_u64().unwrap() >= 1, "{d}");
    assert!(!d["topics"].to_string().contains("%DLQ%"), "DLQ kept: {d}");
    node.fails(2, &["group", "progress", "fragile"]);
    assert!(!node.ok(&["group", "list"]).contains("fragile"));
    assert_eq!(
        node.json(&["dlq", "list", "fragile"])["messages"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "dead letters stay unless --dlq"
    );
    // A consumer of that name now starts as a new group: at the earliest message
    // of Jobs (all 5), not after the 2 the old group had consumed.
    let mut bodies = Vec::new();
    let started = Instant::now();
    while bodies.len() < 5 && started.elapsed() < Duration::from_secs(20) {
        let got = node.json(&[
            "consume",
            "--group",
            "fragile",
            "--topic",
            "Jobs",
            "--max",
            "16",
            "--wait-ms",
            "1000",
        ]);
        for m in got["messages"].as_array().unwrap() {
            bodies.push(m["body"].as_str().unwrap_or_default().to_owned());
        }
    }
    assert_eq!(bodies.len(), 5, "{bodies:?}");
    let out = node.ok(&["group", "delete", "fragile", "--force", "--dlq"]);
    assert!(out.contains("%DLQ%fragile"), "{out}");
    node.fails(2, &["group", "delete", "fragile", "--force"]);

    // ---- config ----
    let cfg = node.json(&["config"]);
    let find = |k: &str| {
        cfg["settings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["key"] == k)
            .cloned()
            .unwrap_or_else(|| panic!("{k} in {cfg}"))
    };
    assert_eq!(find("listen.http")["source"], "flag --http");
    assert_eq!(
        find("store.segment_size")["source"],
        "env ROCKETGATE_STORE__SEGMENT_SIZE"
    );
    assert_eq!(find("store.flush")["source"], "default");
    let from_file = find("broker.max_reconsume_times");
    assert_eq!(from_file["value"], 7);
    assert!(
        from_file["source"].as_str().unwrap().starts_with("file ")
            && from_file["source"]
                .as_str()
                .unwrap()
                .ends_with("rocketgate.toml"),
        "{from_file}"
    );
    let jwt = find("auth.jwt_secret");
    assert_eq!(jwt["value"], "<redacted>");
    assert_eq!(jwt["source"], "env ROCKETGATE_AUTH__JWT_SECRET");
    assert_eq!(
        find("auth.internal_secret")["value"],
        "",
        "unset: shown empty"
    );
    assert!(
        !cfg.to_string().contains("hunter2"),
        "a secret leaked: {cfg}"
    );
    assert!(node.ok(&["config"]).contains("flag --data-dir"));

    // ---- users (auth off: no user store; admin_cli_auth.rs manages users) ----
    let e = node.fails(1, &["user", "list"]);
    assert!(e.contains("authentication is off"), "{e}");

    // ---- errors ----
    let e = node.fails(2, &["topic", "status", "NoSuchTopic"]);
    assert!(e.contains("NoSuchTopic") || e.contains("topic"), "{e}");
    node.fails(2, &["--json", "topic", "route", "NoSuchTopic"]);
    node.fails(2, &["message", "get", "0000000000000000000000000000FFFF"]);
    let e = node.fails(1, &["topic", "frobnicate"]);
    assert!(e.contains("frobnicate"), "{e}");
    node.fails(1, &["message", "query", "--topic", "Orders"]);
    node.fails(
        1,
        &[
            "message",
            "query",
            "--topic",
            "Orders",
            "--begin",
            "yesterday",
        ],
    );
    node.fails(
        1,
        &[
            "offset", "reset", "--group", "g", "--topic", "Orders", "--to", "middle",
        ],
    );
    // https: a CA file that cannot be read, and a CA for a plain http server, are
    // bad arguments (1); an https server that is down is unreachable (3).
    let admin = |args: &[&str]| bin().arg("admin").args(args).output().unwrap();
    let e = admin(&[
        "--server",
        "https://localhost:1",
        "--cacert",
        "/no/such/ca.pem",
        "topic",
        "list",
    ]);
    assert_eq!(e.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&e.stderr).contains("--cacert"));
    let e = admin(&[
        "--server",
        "http://127.0.0.1:1",
        "--cacert",
        "/no/such/ca.pem",
        "topic",
        "list",
    ]);
    assert_eq!(e.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&e.stderr).contains("plain http"));
    // Without --cacert the system's CA bundle is trusted; a machine without one is
    // told to give --cacert (1).
    let bundle = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt").is_file();
    let e = admin(&["--server", "https://127.0.0.1:1", "topic", "list"]);
    assert_eq!(e.status.code(), Some(if bundle { 3 } else { 1 }), "{e:?}");
    let e = bin()
        .args(["admin", "--server", "http://127.0.0.1:1", "topic", "list"])
        .output()
        .unwrap();
    assert_eq!(e.status.code(), Some(3), "server down");
    assert!(String::from_utf8_lossy(&e.stderr).contains("cannot reach"));
}

/// `--advertised-address`: the NameServer (and so `cluster list`, the routes native
/// clients get) holds the advertised address, not the one the node listens on.
#[test]
fn the_advertised_address_is_what_the_nameserver_hands_out() {
    let node = start_with(&["--advertised-address", "rg-1.example:31911"]);
    let started = Instant::now();
    let v = loop {
        let v = node.json(&["cluster", "list"]);
        if v["brokers"].as_array().is_some_and(|b| !b.is_empty()) {
            break v;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(v["brokers"][0]["addrs"]["0"], "rg-1.example:31911", "{v}");
    assert!(node.ok(&["cluster", "list"]).contains("rg-1.example:31911"));
    let (_, cfg) = node.get("/v1/config");
    let s = cfg["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "broker.advertised_address")
        .cloned()
        .unwrap();
    assert_eq!(s["source"], "flag --advertised-address", "{s}");
    // A bad one stops the node at start with the setting named.
    let out = bin()
        .args([
            "standalone",
            "--advertised-address",
            "not a host",
            "--data-dir",
        ])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("broker.advertised_address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
