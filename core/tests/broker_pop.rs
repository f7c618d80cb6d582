//! POP through the `MessagingApi`: message-level load balancing between
//! consumers of one group, ack by receipt handle, reappearance after the
//! invisibility time, change of invisibility, stale and garbled handles,
//! filters, long polling, and the state surviving a restart.

mod broker_support;

use std::collections::BTreeSet;
use std::time::Duration;

use broker_support::{body, open, options};
use rocketgate_core::Error;
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    Broker, MessagingApi, PopRequest, Popped, QueueChoice, ReceiptHandle, TopicConfig,
};
use rocketgate_core::store::Message;

const INVISIBLE: Duration = Duration::from_secs(30);

fn msg(topic: &str, body: &str) -> Message {
    Message::new(topic, 0, body.as_bytes().to_vec())
}

fn pop_req(group: &str, topic: &str, max: usize) -> PopRequest {
    PopRequest {
        group: group.into(),
        topic: topic.into(),
        filter: Filter::all(),
        max_messages: max,
        invisible: INVISIBLE,
        wait: Duration::ZERO,
    }
}

async fn pop(b: &Broker, group: &str, topic: &str, max: usize) -> Vec<Popped> {
    b.pop(pop_req(group, topic, max)).await.unwrap()
}

fn bodies(popped: &[Popped]) -> BTreeSet<String> {
    popped.iter().map(|p| body(&p.message)).collect()
}

async fn send_all(b: &Broker, topic: &str, bodies: impl IntoIterator<Item = String>) {
    for body in bodies {
        b.send(msg(topic, &body), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_goes_to_one_consumer_and_acked_ones_never_return() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 4)).await.unwrap();
    send_all(b, "t", names(0..40)).await;
    env.dispatched();

    // Two consumers pop concurrently in small batches until the topic is dry.
    let consumer = |b: std::sync::Arc<Broker>| async move {
        let mut got = Vec::new();
        loop {
            let batch = pop(&b, "g", "t", 3).await;
            if batch.is_empty() {
                return got;
            }
            got.extend(batch);
        }
    };
    let (a, c) = tokio::join!(
        tokio::spawn(consumer(b.clone())),
        tokio::spawn(consumer(b.clone()))
    );
    let (a, c) = (a.unwrap(), c.unwrap());
    assert_eq!(a.len() + c.len(), 40, "each message handed out once");
    let (sa, sc) = (bodies(&a), bodies(&c));
    assert!(sa.is_disjoint(&sc), "no message went to both consumers");
    let all: BTreeSet<String> = sa.union(&sc).cloned().collect();
    assert_eq!(all, names(0..40).into_iter().collect());
    assert!(a.iter().chain(&c).all(|p| p.attempt() == 1));

    for p in a.iter().chain(&c) {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    env.clock.advance(Duration::from_secs(3600));
    assert!(pop(b, "g", "t", 32).await.is_empty(), "acked never return");
    // The group's consume offsets moved past everything.
    for q in 0..4 {
        assert_eq!(b.query_offset("g", "", "t", q).await.unwrap(), Some(10));
    }
    // Another group gets its own copy.
    assert_eq!(pop(b, "other", "t", 64).await.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_messages_reappear_after_the_deadline_with_attempt_two() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    send_all(b, "t", names(0..4)).await;
    env.dispatched();

    let first = pop(b, "g", "t", 10).await;
    assert_eq!(first.len(), 4);
    for p in first.iter().filter(|p| p.message.queue_offset % 2 == 0) {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    assert!(pop(b, "g", "t", 10).await.is_empty(), "still invisible");
    env.clock.advance(INVISIBLE - Duration::from_millis(1));
    assert!(pop(b, "g", "t", 10).await.is_empty(), "still invisible");
    env.clock.advance(Duration::from_millis(1));

    let again = pop(b, "g", "t", 10).await;
    assert_eq!(bodies(&again), BTreeSet::from(["m1".into(), "m3".into()]));
    assert!(again.iter().all(|p| p.attempt() == 2));
    // The first delivery's handles no longer ack: the redelivery owns the message.
    for p in first.iter().filter(|p| p.message.queue_offset % 2 == 1) {
        let err = b.ack(&p.receipt.to_string()).await.unwrap_err();
        assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err:?}");
    }
    for p in &again {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    env.clock.advance(INVISIBLE * 10);
    assert!(pop(b, "g", "t", 10).await.is_empty());
    assert_eq!(b.query_offset("g", "", "t", 0).await.unwrap(), Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_invisibility_extends_the_deadline_and_stales_the_old_handle() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    send_all(b, "t", names(0..1)).await;
    env.dispatched();

    let popped = pop(b, "g", "t", 1).await.remove(0);
    let old = popped.receipt.to_string();
    // Even with the same deadline (the clock has not moved), the handle changes.
    let same = b.change_invisibility(&old, INVISIBLE).await.unwrap();
    assert_ne!(same.to_string(), old);
    let renewed = b
        .change_invisibility(&same.to_string(), INVISIBLE * 2)
        .await
        .unwrap();
    assert_eq!(
        renewed.invisible_until_ms,
        popped.receipt.invisible_until_ms + INVISIBLE.as_millis() as i64
    );
    assert_eq!(renewed.attempt, 1);

    env.clock.advance(INVISIBLE + Duration::from_secs(1));
    assert!(
        pop(b, "g", "t", 1).await.is_empty(),
        "the new deadline holds"
    );
    for stale in [&old, &same.to_string()] {
        let err = b.ack(stale).await.unwrap_err();
        assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err:?}");
        let err = b.change_invisibility(stale, INVISIBLE).await.unwrap_err();
        assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err:?}");
    }
    b.ack(&renewed.to_string()).await.unwrap();
    let err = b.ack(&renewed.to_string()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::StaleReceiptHandle {
                reason: "already acked",
                ..
            }
        ),
        "{err:?}"
    );
    env.clock.advance(INVISIBLE * 10);
    assert!(pop(b, "g", "t", 1).await.is_empty(), "acked: gone for good");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_handles_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    send_all(b, "t", names(0..1)).await;
    env.dispatched();
    let popped = pop(b, "g", "t", 1).await.remove(0);
    let good = popped.receipt.to_string();

    for garbled in [
        "",
        "hello",
        &good[..good.len() - 2],
        &good.replace("v1", "v9"),
    ] {
        let err = b.ack(garbled).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidReceiptHandle { .. }),
            "{garbled:?}: {err:?}"
        );
        let err = b.change_invisibility(garbled, INVISIBLE).await.unwrap_err();
        assert!(matches!(err, Error::InvalidReceiptHandle { .. }), "{err:?}");
    }
    // Well-formed, but naming nothing this broker handed out.
    let forged = [
        ReceiptHandle {
            group: "nobody".into(),
            ..popped.receipt.clone()
        },
        ReceiptHandle {
            queue_offset: 7,
            ..popped.receipt.clone()
        },
        ReceiptHandle {
            attempt: 2,
            ..popped.receipt.clone()
        },
    ];
    for f in forged {
        let err = b.ack(&f.to_string()).await.unwrap_err();
        assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err:?}");
    }
    // None of that acked the real delivery.
    b.ack(&good).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pop_applies_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    for (body, tag) in [("a1", "A"), ("b1", "B"), ("a2", "A"), ("c1", "C")] {
        b.send(msg("t", body).with_tags(tag), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    env.dispatched();
    let mut req = pop_req("g", "t", 10);
    req.filter = Filter::tag("A || C").unwrap();
    let got = b.pop(req.clone()).await.unwrap();
    assert_eq!(
        bodies(&got),
        BTreeSet::from(["a1".into(), "a2".into(), "c1".into()])
    );
    for p in &got {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    env.clock.advance(INVISIBLE * 2);
    assert!(b.pop(req).await.unwrap().is_empty());
    // The rejected message counts as consumed for the group.
    assert_eq!(b.query_offset("g", "", "t", 0).await.unwrap(), Some(4));
}

/// A POP of up to 4 messages with a 60 s wait, spawned; checked to be waiting.
async fn waiting_pop(
    broker: &std::sync::Arc<Broker>,
    topic: &str,
) -> tokio::task::JoinHandle<rocketgate_core::Result<Vec<Popped>>> {
    let mut req = pop_req("g", topic, 4);
    req.wait = Duration::from_secs(60);
    let popper = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.pop(req).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!popper.is_finished(), "the pop waits: nothing for it yet");
    popper
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pop_wakes_on_a_new_message() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    env.broker
        .create_topic(TopicConfig::new("t", 2))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let popper = waiting_pop(&env.broker, "t").await;
    env.broker
        .send(msg("t", "hello"), QueueChoice::Queue(1))
        .await
        .unwrap();
    let got = popper.await.unwrap().unwrap();
    assert_eq!(bodies(&got), BTreeSet::from(["hello".into()]));
    assert_eq!(got[0].message.queue_id, 1);
    // Woken by the send, not by its 60 s timeout.
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pop_sees_a_queue_added_while_it_waits() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let started = std::time::Instant::now();
    let popper = waiting_pop(&env.broker, "t").await;
    // The POP waits on the arrivals of the queues it knew (one); the topic
    // grows to two and the message goes to the new one.
    b.update_topic(TopicConfig::new("t", 2)).await.unwrap();
    b.send(msg("t", "late"), QueueChoice::Queue(1))
        .await
        .unwrap();
    let got = popper.await.unwrap().unwrap();
    assert_eq!(bodies(&got), BTreeSet::from(["late".into()]));
    assert_eq!(got[0].message.queue_id, 1);
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pop_is_not_answered_by_another_topics_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("quiet", 4)).await.unwrap();
    b.create_topic(TopicConfig::new("busy", 4)).await.unwrap();
    let popper = waiting_pop(&env.broker, "quiet").await;
    send_all(b, "busy", names(0..200)).await;
    env.dispatched();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!popper.is_finished(), "nothing arrived on its topic");
    b.send(msg("quiet", "mine"), QueueChoice::Queue(3))
        .await
        .unwrap();
    let got = popper.await.unwrap().unwrap();
    assert_eq!(bodies(&got), BTreeSet::from(["mine".into()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pop_wakes_on_a_nack() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    send_all(b, "t", names(0..1)).await;
    env.dispatched();
    let first = pop(b, "g", "t", 1).await.remove(0);

    let mut req = pop_req("g", "t", 1);
    req.wait = Duration::from_secs(60);
    let started = std::time::Instant::now();
    let popper = {
        let broker = env.broker.clone();
        tokio::spawn(async move { broker.pop(req).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!popper.is_finished(), "the only message is invisible");
    // A nack: visible again now, not at the deadline the waiting POP knew.
    b.change_invisibility(&first.receipt.to_string(), Duration::ZERO)
        .await
        .unwrap();
    let got = popper.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].receipt.attempt, 2);
    // Woken by the nack, not by the 30 s invisibility nor the 60 s wait.
    assert!(started.elapsed() < Duration::from_secs(25));
}

#[tokio::test(start_paused = true)]
async fn a_waiting_pop_gives_up_after_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    env.broker
        .create_topic(TopicConfig::new("t", 1))
        .await
        .unwrap();
    let mut req = pop_req("g", "t", 4);
    req.wait = Duration::from_secs(20);
    let started = tokio::time::Instant::now();
    assert!(env.broker.pop(req).await.unwrap().is_empty());
    assert!(started.elapsed() >= Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_unacked_messages_return_and_acked_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 2)).await.unwrap();
    send_all(b, "t", names(0..8)).await;
    env.dispatched();
    let got = pop(b, "g", "t", 8).await;
    assert_eq!(got.len(), 8);
    // Ack above the low-water mark: offsets 1 and 3 of each queue.
    let (acked, unacked): (Vec<_>, Vec<_>) =
        got.iter().partition(|p| p.message.queue_offset % 2 == 1);
    for p in &acked {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    let kept = unacked[0].receipt.to_string();
    env.close();

    let env = open(dir.path(), options());
    let b = &env.broker;
    for q in 0..2 {
        assert_eq!(b.query_offset("g", "", "t", q).await.unwrap(), Some(0));
    }
    // Leases survive: still invisible, and a handle from before still acks.
    assert!(pop(b, "g", "t", 8).await.is_empty());
    b.ack(&kept).await.unwrap();
    env.clock.advance(INVISIBLE);
    let again = pop(b, "g", "t", 8).await;
    let expected: BTreeSet<String> = unacked[1..].iter().map(|p| body(&p.message)).collect();
    assert_eq!(bodies(&again), expected);
    assert!(again.iter().all(|p| p.attempt() == 2));
    for p in &again {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    // New messages go on from where the cursor was.
    send_all(b, "t", names(8..10)).await;
    env.dispatched();
    let fresh = pop(b, "g", "t", 8).await;
    assert_eq!(bodies(&fresh), BTreeSet::from(["m8".into(), "m9".into()]));
    assert!(fresh.iter().all(|p| p.attempt() == 1));
    for p in &fresh {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }
    for q in 0..2 {
        assert_eq!(b.query_offset("g", "", "t", q).await.unwrap(), Some(5));
    }
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pop_refuses_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    let err = b.pop(pop_req("g", "missing", 1)).await.unwrap_err();
    assert!(matches!(err, Error::TopicNotFound { .. }), "{err:?}");
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let err = b.pop(pop_req("g", "t", 0)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = b.pop(pop_req("bad group", "t", 1)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidName(_)), "{err:?}");
}

/// A FIFO group: while a queue's message is in flight nothing after it goes out;
/// a nack or timeout brings the same message back (attempt raised) before the
/// rest; handles of a redelivered batch's tail go stale; the DLQ takes a message
/// after its last attempt and the queue moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_group_hands_out_a_queue_in_order_through_nacks_and_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 2)).await.unwrap();
    b.set_fifo("g", true).await.unwrap();
    b.set_max_reconsume_times("g", Some(1)).await.unwrap();
    assert!(b.group_info("g").await.unwrap().fifo);
    for i in 0..4 {
        b.send(msg("t", &format!("a{i}")), QueueChoice::Queue(0))
            .await
            .unwrap();
    }
    env.dispatched();
    let seen = |p: &[Popped]| p.iter().map(|p| body(&p.message)).collect::<Vec<_>>();

    // One POP takes a batch of queue 0; the next gets nothing until it is done.
    let first = pop(b, "g", "t", 2).await;
    assert_eq!(seen(&first), ["a0", "a1"]);
    assert!(pop(b, "g", "t", 10).await.is_empty(), "queue 0 is held");
    // a1 acked out of turn, a0 nacked: a0 comes back first, alone.
    b.ack(&first[1].receipt.to_string()).await.unwrap();
    b.change_invisibility(&first[0].receipt.to_string(), Duration::ZERO)
        .await
        .unwrap();
    let again = pop(b, "g", "t", 10).await;
    assert_eq!(seen(&again), ["a0"]);
    assert_eq!(again[0].attempt(), 2);
    b.ack(&again[0].receipt.to_string()).await.unwrap();

    // a2, a3 out; a2 times out: both come back, in order, a3's old handle stale.
    let batch = pop(b, "g", "t", 10).await;
    assert_eq!(seen(&batch), ["a2", "a3"]);
    env.clock.advance(INVISIBLE);
    let back = pop(b, "g", "t", 1).await;
    assert_eq!(seen(&back), ["a2"]);
    assert!(matches!(
        b.ack(&batch[1].receipt.to_string()).await,
        Err(Error::StaleReceiptHandle { .. })
    ));
    // a2 times out once more: past its last attempt it goes to the DLQ and a3 follows.
    env.clock.advance(INVISIBLE);
    let after = pop(b, "g", "t", 10).await;
    assert_eq!(seen(&after), ["a3"]);
    let dlq = pop(b, "dlq-reader", "%DLQ%g", 10).await;
    assert_eq!(seen(&dlq), ["a2"]);
    b.ack(&after[0].receipt.to_string()).await.unwrap();
    env.clock.advance(Duration::from_secs(3600));
    assert!(pop(b, "g", "t", 10).await.is_empty());

    // A nack gives back the later messages of its queue the group has out too.
    for i in 4..7 {
        b.send(msg("t", &format!("a{i}")), QueueChoice::Queue(0))
            .await
            .unwrap();
    }
    env.dispatched();
    let held = pop(b, "g", "t", 3).await;
    assert_eq!(seen(&held), ["a4", "a5", "a6"]);
    b.nack(&held[0].receipt.to_string(), Duration::ZERO)
        .await
        .unwrap();
    assert!(matches!(
        b.ack(&held[1].receipt.to_string()).await,
        Err(Error::StaleReceiptHandle { .. })
    ));
    let again = pop(b, "g", "t", 10).await;
    assert_eq!(seen(&again), ["a4", "a5", "a6"]);
    for p in &again {
        b.ack(&p.receipt.to_string()).await.unwrap();
    }

    // Back to a concurrent group: the setting is remembered per group.
    b.set_fifo("g", false).await.unwrap();
    assert!(!b.group_info("g").await.unwrap().fifo);
}
