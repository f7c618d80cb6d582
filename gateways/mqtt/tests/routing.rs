//! How the router hands messages of one core topic to many sessions, seen
//! through the socket with real clients: exact subscribers among many MQTT topics
//! of one core topic get exactly theirs, wildcard subscribers alongside them get
//! everything, a persistent session catches up after a reconnect, and a QoS 0
//! flood leaves each subscriber an ordered stream and every publish stored.

mod clients;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use clients::*;
use mqttbytes::QoS;
use mqttbytes::v4;
use rocketgate_core::broker::MessagingApi;
use support::{Node, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Receives `n` publishes (QoS 1 ones are acked by rumqttc) as (topic, payload).
async fn take(c: &mut V4, n: usize) -> Vec<(String, String)> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let p = c.publish().await;
        got.push((p.topic, String::from_utf8_lossy(&p.payload).into_owned()));
    }
    got
}

/// Nothing more arrives for a while (used after the expected messages).
async fn quiet(c: &mut V4) {
    let extra = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            match c.rx.recv().await {
                Some(rumqttc::Packet::Publish(p)) => return Some(p),
                Some(_) => continue,
                None => return None,
            }
        }
    })
    .await;
    if let Ok(Some(p)) = extra {
        panic!("unexpected message on {}: {:?}", p.topic, p.payload);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_subscribers_among_many_topics_of_one_core_topic_get_exactly_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    const TOPICS: usize = 6;
    const EACH: usize = 40;
    let mut exact = Vec::new();
    for i in 0..TOPICS {
        let mut s = v4(&node, &format!("exact-{i}"), true);
        s.connack().await;
        s.subscribe(&format!("p2p/run/{i}"), rumqttc::QoS::AtLeastOnce)
            .await;
        exact.push(s);
    }
    // One session with two exact filters, one with wildcards, on the same core topic.
    let mut two = v4(&node, "two-exact", true);
    two.connack().await;
    two.subscribe("p2p/run/1", rumqttc::QoS::AtLeastOnce).await;
    two.subscribe("p2p/run/4", rumqttc::QoS::AtLeastOnce).await;
    let mut all = v4(&node, "wild-all", true);
    all.connack().await;
    all.subscribe("p2p/#", rumqttc::QoS::AtLeastOnce).await;
    let mut plus = v4(&node, "wild-plus", true);
    plus.connack().await;
    plus.subscribe("p2p/+/3", rumqttc::QoS::AtLeastOnce).await;

    let mut pubs = Vec::new();
    for i in 0..TOPICS {
        let mut p = v4(&node, &format!("pub-{i}"), true);
        p.connack().await;
        pubs.push(p);
    }
    for n in 0..EACH {
        for (i, p) in pubs.iter().enumerate() {
            p.client
                .publish(
                    format!("p2p/run/{i}"),
                    rumqttc::QoS::AtLeastOnce,
                    false,
                    format!("{i}:{n}"),
                )
                .await
                .unwrap();
        }
    }

    for (i, s) in exact.iter_mut().enumerate() {
        let got = take(s, EACH).await;
        let want: Vec<(String, String)> = (0..EACH)
            .map(|n| (format!("p2p/run/{i}"), format!("{i}:{n}")))
            .collect();
        assert_eq!(
            got, want,
            "subscriber of p2p/run/{i}: its messages, in order"
        );
        quiet(s).await;
    }
    let got = take(&mut two, 2 * EACH).await;
    for t in [1, 4] {
        let of_t: Vec<&str> = got
            .iter()
            .filter(|(topic, _)| *topic == format!("p2p/run/{t}"))
            .map(|(_, p)| p.as_str())
            .collect();
        let want: Vec<String> = (0..EACH).map(|n| format!("{t}:{n}")).collect();
        assert_eq!(
            of_t, want,
            "two exact filters: all of p2p/run/{t}, in order"
        );
    }
    quiet(&mut two).await;
    let got = take(&mut all, TOPICS * EACH).await;
    for t in 0..TOPICS {
        let of_t: Vec<&str> = got
            .iter()
            .filter(|(topic, _)| *topic == format!("p2p/run/{t}"))
            .map(|(_, p)| p.as_str())
            .collect();
        let want: Vec<String> = (0..EACH).map(|n| format!("{t}:{n}")).collect();
        assert_eq!(of_t, want, "p2p/# gets everything of p2p/run/{t}, in order");
    }
    quiet(&mut all).await;
    let got = take(&mut plus, EACH).await;
    assert!(got.iter().all(|(t, _)| t == "p2p/run/3"), "{got:?}");
    quiet(&mut plus).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_subscriptions_on_a_followed_core_topic_changes_what_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v4(&node, "changer", true);
    sub.connack().await;
    sub.subscribe("chg/a", rumqttc::QoS::AtLeastOnce).await;
    let mut publ = v4(&node, "chg-pub", true);
    publ.connack().await;
    let send = |topic: &'static str, body: &'static str| {
        let c = publ.client.clone();
        async move {
            c.publish(topic, rumqttc::QoS::AtLeastOnce, false, body)
                .await
                .unwrap()
        }
    };
    send("chg/b", "b1").await;
    send("chg/a", "a1").await;
    assert_eq!(take(&mut sub, 1).await, [("chg/a".into(), "a1".into())]);

    // A wildcard on the same core topic: now everything of it arrives.
    sub.subscribe("chg/#", rumqttc::QoS::AtLeastOnce).await;
    send("chg/b", "b2").await;
    send("chg/a", "a2").await;
    assert_eq!(
        take(&mut sub, 2).await,
        [("chg/b".into(), "b2".into()), ("chg/a".into(), "a2".into())]
    );

    // Back to the exact filter only, then a second exact one.
    sub.client.unsubscribe("chg/#").await.unwrap();
    sub.next(|p| matches!(p, rumqttc::Packet::UnsubAck(_)).then_some(()))
        .await;
    send("chg/b", "b3").await;
    send("chg/a", "a3").await;
    assert_eq!(take(&mut sub, 1).await, [("chg/a".into(), "a3".into())]);
    sub.subscribe("chg/c", rumqttc::QoS::AtLeastOnce).await;
    send("chg/b", "b4").await;
    send("chg/c", "c4").await;
    send("chg/a", "a4").await;
    assert_eq!(
        take(&mut sub, 2).await,
        [("chg/c".into(), "c4".into()), ("chg/a".into(), "a4".into())]
    );
    quiet(&mut sub).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_exact_subscriber_catches_up_past_other_topics_after_a_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = v4(&node, "catch-up", false);
    sub.connack().await;
    sub.subscribe("cu/mine", rumqttc::QoS::AtLeastOnce).await;
    // Someone else's busy topic under the same core topic, in the same queue as
    // ours (one publisher): many records the session must move past.
    let mut publ = v4(&node, "cu-pub", true);
    publ.connack().await;
    let burst = |from: usize, n: usize| {
        let c = publ.client.clone();
        async move {
            for k in from..from + n {
                c.publish("cu/other", rumqttc::QoS::AtMostOnce, false, format!("o{k}"))
                    .await
                    .unwrap();
            }
        }
    };
    // Connected: others' messages (more than the router's batches), then ours.
    burst(0, 3000).await;
    for k in 0..3 {
        publ.client
            .publish("cu/mine", rumqttc::QoS::AtLeastOnce, false, format!("m{k}"))
            .await
            .unwrap();
    }
    let got = take(&mut sub, 3).await;
    assert_eq!(
        got.iter().map(|(_, p)| p.as_str()).collect::<Vec<_>>(),
        ["m0", "m1", "m2"]
    );
    sub.client.disconnect().await.unwrap();
    let _ = tokio::time::timeout(WAIT, &mut sub.task).await;

    // Offline: more of both.
    burst(3000, 3000).await;
    for k in 3..6 {
        publ.client
            .publish("cu/mine", rumqttc::QoS::AtLeastOnce, false, format!("m{k}"))
            .await
            .unwrap();
        burst(10_000 + k * 100, 100).await;
    }
    // A QoS 1 publish is acknowledged after everything before it is stored.
    publ.client
        .publish("cu/other", rumqttc::QoS::AtLeastOnce, false, "last")
        .await
        .unwrap();
    publ.next(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
        .await;

    let mut again = v4(&node, "catch-up", false);
    assert!(again.connack().await, "the session is present");
    let got = take(&mut again, 3).await;
    assert_eq!(
        got,
        [
            ("cu/mine".into(), "m3".into()),
            ("cu/mine".into(), "m4".into()),
            ("cu/mine".into(), "m5".into())
        ],
        "exactly the messages published while offline, none twice"
    );
    // Live again after the catch-up.
    publ.client
        .publish("cu/mine", rumqttc::QoS::AtLeastOnce, false, "m6")
        .await
        .unwrap();
    assert_eq!(take(&mut again, 1).await, [("cu/mine".into(), "m6".into())]);
    quiet(&mut again).await;
    node.stop().await;
}

/// A raw 3.1.1 connection (the flood needs more than rumqttc's request channel).
async fn raw_v4(node: &Node, id: &str) -> TcpStream {
    let mut s = TcpStream::connect(node.addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut out = BytesMut::new();
    let mut c = v4::Connect::new(id);
    c.keep_alive = 60;
    c.write(&mut out).unwrap();
    s.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    match read_packet(&mut s, &mut buf).await {
        Some(v4::Packet::ConnAck(a)) => assert_eq!(a.code, v4::ConnectReturnCode::Success),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    s
}

async fn read_packet(s: &mut TcpStream, buf: &mut BytesMut) -> Option<v4::Packet> {
    tokio::time::timeout(WAIT, async {
        loop {
            match v4::read(buf, 1 << 20) {
                Ok(p) => return Some(p),
                Err(mqttbytes::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("bad packet: {e:?}"),
            }
            match s.read_buf(buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("no packet in time")
}

/// What a QoS 0 flood subscriber saw: per topic, the sequence numbers in order.
#[derive(Default, Debug)]
struct Seen {
    per_topic: HashMap<String, Vec<u64>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos0_flood_leaves_ordered_streams_and_stores_every_publish() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    const PUBS: usize = 4;
    const EACH: u64 = 20_000;

    // Exact QoS 0 subscribers, one per topic, and a wildcard one, all reading
    // as fast as they can.
    let tails = Arc::new(AtomicUsize::new(0));
    let mut subs = Vec::new();
    let filters: Vec<String> = (0..PUBS)
        .map(|i| format!("flood/t/{i}"))
        .chain(std::iter::once("flood/#".to_owned()))
        .collect();
    for (i, f) in filters.iter().enumerate() {
        let mut s = raw_v4(&node, &format!("flood-sub-{i}")).await;
        let mut out = BytesMut::new();
        let mut sub = v4::Subscribe::new(f, QoS::AtMostOnce);
        sub.pkid = 1;
        sub.write(&mut out).unwrap();
        s.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        match read_packet(&mut s, &mut buf).await {
            Some(v4::Packet::SubAck(_)) => {}
            other => panic!("expected SUBACK, got {other:?}"),
        }
        let tails = tails.clone();
        subs.push(tokio::spawn(async move {
            let mut seen = Seen::default();
            loop {
                // The stream is over when nothing came for a while after the flood
                // and its end marker (a QoS 0 "end" may itself be dropped).
                let more = tokio::time::timeout(Duration::from_secs(3), async {
                    loop {
                        match v4::read(&mut buf, 1 << 20) {
                            Ok(p) => return Some(p),
                            Err(mqttbytes::Error::InsufficientBytes(_)) => {}
                            Err(e) => panic!("bad packet: {e:?}"),
                        }
                        match s.read_buf(&mut buf).await {
                            Ok(0) | Err(_) => return None,
                            Ok(_) => {}
                        }
                    }
                })
                .await;
                match more {
                    Ok(Some(v4::Packet::Publish(p))) => {
                        let mut b = &p.payload[..];
                        let seq = b.get_u64();
                        let seqs = seen.per_topic.entry(p.topic).or_default();
                        if seq >= EACH && seqs.last().is_none_or(|&l| l < EACH) {
                            tails.fetch_add(1, Ordering::AcqRel);
                        }
                        seqs.push(seq);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return seen,
                }
            }
        }));
    }

    // Publishers write QoS 0 as fast as the broker reads their sockets.
    let mut pubs = Vec::new();
    for i in 0..PUBS {
        let mut s = raw_v4(&node, &format!("flood-pub-{i}")).await;
        pubs.push(tokio::spawn(async move {
            let topic = format!("flood/t/{i}");
            let mut out = BytesMut::new();
            for seq in 0..EACH {
                let p = v4::Publish::new(&topic, QoS::AtMostOnce, seq.to_be_bytes().to_vec());
                p.write(&mut out).unwrap();
                if out.len() > 16 * 1024 {
                    s.write_all(&out).await.unwrap();
                    out.clear();
                }
            }
            // PINGRESP comes after every publish before it is stored.
            v4::PingReq.write(&mut out).unwrap();
            s.write_all(&out).await.unwrap();
            let mut buf = BytesMut::new();
            while !matches!(
                read_packet(&mut s, &mut buf).await,
                Some(v4::Packet::PingResp)
            ) {}
            (topic, s)
        }));
    }
    let mut pubs_done = Vec::new();
    for p in pubs {
        pubs_done.push(p.await.unwrap());
    }

    // Every publish read was stored (flow control slows publishers, it drops none).
    let config = node.broker.topic("flood").await.unwrap();
    let mut stored = 0;
    for q in 0..config.read_queues {
        let (min, max) = node.store.queue_bounds("flood", q);
        stored += max - min;
    }
    assert_eq!(stored, PUBS as u64 * EACH, "every QoS 0 publish stored");

    // Live again after the flood: messages published after it arrive (sent
    // until every subscriber has one of each of its topics, or the wait is over).
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seq = EACH;
    while tails.load(Ordering::Acquire) < 2 * PUBS && tokio::time::Instant::now() < deadline {
        for (topic, s) in &mut pubs_done {
            let mut out = BytesMut::new();
            v4::Publish::new(topic.as_str(), QoS::AtMostOnce, seq.to_be_bytes().to_vec())
                .write(&mut out)
                .unwrap();
            s.write_all(&out).await.unwrap();
        }
        seq += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for (i, s) in subs.into_iter().enumerate() {
        let seen = s.await.unwrap();
        let wildcard = i == PUBS;
        for (topic, seqs) in &seen.per_topic {
            if !wildcard {
                assert_eq!(*topic, format!("flood/t/{i}"), "only its own topic");
            }
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "{topic}: in order, never twice"
            );
        }
        let topics: Vec<&String> = seen.per_topic.keys().collect();
        let want = if wildcard { PUBS } else { 1 };
        assert_eq!(topics.len(), want, "subscriber {i} saw {topics:?}");
        for seqs in seen.per_topic.values() {
            assert!(
                seqs.last().is_some_and(|&s| s >= EACH),
                "subscriber {i} is live again after the flood"
            );
        }
    }
    drop(pubs_done);
    node.stop().await;
}

/// A raw 3.1.1 connection with a persistent session: the stream and whether the
/// session was present.
async fn raw_v4_kept(node: &Node, id: &str) -> (TcpStream, BytesMut, bool) {
    let mut s = TcpStream::connect(node.addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut out = BytesMut::new();
    let mut c = v4::Connect::new(id);
    c.keep_alive = 60;
    c.clean_session = false;
    c.write(&mut out).unwrap();
    s.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    match read_packet(&mut s, &mut buf).await {
        Some(v4::Packet::ConnAck(a)) => {
            assert_eq!(a.code, v4::ConnectReturnCode::Success);
            (s, buf, a.session_present)
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

async fn send_v4(s: &mut TcpStream, p: v4::Packet) {
    let mut out = BytesMut::new();
    match p {
        v4::Packet::Publish(p) => p.write(&mut out),
        v4::Packet::PubAck(p) => p.write(&mut out),
        v4::Packet::Subscribe(p) => p.write(&mut out),
        other => panic!("not sent by this test: {other:?}"),
    }
    .unwrap();
    s.write_all(&out).await.unwrap();
}

/// Subscribes at QoS 1 and waits for the SUBACK.
async fn subscribe_v4(s: &mut TcpStream, buf: &mut BytesMut, filter: &str) {
    let mut sub = v4::Subscribe::new(filter, QoS::AtLeastOnce);
    sub.pkid = 1;
    send_v4(s, v4::Packet::Subscribe(sub)).await;
    assert!(matches!(
        read_packet(s, buf).await,
        Some(v4::Packet::SubAck(_))
    ));
}

async fn publish_v4(s: &mut TcpStream, buf: &mut BytesMut, pkid: u16, topic: &str, payload: &str) {
    let mut p = v4::Publish::new(topic, QoS::AtLeastOnce, payload.as_bytes().to_vec());
    p.pkid = pkid;
    send_v4(s, v4::Packet::Publish(p)).await;
    match read_packet(s, buf).await {
        Some(v4::Packet::PubAck(a)) => assert_eq!(a.pkid, pkid),
        other => panic!("expected PUBACK, got {other:?}"),
    }
}

/// (packet id, topic, payload, dup) of the next PUBLISH.
async fn next_publish(s: &mut TcpStream, buf: &mut BytesMut) -> (u16, String, String, bool) {
    match read_packet(s, buf).await {
        Some(v4::Packet::Publish(p)) => {
            assert_eq!(p.qos, QoS::AtLeastOnce);
            let payload = String::from_utf8(p.payload.to_vec()).unwrap();
            (p.pkid, p.topic, payload, p.dup)
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

/// A 3.1.1 session keeps its messages in flight without a copy of each (they
/// are read back from the log): after a reconnect they come again with their
/// packet ids, DUP set, the same topics and payloads, and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_311_deliveries_are_read_back_from_the_log_and_resent_after_a_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut sub, mut sbuf, present) = raw_v4_kept(&node, "resend").await;
    assert!(!present);
    subscribe_v4(&mut sub, &mut sbuf, "rs/#").await;
    let mut publ = raw_v4(&node, "resend-pub").await;
    let mut pbuf = BytesMut::new();
    publish_v4(&mut publ, &mut pbuf, 1, "rs/a", "one").await;
    publish_v4(&mut publ, &mut pbuf, 2, "rs/b/c", "two").await;
    let first = [
        next_publish(&mut sub, &mut sbuf).await,
        next_publish(&mut sub, &mut sbuf).await,
    ];
    assert_eq!(
        first
            .iter()
            .map(|(_, t, p, dup)| (t.as_str(), p.as_str(), *dup))
            .collect::<Vec<_>>(),
        [("rs/a", "one", false), ("rs/b/c", "two", false)]
    );
    // Not acknowledged: the connection drops and the client comes back.
    drop(sub);
    let (mut sub, mut sbuf, present) = raw_v4_kept(&node, "resend").await;
    assert!(present, "the session is kept");
    for (pkid, topic, payload, _) in &first {
        let again = next_publish(&mut sub, &mut sbuf).await;
        assert_eq!(again, (*pkid, topic.clone(), payload.clone(), true));
        send_v4(&mut sub, v4::Packet::PubAck(v4::PubAck::new(*pkid))).await;
    }
    // Acknowledged now: a new message comes next, and after another reconnect
    // nothing comes again.
    publish_v4(&mut publ, &mut pbuf, 3, "rs/a", "three").await;
    let (pkid, topic, payload, dup) = next_publish(&mut sub, &mut sbuf).await;
    assert_eq!(
        (topic.as_str(), payload.as_str(), dup),
        ("rs/a", "three", false)
    );
    send_v4(&mut sub, v4::Packet::PubAck(v4::PubAck::new(pkid))).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(sub);
    let (mut sub, mut sbuf, present) = raw_v4_kept(&node, "resend").await;
    assert!(present);
    let nothing = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            match sub.read_buf(&mut sbuf).await {
                Ok(0) | Err(_) => return,
                Ok(_) if !sbuf.is_empty() => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        nothing.is_err() && sbuf.is_empty(),
        "nothing resent: {sbuf:?}"
    );
    node.stop().await;
}

/// The resend path when the disk fails (issue #25, item 5): a 3.1.1 delivery in
/// flight is read back from the log at the reconnect; when that read fails with
/// `EIO` the message is kept in flight (not resent now, never dropped), and it is
/// resent, DUP set, at a later reconnect once the disk reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_in_flight_survives_an_io_error_reading_it_back_for_a_resend() {
    use rocketgate_core::store::StoreDeps;
    use rocketgate_core::store::io::Files;
    use rocketgate_core::store::io::faults::{FaultyFiles, Op};

    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let deps = StoreDeps {
        files: Files::new(faults.clone()),
        ..StoreDeps::fixed_usage(0.1)
    };
    let node = Node::start_on(dir.path(), support::settings(dir.path()), deps).await;
    let (mut sub, mut sbuf, _) = raw_v4_kept(&node, "eio-sub").await;
    subscribe_v4(&mut sub, &mut sbuf, "eio/#").await;
    let mut publ = raw_v4(&node, "eio-pub").await;
    let mut pbuf = BytesMut::new();
    publish_v4(&mut publ, &mut pbuf, 1, "eio/a", "keep me").await;
    let (pkid, topic, payload, dup) = next_publish(&mut sub, &mut sbuf).await;
    assert_eq!(
        (topic.as_str(), payload.as_str(), dup),
        ("eio/a", "keep me", false)
    );
    // Not acknowledged; the disk starts failing reads; the client comes back.
    drop(sub);
    faults.fail(Op::Read, Some("commitlog"), libc::EIO, 0, u64::MAX);
    let (mut sub, mut sbuf, present) = raw_v4_kept(&node, "eio-sub").await;
    assert!(present);
    let nothing =
        tokio::time::timeout(Duration::from_millis(500), read_packet(&mut sub, &mut sbuf)).await;
    assert!(
        nothing.is_err(),
        "nothing can be resent while the read fails: {nothing:?}"
    );
    assert!(
        faults.calls(Op::Read) > 0,
        "the resend tried to read it back"
    );
    // The disk reads again: the next reconnect resends it.
    faults.clear();
    drop(sub);
    let (mut sub, mut sbuf, present) = raw_v4_kept(&node, "eio-sub").await;
    assert!(present);
    let again = next_publish(&mut sub, &mut sbuf).await;
    assert_eq!(
        again,
        (pkid, "eio/a".to_owned(), "keep me".to_owned(), true)
    );
    send_v4(&mut sub, v4::Packet::PubAck(v4::PubAck::new(pkid))).await;
    node.stop().await;
}

/// A client that reconnects the moment its connection drops (a device after a
/// network blip) always finds its session: the old connection's going offline
/// and the new one's takeover must not race (the old one used to overwrite the
/// new one's registry entry, and the client got a fresh session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_at_once_always_finds_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let (mut sub, mut sbuf, _) = raw_v4_kept(&node, "blip").await;
    subscribe_v4(&mut sub, &mut sbuf, "blip/#").await;
    for i in 0..40 {
        drop(sub);
        let (again, _, present) = raw_v4_kept(&node, "blip").await;
        assert!(present, "reconnect {i}: the session is gone");
        sub = again;
    }
    node.stop().await;
}
