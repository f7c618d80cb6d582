//! MQTT 5 features driven by `rumqttc`'s v5 client: subscription options and
//! identifiers, properties, no-local, shared subscriptions, message expiry.

mod clients;
mod support;

use std::time::Duration;

use bytes::Bytes;
use clients::*;
use rumqttc::v5::mqttbytes::v5 as p5;
use support::{Node, WAIT};

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
    sub.disconnect_and_wait().await;

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
