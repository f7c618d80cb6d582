//! The secure defaults of the binary (issue #26): a door on a non-loopback address
//! with authentication off refuses to start with the documented message, unless
//! `--allow-anonymous`; `rocketgate user add` creates the first admin, and a node
//! with auth on lets that admin in on every door (MQTT with mosquitto_pub, HTTP with
//! curl) and nobody without credentials; its broker registers with its embedded
//! NameServer using the internal credential. On `/v1/ws` a JWT's `exp` ends the
//! connection (an error frame `token_expired`, then close 4401), and every door
//! but MQTT (tested in its crate) refuses connections over
//! `auth.max_connections_per_address`: HTTP 429 JSON, WebSocket close 1013, native
//! closed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    c.env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB")
        .env_remove("ROCKETGATE_AUTH__ENABLED");
    c
}

const FREE_PORTS_EVERYWHERE: [&str; 10] = [
    "--namesrv",
    "0.0.0.0:0",
    "--native",
    "0.0.0.0:0",
    "--mqtt",
    "0.0.0.0:0",
    "--http",
    "0.0.0.0:0",
    "--ws",
    "0.0.0.0:0",
];

#[test]
fn a_public_address_without_auth_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .arg("standalone")
        .arg("--data-dir")
        .arg(dir.path())
        .args(FREE_PORTS_EVERYWHERE)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to start: authentication is off and listen.namesrv = 0.0.0.0:0"),
        "{err}"
    );
    assert!(err.contains("--allow-anonymous"), "{err}");
    assert!(
        err.contains("rocketgate user add admin --role admin"),
        "{err}"
    );
    assert!(
        !dir.path().join("abort").exists(),
        "refused before opening the store"
    );
}

/// Reads announced addresses until the ready line.
fn addresses(
    lines: &mut impl Iterator<Item = String>,
) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    for l in lines.by_ref() {
        if let Some(rest) = l.strip_prefix("rocketgate: ")
            && let Some((door, addr)) = rest.split_once(" listening on ")
        {
            // 0.0.0.0:P is reached on 127.0.0.1:P.
            out.insert(door.to_owned(), addr.replace("0.0.0.0", "127.0.0.1"));
        }
        if l.contains("ready") {
            break;
        }
    }
    out
}

#[test]
fn the_first_admin_and_a_public_node_with_auth() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let mut add = bin()
        .args([
            "user",
            "add",
            "admin",
            "--role",
            "admin",
            "--password-stdin",
            "--data-dir",
            data,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    add.stdin
        .take()
        .unwrap()
        .write_all(b"s3cret-admin\n")
        .unwrap();
    let out = add.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(dir.path().join("users.toml")).unwrap();
    assert!(
        text.contains("$argon2id$") && !text.contains("s3cret-admin"),
        "{text}"
    );

    let mut child = bin()
        .arg("standalone")
        .args(["--data-dir", data])
        .args(FREE_PORTS_EVERYWHERE)
        .env("ROCKETGATE_AUTH__ENABLED", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    let addrs = addresses(&mut lines);
    let mqtt = addrs["mqtt"].rsplit_once(':').unwrap().1.to_owned();
    let http = addrs["http"].clone();

    let publish = |user: &[&str]| {
        Command::new("mosquitto_pub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &mqtt,
                "-t",
                "t/x",
                "-m",
                "hi",
                "-q",
                "1",
            ])
            .args(user)
            .output()
            .unwrap()
    };
    assert!(
        publish(&["-u", "admin", "-P", "s3cret-admin"])
            .status
            .success()
    );
    assert!(!publish(&[]).status.success());
    let curl = |extra: &[&str], path: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(extra)
            .arg(format!("http://{http}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl(&[], "/v1/topics"), "401");
    assert_eq!(curl(&["-u", "admin:s3cret-admin"], "/v1/topics"), "200");
    // The broker signed its registration with the internal credential: the cluster
    // view lists it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new("curl")
            .args(["-s", "-u", "admin:s3cret-admin"])
            .arg(format!("http://{http}/v1/cluster"))
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("broker-a") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the broker never registered: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

#[test]
fn allow_anonymous_starts_deliberately_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .arg("standalone")
        .arg("--data-dir")
        .arg(dir.path())
        .args(FREE_PORTS_EVERYWHERE)
        .arg("--allow-anonymous")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    let addrs = addresses(&mut lines);
    assert!(addrs.contains_key("http"));
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

/// The WebSocket door's token seam backed by the user store: an API key in
/// `?token=` is the user, and the ACL answers `forbidden` error frames.
#[test]
fn websocket_tokens_and_the_acl() {
    use futures_util::{SinkExt, StreamExt};
    use rocketgate_auth::{Action, Rule, UserEntry, UserFile, store};
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let mut users = UserFile::default();
    users.upsert(UserEntry {
        name: "alice".into(),
        api_keys: vec![store::hash_api_key("alice-key")],
        rules: vec![Rule {
            groups: vec!["g1".into()],
            ..Rule::allow(&[Action::Publish, Action::Subscribe], &["a/#"])
        }],
        ..UserEntry::default()
    });
    users.save(&dir.path().join("users.toml")).unwrap();
    let mut child = bin()
        .arg("standalone")
        .arg("--data-dir")
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
        .env("ROCKETGATE_AUTH__ENABLED", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok);
    let ws = addresses(&mut lines)["ws"].clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A bad token: the upgrade is refused with 401.
        let bad = tokio_tungstenite::connect_async(format!("ws://{ws}/v1/ws?token=nope")).await;
        match bad {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
            other => panic!("expected a 401, got {other:?}"),
        }
        let (mut s, _) =
            tokio_tungstenite::connect_async(format!("ws://{ws}/v1/ws?token=alice-key"))
                .await
                .unwrap();
        let mut ask = async |frame: &str| -> serde_json::Value {
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
        let ok = ask(r#"{"op":"publish","topic":"a","tag":"x","body":"hi","req":1}"#).await;
        assert_eq!(ok["type"], "send_result", "{ok}");
        for frame in [
            r#"{"op":"publish","topic":"b","tag":"x","body":"no","req":2}"#,
            r#"{"op":"publish","topic":"%DLQ%g1","body":"no","req":3}"#,
            r#"{"op":"subscribe","id":"s1","topic":"b","group":"g1","req":4}"#,
            r#"{"op":"subscribe","id":"s2","topic":"a","group":"g2","req":5}"#,
        ] {
            let e = ask(frame).await;
            assert_eq!(
                (e["type"].as_str(), e["code"].as_str()),
                (Some("error"), Some("forbidden")),
                "{frame}: {e}"
            );
        }
        let sub = ask(r#"{"op":"subscribe","id":"s3","topic":"a","group":"g1","req":6}"#).await;
        assert_eq!(sub["type"], "subscribed", "{sub}");
    });
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

/// The ACL's list of internal topics (`rocketgate-auth`, which may not import the
/// core) is the core's list of system topics.
#[test]
fn internal_topics_are_the_cores_system_topics() {
    use rocketgate_core::broker::schedule::is_system_topic;
    for t in [
        "%RETRY%g",
        "%DLQ%g",
        "SCHEDULE_TOPIC_XXXX",
        "SCHEDULE_TOPIC_XXXX_V2",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "BenchmarkTest",
        "TBW102",
        "rmq_sys_wheel_timer",
        "rmq_sys_anything",
        "orders",
        "%MQTT%x",
        "a",
    ] {
        assert_eq!(
            rocketgate_auth::acl::is_internal_topic(t),
            is_system_topic(t),
            "{t}"
        );
    }
}

/// A node started by a test, stopped (SIGTERM, then SIGKILL) when dropped, also
/// when the test panics.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rocketgate standalone` on free loopback ports with `env`; its door addresses.
fn standalone(
    data: &std::path::Path,
    env: &[(&str, &str)],
) -> (Running, std::collections::HashMap<String, String>) {
    let mut cmd = bin();
    cmd.arg("standalone")
        .arg("--data-dir")
        .arg(data)
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
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let running = Running(child);
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let addrs = addresses(&mut lines);
    // Keep reading so the node never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (running, addrs)
}

const JWT_SECRET: &str = "ws-jwt-test-secret";

fn jwt(user: &str, exp: u64) -> String {
    use jsonwebtoken::{EncodingKey, Header, encode};
    encode(
        &Header::default(),
        &serde_json::json!({ "sub": user, "exp": exp }),
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap()
}

/// Reads frames until the connection closes: the text frames seen, and the close
/// code (`None` when the connection ended without a close frame).
async fn until_closed<S>(s: &mut S) -> (Vec<serde_json::Value>, Option<u16>)
where
    S: futures_util::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), s.next()).await {
            Err(_) => panic!("not closed within 30 s; frames so far: {texts:?}"),
            Ok(Some(Ok(Message::Text(t)))) => texts.push(serde_json::from_str(&t).unwrap()),
            Ok(Some(Ok(Message::Close(frame)))) => {
                return (texts, frame.map(|f| u16::from(f.code)));
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_)) | None) => return (texts, None),
        }
    }
}

/// A `/v1/ws` connection authenticated with a JWT ends when the token expires:
/// an error frame `token_expired`, then close code 4401, whether the token came in
/// the query string or in the `auth` frame. An expired token is refused at once.
#[test]
fn websocket_connections_end_when_their_jwt_expires() {
    use futures_util::SinkExt;
    use rocketgate_auth::{Action, Rule, UserEntry, UserFile};
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let mut users = UserFile::default();
    users.upsert(UserEntry {
        name: "alice".into(),
        rules: vec![Rule::allow(&[Action::Publish], &["a/#"])],
        ..UserEntry::default()
    });
    users.save(&dir.path().join("users.toml")).unwrap();
    let (_node, addrs) = standalone(
        dir.path(),
        &[
            ("ROCKETGATE_AUTH__ENABLED", "true"),
            ("ROCKETGATE_AUTH__JWT_SECRET", JWT_SECRET),
        ],
    );
    let ws = addrs["ws"].clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        // Past the 5 s leeway: refused at the upgrade.
        let old = jwt("alice", now - 60);
        match tokio_tungstenite::connect_async(format!("ws://{ws}/v1/ws?token={old}")).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
            other => panic!("expected a 401, got {other:?}"),
        }
        let token = jwt("alice", now + 2);
        let started = Instant::now();
        let (mut by_query, _) =
            tokio_tungstenite::connect_async(format!("ws://{ws}/v1/ws?token={token}"))
                .await
                .unwrap();
        let (mut by_frame, _) = tokio_tungstenite::connect_async(format!("ws://{ws}/v1/ws"))
            .await
            .unwrap();
        let auth = serde_json::json!({"op": "auth", "token": token, "req": "a"});
        by_frame
            .send(Message::text(auth.to_string()))
            .await
            .unwrap();
        // Both work until then.
        by_query
            .send(Message::text(
                r#"{"op":"publish","topic":"a","body":"x","req":1}"#,
            ))
            .await
            .unwrap();
        for (name, conn) in [("query", &mut by_query), ("frame", &mut by_frame)] {
            let (texts, code) = until_closed(conn).await;
            assert_eq!(code, Some(4401), "{name}: {texts:?}");
            let last = texts.last().unwrap_or_else(|| panic!("{name}: no frames"));
            assert_eq!(
                (last["type"].as_str(), last["code"].as_str()),
                (Some("error"), Some("token_expired")),
                "{name}: {texts:?}"
            );
            let first = &texts[0];
            assert!(
                first["type"] == "send_result" || first["type"] == "authenticated",
                "{name}: served before the expiry: {texts:?}"
            );
        }
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "not before exp"
        );
    });
}

/// Reads what the peer sends until it closes (or 20 s pass).
fn read_to_close(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `auth.max_connections_per_address = 2` at the HTTP, WebSocket and native doors:
/// two connections from 127.0.0.1 are served, a third is refused with the door's
/// answer (HTTP 429 JSON; WebSocket close 1013; native: closed), and once one
/// closes there is room again.
#[test]
fn connections_per_address_at_http_websocket_and_native() {
    use futures_util::SinkExt;
    use std::net::TcpStream;
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let (_node, addrs) = standalone(
        dir.path(),
        &[("ROCKETGATE_AUTH__MAX_CONNECTIONS_PER_ADDRESS", "2")],
    );
    let get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    let ask = |s: &mut TcpStream| {
        use std::io::Read;
        s.write_all(get).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };

    // HTTP: two keep-alive connections hold both places.
    let http = addrs["http"].clone();
    let mut one = TcpStream::connect(&http).unwrap();
    let mut two = TcpStream::connect(&http).unwrap();
    assert!(ask(&mut one).starts_with("HTTP/1.1 200"));
    assert!(ask(&mut two).starts_with("HTTP/1.1 200"));
    let mut three = TcpStream::connect(&http).unwrap();
    three.write_all(get).unwrap();
    let refused = read_to_close(&mut three);
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(
        refused.contains(r#""code":"too_many_connections""#),
        "{refused}"
    );
    assert!(ask(&mut one).starts_with("HTTP/1.1 200"), "the others stay");
    drop(two);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut again = TcpStream::connect(&http).unwrap();
        again.write_all(get).unwrap();
        if read_to_close_or_answer(&mut again).starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no room after a connection closed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // WebSocket: the third /v1/ws connection is closed with 1013.
    let ws = addrs["ws"].clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("ws://{ws}/v1/ws");
        let (mut a, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let (_b, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let (mut c, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let (_, code) = until_closed(&mut c).await;
        assert_eq!(code, Some(1013));
        a.send(Message::text(r#"{"op":"ping","req":"p"}"#))
            .await
            .unwrap();
        use futures_util::StreamExt;
        let pong = tokio::time::timeout(Duration::from_secs(20), a.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(pong.to_text().unwrap().contains("pong"), "{pong:?}");
    });

    // Native: the third connection is closed before any request is answered.
    let native = addrs["native"].clone();
    let _n1 = TcpStream::connect(&native).unwrap();
    let _n2 = TcpStream::connect(&native).unwrap();
    let mut n3 = TcpStream::connect(&native).unwrap();
    assert_eq!(read_to_close(&mut n3), "", "closed without an answer");
}

/// The answer to a request on a fresh connection: what arrives before the peer
/// closes or 20 s pass, or the first read of a keep-alive answer.
fn read_to_close_or_answer(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 4096];
    match s.read(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(_) => String::new(),
    }
}
