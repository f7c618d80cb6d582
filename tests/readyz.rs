//! `/readyz` says 503 and names what is not ready: a broker whose NameServer does
//! not answer is not ready (`namesrv`), while `/healthz` stays 200; the image's
//! health check (`rocketgate admin health`) exits 1 for it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(url: &str) -> (u16, serde_json::Value) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), serde_json::from_str(body).unwrap())
}

#[test]
fn a_broker_without_its_nameserver_is_alive_but_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on (outside the ephemeral range, so no other test is
    // handed it while this one counts on its silence).
    let dead_addr = format!("127.0.0.1:{}", rocketgate_testkit::net::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocketgate"))
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .args(["broker", "--data-dir"])
        .arg(dir.path())
        .args(["--namesrv", &dead_addr])
        .args(["--native", "0", "--mqtt", "0", "--http", "0", "--ws", "0"])
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut http = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("rocketgate: http listening on ") {
            http = a.to_owned();
        }
        if line.contains(" ready ") {
            break;
        }
    }
    let _node = Node(child);
    assert_eq!(curl(&format!("http://{http}/healthz")).0, 200);
    let (status, body) = curl(&format!("http://{http}/readyz"));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["not_ready"], serde_json::json!(["namesrv"]), "{body}");
    let ns = body["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "namesrv")
        .unwrap();
    assert!(ns["detail"].as_str().unwrap().contains(&dead_addr), "{ns}");
    let doors = body["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "doors")
        .unwrap();
    assert_eq!(doors["ok"], true, "{doors}");
    let out = Command::new(env!("CARGO_BIN_EXE_rocketgate"))
        .args(["admin", "--server", &format!("http://{http}"), "health"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not ready"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT READY"));
}
