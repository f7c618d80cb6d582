//! An operator's offset reset of a persistent session's group
//! (`mqtt%c%<client id>`, what `POST /v1/groups/{group}/offsets/reset` calls)
//! reaches the session the broker holds in memory: while it is connected, and
//! while it is offline, without a restart. Driven by `rumqttc`.

mod clients;
mod support;

use clients::*;
use rocketgate_core::broker::{MessagingApi, OffsetReset};
use support::Node;

const GROUP: &str = "mqtt%c%reset-sub";

async fn publish_five(node: &Node) {
    let mut publ = v4(node, "reset-pub", true);
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
    for _ in 0..5 {
        publ.next(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
            .await;
    }
    publ.client.disconnect().await.unwrap();
}

async fn expect_five(sub: &mut V4) {
    for i in 0..5 {
        let p = sub.publish().await;
        assert_eq!(p.topic, "orders/eu");
        assert_eq!(&p.payload[..], format!("o{i}").as_bytes());
    }
}

/// Waits until the session has committed its place past the five messages, so
/// the reset below really moves it back (not a reset racing the first commit).
async fn wait_committed(node: &Node) {
    let deadline = tokio::time::Instant::now() + support::WAIT;
    loop {
        let stats = node.broker.queue_stats("orders").await.unwrap();
        let mut done = true;
        for q in stats {
            let at = node
                .broker
                .query_offset(GROUP, "", "orders", q.queue_id)
                .await
                .unwrap()
                .unwrap_or(0);
            done &= at >= q.max_offset;
        }
        if done {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session never committed its offsets"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A persistent session subscribed to `orders/#` that got five messages and
/// committed its place past them.
async fn session_past_five(node: &Node) -> V4 {
    let mut sub = v4(node, "reset-sub", false);
    sub.connack().await;
    sub.subscribe("orders/#", rumqttc::QoS::AtLeastOnce).await;
    publish_five(node).await;
    expect_five(&mut sub).await;
    wait_committed(node).await;
    sub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_reaches_a_connected_persistent_session() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = session_past_five(&node).await;

    let moved = node
        .broker
        .reset_offset(GROUP, "", "orders", OffsetReset::Earliest)
        .await
        .unwrap();
    assert!(moved.iter().all(|(_, o)| *o == 0), "{moved:?}");
    // The same connection reads the five again, in order, and then live ones.
    expect_five(&mut sub).await;
    let mut publ = v4(&node, "reset-pub", true);
    publ.connack().await;
    publ.client
        .publish("orders/us", rumqttc::QoS::AtLeastOnce, false, "live")
        .await
        .unwrap();
    assert_eq!(&sub.publish().await.payload[..], b"live");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_while_offline_wins_over_the_sessions_own_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = session_past_five(&node).await;
    sub.client.disconnect().await.unwrap();
    let _ = tokio::time::timeout(support::WAIT, &mut sub.task).await;

    node.broker
        .reset_offset(GROUP, "", "orders", OffsetReset::Earliest)
        .await
        .unwrap();
    let mut sub = v4(&node, "reset-sub", false);
    assert!(sub.connack().await, "the session is still held");
    expect_five(&mut sub).await;
    node.stop().await;
}
