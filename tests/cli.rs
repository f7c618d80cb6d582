//! The binary as a user runs it: bad settings are clear errors, and a standalone
//! node starts, opens its data directory and stops cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rocketgate"))
}

/// The binary with a small store (1 MiB segments), as the node tests run it.
fn node() -> Command {
    let mut c = bin();
    c.env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        // How full this machine's disk is must not decide a test.
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        // Never take default ports in tests (the flags beat these where a test gives them).
        .env("ROCKETGATE_LISTEN__HTTP", "127.0.0.1:0")
        .env("ROCKETGATE_LISTEN__WS", "127.0.0.1:0")
        .env("ROCKETGATE_LISTEN__MQTT", "127.0.0.1:0")
        .stderr(Stdio::null());
    c
}

#[test]
fn a_bad_setting_names_itself_and_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["--data-dir"])
        .arg(dir.path())
        .env("ROCKETGATE_STORE__FLUSH", "sometimes")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ROCKETGATE_STORE__FLUSH"), "{err}");

    let out = bin().args(["--mqtt", "not-an-address"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not-an-address"));

    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[store]\ndisk_soft_ratio = 0.95\n").unwrap();
    let out = bin().arg("--config").arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("disk_soft_ratio"));
}

#[test]
fn standalone_starts_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = node()
        .args(["standalone", "--data-dir"])
        .arg(dir.path())
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
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = Instant::now();
    let ready = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find(|l| l.contains("ready"))
        .expect("a ready line");
    assert!(ready.contains("standalone ready"), "{ready}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(dir.path().join("abort").exists(), "the store is open");
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        !dir.path().join("abort").exists(),
        "a clean stop removes the abort marker"
    );
    assert!(dir.path().join("checkpoint").exists());
}

/// `standalone` flags for a node in `data` with every door on a free port.
fn standalone_on_free_ports(data: &str) -> [&str; 12] {
    [
        "--data-dir",
        data,
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
    ]
}

/// Starts the binary with `args`, returns it and the address it announced for `door`.
fn start(
    args: &[&str],
    door: &str,
) -> (
    std::process::Child,
    String,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut child = node().args(args).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let prefix = format!("rocketgate: {door} listening on ");
    let addr = loop {
        let line = lines
            .next()
            .expect("the process exited before announcing")
            .unwrap();
        if let Some(a) = line.strip_prefix(&prefix) {
            break a.to_string();
        }
    };
    (child, addr, lines)
}

/// One request/response over the remoting protocol with our codec.
fn ask(
    addr: &str,
    cmd: rocketgate_remoting::RemotingCommand,
) -> rocketgate_remoting::RemotingCommand {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = bytes::BytesMut::new();
    rocketgate_remoting::codec::encode(&cmd, &mut out).unwrap();
    s.write_all(&out).unwrap();
    let mut buf = bytes::BytesMut::new();
    loop {
        if let Some(resp) = rocketgate_remoting::codec::decode(&mut buf).unwrap() {
            return resp;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed before a response");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn cluster_info(addr: &str) -> String {
    use rocketgate_remoting::code::{request, response};
    let resp = ask(
        addr,
        rocketgate_remoting::RemotingCommand::request(request::GET_BROKER_CLUSTER_INFO, 1),
    );
    assert_eq!(resp.code, response::SUCCESS);
    String::from_utf8_lossy(&resp.body).into_owned()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sigterm(child: &mut std::process::Child) {
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

#[test]
fn brokers_register_with_every_namesrv_and_leave_on_stop() {
    let (mut ns1, a1, _l1) = start(&["namesrv", "--listen", "0"], "namesrv");
    let (mut ns2, a2, _l2) = start(&["namesrv", "--listen", "0"], "namesrv");
    let d = tempfile::tempdir().unwrap();
    let list = format!("{a1};{a2}");
    let data = d.path().to_str().unwrap();
    let mut broker = node()
        .args([
            "broker",
            "--name",
            "broker-x",
            "--native",
            "0",
            "--ws",
            "0",
            "--mqtt",
            "0",
            "--namesrv",
            &list,
            "--data-dir",
            data,
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for a in [&a1, &a2] {
        wait_for("the broker to register", || {
            cluster_info(a).contains("broker-x")
        });
    }
    sigterm(&mut broker);
    for a in [&a1, &a2] {
        wait_for("the broker to leave", || {
            !cluster_info(a).contains("broker-x")
        });
    }
    sigterm(&mut ns1);
    sigterm(&mut ns2);
}

#[test]
fn standalone_embeds_a_namesrv_with_its_broker_registered() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().to_str().unwrap();
    let (mut node, addr, _lines) = start(&standalone_on_free_ports(data), "namesrv");
    wait_for("the embedded broker to register", || {
        cluster_info(&addr).contains("broker-a")
    });
    let resp = ask(
        &addr,
        rocketgate_remoting::RemotingCommand::request(
            rocketgate_remoting::code::request::GET_ROUTEINFO_BY_TOPIC,
            2,
        )
        .with_field("topic", "NoSuchTopic"),
    );
    assert_eq!(
        resp.code,
        rocketgate_remoting::code::response::TOPIC_NOT_EXIST
    );
    sigterm(&mut node);
}

#[test]
fn standalone_serves_the_native_door() {
    use rocketgate_remoting::RemotingCommand;
    use rocketgate_remoting::code::{request, response};
    let d = tempfile::tempdir().unwrap();
    let data = d.path().to_str().unwrap();
    let (mut node, addr, _lines) = start(&standalone_on_free_ports(data), "native");
    let sent = ask(
        &addr,
        RemotingCommand::request(request::SEND_MESSAGE, 1)
            .with_field("producerGroup", "cli")
            .with_field("topic", "CliTopic")
            .with_field("queueId", 0)
            .with_field("properties", "TAGS\u{1}t\u{2}")
            .with_body(&b"hello"[..]),
    );
    assert_eq!(sent.code, response::SUCCESS, "{sent:?}");
    // The offset id names the announced address: the store host is the real port.
    let (host, _) =
        rocketgate_core::store::record::decode_msg_id(sent.field("msgId").unwrap()).unwrap();
    assert_eq!(host.to_string(), addr);
    let unknown = ask(&addr, RemotingCommand::request(9999, 2));
    assert_eq!(unknown.code, response::REQUEST_CODE_NOT_SUPPORTED);
    sigterm(&mut node);
}

#[test]
fn a_broker_without_namesrvs_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["broker", "--data-dir"])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--namesrv"));
}

/// The MQTT load generator works end to end against its trivial sink: it connects,
/// subscribes, publishes at QoS 1 and reports deliveries with latencies.
#[cfg(feature = "bench")]
#[test]
fn the_mqtt_load_generator_measures_its_sink() {
    let stdout = generate_against_sink(&[
        "--scenario",
        "fanin",
        "--publishers",
        "4",
        "--subscribers",
        "2",
        "--qos",
        "1",
        "--seconds",
        "1",
        "--warmup",
        "0",
    ]);
    assert!(result_field(&stdout, "delivered_per_s") > 0.0, "{stdout}");
    // Present (a p99 of 0 µs would still be a figure).
    result_field(&stdout, "p99_us");
}

/// Runs `rocketgate bench mqtt ARGS --json` against a fresh `bench mqtt-sink`;
/// the generator must succeed. Its stdout.
#[cfg(feature = "bench")]
fn generate_against_sink(args: &[&str]) -> String {
    let (mut sink, addr, _lines) = start(
        &["bench", "mqtt-sink", "--listen", "127.0.0.1:0"],
        "mqtt-sink",
    );
    let out = bin()
        .args(["bench", "mqtt", "--broker", &addr])
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let _ = sink.kill();
    let _ = sink.wait();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A number field of the generator's `RESULT {json}` line.
#[cfg(feature = "bench")]
fn result_field(stdout: &str, field: &str) -> f64 {
    let result = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("a RESULT line");
    result
        .split(&format!("\"{field}\":"))
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{field} in {result}"))
}

/// `--arrivals spread` paces the publishers from the pacing thread: the fixed rate
/// is kept (what each publisher owes is sent even if it wakes late) and deliveries
/// are measured.
#[cfg(feature = "bench")]
#[test]
fn the_mqtt_load_generator_spreads_a_fixed_rate() {
    let stdout = generate_against_sink(&[
        "--scenario",
        "p2p",
        "--publishers",
        "4",
        "--subscribers",
        "4",
        "--qos",
        "1",
        "--rate",
        "2000",
        "--arrivals",
        "spread",
        "--seconds",
        "2",
        "--warmup",
        "1",
    ]);
    let published = result_field(&stdout, "published_per_s");
    assert!(
        (1500.0..=2500.0).contains(&published),
        "asked for 2,000 msgs/s, published {published}/s"
    );
    assert!(
        result_field(&stdout, "delivered_per_s") > 1000.0,
        "{stdout}"
    );
    assert!(result_field(&stdout, "p99_us") > 0.0, "{stdout}");
}

/// A build without the `bench` feature still knows the word and says what is missing,
/// rather than failing as if the user mistyped.
#[cfg(not(feature = "bench"))]
#[test]
fn bench_in_a_build_without_it_says_so() {
    let out = bin()
        .args(["bench", "mqtt", "--broker", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("built without benchmarks"), "{stderr}");
}

/// `curl -sS -w '\n%{http_code}' ARGS`: (status, body).
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_owned())
}

#[test]
fn standalone_serves_http_publish_receive_ack_and_its_cluster_view() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().to_str().unwrap();
    let (mut node, addr, _lines) = start(&standalone_on_free_ports(data), "http");
    let base = format!("http://{addr}");
    let (status, body) = curl(&[
        "--data-binary",
        "hello",
        &format!("{base}/v1/topics/greetings/messages?tag=en"),
    ]);
    assert_eq!(status, 201, "{body}");
    let (status, body) = curl(&[&format!(
        "{base}/v1/groups/g/topics/greetings/messages?wait_ms=10000"
    )]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"body\":\"hello\""), "{body}");
    let handle = body
        .split("\"receipt_handle\":\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap();
    let ack = format!("{{\"receipt_handle\":\"{handle}\"}}");
    let (status, body) = curl(&[
        "-H",
        "content-type: application/json",
        "-d",
        &ack,
        &format!("{base}/v1/groups/g/acks"),
    ]);
    assert_eq!(status, 200, "{body}");
    wait_for("the cluster view through HTTP", || {
        curl(&[&format!("{base}/v1/cluster")])
            .1
            .contains("broker-a")
    });
    sigterm(&mut node);
}

#[test]
fn standalone_serves_mqtt() {
    use std::io::{Read, Write};
    let d = tempfile::tempdir().unwrap();
    let data = d.path().to_str().unwrap();
    let (mut node, addr, _lines) = start(&standalone_on_free_ports(data), "mqtt");
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // MQTT 3.1.1 CONNECT, clean session, keep-alive 60, client id "cli".
    s.write_all(&[
        0x10, 15, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 3, b'c', b'l', b'i',
    ])
    .unwrap();
    let mut ack = [0u8; 4];
    s.read_exact(&mut ack).unwrap();
    assert_eq!(ack, [0x20, 2, 0, 0], "CONNACK accepted");
    sigterm(&mut node);
}

/// MQTT over WebSocket through the binary: `/mqtt` with subprotocol `mqtt` runs an
/// MQTT connection on the MQTT door's shared state (what MQTT.js in a browser uses).
#[test]
fn standalone_serves_mqtt_over_websocket() {
    use mqttbytes::QoS;
    use mqttbytes::v4::{self, Connect, Packet, Publish, Subscribe};
    use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest};

    let d = tempfile::tempdir().unwrap();
    let data = d.path().to_str().unwrap();
    let (mut node, addr, _lines) = start(&standalone_on_free_ports(data), "ws");
    let mut request = format!("ws://{addr}/mqtt").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", "mqtt".parse().unwrap());
    let (mut ws, response) = tungstenite::connect(request).unwrap();
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "mqtt",
        "the subprotocol is echoed"
    );
    let mut send = |packet: bytes::BytesMut| ws.send(Message::Binary(packet.freeze())).unwrap();
    let mut out = bytes::BytesMut::new();
    Connect::new("ws-cli").write(&mut out).unwrap();
    send(out.split());
    Subscribe::new("wsdemo/#", QoS::AtLeastOnce)
        .write(&mut out)
        .unwrap();
    send(out.split());
    let mut publish = Publish::new("wsdemo/room1", QoS::AtLeastOnce, b"over ws".to_vec());
    publish.pkid = 7;
    let mut published = false;
    let mut buf = bytes::BytesMut::new();
    let got = loop {
        match v4::read(&mut buf, 1 << 20) {
            Ok(Packet::SubAck(_)) if !published => {
                publish.write(&mut out).unwrap();
                ws.send(Message::Binary(out.split().freeze())).unwrap();
                published = true;
            }
            Ok(Packet::Publish(p)) => break p,
            Ok(_) => {}
            Err(mqttbytes::Error::InsufficientBytes(_)) => match ws.read().unwrap() {
                Message::Binary(b) => buf.extend_from_slice(&b),
                Message::Close(c) => panic!("closed: {c:?}"),
                _ => {}
            },
            Err(e) => panic!("bad packet: {e:?}"),
        }
    };
    assert_eq!(got.topic, "wsdemo/room1");
    assert_eq!(&got.payload[..], b"over ws");
    sigterm(&mut node);
}

/// A port free right now, for the "chosen port" flag tests: outside the kernel's
/// ephemeral range, so no other test's `bind(0)` is handed it before the node binds it
/// (a CI run lost the standalone node's MQTT door to that race).
fn free_port() -> u16 {
    rocketgate_testkit::net::free_port()
}

/// Starts `args` without any `ROCKETGATE_LISTEN__*` variable (so a flag that were
/// ignored would show as a default port) and returns each door's announced address.
fn listeners_of(
    args: &[&str],
) -> (
    std::process::Child,
    std::collections::BTreeMap<String, String>,
) {
    let mut child = bin()
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut doors = std::collections::BTreeMap::new();
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

#[test]
fn every_subcommand_takes_a_flag_per_listener() {
    // namesrv: `--namesrv` (the name standalone uses) and `--listen` are one flag.
    let p = free_port();
    let (mut ns, doors) = listeners_of(&["namesrv", "--namesrv", &p.to_string()]);
    assert_eq!(
        doors.get("namesrv"),
        Some(&format!("127.0.0.1:{p}")),
        "{doors:?}"
    );
    let ns_addr = doors["namesrv"].clone();

    // broker: every door it opens, on chosen ports (mqtt, http) and on port 0 (native, ws).
    let d = tempfile::tempdir().unwrap();
    let (mqtt, http) = (free_port(), free_port());
    let (mut broker, doors) = listeners_of(&[
        "broker",
        "--namesrv",
        &ns_addr,
        "--data-dir",
        d.path().to_str().unwrap(),
        "--native",
        "0",
        "--mqtt",
        &mqtt.to_string(),
        "--http",
        &format!("127.0.0.1:{http}"),
        "--ws",
        "0",
    ]);
    assert_eq!(
        doors.get("mqtt"),
        Some(&format!("127.0.0.1:{mqtt}")),
        "{doors:?}"
    );
    assert_eq!(
        doors.get("http"),
        Some(&format!("127.0.0.1:{http}")),
        "{doors:?}"
    );
    for door in ["native", "ws"] {
        let port = doors[door].rsplit(':').next().unwrap();
        assert!(!["0", "10911", "8083"].contains(&port), "{door}: {doors:?}");
    }
    // The HTTP door on the chosen port answers.
    let (code, _) = curl(&[&format!("http://127.0.0.1:{http}/health")]);
    assert_eq!(code, 200);
    sigterm(&mut broker);
    sigterm(&mut ns);

    // standalone: every flag on a chosen port.
    let d = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let ps: Vec<String> = ports.iter().map(u16::to_string).collect();
    let (mut node, doors) = listeners_of(&[
        "standalone",
        "--data-dir",
        d.path().to_str().unwrap(),
        "--namesrv",
        &ps[0],
        "--native",
        &ps[1],
        "--mqtt",
        &ps[2],
        "--http",
        &ps[3],
        "--ws",
        &ps[4],
    ]);
    for (door, port) in ["namesrv", "native", "mqtt", "http", "ws"]
        .iter()
        .zip(&ports)
    {
        assert_eq!(
            doors.get(*door),
            Some(&format!("127.0.0.1:{port}")),
            "{doors:?}"
        );
    }
    sigterm(&mut node);
}

/// `/metrics` counts every door: after real traffic through MQTT (mosquitto_pub),
/// HTTP (curl), WebSocket and native, each shows its messages in and its open
/// connections, with the topic as a label.
#[test]
fn metrics_count_every_door() {
    use rocketgate_remoting::RemotingCommand;
    use rocketgate_remoting::code::request;
    use tokio_tungstenite::tungstenite::{self, Message};

    let d = tempfile::tempdir().unwrap();
    let data = d.path().to_str().unwrap();
    let (mut node, doors) = listeners_of(&[
        "standalone",
        "--data-dir",
        data,
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
    ]);
    let (http, mqtt_port) = (&doors["http"], doors["mqtt"].rsplit(':').next().unwrap());
    // MQTT: a subscriber stays connected while the scrape runs.
    let mut sub = Command::new("mosquitto_sub")
        .args(["-p", mqtt_port, "-t", "metered/#", "-q", "1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = Command::new("mosquitto_pub")
        .args([
            "-p",
            mqtt_port,
            "-t",
            "metered/m",
            "-q",
            "1",
            "-m",
            "from mqtt",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    // HTTP.
    let (code, _) = curl(&[
        "--data-binary",
        "from http",
        &format!("http://{http}/v1/topics/metered/messages"),
    ]);
    assert_eq!(code, 201);
    // WebSocket: publish, and stay connected.
    let (mut ws, _) = tungstenite::connect(format!("ws://{}/v1/ws", doors["ws"])).unwrap();
    ws.send(Message::text(
        r#"{"op":"publish","req":"p","topic":"metered","body":"from ws"}"#,
    ))
    .unwrap();
    loop {
        if let Message::Text(t) = ws.read().unwrap() {
            assert!(t.contains("send_result"), "{t}");
            break;
        }
    }
    // Native: one send over a connection that stays open.
    let native = std::net::TcpStream::connect(&doors["native"]).unwrap();
    let resp = ask(
        &doors["native"],
        RemotingCommand::request(request::SEND_MESSAGE, 1)
            .with_field("producerGroup", "cli")
            .with_field("topic", "metered")
            .with_field("queueId", 0)
            .with_field("properties", "TAGS\u{1}t\u{2}")
            .with_body(&b"from native"[..]),
    );
    assert_eq!(resp.code, 0, "{resp:?}");

    let mut text = String::new();
    wait_for("every door in /metrics", || {
        let (code, body) = curl(&[&format!("http://{http}/metrics")]);
        assert_eq!(code, 200);
        text = body;
        ["mqtt", "http", "ws", "native"].iter().all(|door| {
            text.contains(&format!(
                "rocketgate_messages_in_total{{protocol=\"{door}\",topic=\"metered\"}} 1"
            ))
        }) && ["mqtt", "ws", "native"].iter().all(|door| {
            text.lines().any(|l| {
                l.starts_with(&format!("rocketgate_connections{{protocol=\"{door}\"}}"))
                    && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)
            })
        })
    });
    drop(native);
    let _ = sub.kill();
    let _ = sub.wait();
    sigterm(&mut node);
}
