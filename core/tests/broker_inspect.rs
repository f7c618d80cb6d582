//! Inspection and lookup through `MessagingApi`: queue stats, offsets by time,
//! group listings and progress, messages by id (both kinds), key and time range,
//! also after a restart.

mod broker_support;

use broker_support::{body, open, options};
use rocketgate_core::Error;
use rocketgate_core::broker::{
    ConsumeMode, Delivered, Heartbeat, MessagingApi, QueueChoice, SendResult, Subscription,
    TopicConfig,
};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX as UNIQ_KEY;

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Waits until the wall clock (the store's) is past `ts`, so the next message
/// gets a later store time.
fn after(ts: i64) {
    while wall_ms() <= ts {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn msg(topic: &str, body: &str, uniq: &str, key: &str) -> Message {
    Message::new(topic, 0, body.to_owned())
        .with_keys([key])
        .with_property(UNIQ_KEY, uniq)
}

fn bodies(found: &[Delivered]) -> Vec<String> {
    found.iter().map(body).collect()
}

#[tokio::test]
async fn queue_stats_and_offsets_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 2)).await.unwrap();
    let mut sent: Vec<SendResult> = Vec::new();
    for i in 0..3 {
        if let Some(prev) = sent.last() {
            after(prev.append.store_timestamp);
        }
        let m = Message::new("t", 0, format!("m{i}"));
        sent.push(b.send(m, QueueChoice::Queue(0)).await.unwrap());
    }
    env.dispatched();
    let stats = b.queue_stats("t").await.unwrap();
    assert_eq!(stats.len(), 2);
    assert_eq!((stats[0].min_offset, stats[0].max_offset), (0, 3));
    assert_eq!(stats[0].last_store_ms, Some(sent[2].append.store_timestamp));
    assert_eq!((stats[1].max_offset, stats[1].last_store_ms), (0, None));
    assert!(matches!(
        b.queue_stats("absent").await,
        Err(Error::TopicNotFound { .. })
    ));

    let ts: Vec<i64> = sent.iter().map(|s| s.append.store_timestamp).collect();
    assert_eq!(b.offset_by_time("t", 0, 0).await.unwrap(), 0);
    assert_eq!(b.offset_by_time("t", 0, ts[1]).await.unwrap(), 1);
    assert_eq!(b.offset_by_time("t", 0, ts[1] + 1).await.unwrap(), 2);
    assert_eq!(b.offset_by_time("t", 0, ts[2] + 1).await.unwrap(), 3);
    assert_eq!(b.offset_by_time("t", 1, ts[0]).await.unwrap(), 0);
    assert!(matches!(
        b.offset_by_time("t", 5, 0).await,
        Err(Error::QueueNotFound { .. })
    ));

    // By time: oldest first, across queues, bounded by `max`.
    after(ts[2]);
    let late = b
        .send(Message::new("t", 0, "q1"), QueueChoice::Queue(1))
        .await
        .unwrap();
    env.dispatched();
    let all = b.messages_by_time("t", 0, i64::MAX, 10).await.unwrap();
    assert_eq!(bodies(&all), ["m0", "m1", "m2", "q1"]);
    assert_eq!((all[3].queue_id, all[3].queue_offset), (1, 0));
    let middle = b.messages_by_time("t", ts[1], ts[2], 10).await.unwrap();
    assert_eq!(bodies(&middle), ["m1", "m2"]);
    let two = b.messages_by_time("t", ts[1], i64::MAX, 2).await.unwrap();
    assert_eq!(bodies(&two), ["m1", "m2"]);
    let none = b
        .messages_by_time("t", late.append.store_timestamp + 1, i64::MAX, 10)
        .await
        .unwrap();
    assert!(none.is_empty());
    assert!(matches!(
        b.messages_by_time("t", 10, 5, 10).await,
        Err(Error::InvalidArgument(_))
    ));
    env.close();
}

#[tokio::test]
async fn messages_by_id_and_key_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    let a = b
        .send(msg("t", "a", "UNIQ-A", "order-1"), QueueChoice::Queue(1))
        .await
        .unwrap();
    let c = b
        .send(msg("t", "c", "UNIQ-C", "order-1"), QueueChoice::Queue(2))
        .await
        .unwrap();
    b.send(
        msg("other", "x", "UNIQ-X", "order-1"),
        QueueChoice::RoundRobin,
    )
    .await
    .unwrap();
    env.dispatched();

    async fn check(b: &impl MessagingApi, a: &SendResult, c: &SendResult) {
        // The offset id a send returned.
        let found = b.message_by_id(&a.append.msg_id).await.unwrap();
        assert_eq!(body(&found), "a");
        assert_eq!((found.queue_id, found.queue_offset), (1, 0));
        // The producer's UNIQ_KEY.
        let found = b.message_by_id("UNIQ-C").await.unwrap();
        assert_eq!(body(&found), "c");
        assert_eq!(found.view().unwrap().topic(), "t");
        assert_eq!(
            (found.queue_id, found.queue_offset),
            (c.queue_id, c.append.queue_offset)
        );
        // A well-formed offset id where no record starts, and garbage.
        let mut wrong = a.append.msg_id.clone();
        wrong.replace_range(31.., "1");
        for id in [wrong.as_str(), "nope", ""] {
            assert!(
                matches!(
                    b.message_by_id(id).await,
                    Err(Error::MessageNotFound { .. })
                ),
                "{id:?}"
            );
        }
        // By key: newest first, only in the topic asked for.
        let by_key = b.messages_by_key("t", "order-1", 10).await.unwrap();
        assert_eq!(bodies(&by_key), ["c", "a"]);
        assert_eq!(
            bodies(&b.messages_by_key("t", "order-1", 1).await.unwrap()),
            ["c"]
        );
        let by_uniq = b.messages_by_key("t", "UNIQ-A", 10).await.unwrap();
        assert_eq!(bodies(&by_uniq), ["a"]);
        assert!(
            b.messages_by_key("t", "order-2", 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            b.messages_by_key("absent", "order-1", 10).await,
            Err(Error::TopicNotFound { .. })
        ));
    }
    check(b.as_ref(), &a, &c).await;
    env.close();

    let env = open(dir.path(), options());
    check(env.broker.as_ref(), &a, &c).await;
    env.close();
}

#[tokio::test]
async fn a_retry_copy_does_not_shadow_the_original_by_uniq_key() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    let sent = b
        .send(msg("t", "orig", "UNIQ-R", "k"), QueueChoice::Queue(0))
        .await
        .unwrap();
    env.dispatched();
    b.send_back("g", "t", 0, sent.append.queue_offset, None)
        .await
        .unwrap();
    env.dispatched();
    let found = b.message_by_id("UNIQ-R").await.unwrap();
    assert_eq!(found.view().unwrap().topic(), "t");
    assert_eq!(found.view().unwrap().reconsume_times(), 0);
    env.close();
}

fn hb(group: &str, member: &str, mode: ConsumeMode) -> Heartbeat {
    Heartbeat {
        group: group.into(),
        member: member.into(),
        mode,
        subscriptions: vec![Subscription::tag("t", "TagA || TagB")],
    }
}

#[tokio::test]
async fn groups_and_their_progress_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 2)).await.unwrap();
    for i in 0..5 {
        let q = if i < 3 { 0 } else { 1 };
        b.send(Message::new("t", 0, format!("m{i}")), QueueChoice::Queue(q))
            .await
            .unwrap();
    }
    env.dispatched();
    assert!(b.groups().await.unwrap().is_empty());
    assert!(matches!(
        b.group_info("g").await,
        Err(Error::GroupNotFound { .. })
    ));

    b.heartbeat(hb("g", "m1", ConsumeMode::Clustering))
        .await
        .unwrap();
    env.clock.advance(std::time::Duration::from_millis(250));
    b.heartbeat(hb("g", "m2", ConsumeMode::Clustering))
        .await
        .unwrap();
    b.commit_offset("g", "m1", "t", 0, 2).await.unwrap();
    b.heartbeat(hb("bc", "x", ConsumeMode::Broadcasting))
        .await
        .unwrap();
    b.heartbeat(hb("bc", "y", ConsumeMode::Broadcasting))
        .await
        .unwrap();
    b.commit_offset("bc", "x", "t", 0, 3).await.unwrap();
    b.commit_offset("bc", "y", "t", 0, 1).await.unwrap();
    assert_eq!(b.groups().await.unwrap(), ["bc", "g"]);

    let info = b.group_info("g").await.unwrap();
    assert_eq!(info.mode, Some(ConsumeMode::Clustering));
    let members: Vec<(&str, i64)> = info
        .members
        .iter()
        .map(|m| (m.member.as_str(), m.last_seen_ms))
        .collect();
    assert_eq!(members, [("m1", 1_000_000), ("m2", 1_000_250)]);
    assert_eq!(
        info.members[0].subscriptions,
        [Subscription::tag("t", "TagA || TagB")]
    );
    let progress: Vec<(u32, Option<u64>, u64, u64)> = info
        .progress
        .iter()
        .map(|p| (p.queue_id, p.committed, p.max_offset, p.lag))
        .collect();
    assert_eq!(progress, [(0, Some(2), 3, 1), (1, None, 2, 2)]);
    // A broadcasting group reports its slowest member.
    let bc = b.group_info("bc").await.unwrap();
    assert_eq!(bc.mode, Some(ConsumeMode::Broadcasting));
    assert_eq!(bc.progress[0].committed, Some(1));
    assert_eq!(bc.progress[0].lag, 2);
    env.close();

    // After a restart the members are gone (they heartbeat again); the mode and
    // the progress stay.
    let env = open(dir.path(), options());
    let b = &env.broker;
    assert_eq!(b.groups().await.unwrap(), ["bc", "g"]);
    let info = b.group_info("g").await.unwrap();
    assert_eq!(
        (info.mode, info.members.len()),
        (Some(ConsumeMode::Clustering), 0)
    );
    assert_eq!(info.progress[0].committed, Some(2));
    assert_eq!(info.progress[0].lag, 1);
    assert_eq!(
        b.group_info("bc").await.unwrap().progress[0].committed,
        Some(1)
    );
    env.close();
}

/// Every change of the topic table shows on `watch_topics` (the node re-registers
/// with the NameServers on it); a send to an existing topic does not.
#[tokio::test]
async fn topic_changes_are_watchable() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    let mut w = b.watch_topics();
    b.create_topic(TopicConfig::new("w1", 2)).await.unwrap();
    assert!(w.has_changed().unwrap(), "create");
    w.mark_unchanged();
    b.send(Message::new("w1", 0, "x"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    assert!(!w.has_changed().unwrap(), "a send to an existing topic");
    b.send(Message::new("w2", 0, "x"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    assert!(w.has_changed().unwrap(), "auto-create on first send");
    w.mark_unchanged();
    b.delete_topic("w1").await.unwrap();
    assert!(w.has_changed().unwrap(), "delete");
}
