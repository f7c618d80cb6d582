use super::*;

fn ip() -> IpAddr {
    "127.0.0.1".parse().unwrap()
}

fn open(dir: &std::path::Path) -> Arc<Auth> {
    let mut s = Settings::disabled();
    s.enabled = true;
    s.users_file = dir.join("users.toml");
    s.internal = Some(AccessKey {
        access_key: "internal".into(),
        secret_key: "isecret".into(),
    });
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "alice".into(),
            password: store::hash_password(b"pw"),
            api_keys: vec![store::hash_api_key("key-1")],
            access_keys: vec![AccessKey {
                access_key: "AK".into(),
                secret_key: "SK".into(),
            }],
            rules: vec![Rule::allow(&[Action::Publish, Action::Subscribe], &["a/#"])],
            ..UserEntry::default()
        })
    })
    .unwrap();
    auth
}

#[tokio::test]
async fn passwords_keys_and_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let auth = open(dir.path());
    let pw = |u: &'static str, p: &'static [u8]| Credentials::Password {
        username: u,
        password: p,
    };
    let ok = auth.login(pw("alice", b"pw"), ip(), "test").await.unwrap();
    assert_eq!(ok.identity.user, "alice");
    // Second time from the cache; same answer.
    assert!(auth.login(pw("alice", b"pw"), ip(), "test").await.is_ok());
    assert_eq!(
        auth.login(pw("alice", b"nope"), ip(), "test").await,
        Err(Denied::BadCredentials)
    );
    assert_eq!(
        auth.login(pw("mallory", b"pw"), ip(), "test").await,
        Err(Denied::BadCredentials)
    );
    assert_eq!(
        auth.login(Credentials::None, ip(), "test").await,
        Err(Denied::Missing)
    );
    assert_eq!(
        auth.login(Credentials::Bearer("key-1"), ip(), "test")
            .await
            .unwrap()
            .identity
            .user,
        "alice"
    );
    assert_eq!(
        auth.login(Credentials::Bearer("key-2"), ip(), "test").await,
        Err(Denied::BadToken)
    );
    assert_eq!(
        auth.login(Credentials::Certificate("alice"), ip(), "test")
            .await,
        Err(Denied::CertificateNotAccepted)
    );
    // A change of the user drops the cached password.
    auth.update(|f| {
        f.users[0].password = store::hash_password(b"new");
    })
    .unwrap();
    assert_eq!(
        auth.login(pw("alice", b"pw"), ip(), "test").await,
        Err(Denied::BadCredentials)
    );
    assert!(auth.login(pw("alice", b"new"), ip(), "test").await.is_ok());
}

#[tokio::test]
async fn grants_follow_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let auth = open(dir.path());
    let alice = Identity {
        user: "alice".into(),
        internal: false,
    };
    let g = auth.grant(&alice, "c1");
    assert!(g.may_publish("a/x") && !g.may_publish("b/x"));
    auth.update(|f| f.remove("alice")).unwrap();
    assert!(!auth.grant(&alice, "c1").may_publish("a/x"));
    assert!(Auth::disabled().grant(&alice, "c1").may_publish("b/x"));
}

#[tokio::test]
async fn signed_requests() {
    let dir = tempfile::tempdir().unwrap();
    let auth = open(dir.path());
    let mut fields = vec![("topic", "a"), ("AccessKey", "AK")];
    let sig = sign::signature(b"SK", fields.clone(), b"hello");
    fields.push(("Signature", &sig));
    assert_eq!(
        auth.verify_signed(fields.clone(), b"hello").unwrap().user,
        "alice"
    );
    assert_eq!(
        auth.verify_signed(fields.clone(), b"hellO"),
        Err(Denied::BadSignature("AK".into()))
    );
    assert_eq!(
        auth.verify_signed([("topic", "a")], b""),
        Err(Denied::Unsigned)
    );
    let mut internal = vec![("brokerName", "b"), ("AccessKey", "internal")];
    let isig = sign::signature(b"isecret", internal.clone(), b"");
    internal.push(("Signature", &isig));
    assert!(auth.verify_signed(internal, b"").unwrap().internal);
}

#[tokio::test]
async fn the_file_is_watched() {
    let dir = tempfile::tempdir().unwrap();
    let auth = open(dir.path());
    let _watch = auth.spawn_watch();
    // Another process (the CLI) adds a user.
    let path = dir.path().join("users.toml");
    let mut f = UserFile::load(&path).unwrap();
    f.upsert(UserEntry {
        name: "bob".into(),
        api_keys: vec![store::hash_api_key("bob-key")],
        ..UserEntry::default()
    });
    std::thread::sleep(Duration::from_millis(20)); // a distinct mtime
    f.save(&path).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while auth.users().user("bob").is_none() {
        assert!(Instant::now() < deadline, "bob never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Logins with the same credentials at once share one verification's answer; a
/// wrong password among them is refused, and whoever waited gets the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_logins_with_one_password_share_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let auth = open(dir.path());
    let pw = |u: &'static str, p: &'static [u8]| Credentials::Password {
        username: u,
        password: p,
    };
    let mut calls = Vec::new();
    for i in 0..12 {
        let auth = auth.clone();
        let password: &'static [u8] = if i % 4 == 3 { b"nope" } else { b"pw" };
        calls.push(tokio::spawn(async move {
            (
                password,
                auth.login(pw("alice", password), ip(), "test")
                    .await
                    .is_ok(),
            )
        }));
    }
    for c in calls {
        let (password, ok) = c.await.unwrap();
        assert_eq!(
            ok,
            password == b"pw",
            "{}",
            String::from_utf8_lossy(password)
        );
    }
    assert!(lock(&auth.verifying).is_empty());
}
