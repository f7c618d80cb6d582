//! Consuming through the `MessagingApi`: long polling, filters on pull,
//! clustering (at-least-once across a rebalance), broadcasting, orderly locks.

mod broker_support;

use std::collections::BTreeSet;
use std::time::Duration;

use broker_support::{bodies, drain, open, options, pull_req};
use rocketgate_core::Error;
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    ConsumeMode, Heartbeat, MessagingApi, PullStatus, QueueChoice, Subscription, TopicConfig,
};
use rocketgate_core::store::Message;

fn msg(topic: &str, body: &str) -> Message {
    Message::new(topic, 0, body.as_bytes().to_vec())
}

fn hb(group: &str, member: &str, mode: ConsumeMode, topic: &str) -> Heartbeat {
    Heartbeat {
        group: group.into(),
        member: member.into(),
        mode,
        subscriptions: vec![Subscription::tag(topic, "*")],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pull_returns_when_a_message_is_put() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    env.broker
        .create_topic(TopicConfig::new("t", 1))
        .await
        .unwrap();
    let mut req = pull_req("g", "m", "t", 0, 0);
    req.wait = Duration::from_secs(60);
    let started = std::time::Instant::now();
    let puller = {
        let broker = env.broker.clone();
        tokio::spawn(async move { broker.pull(req).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!puller.is_finished(), "the pull waits on an empty queue");
    let producer = {
        let broker = env.broker.clone();
        tokio::spawn(async move {
            broker
                .send(msg("t", "hello"), QueueChoice::RoundRobin)
                .await
        })
    };
    producer.await.unwrap().unwrap();
    let r = puller.await.unwrap().unwrap();
    assert_eq!(r.status, PullStatus::Found);
    assert_eq!(bodies(&r), ["hello"]);
    assert_eq!(r.next_offset, 1);
    // Woken by the put, not by its 60 s timeout.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_pulls_are_woken_by_their_own_queue_only() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    env.broker
        .create_topic(TopicConfig::new("t", 4))
        .await
        .unwrap();
    let pull = |queue: u32| {
        let broker = env.broker.clone();
        let mut req = pull_req("g", "m", "t", queue, 0);
        req.wait = Duration::from_secs(60);
        tokio::spawn(async move { broker.pull(req).await })
    };
    let pullers: Vec<_> = (0..4).map(pull).collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Many messages into queue 2 (and another topic): only queue 2's puller returns.
    for i in 0..20 {
        env.broker
            .send(msg("t", &format!("q2-{i}")), QueueChoice::Queue(2))
            .await
            .unwrap();
        env.broker
            .send(msg("other", "x"), QueueChoice::Queue(0))
            .await
            .unwrap();
    }
    let mut pullers = pullers.into_iter().map(Some).collect::<Vec<_>>();
    let r = pullers[2].take().unwrap().await.unwrap().unwrap();
    assert_eq!(r.status, PullStatus::Found);
    assert_eq!(bodies(&r)[0], "q2-0");
    tokio::time::sleep(Duration::from_millis(50)).await;
    for q in [0, 1, 3] {
        assert!(
            !pullers[q].as_ref().unwrap().is_finished(),
            "queue {q} had no message: its pull still waits"
        );
    }
    // Then each waiting queue gets its message, and its puller returns with it.
    for q in [3u32, 0, 1] {
        env.broker
            .send(msg("t", &format!("q{q}")), QueueChoice::Queue(q))
            .await
            .unwrap();
        let r = tokio::time::timeout(Duration::from_secs(10), pullers[q as usize].take().unwrap())
            .await
            .expect("woken by its queue's message")
            .unwrap()
            .unwrap();
        assert_eq!(bodies(&r), [format!("q{q}")]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_wait_is_woken_by_any_of_its_queues_and_not_by_other_topics() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    env.broker
        .create_topic(TopicConfig::new("t", 4))
        .await
        .unwrap();
    env.broker
        .send(msg("t", "old"), QueueChoice::Queue(1))
        .await
        .unwrap();
    // A queue behind its end: no waiting at all.
    let behind = tokio::time::timeout(
        Duration::from_secs(10),
        env.broker
            .wait_for_arrivals("t", vec![0, 0, 0, 0], Duration::from_secs(60)),
    )
    .await
    .expect("returns at once when a queue has more");
    assert!(behind.unwrap(), "a local broker waits on topics");
    // Caught up everywhere: it waits, through appends to other topics, until
    // one of its own queues gets an entry.
    let waiter = {
        let broker = env.broker.clone();
        tokio::spawn(async move {
            broker
                .wait_for_arrivals("t", vec![0, 1, 0, 0], Duration::from_secs(60))
                .await
        })
    };
    for _ in 0..5 {
        env.broker
            .send(msg("other", "x"), QueueChoice::Queue(0))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "caught up: it still waits");
    env.broker
        .send(msg("t", "new"), QueueChoice::Queue(3))
        .await
        .unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken by queue 3's entry, not by its 60 s wait");
    assert!(woken.unwrap().unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_waiting_pull_gives_up_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    env.broker
        .create_topic(TopicConfig::new("t", 1))
        .await
        .unwrap();
    let mut req = pull_req("g", "m", "t", 0, 0);
    req.wait = Duration::from_secs(30);
    let started = tokio::time::Instant::now();
    let r = env.broker.pull(req).await.unwrap();
    assert_eq!(r.status, PullStatus::NoNewMessage);
    assert!(r.messages.is_empty());
    assert_eq!(r.next_offset, 0);
    assert!(started.elapsed() >= Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pull_skips_messages_its_filter_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let mut req = pull_req("g", "m", "t", 0, 0);
    req.wait = Duration::from_secs(60);
    req.filter = Filter::tag("A").unwrap();
    let puller = {
        let broker = b.clone();
        tokio::spawn(async move { broker.pull(req).await })
    };
    b.send(msg("t", "b").with_tags("B"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    env.dispatched();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !puller.is_finished(),
        "a non-matching message does not end the wait"
    );
    b.send(msg("t", "a").with_tags("A"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    let r = puller.await.unwrap().unwrap();
    assert_eq!(bodies(&r), ["a"]);
    assert_eq!(r.next_offset, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_and_sql92_filters_apply_on_pull() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let sends = [
        ("TagA", "eu", "5"),
        ("TagB", "eu", "50"),
        ("TagC", "us", "50"),
        ("TagA", "us", "20"),
    ];
    for (i, (tag, region, price)) in sends.iter().enumerate() {
        let m = msg("t", &format!("m{i}"))
            .with_tags(*tag)
            .with_property("region", *region)
            .with_property("price", *price);
        b.send(m, QueueChoice::Queue(0)).await.unwrap();
    }
    env.dispatched();
    let pull = |filter: Filter| {
        let mut req = pull_req("g", "m", "t", 0, 0);
        req.filter = filter;
        b.pull(req)
    };
    let r = pull(Filter::tag("TagA || TagB").unwrap()).await.unwrap();
    assert_eq!(bodies(&r), ["m0", "m1", "m3"]);
    let r = pull(Filter::sql92("region = 'eu' AND price > 10").unwrap())
        .await
        .unwrap();
    assert_eq!(bodies(&r), ["m1"]);
    // Past the rejected ones at the end too: they need not be examined again.
    assert_eq!(r.next_offset, 4);
    let r = pull(Filter::sql92("TAGS IN ('TagC') OR price BETWEEN 1 AND 10").unwrap())
        .await
        .unwrap();
    assert_eq!(bodies(&r), ["m0", "m2"]);
    // Nothing matches: the offset still moves past what was examined.
    let r = pull(Filter::tag("TagZ").unwrap()).await.unwrap();
    assert_eq!(r.status, PullStatus::NoNewMessage);
    assert_eq!(r.next_offset, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_offsets_are_moved() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    for i in 0..3 {
        b.send(msg("t", &i.to_string()), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    env.dispatched();
    let r = b.pull(pull_req("g", "m", "t", 0, 100)).await.unwrap();
    assert_eq!(r.status, PullStatus::OffsetMoved);
    assert_eq!((r.next_offset, r.min_offset, r.max_offset), (3, 0, 3));
    assert!(matches!(
        b.pull(pull_req("g", "m", "t", 1, 0)).await,
        Err(Error::QueueNotFound { .. })
    ));
    assert!(matches!(
        b.pull(pull_req("g", "m", "nope", 0, 0)).await,
        Err(Error::TopicNotFound { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_filter_is_rejected_at_subscribe_time() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let mut h = hb("g", "m", ConsumeMode::Clustering, "t");
    h.subscriptions = vec![Subscription::sql92("t", "price > AND")];
    let err = env.broker.heartbeat(h).await.unwrap_err();
    assert!(matches!(err, Error::InvalidFilter(_)), "{err}");
    assert!(matches!(
        env.broker.assignment("g", "m", "t").await,
        Err(Error::TopicNotFound { .. } | Error::MemberNotFound { .. })
    ));
}

/// Two members share four queues; one consumes part of its share and vanishes
/// without committing the rest; after its heartbeat expires the survivor takes
/// every queue over from the committed offsets and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clustering_is_at_least_once_across_a_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 4)).await.unwrap();
    b.heartbeat(hb("g", "m1", ConsumeMode::Clustering, "t"))
        .await
        .unwrap();
    b.heartbeat(hb("g", "m2", ConsumeMode::Clustering, "t"))
        .await
        .unwrap();
    let sent: BTreeSet<String> = (0..200).map(|i| format!("m{i}")).collect();
    for body in &sent {
        b.send(msg("t", body), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    env.dispatched();

    let a1 = b.assignment("g", "m1", "t").await.unwrap();
    let a2 = b.assignment("g", "m2", "t").await.unwrap();
    assert_eq!(a1.len() + a2.len(), 4);
    assert!(a1.iter().all(|q| !a2.contains(q)), "{a1:?} / {a2:?}");

    let mut consumed = BTreeSet::new();
    for q in &a1 {
        let (got, next) = drain(b, "g", "m1", "t", *q, 0).await;
        consumed.extend(got);
        b.commit_offset("g", "m1", "t", *q, next).await.unwrap();
    }
    // m2 processes 10 messages of each queue but commits only 5, then dies.
    for q in &a2 {
        let mut req = pull_req("g", "m2", "t", *q, 0);
        req.max_messages = 10;
        let r = b.pull(req).await.unwrap();
        consumed.extend(bodies(&r));
        b.commit_offset("g", "m2", "t", *q, 5).await.unwrap();
    }

    // m1 keeps heart-beating; m2 is silent past the member timeout.
    env.clock.advance(Duration::from_secs(6));
    b.heartbeat(hb("g", "m1", ConsumeMode::Clustering, "t"))
        .await
        .unwrap();
    env.clock.advance(Duration::from_secs(6));
    let taken = b.assignment("g", "m1", "t").await.unwrap();
    assert_eq!(taken, [0, 1, 2, 3]);
    assert!(matches!(
        b.assignment("g", "m2", "t").await,
        Err(Error::MemberNotFound { .. })
    ));
    for q in taken {
        let from = b
            .query_offset("g", "m1", "t", q)
            .await
            .unwrap()
            .unwrap_or(0);
        let (got, next) = drain(b, "g", "m1", "t", q, from).await;
        consumed.extend(got);
        b.commit_offset("g", "m1", "t", q, next).await.unwrap();
    }
    assert_eq!(consumed, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcasting_members_each_get_everything_with_their_own_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 2)).await.unwrap();
    for m in ["m1", "m2"] {
        b.heartbeat(hb("g", m, ConsumeMode::Broadcasting, "t"))
            .await
            .unwrap();
    }
    for i in 0..6 {
        b.send(msg("t", &i.to_string()), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    env.dispatched();
    for m in ["m1", "m2"] {
        assert_eq!(b.assignment("g", m, "t").await.unwrap(), [0, 1]);
    }
    b.commit_offset("g", "m1", "t", 0, 3).await.unwrap();
    assert_eq!(b.query_offset("g", "m1", "t", 0).await.unwrap(), Some(3));
    assert_eq!(b.query_offset("g", "m2", "t", 0).await.unwrap(), None);
    assert!(matches!(
        b.query_offset("g", "", "t", 0).await,
        Err(Error::InvalidArgument(_))
    ));
    // A clustering member cannot join a broadcasting group.
    assert!(matches!(
        b.heartbeat(hb("g", "m3", ConsumeMode::Clustering, "t"))
            .await,
        Err(Error::GroupModeConflict { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_queue_is_consumed_by_its_holder_only() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 2)).await.unwrap();
    for m in ["m1", "m2"] {
        b.heartbeat(hb("g", m, ConsumeMode::Clustering, "t"))
            .await
            .unwrap();
    }
    b.lock_queue("g", "m1", "t", 0).await.unwrap();
    assert!(matches!(
        b.lock_queue("g", "m2", "t", 0).await,
        Err(Error::QueueLocked { .. })
    ));
    assert!(matches!(
        b.pull(pull_req("g", "m2", "t", 0, 0)).await,
        Err(Error::QueueLocked { .. })
    ));
    b.pull(pull_req("g", "m1", "t", 0, 0)).await.unwrap();
    b.pull(pull_req("g", "m2", "t", 1, 0)).await.unwrap();
    // The lease runs out without renewal (5 s in these tests).
    env.clock.advance(Duration::from_secs(6));
    for m in ["m1", "m2"] {
        b.heartbeat(hb("g", m, ConsumeMode::Clustering, "t"))
            .await
            .unwrap();
    }
    b.lock_queue("g", "m2", "t", 0).await.unwrap();
    b.unlock_queue("g", "m2", "t", 0).await.unwrap();
    b.lock_queue("g", "m1", "t", 0).await.unwrap();
}
