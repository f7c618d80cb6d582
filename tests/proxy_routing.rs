//! The MQTT and HTTP doors over a `Cluster` of two in-process broker groups (issue 29):
//! the doors are the real servers, the clients are mosquitto and curl. What proxy mode
//! will run, minus the remote hop (each member here is a local broker).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocketgate_core::broker::{Broker, BrokerSettings, MessagingApi, SystemClock, TopicConfig};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};
use rocketgate_native::cluster::{BrokerAddr, Cluster, ClusterSettings, MemberRoutes};
use serde_json::Value;

type Groups = Cluster<Broker, Arc<MemberRoutes<Broker>>>;

struct Group {
    store: Arc<Store>,
    broker: Arc<Broker>,
    addr: String,
    _dir: tempfile::TempDir,
}

fn group(port: u16) -> Group {
    let dir = tempfile::tempdir().unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let settings = StoreSettings {
        segment_size: 16 << 20,
        store_host: addr,
        flush: FlushMode::Async {
            interval: Duration::from_millis(10),
        },
        ..StoreSettings::default()
    };
    let store = Arc::new(
        Store::open(dir.path(), settings, StoreDeps::fixed_usage(0.1))
            .unwrap()
            .0,
    );
    let broker = Arc::new(
        Broker::open(
            store.clone(),
            BrokerSettings::default(),
            Arc::new(SystemClock),
        )
        .unwrap(),
    );
    Group {
        store,
        broker,
        addr: addr.to_string(),
        _dir: dir,
    }
}

async fn cluster(groups: &[(&str, &Group)]) -> Groups {
    let routes = Arc::new(MemberRoutes::new());
    for (name, g) in groups {
        routes.add(name, &g.addr, g.broker.clone());
    }
    let r = routes.clone();
    Cluster::start(routes, ClusterSettings::default(), move |b: &BrokerAddr| {
        let m = r.member(&b.addr);
        async move { m.ok_or(rocketgate_core::Error::ShutDown) }
    })
    .await
}

/// Runs curl; the answer's JSON.
async fn curl(args: Vec<String>) -> Value {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .arg("-sS")
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

async fn stored(g: &Group, topic: &str) -> u64 {
    g.broker.sync_visible().await;
    g.broker
        .queue_stats(topic)
        .await
        .map_or(0, |s| s.iter().map(|q| q.max_offset).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_and_http_doors_over_two_broker_groups() {
    let (a, b) = (group(20201), group(20202));
    let groups = Arc::new(cluster(&[("broker-a", &a), ("broker-b", &b)]).await);
    for t in ["sensors", "orders"] {
        groups.create_topic(TopicConfig::new(t, 2)).await.unwrap();
    }

    // MQTT: a subscriber on `sensors/#` gets every QoS 1 message, stored on both groups.
    let mqtt_dir = tempfile::tempdir().unwrap();
    let mut mqtt_settings = rocketgate_mqtt::Settings::new(mqtt_dir.path().join("mqtt"));
    mqtt_settings.topic_poll = Duration::from_millis(100);
    let (mqtt, mqtt_addr) = rocketgate_mqtt::Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        groups.clone(),
        mqtt_settings,
    )
    .await
    .unwrap();
    let mqtt = mqtt.spawn();
    let port = mqtt_addr.port().to_string();
    let sub = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port, "-q", "1", "-i", "sub-1"])
        .args(["-t", "sensors/#", "-C", "10", "-W", "30", "-v"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A shared subscription ($share group = a consumer group over both groups' queues).
    let shared = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port, "-q", "1", "-i", "sub-2"])
        .args([
            "-t",
            "$share/meters/sensors/#",
            "-C",
            "10",
            "-W",
            "30",
            "-v",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The subscription starts at the end of the log: publish once it is in place.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..10 {
        let status = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-q", "1"])
            .args([
                "-t",
                &format!("sensors/room{i}/temp"),
                "-m",
                &format!("t{i}"),
            ])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let out = tokio::task::spawn_blocking(move || sub.wait_with_output().unwrap())
        .await
        .unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    let want: Vec<String> = (0..10)
        .map(|i| format!("sensors/room{i}/temp t{i}"))
        .collect();
    assert_eq!(lines, want);
    let out = tokio::task::spawn_blocking(move || shared.wait_with_output().unwrap())
        .await
        .unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    assert_eq!(lines, want, "the shared subscriber");
    assert!(stored(&a, "sensors").await > 0 && stored(&b, "sensors").await > 0);
    mqtt.stop().await;

    // HTTP: publish, receive (POP over both groups), ack with the handles that name
    // their group; a transaction's id names its group too.
    let probe = Arc::new(rocketgate_http::StoreProbe::new(a.store.clone(), 0.9));
    let (http, http_addr) = rocketgate_http::Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        groups.clone(),
        probe,
        rocketgate_http::Settings::default(),
    )
    .await
    .unwrap();
    let http = http.spawn();
    let url = |path: &str| format!("http://{http_addr}{path}");
    for i in 0..6 {
        let sent = curl(vec![
            "--data-binary".into(),
            format!("o{i}"),
            url("/v1/topics/orders/messages"),
        ])
        .await;
        assert_eq!(sent["topic"], "orders", "{sent}");
    }
    assert_eq!(stored(&a, "orders").await + stored(&b, "orders").await, 6);
    let mut handles = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while handles.len() < 6 {
        assert!(Instant::now() < deadline, "received only {}", handles.len());
        let got = curl(vec![url(
            "/v1/groups/billing/topics/orders/messages?max=16&wait_ms=1000",
        )])
        .await;
        for m in got["messages"].as_array().unwrap() {
            let h = m["receipt_handle"].as_str().unwrap().to_owned();
            assert!(h.starts_with("v2:broker-"), "{h}");
            handles.push(h);
        }
    }
    let acked = curl(vec![
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        serde_json::json!({ "receipt_handles": handles }).to_string(),
        url("/v1/groups/billing/acks"),
    ])
    .await;
    assert_eq!(acked["acked"], 6, "{acked}");
    let again = curl(vec![url(
        "/v1/groups/billing/topics/orders/messages?wait_ms=500",
    )])
    .await;
    assert_eq!(
        again["messages"].as_array().map(Vec::len),
        Some(0),
        "{again}"
    );

    let half = curl(vec![
        "--data-binary".into(),
        "{\"order\":7}".into(),
        url("/v1/topics/orders/messages?transaction=begin&producer_group=shop"),
    ])
    .await;
    let id = half["transaction_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("broker-") && id.contains('@'), "{id}");
    let done = curl(vec![
        "-X".into(),
        "POST".into(),
        url(&format!("/v1/transactions/{id}/commit")),
    ])
    .await;
    assert_eq!(done["status"], "committed", "{done}");
    http.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_door_over_two_broker_groups() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as Frame;

    let (a, b) = (group(20211), group(20212));
    let groups = Arc::new(cluster(&[("broker-a", &a), ("broker-b", &b)]).await);
    groups
        .create_topic(TopicConfig::new("feed", 2))
        .await
        .unwrap();
    let (ws, ws_addr) = rocketgate_websocket::Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        groups.clone(),
        rocketgate_websocket::Settings::default(),
        rocketgate_websocket::Hooks::default(),
    )
    .await
    .unwrap();
    let ws = ws.spawn();
    let (mut s, _) = tokio_tungstenite::connect_async(format!("ws://{ws_addr}/v1/ws"))
        .await
        .unwrap();
    let send = |v: Value| Frame::text(v.to_string());
    // A clustering subscription (POP over both groups) and a broadcasting one (pulls
    // every global queue) on one connection; then 6 publishes through the socket.
    s.send(send(
        serde_json::json!({"op": "subscribe", "id": "shared", "topic": "feed",
        "group": "wsg", "credit": 20}),
    ))
    .await
    .unwrap();
    s.send(send(
        serde_json::json!({"op": "subscribe", "id": "all", "topic": "feed",
        "group": "wsb", "mode": "broadcasting", "start": "earliest", "credit": 20}),
    ))
    .await
    .unwrap();
    for i in 0..6 {
        s.send(send(
            serde_json::json!({"op": "publish", "topic": "feed", "body": format!("w{i}")}),
        ))
        .await
        .unwrap();
    }
    let mut shared = Vec::new();
    let mut all = Vec::new();
    let mut queues = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while shared.len() < 6 || all.len() < 6 {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, s.next())
            .await
            .unwrap_or_else(|_| panic!("shared {shared:?}, all {all:?}"))
            .unwrap()
            .unwrap();
        let f: Value = serde_json::from_str(frame.to_text().unwrap()).unwrap();
        match f["type"].as_str() {
            Some("message") => {
                let body = f["body"].as_str().unwrap().to_owned();
                queues.insert(f["queue_id"].as_u64().unwrap());
                if f["subscription"] == "shared" {
                    let receipt = f["receipt"].as_str().unwrap();
                    assert!(receipt.starts_with("v2:broker-"), "{receipt}");
                    s.send(send(serde_json::json!({"op": "ack", "receipt": receipt})))
                        .await
                        .unwrap();
                    shared.push(body);
                } else {
                    all.push(body);
                }
            }
            Some("error") => panic!("{f}"),
            _ => {}
        }
    }
    shared.sort();
    all.sort();
    let want: Vec<String> = (0..6).map(|i| format!("w{i}")).collect();
    assert_eq!((shared, all), (want.clone(), want));
    assert_eq!(
        queues.len(),
        4,
        "every global queue of both groups: {queues:?}"
    );
    let (on_a, on_b) = (stored(&a, "feed").await, stored(&b, "feed").await);
    assert!(on_a > 0 && on_b > 0 && on_a + on_b == 6, "{on_a} + {on_b}");
    s.close(None).await.unwrap();
    ws.stop().await;
}
