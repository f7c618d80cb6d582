//! Server redirection (MQTT 5 section 4.11) at the door: `mqtt.server_reference`
//! sends v5 clients a read-only slave cannot serve to another server (DISCONNECT or
//! CONNACK 0x9C with the Server Reference), a master demoted by the controller
//! closes its v5 connections with 0x9C (`Handle::redirect_on_stop`), and
//! `mqtt.moved_to` answers every CONNECT with 0x9D (Server moved). The slave here
//! is this node's store with a slave's replication gate attached (writes refused
//! as on a real slave); `interop-tests/tests/replication.rs` does it with two
//! processes and paho.

mod support;

use std::sync::Arc;

use mqttbytes::QoS;
use mqttbytes::v5::{self, ConnectReturnCode, DisconnectReasonCode, Packet};
use rocketgate_core::store::ha::Gate;
use rumqttc::v5 as c5;
use support::{Node, Raw, WAIT};

const MASTER: &str = "master-host:1883 other-host:1883";

async fn v4_connect(node: &Node, id: &str) -> (Raw, Option<Vec<u8>>) {
    let mut raw = Raw::connect(node.addr).await;
    let mut out = bytes::BytesMut::new();
    mqttbytes::v4::Connect::new(id).write(&mut out).unwrap();
    raw.send_bytes(&out).await;
    let mut got = Vec::new();
    let n = tokio::time::timeout(WAIT, async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        loop {
            match raw.sock.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.len() >= 4 {
                        return Some(got.clone());
                    }
                }
            }
        }
    })
    .await
    .expect("an answer in time");
    (raw, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_door_sends_v5_publishers_and_persistent_sessions_to_the_master() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = support::settings(dir.path());
    s.server_reference = Some(MASTER.into());
    let node = Node::start_with(dir.path(), s).await;
    // The topic exists before the node turns into a slave.
    let (mut raw, ack) = Raw::connect_v5(node.addr, "before", None).await;
    assert_eq!(ack.code, ConnectReturnCode::Success);
    let mut p = v5::Publish::new("t/x", QoS::AtLeastOnce, b"as master".to_vec());
    p.pkid = 1;
    raw.send(Packet::Publish(p)).await;
    assert!(
        matches!(raw.recv().await, Some(Packet::PubAck(a)) if a.reason == v5::PubAckReason::Success)
    );
    node.store
        .attach_replication(Arc::new(Gate::slave("10.0.0.1:10912")))
        .unwrap();

    // A v5 publisher (clean, non-persistent: served for reading) is sent away.
    let (mut raw, ack) = Raw::connect_v5(node.addr, "pub5", None).await;
    assert_eq!(ack.code, ConnectReturnCode::Success);
    let mut p = v5::Publish::new("t/x", QoS::AtLeastOnce, b"to a slave".to_vec());
    p.pkid = 1;
    raw.send(Packet::Publish(p)).await;
    match raw.recv().await {
        Some(Packet::Disconnect(d)) => {
            assert_eq!(d.reason_code, DisconnectReasonCode::UseAnotherServer);
            let p = d.properties.expect("properties");
            assert_eq!(p.server_reference.as_deref(), Some(MASTER));
            assert!(p.reason_string.unwrap().contains("read-only slave"));
        }
        other => panic!("DISCONNECT 0x9C expected, got {other:?}"),
    }
    assert!(raw.recv().await.is_none(), "closed after DISCONNECT");

    // A persistent session it cannot record: CONNACK 0x9C with the reference.
    let mut props = support::connect_props();
    props.session_expiry_interval = Some(3600);
    let (mut raw, ack) = Raw::connect_v5(node.addr, "persistent", Some(props)).await;
    assert_eq!(ack.code, ConnectReturnCode::UseAnotherServer);
    assert_eq!(
        ack.properties.and_then(|p| p.server_reference).as_deref(),
        Some(MASTER)
    );
    assert!(raw.recv().await.is_none());

    // A 3.1.1 publisher is closed without an ack, as before.
    let (mut raw, ack) = v4_connect(&node, "pub4").await;
    assert_eq!(ack.as_deref().map(|a| a[3]), Some(0), "CONNACK accepted");
    let mut out = bytes::BytesMut::new();
    let mut p = mqttbytes::v4::Publish::new("t/x", QoS::AtLeastOnce, b"to a slave".to_vec());
    p.pkid = 1;
    p.write(&mut out).unwrap();
    raw.send_bytes(&out).await;
    let mut rest = Vec::new();
    use tokio::io::AsyncReadExt;
    let n = tokio::time::timeout(WAIT, raw.sock.read_to_end(&mut rest))
        .await
        .expect("closed in time");
    assert!(n.is_ok() && rest.is_empty(), "3.1.1 got {rest:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_door_without_a_reference_still_answers_puback_0x80() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut raw, _) = Raw::connect_v5(node.addr, "before", None).await;
    let mut p = v5::Publish::new("t/x", QoS::AtLeastOnce, b"as master".to_vec());
    p.pkid = 1;
    raw.send(Packet::Publish(p)).await;
    assert!(matches!(raw.recv().await, Some(Packet::PubAck(_))));
    node.store
        .attach_replication(Arc::new(Gate::slave("10.0.0.1:10912")))
        .unwrap();
    let mut p = v5::Publish::new("t/x", QoS::AtLeastOnce, b"to a slave".to_vec());
    p.pkid = 2;
    raw.send(Packet::Publish(p)).await;
    match raw.recv().await {
        Some(Packet::PubAck(a)) => {
            assert_eq!(a.reason, v5::PubAckReason::UnspecifiedError);
            assert!(
                a.properties
                    .unwrap()
                    .reason_string
                    .unwrap()
                    .contains("read-only slave")
            );
        }
        other => panic!("PUBACK 0x80 expected, got {other:?}"),
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_masters_door_sends_v5_clients_to_another_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = support::settings(dir.path());
    s.server_reference = Some(MASTER.into());
    let node = Node::start_with(dir.path(), s).await;
    let (mut v5raw, _) = Raw::connect_v5(node.addr, "dev5", None).await;
    let (mut v4raw, ack) = v4_connect(&node, "dev4").await;
    assert!(ack.is_some());
    node.handle.redirect_on_stop();
    let stop = tokio::spawn(node.stop());
    match v5raw.recv().await {
        Some(Packet::Disconnect(d)) => {
            assert_eq!(d.reason_code, DisconnectReasonCode::UseAnotherServer);
            assert_eq!(
                d.properties.and_then(|p| p.server_reference).as_deref(),
                Some(MASTER)
            );
        }
        other => panic!("DISCONNECT 0x9C expected, got {other:?}"),
    }
    // 3.1.1 has no DISCONNECT from the server: closed.
    let mut rest = Vec::new();
    use tokio::io::AsyncReadExt;
    let _ = tokio::time::timeout(WAIT, v4raw.sock.read_to_end(&mut rest)).await;
    assert!(rest.is_empty(), "3.1.1 got {rest:?}");
    stop.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_service_answers_every_connect_with_server_moved() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = support::settings(dir.path());
    s.moved_to = Some("new-host:1883".into());
    let node = Node::start_with(dir.path(), s).await;
    let (mut raw, ack) = Raw::connect_v5(node.addr, "m5", None).await;
    assert_eq!(ack.code, ConnectReturnCode::ServerMoved);
    assert_eq!(
        ack.properties.and_then(|p| p.server_reference).as_deref(),
        Some("new-host:1883")
    );
    assert!(raw.recv().await.is_none());
    let (_raw, ack) = v4_connect(&node, "m4").await;
    assert_eq!(
        ack.as_deref(),
        Some(&[0x20, 2, 0, 3][..]),
        "3.1.1: server unavailable"
    );
    // rumqttc's v5 client reads the code.
    let o = c5::MqttOptions::new("m5-rumqttc", "127.0.0.1", node.port());
    let (_client, mut el) = c5::AsyncClient::new(o, 10);
    match tokio::time::timeout(WAIT, el.poll())
        .await
        .expect("in time")
    {
        Err(c5::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, c5::mqttbytes::v5::ConnectReturnCode::ServerMoved)
        }
        other => panic!("refused expected, got {other:?}"),
    }
    node.stop().await;
}
