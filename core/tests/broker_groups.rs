//! Consumer-group behaviour across members and restarts: FIFO per queue under
//! orderly consumption with a hand-over between members, offset resets moving
//! POP consumers, send-back of a popped message, broadcasting offsets found
//! after a restart, and a per-group retry limit.

mod broker_support;

use std::time::Duration;

use broker_support::{Env, bodies, body, drain, open, options, pull_req};
use rocketgate_core::Error;
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::schedule::RetryDecision;
use rocketgate_core::broker::{
    ConsumeMode, Heartbeat, MessagingApi, OffsetReset, PopRequest, Popped, QueueChoice,
    Subscription, TopicConfig, sharding_queue,
};
use rocketgate_core::store::Message;

fn hb(group: &str, member: &str, mode: ConsumeMode, topic: &str) -> Heartbeat {
    Heartbeat {
        group: group.into(),
        member: member.into(),
        mode,
        subscriptions: vec![Subscription::tag(topic, "*")],
    }
}

fn pop_req(group: &str, topic: &str) -> PopRequest {
    PopRequest {
        group: group.into(),
        topic: topic.into(),
        filter: Filter::all(),
        max_messages: 32,
        invisible: Duration::from_secs(30),
        wait: Duration::ZERO,
    }
}

fn popped_bodies(p: &[Popped]) -> Vec<String> {
    let mut v: Vec<String> = p.iter().map(|p| body(&p.message)).collect();
    v.sort();
    v
}

async fn send_n(env: &Env, topic: &str, n: usize, queue: QueueChoice) {
    for i in 0..n {
        env.broker
            .send(Message::new(topic, 0, format!("m{i}")), queue.clone())
            .await
            .unwrap();
    }
    env.dispatched();
}

/// Consumes up to `max` messages of a locked queue from the committed offset,
/// commits past them, and returns their bodies.
async fn consume_locked(
    env: &Env,
    member: &str,
    topic: &str,
    queue: u32,
    max: usize,
) -> Vec<String> {
    let b = &env.broker;
    let from = b
        .query_offset("og", member, topic, queue)
        .await
        .unwrap()
        .unwrap_or(0);
    let mut req = pull_req("og", member, topic, queue, from);
    req.max_messages = max;
    let r = b.pull(req).await.unwrap();
    b.commit_offset("og", member, topic, queue, r.next_offset)
        .await
        .unwrap();
    bodies(&r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_consumption_is_fifo_across_a_hand_over_between_members() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("o", 4)).await.unwrap();
    // One key's messages land in one queue, in send order.
    let q = sharding_queue("order-1", 4);
    send_n(&env, "o", 10, QueueChoice::ShardingKey("order-1".into())).await;
    assert_eq!(b.queue_stats("o").await.unwrap()[q as usize].max_offset, 10);
    for m in ["A", "B"] {
        b.heartbeat(hb("og", m, ConsumeMode::Clustering, "o"))
            .await
            .unwrap();
    }

    // A holds the queue: B can neither lock nor pull it.
    b.lock_queue("og", "A", "o", q).await.unwrap();
    assert!(matches!(
        b.lock_queue("og", "B", "o", q).await,
        Err(Error::QueueLocked { .. })
    ));
    assert!(matches!(
        b.pull(pull_req("og", "B", "o", q, 0)).await,
        Err(Error::QueueLocked { .. })
    ));
    let mut consumed = consume_locked(&env, "A", "o", q, 4).await;

    // A unlocks; B takes over exactly after A's committed offset.
    b.unlock_queue("og", "A", "o", q).await.unwrap();
    b.lock_queue("og", "B", "o", q).await.unwrap();
    assert!(matches!(
        b.pull(pull_req("og", "A", "o", q, 4)).await,
        Err(Error::QueueLocked { .. })
    ));
    consumed.extend(consume_locked(&env, "B", "o", q, 3).await);

    // B goes quiet: once its lease (5 s) runs out, A takes over after B's offset.
    env.clock.advance(Duration::from_secs(6));
    b.heartbeat(hb("og", "A", ConsumeMode::Clustering, "o"))
        .await
        .unwrap();
    b.lock_queue("og", "A", "o", q).await.unwrap();
    assert!(matches!(
        b.pull(pull_req("og", "B", "o", q, 7)).await,
        Err(Error::QueueLocked { .. })
    ));
    consumed.extend(consume_locked(&env, "A", "o", q, 32).await);

    let expected: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    assert_eq!(consumed, expected, "no gap, no duplicate, no reordering");
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_offset_moves_pop_consumers_too() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("p", 1)).await.unwrap();
    send_n(&env, "p", 5, QueueChoice::Queue(0)).await;
    let all = b.pop(pop_req("pg", "p")).await.unwrap();
    assert_eq!(all.len(), 5);
    for p in &all {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    assert!(b.pop(pop_req("pg", "p")).await.unwrap().is_empty());

    // Back to the start: every message is delivered again, as a first delivery.
    assert_eq!(
        b.reset_offset("pg", "", "p", OffsetReset::Earliest)
            .await
            .unwrap(),
        [(0, 0)]
    );
    let again = b.pop(pop_req("pg", "p")).await.unwrap();
    assert_eq!(popped_bodies(&again), popped_bodies(&all));
    assert!(again.iter().all(|p| p.attempt() == 1));

    // Forward to m3 while m0..m4 are in flight: only m3, m4 come back, and the
    // handles issued before the reset are stale.
    let m3_time = again
        .iter()
        .find(|p| body(&p.message) == "m3")
        .unwrap()
        .message
        .view()
        .unwrap()
        .store_timestamp();
    let m2_time = again
        .iter()
        .find(|p| body(&p.message) == "m2")
        .unwrap()
        .message
        .view()
        .unwrap()
        .store_timestamp();
    let to = b
        .reset_offset("pg", "", "p", OffsetReset::Timestamp(m3_time))
        .await
        .unwrap();
    // Messages may share a millisecond: the reset lands on the first stored at that time.
    let first = to[0].1;
    assert!(first <= 3 && (m2_time < m3_time) == (first == 3));
    assert!(matches!(
        b.ack(&again[0].receipt.to_string()).await,
        Err(Error::StaleReceiptHandle { .. })
    ));
    let expected: Vec<String> = (first..5).map(|i| format!("m{i}")).collect();
    let after = b.pop(pop_req("pg", "p")).await.unwrap();
    assert_eq!(popped_bodies(&after), expected);
    assert_eq!(b.query_offset("pg", "", "p", 0).await.unwrap(), Some(first));
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sending_back_a_popped_message_releases_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("s", 1)).await.unwrap();
    send_n(&env, "s", 1, QueueChoice::Queue(0)).await;
    let popped = b.pop(pop_req("sg", "s")).await.unwrap();
    assert_eq!(popped.len(), 1);
    let sent_back = b
        .send_back("sg", "s", 0, popped[0].message.queue_offset, None)
        .await
        .unwrap();
    assert!(matches!(sent_back.decision, RetryDecision::Retry { .. }));
    assert!(matches!(
        b.ack(&popped[0].receipt.to_string()).await,
        Err(Error::StaleReceiptHandle { .. })
    ));
    assert_eq!(b.query_offset("sg", "", "s", 0).await.unwrap(), Some(1));

    // Past the invisibility time it does not reappear in place...
    env.clock.advance(Duration::from_secs(31));
    assert!(b.pop(pop_req("sg", "s")).await.unwrap().is_empty());
    // ...it comes back once, through the retry topic.
    env.dispatched();
    assert_eq!(b.deliver_due().await.unwrap(), 1);
    env.dispatched();
    let retried = b.pop(pop_req("sg", "%RETRY%sg")).await.unwrap();
    assert_eq!(popped_bodies(&retried), ["m0"]);
    assert_eq!(retried[0].message.view().unwrap().reconsume_times(), 1);
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasting_offsets_are_found_after_a_restart_before_any_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    for m in ["x", "y"] {
        b.heartbeat(hb("bc", m, ConsumeMode::Broadcasting, "t"))
            .await
            .unwrap();
    }
    b.commit_offset("bc", "x", "t", 0, 3).await.unwrap();
    b.commit_offset("bc", "y", "t", 0, 1).await.unwrap();
    env.close();

    let env = open(dir.path(), options());
    let b = &env.broker;
    assert_eq!(b.query_offset("bc", "x", "t", 0).await.unwrap(), Some(3));
    assert_eq!(b.query_offset("bc", "y", "t", 0).await.unwrap(), Some(1));
    assert!(matches!(
        b.query_offset("bc", "", "t", 0).await,
        Err(Error::InvalidArgument(_))
    ));
    b.commit_offset("bc", "x", "t", 0, 4).await.unwrap();
    assert_eq!(b.query_offset("bc", "y", "t", 0).await.unwrap(), Some(1));
    let info = b.group_info("bc").await.unwrap();
    assert_eq!(
        (info.mode, info.members.len()),
        (Some(ConsumeMode::Broadcasting), 0)
    );
    // Members coming back see their own offsets.
    b.heartbeat(hb("bc", "x", ConsumeMode::Broadcasting, "t"))
        .await
        .unwrap();
    assert_eq!(b.query_offset("bc", "x", "t", 0).await.unwrap(), Some(4));
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_can_have_its_own_retry_limit() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("r", 1)).await.unwrap();
    send_n(&env, "r", 2, QueueChoice::Queue(0)).await;
    b.set_max_reconsume_times("strict", Some(0)).await.unwrap();
    assert_eq!(b.group_info("strict").await.unwrap().max_reconsume_times, 0);

    // Send-back: straight to the DLQ for the strict group, a retry for others.
    let strict = b.send_back("strict", "r", 0, 0, None).await.unwrap();
    assert_eq!(strict.decision, RetryDecision::DeadLetter);
    let lenient = b.send_back("other", "r", 0, 0, None).await.unwrap();
    assert!(matches!(lenient.decision, RetryDecision::Retry { .. }));
    env.close();

    // Persisted; and POP obeys it too: one delivery, then the DLQ.
    let env = open(dir.path(), options());
    let b = &env.broker;
    assert_eq!(b.group_info("strict").await.unwrap().max_reconsume_times, 0);
    let popped = b.pop(pop_req("strict", "r")).await.unwrap();
    assert_eq!(popped.len(), 2);
    env.clock.advance(Duration::from_secs(31));
    assert!(b.pop(pop_req("strict", "r")).await.unwrap().is_empty());
    env.dispatched();
    let (dead, _) = drain(&env.broker, "admin", "m", "%DLQ%strict", 0, 0).await;
    assert_eq!(dead, ["m0", "m0", "m1"]);

    b.set_max_reconsume_times("strict", None).await.unwrap();
    assert_eq!(
        b.group_info("strict").await.unwrap().max_reconsume_times,
        16
    );
    assert!(matches!(
        b.set_max_reconsume_times("bad group!", Some(1)).await,
        Err(Error::InvalidName(_))
    ));
    env.close();
}
