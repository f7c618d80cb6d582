//! RocketMQ's request signature and the ACL at the native door, with our Rust
//! client signing as RocketMQ's ACL hook does: good credentials work, a wrong
//! secret and an unsigned client get NO_PERMISSION with a remark, and issue #26's
//! matrix (a user allowed on `a/#` only, consuming as group `g1`).

mod common;

use std::sync::Arc;

use common::{Cluster, Conn, WAIT};
use rocketgate_auth::{AccessKey, Action, Auth, Rule, UserEntry, sign};
use rocketgate_native::client::{Message, Producer, PullConsumer};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;

fn auth(dir: &std::path::Path) -> Arc<Auth> {
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.join("users.toml");
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "alice".into(),
            access_keys: vec![AccessKey {
                access_key: "alice-ak".into(),
                secret_key: "alice-sk".into(),
            }],
            rules: vec![Rule {
                groups: vec!["g1".into()],
                ..Rule::allow(&[Action::Publish, Action::Subscribe], &["a/#"])
            }],
            ..UserEntry::default()
        });
        f.upsert(UserEntry {
            name: "root".into(),
            access_keys: vec![AccessKey {
                access_key: "root-ak".into(),
                secret_key: "root-sk".into(),
            }],
            roles: vec!["admin".into()],
            ..UserEntry::default()
        });
    })
    .unwrap();
    auth
}

/// A pull of `topic` as `group`, signed as alice.
fn pull(topic: &str, group: &str) -> RemotingCommand {
    let mut cmd = RemotingCommand::request(request::PULL_MESSAGE, 0);
    for (k, v) in [
        ("consumerGroup", group),
        ("topic", topic),
        ("queueId", "0"),
        ("queueOffset", "0"),
        ("maxMsgNums", "32"),
        ("sysFlag", "0"),
        ("commitOffset", "0"),
        ("suspendTimeoutMillis", "0"),
        ("subscription", "*"),
        ("subVersion", "0"),
    ] {
        cmd.ext_fields.insert(k.to_owned(), v.to_owned());
    }
    cmd.ext_fields
        .insert(sign::ACCESS_KEY, "alice-ak".to_owned());
    let sig = sign::signature(b"alice-sk", cmd.ext_fields.iter(), &cmd.body);
    cmd.ext_fields.insert(sign::SIGNATURE, sig);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_clients_and_the_acl_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start_with_auth(auth(dir.path())).await;
    let alice = Producer::start(
        cluster.config().with_credentials("alice-ak", "alice-sk"),
        "pg",
    )
    .await
    .unwrap();
    // The broker registers with the NameServer just after start: until then a send
    // finds no route (not a permission matter), so the first one is retried.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match alice.send(Message::new("a", "hello").with_tag("x")).await {
            Ok(_) => break,
            Err(e)
                if format!("{e:?}").contains("NoRoute")
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("alice publishes to a/x: {e:?}"),
        }
    }
    for (topic, tag) in [("b", "x"), ("%DLQ%g1", "")] {
        let mut m = Message::new(topic, "no");
        if !tag.is_empty() {
            m = m.with_tag(tag);
        }
        let err = alice.send(m).await.unwrap_err();
        assert_eq!(err.code(), Some(response::NO_PERMISSION), "{topic}: {err}");
        assert!(format!("{err:?}").contains("not allowed"), "{err:?}");
    }
    // Creating topics is an admin request.
    let err = alice.create_topic("c", 1).await.unwrap_err();
    assert_eq!(err.code(), Some(response::NO_PERMISSION), "{err}");
    let root = Producer::start(
        cluster.config().with_credentials("root-ak", "root-sk"),
        "pg",
    )
    .await
    .unwrap();
    root.create_topic("c", 1)
        .await
        .expect("admins create topics");

    // A wrong secret, and no credentials at all.
    let wrong = Producer::start(cluster.config().with_credentials("alice-ak", "nope"), "pg")
        .await
        .unwrap();
    let err = wrong.send(Message::new("a", "x")).await.unwrap_err();
    assert_eq!(err.code(), Some(response::NO_PERMISSION), "{err}");
    assert!(format!("{err:?}").contains("signature"), "{err:?}");
    let anonymous = Producer::start(cluster.config(), "pg").await.unwrap();
    let err = anonymous.send(Message::new("a", "x")).await.unwrap_err();
    assert_eq!(err.code(), Some(response::NO_PERMISSION), "{err}");
    assert!(format!("{err:?}").contains("not signed"), "{err:?}");

    // Reading: a as g1 works through the client; the rest is refused.
    let consumer = PullConsumer::start(
        cluster.config().with_credentials("alice-ak", "alice-sk"),
        "g1",
    )
    .await
    .unwrap();
    let queues = consumer.queues("a").await.unwrap();
    consumer.assign(queues, "*").await.unwrap();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while got.is_empty() && tokio::time::Instant::now() < deadline {
        got.extend(
            consumer
                .poll(std::time::Duration::from_secs(1))
                .await
                .unwrap(),
        );
    }
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body.as_ref(), b"hello");
    let mut conn = Conn::connect(cluster.broker_addr).await;
    for (topic, group) in [
        ("b", "g1"),
        ("#", "g1"),
        ("a", "g2"),
        ("SCHEDULE_TOPIC_XXXX", "g1"),
        ("%DLQ%g2", "g2"),
    ] {
        let resp = conn.ask(pull(topic, group)).await;
        assert_eq!(
            resp.code,
            response::NO_PERMISSION,
            "pull {topic} as {group}: {:?}",
            resp.remark
        );
    }
    // The group's own retry topic is open to it (a push consumer subscribes by itself).
    let resp = conn.ask(pull("%RETRY%g1", "g1")).await;
    assert_ne!(resp.code, response::NO_PERMISSION, "{:?}", resp.remark);
    consumer.shutdown().await;
    for p in [alice, root, wrong, anonymous] {
        p.shutdown().await;
    }
}
