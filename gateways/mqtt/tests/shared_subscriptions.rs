//! Shared subscriptions (`$share/<group>/<filter>`) through the socket with real
//! clients: rumqttc v5 members and publishers, and a raw client for a member
//! that never acknowledges.

mod clients;
mod support;

use std::collections::{BTreeMap, BTreeSet};

use clients::*;
use mqttbytes::v5 as raw5;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5 as p5;
use support::{Node, Raw, WAIT};

/// Publishes every payload at QoS 1 and waits until each is acknowledged (stored).
async fn publish_all(p: &mut V5, topic: &str, payloads: &[String]) {
    for body in payloads {
        p.client
            .publish(topic, QoS::AtLeastOnce, false, body.clone())
            .await
            .unwrap();
    }
    let mut acked = 0;
    while acked < payloads.len() {
        p.next(|pk| matches!(pk, p5::Packet::PubAck(_)).then_some(()))
            .await;
        acked += 1;
    }
}

/// Receives from every member until `want` distinct payloads arrived (or the
/// wait runs out); returns what each member got, in arrival order.
async fn collect(members: &mut [V5], want: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut got: Vec<Vec<String>> = vec![Vec::new(); members.len()];
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seen = BTreeSet::new();
    while !want.is_subset(&seen) && tokio::time::Instant::now() < deadline {
        let mut any = false;
        for (i, m) in members.iter_mut().enumerate() {
            while let Ok(p) = m.rx.try_recv() {
                if let p5::Packet::Publish(p) = p {
                    let body = String::from_utf8(p.payload.to_vec()).unwrap();
                    seen.insert(body.clone());
                    got[i].push(body);
                    any = true;
                }
            }
        }
        if !any {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    got
}

/// Every payload in `got` with how often it arrived.
fn counts(got: &[Vec<String>]) -> BTreeMap<String, usize> {
    let mut c = BTreeMap::new();
    for g in got {
        for b in g {
            *c.entry(b.clone()).or_insert(0) += 1;
        }
    }
    c
}

fn payloads(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_three_receives_every_message_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut members = vec![
        share_member(&node, "three-a").await,
        share_member(&node, "three-b").await,
        share_member(&node, "three-c").await,
    ];
    // Three publishers, so the messages spread over several core queues.
    let mut all = BTreeSet::new();
    for p in 0..3 {
        let mut publ = v5_with(v5_opts(&node, &format!("three-pub-{p}")));
        publ.connack().await;
        let bodies = payloads(&format!("p{p}"), 200);
        publish_all(&mut publ, &format!("jobs/p{p}"), &bodies).await;
        all.extend(bodies);
    }
    let got = collect(&mut members, &all).await;
    // Then a second round: anything delivered twice by now would show up.
    let mut publ = v5_with(v5_opts(&node, "three-pub-tail"));
    publ.connack().await;
    let tail = payloads("tail", 30);
    publish_all(&mut publ, "jobs/tail", &tail).await;
    let tail_got = collect(&mut members, &tail.iter().cloned().collect()).await;

    let mut c = counts(&got);
    for (b, n) in counts(&tail_got) {
        *c.entry(b).or_insert(0) += n;
    }
    let missing: Vec<_> = all
        .iter()
        .chain(&tail)
        .filter(|b| !c.contains_key(*b))
        .collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
    let twice: Vec<_> = c.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    assert_eq!(c.len(), all.len() + tail.len());
    for (i, g) in got.iter().enumerate() {
        assert!(!g.is_empty(), "member {i} got no share of the work");
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_of_a_member_that_disconnects_reach_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    // A member that receives but never sends PUBACK.
    let (mut silent, _) = Raw::connect_v5(node.addr, "silent", None).await;
    let mut sub = raw5::Subscribe::new(SHARE_FILTER, mqttbytes::QoS::AtLeastOnce);
    sub.pkid = 1;
    silent.send(raw5::Packet::Subscribe(sub)).await;
    match silent.recv().await {
        Some(raw5::Packet::SubAck(_)) => {}
        other => panic!("expected SUBACK, got {other:?}"),
    }
    let mut others = vec![
        share_member(&node, "steady-b").await,
        share_member(&node, "steady-c").await,
    ];
    let mut publ = v5_with(v5_opts(&node, "steady-pub"));
    publ.connack().await;
    let bodies = payloads("job", 90);
    publish_all(&mut publ, "jobs/x", &bodies).await;

    // The silent member gets its share of the group's messages...
    let mut held = Vec::new();
    while held.is_empty() {
        match silent.recv().await {
            Some(raw5::Packet::Publish(p)) => {
                assert_eq!(p.qos, mqttbytes::QoS::AtLeastOnce);
                held.push(String::from_utf8(p.payload.to_vec()).unwrap());
            }
            Some(_) => {}
            None => panic!("the server closed the silent member"),
        }
    }
    // ...and goes away without acknowledging any of them.
    drop(silent);

    let all: BTreeSet<String> = bodies.iter().cloned().collect();
    let got = collect(&mut others, &all).await;
    let c = counts(&got);
    for b in &held {
        assert!(
            c.contains_key(b),
            "{b} (un-acked by the member that left) never reached the others"
        );
    }
    let missing: Vec<_> = all.iter().filter(|b| !c.contains_key(*b)).collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
    let twice: Vec<_> = c.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "delivered more than once to the remaining members: {twice:?}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_position_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut members = vec![
        share_member(&node, "restart-a").await,
        share_member(&node, "restart-b").await,
    ];
    let mut publ = v5_with(v5_opts(&node, "restart-pub"));
    publ.connack().await;
    let first = payloads("before", 40);
    publish_all(&mut publ, "jobs/r", &first).await;
    let got = collect(&mut members, &first.iter().cloned().collect()).await;
    assert_eq!(
        counts(&got).len(),
        first.len(),
        "every message before the restart"
    );
    // A SUBSCRIBE round trip per member: the server reads packets in order, so
    // every PUBACK sent before it has been handled when the SUBACK comes.
    for m in &mut members {
        m.subscribe("unrelated/sync", QoS::AtMostOnce, None).await;
        m.disconnect_and_wait().await;
    }
    drop(members);
    // Published while the group has no member: kept for it.
    let away = payloads("away", 25);
    publish_all(&mut publ, "jobs/r", &away).await;
    drop(publ);

    let node = node.restart().await;
    let mut members = vec![
        share_member(&node, "restart-a").await,
        share_member(&node, "restart-b").await,
    ];
    let mut publ = v5_with(v5_opts(&node, "restart-pub"));
    publ.connack().await;
    let after = payloads("after", 25);
    publish_all(&mut publ, "jobs/r", &after).await;
    let want: BTreeSet<String> = away.iter().chain(&after).cloned().collect();
    let got = collect(&mut members, &want).await;
    let c = counts(&got);
    let missing: Vec<_> = want.iter().filter(|b| !c.contains_key(*b)).collect();
    assert!(missing.is_empty(), "lost across the restart: {missing:?}");
    let repeated: Vec<_> = first.iter().filter(|b| c.contains_key(*b)).collect();
    assert!(
        repeated.is_empty(),
        "acknowledged before a clean restart, delivered again: {repeated:?}"
    );
    let twice: Vec<_> = c.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_reset_moves_a_running_group() {
    use rocketgate_core::broker::{MessagingApi, OffsetReset};
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut members = vec![share_member(&node, "reset-a").await];
    let mut publ = v5_with(v5_opts(&node, "reset-pub"));
    publ.connack().await;
    let bodies = payloads("r", 20);
    publish_all(&mut publ, "jobs/r", &bodies).await;
    let want: BTreeSet<String> = bodies.iter().cloned().collect();
    let first = collect(&mut members, &want).await;
    assert_eq!(counts(&first).len(), 20);

    // Wait until the group committed past all twenty (its core group shows in
    // the group list once it has offsets), then move it back.
    let deadline = tokio::time::Instant::now() + WAIT;
    let group = loop {
        let found = node
            .broker
            .groups()
            .await
            .unwrap()
            .into_iter()
            .find(|g| g.starts_with("mqtt%s%"));
        if let Some(g) = found {
            break g;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no mqtt%s% group listed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    loop {
        let mut done = true;
        for q in node.broker.queue_stats("jobs").await.unwrap() {
            let at = node
                .broker
                .query_offset(&group, "", "jobs", q.queue_id)
                .await
                .unwrap()
                .unwrap_or(0);
            done &= at >= q.max_offset;
        }
        if done {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never committed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    node.broker
        .reset_offset(&group, "", "jobs", OffsetReset::Earliest)
        .await
        .unwrap();
    // The same member, same connection, gets all twenty again.
    let again = collect(&mut members, &want).await;
    assert_eq!(counts(&again).len(), 20, "after the reset: {again:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_that_first_gets_messages_while_the_group_is_away_is_read_from_its_start() {
    use bytes::Bytes;
    use rocketgate_core::broker::{MessagingApi, QueueChoice};
    use rocketgate_core::store::Message;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let send = |queue: u32, body: String| {
        let broker = node.broker.clone();
        async move {
            let m = Message::new("jobs", 0, Bytes::from(body)).with_tags("q");
            broker.send(m, QueueChoice::Queue(queue)).await.unwrap();
        }
    };
    // The group starts before its topic exists; only queue 0 gets messages while it runs.
    let mut members = vec![share_member(&node, "away-a").await];
    let first = payloads("q0", 5);
    for b in &first {
        send(0, b.clone()).await;
    }
    let got = collect(&mut members, &first.iter().cloned().collect()).await;
    assert_eq!(counts(&got).len(), 5);
    for m in &mut members {
        m.subscribe("unrelated/sync", QoS::AtMostOnce, None).await;
        m.disconnect_and_wait().await;
    }
    drop(members);
    // With no member, queue 3 gets its first messages.
    let away = payloads("q3", 5);
    for b in &away {
        send(3, b.clone()).await;
    }
    // The group comes back (a new task on this node, and again after a restart).
    let mut members = vec![share_member(&node, "away-a").await];
    let want: BTreeSet<String> = away.iter().cloned().collect();
    let got = collect(&mut members, &want).await;
    let missing: Vec<_> = want
        .iter()
        .filter(|b| !counts(&got).contains_key(*b))
        .collect();
    assert!(
        missing.is_empty(),
        "published while the group was away, never delivered: {missing:?}"
    );
    node.stop().await;
}
