//! Retry with back-off and dead letters through the `MessagingApi`, driven by a
//! manual clock: send-back through `%RETRY%<group>` at 10 s, 30 s, 1 m; the
//! last failure into `%DLQ%<group>` with the message intact; re-sending dead
//! letters; POP messages never acked ending in the DLQ; all of it across a
//! restart.

mod broker_support;

use std::time::Duration;

use broker_support::{Env, body, drain, open, options, pull_req};
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::schedule::RetryDecision;
use rocketgate_core::broker::{
    BrokerSettings, DeadLetters, Delivered, MessagingApi, PopRequest, QueueChoice, TopicConfig,
};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::property;

const RETRY: &str = "%RETRY%g";
const DLQ: &str = "%DLQ%g";

fn with_max(max: u32) -> BrokerSettings {
    BrokerSettings {
        max_reconsume_times: max,
        ..options()
    }
}

fn original(body: &str) -> Message {
    Message::new("t", 0, body.as_bytes().to_vec())
        .with_tags("TagA")
        .with_keys(["k1", "k2"])
        .with_property("color", "red")
}

/// Moves the clock, delivers what is due, waits for it to be readable.
async fn advance(env: &Env, by: Duration) -> usize {
    env.clock.advance(by);
    env.dispatched();
    let n = env.broker.deliver_due().await.unwrap();
    env.dispatched();
    n
}

/// The message at `offset` of queue 0 of `topic`.
async fn at(env: &Env, topic: &str, offset: u64) -> Delivered {
    env.dispatched();
    let r = env
        .broker
        .pull(pull_req("reader", "", topic, 0, offset))
        .await
        .unwrap();
    assert_eq!(r.messages[0].queue_offset, offset, "{topic}");
    r.messages[0].clone()
}

async fn all(env: &Env, topic: &str) -> Vec<String> {
    env.dispatched();
    drain(&env.broker, "reader", "", topic, 0, 0).await.0
}

/// Body, tags, keys and user properties as sent.
fn assert_intact(d: &Delivered, body_text: &str) {
    let v = d.view().unwrap();
    assert_eq!(body(d), body_text);
    assert_eq!(v.tags(), Some("TagA"));
    assert_eq!(v.keys().collect::<Vec<_>>(), ["k1", "k2"]);
    assert_eq!(v.property("color"), Some("red"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_back_off_through_the_retry_topic_then_dead_letter_and_resend() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), with_max(3));
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    b.send(original("hello"), QueueChoice::Queue(0))
        .await
        .unwrap();
    let first = at(&env, "t", 0).await;

    let mut failed = ("t".to_owned(), 0_u64);
    for (i, backoff) in [10_u64, 30, 60].into_iter().enumerate() {
        let r = b
            .send_back("g", &failed.0, 0, failed.1, None)
            .await
            .unwrap();
        assert!(matches!(r.decision, RetryDecision::Retry { .. }));
        let before = all(&env, RETRY).await.len();
        assert_eq!(before, i, "nothing new in the retry topic yet");
        assert_eq!(
            advance(&env, Duration::from_millis(backoff * 1000 - 1)).await,
            0
        );
        assert_eq!(all(&env, RETRY).await.len(), i, "not before {backoff} s");
        assert_eq!(advance(&env, Duration::from_millis(1)).await, 1);
        let retried = at(&env, RETRY, i as u64).await;
        let v = retried.view().unwrap();
        assert_eq!(v.reconsume_times(), i as i32 + 1);
        assert_eq!(v.property(property::RETRY_TOPIC), Some("t"));
        assert_eq!(v.property(property::DELAY_TIME_LEVEL), None);
        assert_intact(&retried, "hello");
        failed = (RETRY.to_owned(), i as u64);
    }

    // The 4th failure: out of attempts.
    let r = b.send_back("g", RETRY, 0, 2, None).await.unwrap();
    assert_eq!(r.decision, RetryDecision::DeadLetter);
    assert_eq!(r.sent.topic, DLQ);
    let dead = at(&env, DLQ, 0).await;
    let v = dead.view().unwrap();
    assert_intact(&dead, "hello");
    assert_eq!(v.reconsume_times(), 4);
    assert_eq!(v.property(property::RETRY_TOPIC), Some("t"));
    let origin = v.property(property::ORIGIN_MESSAGE_ID).unwrap().to_owned();
    assert!(!origin.is_empty());
    // Every copy named the same origin.
    let retried = at(&env, RETRY, 0).await;
    assert_eq!(
        retried
            .view()
            .unwrap()
            .property(property::ORIGIN_MESSAGE_ID),
        Some(origin.as_str())
    );
    // Nothing else comes back, however long we wait.
    assert_eq!(advance(&env, Duration::from_secs(3 * 3600)).await, 0);
    assert_eq!(all(&env, RETRY).await.len(), 3);

    // Re-send the dead letter: back on "t", reconsume times reset, once.
    let sent = b.resend_dead_letters("g", DeadLetters::All).await.unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].topic, "t");
    assert_eq!(all(&env, "t").await, ["hello", "hello"]);
    let again = at(&env, "t", 1).await;
    let v = again.view().unwrap();
    assert_intact(&again, "hello");
    assert_eq!(v.reconsume_times(), 0);
    assert_eq!(v.property(property::RETRY_TOPIC), None);
    assert_eq!(v.body(), first.view().unwrap().body());
    assert!(
        b.resend_dead_letters("g", DeadLetters::All)
            .await
            .unwrap()
            .is_empty()
    );
    // One by offset re-sends it again on request.
    let sent = b
        .resend_dead_letters("g", DeadLetters::One(0))
        .await
        .unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(all(&env, "t").await.len(), 3);
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_delay_level_and_a_missing_message() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    b.send(original("x"), QueueChoice::Queue(0)).await.unwrap();
    env.dispatched();
    // Level 1 is 1 s instead of the 10 s back-off.
    b.send_back("g", "t", 0, 0, Some(1)).await.unwrap();
    assert_eq!(advance(&env, Duration::from_secs(1)).await, 1);
    assert_eq!(all(&env, RETRY).await, ["x"]);
    assert!(matches!(
        b.send_back("g", "t", 0, 7, None).await,
        Err(rocketgate_core::Error::MessageNotFound { .. })
    ));
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_message_never_acked_ends_in_the_dlq() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), with_max(2));
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    b.send(original("p"), QueueChoice::Queue(0)).await.unwrap();
    env.dispatched();
    let req = PopRequest {
        group: "g".into(),
        topic: "t".into(),
        filter: Filter::all(),
        max_messages: 4,
        invisible: Duration::from_secs(30),
        wait: Duration::ZERO,
    };
    // Delivered once, then redelivered max_reconsume_times (2) times.
    for attempt in 1..=3 {
        let got = b.pop(req.clone()).await.unwrap();
        assert_eq!(got.len(), 1, "delivery {attempt}");
        assert_eq!(got[0].attempt(), attempt);
        env.clock.advance(Duration::from_secs(31));
    }
    assert!(b.pop(req.clone()).await.unwrap().is_empty());
    let dead = at(&env, DLQ, 0).await;
    assert_intact(&dead, "p");
    assert_eq!(
        dead.view().unwrap().property(property::RETRY_TOPIC),
        Some("t")
    );
    // Gone from the POP for good, and dead-lettered once.
    env.clock.advance(Duration::from_secs(3600));
    assert!(b.pop(req.clone()).await.unwrap().is_empty());
    assert_eq!(all(&env, DLQ).await, ["p"]);
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_dead_letters_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    env.broker
        .create_topic(TopicConfig::new("t", 1))
        .await
        .unwrap();
    env.broker
        .send(original("r"), QueueChoice::Queue(0))
        .await
        .unwrap();
    env.dispatched();
    env.broker.send_back("g", "t", 0, 0, None).await.unwrap();
    env.close();

    // Waiting for its retry across the restart; now allowed no retries at all.
    let env = open(dir.path(), with_max(0));
    assert_eq!(advance(&env, Duration::from_secs(10)).await, 1);
    let retried = at(&env, RETRY, 0).await;
    assert_eq!(retried.view().unwrap().reconsume_times(), 1);
    let r = env.broker.send_back("g", RETRY, 0, 0, None).await.unwrap();
    assert_eq!(r.decision, RetryDecision::DeadLetter);
    env.close();

    let env = open(dir.path(), options());
    assert_eq!(advance(&env, Duration::from_secs(3600)).await, 0);
    assert_eq!(all(&env, RETRY).await, ["r"]);
    assert_intact(&at(&env, DLQ, 0).await, "r");
    let sent = env
        .broker
        .resend_dead_letters("g", DeadLetters::All)
        .await
        .unwrap();
    assert_eq!(sent.len(), 1);
    env.broker.flush_offsets().unwrap();
    env.close();

    let env = open(dir.path(), options());
    assert_eq!(all(&env, "t").await, ["r", "r"]);
    assert!(
        env.broker
            .resend_dead_letters("g", DeadLetters::All)
            .await
            .unwrap()
            .is_empty()
    );
    env.close();
}
