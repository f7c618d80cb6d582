//! The MQTT door over a `RemoteBroker` (issue #29, a proxy node's doors): the door
//! holds no broker of its own; every publish and delivery goes through the broker
//! API over the native door of a broker (here in the same process, through the
//! socket). `mosquitto_sub` subscribes at QoS 1, `mosquitto_pub` publishes QoS 1
//! messages (each acknowledged only once stored in the broker), and the subscriber
//! gets every one; the broker's own store holds them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use rocketgate_core::broker::{Broker, BrokerSettings, MessagingApi, SystemClock};
use rocketgate_core::store::{RecordView, Store, StoreDeps, StoreSettings};
use rocketgate_native::client::{RemoteBroker, RemoteSettings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_through_the_mqtt_door_over_a_remote_broker() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let native = listener.local_addr().unwrap();
    let opts = StoreSettings {
        segment_size: 16 << 20,
        store_host: native,
        ..StoreSettings::default()
    };
    let store = Arc::new(
        Store::open(&dir.path().join("store"), opts, StoreDeps::fixed_usage(0.1))
            .unwrap()
            .0,
    );
    let broker =
        Arc::new(Broker::open(store, BrokerSettings::default(), Arc::new(SystemClock)).unwrap());
    let (server, _) = rocketgate_native::Server::from_listener(
        listener,
        broker.clone(),
        rocketgate_native::ServerSettings {
            store_host: native,
            ..rocketgate_native::ServerSettings::default()
        },
    )
    .unwrap();
    let _native = server.spawn();
    let remote = Arc::new(
        RemoteBroker::connect(RemoteSettings::new(native.to_string()))
            .await
            .unwrap(),
    );
    let (door, mqtt) = rocketgate_mqtt::Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        remote,
        rocketgate_mqtt::Settings::new(dir.path().join("mqtt")),
    )
    .await
    .unwrap();
    let _door = door.spawn();
    let port = mqtt.port().to_string();

    // The subscriber, ready once it printed its SUBACK (-d: debug lines on stdout;
    // line-buffered, as a piped mosquitto_sub would hold its output in a block buffer).
    let mut sub = Command::new("stdbuf")
        .args(["-oL", "mosquitto_sub"])
        .args(["-h", "127.0.0.1", "-p", &port, "-q", "1", "-i", "proxy-sub"])
        .args(["-t", "proxy/+/temp", "-C", "3", "-W", "30", "-d", "-v"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("mosquitto_sub (scripts/install-test-deps installs it)");
    let mut lines = BufReader::new(sub.stdout.take().unwrap()).lines();
    let lines = tokio::task::spawn_blocking(move || {
        for l in lines.by_ref() {
            if l.unwrap().contains("received SUBACK") {
                return lines;
            }
        }
        panic!("mosquitto_sub ended without a SUBACK");
    })
    .await
    .unwrap();

    for i in 0..3 {
        let out = tokio::task::spawn_blocking(move || {
            Command::new("mosquitto_pub")
                .args(["-h", "127.0.0.1", "-p", &port_of(&mqtt), "-q", "1"])
                .args([
                    "-i",
                    &format!("proxy-pub-{i}"),
                    "-t",
                    &format!("proxy/{i}/temp"),
                ])
                .args(["-m", &format!("reading {i}")])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "mosquitto_pub: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let got: Vec<String> = tokio::task::spawn_blocking(move || {
        let got = lines
            .map_while(Result::ok)
            .filter(|l| l.starts_with("proxy/"))
            .collect();
        let _ = sub.wait();
        got
    })
    .await
    .unwrap();
    assert_eq!(
        got,
        [
            "proxy/0/temp reading 0",
            "proxy/1/temp reading 1",
            "proxy/2/temp reading 2"
        ]
    );

    // Stored in the broker behind the native door (core topic `proxy`, tag `1/temp`).
    let stored = broker
        .messages_by_time("proxy", 0, i64::MAX, 10)
        .await
        .unwrap();
    let bodies: Vec<Vec<u8>> = stored
        .iter()
        .map(|d| RecordView::parse(&d.record).unwrap().body().to_vec())
        .collect();
    assert!(bodies.contains(&b"reading 1".to_vec()), "{bodies:?}");
}

fn port_of(addr: &std::net::SocketAddr) -> String {
    addr.port().to_string()
}
