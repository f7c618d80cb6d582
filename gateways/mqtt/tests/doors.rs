//! Several MQTT doors (`rocketgate_mqtt::Server`) over one broker, on their own
//! ports: what two proxies over one cluster look like to the door. The state
//! (sessions, retained messages, wills, who holds a client id) lives in the
//! broker's state topics, so a device may move between doors; a door is killed
//! by dropping its runtime (no code of it runs after: no DISCONNECT, no release,
//! no "gone"), as `kill -9` of a proxy would.

mod clients;
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mqttbytes::QoS;
use mqttbytes::v5::{self, Packet};
use rocketgate_core::broker::Broker;
use rocketgate_mqtt::{Server, Settings};
use rumqttc::v5 as c5;
use support::{Node, Raw, connect_props};

/// Door settings for the tests: liveness and timeout short, so a dead door is
/// found within about a second.
fn fast(dir: &Path) -> Settings {
    let mut s = support::settings(dir);
    s.door_liveness = Duration::from_millis(150);
    s.door_timeout = Duration::from_millis(900);
    s.snapshot_chunk = 16 * 1024;
    s
}

/// [`fast`], with a snapshot every 20 entries.
fn snapshots(dir: &Path) -> Settings {
    let mut s = fast(dir);
    s.snapshot_entries = 20;
    s
}

/// A door on a runtime of its own, killed by dropping that runtime.
struct Door {
    addr: SocketAddr,
    kill: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Door {
    fn start(broker: Arc<Broker>, settings: Settings) -> Door {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (kill, kill_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let handle = rt.block_on(async move {
                let (server, addr) = Server::bind("127.0.0.1:0".parse().unwrap(), broker, settings)
                    .await
                    .unwrap();
                addr_tx.send(addr).unwrap();
                server.spawn()
            });
            let _ = kill_rx.recv();
            // Abrupt: every task of the door is dropped where it stands.
            std::mem::forget(handle);
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        Door {
            addr: addr_rx.recv().unwrap(),
            kill: Some(kill),
            thread: Some(thread),
        }
    }

    fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A v5 CONNECT with clean start 0 and a session expiry.
async fn connect_kept(
    addr: SocketAddr,
    id: &str,
    will: Option<v5::LastWill>,
) -> (Raw, v5::ConnAck) {
    let mut raw = Raw::connect(addr).await;
    let mut c = v5::Connect::new(id);
    c.keep_alive = 60;
    c.clean_session = false;
    c.last_will = will;
    let mut p = connect_props();
    p.session_expiry_interval = Some(600);
    c.properties = Some(p);
    raw.send(Packet::Connect(c)).await;
    match raw.recv().await {
        Some(Packet::ConnAck(a)) => (raw, a),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

async fn subscribe(raw: &mut Raw, filter: &str) {
    let mut s = v5::Subscribe::new(filter, QoS::AtLeastOnce);
    s.pkid = 1;
    raw.send(Packet::Subscribe(s)).await;
    loop {
        match raw.recv().await {
            Some(Packet::SubAck(_)) => return,
            Some(_) => continue,
            None => panic!("closed before SUBACK"),
        }
    }
}

/// The next PUBLISH (other packets skipped).
async fn next_publish(raw: &mut Raw) -> v5::Publish {
    loop {
        match raw.recv().await {
            Some(Packet::Publish(p)) => return p,
            Some(_) => continue,
            None => panic!("closed while waiting for a PUBLISH"),
        }
    }
}

fn publisher(addr: SocketAddr, id: &str) -> clients::V5 {
    let mut o = c5::MqttOptions::new(id, "127.0.0.1", addr.port());
    o.set_keep_alive(Duration::from_secs(30));
    clients::v5_with(o)
}

async fn publish_acked(p: &mut clients::V5, topic: &str, payload: &[u8], retain: bool) {
    p.client
        .publish(
            topic,
            c5::mqttbytes::QoS::AtLeastOnce,
            retain,
            payload.to_vec(),
        )
        .await
        .unwrap();
    p.next(|x| matches!(x, c5::mqttbytes::v5::Packet::PubAck(_)).then_some(()))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_session_resumes_on_another_door_after_its_door_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(dir.path(), fast(dir.path())).await;
    let mut door1 = Door::start(node.broker.clone(), fast(dir.path()));

    let (mut dev, ack) = connect_kept(door1.addr, "dev-moves", None).await;
    assert!(!ack.session_present);
    subscribe(&mut dev, "moves/#").await;

    let mut p = publisher(node.addr, "pub-moves");
    p.connack().await;
    for i in 0..5 {
        publish_acked(
            &mut p,
            &format!("moves/{i}"),
            format!("m{i}").as_bytes(),
            false,
        )
        .await;
    }
    // Received on door 1, none acknowledged.
    let mut first = Vec::new();
    for _ in 0..5 {
        first.push(next_publish(&mut dev).await.payload);
    }
    door1.kill();
    drop(dev);

    let (mut dev, ack) = connect_kept(node.addr, "dev-moves", None).await;
    assert!(
        ack.session_present,
        "the session was found on the other door"
    );
    let mut again = Vec::new();
    while again.len() < 5 {
        let m = next_publish(&mut dev).await;
        if !again.contains(&m.payload) {
            again.push(m.payload.clone());
        }
        let ack = v5::PubAck::new(m.pkid);
        dev.send(Packet::PubAck(ack)).await;
    }
    again.sort();
    first.sort();
    assert_eq!(again, first, "every unacknowledged message came again");
    // The subscription is intact.
    publish_acked(&mut p, "moves/after", b"after", false).await;
    loop {
        let m = next_publish(&mut dev).await;
        let pkid = m.pkid;
        dev.send(Packet::PubAck(v5::PubAck::new(pkid))).await;
        if m.payload == Bytes::from_static(b"after") {
            break;
        }
    }
    drop(dev);
    p.client.disconnect().await.unwrap();
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_id_connected_on_a_second_door_closes_the_first_with_0x8e() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(dir.path(), fast(dir.path())).await;
    let door1 = Door::start(node.broker.clone(), fast(dir.path()));

    let (mut first, _) = connect_kept(door1.addr, "twice", None).await;
    subscribe(&mut first, "twice/#").await;
    let (mut second, ack) = connect_kept(node.addr, "twice", None).await;
    assert_eq!(
        first.disconnect_reason().await,
        Some(v5::DisconnectReasonCode::SessionTakenOver)
    );
    assert!(ack.session_present, "the session came with the client id");
    // Its subscription too.
    let mut p = publisher(door1.addr, "pub-twice");
    p.connack().await;
    publish_acked(&mut p, "twice/x", b"x", false).await;
    assert_eq!(
        next_publish(&mut second).await.payload,
        Bytes::from_static(b"x")
    );

    // And back: the second connection is closed in turn.
    let (_third, ack) = connect_kept(door1.addr, "twice", None).await;
    assert!(ack.session_present);
    assert_eq!(
        second.disconnect_reason().await,
        Some(v5::DisconnectReasonCode::SessionTakenOver)
    );
    p.client.disconnect().await.unwrap();
    drop(door1);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_message_set_on_one_door_is_seen_and_cleared_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(dir.path(), fast(dir.path())).await;
    let door1 = Door::start(node.broker.clone(), fast(dir.path()));

    let mut p = publisher(door1.addr, "pub-retained");
    p.connack().await;
    publish_acked(&mut p, "lamp/1/state", b"on", true).await;

    let (mut sub, _) = Raw::connect_v5(node.addr, "sub-retained", None).await;
    subscribe(&mut sub, "lamp/#").await;
    let m = next_publish(&mut sub).await;
    assert!(m.retain);
    assert_eq!(m.payload, Bytes::from_static(b"on"));
    drop(sub);

    publish_acked(&mut p, "lamp/1/state", b"", true).await;
    let (mut sub, _) = Raw::connect_v5(node.addr, "sub-retained-2", None).await;
    subscribe(&mut sub, "lamp/#").await;
    publish_acked(&mut p, "lamp/2/marker", b"marker", false).await;
    let m = next_publish(&mut sub).await;
    assert_eq!(
        m.payload,
        Bytes::from_static(b"marker"),
        "the cleared retained message is gone on the other door too"
    );
    p.client.disconnect().await.unwrap();
    drop(door1);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_will_of_a_device_whose_door_died_is_published_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(dir.path(), fast(dir.path())).await;
    // A third door: two survivors, and still one will each.
    let door3 = Door::start(node.broker.clone(), fast(dir.path()));
    let mut door1 = Door::start(node.broker.clone(), fast(dir.path()));

    let (mut watcher, _) = Raw::connect_v5(node.addr, "will-watcher", None).await;
    subscribe(&mut watcher, "wills/#").await;
    let will = |t: &str| Some(v5::LastWill::new(t, "gone", QoS::AtLeastOnce, false));
    // One never comes back; one reconnects on another door.
    let (_gone, _) = connect_kept(door1.addr, "will-gone", will("wills/gone")).await;
    let (_back, _) = connect_kept(door1.addr, "will-back", will("wills/back")).await;
    let (_clean, _) = connect_kept(door1.addr, "will-clean", will("wills/clean")).await;
    door1.kill();
    let (_back, ack) = connect_kept(door3.addr, "will-back", None).await;
    assert!(ack.session_present);
    // Back with a clean start: the old session ends, its will goes out.
    let (_clean, ack) = Raw::connect_v5(node.addr, "will-clean", None).await;
    assert!(!ack.session_present);

    let mut got = Vec::new();
    for _ in 0..3 {
        let m = next_publish(&mut watcher).await;
        got.push(m.topic.clone());
        watcher.send(Packet::PubAck(v5::PubAck::new(m.pkid))).await;
    }
    got.sort();
    assert_eq!(got, ["wills/back", "wills/clean", "wills/gone"]);
    // Nothing more: each will once, whichever survivor adopted the dead door.
    let more = tokio::time::timeout(Duration::from_secs(2), next_publish(&mut watcher)).await;
    assert!(more.is_err(), "a will came twice: {more:?}");
    drop(door3);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_survives_a_broker_restart_through_the_log_and_old_files_are_imported() {
    let dir = tempfile::tempdir().unwrap();
    // Files as an earlier version left them.
    let mqtt = dir.path().join("mqtt");
    std::fs::create_dir_all(mqtt.join("sessions")).unwrap();
    std::fs::write(
        mqtt.join("sessions/6f6c64.json"),
        br#"{"client_id":"old","expiry":600,"subscriptions":[{"filter":"old/#","qos":1}]}"#,
    )
    .unwrap();
    std::fs::write(
        mqtt.join("retained.json"),
        br#"[{"topic":"old/r","qos":1,"payload":"b2xk","properties":[]}]"#,
    )
    .unwrap();
    let node = Node::start_with(dir.path(), snapshots(dir.path())).await;
    assert!(!mqtt.exists(), "the old files were moved aside");
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mqtt.imported-")
        })
        .collect();
    assert_eq!(aside.len(), 1);

    // A session and a retained message of this version, then a restart.
    let mut p = publisher(node.addr, "pub-restart");
    p.connack().await;
    publish_acked(&mut p, "new/r", b"new", true).await;
    let (mut dev, _) = connect_kept(node.addr, "new", None).await;
    subscribe(&mut dev, "new/#").await;
    let _ = next_publish(&mut dev).await; // the retained one
    dev.send(Packet::Disconnect(v5::Disconnect::new())).await;
    drop(dev);
    p.client.disconnect().await.unwrap();
    // Let the keeper write a snapshot (every 20 entries here), so the restart
    // loads from one.
    tokio::time::sleep(Duration::from_millis(600)).await;
    node.stop().await;
    assert!(!mqtt.exists(), "no state files are written any more");
    let node = Node::start_with(dir.path(), snapshots(dir.path())).await;

    for (id, filter, payload) in [("old", "old/#", "old"), ("new", "new/#", "new")] {
        let (mut dev, ack) = connect_kept(node.addr, id, None).await;
        assert!(ack.session_present, "session {id} survived");
        let _ = filter;
        // Its subscription is there: the retained message of its topic comes
        // only on a SUBSCRIBE, so publish a fresh one instead.
        let mut p = publisher(node.addr, &format!("pub-{id}"));
        p.connack().await;
        publish_acked(&mut p, &format!("{id}/x"), payload.as_bytes(), false).await;
        let m = next_publish(&mut dev).await;
        assert_eq!(m.payload, Bytes::from(payload.to_owned()));
        p.client.disconnect().await.unwrap();
    }
    let (mut sub, _) = Raw::connect_v5(node.addr, "sub-after", None).await;
    subscribe(&mut sub, "+/r").await;
    let mut got = vec![
        next_publish(&mut sub).await.payload,
        next_publish(&mut sub).await.payload,
    ];
    got.sort();
    assert_eq!(
        got,
        [Bytes::from_static(b"new"), Bytes::from_static(b"old")]
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_subscription_with_members_on_two_doors_gets_each_message_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(dir.path(), fast(dir.path())).await;
    let door1 = Door::start(node.broker.clone(), fast(dir.path()));

    let mut members = Vec::new();
    for (i, addr) in [door1.addr, node.addr].into_iter().enumerate() {
        let mut o = c5::MqttOptions::new(format!("worker-{i}"), "127.0.0.1", addr.port());
        o.set_keep_alive(Duration::from_secs(30));
        let mut m = clients::v5_with(o);
        m.connack().await;
        m.subscribe(
            "$share/workers/jobs/#",
            c5::mqttbytes::QoS::AtLeastOnce,
            None,
        )
        .await;
        members.push(m);
    }
    // Both doors' group tasks joined the core group and took their queues.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // Publishers with different client ids: their messages land in different
    // queues (sharding key = client id), so both doors get some.
    let mut want = Vec::new();
    for i in 0..16 {
        let mut p = publisher(node.addr, &format!("job-pub-{i}"));
        p.connack().await;
        for j in 0..4 {
            let body = format!("job-{i}-{j}");
            publish_acked(&mut p, &format!("jobs/{i}"), body.as_bytes(), false).await;
            want.push(body);
        }
        p.client.disconnect().await.unwrap();
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, mut m) in members.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let p = m
                    .next(|p| match p {
                        c5::mqttbytes::v5::Packet::Publish(p) => Some(p),
                        _ => None,
                    })
                    .await;
                if tx
                    .send((i, String::from_utf8(p.payload.to_vec()).unwrap()))
                    .is_err()
                {
                    return;
                }
            }
        });
    }
    let mut got: Vec<(usize, String)> = Vec::new();
    while got.len() < want.len() {
        let x = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("every job delivered")
            .unwrap();
        got.push(x);
    }
    // Anything more would be a duplicate.
    if let Ok(Some(x)) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
        got.push(x);
    }
    let mut bodies: Vec<String> = got.iter().map(|(_, b)| b.clone()).collect();
    bodies.sort();
    want.sort();
    assert_eq!(bodies, want, "each message exactly once");
    for door in 0..2 {
        assert!(
            got.iter().any(|(i, _)| *i == door),
            "the members on door {door} got none: {got:?}"
        );
    }
    drop(door1);
    node.stop().await;
}
