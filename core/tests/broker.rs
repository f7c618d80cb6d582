//! The broker's topic table, sending and consumer offsets, through the
//! `MessagingApi` only: permissions, auto-create, sharding-key order, batches,
//! offset resets, and topics and offsets surviving a restart.

mod broker_support;

use broker_support::{drain, open, options, pull_req};
use rocketgate_core::Error;
use rocketgate_core::broker::{
    BrokerSettings, MessagingApi, OffsetReset, Perm, PullStatus, QueueChoice, TopicConfig,
    TopicKind,
};
use rocketgate_core::store::Message;

fn msg(topic: &str, body: &str) -> Message {
    Message::new(topic, 0, body.as_bytes().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_and_offsets_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("orders", 2)).await.unwrap();
    b.create_topic(TopicConfig::new("audit", 1)).await.unwrap();
    b.update_topic(TopicConfig::new("audit", 3).with_perm(Perm::READ))
        .await
        .unwrap();
    for i in 0..10 {
        b.send(msg("orders", &format!("m{i}")), QueueChoice::Queue(i % 2))
            .await
            .unwrap();
    }
    b.commit_offset("g", "c1", "orders", 0, 3).await.unwrap();
    b.commit_offset("g", "c1", "orders", 1, 5).await.unwrap();
    env.close();

    let env = open(dir.path(), options());
    let b = &env.broker;
    assert_eq!(
        b.topics(TopicKind::User).await.unwrap(),
        vec![
            TopicConfig::new("audit", 3).with_perm(Perm::READ),
            TopicConfig::new("orders", 2),
        ]
    );
    assert_eq!(
        b.query_offset("g", "c1", "orders", 0).await.unwrap(),
        Some(3)
    );
    assert_eq!(
        b.query_offset("g", "c1", "orders", 1).await.unwrap(),
        Some(5)
    );
    assert_eq!(
        b.query_offset("other", "x", "orders", 0).await.unwrap(),
        None
    );
    // The consumer resumes where it left off.
    let (rest, _) = drain(b, "g", "c1", "orders", 0, 3).await;
    assert_eq!(rest, ["m6", "m8"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_are_flushed_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerSettings {
        offset_flush_interval: std::time::Duration::from_millis(20),
        ..options()
    };
    let env = open(dir.path(), opts);
    env.broker
        .create_topic(TopicConfig::new("t", 1))
        .await
        .unwrap();
    env.broker.commit_offset("g", "", "t", 0, 7).await.unwrap();
    let file = dir.path().join("config/offsets.json");
    for _ in 0..500 {
        if std::fs::read_to_string(&file).is_ok_and(|s| s.contains('7')) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("offsets.json was not written by the flusher");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_create_follows_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let r = env
        .broker
        .send(msg("fresh", "x"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    assert_eq!(r.topic, "fresh");
    assert_eq!(
        env.broker.topic("fresh").await.unwrap(),
        TopicConfig::new("fresh", options().default_queues)
    );
    env.close();

    let dir = tempfile::tempdir().unwrap();
    let off = BrokerSettings {
        auto_create_topics: false,
        ..options()
    };
    let env = open(dir.path(), off);
    let b = &env.broker;
    assert!(matches!(
        b.send(msg("fresh", "x"), QueueChoice::RoundRobin).await,
        Err(Error::TopicNotFound { .. })
    ));
    // A consumer's retry topic is created on demand anyway, as a system topic.
    b.send(msg("%RETRY%g", "x"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    assert!(b.topics(TopicKind::User).await.unwrap().is_empty());
    assert_eq!(b.topics(TopicKind::System).await.unwrap().len(), 1);
    // Broker-owned topics can be neither created nor written by users.
    assert!(matches!(
        b.create_topic(TopicConfig::new("%DLQ%g", 1)).await,
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        b.send(msg("SCHEDULE_TOPIC_XXXX", "x"), QueueChoice::RoundRobin)
            .await,
        Err(Error::NoPermission { .. })
    ));
    assert!(matches!(
        b.send(msg("bad name", "x"), QueueChoice::RoundRobin).await,
        Err(Error::InvalidName(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("ro", 1).with_perm(Perm::READ))
        .await
        .unwrap();
    b.create_topic(TopicConfig::new("wo", 1).with_perm(Perm::WRITE))
        .await
        .unwrap();
    assert!(matches!(
        b.send(msg("ro", "x"), QueueChoice::RoundRobin).await,
        Err(Error::NoPermission {
            operation: "write",
            ..
        })
    ));
    b.send(msg("wo", "x"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    assert!(matches!(
        b.pull(pull_req("g", "m", "wo", 0, 0)).await,
        Err(Error::NoPermission {
            operation: "read",
            ..
        })
    ));
    assert!(matches!(
        b.send(msg("wo", "x"), QueueChoice::Queue(1)).await,
        Err(Error::QueueNotFound { queues: 1, .. })
    ));
    // Making it readable lets the message out.
    b.update_topic(TopicConfig::new("wo", 1)).await.unwrap();
    env.dispatched();
    let r = b.pull(pull_req("g", "m", "wo", 0, 0)).await.unwrap();
    assert_eq!(r.status, PullStatus::Found);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharding_key_keeps_its_messages_in_order_in_one_queue() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("orders", 4)).await.unwrap();
    let keys = ["alice", "bob", "carol", "dave", "erin", "frank"];
    let mut queue_of = std::collections::HashMap::new();
    for seq in 0..20 {
        for key in keys {
            let r = b
                .send(
                    msg("orders", &format!("{key}-{seq:02}")),
                    QueueChoice::ShardingKey(key.into()),
                )
                .await
                .unwrap();
            assert_eq!(*queue_of.entry(key).or_insert(r.queue_id), r.queue_id);
        }
    }
    env.dispatched();
    for key in keys {
        let (all, _) = drain(b, "g", "m", "orders", queue_of[key], 0).await;
        let mine: Vec<String> = all
            .into_iter()
            .filter(|s| s.starts_with(&format!("{key}-")))
            .collect();
        let expected: Vec<String> = (0..20).map(|s| format!("{key}-{s:02}")).collect();
        assert_eq!(mine, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_and_batches_stay_together() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 4)).await.unwrap();
    let mut per_queue = [0; 4];
    for i in 0..40 {
        let r = b
            .send(msg("t", &i.to_string()), QueueChoice::RoundRobin)
            .await
            .unwrap();
        per_queue[r.queue_id as usize] += 1;
    }
    assert_eq!(per_queue, [10; 4]);

    let batch: Vec<Message> = (0..5).map(|i| msg("t", &format!("b{i}"))).collect();
    let sent = b.send_batch(batch, QueueChoice::Queue(2)).await.unwrap();
    assert!(sent.iter().all(|r| r.queue_id == 2));
    let offsets: Vec<u64> = sent.iter().map(|r| r.append.queue_offset).collect();
    assert_eq!(offsets, [10, 11, 12, 13, 14]);

    let mixed = vec![msg("t", "a"), msg("u", "b")];
    assert!(matches!(
        b.send_batch(mixed, QueueChoice::RoundRobin).await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_reset_to_earliest_latest_and_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let mut stored_at = Vec::new();
    for i in 0..10 {
        let r = b
            .send(msg("t", &format!("m{i}")), QueueChoice::Queue(0))
            .await
            .unwrap();
        stored_at.push(r.append.store_timestamp);
        // Distinct store times (the store stamps the wall clock, in ms).
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    env.dispatched();
    let at = OffsetReset::Timestamp;
    let reset = |to| b.reset_offset("g", "", "t", to);
    assert_eq!(reset(OffsetReset::Latest).await.unwrap(), [(0, 10)]);
    assert_eq!(reset(OffsetReset::Earliest).await.unwrap(), [(0, 0)]);
    // Back-tracking by time, to the millisecond.
    assert_eq!(reset(at(stored_at[4])).await.unwrap(), [(0, 4)]);
    assert_eq!(reset(at(stored_at[4] + 1)).await.unwrap(), [(0, 5)]);
    assert_eq!(b.query_offset("g", "", "t", 0).await.unwrap(), Some(5));
    let (rest, _) = drain(b, "g", "", "t", 0, 5).await;
    assert_eq!(rest, ["m5", "m6", "m7", "m8", "m9"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_topic_removes_its_queues_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 2)).await.unwrap();
    b.send(msg("t", "x"), QueueChoice::Queue(1)).await.unwrap();
    b.commit_offset("g", "", "t", 1, 1).await.unwrap();
    env.dispatched();
    assert_eq!(env.store.queue_bounds("t", 1), (0, 1));
    b.delete_topic("t").await.unwrap();
    assert!(matches!(
        b.topic("t").await,
        Err(Error::TopicNotFound { .. })
    ));
    assert_eq!(env.store.queue_bounds("t", 1), (0, 0));
    assert!(!dir.path().join("consumequeue/t").exists());
    assert_eq!(b.query_offset("g", "", "t", 1).await.unwrap(), None);
    assert!(matches!(
        b.delete_topic("t").await,
        Err(Error::TopicNotFound { .. })
    ));
}

/// `sync_visible` (asked by the MQTT gateway before a subscription starts at the
/// end): every send that completed before it is counted in the queue's end, so a
/// subscriber starting there never gets one of them as new. Checked after each of
/// many sends, as a new subscription would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_visible_makes_every_completed_send_count_in_the_queue_end() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("visible", 1))
        .await
        .unwrap();
    for i in 0..200u64 {
        b.send(msg("visible", &format!("m{i}")), QueueChoice::Queue(0))
            .await
            .unwrap();
        b.sync_visible().await;
        let end = b
            .pull(pull_req("probe", "", "visible", 0, u64::MAX))
            .await
            .unwrap()
            .max_offset;
        assert_eq!(
            end,
            i + 1,
            "send {i} completed but is not in the queue's end"
        );
    }
    env.close();
}
