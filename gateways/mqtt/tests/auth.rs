//! Authentication and the ACL at the MQTT door, through the socket with real
//! clients: mosquitto_pub/sub and paho-mqtt with good, bad and missing credentials,
//! the ACL matrix of issue #26 (a user allowed on `a/#` only, on 3.1.1 and 5, exact
//! reason codes), `auth.deny_action = disconnect`, and a JWT password whose expiry
//! ends the connection.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mqttbytes::QoS;
use mqttbytes::v5::{self, Packet};
use rocketgate_auth::{Action, Auth, Rule, UserEntry, store};
use rocketgate_config::DenyAction;
use support::{Node, Raw, WAIT};
use tokio::process::Command;

const JWT_SECRET: &str = "jwt-test-secret";

fn auth(dir: &std::path::Path, deny: DenyAction) -> Arc<Auth> {
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.join("users.toml");
    s.deny_action = deny;
    s.jwt_secret = Some(JWT_SECRET.as_bytes().to_vec());
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "alice".into(),
            password: store::hash_password(b"alice-pw"),
            rules: vec![Rule::allow(&[Action::Publish, Action::Subscribe], &["a/#"])],
            ..UserEntry::default()
        });
        f.upsert(UserEntry {
            name: "root".into(),
            password: store::hash_password(b"root-pw"),
            roles: vec!["admin".into()],
            ..UserEntry::default()
        });
    })
    .unwrap();
    auth
}

async fn node(dir: &std::path::Path, deny: DenyAction) -> Node {
    let mut settings = support::settings(dir);
    settings.auth = auth(dir, deny);
    Node::start_with(dir, settings).await
}

async fn login_v5(node: &Node, client: &str, user: &str, password: &str) -> (Raw, v5::ConnAck) {
    let mut raw = Raw::connect(node.addr).await;
    let mut c = v5::Connect::new(client);
    c.keep_alive = 60;
    c.login = Some(v5::Login::new(user, password));
    raw.send(Packet::Connect(c)).await;
    match raw.recv().await {
        Some(Packet::ConnAck(a)) => (raw, a),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

async fn mosquitto(program: &str, node: &Node, args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        WAIT,
        Command::new(program)
            .args(["-h", "127.0.0.1", "-p", &node.port().to_string()])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("mosquitto client finished in time")
    .expect("mosquitto clients are installed (scripts/install-test-deps)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_pub_with_good_bad_and_missing_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path(), DenyAction::Ignore).await;
    for v in ["mqttv311", "mqttv5"] {
        let good = mosquitto(
            "mosquitto_pub",
            &node,
            &[
                "-V", v, "-u", "alice", "-P", "alice-pw", "-t", "a/x", "-m", "hi", "-q", "1",
            ],
        )
        .await;
        assert!(good.status.success(), "{v}: {good:?}");
        let bad = mosquitto(
            "mosquitto_pub",
            &node,
            &[
                "-V", v, "-u", "alice", "-P", "wrong", "-t", "a/x", "-m", "hi", "-q", "1",
            ],
        )
        .await;
        let err = String::from_utf8_lossy(&bad.stderr).to_lowercase();
        assert!(!bad.status.success(), "{v}: a bad password was let in");
        assert!(err.contains("bad user name or password"), "{v}: {err}");
        let missing = mosquitto(
            "mosquitto_pub",
            &node,
            &["-V", v, "-t", "a/x", "-m", "hi", "-q", "1"],
        )
        .await;
        let err = String::from_utf8_lossy(&missing.stderr).to_lowercase();
        assert!(!missing.status.success(), "{v}: no credentials were let in");
        assert!(err.contains("not authori"), "{v}: {err}");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_with_good_bad_and_missing_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path(), DenyAction::Ignore).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/paho_auth.py");
    let out = tokio::time::timeout(
        WAIT * 2,
        Command::new("python3")
            .args([
                script,
                "127.0.0.1",
                &node.port().to_string(),
                "alice",
                "alice-pw",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .expect("python3 with paho-mqtt (scripts/install-test-deps)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    node.stop().await;
}

/// Issue #26's matrix on MQTT 5: alice may use `a/#` only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_matrix_v5_reason_codes() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path(), DenyAction::Ignore).await;
    let (_, bad) = login_v5(&node, "x", "alice", "nope").await;
    assert_eq!(bad.code, v5::ConnectReturnCode::BadUserNamePassword);
    let (mut c, ack) = login_v5(&node, "alice-1", "alice", "alice-pw").await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let mut sub = v5::Subscribe::new_many([
        v5::SubscribeFilter::new("a/x".into(), QoS::AtLeastOnce),
        v5::SubscribeFilter::new("b/x".into(), QoS::AtLeastOnce),
        v5::SubscribeFilter::new("#".into(), QoS::AtLeastOnce),
        v5::SubscribeFilter::new("%DLQ%g".into(), QoS::AtLeastOnce),
    ]);
    sub.pkid = 1;
    c.send(Packet::Subscribe(sub)).await;
    match c.recv().await {
        Some(Packet::SubAck(a)) => assert_eq!(
            a.return_codes,
            vec![
                v5::SubscribeReasonCode::QoS1,
                v5::SubscribeReasonCode::NotAuthorized,
                v5::SubscribeReasonCode::NotAuthorized,
                v5::SubscribeReasonCode::NotAuthorized,
            ]
        ),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    let publish = |topic: &str, qos: QoS, pkid: u16| {
        let mut p = v5::Publish::new(topic, qos, topic.as_bytes().to_vec());
        p.pkid = pkid;
        Packet::Publish(p)
    };
    for (i, (topic, ok)) in [("b/x", false), ("%DLQ%g", false), ("a/x", true)]
        .into_iter()
        .enumerate()
    {
        c.send(publish(topic, QoS::AtLeastOnce, 10 + i as u16))
            .await;
        loop {
            match c.recv().await {
                Some(Packet::PubAck(a)) => {
                    let want = if ok {
                        v5::PubAckReason::Success
                    } else {
                        v5::PubAckReason::NotAuthorized
                    };
                    assert_eq!(a.reason, want, "{topic}");
                    break;
                }
                Some(Packet::Publish(_)) => continue,
                other => panic!("expected PUBACK for {topic}, got {other:?}"),
            }
        }
    }
    c.send(publish("b/x", QoS::ExactlyOnce, 20)).await;
    loop {
        match c.recv().await {
            Some(Packet::PubRec(r)) => {
                assert_eq!(r.reason, v5::PubRecReason::NotAuthorized);
                break;
            }
            Some(Packet::Publish(_)) => continue,
            other => panic!("expected PUBREC, got {other:?}"),
        }
    }
    node.stop().await;
}

/// The matrix on 3.1.1 with mosquitto: SUBACK 0x80 per denied filter, a denied
/// QoS 1 publish acknowledged and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_matrix_v311_with_mosquitto() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path(), DenyAction::Ignore).await;
    let out = mosquitto(
        "mosquitto_sub",
        &node,
        &[
            "-V", "mqttv311", "-u", "alice", "-P", "alice-pw", "-d", "-q", "1", "-W", "2", "-t",
            "a/x", "-t", "b/x", "-t", "#", "-t", "%DLQ%g",
        ],
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Subscribed (mid: 1): 1, 128, 128, 128"),
        "mosquitto_sub said: {text}"
    );
    // root (admin) watches b/x; alice's QoS 1 publish there is acked but dropped.
    let (mut root, ack) = login_v5(&node, "root-1", "root", "root-pw").await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let mut sub = v5::Subscribe::new("b/x", QoS::AtLeastOnce);
    sub.pkid = 1;
    root.send(Packet::Subscribe(sub)).await;
    assert!(matches!(root.recv().await, Some(Packet::SubAck(_))));
    let denied = mosquitto(
        "mosquitto_pub",
        &node,
        &[
            "-V", "mqttv311", "-u", "alice", "-P", "alice-pw", "-t", "b/x", "-m", "denied", "-q",
            "1",
        ],
    )
    .await;
    assert!(denied.status.success(), "acknowledged: {denied:?}");
    let mut p = v5::Publish::new("b/x", QoS::AtMostOnce, b"marker".to_vec());
    p.pkid = 0;
    root.send(Packet::Publish(p)).await;
    match root.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!(&p.payload[..], b"marker", "the denied publish was stored")
        }
        other => panic!("expected the marker, got {other:?}"),
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_action_disconnect_closes_with_0x87() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path(), DenyAction::Disconnect).await;
    let (mut c, _) = login_v5(&node, "alice-2", "alice", "alice-pw").await;
    let mut p = v5::Publish::new("b/x", QoS::AtLeastOnce, b"x".to_vec());
    p.pkid = 1;
    c.send(Packet::Publish(p)).await;
    assert_eq!(
        c.disconnect_reason().await,
        Some(v5::DisconnectReasonCode::NotAuthorized)
    );
    node.stop().await;
}

fn jwt(user: &str, exp: u64) -> String {
    use jsonwebtoken::{EncodingKey, Header, encode};
    encode(
        &Header::default(),
        &serde_json::json!({ "sub": user, "exp": exp }),
        &EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_password_works_until_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path(), DenyAction::Ignore).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (_, ack) = login_v5(&node, "j0", "", &jwt("alice", now - 60)).await;
    assert_eq!(
        ack.code,
        v5::ConnectReturnCode::BadUserNamePassword,
        "expired"
    );
    let started = std::time::Instant::now();
    let (mut c, ack) = login_v5(&node, "j1", "", &jwt("alice", now + 2)).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    assert_eq!(
        c.disconnect_reason().await,
        Some(v5::DisconnectReasonCode::NotAuthorized),
        "dropped when the token expires"
    );
    assert!(started.elapsed() >= Duration::from_secs(1));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_address_are_limited() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.path().join("users.toml");
    s.max_connections_per_address = 1;
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "alice".into(),
            password: store::hash_password(b"alice-pw"),
            ..UserEntry::default()
        })
    })
    .unwrap();
    let mut settings = support::settings(dir.path());
    settings.auth = auth;
    let node = Node::start_with(dir.path(), settings).await;
    let (mut first, ack) = login_v5(&node, "c1", "alice", "alice-pw").await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let (_, ack) = login_v5(&node, "c2", "alice", "alice-pw").await;
    assert_eq!(ack.code, v5::ConnectReturnCode::QuotaExceeded);
    first.send(Packet::Disconnect(v5::Disconnect::new())).await;
    assert!(first.recv().await.is_none(), "closed after DISCONNECT");
    // The place is free again once the first connection is gone.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, ack) = login_v5(&node, "c3", "alice", "alice-pw").await;
        if ack.code == v5::ConnectReturnCode::Success {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the place was never freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.stop().await;
}
