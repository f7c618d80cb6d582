//! A connection starts on a small read buffer (memory per idle connection) and
//! grows it for what it is sent: large and back-to-back packets arrive intact
//! after the connection sat idle, driven by `rumqttc`.

mod clients;
mod support;

use std::time::Duration;

use clients::*;
use support::Node;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_many_packets_after_an_idle_start_arrive_intact() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let opts = |id: &str| {
        let mut o = rumqttc::MqttOptions::new(id, "127.0.0.1", node.port());
        o.set_keep_alive(Duration::from_secs(30));
        o.set_max_packet_size(1 << 20, 1 << 20);
        o
    };
    let mut sub = v4_with(opts("buf-sub"));
    sub.connack().await;
    sub.subscribe("blobs/#", rumqttc::QoS::AtLeastOnce).await;

    let mut publ = v4_with(opts("buf-pub"));
    publ.connack().await;
    // Idle for a moment on the small buffer, then a burst: one 30 KB message (the test node takes packets up to 32 KiB)
    // (many reads into a growing buffer) and 200 small ones behind it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let big: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
    publ.client
        .publish("blobs/big", rumqttc::QoS::AtLeastOnce, false, big.clone())
        .await
        .unwrap();
    for i in 0..200 {
        publ.client
            .publish(
                "blobs/small",
                rumqttc::QoS::AtLeastOnce,
                false,
                format!("s{i}"),
            )
            .await
            .unwrap();
    }
    let first = sub.publish().await;
    assert_eq!(first.topic, "blobs/big");
    assert_eq!(
        &first.payload[..],
        &big[..],
        "the large message byte for byte"
    );
    for i in 0..200 {
        let p = sub.publish().await;
        assert_eq!(&p.payload[..], format!("s{i}").as_bytes());
    }
    node.stop().await;
}
