//! The client's Maximum Packet Size bounds the server's own diagnostics too: a reason
//! string or user property that would make a packet larger than the client accepts is
//! left out, and the packet (with its reason code) is still sent — MQTT-3.2.2-19/20
//! (CONNACK), 3.4.2-2/3 (PUBACK), 3.5.2-2/3 (PUBREC), 3.9.2-1/2 (SUBACK),
//! 3.14.2-3/4 (DISCONNECT) of MQTT 5.

mod support;

use mqttbytes::QoS;
use mqttbytes::v5::{self, PubAckReason, SubscribeReasonCode};
use support::{Node, Raw, connect_props};

fn limited(max: u32) -> Option<v5::ConnectProperties> {
    let mut p = connect_props();
    p.max_packet_size = Some(max);
    Some(p)
}

async fn refused_puback(raw: &mut Raw) -> v5::PubAck {
    let mut p = v5::Publish::new("$SYS/not-yours", QoS::AtLeastOnce, b"x".to_vec());
    p.pkid = 1;
    raw.send(v5::Packet::Publish(p)).await;
    match raw.recv().await {
        Some(v5::Packet::PubAck(a)) => a,
        other => panic!("expected PUBACK, got {other:?}"),
    }
}

#[tokio::test]
async fn reason_strings_are_dropped_when_they_would_exceed_the_clients_maximum_packet_size() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;

    // Without a limit the refusal carries its reason string (so the case is real).
    let (mut free, _) = Raw::connect_v5(node.addr, "free", Some(connect_props())).await;
    let a = refused_puback(&mut free).await;
    assert_eq!(a.reason, PubAckReason::TopicNameInvalid);
    let reason = a
        .properties
        .and_then(|p| p.reason_string)
        .expect("a reason string without a packet size limit");
    assert!(reason.len() > 24, "reason string {reason:?}");

    // With a 24-byte limit: same reason code, no reason string, nothing oversize.
    let (mut small, ack) = Raw::connect_v5(node.addr, "small", limited(24)).await;
    assert_eq!(ack.code, v5::ConnectReturnCode::Success);
    let before = small.buf.len();
    let a = refused_puback(&mut small).await;
    assert_eq!(before, 0);
    assert_eq!(a.reason, PubAckReason::TopicNameInvalid);
    assert!(
        a.properties
            .as_ref()
            .and_then(|p| p.reason_string.as_ref())
            .is_none(),
        "reason string sent past the client's maximum packet size: {a:?}"
    );

    // A SUBACK refusing a bad filter: the code arrives, the long reason does not.
    let bad = format!("a/#/{}", "b".repeat(40));
    let mut s = v5::Subscribe::new(bad, QoS::AtLeastOnce);
    s.pkid = 2;
    small.send(v5::Packet::Subscribe(s)).await;
    match small.recv().await {
        Some(v5::Packet::SubAck(a)) => {
            assert_eq!(
                a.return_codes,
                vec![SubscribeReasonCode::TopicFilterInvalid]
            );
            assert!(a.properties.is_none_or(|p| p.reason_string.is_none()));
        }
        other => panic!("expected SUBACK, got {other:?}"),
    }

    // The connection is still usable afterwards.
    small.send(v5::Packet::PingReq).await;
    assert!(matches!(small.recv().await, Some(v5::Packet::PingResp)));
    node.stop().await;
}
