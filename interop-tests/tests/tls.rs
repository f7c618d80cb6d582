//! TLS on every door, with real clients and certificates made in the test (`rcgen`,
//! `interop_tests::pki`):
//!
//! - MQTT on the TLS port: `mosquitto_pub`/`mosquitto_sub --cafile`, paho-mqtt with
//!   `tls_set`, and a client trusting the wrong CA refused;
//! - mTLS (`tls.client_auth = required`): no certificate refused, the client
//!   certificate's CN logged as `tls_identity` at CONNECT;
//! - HTTPS with `curl --cacert`, and the `Origin` allow-list (403 / CORS headers);
//! - WSS: Chromium (trusting the test key by its SPKI hash) on `wss://…/v1/ws`, and
//!   the `Origin` check at the upgrade;
//! - the native door: our client over TLS in `enforcing` and `permissive` modes,
//!   plain in `permissive`, plain refused in `enforcing`;
//! - rotation: new files are picked up while a connection stays open; new
//!   connections see the new certificate, a bad file keeps the old one;
//! - mTLS identity (`auth.certificate_identity`) on WSS `/v1/ws` and the native
//!   door: the certificate's CN is the user and its ACL applies; without a
//!   certificate the door asks for credentials as usual.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use interop_tests::Node;
use interop_tests::doors::curl;
use interop_tests::pki::Pki;
use rocketgate_native::client::{ClientSettings, Message, Producer};
use rocketgate_testkit::browser::{Browser, serve};
use rocketgate_tls::rustls::pki_types::{CertificateDer, ServerName};
use rocketgate_tls::tokio_rustls::TlsConnector;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A node with TLS on the doors `extra` switches on (plus the certificate files).
fn start(pki: &Pki, extra: &[(&str, &str)]) -> Node {
    let mut env: Vec<(String, String)> = pki.env();
    env.push(("ROCKETGATE_LISTEN__MQTTS".into(), "127.0.0.1:0".into()));
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Node::start_with_env(&refs).expect("start")
}

fn run(cmd: &mut Command) -> anyhow::Result<std::process::Output> {
    tokio::task::block_in_place(|| cmd.output()).with_context(|| {
        format!("running {cmd:?} (scripts/install-test-deps installs mosquitto-clients, curl, python3-paho-mqtt)")
    })
}

fn mosquitto(bin: &str, node: &Node, tls: &[String]) -> Command {
    let addr = node.addr("mqtts");
    let mut c = Command::new(bin);
    c.args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-q", "1"])
        .args(tls);
    c
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn path(pki: &Pki, name: &str) -> String {
    pki.path(name).display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_over_tls_with_mosquitto_and_paho_and_the_wrong_ca_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "unused").unwrap();
    let node = start(&pki, &[("ROCKETGATE_TLS__MQTT", "true")]);
    let ca = args(&["--cafile", &path(&pki, "ca.pem")]);

    // A retained publish over TLS, read back over TLS by a fresh subscriber.
    let out = run(mosquitto("mosquitto_pub", &node, &ca).args([
        "-t",
        "tls/greeting",
        "-r",
        "-m",
        "over tls",
    ]))
    .unwrap();
    assert!(out.status.success(), "mosquitto_pub over TLS: {out:?}");
    let out = run(mosquitto("mosquitto_sub", &node, &ca).args([
        "-t",
        "tls/greeting",
        "-C",
        "1",
        "-W",
        "20",
    ]))
    .unwrap();
    assert!(out.status.success(), "mosquitto_sub over TLS: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "over tls");

    // A client that trusts another CA does not get in.
    let wrong = args(&["--cafile", &path(&pki, "wrong-ca.pem")]);
    let out =
        run(mosquitto("mosquitto_pub", &node, &wrong).args(["-t", "tls/x", "-m", "no"])).unwrap();
    assert!(!out.status.success(), "the wrong CA must fail: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(err.contains("tls") || err.contains("certificate"), "{err}");

    // The plain port still serves plain MQTT.
    let plain = node.addr("mqtt");
    let out = run(Command::new("mosquitto_sub").args([
        "-h",
        "127.0.0.1",
        "-p",
        &plain.port().to_string(),
        "-t",
        "tls/greeting",
        "-C",
        "1",
        "-W",
        "20",
    ]))
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "over tls");

    // paho-mqtt with tls_set: publishes QoS 1 and reads the retained message back.
    let script = r#"
import sys, paho.mqtt.client as mqtt
port, ca = int(sys.argv[1]), sys.argv[2]
got = []
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-tls")
c.tls_set(ca_certs=ca)
c.on_message = lambda cl, u, m: got.append(m.payload.decode())
c.connect("127.0.0.1", port)
c.loop_start()
info = c.publish("tls/paho", "from paho", qos=1, retain=True)
info.wait_for_publish(20)
c.subscribe("tls/greeting", qos=1)
import time
deadline = time.time() + 20
while not got and time.time() < deadline:
    time.sleep(0.05)
c.disconnect(); c.loop_stop()
print(got[0] if got else "nothing")
"#;
    let port = node.addr("mqtts").port().to_string();
    let out =
        run(Command::new("python3").args(["-c", script, &port, &path(&pki, "ca.pem")])).unwrap();
    assert!(out.status.success(), "paho over TLS: {out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "over tls");
    let out =
        run(mosquitto("mosquitto_sub", &node, &ca).args(["-t", "tls/paho", "-C", "1", "-W", "20"]))
            .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "from paho");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_required_refuses_a_client_without_a_certificate_and_names_the_one_with() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "device-17").unwrap();
    let node = start(
        &pki,
        &[
            ("ROCKETGATE_TLS__MQTT", "true"),
            ("ROCKETGATE_TLS__HTTP", "true"),
            ("ROCKETGATE_TLS__CLIENT_AUTH", "required"),
        ],
    );
    // HTTPS: curl without a client certificate fails, with one it is served and named.
    let health = format!("https://127.0.0.1:{}/health", node.addr("http").port());
    let ca = path(&pki, "ca.pem");
    assert!(
        curl(&["--cacert", &ca, &health]).is_err(),
        "curl without a certificate"
    );
    let (status, body) = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &path(&pki, "client.pem"),
        "--key",
        &path(&pki, "client.key"),
        &health,
    ])
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let log = node.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("TLS client certificate verified")
                && l.contains("door=\"http\"")
                && l.contains("tls_identity=device-17")),
        "no HTTPS identity line:\n{log}"
    );

    let ca_only = args(&["--cafile", &path(&pki, "ca.pem")]);
    let out = run(mosquitto("mosquitto_pub", &node, &ca_only)
        .args(["-i", "no-cert", "-t", "m/x", "-m", "no"]))
    .unwrap();
    assert!(
        !out.status.success(),
        "no client certificate must fail: {out:?}"
    );

    let with_cert = args(&[
        "--cafile",
        &path(&pki, "ca.pem"),
        "--cert",
        &path(&pki, "client.pem"),
        "--key",
        &path(&pki, "client.key"),
    ]);
    let out = run(mosquitto("mosquitto_pub", &node, &with_cert).args([
        "-i",
        "with-cert",
        "-t",
        "m/x",
        "-r",
        "-m",
        "yes",
    ]))
    .unwrap();
    assert!(out.status.success(), "with a client certificate: {out:?}");
    let out = run(mosquitto("mosquitto_sub", &node, &with_cert).args([
        "-i",
        "with-cert-sub",
        "-t",
        "m/x",
        "-C",
        "1",
        "-W",
        "20",
    ]))
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");

    let log = node.log_text();
    let line = log
        .lines()
        .find(|l| {
            l.contains("MQTT CONNECT with a client certificate") && l.contains("client=with-cert ")
        })
        .unwrap_or_else(|| panic!("no CONNECT line naming the certificate:\n{log}"));
    assert!(line.contains("tls_identity=device-17"), "{line}");
    assert!(
        !log.lines().any(|l| l.contains("client=no-cert")),
        "the client without a certificate never reached CONNECT"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_curl_and_the_origin_allow_list() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "unused").unwrap();
    let node = start(
        &pki,
        &[
            ("ROCKETGATE_TLS__HTTP", "true"),
            (
                "ROCKETGATE_HTTP__ALLOWED_ORIGINS",
                r#"["https://app.example"]"#,
            ),
        ],
    );
    let base = format!("https://127.0.0.1:{}", node.addr("http").port());
    let ca = path(&pki, "ca.pem");
    let publish = format!("{base}/v1/topics/web/messages");
    let topic = json!({"name": "web", "queues": 1}).to_string();
    let (status, body) = curl(&[
        "--cacert",
        &ca,
        "-H",
        "content-type: application/json",
        "--data-binary",
        &topic,
        &format!("{base}/v1/topics"),
    ])
    .unwrap();
    assert_eq!(status, 201, "{body}");

    // curl --cacert: publishes over HTTPS; without the CA curl refuses the server.
    let (status, body) = curl(&["--cacert", &ca, "--data-binary", "over https", &publish]).unwrap();
    assert_eq!(status, 201, "{body}");
    assert!(
        curl(&["--data-binary", "x", &publish]).is_err(),
        "an untrusted certificate must fail"
    );

    // No Origin (curl, apps): passes, no CORS headers.
    let (status, head) = curl(&[
        "--cacert",
        &ca,
        "-D",
        "-",
        "-o",
        "/dev/null",
        &format!("{base}/health"),
    ])
    .unwrap();
    assert_eq!(status, 200, "{head}");
    assert!(
        !head.to_lowercase().contains("access-control-allow-origin"),
        "{head}"
    );

    // A page from elsewhere: 403 JSON, nothing published.
    let (status, body) = curl(&[
        "--cacert",
        &ca,
        "-H",
        "Origin: https://evil.example",
        "--data-binary",
        "evil",
        &publish,
    ])
    .unwrap();
    assert_eq!(status, 403, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "forbidden_origin");

    // The allowed origin: served, with CORS headers for it; its preflight answered.
    let (status, head) = curl(&[
        "--cacert",
        &ca,
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "Origin: https://app.example",
        "--data-binary",
        "from the app",
        &publish,
    ])
    .unwrap();
    assert_eq!(status, 201, "{head}");
    assert!(
        head.to_lowercase()
            .contains("access-control-allow-origin: https://app.example"),
        "{head}"
    );
    let (status, head) = curl(&[
        "--cacert",
        &ca,
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-X",
        "OPTIONS",
        "-H",
        "Origin: https://app.example",
        "-H",
        "Access-Control-Request-Method: POST",
        "-H",
        "Access-Control-Request-Headers: content-type",
        &publish,
    ])
    .unwrap();
    assert_eq!(status, 204, "{head}");
    let h = head.to_lowercase();
    assert!(
        h.contains("access-control-allow-methods:") && h.contains("post"),
        "{head}"
    );
    assert!(
        h.contains("access-control-allow-headers: content-type"),
        "{head}"
    );

    // Exactly the two allowed publishes are stored.
    let (status, body) = curl(&[
        "--cacert",
        &ca,
        &format!("{base}/v1/topics/web/queues/0/messages?offset=0&max=10"),
    ])
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("over https") && body.contains("from the app") && !body.contains("evil"),
        "{body}"
    );
}

/// A TLS client stream to `addr` trusting `ca`, and the certificate the server showed.
async fn tls_connect(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
) -> anyhow::Result<(
    rocketgate_tls::tokio_rustls::client::TlsStream<TcpStream>,
    CertificateDer<'static>,
)> {
    let config = rocketgate_tls::client_config(ca)?;
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .context("no server certificate")?
        .clone()
        .into_owned();
    Ok((tls, cert))
}

/// The status of a refused WebSocket upgrade, or 101 when it was accepted.
async fn ws_upgrade_status(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
    origin: Option<&str>,
) -> u16 {
    let (tls, _) = tls_connect(addr, ca).await.unwrap();
    let mut req = format!("wss://127.0.0.1:{}/v1/ws", addr.port())
        .into_client_request()
        .unwrap();
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio_tungstenite::client_async(req, tls).await {
        Ok((mut ws, _)) => {
            let _ = ws.close(None).await;
            101
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("upgrade failed otherwise: {e}"),
    }
}

const WSS_PAGE: &str = r#"<!doctype html>
<html><body><script>
const state = { phase: "connecting", received: [], errors: [] };
window.rg = state;
const ws = new WebSocket("wss://127.0.0.1:__PORT__/v1/ws");
const send = (frame) => ws.send(JSON.stringify(frame));
ws.onopen = () => send({ op: "subscribe", req: "sub", id: "page", topic: "secure",
  group: "chromium-wss", mode: "broadcasting", start: "latest", credit: 10 });
ws.onmessage = (event) => {
  const f = JSON.parse(event.data);
  if (f.type === "subscribed") state.phase = "subscribed";
  else if (f.type === "message") { state.received.push(f.body); send({ op: "ack", receipt: f.receipt }); }
  else if (f.type === "error") state.errors.push(f);
};
ws.onerror = () => state.errors.push("websocket error");
</script></body></html>"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_over_wss_and_the_origin_check_at_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "unused").unwrap();
    let node = start(
        &pki,
        &[
            ("ROCKETGATE_TLS__WS", "true"),
            (
                "ROCKETGATE_WS__ALLOWED_ORIGINS",
                r#"["http://127.0.0.1:*"]"#,
            ),
        ],
    );
    let ws = node.addr("ws");
    let ca = pki.path("ca.pem");
    assert_eq!(
        ws_upgrade_status(ws, &ca, None).await,
        101,
        "no Origin passes"
    );
    assert_eq!(
        ws_upgrade_status(ws, &ca, Some("http://127.0.0.1:8000")).await,
        101
    );
    assert_eq!(
        ws_upgrade_status(ws, &ca, Some("https://evil.example")).await,
        403
    );

    // A page (served from an allowed origin) on wss:// gets what curl publishes.
    create_topic(&node, "secure").await;
    let page = serve(vec![(
        "/",
        "text/html",
        WSS_PAGE
            .replace("__PORT__", &ws.port().to_string())
            .into_bytes(),
    )])
    .await;
    let trust = format!(
        "--ignore-certificate-errors-spki-list={}",
        pki.server_spki_sha256
    );
    let mut browser = Browser::open_with_args(&format!("http://{page}/"), &[trust]).await;
    browser
        .wait_until("rg.phase === 'subscribed' || rg.errors.length > 0", "rg")
        .await;
    let state = browser.eval("rg").await;
    assert_eq!(state["phase"], "subscribed", "{state}");
    let url = format!("http://{}/v1/topics/secure/messages", node.addr("http"));
    let (status, body) = curl(&["--data-binary", "to the browser", &url]).unwrap();
    assert_eq!(status, 201, "{body}");
    let state = browser.wait_until("rg.received.length >= 1", "rg").await;
    assert_eq!(state["received"][0], "to the browser", "{state}");
}

async fn create_topic(node: &Node, topic: &str) {
    let url = format!("http://{}/v1/topics", node.addr("http"));
    let body = json!({"name": topic, "queues": 1}).to_string();
    let (status, text) = curl(&[
        "-H",
        "content-type: application/json",
        "--data-binary",
        &body,
        &url,
    ])
    .unwrap();
    assert!(status == 201 || status == 409, "{status} {text}");
}

async fn native_send(settings: ClientSettings, topic: &str, body: &str) -> anyhow::Result<()> {
    let settings = settings.with_request_timeout(Duration::from_secs(5));
    let producer = Producer::start(settings, "tls-producers").await?;
    let sent = producer
        .send(Message::new(topic, body.as_bytes().to_vec()))
        .await;
    producer.shutdown().await;
    sent?;
    Ok(())
}

/// The bodies stored in queue 0 of `topic` (read over the HTTP door).
fn stored(node: &Node, topic: &str) -> String {
    let url = format!(
        "http://{}/v1/topics/{topic}/queues/0/messages?offset=0&max=10",
        node.addr("http")
    );
    curl(&[&url]).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_client_over_tls_in_enforcing_and_permissive_modes() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "unused").unwrap();
    let ca = pki.path("ca.pem");
    for mode in ["enforcing", "permissive"] {
        let node = start(&pki, &[("ROCKETGATE_TLS__NATIVE", mode)]);
        create_topic(&node, "nat").await;
        let plain = ClientSettings::new([node.addr("namesrv").to_string()]);
        let tls = plain.clone().with_tls_ca(&ca).unwrap();
        native_send(tls, "nat", &format!("tls in {mode}"))
            .await
            .unwrap();
        let plain_result = native_send(plain, "nat", &format!("plain in {mode}")).await;
        let bodies = stored(&node, "nat");
        assert!(
            bodies.contains(&format!("tls in {mode}")),
            "{mode}: {bodies}"
        );
        if mode == "enforcing" {
            assert!(
                plain_result.is_err(),
                "plain remoting must be refused when enforcing"
            );
            assert!(!bodies.contains("plain in"), "{bodies}");
        } else {
            plain_result.unwrap();
            assert!(bodies.contains("plain in permissive"), "{bodies}");
        }
    }
}

/// MQTT 3.1.1 CONNECT (clean session, keep-alive 60 s, client id `rt`).
const CONNECT: &[u8] = &[
    0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 2, b'r', b't',
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_keeps_connections_and_serves_the_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let mut pki = Pki::new(dir.path(), "unused").unwrap();
    let node = start(
        &pki,
        &[
            ("ROCKETGATE_TLS__MQTT", "true"),
            ("ROCKETGATE_TLS__RELOAD_INTERVAL", "200ms"),
        ],
    );
    let addr = node.addr("mqtts");
    let ca = pki.path("ca.pem");
    let first = pki.server_der.clone();

    // A client connects and stays.
    let (mut old, seen) = tls_connect(addr, &ca).await.unwrap();
    assert_eq!(seen, first);
    old.write_all(CONNECT).await.unwrap();
    let mut ack = [0u8; 4];
    old.read_exact(&mut ack).await.unwrap();
    assert_eq!(ack, [0x20, 2, 0, 0]);

    // New files: new connections get the new certificate.
    pki.issue_server(2).unwrap();
    let second = pki.server_der.clone();
    assert_ne!(first, second);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, seen) = tls_connect(addr, &ca).await.unwrap();
        if seen == second {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The connection made before the rotation still works (PINGREQ, PINGRESP).
    old.write_all(&[0xc0, 0]).await.unwrap();
    let mut pong = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(5), old.read_exact(&mut pong))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pong, [0xd0, 0]);

    // A bad file is reported and the previous certificate kept.
    std::fs::write(pki.path("server.key"), "not a key").unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !node.log_text().contains("keeping the previous certificate") {
        if Instant::now() > deadline {
            bail_log(&node);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, seen) = tls_connect(addr, &ca).await.unwrap();
    assert_eq!(seen, second, "a bad file must not replace the certificate");
}

/// A TLS stream to `addr` presenting the test client certificate (CN `device-17`),
/// or none.
async fn tls_with_certificate(
    pki: &Pki,
    addr: std::net::SocketAddr,
    with_cert: bool,
) -> rocketgate_tls::tokio_rustls::client::TlsStream<TcpStream> {
    let ca = pki.path("ca.pem");
    let config = if with_cert {
        rocketgate_tls::client_config_with_certificate(
            &ca,
            &pki.path("client.pem"),
            &pki.path("client.key"),
        )
        .unwrap()
    } else {
        rocketgate_tls::client_config(&ca).unwrap()
    };
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap()
}

/// One remoting request on `io` and its answer (our codec).
async fn remoting_call<IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    io: &mut IO,
    cmd: rocketgate_remoting::RemotingCommand,
) -> rocketgate_remoting::RemotingCommand {
    let codec = rocketgate_remoting::FrameCodec::default();
    let mut buf = bytes::BytesMut::new();
    codec.encode(&cmd, &mut buf).unwrap();
    io.write_all(&buf).await.unwrap();
    buf.clear();
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(r) = codec.decode(&mut buf).unwrap() {
                return r;
            }
            assert!(io.read_buf(&mut buf).await.unwrap() > 0, "closed");
        }
    })
    .await
    .expect("no answer")
}

/// With `auth.certificate_identity`, a verified client certificate is the user at
/// the WebSocket `/v1/ws` door (no token needed) and the native door (unsigned
/// requests), with that user's ACL; without a certificate the usual credentials
/// are asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_identity_on_websocket_and_native() {
    use futures_util::{SinkExt, StreamExt};
    use rocketgate_remoting::RemotingCommand;
    use rocketgate_remoting::code::{request, response};
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "device-17").unwrap();
    let users = dir.path().join("users.toml");
    std::fs::write(
        &users,
        r#"[[user]]
name = "device-17"
rules = [{ effect = "allow", actions = ["publish", "subscribe"], topics = ["a/#"], groups = ["g1"] }]
"#,
    )
    .unwrap();
    let node = start(
        &pki,
        &[
            ("ROCKETGATE_TLS__WS", "true"),
            ("ROCKETGATE_TLS__NATIVE", "enforcing"),
            ("ROCKETGATE_TLS__CLIENT_AUTH", "optional"),
            ("ROCKETGATE_AUTH__ENABLED", "true"),
            ("ROCKETGATE_AUTH__CERTIFICATE_IDENTITY", "true"),
            ("ROCKETGATE_AUTH__USERS_FILE", users.to_str().unwrap()),
        ],
    );

    // WSS with the certificate: no token, the ACL of device-17.
    let ws = node.addr("ws");
    let url = format!("wss://127.0.0.1:{}/v1/ws", ws.port());
    let tls = tls_with_certificate(&pki, ws, true).await;
    let (mut s, _) = tokio_tungstenite::client_async(url.clone(), tls)
        .await
        .unwrap();
    let mut ask = async |frame: &str| -> Value {
        s.send(Message::text(frame)).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(20), s.next())
                .await
                .unwrap()
            {
                Some(Ok(Message::Text(t))) => return serde_json::from_str(&t).unwrap(),
                Some(Ok(_)) => continue,
                other => panic!("connection ended: {other:?}"),
            }
        }
    };
    let ok = ask(r#"{"op":"publish","topic":"a","tag":"x","body":"by certificate","req":1}"#).await;
    assert_eq!(ok["type"], "send_result", "{ok}");
    let denied = ask(r#"{"op":"publish","topic":"b","body":"no","req":2}"#).await;
    assert_eq!(denied["code"], "forbidden", "{denied}");
    // Without a certificate: the first frame must be `auth`.
    let tls = tls_with_certificate(&pki, ws, false).await;
    let (mut anon, _) = tokio_tungstenite::client_async(url, tls).await.unwrap();
    anon.send(Message::text(
        r#"{"op":"publish","topic":"a","body":"no","req":1}"#,
    ))
    .await
    .unwrap();
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(20), anon.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
            Some(Ok(Message::Text(t))) => panic!("served without credentials: {t}"),
            Some(Ok(_)) => continue,
            other => panic!("ended without a close frame: {other:?}"),
        }
    };
    assert_eq!(closed, Some(1008));

    // Native, unsigned requests: the certificate's user may read `a`, not `b`.
    let native = node.addr("native");
    let max_offset = |topic: &str| {
        RemotingCommand::request(request::GET_MAX_OFFSET, 1)
            .with_field("topic", topic)
            .with_field("queueId", "0")
    };
    let mut with = tls_with_certificate(&pki, native, true).await;
    let r = remoting_call(&mut with, max_offset("a")).await;
    assert_eq!(r.code, response::SUCCESS, "{:?}", r.remark);
    let r = remoting_call(&mut with, max_offset("b")).await;
    assert_eq!(r.code, response::NO_PERMISSION, "{:?}", r.remark);
    assert!(r.remark.unwrap_or_default().contains("device-17"));
    let mut without = tls_with_certificate(&pki, native, false).await;
    let r = remoting_call(&mut without, max_offset("a")).await;
    assert_eq!(r.code, response::NO_PERMISSION, "{:?}", r.remark);
    assert!(r.remark.unwrap_or_default().contains("not signed"));
}

fn bail_log(node: &Node) -> ! {
    panic!("the bad key was never reported\n{}", node.log_tail())
}

/// `rocketgate admin --server https://…`: trusted with `--cacert` (or
/// `ROCKETGATE_CACERT`), by host name and by IP address; a certificate from another
/// CA is refused with a clear message (exit 3), and plain http to a TLS door fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_talks_https_trusting_only_the_given_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "unused").unwrap();
    let node = start(&pki, &[("ROCKETGATE_TLS__HTTP", "true")]);
    let port = node.addr("http").port();
    let admin = |server: &str, env: &[(&str, String)], extra: &[&str]| {
        let mut c = Command::new(interop_tests::binary().unwrap());
        c.env_remove("ROCKETGATE_CACERT")
            .args(["admin", "--server", server])
            .args(extra)
            .args(["--json", "broker", "status"]);
        for (k, v) in env {
            c.env(k, v);
        }
        run(&mut c).unwrap()
    };
    let ca = path(&pki, "ca.pem");
    for host in ["localhost", "127.0.0.1"] {
        let out = admin(&format!("https://{host}:{port}"), &[], &["--cacert", &ca]);
        assert!(
            out.status.success(),
            "{host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["broker_name"].is_string(), "{v}");
    }
    let server = format!("https://localhost:{port}");
    let by_env = admin(&server, &[("ROCKETGATE_CACERT", ca.clone())], &[]);
    assert!(
        by_env.status.success(),
        "{}",
        String::from_utf8_lossy(&by_env.stderr)
    );
    let wrong = admin(&server, &[], &["--cacert", &path(&pki, "wrong-ca.pem")]);
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(3), "{err}");
    assert!(err.contains("TLS") && err.contains("certificate"), "{err}");
    let missing = admin(&server, &[], &["--cacert", "/no/such/ca.pem"]);
    assert_eq!(missing.status.code(), Some(1));
    let plain = admin(&format!("http://127.0.0.1:{port}"), &[], &[]);
    assert_ne!(plain.status.code(), Some(0), "plain http to a TLS door");
}
