//! Authentication and the ACL at the HTTP door, with the real `curl`: 401 JSON
//! without (valid) credentials, Bearer API keys and Basic, 403 JSON when the ACL
//! says no (issue #26's matrix: a user allowed on `a/#` only), the admin API only
//! for admins, and users managed over the admin API taking effect at once.

mod support;

use std::sync::Arc;

use rocketgate_auth::{Action, Auth, Rule, UserEntry, store};
use serde_json::Value;
use support::*;

fn auth(dir: &std::path::Path) -> Arc<Auth> {
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.join("users.toml");
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "alice".into(),
            password: store::hash_password(b"alice-pw"),
            api_keys: vec![store::hash_api_key("alice-key")],
            rules: vec![Rule {
                groups: vec!["g1".into()],
                ..Rule::allow(&[Action::Publish, Action::Subscribe], &["a/#"])
            }],
            ..UserEntry::default()
        });
        f.upsert(UserEntry {
            name: "watcher".into(),
            api_keys: vec![store::hash_api_key("watcher-key")],
            roles: vec!["monitor".into()],
            ..UserEntry::default()
        });
        f.upsert(UserEntry {
            name: "tagger".into(),
            api_keys: vec![store::hash_api_key("tagger-key")],
            rules: vec![Rule::allow(&[Action::Publish], &["t/ok"])],
            ..UserEntry::default()
        });
        f.upsert(UserEntry {
            name: "root".into(),
            api_keys: vec![store::hash_api_key("root-key")],
            roles: vec!["admin".into()],
            ..UserEntry::default()
        });
    })
    .unwrap();
    auth
}

async fn curl_json(args: Vec<String>) -> (u16, Value) {
    let (status, body) = curl_async(args).await;
    let v = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)))
    };
    (status, v)
}

fn bearer(key: &str) -> Vec<String> {
    vec!["-H".into(), format!("Authorization: Bearer {key}")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_with_and_without_credentials_and_the_acl_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings();
    settings.auth = auth(dir.path());
    let node = start_with(settings, broker_options()).await;
    let base = format!("http://{}", node.addr);
    let publish = |topic: &str, tag: &str| format!("{base}/v1/topics/{topic}/messages?tag={tag}");

    // No credentials: 401 with a JSON body; a wrong key or password: 401 too.
    let (status, body) =
        curl_json(vec!["--data-binary".into(), "x".into(), publish("a", "x")]).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "unauthorized");
    let mut wrong = bearer("nope");
    wrong.extend(["--data-binary".into(), "x".into(), publish("a", "x")]);
    assert_eq!(curl_json(wrong).await.0, 401);
    let (status, _) = curl_json(vec![
        "-u".into(),
        "alice:wrong".into(),
        "--data-binary".into(),
        "x".into(),
        publish("a", "x"),
    ])
    .await;
    assert_eq!(status, 401);
    // Health stays open for probes.
    assert_eq!(curl_json(vec![format!("{base}/health")]).await.0, 200);

    // The matrix, with a Bearer key and with Basic.
    for auth in [
        bearer("alice-key"),
        vec!["-u".into(), "alice:alice-pw".into()],
    ] {
        let with = |mut rest: Vec<String>| {
            let mut a = auth.clone();
            a.append(&mut rest);
            a
        };
        let (s, _) = curl_json(with(vec![
            "--data-binary".into(),
            "m".into(),
            publish("a", "x"),
        ]))
        .await;
        assert_eq!(s, 201, "publish a/x");
        let (s, body) = curl_json(with(vec![
            "--data-binary".into(),
            "m".into(),
            publish("b", "x"),
        ]))
        .await;
        assert_eq!(s, 403, "publish b/x");
        assert_eq!(body["error"]["code"], "forbidden");
        let (s, _) = curl_json(with(vec![
            "--data-binary".into(),
            "m".into(),
            format!("{base}/v1/topics/%25DLQ%25g1/messages"),
        ]))
        .await;
        assert_eq!(s, 403, "publish to an internal topic");
        // Subscribe (receive as group g1).
        let (s, _) = curl_json(with(vec![format!("{base}/v1/groups/g1/topics/a/messages")])).await;
        assert_eq!(s, 200, "receive a as g1");
        let (s, _) = curl_json(with(vec![format!("{base}/v1/groups/g1/topics/b/messages")])).await;
        assert_eq!(s, 403, "receive b");
        let (s, _) = curl_json(with(vec![format!(
            "{base}/v1/groups/other/topics/a/messages"
        )]))
        .await;
        assert_eq!(s, 403, "receive as a group not granted");
        let (s, _) = curl_json(with(vec![format!(
            "{base}/v1/groups/g1/topics/SCHEDULE_TOPIC_XXXX/messages"
        )]))
        .await;
        assert_eq!(s, 403, "receive an internal topic");
        // Admin API: not for alice.
        let (s, body) = curl_json(with(vec![format!("{base}/v1/topics")])).await;
        assert_eq!(s, 403, "{body}");
    }
    let (s, _) = curl_json({
        let mut a = bearer("root-key");
        a.push(format!("{base}/v1/topics"));
        a
    })
    .await;
    assert_eq!(s, 200, "admins use the admin API");
    node.stop().await;
}

/// A batch publish checks every message's `topic/tag`: one message whose tag the
/// ACL denies refuses the whole batch with 403 naming it, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_one_denied_tag_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings();
    settings.auth = auth(dir.path());
    let node = start_with(settings, broker_options()).await;
    let base = format!("http://{}", node.addr);
    let batch = |key: &str, topic: &str, body: serde_json::Value| {
        let mut a = bearer(key);
        a.extend([
            "-H".into(),
            "content-type: application/json".into(),
            "--data-binary".into(),
            body.to_string(),
            format!("{base}/v1/topics/{topic}/messages/batch?queue=0"),
        ]);
        a
    };
    let mixed = serde_json::json!([
        {"body": "denied-1", "tag": "ok"},
        {"body": "denied-2", "tag": "bad"},
    ]);
    let (s, body) = curl_json(batch("tagger-key", "t", mixed)).await;
    assert_eq!(s, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("t/bad") && message.contains("[1]"),
        "{message}"
    );
    let untagged = serde_json::json!([{"body": "denied-3"}]);
    assert_eq!(curl_json(batch("tagger-key", "t", untagged)).await.0, 403);
    let (s, _) = curl_json(batch("alice-key", "b", serde_json::json!([{"body": "x"}]))).await;
    assert_eq!(s, 403, "a topic alice may not publish to");
    let (s, _) = curl_async(vec![
        "--data-binary".into(),
        "[{\"body\":\"x\"}]".into(),
        format!("{base}/v1/topics/t/messages/batch"),
    ])
    .await;
    assert_eq!(s, 401, "still authenticated first");
    let good = serde_json::json!([
        {"body": "ok-1", "tag": "ok"},
        {"body": "ok-2", "tag": "ok"},
    ]);
    let (s, body) = curl_json(batch("tagger-key", "t", good)).await;
    assert_eq!(s, 201, "{body}");
    let (s, stored) = curl_async({
        let mut a = bearer("root-key");
        a.push(format!(
            "{base}/v1/topics/t/queues/0/messages?offset=0&max=10"
        ));
        a
    })
    .await;
    let stored = String::from_utf8_lossy(&stored).into_owned();
    assert_eq!(s, 200, "{stored}");
    assert!(
        stored.contains("ok-1") && stored.contains("ok-2"),
        "{stored}"
    );
    assert!(
        !stored.contains("denied"),
        "nothing of a refused batch: {stored}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_managed_over_the_admin_api_take_effect_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings();
    settings.auth = auth(dir.path());
    let node = start_with(settings, broker_options()).await;
    let base = format!("http://{}", node.addr);
    let root = |mut rest: Vec<String>| {
        let mut a = bearer("root-key");
        a.append(&mut rest);
        a
    };
    let (s, body) = curl_json(root(vec![
        "-X".into(),
        "PUT".into(),
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        r#"{"password":"bob-pw","rules":[{"effect":"allow","actions":["publish"],"topics":["bob/#"]}]}"#.into(),
        format!("{base}/v1/users/bob"),
    ]))
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["created"], true);
    let (s, _) = curl_json(vec![
        "-u".into(),
        "bob:bob-pw".into(),
        "--data-binary".into(),
        "hi".into(),
        format!("{base}/v1/topics/bob/messages?tag=x"),
    ])
    .await;
    assert_eq!(s, 201);
    let (s, body) = curl_json(root(vec![
        "-X".into(),
        "POST".into(),
        format!("{base}/v1/users/bob/api_keys"),
    ]))
    .await;
    assert_eq!(s, 200);
    let key = body["api_key"].as_str().unwrap().to_owned();
    let mut with_key = bearer(&key);
    with_key.extend([
        "--data-binary".into(),
        "hi".into(),
        format!("{base}/v1/topics/bob/messages"),
    ]);
    assert_eq!(curl_json(with_key.clone()).await.0, 201);
    let (s, body) = curl_json(root(vec![format!("{base}/v1/users")])).await;
    assert_eq!(s, 200);
    assert!(
        !body.to_string().contains("argon2"),
        "no secrets listed: {body}"
    );
    let (s, _) = curl_json(root(vec![
        "-X".into(),
        "DELETE".into(),
        format!("{base}/v1/users/bob"),
    ]))
    .await;
    assert_eq!(s, 204);
    assert_eq!(
        curl_json(with_key).await.0,
        401,
        "a deleted user's key is void at once"
    );
    node.stop().await;
}

/// The built-in `monitor` role reads the admin API (what the dashboard shows) and
/// changes nothing; `GET /v1/session` tells a page which it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_reads_the_admin_api_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = settings();
    settings.auth = auth(dir.path());
    let node = start_with(settings, broker_options()).await;
    let base = format!("http://{}", node.addr);
    let call = |key: &str, extra: &[&str], path: &str| {
        let mut a = bearer(key);
        a.extend(extra.iter().map(|s| s.to_string()));
        a.push(format!("{base}{path}"));
        curl_json(a)
    };
    let json = ["-H", "content-type: application/json", "-d"];
    let create = [&json[..], &[r#"{"name":"t1","queues":2}"#]].concat();
    assert_eq!(call("root-key", &create, "/v1/topics").await.0, 201);

    let (status, me) = call("watcher-key", &[], "/v1/session").await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["user"], "watcher");
    assert_eq!(me["admin"], false);
    assert_eq!(me["monitor"], true);
    let (_, me) = call("root-key", &[], "/v1/session").await;
    assert_eq!(
        (me["admin"].clone(), me["monitor"].clone()),
        (true.into(), true.into())
    );
    let (_, me) = call("alice-key", &[], "/v1/session").await;
    assert_eq!(
        (me["admin"].clone(), me["monitor"].clone()),
        (false.into(), false.into())
    );
    assert_eq!(curl_json(vec![format!("{base}/v1/session")]).await.0, 401);

    // Reads: allowed.
    for path in [
        "/v1/topics",
        "/v1/topics/t1",
        "/v1/groups",
        "/v1/broker",
        "/v1/topics/t1/status",
    ] {
        let (status, body) = call("watcher-key", &[], path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
    }
    // Changes, and the user list: refused.
    let create2 = [&json[..], &[r#"{"name":"t2"}"#]].concat();
    let (status, body) = call("watcher-key", &create2, "/v1/topics").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    let resend = [&json[..], &[r#"{"all":true}"#]].concat();
    assert_eq!(
        call("watcher-key", &resend, "/v1/groups/g1/dlq/resend")
            .await
            .0,
        403
    );
    assert_eq!(
        call("watcher-key", &["-X", "DELETE"], "/v1/topics/t1")
            .await
            .0,
        403
    );
    assert_eq!(call("watcher-key", &[], "/v1/users").await.0, 403);
    // A user without monitor reads nothing of the admin API.
    assert_eq!(call("alice-key", &[], "/v1/topics").await.0, 403);
}
