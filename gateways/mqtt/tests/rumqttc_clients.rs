//! The gateway driven by `rumqttc` (v4 = MQTT 3.1.1 and v5 clients), through the
//! socket, against a real broker on a temp dir.

mod support;

use std::time::Duration;

use bytes::Bytes;
use rocketgate_core::broker::{MessagingApi, PullRequest, QueueChoice, filter::Filter};
use rocketgate_core::store::{Message, RecordView};
use rumqttc::v5 as c5;
use rumqttc::v5::mqttbytes::v5 as p5;
use support::{Node, WAIT};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A v3.1.1 client: its handle, the incoming packets, the event-loop task.
struct V4 {
    client: rumqttc::AsyncClient,
    rx: mpsc::UnboundedReceiver<rumqttc::Packet>,
    task: JoinHandle<()>,
}

fn v4(node: &Node, id: &str, clean: bool) -> V4 {
    let mut o = rumqttc::MqttOptions::new(id, "127.0.0.1", node.port());
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(clean);
    v4_with(o)
}

fn v4_with(o: rumqttc::MqttOptions) -> V4 {
    let (client, mut el) = rumqttc::AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(rumqttc::Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    V4 { client, rx, task }
}

impl V4 {
    async fn next<T>(&mut self, mut f: impl FnMut(rumqttc::Packet) -> Option<T>) -> T {
        tokio::time::timeout(WAIT, async {
            loop {
                let p = self.rx.recv().await.expect("client event loop ended");
                if let Some(t) = f(p) {
                    return t;
                }
            }
        })
        .await
        .expect("timed out waiting for a packet")
    }

    async fn connack(&mut self) -> bool {
        self.next(|p| match p {
            rumqttc::Packet::ConnAck(a) => Some(a.session_present),
            _ => None,
        })
        .await
    }

    async fn subscribe(&mut self, filter: &str, qos: rumqttc::QoS) {
        self.client.subscribe(filter, qos).await.unwrap();
        self.next(|p| matches!(p, rumqttc::Packet::SubAck(_)).then_some(()))
            .await;
    }

    async fn publish(&mut self) -> rumqttc::Publish {
        self.next(|p| match p {
            rumqttc::Packet::Publish(p) => Some(p),
            _ => None,
        })
        .await
    }
}

struct V5 {
    client: c5::AsyncClient,
    rx: mpsc::UnboundedReceiver<p5::Packet>,
    task: JoinHandle<()>,
}

fn v5_opts(node: &Node, id: &str) -> c5::MqttOptions {
    let mut o = c5::MqttOptions::new(id, "127.0.0.1", node.port());
    o.set_keep_alive(Duration::from_secs(30));
    o
}

fn v5_with(o: c5::MqttOptions) -> V5 {
    let (client, mut el) = c5::AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(c5::Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(c5::ConnectionError::MqttState(c5::StateError::ServerDisconnect {
                    reason_code,
                    ..
                })) => {
                    // rumqttc reports a server DISCONNECT as an error: pass it on.
                    let _ = tx.send(p5::Packet::Disconnect(p5::Disconnect {
                        reason_code,
                        properties: None,
                    }));
                    return;
                }
                Err(_) => return,
            }
        }
    });
    V5 { client, rx, task }
}

impl V5 {
    async fn next<T>(&mut self, mut f: impl FnMut(p5::Packet) -> Option<T>) -> T {
        tokio::time::timeout(WAIT, async {
            loop {
                let p = self.rx.recv().await.expect("client event loop ended");
                if let Some(t) = f(p) {
                    return t;
                }
            }
        })
        .await
        .expect("timed out waiting for a packet")
    }

    async fn connack(&mut self) -> p5::ConnAck {
        self.next(|p| match p {
            p5::Packet::ConnAck(a) => Some(a),
            _ => None,
        })
        .await
    }

    async fn subscribe(
        &mut self,
        filter: &str,
        qos: rumqttc::v5::mqttbytes::QoS,
        id: Option<usize>,
    ) {
        let props = p5::SubscribeProperties {
            id,
            user_properties: Vec::new(),
        };
        self.client
            .subscribe_with_properties(filter, qos, props)
            .await
            .unwrap();
        self.next(|p| matches!(p, p5::Packet::SubAck(_)).then_some(()))
            .await;
    }

    async fn publish(&mut self) -> p5::Publish {
        self.next(|p| match p {
            p5::Packet::Publish(p) => Some(p),
            _ => None,
        })
        .await
    }
}

fn topic_of(p: &p5::Publish) -> String {
    String::from_utf8(p.topic.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v4_qos_0_1_2_both_ways_with_wildcards() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v4(&node, "sub-1", true);
    sub.connack().await;
    sub.subscribe("sensors/+/temp", rumqttc::QoS::ExactlyOnce)
        .await;
    let mut publ = v4(&node, "pub-1", true);
    publ.connack().await;
    for (i, qos) in [
        rumqttc::QoS::AtMostOnce,
        rumqttc::QoS::AtLeastOnce,
        rumqttc::QoS::ExactlyOnce,
    ]
    .into_iter()
    .enumerate()
    {
        publ.client
            .publish("sensors/room1/temp", qos, false, format!("m{i}"))
            .await
            .unwrap();
        // Not matched by the filter.
        publ.client
            .publish("sensors/room1/hum", qos, false, "no")
            .await
            .unwrap();
        let got = sub.publish().await;
        assert_eq!(got.topic, "sensors/room1/temp");
        assert_eq!(&got.payload[..], format!("m{i}").as_bytes());
        assert_eq!(got.qos, qos, "delivered at the publish QoS (granted 2)");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_publish_is_a_core_message_and_core_messages_reach_mqtt() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v5_with(v5_opts(&node, "sub-core"));
    sub.connack().await;
    sub.subscribe("sensors/#", rumqttc::v5::mqttbytes::QoS::AtLeastOnce, None)
        .await;

    let mut publ = v5_with(v5_opts(&node, "pub-core"));
    publ.connack().await;
    let props = p5::PublishProperties {
        user_properties: vec![
            ("color".into(), "red".into()),
            ("KEYS".into(), "dropped".into()),
        ],
        content_type: Some("text/plain".into()),
        ..Default::default()
    };
    publ.client
        .publish_with_properties(
            "sensors/room1/temp",
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            "21.5",
            props,
        )
        .await
        .unwrap();
    publ.next(|p| matches!(p, p5::Packet::PubAck(_)).then_some(()))
        .await;
    // Acked means stored: read it through the core.
    let mut found = None;
    for q in 0..4 {
        let r = node
            .broker
            .pull(PullRequest {
                group: "reader".into(),
                member: String::new(),
                topic: "sensors".into(),
                queue_id: q,
                offset: 0,
                max_messages: 10,
                filter: Filter::all(),
                wait: Duration::ZERO,
            })
            .await
            .unwrap();
        if let Some(m) = r.messages.into_iter().next() {
            found = Some(m);
        }
    }
    let m = found.expect("the published message is in the core");
    let view = RecordView::parse(&m.record).unwrap();
    assert_eq!(view.topic(), "sensors");
    assert_eq!(view.tags(), Some("room1/temp"));
    assert_eq!(view.body(), b"21.5");
    assert_eq!(view.property("color"), Some("red"));
    assert_eq!(view.property("mqtt.content_type"), Some("text/plain"));
    assert_eq!(view.property("mqtt.qos"), Some("1"));
    assert_eq!(
        view.keys().count(),
        0,
        "a reserved user property is dropped"
    );
    let got = sub.publish().await;
    assert_eq!(topic_of(&got), "sensors/room1/temp");

    // The other way: a core send (what HTTP/native do) reaches the MQTT subscriber.
    let msg = Message::new("sensors", 0, Bytes::from_static(b"from-core"))
        .with_tags("room2/hum")
        .with_property("origin", "http");
    node.broker
        .send(msg, QueueChoice::RoundRobin)
        .await
        .unwrap();
    let got = sub.publish().await;
    assert_eq!(topic_of(&got), "sensors/room2/hum");
    assert_eq!(&got.payload[..], b"from-core");
    let props = got.properties.expect("v5 properties");
    assert!(
        props
            .user_properties
            .contains(&("origin".into(), "http".into()))
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_session_gets_offline_messages_across_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v4(&node, "offline-sub", false);
    assert!(!sub.connack().await);
    sub.subscribe("orders/#", rumqttc::QoS::AtLeastOnce).await;
    sub.client.disconnect().await.unwrap();
    let _ = tokio::time::timeout(WAIT, &mut sub.task).await;

    let mut publ = v4(&node, "offline-pub", true);
    publ.connack().await;
    for i in 0..5 {
        publ.client
            .publish(
                "orders/eu",
                rumqttc::QoS::AtLeastOnce,
                false,
                format!("o{i}"),
            )
            .await
            .unwrap();
    }
    let mut acked = 0;
    while acked < 5 {
        publ.next(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
            .await;
        acked += 1;
    }
    publ.client.disconnect().await.unwrap();

    let node = node.restart().await;
    let mut sub = v4(&node, "offline-sub", false);
    assert!(sub.connack().await, "the session survived the restart");
    for i in 0..5 {
        let p = sub.publish().await;
        assert_eq!(p.topic, "orders/eu");
        assert_eq!(&p.payload[..], format!("o{i}").as_bytes());
    }
    // And it is still subscribed: live messages keep coming.
    let mut publ = v4(&node, "offline-pub", true);
    publ.connack().await;
    publ.client
        .publish("orders/us", rumqttc::QoS::AtLeastOnce, false, "live")
        .await
        .unwrap();
    let p = sub.publish().await;
    assert_eq!(&p.payload[..], b"live");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_set_replace_clear_and_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut publ = v4(&node, "ret-pub", true);
    publ.connack().await;
    let publish = |topic: &'static str, payload: &'static str| {
        let c = publ.client.clone();
        async move {
            c.publish(topic, rumqttc::QoS::AtLeastOnce, true, payload)
                .await
                .unwrap();
        }
    };
    publish("status/dev1", "online").await;
    publish("status/dev2", "v1").await;
    publish("status/dev2", "v2").await; // replaces
    publish("status/dev3", "x").await;
    publish("status/dev3", "").await; // clears
    for _ in 0..5 {
        publ.next(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
            .await;
    }
    let node = node.restart().await;
    let mut sub = v4(&node, "ret-sub", true);
    sub.connack().await;
    sub.subscribe("status/+", rumqttc::QoS::AtLeastOnce).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let p = sub.publish().await;
        assert!(p.retain, "retained messages carry the retain flag");
        got.push((
            p.topic.clone(),
            String::from_utf8(p.payload.to_vec()).unwrap(),
        ));
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            ("status/dev1".to_string(), "online".to_string()),
            ("status/dev2".to_string(), "v2".to_string())
        ]
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_take_over_closes_the_first_connection() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut first = v5_with(v5_opts(&node, "same-id"));
    first.connack().await;
    first
        .subscribe("t/#", rumqttc::v5::mqttbytes::QoS::AtLeastOnce, None)
        .await;
    let mut o = v5_opts(&node, "same-id");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(60));
    let mut second = v5_with(o);
    second.connack().await;
    let reason = first
        .next(|p| match p {
            p5::Packet::Disconnect(d) => Some(d.reason_code),
            _ => None,
        })
        .await;
    assert_eq!(reason, p5::DisconnectReasonCode::SessionTakenOver);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn will_is_published_on_abnormal_close_and_after_its_delay() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut watcher = v5_with(v5_opts(&node, "watcher"));
    watcher.connack().await;
    watcher
        .subscribe("wills/#", rumqttc::v5::mqttbytes::QoS::AtLeastOnce, None)
        .await;

    // 3.1.1: published at once when the connection drops without DISCONNECT.
    let mut o = rumqttc::MqttOptions::new("dies", "127.0.0.1", node.port());
    o.set_last_will(rumqttc::LastWill::new(
        "wills/dies",
        "gone",
        rumqttc::QoS::AtLeastOnce,
        false,
    ));
    let mut dying = v4_with(o);
    dying.connack().await;
    dying.task.abort(); // drops the socket: no DISCONNECT
    let p = watcher.publish().await;
    assert_eq!(topic_of(&p), "wills/dies");
    assert_eq!(&p.payload[..], b"gone");

    // v5 with a will delay longer than the session: published when the session ends.
    let mut o = v5_opts(&node, "delayed");
    o.set_session_expiry_interval(Some(1));
    let props = p5::LastWillProperties {
        delay_interval: Some(3600),
        payload_format_indicator: None,
        message_expiry_interval: None,
        content_type: None,
        response_topic: None,
        correlation_data: None,
        user_properties: vec![("why".into(), "expired".into())],
    };
    o.set_last_will(p5::LastWill::new(
        "wills/delayed",
        "late",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        Some(props),
    ));
    let mut delayed = v5_with(o);
    delayed.connack().await;
    delayed.task.abort();
    let p = watcher.publish().await;
    assert_eq!(topic_of(&p), "wills/delayed");
    let props = p.properties.unwrap();
    assert!(
        props
            .user_properties
            .contains(&("why".into(), "expired".into()))
    );

    // A normal DISCONNECT sends no will: the next message is the marker.
    let mut o = v5_opts(&node, "polite");
    o.set_last_will(p5::LastWill::new(
        "wills/polite",
        "no",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        false,
        None,
    ));
    let mut polite = v5_with(o);
    polite.connack().await;
    polite.client.disconnect().await.unwrap();
    let _ = tokio::time::timeout(WAIT, &mut polite.task).await;
    let mut marker = v5_with(v5_opts(&node, "marker"));
    marker.connack().await;
    marker
        .client
        .publish(
            "wills/marker",
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            "m",
        )
        .await
        .unwrap();
    let p = watcher.publish().await;
    assert_eq!(topic_of(&p), "wills/marker");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_subscription_delivers_each_message_to_one_member() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut a = v5_with(v5_opts(&node, "worker-a"));
    a.connack().await;
    a.subscribe(
        "$share/workers/jobs/#",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        None,
    )
    .await;
    let mut b = v5_with(v5_opts(&node, "worker-b"));
    b.connack().await;
    b.subscribe(
        "$share/workers/jobs/#",
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        None,
    )
    .await;
    let mut publ = v5_with(v5_opts(&node, "jobs-pub"));
    publ.connack().await;
    let n = 40;
    for i in 0..n {
        publ.client
            .publish(
                "jobs/x",
                rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                false,
                format!("{i}"),
            )
            .await
            .unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < n && tokio::time::Instant::now() < deadline {
        tokio::select! {
            Some(p) = a.rx.recv() => if let p5::Packet::Publish(p) = p {
                assert!(seen.insert(p.payload.to_vec()), "delivered twice");
            },
            Some(p) = b.rx.recv() => if let p5::Packet::Publish(p) = p {
                assert!(seen.insert(p.payload.to_vec()), "delivered twice");
            },
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
    assert_eq!(seen.len(), n, "every message reached one member");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_subscriptions_deliver_once_at_the_highest_qos_with_all_ids() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v5_with(v5_opts(&node, "overlap"));
    sub.connack().await;
    sub.subscribe("home/#", rumqttc::v5::mqttbytes::QoS::AtMostOnce, Some(1))
        .await;
    sub.subscribe(
        "home/+/light",
        rumqttc::v5::mqttbytes::QoS::ExactlyOnce,
        Some(2),
    )
    .await;
    let mut publ = v5_with(v5_opts(&node, "overlap-pub"));
    publ.connack().await;
    publ.client
        .publish(
            "home/kitchen/light",
            rumqttc::v5::mqttbytes::QoS::ExactlyOnce,
            false,
            "on",
        )
        .await
        .unwrap();
    publ.client
        .publish(
            "home/kitchen/door",
            rumqttc::v5::mqttbytes::QoS::ExactlyOnce,
            false,
            "closed",
        )
        .await
        .unwrap();
    let p = sub.publish().await;
    assert_eq!(topic_of(&p), "home/kitchen/light");
    assert_eq!(p.qos, rumqttc::v5::mqttbytes::QoS::ExactlyOnce);
    let mut ids = p.properties.unwrap().subscription_identifiers;
    ids.sort();
    assert_eq!(ids, vec![1, 2]);
    // The next one is the door (so the light was not delivered twice).
    let p = sub.publish().await;
    assert_eq!(topic_of(&p), "home/kitchen/door");
    assert_eq!(p.qos, rumqttc::v5::mqttbytes::QoS::AtMostOnce);
    assert_eq!(p.properties.unwrap().subscription_identifiers, vec![1]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_properties_round_trip_and_no_local() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v5_with(v5_opts(&node, "props-sub"));
    sub.connack().await;
    sub.subscribe("req/#", rumqttc::v5::mqttbytes::QoS::AtLeastOnce, None)
        .await;
    // The same client publishing with no-local on: it must not get its own.
    let filter = p5::Filter {
        path: "req/#".into(),
        qos: rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        nolocal: true,
        preserve_retain: false,
        retain_forward_rule: p5::RetainForwardRule::Never,
    };
    let mut me = v5_with(v5_opts(&node, "props-me"));
    me.connack().await;
    me.client.subscribe_many(vec![filter]).await.unwrap();
    me.next(|p| matches!(p, p5::Packet::SubAck(_)).then_some(()))
        .await;
    let props = p5::PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(300),
        topic_alias: None,
        response_topic: Some("resp/me".into()),
        correlation_data: Some(Bytes::from_static(b"\x01corr")),
        user_properties: vec![("a".into(), "1".into()), ("b".into(), "2".into())],
        subscription_identifiers: Vec::new(),
        content_type: Some("application/json".into()),
    };
    me.client
        .publish_with_properties(
            "req/x",
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            "{}",
            props,
        )
        .await
        .unwrap();
    let p = sub.publish().await;
    let got = p.properties.unwrap();
    assert_eq!(got.payload_format_indicator, Some(1));
    assert!(matches!(got.message_expiry_interval, Some(s) if s > 0 && s <= 300));
    assert_eq!(got.response_topic.as_deref(), Some("resp/me"));
    assert_eq!(got.correlation_data.as_deref(), Some(&b"\x01corr"[..]));
    assert_eq!(got.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        got.user_properties,
        vec![
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string())
        ]
    );
    // `me` must not receive its own message; the next one it sees is from `sub`.
    sub.client
        .publish(
            "req/y",
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            "other",
        )
        .await
        .unwrap();
    let p = me.publish().await;
    assert_eq!(topic_of(&p), "req/y");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assigned_client_id_and_connack_properties() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut c = v5_with(v5_opts(&node, ""));
    let ack = c.connack().await;
    let props = ack.properties.unwrap();
    assert!(props.assigned_client_identifier.unwrap().starts_with("rg-"));
    assert_eq!(props.max_packet_size, Some(32 * 1024));
    assert_eq!(props.shared_subscription_available, Some(1));
    node.stop().await;
}

fn filter(path: &str, rap: bool, rule: p5::RetainForwardRule) -> p5::Filter {
    p5::Filter {
        path: path.into(),
        qos: rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        nolocal: false,
        preserve_retain: rap,
        retain_forward_rule: rule,
    }
}

impl V5 {
    async fn subscribe_filter(&mut self, f: p5::Filter) {
        self.client.subscribe_many(vec![f]).await.unwrap();
        self.next(|p| matches!(p, p5::Packet::SubAck(_)).then_some(()))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retain_handling_and_retain_as_published() {
    use rumqttc::v5::mqttbytes::QoS;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut publ = v5_with(v5_opts(&node, "cfg-pub"));
    publ.connack().await;
    publ.client
        .publish("cfg/a", QoS::AtLeastOnce, true, "1")
        .await
        .unwrap();
    publ.next(|p| matches!(p, p5::Packet::PubAck(_)).then_some(()))
        .await;

    // Retain handling 2 (never) with retain-as-published.
    let mut never = v5_with(v5_opts(&node, "cfg-never"));
    never.connack().await;
    never
        .subscribe_filter(filter("cfg/#", true, p5::RetainForwardRule::Never))
        .await;
    // Retain handling 0 without retain-as-published.
    let mut plain = v5_with(v5_opts(&node, "cfg-plain"));
    plain.connack().await;
    plain
        .subscribe_filter(filter(
            "cfg/#",
            false,
            p5::RetainForwardRule::OnEverySubscribe,
        ))
        .await;
    let p = plain.publish().await;
    assert_eq!(
        (topic_of(&p).as_str(), p.retain),
        ("cfg/a", true),
        "retained on subscribe"
    );

    publ.client
        .publish("cfg/b", QoS::AtLeastOnce, true, "2")
        .await
        .unwrap();
    let p = never.publish().await;
    assert_eq!(topic_of(&p), "cfg/b", "no retained message with handling 2");
    assert!(
        p.retain,
        "retain-as-published keeps the flag on a live message"
    );
    let p = plain.publish().await;
    assert_eq!(topic_of(&p), "cfg/b");
    assert!(
        !p.retain,
        "a live message has retain 0 without retain-as-published"
    );

    // Retain handling 1: only when the subscription is new.
    let mut once = v5_with(v5_opts(&node, "cfg-once"));
    once.connack().await;
    once.subscribe_filter(filter(
        "cfg/#",
        false,
        p5::RetainForwardRule::OnNewSubscribe,
    ))
    .await;
    let mut got = vec![
        topic_of(&once.publish().await),
        topic_of(&once.publish().await),
    ];
    got.sort();
    assert_eq!(got, vec!["cfg/a", "cfg/b"]);
    once.subscribe_filter(filter(
        "cfg/#",
        false,
        p5::RetainForwardRule::OnNewSubscribe,
    ))
    .await;
    publ.client
        .publish("cfg/marker", QoS::AtLeastOnce, false, "m")
        .await
        .unwrap();
    assert_eq!(
        topic_of(&once.publish().await),
        "cfg/marker",
        "no retained resend"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribe_stops_delivery() {
    use rumqttc::v5::mqttbytes::QoS;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v5_with(v5_opts(&node, "unsub"));
    sub.connack().await;
    sub.subscribe("gone/#", QoS::AtLeastOnce, None).await;
    sub.subscribe("kept/#", QoS::AtLeastOnce, None).await;
    sub.client.unsubscribe("gone/#").await.unwrap();
    sub.next(|p| matches!(p, p5::Packet::UnsubAck(_)).then_some(()))
        .await;
    let mut publ = v5_with(v5_opts(&node, "unsub-pub"));
    publ.connack().await;
    publ.client
        .publish("gone/x", QoS::AtLeastOnce, false, "no")
        .await
        .unwrap();
    publ.client
        .publish("kept/x", QoS::AtLeastOnce, false, "yes")
        .await
        .unwrap();
    let p = sub.publish().await;
    assert_eq!(topic_of(&p), "kept/x");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_are_not_delivered_to_a_returning_session() {
    use rumqttc::v5::mqttbytes::QoS;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut o = v5_opts(&node, "expiring");
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(300));
    let mut sub = v5_with(o.clone());
    sub.connack().await;
    sub.subscribe("exp/#", QoS::AtLeastOnce, None).await;
    sub.client.disconnect().await.unwrap();
    let _ = tokio::time::timeout(WAIT, &mut sub.task).await;

    let mut publ = v5_with(v5_opts(&node, "exp-pub"));
    publ.connack().await;
    let short = p5::PublishProperties {
        message_expiry_interval: Some(1),
        ..Default::default()
    };
    publ.client
        .publish_with_properties("exp/short", QoS::AtLeastOnce, false, "x", short)
        .await
        .unwrap();
    publ.client
        .publish("exp/long", QoS::AtLeastOnce, false, "y")
        .await
        .unwrap();
    for _ in 0..2 {
        publ.next(|p| matches!(p, p5::Packet::PubAck(_)).then_some(()))
            .await;
    }
    // Let the one-second expiry pass while the session is offline.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut sub = v5_with(o);
    assert!(sub.connack().await.session_present);
    let p = sub.publish().await;
    assert_eq!(topic_of(&p), "exp/long", "the expired message was dropped");
    node.stop().await;
}
