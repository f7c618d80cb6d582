//! `rocketgate admin` against a node with authentication on: no credentials or
//! a user without the admin role exit 4, an admin's password or API key work
//! (also from `ROCKETGATE_ADMIN_*`), users are managed over the API, and the
//! probes (`/healthz`, `/readyz`) stay open for health checks.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

struct Node {
    child: Child,
    http: String,
    _dir: tempfile::TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
    c.env("ROCKETGATE_AUTH__ENABLED", "true")
        .env("ROCKETGATE_STORE__DISK_HARD_RATIO", "1")
        .env("ROCKETGATE_STORE__SEGMENT_SIZE", "1MiB")
        .env("ROCKETGATE_STORE__MAX_MESSAGE_SIZE", "64KiB");
    c
}

fn user_add(dir: &std::path::Path, args: &[&str]) -> String {
    let out = bin()
        .args(["user", "add"])
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn start() -> (Node, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = user_add(
        dir.path(),
        &[
            "root",
            "--role",
            "admin",
            "--password",
            "s3cret",
            "--api-key",
        ],
    );
    let key = out
        .lines()
        .find_map(|l| l.strip_prefix("api key (shown once): "))
        .expect("an API key")
        .to_owned();
    user_add(dir.path(), &["alice", "--password", "alice-pw"]);
    let mut child = bin()
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
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut http = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("rocketgate: http listening on ") {
            http = a.to_owned();
        }
        if line.contains("standalone ready") {
            break;
        }
    }
    assert!(!http.is_empty());
    (
        Node {
            child,
            http,
            _dir: dir,
        },
        key,
    )
}

impl Node {
    fn admin(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rocketgate"));
        c.arg("admin")
            .args(["--server", &format!("http://{}", self.http)])
            .args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    }
}

fn code(o: &Output) -> Option<i32> {
    o.status.code()
}

#[test]
fn forbidden_is_exit_4_and_credentials_work() {
    let (node, key) = start();

    let none = node.admin(&[], &["topic", "list"]);
    assert_eq!(
        code(&none),
        Some(4),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
    assert!(String::from_utf8_lossy(&none.stderr).contains("401"));
    let wrong = node.admin(
        &[],
        &["--user", "root", "--password", "nope", "topic", "list"],
    );
    assert_eq!(code(&wrong), Some(4));
    let alice = node.admin(
        &[],
        &["--user", "alice", "--password", "alice-pw", "topic", "list"],
    );
    assert_eq!(code(&alice), Some(4), "no admin role");
    assert!(String::from_utf8_lossy(&alice.stderr).contains("403"));
    let bad = node.admin(&[], &["--user", "root", "topic", "list"]);
    assert_eq!(code(&bad), Some(1), "--user without --password");

    let root = node.admin(
        &[],
        &["--user", "root", "--password", "s3cret", "topic", "list"],
    );
    assert_eq!(
        code(&root),
        Some(0),
        "{}",
        String::from_utf8_lossy(&root.stderr)
    );
    let by_key = node.admin(&[], &["--api-key", &key, "--json", "broker", "status"]);
    assert_eq!(code(&by_key), Some(0));
    let by_env = node.admin(
        &[("ROCKETGATE_ADMIN_API_KEY", key.as_str())],
        &["topic", "list"],
    );
    assert_eq!(
        code(&by_env),
        Some(0),
        "{}",
        String::from_utf8_lossy(&by_env.stderr)
    );

    // The probes answer without credentials (container health checks).
    let health = node.admin(&[], &["health"]);
    assert_eq!(
        code(&health),
        Some(0),
        "{}",
        String::from_utf8_lossy(&health.stderr)
    );

    // Users over the API.
    let k = [("ROCKETGATE_ADMIN_API_KEY", key.as_str())];
    let add = node.admin(
        &k,
        &[
            "user",
            "add",
            "bob",
            "--new-password",
            "bob-pw",
            "--role",
            "admin",
        ],
    );
    assert_eq!(
        code(&add),
        Some(0),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    let list = node.admin(&k, &["user", "list"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("bob"));
    let bob = node.admin(
        &[],
        &["--user", "bob", "--password", "bob-pw", "topic", "list"],
    );
    assert_eq!(code(&bob), Some(0), "a new admin works at once");
    let api = node.admin(&k, &["user", "api-key", "bob"]);
    assert_eq!(code(&api), Some(0));
    let del = node.admin(&k, &["user", "delete", "bob"]);
    assert_eq!(code(&del), Some(0));
    let bob = node.admin(
        &[],
        &["--user", "bob", "--password", "bob-pw", "topic", "list"],
    );
    assert_eq!(code(&bob), Some(4), "a deleted user is refused");
}

/// `acl list|add|remove` change what a user may do at once: alice cannot publish to
/// `acl-t` until a rule allows it, and cannot again once it is removed (checked with
/// a real HTTP publish as alice).
#[test]
fn acl_rules_are_listed_added_and_removed() {
    let (node, key) = start();
    let k = [("ROCKETGATE_ADMIN_API_KEY", key.as_str())];
    let ok = |args: &[&str]| {
        let o = node.admin(&k, args);
        assert_eq!(
            code(&o),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    ok(&["topic", "create", "acl-t", "--queues", "1"]);
    let publish = || {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-u"])
            .arg("alice:alice-pw")
            .args(["--data-binary", "hello"])
            .arg(format!("http://{}/v1/topics/acl-t/messages", node.http))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(publish(), "403", "no rule yet");
    let out = ok(&[
        "acl", "add", "alice", "--action", "publish", "--topic", "acl-t/#",
    ]);
    assert!(out.contains("added rule 0 to alice"), "{out}");
    let table = ok(&["acl", "list", "alice"]);
    assert!(
        table.contains("alice") && table.contains("allow") && table.contains("acl-t/#"),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&["--json", "acl", "list"])).unwrap();
    let alice = v["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["user"] == "alice")
        .unwrap();
    assert_eq!(alice["rules"][0]["actions"], serde_json::json!(["publish"]));
    assert_eq!(publish(), "201", "the rule holds at once");
    let gone = node.admin(&k, &["acl", "remove", "alice", "5"]);
    assert_eq!(code(&gone), Some(2), "no rule 5");
    let nobody = node.admin(&k, &["acl", "add", "nobody", "--action", "publish"]);
    assert_eq!(code(&nobody), Some(2), "no such user");
    let bad = node.admin(&k, &["acl", "add", "alice", "--action", "fly"]);
    assert_eq!(code(&bad), Some(1), "bad action");
    assert!(ok(&["acl", "remove", "alice", "0"]).contains("removed rule 0"));
    assert_eq!(publish(), "403", "removed: refused again");
    let alice_cli = node.admin(
        &[],
        &["--user", "alice", "--password", "alice-pw", "acl", "list"],
    );
    assert_eq!(code(&alice_cli), Some(4), "not an admin");
}
