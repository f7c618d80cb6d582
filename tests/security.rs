//! The secure defaults of the binary (issue #26): a door on a non-loopback address
//! with authentication off refuses to start with the documented message, unless
//! `--allow-anonymous`; `rocketgate user add` creates the first admin, and a node
//! with auth on lets that admin in on every door (MQTT with mosquitto_pub, HTTP with
//! curl) and nobody without credentials; its broker registers with its embedded
//! NameServer using the internal credential.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    c.env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
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
