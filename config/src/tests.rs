use super::*;

#[test]
fn defaults_are_valid_and_documented_ports() {
    let c = Config::load(None, &[]).unwrap();
    assert_eq!(c.listen.namesrv.port(), 9876);
    assert_eq!(c.listen.native.port(), 10911);
    assert_eq!(c.listen.mqtt.port(), 1883);
    assert_eq!(c.listen.http.port(), 8080);
    assert_eq!(c.listen.ws.port(), 8083);
    assert_eq!(c.data_dir, PathBuf::from("data"));
    assert_eq!(c.store.segment_size, ByteSize(1 << 30));
    assert_eq!(c.store.retention, Duration::from_secs(72 * 3600));
}

#[test]
fn layers_apply_in_order_file_env_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rg.toml");
    std::fs::write(
        &file,
        "data_dir = \"/from/file\"\n[store]\nflush = \"sync\"\nsegment_size = \"64MiB\"\n[listen]\nmqtt = \"127.0.0.1:2883\"\n",
    )
    .unwrap();
    let env = env_overrides(vec![
        ("ROCKETGATE_DATA_DIR".to_string(), "/from/env".to_string()),
        ("ROCKETGATE_STORE__RETENTION".to_string(), "2h".to_string()),
        ("PATH".to_string(), "/bin".to_string()),
    ]);
    let mut all = env;
    all.push(Override::new("data_dir", "/from/flag", "flag --data-dir"));
    let c = Config::load(Some(&file), &all).unwrap();
    assert_eq!(c.data_dir, PathBuf::from("/from/flag"));
    assert_eq!(c.store.flush, FlushMode::Sync);
    assert_eq!(c.store.segment_size, ByteSize(64 << 20));
    assert_eq!(c.store.retention, Duration::from_secs(7200));
    assert_eq!(c.listen.mqtt.port(), 2883);
}

#[test]
fn unknown_keys_and_bad_values_name_their_origin() {
    let err = Config::load(None, &[Override::new("store.flsh", "sync", "env X")]).unwrap_err();
    assert!(
        err.to_string().contains("unknown setting `store.flsh`"),
        "{err}"
    );
    assert!(err.to_string().contains("env X"), "{err}");

    let err = Config::load(
        None,
        &[Override::new("store.flush", "sometimes", "flag --flush")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("flag --flush"), "{err}");

    let err = Config::load(
        None,
        &[Override::new("store.retention", "forever", "env R")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a duration"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[store]\nsegmentsize = 1\n").unwrap();
    let err = Config::load(Some(&file), &[]).unwrap_err();
    assert!(err.to_string().contains("bad.toml"), "{err}");
    assert!(err.to_string().contains("segmentsize"), "{err}");

    std::fs::write(&file, "[store\n").unwrap();
    assert!(matches!(
        Config::load(Some(&file), &[]).unwrap_err(),
        Error::Parse { .. }
    ));
}

#[test]
fn validation_reports_every_problem() {
    let err = Config::load(
        None,
        &[
            Override::new("store.disk_soft_ratio", "0.95", "t"),
            Override::new("store.segment_size", "1KiB", "t"),
            Override::new("listen.http", "127.0.0.1:1883", "t"),
        ],
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("disk_soft_ratio"), "{text}");
    assert!(text.contains("segment_size"), "{text}");
    assert!(text.contains("listen.mqtt and listen.http"), "{text}");
}

#[test]
fn disk_full_policy_defaults_to_refuse_and_takes_env_and_toml() {
    let c = Config::load(None, &[]).unwrap();
    assert_eq!(c.store.disk_full_policy, DiskFullPolicy::Refuse);
    let env = env_overrides(vec![(
        "ROCKETGATE_STORE__DISK_FULL_POLICY".to_string(),
        "delete_oldest".to_string(),
    )]);
    let c = Config::load(None, &env).unwrap();
    assert_eq!(c.store.disk_full_policy, DiskFullPolicy::DeleteOldest);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rg.toml");
    std::fs::write(&file, "[store]\ndisk_full_policy = \"delete_oldest\"\n").unwrap();
    let c = Config::load(Some(&file), &[]).unwrap();
    assert_eq!(c.store.disk_full_policy, DiskFullPolicy::DeleteOldest);

    let err = Config::load(
        None,
        &[Override::new("store.disk_full_policy", "shrug", "env P")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("env P"), "{err}");
}

#[test]
fn listen_flags_accept_a_bare_port() {
    assert_eq!(parse_listen("0").unwrap(), "127.0.0.1:0".parse().unwrap());
    assert_eq!(
        parse_listen("[::1]:1883").unwrap(),
        "[::1]:1883".parse().unwrap()
    );
    assert!(parse_listen("localhost").is_err());
}

#[test]
fn namesrv_list_accepts_rocketmq_style_string() {
    let c = Config::load(
        None,
        &[Override::new(
            "broker.namesrv_addrs",
            "127.0.0.1:9876;127.0.0.2:9876",
            "t",
        )],
    )
    .unwrap();
    assert_eq!(
        c.broker.namesrv_addrs,
        vec!["127.0.0.1:9876", "127.0.0.2:9876"]
    );
}

#[test]
fn shipped_example_config_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rocketgate.example.toml");
    let c = Config::load(Some(&path), &[]).unwrap();
    assert_eq!(c, Config::default(), "the example documents the defaults");
}

#[test]
fn sizes_parse_and_print() {
    assert_eq!(ByteSize::parse("64KiB").unwrap(), ByteSize(65536));
    assert_eq!(ByteSize::parse("10MB").unwrap(), ByteSize(10_000_000));
    assert_eq!(ByteSize::parse("123").unwrap(), ByteSize(123));
    assert!(ByteSize::parse("12 parsecs").is_err());
    assert_eq!(ByteSize(1 << 30).to_string(), "1GiB");
}

#[test]
fn tls_and_origins_from_the_environment_and_their_checks() {
    let env = env_overrides(vec![
        (
            "ROCKETGATE_TLS__CERT".to_string(),
            "/etc/rg/server.pem".to_string(),
        ),
        (
            "ROCKETGATE_TLS__KEY".to_string(),
            "/etc/rg/server.key".to_string(),
        ),
        ("ROCKETGATE_TLS__MQTT".to_string(), "true".to_string()),
        (
            "ROCKETGATE_TLS__NATIVE".to_string(),
            "permissive".to_string(),
        ),
        (
            "ROCKETGATE_TLS__CLIENT_AUTH".to_string(),
            "optional".to_string(),
        ),
        (
            "ROCKETGATE_TLS__CLIENT_CA".to_string(),
            "/etc/rg/ca.pem".to_string(),
        ),
        (
            "ROCKETGATE_WS__ALLOWED_ORIGINS".to_string(),
            r#"["https://app.example", "http://127.0.0.1:*"]"#.to_string(),
        ),
    ]);
    let c = Config::load(None, &env).unwrap();
    assert!(c.tls.mqtt && c.tls.enabled());
    assert_eq!(c.tls.native, NativeTls::Permissive);
    assert_eq!(c.tls.client_auth, ClientAuth::Optional);
    assert_eq!(c.listen.mqtts.port(), 8883);
    assert_eq!(
        c.ws.allowed_origins,
        ["https://app.example", "http://127.0.0.1:*"]
    );

    let bad = |pairs: &[(&str, &str)]| {
        let env = env_overrides(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Config::load(None, &env).unwrap_err().to_string()
    };
    let e = bad(&[("ROCKETGATE_TLS__HTTP", "true")]);
    assert!(e.contains("tls.cert or tls.key is not set"), "{e}");
    let e = bad(&[("ROCKETGATE_TLS__CLIENT_AUTH", "required")]);
    assert!(e.contains("tls.client_ca"), "{e}");
    let e = bad(&[("ROCKETGATE_HTTP__ALLOWED_ORIGINS", r#"["app.example/"]"#)]);
    assert!(e.contains("is not an origin"), "{e}");
    let e = bad(&[("ROCKETGATE_TLS__NATIVE", "sometimes")]);
    assert!(e.contains("ROCKETGATE_TLS__NATIVE"), "{e}");
}

#[test]
fn ha_settings_from_env_and_their_checks() {
    let env = env_overrides(vec![
        ("ROCKETGATE_BROKER__ID".to_string(), "1".to_string()),
        (
            "ROCKETGATE_HA__MASTER".to_string(),
            "127.0.0.1:10912".to_string(),
        ),
        ("ROCKETGATE_HA__MODE".to_string(), "sync".to_string()),
        ("ROCKETGATE_HA__SECRET".to_string(), "s3cret".to_string()),
        (
            "ROCKETGATE_HA__SYNC_TIMEOUT".to_string(),
            "750ms".to_string(),
        ),
    ]);
    let c = Config::load(None, &env).unwrap();
    assert!(c.is_slave());
    assert_eq!(c.ha.master, "127.0.0.1:10912");
    assert_eq!(c.ha.mode, HaMode::Sync);
    assert_eq!(c.ha.required_copies(), 2, "sync defaults to two copies");
    assert_eq!(c.ha.sync_timeout, Duration::from_millis(750));
    assert_eq!(c.listen.ha.port(), 10912);
    assert_eq!(Config::default().ha.required_copies(), 1);

    // A slave without a master is refused at boot, saying what to set.
    let err = Config::load(None, &[Override::new("broker.id", "2", "flag --broker-id")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("ha.master"), "{err}");

    // Replication without a shared secret is refused (a slave, a master waiting for
    // copies); a lone master without one keeps its replication port closed.
    for (key, value) in [("broker.id", "1"), ("ha.mode", "sync")] {
        let mut o = vec![Override::new(key, value, "flag")];
        if key == "broker.id" {
            o.push(Override::new("ha.master", "127.0.0.1:10912", "flag"));
        }
        let err = Config::load(None, &o).unwrap_err().to_string();
        assert!(err.contains("ha.secret"), "{key}: {err}");
    }
    assert!(!Config::default().serves_ha());
    let with_secret = Config::load(None, &[Override::new("ha.secret", "s", "flag")]).unwrap();
    assert!(with_secret.serves_ha());
}

#[test]
fn a_broker_under_a_controller_needs_an_id_and_a_secret_and_no_fixed_master() {
    let ctl = || Override::new("controller.addresses", "127.0.0.1:9878", "env");
    let o = |k: &str, v: &str| Override::new(k, v, "flag");
    let ok = Config::load(None, &[ctl(), o("broker.id", "2"), o("ha.secret", "s")]).unwrap();
    assert!(ok.controlled());
    assert!(!Config::default().controlled());
    for (bad, why) in [
        (vec![ctl(), o("ha.secret", "s")], "must be 1 or more"),
        (vec![ctl(), o("broker.id", "1")], "ha.secret"),
        (
            vec![
                ctl(),
                o("broker.id", "1"),
                o("ha.secret", "s"),
                o("ha.master", "127.0.0.1:10912"),
            ],
            "leave ha.master empty",
        ),
    ] {
        let err = Config::load(None, &bad).unwrap_err().to_string();
        assert!(err.contains(why), "{why}: {err}");
    }
}

#[test]
fn controller_settings_from_env_and_their_checks() {
    let env = env_overrides(vec![
        (
            "ROCKETGATE_CONTROLLER__PEERS".to_string(),
            "1=127.0.0.1:9878,2=127.0.0.1:9879".to_string(),
        ),
        ("ROCKETGATE_CONTROLLER__ID".to_string(), "2".to_string()),
        (
            "ROCKETGATE_CONTROLLER__BROKER_TIMEOUT".to_string(),
            "1500ms".to_string(),
        ),
        (
            "ROCKETGATE_CONTROLLER__ALLOW_UNCLEAN_ELECTION".to_string(),
            "true".to_string(),
        ),
    ]);
    let c = Config::load(None, &env).unwrap();
    assert_eq!(c.controller.id, 2);
    assert_eq!(c.controller.broker_timeout, Duration::from_millis(1500));
    assert!(c.controller.allow_unclean_election);
    assert_eq!(
        c.controller.dir(Path::new("/d")),
        Path::new("/d/controller"),
        "the Raft state lives under data_dir unless told otherwise"
    );

    // A heartbeat period over half the timeout, a bad peer entry, Raft timings that
    // would elect on every hiccup: each refused, each named.
    let err = Config::load(
        None,
        &[
            Override::new("controller.heartbeat_interval", "2s", "flag"),
            Override::new("controller.peers", "1=127.0.0.1:9878,two=x", "flag"),
            Override::new("controller.raft_election_timeout", "200ms", "flag"),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("controller.heartbeat_interval"), "{err}");
    assert!(err.contains("\"two=x\" is not ID=HOST:PORT"), "{err}");
    assert!(err.contains("controller.raft_heartbeat_interval"), "{err}");
}

#[test]
fn the_admin_cli_s_variables_are_not_settings() {
    let env = env_overrides(vec![
        (
            "ROCKETGATE_ADMIN_SERVER".to_owned(),
            "http://h:1".to_owned(),
        ),
        ("ROCKETGATE_ADMIN_API_KEY".to_owned(), "k".to_owned()),
        ("ROCKETGATE_CACERT".to_owned(), "/etc/ca.pem".to_owned()),
        ("ROCKETGATE_STORE__FLUSH".to_owned(), "sync".to_owned()),
    ]);
    assert_eq!(env.len(), 1);
    assert_eq!(env[0].path, "store.flush");
}

#[test]
fn the_advertised_address_replaces_the_listen_host_and_keeps_the_ports() {
    let mut c = Config::default();
    c.listen.native = "0.0.0.0:10911".parse().unwrap();
    c.listen.ha = "0.0.0.0:10912".parse().unwrap();
    assert_eq!(
        c.advertised_native(),
        "0.0.0.0:10911",
        "unset: the listen address"
    );
    assert_eq!(c.advertised_ha(), "0.0.0.0:10912");
    c.broker.advertised_address = "broker-a.example".into();
    assert_eq!(c.advertised_native(), "broker-a.example:10911");
    assert_eq!(c.advertised_ha(), "broker-a.example:10912");
    c.broker.advertised_address = "203.0.113.7:30911".into();
    assert_eq!(c.advertised_native(), "203.0.113.7:30911", "a mapped port");
    assert_eq!(c.advertised_ha(), "203.0.113.7:10912");
    c.broker.advertised_address = "::1".into();
    assert_eq!(c.advertised_native(), "[::1]:10911");
    c.validate().unwrap();
    for bad in ["a b", "host:0", "host:http", "http://x", ":9"] {
        c.broker.advertised_address = bad.into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("broker.advertised_address"), "{bad}: {e}");
    }
}

#[test]
fn verify_share_is_a_share_of_one_core() {
    let mut c = Config::default();
    assert_eq!(c.auth.verify_share, 1.0);
    c.auth.verify_share = 0.25;
    c.validate().unwrap();
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        c.auth.verify_share = bad;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("auth.verify_share"), "{bad}: {e}");
    }
}
