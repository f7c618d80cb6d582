//! Protocol-level behaviour through a raw socket: bad input gets the spec's
//! reaction and never hurts other clients; flow control; topic aliases;
//! keep-alive; MQTT over an arbitrary byte stream.

mod support;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mqttbytes::QoS;
use mqttbytes::v5::{self, DisconnectReasonCode as Dr, Packet};
use support::{Node, Raw, WAIT, connect_props};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn publish(topic: &str, qos: QoS, pkid: u16, payload: &'static [u8]) -> Packet {
    let mut p = v5::Publish::new(topic, qos, payload);
    p.pkid = pkid;
    Packet::Publish(p)
}

async fn subscribe(raw: &mut Raw, filter: &str, qos: QoS) {
    let mut s = v5::Subscribe::new(filter, qos);
    s.pkid = 1;
    raw.send(Packet::Subscribe(s)).await;
    match raw.recv().await {
        Some(Packet::SubAck(_)) => {}
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

/// A fresh client can still publish and receive: the server survived.
async fn still_serving(node: &Node) {
    let (mut a, _) = Raw::connect_v5(node.addr, "alive-check", None).await;
    subscribe(&mut a, "alive/#", QoS::AtLeastOnce).await;
    a.send(publish("alive/x", QoS::AtLeastOnce, 7, b"yes"))
        .await;
    let mut got_ack = false;
    let mut got_msg = false;
    while !(got_ack && got_msg) {
        match a.recv().await {
            Some(Packet::PubAck(x)) if x.pkid == 7 => got_ack = true,
            Some(Packet::Publish(p)) => {
                assert_eq!(&p.payload[..], b"yes");
                a.send(Packet::PubAck(v5::PubAck::new(p.pkid))).await;
                got_msg = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_early_publish_close_the_connection_only() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    // Random bytes instead of CONNECT.
    let mut raw = Raw::connect(node.addr).await;
    raw.send_bytes(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(raw.recv().await.is_none(), "closed");
    // A PUBLISH before CONNECT.
    let mut raw = Raw::connect(node.addr).await;
    raw.send(publish("a/b", QoS::AtMostOnce, 0, b"x")).await;
    assert!(raw.recv().await.is_none(), "closed");
    // An unsupported protocol level gets CONNACK 0x84.
    let mut raw = Raw::connect(node.addr).await;
    let mut c = BytesMut::new();
    v5::Connect::new("lvl").write(&mut c).unwrap();
    c[8] = 6; // protocol level byte
    raw.send_bytes(&c).await;
    match raw.recv().await {
        Some(Packet::ConnAck(a)) => {
            assert_eq!(a.code, v5::ConnectReturnCode::UnsupportedProtocolVersion)
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
    // A malformed packet after CONNECT: DISCONNECT 0x81.
    let (mut raw, _) = Raw::connect_v5(node.addr, "malformed", None).await;
    raw.send_bytes(&[0x30, 0x02, 0x00, 0x05]).await; // topic length past the packet
    assert_eq!(raw.disconnect_reason().await, Some(Dr::MalformedPacket));
    // A SUBSCRIBE without filters: DISCONNECT 0x82.
    let (mut raw, _) = Raw::connect_v5(node.addr, "nofilter", None).await;
    raw.send_bytes(&[0x82, 0x03, 0x00, 0x01, 0x00]).await;
    assert_eq!(raw.disconnect_reason().await, Some(Dr::ProtocolError));
    still_serving(&node).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_second_connect_wildcard_and_bad_utf8_get_their_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut raw, ack) = Raw::connect_v5(node.addr, "big", None).await;
    let max = ack.properties.unwrap().max_packet_size.unwrap();
    let big = vec![b'x'; max as usize + 10];
    let mut p = v5::Publish::new("a/b", QoS::AtMostOnce, big);
    p.pkid = 0;
    raw.send(Packet::Publish(p)).await;
    assert_eq!(raw.disconnect_reason().await, Some(Dr::PacketTooLarge));

    let (mut raw, _) = Raw::connect_v5(node.addr, "twice", None).await;
    raw.send(Packet::Connect(v5::Connect::new("twice"))).await;
    assert_eq!(raw.disconnect_reason().await, Some(Dr::ProtocolError));

    let (mut raw, _) = Raw::connect_v5(node.addr, "wild", None).await;
    raw.send(publish("a/+/b", QoS::AtLeastOnce, 1, b"x")).await;
    assert_eq!(raw.disconnect_reason().await, Some(Dr::TopicNameInvalid));

    let (mut raw, _) = Raw::connect_v5(node.addr, "utf8", None).await;
    // PUBLISH QoS 0, topic of 2 bytes that are not UTF-8, no properties.
    raw.send_bytes(&[0x30, 0x06, 0x00, 0x02, 0xff, 0xfe, 0x00, b'x'])
        .await;
    assert_eq!(raw.disconnect_reason().await, Some(Dr::MalformedPacket));

    // A 3.1.1 client sending a bad packet is just closed.
    let mut raw = Raw::connect(node.addr).await;
    let mut c = BytesMut::new();
    mqttbytes::v4::Connect::new("v4-bad").write(&mut c).unwrap();
    raw.send_bytes(&c).await;
    let mut ack = [0u8; 4];
    raw.sock.read_exact(&mut ack).await.unwrap();
    assert_eq!(ack, [0x20, 2, 0, 0], "3.1.1 CONNACK");
    raw.send_bytes(&[0xF0, 0x00]).await; // AUTH does not exist in 3.1.1
    assert!(raw.recv().await.is_none());
    still_serving(&node).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_topic_name_gets_a_negative_puback_with_a_reason_string() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut raw, _) = Raw::connect_v5(node.addr, "neg", None).await;
    raw.send(publish("$SYS/broker/x", QoS::AtLeastOnce, 3, b"x"))
        .await;
    match raw.recv().await {
        Some(Packet::PubAck(a)) => {
            assert_eq!(a.pkid, 3);
            assert_eq!(a.reason, v5::PubAckReason::TopicNameInvalid);
            assert!(
                a.properties
                    .unwrap()
                    .reason_string
                    .unwrap()
                    .contains("$SYS/ topics are the broker's own")
            );
        }
        other => panic!("expected PUBACK, got {other:?}"),
    }
    // Invalid filters get SUBACK 0x8F, valid ones in the same packet are granted.
    let mut s = v5::Subscribe::new("a/#/b", QoS::AtLeastOnce);
    s.filters
        .push(v5::SubscribeFilter::new("ok/+".into(), QoS::AtLeastOnce));
    s.pkid = 9;
    raw.send(Packet::Subscribe(s)).await;
    match raw.recv().await {
        Some(Packet::SubAck(a)) => assert_eq!(
            a.return_codes,
            vec![
                v5::SubscribeReasonCode::TopicFilterInvalid,
                v5::SubscribeReasonCode::QoS1
            ]
        ),
        other => panic!("expected SUBACK, got {other:?}"),
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_timeout_disconnects_with_0x8d() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut raw = Raw::connect(node.addr).await;
    let mut c = v5::Connect::new("sleepy");
    c.keep_alive = 1;
    raw.send(Packet::Connect(c)).await;
    assert!(matches!(raw.recv().await, Some(Packet::ConnAck(_))));
    assert_eq!(raw.disconnect_reason().await, Some(Dr::KeepAliveTimeout));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_maximum_limits_messages_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut props = connect_props();
    props.session_expiry_interval = Some(300);
    let (mut sub, _) = Raw::connect_v5(node.addr, "windowed", Some(props.clone())).await;
    subscribe(&mut sub, "win/#", QoS::AtLeastOnce).await;
    drop(sub);
    let (mut publ, _) = Raw::connect_v5(node.addr, "win-pub", None).await;
    for i in 1..=10u16 {
        publ.send(publish("win/x", QoS::AtLeastOnce, i, b"m")).await;
    }
    for _ in 0..10 {
        assert!(matches!(publ.recv().await, Some(Packet::PubAck(_))));
    }
    // Reconnect with a window of 2: two come, then one per ack.
    props.receive_maximum = Some(2);
    let mut c = v5::Connect::new("windowed");
    c.clean_session = false;
    c.properties = Some(props);
    let mut sub = Raw::connect(node.addr).await;
    sub.send(Packet::Connect(c)).await;
    match sub.recv().await {
        Some(Packet::ConnAck(a)) => assert!(a.session_present),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    let mut inflight = Vec::new();
    for _ in 0..2 {
        match sub.recv().await {
            Some(Packet::Publish(p)) => inflight.push(p.pkid),
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
    // The window is full: a ping is answered before any third message.
    sub.send(Packet::PingReq).await;
    assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
    let mut received = 2;
    while received < 10 {
        sub.send(Packet::PubAck(v5::PubAck::new(inflight.remove(0))))
            .await;
        match sub.recv().await {
            Some(Packet::Publish(p)) => inflight.push(p.pkid),
            other => panic!("expected PUBLISH, got {other:?}"),
        }
        received += 1;
        sub.send(Packet::PingReq).await;
        assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_aliases_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut props = connect_props();
    props.topic_alias_max = Some(5);
    let (mut sub, _) = Raw::connect_v5(node.addr, "alias-sub", Some(props)).await;
    subscribe(&mut sub, "alias/#", QoS::AtMostOnce).await;
    let (mut publ, _) = Raw::connect_v5(node.addr, "alias-pub", None).await;
    for (topic, payload) in [("alias/long/topic", &b"1"[..]), ("", &b"2"[..])] {
        let mut p = v5::Publish::new(topic, QoS::AtLeastOnce, payload);
        p.pkid = if topic.is_empty() { 2 } else { 1 };
        let mut pr = empty_props();
        pr.topic_alias = Some(3);
        p.properties = Some(pr);
        publ.send(Packet::Publish(p)).await;
        assert!(
            matches!(publ.recv().await, Some(Packet::PubAck(a)) if a.reason == v5::PubAckReason::Success)
        );
    }
    // The server aliases towards the subscriber: full topic once, then the alias.
    let first = match sub.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!(first.topic, "alias/long/topic");
    let alias = first
        .properties
        .unwrap()
        .topic_alias
        .expect("an alias is set");
    let second = match sub.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("{other:?}"),
    };
    assert_eq!(second.topic, "");
    assert_eq!(second.properties.unwrap().topic_alias, Some(alias));
    assert_eq!(&second.payload[..], b"2");
    // An unknown alias is a protocol error.
    let mut p = v5::Publish::new("", QoS::AtMostOnce, &b"x"[..]);
    let mut pr = empty_props();
    pr.topic_alias = Some(4);
    p.properties = Some(pr);
    publ.send(Packet::Publish(p)).await;
    assert_eq!(publ.disconnect_reason().await, Some(Dr::ProtocolError));
    node.stop().await;
}

fn empty_props() -> v5::PublishProperties {
    v5::PublishProperties {
        payload_format_indicator: None,
        message_expiry_interval: None,
        topic_alias: None,
        response_topic: None,
        correlation_data: None,
        user_properties: Vec::new(),
        subscription_identifiers: Vec::new(),
        content_type: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos2_inbound_is_stored_once_even_when_retransmitted() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut sub, _) = Raw::connect_v5(node.addr, "q2-sub", None).await;
    subscribe(&mut sub, "q2/#", QoS::ExactlyOnce).await;
    let (mut publ, _) = Raw::connect_v5(node.addr, "q2-pub", None).await;
    publ.send(publish("q2/a", QoS::ExactlyOnce, 11, b"once"))
        .await;
    assert!(matches!(publ.recv().await, Some(Packet::PubRec(r)) if r.pkid == 11));
    // Retransmitted with DUP before PUBREL: acknowledged, not stored again.
    let mut again = v5::Publish::new("q2/a", QoS::ExactlyOnce, &b"once"[..]);
    again.pkid = 11;
    again.dup = true;
    publ.send(Packet::Publish(again)).await;
    assert!(matches!(publ.recv().await, Some(Packet::PubRec(r)) if r.pkid == 11));
    publ.send(Packet::PubRel(v5::PubRel::new(11))).await;
    assert!(matches!(publ.recv().await, Some(Packet::PubComp(c)) if c.pkid == 11));
    publ.send(publish("q2/b", QoS::ExactlyOnce, 12, b"marker"))
        .await;
    // The subscriber side: QoS 2 handshake outbound (several may be in flight).
    let mut payloads = Vec::new();
    let mut completed = 0;
    while completed < 2 {
        match sub.recv().await {
            Some(Packet::Publish(p)) => {
                assert_eq!(p.qos, QoS::ExactlyOnce);
                sub.send(Packet::PubRec(v5::PubRec::new(p.pkid))).await;
                payloads.push(p.payload.clone());
            }
            Some(Packet::PubRel(r)) => {
                sub.send(Packet::PubComp(v5::PubComp::new(r.pkid))).await;
                completed += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        payloads,
        vec![Bytes::from_static(b"once"), Bytes::from_static(b"marker")]
    );
    node.stop().await;
}

/// Acknowledgements settle what they acknowledge and nothing else, however the
/// reads cut them: several in one read with another packet between them, one
/// split across two reads, one for an id not in flight, and a PUBCOMP for a
/// QoS 2 message the client never sent a PUBREC for (not released, so not
/// complete). What is left in flight comes again on resume, and only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_settle_only_what_they_acknowledge_however_read() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut props = connect_props();
    props.session_expiry_interval = Some(300);
    let (mut sub, _) = Raw::connect_v5(node.addr, "acker", Some(props.clone())).await;
    subscribe(&mut sub, "acks/#", QoS::ExactlyOnce).await;
    let (mut publ, _) = Raw::connect_v5(node.addr, "acks-pub", None).await;
    publ.send(publish("acks/x", QoS::AtLeastOnce, 1, b"one"))
        .await;
    publ.send(publish("acks/x", QoS::AtLeastOnce, 2, b"two"))
        .await;
    publ.send(publish("acks/x", QoS::ExactlyOnce, 3, b"three"))
        .await;
    assert!(matches!(publ.recv().await, Some(Packet::PubAck(a)) if a.pkid == 1));
    assert!(matches!(publ.recv().await, Some(Packet::PubAck(a)) if a.pkid == 2));
    assert!(matches!(publ.recv().await, Some(Packet::PubRec(r)) if r.pkid == 3));
    publ.send(Packet::PubRel(v5::PubRel::new(3))).await;
    assert!(matches!(publ.recv().await, Some(Packet::PubComp(c)) if c.pkid == 3));

    let mut ids = Vec::new();
    while ids.len() < 3 {
        match sub.recv().await {
            Some(Packet::Publish(p)) => ids.push((p.payload.clone(), p.pkid, p.qos)),
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
    let id_of = |payload: &[u8]| ids.iter().find(|(p, ..)| &p[..] == payload).unwrap().1;
    let (one, two, three) = (id_of(b"one"), id_of(b"two"), id_of(b"three"));
    let unknown = (1..=u16::MAX)
        .find(|id| ![one, two, three].contains(id))
        .unwrap();
    let mut wire = BytesMut::new();
    v5::PubAck::new(one).write(&mut wire).unwrap();
    v5::PingReq.write(&mut wire).unwrap();
    v5::PubAck::new(unknown).write(&mut wire).unwrap();
    v5::PubComp::new(three).write(&mut wire).unwrap();
    v5::PubAck::new(two).write(&mut wire).unwrap();
    let split = wire.len() - 2;
    sub.send_bytes(&wire[..split]).await;
    assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
    sub.send_bytes(&wire[split..]).await;
    sub.send(Packet::PingReq).await;
    assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
    drop(sub);

    // Only "three" was not acknowledged as its flow asks: it comes again, and
    // its PUBCOMP after the PUBREL (split across reads too) completes it.
    let addr = node.addr;
    let resume = |props: v5::ConnectProperties| async move {
        let mut c = v5::Connect::new("acker");
        c.clean_session = false;
        c.properties = Some(props);
        let mut sub = Raw::connect(addr).await;
        sub.send(Packet::Connect(c)).await;
        assert!(matches!(sub.recv().await, Some(Packet::ConnAck(a)) if a.session_present));
        sub
    };
    let mut sub = resume(props.clone()).await;
    let again = match sub.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("expected \"three\" again, got {other:?}"),
    };
    assert_eq!(&again.payload[..], b"three");
    assert!(again.dup);
    assert_eq!(again.qos, QoS::ExactlyOnce);
    sub.send(Packet::PingReq).await;
    assert!(
        matches!(sub.recv().await, Some(Packet::PingResp)),
        "nothing else was in flight"
    );
    sub.send(Packet::PubRec(v5::PubRec::new(again.pkid))).await;
    assert!(matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.pkid == again.pkid));
    let mut comp = BytesMut::new();
    v5::PubComp::new(again.pkid).write(&mut comp).unwrap();
    sub.send_bytes(&comp[..1]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    sub.send_bytes(&comp[1..]).await;
    sub.send(Packet::PingReq).await;
    assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
    drop(sub);

    let mut sub = resume(props).await;
    sub.send(Packet::PingReq).await;
    assert!(
        matches!(sub.recv().await, Some(Packet::PingResp)),
        "nothing is in flight any more"
    );
    node.stop().await;
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stream_runs_mqtt_over_any_byte_stream_with_shared_state() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (client, server) = tokio::io::duplex(64 * 1024);
    let streams = node.handle.streams();
    let peer = "127.0.0.1:9".parse().unwrap();
    let served = tokio::spawn(async move { streams.serve_stream(server, peer, None).await });
    let (mut rd, mut wr) = tokio::io::split(client);
    let mut out = BytesMut::new();
    v5::Connect::new("over-stream").write(&mut out).unwrap();
    let mut s = v5::Subscribe::new("stream/#", QoS::AtLeastOnce);
    s.pkid = 1;
    s.write(&mut out).unwrap();
    wr.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let mut next = async || loop {
        if let Ok(p) = v5::read(&mut buf, 1 << 20) {
            return p;
        }
        let n = tokio::time::timeout(WAIT, rd.read_buf(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "stream closed");
    };
    assert!(matches!(next().await, Packet::ConnAck(_)));
    assert!(matches!(next().await, Packet::SubAck(_)));
    // A TCP client publishes; the stream client receives (one router, one registry).
    let (mut publ, _) = Raw::connect_v5(node.addr, "tcp-pub", None).await;
    publ.send(publish("stream/x", QoS::AtLeastOnce, 1, b"hello"))
        .await;
    match next().await {
        Packet::Publish(p) => assert_eq!(&p.payload[..], b"hello"),
        other => panic!("{other:?}"),
    }
    let mut out = BytesMut::new();
    v5::Disconnect::new().write(&mut out).unwrap();
    wr.write_all(&out).await.unwrap();
    tokio::time::timeout(WAIT, served).await.unwrap().unwrap();
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_shutdown_sends_disconnect_0x8b() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut raw, _) = Raw::connect_v5(node.addr, "bye", None).await;
    let stop = tokio::spawn(node.stop());
    assert_eq!(raw.disconnect_reason().await, Some(Dr::ServerShuttingDown));
    tokio::time::timeout(Duration::from_secs(20), stop)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leading_wildcards_see_new_core_topics() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut sub, _) = Raw::connect_v5(node.addr, "wild-sub", None).await;
    subscribe(&mut sub, "+/status/#", QoS::AtLeastOnce).await;
    let (mut publ, _) = Raw::connect_v5(node.addr, "wild-pub", None).await;
    // Neither topic existed when the subscription was made.
    publ.send(publish("brandnew/status/x", QoS::AtLeastOnce, 1, b"a"))
        .await;
    publ.send(publish("other/status", QoS::AtLeastOnce, 2, b"b"))
        .await;
    let mut got = Vec::new();
    while got.len() < 2 {
        match sub.recv().await {
            Some(Packet::Publish(p)) => {
                sub.send(Packet::PubAck(v5::PubAck::new(p.pkid))).await;
                got.push(p.topic);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    got.sort();
    assert_eq!(got, vec!["brandnew/status/x", "other/status"]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_are_redelivered_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut props = connect_props();
    props.session_expiry_interval = Some(600);
    let (mut sub, _) = Raw::connect_v5(node.addr, "unacked", Some(props.clone())).await;
    subscribe(&mut sub, "inflight/#", QoS::AtLeastOnce).await;
    let (mut publ, _) = Raw::connect_v5(node.addr, "unacked-pub", None).await;
    publ.send(publish("inflight/a", QoS::AtLeastOnce, 1, b"keep me"))
        .await;
    assert!(matches!(publ.recv().await, Some(Packet::PubAck(_))));
    match sub.recv().await {
        Some(Packet::Publish(p)) => assert_eq!(&p.payload[..], b"keep me"),
        other => panic!("expected PUBLISH, got {other:?}"),
    }
    // Never acknowledged; the broker restarts.
    drop(sub);
    drop(publ);
    let node = node.restart().await;
    let mut c = v5::Connect::new("unacked");
    c.clean_session = false;
    c.properties = Some(props);
    let mut sub = Raw::connect(node.addr).await;
    sub.send(Packet::Connect(c)).await;
    assert!(matches!(sub.recv().await, Some(Packet::ConnAck(a)) if a.session_present));
    match sub.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!(&p.payload[..], b"keep me");
            sub.send(Packet::PubAck(v5::PubAck::new(p.pkid))).await;
        }
        other => panic!("expected the un-acked PUBLISH again, got {other:?}"),
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_the_core_cannot_store_is_never_acknowledged_to_a_311_client() {
    use rocketgate_core::broker::{MessagingApi, Perm, TopicConfig};
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut ro = TopicConfig::new("readonly", 1);
    ro.perm = Perm::READ;
    node.broker.create_topic(ro).await.unwrap();

    // v5: a negative PUBACK says why.
    let (mut raw, _) = Raw::connect_v5(node.addr, "v5-ro", None).await;
    raw.send(publish("readonly/x", QoS::AtLeastOnce, 4, b"x"))
        .await;
    match raw.recv().await {
        Some(Packet::PubAck(a)) => {
            assert_eq!(a.pkid, 4);
            assert_eq!(a.reason, v5::PubAckReason::UnspecifiedError);
        }
        other => panic!("expected a negative PUBACK, got {other:?}"),
    }

    // 3.1.1 has no negative PUBACK: no acknowledgement, the connection ends, so the
    // client does not believe the message stored.
    let mut raw = Raw::connect(node.addr).await;
    let mut out = BytesMut::new();
    mqttbytes::v4::Connect::new("v4-ro")
        .write(&mut out)
        .unwrap();
    let mut p = mqttbytes::v4::Publish::new("readonly/x", QoS::AtLeastOnce, "x");
    p.pkid = 5;
    p.write(&mut out).unwrap();
    raw.send_bytes(&out).await;
    let mut ack = [0u8; 4];
    raw.sock.read_exact(&mut ack).await.unwrap();
    assert_eq!(ack, [0x20, 2, 0, 0], "3.1.1 CONNACK");
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, raw.sock.read_to_end(&mut rest))
        .await
        .expect("the connection ends")
        .ok();
    assert!(
        rest.is_empty(),
        "no PUBACK for an unstored message: {rest:02x?}"
    );
    still_serving(&node).await;
    node.stop().await;
}
