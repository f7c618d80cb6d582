//! The gateway driven by `rumqttc` (v4 = MQTT 3.1.1 and v5 clients), through the
//! socket, against a real broker on a temp dir: QoS, mapping, sessions, retained,
//! take-over, wills.

mod clients;
mod support;

use std::time::Duration;

use bytes::Bytes;
use clients::*;
use rocketgate_core::broker::{MessagingApi, PullRequest, QueueChoice, filter::Filter};
use rocketgate_core::store::{Message, RecordView};
use rumqttc::v5::mqttbytes::v5 as p5;
use support::{Node, WAIT};

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
    // Acknowledged means in the broker's state topic, before any clean shutdown.
    let saved = support::state_entries(&node).await;
    for (topic, payload) in [
        ("status/dev1", "online"),
        ("status/dev2", "v2"),
        ("status/dev3", ""),
    ] {
        assert!(
            saved
                .iter()
                .any(|(h, b)| h.contains(topic) && b == payload.as_bytes()),
            "{topic} {payload:?} in {saved:?}"
        );
    }
    assert!(!dir.path().join("mqtt").exists(), "no state files");
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
    polite.disconnect_and_wait().await;
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
