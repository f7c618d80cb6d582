//! The web dashboard (`/dashboard`, docs/dashboard.md) in a real browser: headless
//! Chromium driven by playwright-core (`interop-tests/js/dashboard.mjs`) against the
//! built binary with traffic from real clients — HTTP publishes and a consumer group
//! with lag (curl), a binary message, a dead letter, an MQTT client
//! (`mosquitto_sub` with a persistent session, `mosquitto_pub`).
//!
//! The script opens each page, compares the numbers shown with the admin API (which
//! it fetches itself), searches messages by key, id and time, re-sends a dead letter
//! and kicks an MQTT session by clicking (the kick when the node has
//! `DELETE /v1/mqtt/sessions/{id}`), and saves a screenshot of each page,
//! `dashboard-*.png`, into a temporary directory, or into `DASHBOARD_SCREENSHOTS=DIR`
//! (`$PWD/docs/images` refreshes the committed ones the README shows).
//! A second test runs a node with auth on: the page asks for credentials, a wrong
//! password is asked again, and a read-only user sees the pages with the resend button
//! disabled while the server refuses the resend anyway.
//!
//! playwright-core is installed by `scripts/install-test-deps` (`npm ci` in
//! interop-tests/js); Chromium is the system one (`/usr/bin/chromium`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use interop_tests::Node;
use serde_json::{Value, json};

fn js_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("js");
    assert!(
        dir.join("node_modules/playwright-core/package.json")
            .is_file(),
        "playwright-core is not installed in {}: run scripts/install-test-deps (it runs `npm ci` there)",
        dir.display()
    );
    dir
}

/// `curl` with optional extra arguments; returns (status, body).
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("running curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_owned())
}

fn json_of(args: &[&str], want: u16) -> Value {
    let (status, body) = curl(args);
    assert_eq!(status, want, "curl {args:?}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("curl {args:?}: not JSON ({e}): {body}"))
}

/// A child process killed when dropped (even when the test panics).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the test made, for the script's arguments.
struct Traffic {
    key: String,
    binary_id: String,
    _mqtt: Killed,
}

const MQTT_CLIENT: &str = "dash-sensor";
const HA_SECRET: &str = "dashboard-group-secret";

/// HTTP publishes with keys and a property, a group (`billing`) that acked a few of
/// them and lags on the rest, a binary message, a dead letter of group `audit`, and
/// an MQTT client with a persistent session. `auth`: `-u user:password` for curl.
fn make_traffic(node: &Node, auth: &[&str], mqtt_auth: &[&str]) -> Traffic {
    let h = format!("http://{}", node.addr("http"));
    for n in 0..12 {
        let url = format!("{h}/v1/topics/orders/messages?tag=created&keys=order-{n}");
        let body = format!("{{\"order\":{n},\"amount\":{}}}", 10 + n);
        let mut a = auth.to_vec();
        a.extend(["-H", "x-rg-prop-region: eu", "--data-binary", &body, &url]);
        json_of(&a, 201);
    }
    // billing receives 5 and acks them: lag on the other 7.
    let mut a = auth.to_vec();
    let url = format!("{h}/v1/groups/billing/topics/orders/messages?max=5&wait_ms=3000");
    a.push(&url);
    let got = json_of(&a, 200);
    let msgs = got["messages"].as_array().expect("messages").clone();
    assert!(!msgs.is_empty(), "billing received nothing: {got}");
    let handles: Vec<Value> = msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
    let mut a = auth.to_vec();
    let body = json!({ "receipt_handles": handles }).to_string();
    let url = format!("{h}/v1/groups/billing/acks");
    a.extend(["-H", "content-type: application/json", "-d", &body, &url]);
    json_of(&a, 200);
    // A message the group consumed: the first of its queue, so the group's offset is past it.
    let consumed = msgs
        .iter()
        .find(|m| m["queue_offset"] == json!(0))
        .unwrap_or(&msgs[0]);
    let key = consumed["keys"][0].as_str().expect("a key").to_owned();

    // A binary body (not UTF-8: shown as hex).
    let tmp = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(tmp.path(), b"\x00\x01rocket\xffgate\xfe\x00\x80\xc3\x28end").unwrap();
    let mut a = auth.to_vec();
    let file = format!("@{}", tmp.path().display());
    let url = format!("{h}/v1/topics/devices/messages?tag=bin&keys=blob-1");
    a.extend(["--data-binary", &file, &url]);
    let binary_id = json_of(&a, 201)["msg_id"].as_str().unwrap().to_owned();

    // A dead letter: group audit retries nothing, one nack sends it to %DLQ%audit.
    let mut a = auth.to_vec();
    let url = format!("{h}/v1/groups/audit");
    a.extend([
        "-X",
        "PATCH",
        "-H",
        "content-type: application/json",
        "-d",
        r#"{"max_reconsume_times":0}"#,
        &url,
    ]);
    json_of(&a, 200);
    let mut a = auth.to_vec();
    let url = format!("{h}/v1/topics/payments/messages?tag=card&keys=pay-1");
    a.extend(["--data-binary", "declined card 4242", &url]);
    json_of(&a, 201);
    let mut a = auth.to_vec();
    let url = format!("{h}/v1/groups/audit/topics/payments/messages?max=1&wait_ms=3000");
    a.push(&url);
    let got = json_of(&a, 200);
    let handle = got["messages"][0]["receipt_handle"].clone();
    assert!(handle.is_string(), "audit received nothing: {got}");
    let mut a = auth.to_vec();
    let body = json!({ "receipt_handle": handle }).to_string();
    let url = format!("{h}/v1/groups/audit/nacks");
    a.extend(["-H", "content-type: application/json", "-d", &body, &url]);
    json_of(&a, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The group's next receive moves the spent message to its DLQ.
        let mut a = auth.to_vec();
        let url = format!("{h}/v1/groups/audit/topics/payments/messages?max=1");
        a.push(&url);
        json_of(&a, 200);
        let mut a = auth.to_vec();
        let url = format!("{h}/v1/groups/audit/dlq");
        a.push(&url);
        if json_of(&a, 200)["messages"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
        {
            break;
        }
        assert!(Instant::now() < deadline, "no dead letter for audit");
        std::thread::sleep(Duration::from_millis(100));
    }

    // MQTT: a subscriber with a persistent session, and a few publishes.
    let mqtt = node.addr("mqtt");
    let (host, port) = (mqtt.ip().to_string(), mqtt.port().to_string());
    let sub = Command::new("mosquitto_sub")
        .args(["-h", &host, "-p", &port, "-V", "mqttv5", "-i", MQTT_CLIENT])
        .args(["-c", "-x", "3600", "-q", "1", "-t", "sensors/#"])
        .args(mqtt_auth)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub (scripts/install-test-deps installs it)");
    let sub = Killed(sub);
    std::thread::sleep(Duration::from_millis(500));
    for n in 0..3 {
        let status = Command::new("mosquitto_pub")
            .args(["-h", &host, "-p", &port, "-V", "mqttv5", "-q", "1"])
            .args(["-t", "sensors/room1/temp", "-m", &format!("2{n}.5")])
            .args(mqtt_auth)
            .status()
            .expect("mosquitto_pub");
        assert!(status.success(), "mosquitto_pub failed");
    }
    Traffic {
        key,
        binary_id,
        _mqtt: sub,
    }
}

/// Where the screenshots go: `DASHBOARD_SCREENSHOTS` (to refresh the committed ones:
/// `DASHBOARD_SCREENSHOTS=$PWD/docs/images`), else a temporary directory (kept alive
/// by the returned guard), so a test run does not rewrite files in the checkout.
fn screenshot_dir() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os("DASHBOARD_SCREENSHOTS") {
        Some(d) => {
            let d = PathBuf::from(d);
            std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            (d, None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("rg-dashboard-")
                .tempdir()
                .expect("a temporary screenshot directory");
            (t.path().to_path_buf(), Some(t))
        }
    }
}

/// Runs `node dashboard.mjs` with `args`; returns its JSON report (asserted ok).
fn run_script(args: &[String]) -> Value {
    let mut child = Command::new("node")
        .current_dir(js_dir())
        .arg("dashboard.mjs")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running node (scripts/install-test-deps installs it)");
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let child = Killed(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        let _ = tx.send((out, err));
    });
    // The script times itself out; this is the backstop if node itself hangs.
    let (out, err) = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("node dashboard.mjs did not finish in 90 s");
    drop(child);
    let report: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("no JSON report ({e}): stdout {out:?} stderr {err:?}"));
    assert_eq!(
        report["ok"],
        json!(true),
        "the dashboard check failed: {:#}\nstderr: {err}",
        report
    );
    report
}

/// The script's arguments for what [`make_traffic`] made.
fn script_args(h: &str, traffic: &Traffic) -> Vec<String> {
    [
        ("--http", h),
        ("--key-topic", "orders"),
        ("--key", &traffic.key),
        ("--binary-id", &traffic.binary_id),
        ("--lag-group", "billing"),
        ("--dlq-group", "audit"),
        ("--dlq-topic", "payments"),
        ("--mqtt-client", MQTT_CLIENT),
    ]
    .iter()
    .flat_map(|(k, v)| [k.to_string(), v.to_string()])
    .collect()
}

#[test]
fn every_page_shows_what_the_api_says_and_the_buttons_work() {
    let started = Instant::now();
    // A broker group: this master (async replication) and a slave following it, so
    // the overview has nodes, roles and replication lag to show.
    let node = Node::start_with_env(&[
        ("ROCKETGATE_HA__MODE", "async"),
        ("ROCKETGATE_HA__SECRET", HA_SECRET),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms"),
    ])
    .expect("starting the master");
    let ha = node.addr("ha").to_string();
    let namesrv = node.addr("namesrv").to_string();
    let _slave = Node::start_with_env(&[
        ("ROCKETGATE_BROKER__ID", "1"),
        ("ROCKETGATE_HA__MASTER", &ha),
        ("ROCKETGATE_HA__SECRET", HA_SECRET),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms"),
        ("ROCKETGATE_BROKER__NAMESRV_ADDRS", &namesrv),
    ])
    .expect("starting the slave");
    let h = format!("http://{}", node.addr("http"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = json_of(&[&format!("{h}/v1/cluster")], 200);
        let slaves = c["replication"]["slaves"].as_array().map_or(0, |s| s.len());
        let addrs = c["brokers"][0]["addrs"].as_object().map_or(0, |a| a.len());
        if slaves == 1 && addrs == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the slave did not join: {c}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The files: types, caching, 404 for anything else.
    let (status, _) = curl(&["-o", "/dev/null", &format!("{h}/dashboard")]);
    assert_eq!(status, 200);
    let head = Command::new("curl")
        .args([
            "-sS",
            "-D",
            "-",
            "-o",
            "/dev/null",
            &format!("{h}/dashboard/app.js"),
        ])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).to_lowercase();
    assert!(head.contains("content-type: text/javascript"), "{head}");
    assert!(head.contains("cache-control: no-cache"), "{head}");
    let etag = head
        .lines()
        .find_map(|l| l.strip_prefix("etag: "))
        .expect("an etag")
        .trim()
        .to_owned();
    let (status, _) = curl(&[
        "-H",
        &format!("if-none-match: {etag}"),
        &format!("{h}/dashboard/app.js"),
    ]);
    assert_eq!(status, 304, "a matching ETag revalidates");
    let (status, body) = curl(&[&format!("{h}/dashboard/nope.js")]);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("\"not_found\""), "{body}");

    let traffic = make_traffic(&node, &[], &[]);
    let (out, _keep) = screenshot_dir();
    let mut args = script_args(&h, &traffic);
    args.extend(["--out".into(), out.display().to_string()]);
    let report = run_script(&args);
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.len() > 30, "too few checks ran: {report:#}");
    for page in [
        "overview", "topics", "groups", "messages", "dlq", "mqtt", "config",
    ] {
        let png = out.join(format!("dashboard-{page}.png"));
        let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
            "{}",
            png.display()
        );
    }
    eprintln!(
        "dashboard: {} checks, skipped {}, in {:?}",
        checks.len(),
        report["skipped"],
        started.elapsed()
    );
}

#[test]
fn with_auth_the_page_asks_for_credentials_and_a_monitor_user_only_reads() {
    // Users made with the CLI before the node starts: an admin with an API key and a
    // read-only user (the built-in `monitor` role) with a password.
    let users = tempfile::tempdir().unwrap();
    let bin = interop_tests::binary().expect("the rocketgate binary");
    let add = |args: &[&str], password: &str| {
        let mut child = Command::new(&bin)
            .args(["user", "add"])
            .args(args)
            .args(["--password-stdin", "--data-dir"])
            .arg(users.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("rocketgate user add");
        use std::io::Write;
        writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "rocketgate user add {args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let printed = add(&["admin", "--role", "admin", "--api-key"], "admin-pw");
    let key = printed
        .split_whitespace()
        .find(|w| w.starts_with("rg_"))
        .unwrap_or_else(|| panic!("no API key in {printed:?}"))
        .to_owned();
    add(&["watcher", "--role", "monitor"], "watch-pw");
    let users_file = users.path().join("users.toml");
    let node = Node::start_with_env(&[
        ("ROCKETGATE_AUTH__ENABLED", "true"),
        ("ROCKETGATE_AUTH__USERS_FILE", users_file.to_str().unwrap()),
    ])
    .expect("starting rocketgate with auth");
    let h = format!("http://{}", node.addr("http"));
    // The page itself is open (it holds nothing); the API behind it is not.
    assert_eq!(curl(&["-o", "/dev/null", &format!("{h}/dashboard")]).0, 200);
    assert_eq!(curl(&[&format!("{h}/v1/broker")]).0, 401);

    let bearer = format!("Authorization: Bearer {key}");
    let traffic = make_traffic(&node, &["-H", &bearer], &["-u", "admin", "-P", "admin-pw"]);
    let mut args = script_args(&h, &traffic);
    args.extend(
        [
            ("--admin-key", key.as_str()),
            ("--readonly-user", "watcher"),
            ("--readonly-password", "watch-pw"),
            ("--only", "overview,dlq"),
        ]
        .iter()
        .flat_map(|(k, v)| [k.to_string(), v.to_string()]),
    );
    let report = run_script(&args);
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for want in [
        "auth: the page asked for credentials and the admin key was taken",
        "read-only: resend disabled",
        "read-only: the server refuses a resend (403)",
        "auth: wrong password asked again",
    ] {
        assert!(names.contains(&want), "{want} not checked: {report:#}");
    }
}
