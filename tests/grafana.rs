//! The Grafana dashboard in `deploy/grafana/` answers from a live Prometheus:
//! a master and a slave run with traffic through MQTT and HTTP, Debian's
//! Prometheus scrapes them with `deploy/prometheus/prometheus.yml` (its two
//! targets rewritten to the nodes' ports, the interval to 1 s), and every query
//! of every panel is evaluated through Prometheus's HTTP API: each must return
//! at least one series with a number (not NaN). Grafana itself cannot be
//! installed here; it runs the same queries. Needs `prometheus`
//! (`scripts/install-test-deps`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the child when dropped (also when the test fails).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SIGTERM first: nodes and Prometheus stop cleanly on it.
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// A port outside the kernel's ephemeral range, so no other test's `bind(0)` is
/// handed it before the process this test starts binds it.
fn free_port() -> u16 {
    rocketgate_testkit::net::free_port()
}

/// A standalone node with `args` and `env`; its listeners (`door -> addr`).
fn node(args: &[&str], env: &[(&str, &str)]) -> (Reaped, BTreeMap<String, String>) {
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_rocketgate"))
            .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
            .arg("standalone")
            .args(args)
            .args(["--namesrv", "0", "--native", "0", "--mqtt", "0"])
            .args(["--http", "0", "--ws", "0"])
            .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
            .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut doors = BTreeMap::new();
    for line in BufReader::new(child.0.stdout.take().unwrap()).lines() {
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
    assert!(
        doors.contains_key("http"),
        "the node did not start: {doors:?}"
    );
    (child, doors)
}

fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_owned())
}

/// Every `expr` of every panel (rows included), with its panel's title.
fn panel_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_owned()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The series of an instant query that have a number (not NaN / Inf).
fn numbers(prom: &str, expr: &str) -> Result<usize, String> {
    let (code, body) = curl(&[
        "--data-urlencode",
        &format!("query={expr}"),
        &format!("http://{prom}/api/v1/query"),
    ]);
    if code != 200 {
        return Err(format!("HTTP {code}: {body}"));
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
    Ok(result
        .iter()
        .filter_map(|s| s["value"][1].as_str()?.parse::<f64>().ok())
        .filter(|x| x.is_finite())
        .count())
}

#[test]
fn every_grafana_panel_query_answers_from_prometheus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        Command::new("prometheus").arg("--version").output().is_ok(),
        "Debian's prometheus is not installed: run scripts/install-test-deps"
    );
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/dashboards/rocketgate.json")).unwrap(),
    )
    .unwrap();
    let queries = panel_queries(&dashboard);
    assert!(queries.len() >= 15, "{queries:?}");
    // The provisioning points at the dashboards and the datasource the panels name.
    let ds = std::fs::read_to_string(
        root.join("deploy/grafana/provisioning/datasources/prometheus.yml"),
    )
    .unwrap();
    assert!(ds.contains("uid: prometheus") && ds.contains("type: prometheus"));
    for p in dashboard["panels"].as_array().unwrap() {
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "prometheus", "{}", p["title"]);
        }
    }

    // A master and its slave.
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ha = format!("127.0.0.1:{}", free_port());
    let secret = ("ROCKETGATE_HA__SECRET", "grafana-test");
    let (_master, m) = node(
        &["--data-dir", dirs.0.path().to_str().unwrap(), "--ha", &ha],
        &[secret],
    );
    let (_slave, s) = node(
        &[
            "--data-dir",
            dirs.1.path().to_str().unwrap(),
            "--broker-id",
            "1",
            "--ha-master",
            &ha,
        ],
        &[secret, ("ROCKETGATE_BROKER__NAMESRV_ADDRS", &m["namesrv"])],
    );

    // Prometheus with the shipped config, targets and interval rewritten.
    let shipped = std::fs::read_to_string(root.join("deploy/prometheus/prometheus.yml")).unwrap();
    let config = shipped
        .replace("127.0.0.1:8080", &m["http"])
        .replace("127.0.0.1:8081", &s["http"])
        .replace("scrape_interval: 5s", "scrape_interval: 1s");
    assert!(config.contains(&m["http"]) && config.contains(&s["http"]) && config.contains("1s"));
    let prom_dir = tempfile::tempdir().unwrap();
    let config_path = prom_dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).unwrap();
    let prom = format!("127.0.0.1:{}", free_port());
    let _prometheus = Reaped(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                prom_dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // Traffic while Prometheus scrapes: MQTT publishes to a subscriber, HTTP
    // publishes, receives that are never acked (POP in flight, lag).
    let mqtt_port = m["mqtt"].rsplit(':').next().unwrap().to_owned();
    let _sub = Reaped(
        Command::new("mosquitto_sub")
            .args(["-p", &mqtt_port, "-t", "graphed/#", "-q", "1"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut publisher = Reaped(
        Command::new("mosquitto_pub")
            .args(["-p", &mqtt_port, "-t", "graphed/m", "-q", "1", "-l"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = publisher.0.stdin.take().unwrap();
    let started = Instant::now();
    let mut ready = false;
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(8) || !ready {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Prometheus did not become ready on {prom}"
        );
        writeln!(stdin, "reading {i}").unwrap();
        let (code, _) = curl(&[
            "--data-binary",
            &format!("http {i}"),
            &format!("http://{}/v1/topics/graphed/messages", m["http"]),
        ]);
        assert_eq!(code, 201);
        if i % 5 == 0 {
            let (code, body) = curl(&[&format!(
                "http://{}/v1/groups/dashboards/topics/graphed/messages?max=2",
                m["http"]
            )]);
            assert_eq!(code, 200, "{body}");
        }
        ready = ready || curl(&[&format!("http://{prom}/-/ready")]).0 == 200;
        i += 1;
        std::thread::sleep(Duration::from_millis(150));
    }
    drop(stdin);

    // Both targets up, then every panel's every query.
    let deadline = Instant::now() + Duration::from_secs(15);
    while numbers(&prom, "up == 1") != Ok(2) {
        assert!(
            Instant::now() < deadline,
            "targets not up: {:?}",
            curl(&[&format!("http://{prom}/api/v1/targets")])
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut empty = Vec::new();
    for (title, expr) in &queries {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match numbers(&prom, expr) {
                Ok(n) if n > 0 => break,
                r if Instant::now() >= deadline => {
                    empty.push(format!("{title}: {expr} -> {r:?}"));
                    break;
                }
                _ => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }
    assert!(
        empty.is_empty(),
        "panel queries without data:\n{}",
        empty.join("\n")
    );
}
