//! MQTT.js (the `mqtt` npm package, 5.x, in Node) against the built binary, over TCP
//! (`mqtt://`) and over WebSocket (`ws://…/mqtt`), as MQTT 3.1.1 and 5: QoS 0/1/2,
//! wildcards with overlapping subscriptions, retained set/replace/clear, a will,
//! a persistent session receiving offline messages, v5 request/response with user
//! properties + response topic + correlation data, and a shared subscription.
//!
//! `interop-tests/js/mqttjs.mjs` runs the scenarios and prints what MQTT.js saw as
//! JSON; this file asserts on it. The script has its own timeout (a broken broker
//! fails the test, never hangs it), and the test kills it if even that does not
//! fire. MQTT.js is installed into `interop-tests/js/node_modules` by
//! `scripts/install-test-deps` (`npm ci`); without it these tests fail with that hint.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use interop_tests::Node;
use serde_json::{Value, json};

/// `interop-tests/js`, where the scripts and their `node_modules` live.
pub fn js_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("js");
    assert!(
        dir.join("node_modules/mqtt/package.json").is_file(),
        "MQTT.js is not installed in {}: run scripts/install-test-deps (it runs `npm ci` there)",
        dir.display()
    );
    dir
}

/// Runs `node mqttjs.mjs` against `url` and returns its `results`, failing the
/// test (with the report) unless the run succeeded.
fn run_mqttjs(url: &str, version: u8, prefix: &str, extra: &[&str]) -> Value {
    let (report, status, err) = run_script(url, version, prefix, "150", extra);
    assert_eq!(
        report["ok"],
        json!(true),
        "MQTT.js failed: {report:#}\nstderr: {err}"
    );
    assert!(status.success(), "node exited with {status}");
    assert_eq!(report["clientErrors"], json!({}), "{report:#}");
    report["results"].clone()
}

/// Runs the script with its own timeout of `timeout` seconds; returns its JSON
/// report, exit status and stderr.
fn run_script(
    url: &str,
    version: u8,
    prefix: &str,
    timeout: &str,
    extra: &[&str],
) -> (Value, std::process::ExitStatus, String) {
    let dir = js_dir();
    let mut child = Command::new("node")
        .current_dir(&dir)
        .arg("mqttjs.mjs")
        .args(["--url", url, "--version", &version.to_string()])
        .args(["--prefix", prefix, "--timeout", timeout])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running node (scripts/install-test-deps installs it)");
    let pid = child.id() as libc::pid_t;
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        let _ = tx.send((out, err));
    });
    // The script times itself out at 150 s; this is the backstop if node itself hangs.
    let (out, err) = match rx.recv_timeout(Duration::from_secs(240)) {
        Ok(outputs) => outputs,
        Err(_) => {
            // SAFETY: kill(2) on the pid of our own child, which has not been reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("node mqttjs.mjs did not finish in 240 s");
        }
    };
    let status = child.wait().expect("waiting for node");
    let report: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| {
        panic!("node printed no JSON report ({e}), exit {status}: stdout {out:?} stderr {err:?}")
    });
    (report, status, err)
}

/// `(topic, payload, qos, retain)` of each delivered message.
fn summary(messages: &Value) -> Vec<(String, String, u64, bool)> {
    messages
        .as_array()
        .expect("a message list")
        .iter()
        .map(|m| {
            (
                m["topic"].as_str().unwrap().to_owned(),
                m["payload"].as_str().unwrap().to_owned(),
                m["qos"].as_u64().unwrap(),
                m["retain"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn msg(topic: String, payload: &str, qos: u64, retain: bool) -> (String, String, u64, bool) {
    (topic, payload.to_owned(), qos, retain)
}

/// Asserts every scenario's observations.
fn check(r: &Value, version: u8, p: &str) {
    // QoS 0/1/2 to a QoS 2 subscription: each delivered at its publish QoS, in order.
    assert_eq!(r["qos"]["granted"], json!([2]), "{:#}", r["qos"]);
    assert_eq!(
        summary(&r["qos"]["received"]),
        [
            msg(format!("{p}q/zero"), "q0", 0, false),
            msg(format!("{p}q/one"), "q1", 1, false),
            msg(format!("{p}q/two"), "q2", 2, false),
        ]
    );

    // `+/temp` at QoS 1 and `room1/#` at QoS 0 overlap on room1/temp: delivered once,
    // at the higher QoS; room2/hum matches neither.
    assert_eq!(r["wildcard"]["granted"], json!([1, 0]));
    assert_eq!(
        summary(&r["wildcard"]["received"]),
        [
            msg(format!("{p}w/room1/temp"), "room1/temp", 1, false),
            msg(format!("{p}w/room1/hum"), "room1/hum", 0, false),
            msg(format!("{p}w/room2/temp"), "room2/temp", 1, false),
            msg(format!("{p}w/room1/end"), "room1/end", 0, false),
        ]
    );

    // Retained: the replacement is delivered on subscribe (retain flag set), then an
    // empty retained publish clears it: the next subscriber gets only live traffic.
    assert_eq!(
        summary(&r["retained"]["afterSet"]),
        [
            msg(format!("{p}r/state"), "off", 1, true),
            msg(format!("{p}r/marker"), "after subscribe 1", 1, false),
        ]
    );
    assert_eq!(
        summary(&r["retained"]["afterClear"]),
        [msg(format!("{p}r/marker"), "after subscribe 2", 1, false)]
    );

    // The will of the client that vanished, not of the one that said DISCONNECT.
    assert_eq!(
        summary(&r["will"]["received"]),
        [msg(format!("{p}l/doomed"), "gone", 1, false)]
    );

    // The persistent session: new at first, present on return, with the offline messages.
    let s = &r["session"];
    assert_eq!(s["granted"], json!([1]));
    assert_eq!(s["firstSessionPresent"], json!(false), "{s:#}");
    assert_eq!(s["sessionPresent"], json!(true), "{s:#}");
    assert_eq!(
        summary(&s["received"]),
        (1..=3)
            .map(|n| msg(format!("{p}s/offline"), &format!("offline {n}"), 1, false))
            .collect::<Vec<_>>()
    );

    // MQTT 5 request/response through the broker, properties intact both ways.
    let rr = &r["requestResponse"];
    if version == 5 {
        assert_eq!(rr["request"]["topic"], format!("{p}p/request"));
        assert_eq!(rr["request"]["payload"], "what time is it");
        assert_eq!(
            rr["request"]["props"],
            json!({
                "user": {"unit": "C", "room": "kitchen"},
                "responseTopic": format!("{p}p/reply/requester"),
                "correlationData": "AAEC+g==",
                "contentType": "text/plain",
            }),
            "{rr:#}"
        );
        assert_eq!(rr["reply"]["topic"], format!("{p}p/reply/requester"));
        assert_eq!(rr["reply"]["payload"], "re: what time is it");
        assert_eq!(rr["reply"]["props"]["correlationData"], "AAEC+g==");
        assert_eq!(rr["reply"]["props"]["user"], json!({"answered": "yes"}));
    } else {
        assert_eq!(rr["skipped"], "MQTT 5 only");
    }

    // Shared subscription: the two members together got each job exactly once; the
    // plain subscriber of the same filter got every job.
    let sh = &r["shared"];
    assert_eq!(sh["granted"], json!([1, 1]));
    let jobs = |v: &Value| -> Vec<String> {
        let mut all: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j.as_str().unwrap().to_owned())
            .collect();
        all.sort();
        all
    };
    let mut expected: Vec<String> = (0..20).map(|i| format!("job {i}")).collect();
    expected.sort();
    let mut group = jobs(&sh["a"]);
    group.extend(jobs(&sh["b"]));
    group.sort();
    assert_eq!(group, expected, "each job to exactly one member: {sh:#}");
    assert_eq!(jobs(&sh["plain"]), expected, "{sh:#}");
}

fn mqttjs_against(transport: &str, version: u8) {
    let node = Node::start().expect("start");
    let url = match transport {
        "tcp" => format!("mqtt://{}", node.addr("mqtt")),
        _ => format!("ws://{}/mqtt", node.addr("ws")),
    };
    let prefix = format!("js{version}{transport}");
    let results = run_mqttjs(&url, version, &prefix, &[]);
    check(&results, version, &prefix);
}

#[test]
fn mqttjs_v311_over_tcp() {
    mqttjs_against("tcp", 4);
}

#[test]
fn mqttjs_v5_over_tcp() {
    mqttjs_against("tcp", 5);
}

#[test]
fn mqttjs_v311_over_websocket() {
    mqttjs_against("ws", 4);
}

#[test]
fn mqttjs_v5_over_websocket() {
    mqttjs_against("ws", 5);
}

/// A persistent session across a clean broker restart: subscribed and away before,
/// the offline messages delivered after (MQTT.js is a new process each time).
fn session_across_restart(transport: &str, version: u8) {
    let mut node = Node::start().expect("start");
    let url = |node: &Node| match transport {
        "tcp" => format!("mqtt://{}", node.addr("mqtt")),
        _ => format!("ws://{}/mqtt", node.addr("ws")),
    };
    let prefix = format!("jsr{version}{transport}");
    let id = format!("{prefix}-restart");
    let away = run_mqttjs(
        &url(&node),
        version,
        &prefix,
        &["--only", "sessionAway", "--session", &id],
    );
    assert_eq!(away["sessionAway"]["granted"], json!([1]));
    assert_eq!(away["sessionAway"]["firstSessionPresent"], json!(false));

    node.stop().expect("clean stop");
    node.restart().expect("restart on the same data and ports");

    let back = run_mqttjs(
        &url(&node),
        version,
        &prefix,
        &["--only", "sessionBack", "--session", &id],
    );
    let back = &back["sessionBack"];
    assert_eq!(back["sessionPresent"], json!(true), "{back:#}");
    assert_eq!(
        summary(&back["received"]),
        (1..=3)
            .map(|n| msg(
                format!("{prefix}s/offline"),
                &format!("offline {n}"),
                1,
                false
            ))
            .collect::<Vec<_>>()
    );
}

#[test]
fn mqttjs_v311_persistent_session_survives_a_restart_over_tcp() {
    session_across_restart("tcp", 4);
}

#[test]
fn mqttjs_v5_persistent_session_survives_a_restart_over_websocket() {
    session_across_restart("ws", 5);
}

/// The script's own timeout: against a "broker" that accepts and never answers, the
/// run ends with `ok: false` naming the timeout, instead of hanging the test.
#[test]
fn a_silent_broker_fails_the_mqttjs_run_instead_of_hanging_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Hold every accepted socket open without a byte of answer.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().map_while(Result::ok) {
            held.push(s);
        }
    });
    let (report, status, _) = run_script(&format!("mqtt://{addr}"), 5, "silent", "3", &[]);
    assert_eq!(report["ok"], json!(false), "{report:#}");
    assert!(!status.success());
    assert_eq!(report["scenario"], "qos", "{report:#}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("timed out after 3 s"),
        "{report:#}"
    );
}
