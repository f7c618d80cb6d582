//! Our Rust client against the real server, NameServer and broker started in-process.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Cluster, WAIT, until};
use rocketgate_native::client::{
    ConsumeFrom, ConsumeMode, ConsumeResult, Message, OrderlyResult, Producer, PullConsumer,
    PushConsumer, PushConsumerSettings, ReceivedMessage,
};
use tokio::sync::mpsc;

fn fast(group: &str) -> PushConsumerSettings {
    let mut o = PushConsumerSettings::new(group);
    o.rebalance_interval = Duration::from_millis(500);
    o.commit_interval = Duration::from_millis(200);
    o.long_poll = Duration::from_secs(2);
    o
}

/// Receives until `n` distinct bodies arrived (duplicates are counted, not failed).
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<ReceivedMessage>,
    n: usize,
) -> (BTreeMap<Vec<u8>, ReceivedMessage>, usize) {
    let mut seen = BTreeMap::new();
    let mut dups = 0;
    while seen.len() < n {
        let m = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} messages arrived", seen.len()))
            .expect("consumer alive");
        if seen.insert(m.body.to_vec(), m).is_some() {
            dups += 1;
        }
    }
    (seen, dups)
}

fn forward(
    tx: mpsc::UnboundedSender<ReceivedMessage>,
) -> impl Fn(&[ReceivedMessage]) -> ConsumeResult {
    move |msgs| {
        for m in msgs {
            let _ = tx.send(m.clone());
        }
        ConsumeResult::Success
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_with_tags_and_keys_reach_a_push_consumer() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Orders", 4).await.unwrap();
    // Sync, async and batch sends.
    for i in 0..400 {
        let m = Message::new("Orders", format!("m{i}"))
            .with_tag(format!("t{}", i % 3))
            .with_keys([format!("k{i}")]);
        producer.send(m).await.unwrap();
    }
    let pending: Vec<_> = (400..800)
        .map(|i| {
            producer.send_async(
                Message::new("Orders", format!("m{i}"))
                    .with_tag(format!("t{}", i % 3))
                    .with_keys([format!("k{i}")]),
            )
        })
        .collect();
    for p in pending {
        p.await.unwrap();
    }
    for chunk in (800..1000).collect::<Vec<_>>().chunks(50) {
        let batch = chunk
            .iter()
            .map(|i| {
                Message::new("Orders", format!("m{i}"))
                    .with_tag(format!("t{}", i % 3))
                    .with_keys([format!("k{i}")])
            })
            .collect();
        let sent = producer.send_batch(batch).await.unwrap();
        assert_eq!(sent.len(), 50);
    }

    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = PushConsumer::start_concurrent(
        cluster.config(),
        fast("cg").subscribe("Orders", "*"),
        forward(tx),
    )
    .await
    .unwrap();
    let (seen, _dups) = collect(&mut rx, 1000).await;
    for i in 0..1000 {
        let m = &seen[format!("m{i}").as_bytes()];
        assert_eq!(m.tag(), Some(format!("t{}", i % 3).as_str()));
        assert_eq!(m.keys(), vec![format!("k{i}")]);
        assert_eq!(m.topic, "Orders");
    }
    consumer.shutdown().await;

    // A tag filter only delivers its tag.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let filtered = PushConsumer::start_concurrent(
        cluster.config(),
        fast("cg-t1").subscribe("Orders", "t1"),
        forward(tx),
    )
    .await
    .unwrap();
    let (seen, _) = collect(&mut rx, 333).await;
    assert!(seen.values().all(|m| m.tag() == Some("t1")));
    filtered.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clustering_shares_queues_and_rebalances_when_a_member_leaves() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Shared", 8).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = PushConsumer::start_concurrent(cluster.config(), fast("g"), forward(tx.clone())).await;
    assert!(a.is_err(), "a consumer needs a subscription");
    let opts = || fast("g").subscribe("Shared", "*");
    let a = PushConsumer::start_concurrent(cluster.config(), opts(), forward(tx.clone()))
        .await
        .unwrap();
    let b = PushConsumer::start_concurrent(cluster.config(), opts(), forward(tx.clone()))
        .await
        .unwrap();
    let shared_queues = |a: &PushConsumer, b: &PushConsumer| {
        let qa: BTreeSet<_> = a
            .assignment()
            .into_iter()
            .filter(|q| q.topic == "Shared")
            .collect();
        let qb: BTreeSet<_> = b
            .assignment()
            .into_iter()
            .filter(|q| q.topic == "Shared")
            .collect();
        (qa, qb)
    };
    until("both members to hold half the queues", || {
        let (qa, qb) = shared_queues(&a, &b);
        qa.len() == 4 && qb.len() == 4 && qa.is_disjoint(&qb)
    })
    .await;
    for i in 0..200 {
        producer
            .send(Message::new("Shared", format!("a{i}")))
            .await
            .unwrap();
    }
    let (_, dups) = collect(&mut rx, 200).await;
    assert_eq!(dups, 0, "no failures: every message exactly once");

    b.shutdown().await;
    until("the survivor to take every queue", || {
        a.assignment()
            .iter()
            .filter(|q| q.topic == "Shared")
            .count()
            == 8
    })
    .await;
    for i in 0..200 {
        producer
            .send(Message::new("Shared", format!("b{i}")))
            .await
            .unwrap();
    }
    let (seen, _) = collect(&mut rx, 200).await;
    assert!(seen.keys().all(|k| k.starts_with(b"b")));
    a.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasting_delivers_everything_to_every_member() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("News", 2).await.unwrap();
    let offsets = tempfile::tempdir().unwrap();
    let mut members = Vec::new();
    let mut inboxes = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut opts = fast("bc")
            .subscribe("News", "*")
            .mode(ConsumeMode::Broadcasting)
            .consume_from(ConsumeFrom::First);
        opts.offset_store_dir = offsets.path().to_owned();
        members.push(
            PushConsumer::start_concurrent(cluster.config(), opts, forward(tx))
                .await
                .unwrap(),
        );
        inboxes.push(rx);
    }
    for i in 0..50 {
        producer
            .send(Message::new("News", format!("n{i}")))
            .await
            .unwrap();
    }
    for rx in &mut inboxes {
        let (seen, _) = collect(rx, 50).await;
        assert_eq!(seen.len(), 50);
    }
    for m in members {
        m.shutdown().await;
    }
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_broadcasting_consumer_resumes_from_its_local_offsets() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Feed", 2).await.unwrap();
    let offsets = tempfile::tempdir().unwrap();
    let start = |tx| {
        let mut opts = fast("bc-resume")
            .subscribe("Feed", "*")
            .mode(ConsumeMode::Broadcasting)
            .consume_from(ConsumeFrom::First);
        opts.offset_store_dir = offsets.path().to_owned();
        // A stable client id: the offsets file is per client, as RocketMQ's.
        let config = cluster.config().with_client_id("10.0.0.7@feed-reader");
        PushConsumer::start_concurrent(config, opts, forward(tx))
    };
    for i in 0..40 {
        let m = Message::new("Feed", format!("a{i}"));
        producer.send(m).await.unwrap();
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = start(tx).await.unwrap();
    let (seen, _) = collect(&mut rx, 40).await;
    assert!(seen.keys().all(|k| k.starts_with(b"a")));
    first.shutdown().await;
    let file = offsets
        .path()
        .join("10.0.0.7@feed-reader")
        .join("bc-resume")
        .join("offsets.json");
    let saved = std::fs::read_to_string(&file).expect("offsets written on shutdown");
    assert!(saved.contains("\"topic\": \"Feed\""), "{saved}");

    for i in 0..60 {
        let m = Message::new("Feed", format!("b{i}"));
        producer.send(m).await.unwrap();
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let second = start(tx).await.unwrap();
    // Exactly the 60 new ones: an old message would take one of the 60 places.
    let (seen, dups) = collect(&mut rx, 60).await;
    assert!(
        seen.keys().all(|k| k.starts_with(b"b")),
        "committed progress was redelivered"
    );
    assert_eq!(dups, 0);
    second.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_consumption_keeps_each_key_in_order() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Ordered", 4).await.unwrap();
    for step in 0..20 {
        for order in 0..5 {
            let m =
                Message::new("Ordered", format!("{order}:{step}")).with_keys([format!("o{order}")]);
            producer
                .send_ordered(m, &format!("o{order}"))
                .await
                .unwrap();
        }
    }
    let log: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let l = log.clone();
    let failed_once = Arc::new(Mutex::new(false));
    let f = failed_once.clone();
    let consumer = PushConsumer::start_orderly(
        cluster.config(),
        fast("og").subscribe("Ordered", "*"),
        move |msgs| {
            // Fail the very first batch once: orderly retries it in place.
            let mut failed = f.lock().unwrap();
            if !*failed {
                *failed = true;
                return OrderlyResult::SuspendMoment;
            }
            for m in msgs {
                let text = String::from_utf8_lossy(&m.body).to_string();
                let (order, step) = text.split_once(':').unwrap();
                l.lock()
                    .unwrap()
                    .push((order.to_string(), step.parse().unwrap()));
                let _ = tx.send(m.clone());
            }
            OrderlyResult::Success
        },
    )
    .await
    .unwrap();
    collect(&mut rx, 100).await;
    let log = log.lock().unwrap().clone();
    let mut last: BTreeMap<String, u32> = BTreeMap::new();
    for (order, step) in log {
        if let Some(prev) = last.get(&order) {
            assert!(step > *prev, "order {order}: step {step} after {prev}");
        }
        last.insert(order, step);
    }
    assert_eq!(last.len(), 5);
    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_consumer_polls_commits_and_seeks() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Log", 1).await.unwrap();
    for i in 0..10 {
        producer
            .send(Message::new("Log", format!("l{i}")))
            .await
            .unwrap();
    }
    let consumer = PullConsumer::start(cluster.config(), "readers")
        .await
        .unwrap();
    let queues = consumer.queues("Log").await.unwrap();
    assert_eq!(queues.len(), 1);
    let mq = queues[0].clone();
    consumer.assign(queues, "*").await.unwrap();
    let mut got = Vec::new();
    while got.len() < 10 {
        let batch = consumer.poll(WAIT).await.unwrap();
        assert!(!batch.is_empty(), "poll returned nothing within {WAIT:?}");
        got.extend(batch);
    }
    let offsets: Vec<u64> = got.iter().map(|m| m.queue_offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
    consumer.commit().await.unwrap();
    assert_eq!(consumer.committed(&mq).await.unwrap(), Some(10));

    // A long poll wakes on a new message.
    let p = producer.clone();
    let sender = tokio::spawn(async move {
        p.send(Message::new("Log", "late")).await.unwrap();
    });
    let batch = consumer.poll(WAIT).await.unwrap();
    assert_eq!(batch[0].body.as_ref(), b"late");
    sender.await.unwrap();

    consumer.seek(&mq, 5).unwrap();
    let batch = consumer.poll(WAIT).await.unwrap();
    assert_eq!(batch[0].queue_offset, 5);
    assert_eq!(batch[0].body.as_ref(), b"l5");
    consumer.shutdown().await;
    producer.shutdown().await;
}

/// A producer that starts with its cluster sends to a topic nobody created before the
/// broker has registered with the NameServer: the send waits (within its timeout) for a
/// broker to appear instead of failing at once (seen under load in CI:
/// `SendFailed { attempts: 3, last: NoRoute }`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_send_waits_for_a_broker_that_is_still_registering() {
    let cluster = Arc::new(Cluster::start_unregistered(rocketgate_auth::Auth::disabled()).await);
    let producer = Producer::start(cluster.config(), "early").await.unwrap();
    let c = cluster.clone();
    let registering = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        c.register();
    });
    let sent = producer.send(Message::new("Early", "x")).await.unwrap();
    assert_eq!(sent.queue_offset, 0);
    registering.await.unwrap();
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_modes_and_errors() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    // A topic nobody created: the broker creates it on first send.
    let sent = producer.send(Message::new("Fresh", "x")).await.unwrap();
    assert_eq!(sent.queue_offset, 0);
    producer.create_topic("Modes", 4).await.unwrap();
    let queues = producer.write_queues("Modes").await.unwrap();
    assert_eq!(queues.len(), 4);
    let to = producer
        .send_to_queue(Message::new("Modes", "q2"), queues[2].clone())
        .await
        .unwrap();
    assert_eq!(to.queue.queue_id, 2);
    let a = producer
        .send_ordered(Message::new("Modes", "k"), "key-1")
        .await
        .unwrap();
    let b = producer
        .send_ordered(Message::new("Modes", "k"), "key-1")
        .await
        .unwrap();
    assert_eq!(a.queue, b.queue);
    let sel = producer
        .send_with_selector(Message::new("Modes", "s"), |qs| qs.len() - 1)
        .await
        .unwrap();
    assert_eq!(sel.queue.queue_id, 3);
    producer
        .send_oneway(Message::new("Modes", "fire"))
        .await
        .unwrap();

    // An empty topic is refused with MESSAGE_ILLEGAL, not retried.
    let err = producer.send(Message::new("", "x")).await.unwrap_err();
    assert_eq!(
        err.code(),
        Some(rocketgate_remoting::code::response::MESSAGE_ILLEGAL),
        "{err}"
    );

    // Several NameServers: a dead one is skipped.
    let both = rocketgate_native::client::ClientSettings::new([
        "127.0.0.1:1".to_string(),
        cluster.namesrv.clone(),
    ]);
    let p2 = Producer::start(both, "pg2").await.unwrap();
    p2.send(Message::new("Modes", "via the second NameServer"))
        .await
        .unwrap();
    p2.shutdown().await;

    // Nothing listening: a clear error, no panic, no hang.
    let dead = rocketgate_native::client::ClientSettings::new(["127.0.0.1:1"])
        .with_request_timeout(Duration::from_secs(1));
    let lonely = Producer::start(dead, "pg").await.unwrap();
    let err = lonely.send(Message::new("Modes", "x")).await.unwrap_err();
    assert!(
        matches!(
            err,
            rocketgate_native::Error::SendFailed { .. } | rocketgate_native::Error::Connect { .. }
        ),
        "{err}"
    );
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_share_eight_queues_and_survive_a_killed_member() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Work", 8).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(
            PushConsumer::start_concurrent(
                cluster.config(),
                fast("w").subscribe("Work", "*"),
                forward(tx.clone()),
            )
            .await
            .unwrap(),
        );
    }
    let owned = |ms: &[PushConsumer]| -> Vec<BTreeSet<_>> {
        ms.iter()
            .map(|m| {
                m.assignment()
                    .into_iter()
                    .filter(|q| q.topic == "Work")
                    .collect()
            })
            .collect()
    };
    until("8 queues shared 3/3/2 without overlap", || {
        let sets = owned(&members);
        let total: usize = sets.iter().map(BTreeSet::len).sum();
        let union: BTreeSet<_> = sets.iter().flatten().collect();
        let mut sizes: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
        sizes.sort();
        total == 8 && union.len() == 8 && sizes == vec![2, 3, 3]
    })
    .await;
    for i in 0..300 {
        producer
            .send(Message::new("Work", format!("x{i}")))
            .await
            .unwrap();
    }
    let (_, dups) = collect(&mut rx, 300).await;
    assert_eq!(
        dups, 0,
        "without failures every message arrives exactly once"
    );

    // Kill one member while messages keep coming.
    let p = producer.clone();
    let sending = tokio::spawn(async move {
        for i in 0..300 {
            p.send(Message::new("Work", format!("y{i}"))).await.unwrap();
        }
    });
    let victim = members.remove(0);
    victim.abort().await;
    until("the survivors to take over all 8 queues", || {
        let sets = owned(&members);
        let union: BTreeSet<_> = sets.iter().flatten().collect();
        union.len() == 8 && sets.iter().map(BTreeSet::len).sum::<usize>() == 8
    })
    .await;
    sending.await.unwrap();
    // Everything sent after the first round arrives (the victim's uncommitted
    // messages may come twice: counted, allowed).
    let mut seen = BTreeSet::new();
    let mut dups = 0;
    while (0..300).any(|i| !seen.contains(format!("y{i}").as_bytes())) {
        let m = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("no message lost")
            .unwrap();
        if !seen.insert(m.body.to_vec()) {
            dups += 1;
        }
    }
    println!("duplicates after the kill: {dups}");
    for m in members {
        m.shutdown().await;
    }
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_consumption_comes_back_through_the_retry_topic() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Flaky", 2).await.unwrap();
    for i in 0..20 {
        producer
            .send(Message::new("Flaky", format!("f{i}")).with_tag("t"))
            .await
            .unwrap();
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut opts = fast("retrying").subscribe("Flaky", "*");
    opts.retry_delay_level = 1; // 1 s
    let consumer = PushConsumer::start_concurrent(cluster.config(), opts, move |msgs| {
        if msgs.iter().any(|m| m.reconsume_times == 0) {
            return ConsumeResult::Retry;
        }
        for m in msgs {
            let _ = tx.send(m.clone());
        }
        ConsumeResult::Success
    })
    .await
    .unwrap();
    let (seen, _) = collect(&mut rx, 20).await;
    for m in seen.values() {
        assert_eq!(m.reconsume_times, 1);
        assert_eq!(m.topic, "Flaky", "shown under its original topic");
        assert_eq!(m.tag(), Some("t"));
    }
    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_consumer_seeks_by_time_and_to_the_beginning() {
    let cluster = Cluster::start().await;
    let producer = Producer::start(cluster.config(), "pg").await.unwrap();
    producer.create_topic("Timed", 1).await.unwrap();
    for i in 0..5 {
        producer
            .send(Message::new("Timed", format!("early{i}")))
            .await
            .unwrap();
    }
    let consumer = PullConsumer::start(cluster.config(), "timed-readers")
        .await
        .unwrap();
    let queues = consumer.queues("Timed").await.unwrap();
    let mq = queues[0].clone();
    consumer.assign(queues, "*").await.unwrap();
    let mut first = Vec::new();
    while first.len() < 5 {
        first.extend(consumer.poll(WAIT).await.unwrap());
    }
    let boundary = first[4].store_timestamp + 1;
    // Messages stored strictly later than the boundary.
    tokio::time::sleep(Duration::from_millis(5)).await;
    for i in 0..3 {
        producer
            .send(Message::new("Timed", format!("late{i}")))
            .await
            .unwrap();
    }
    let at = consumer.seek_to_timestamp(&mq, boundary).await.unwrap();
    assert_eq!(at, 5);
    let batch = consumer.poll(WAIT).await.unwrap();
    assert_eq!(batch[0].body.as_ref(), b"late0");
    assert_eq!(consumer.seek_to_begin(&mq).await.unwrap(), 0);
    let batch = consumer.poll(WAIT).await.unwrap();
    assert_eq!(batch[0].body.as_ref(), b"early0");
    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_commit_roll_back_and_check_back() {
    use rocketgate_native::client::{TransactionProducer, TransactionState};
    let cluster = Cluster::start().await;
    let admin = Producer::start(cluster.config(), "admin").await.unwrap();
    admin.create_topic("Pay", 1).await.unwrap();
    let checked = Arc::new(Mutex::new(Vec::new()));
    let c = checked.clone();
    let producer = TransactionProducer::start(cluster.config(), "payers", move |half| {
        c.lock().unwrap().push(half.keys().join(","));
        if half.keys() == vec!["undecided"] {
            TransactionState::Commit
        } else {
            TransactionState::Rollback
        }
    })
    .await
    .unwrap();
    let (_, s) = producer
        .send_in_transaction(Message::new("Pay", "committed").with_keys(["c"]), |sent| {
            assert!(sent.transaction_id.is_some());
            TransactionState::Commit
        })
        .await
        .unwrap();
    assert_eq!(s, TransactionState::Commit);
    producer
        .send_in_transaction(Message::new("Pay", "rolled back").with_keys(["r"]), |_| {
            TransactionState::Rollback
        })
        .await
        .unwrap();
    // Unknown: only the broker's check-back can commit it.
    producer
        .send_in_transaction(
            Message::new("Pay", "checked").with_keys(["undecided"]),
            |_| TransactionState::Unknown,
        )
        .await
        .unwrap();

    let consumer = PullConsumer::start(cluster.config(), "pay-readers")
        .await
        .unwrap();
    let queues = consumer.queues("Pay").await.unwrap();
    consumer.assign(queues, "*").await.unwrap();
    let mut bodies = Vec::new();
    while bodies.len() < 2 {
        let batch = consumer.poll(WAIT).await.unwrap();
        assert!(!batch.is_empty(), "committed messages become visible");
        bodies.extend(
            batch
                .iter()
                .map(|m| String::from_utf8_lossy(&m.body).to_string()),
        );
    }
    assert_eq!(
        bodies,
        vec!["committed", "checked"],
        "the rolled-back one never shows"
    );
    assert!(checked.lock().unwrap().contains(&"undecided".to_string()));
    consumer.shutdown().await;
    producer.shutdown().await;
    admin.shutdown().await;
}
