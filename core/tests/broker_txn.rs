//! Transactions through `MessagingApi`: half messages invisible until commit,
//! commit visible once, rollback never, the check-back driven by the broker
//! clock, and undecided halves surviving a clean restart and a crash.

mod broker_support;

use std::sync::Arc;
use std::time::Duration;

use broker_support::{Env, body, drain, open, options, pull_req};
use rocketgate_core::Error;
use rocketgate_core::broker::{
    BrokerSettings, CheckRound, HalfMessage, MessagingApi, PopRequest, QueueChoice, Resolution,
    TopicConfig, TransactionChecker, TransactionHandle, filter::Filter,
};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::property;
use tokio::sync::mpsc;

fn half(body: &str, uniq: &str) -> Message {
    Message::new("t", 0, body.to_owned())
        .with_tags("TagA")
        .with_keys([format!("key-{body}")])
        .with_property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
        .with_property("user", "v")
}

fn pop_req() -> PopRequest {
    PopRequest {
        group: "pop-group".into(),
        topic: "t".into(),
        filter: Filter::all(),
        max_messages: 16,
        invisible: Duration::from_secs(30),
        wait: Duration::ZERO,
    }
}

async fn setup(opts: BrokerSettings) -> (tempfile::TempDir, Env) {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), opts);
    env.broker
        .create_topic(TopicConfig::new("t", 1))
        .await
        .unwrap();
    (dir, env)
}

/// Everything a consumer could see of topic `t` right now.
async fn visible(env: &Env) -> Vec<String> {
    env.dispatched();
    drain(&env.broker, "g", "m", "t", 0, 0).await.0
}

struct Chan(mpsc::UnboundedSender<HalfMessage>);

impl TransactionChecker for Chan {
    fn check(&self, half: HalfMessage) {
        let _ = self.0.send(half);
    }
}

fn round(checked: usize, unchecked: usize, rolled_back: usize) -> CheckRound {
    CheckRound {
        checked,
        unchecked,
        rolled_back,
    }
}

#[tokio::test]
async fn a_half_is_invisible_until_committed_then_visible_once() {
    let (_dir, env) = setup(options()).await;
    let b = &env.broker;
    let sent = b
        .send_half("pg", half("a", "U-A"), QueueChoice::Queue(0))
        .await
        .unwrap();
    assert_eq!((sent.sent.topic.as_str(), sent.sent.queue_id), ("t", 0));
    let h = sent.transaction;
    assert_eq!(h.half_queue_offset, sent.sent.append.queue_offset);
    assert_eq!(h.to_string().parse::<TransactionHandle>().unwrap(), h);

    // Invisible to pull, POP, lookups and queue stats.
    assert!(visible(&env).await.is_empty());
    assert!(b.pop(pop_req()).await.unwrap().is_empty());
    assert!(
        b.messages_by_key("t", "key-a", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(b.messages_by_key("t", "U-A", 10).await.unwrap().is_empty());
    for id in ["U-A", sent.sent.append.msg_id.as_str()] {
        assert!(matches!(
            b.message_by_id(id).await,
            Err(Error::MessageNotFound { .. })
        ));
    }
    assert_eq!(b.queue_stats("t").await.unwrap()[0].max_offset, 0);
    assert!(matches!(
        b.pull(pull_req("g", "m", "RMQ_SYS_TRANS_HALF_TOPIC", 0, 0))
            .await,
        Err(Error::TopicNotFound { .. })
    ));
    assert!(
        b.messages_by_time("t", 0, i64::MAX, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Commit: visible once, in the real topic and queue, same UNIQ_KEY.
    let committed = b
        .end_transaction(&h, Resolution::Commit)
        .await
        .unwrap()
        .expect("a commit says where the message went");
    assert_eq!((committed.topic.as_str(), committed.queue_id), ("t", 0));
    assert_eq!(visible(&env).await, ["a"]);
    let popped = b.pop(pop_req()).await.unwrap();
    assert_eq!(popped.len(), 1);
    let view = popped[0].message.view().unwrap();
    assert_eq!(view.topic(), "t");
    assert_eq!(view.tags(), Some("TagA"));
    assert_eq!(
        view.property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        Some("U-A")
    );
    assert_eq!(view.property("user"), Some("v"));
    assert_eq!(view.property(property::PRODUCER_GROUP), Some("pg"));
    assert_eq!(view.property(property::REAL_TOPIC), None);
    let found = b.message_by_id("U-A").await.unwrap();
    assert_eq!(body(&found), "a");
    assert_eq!(found.view().unwrap().topic(), "t");

    // Ending it again is a clear error, and nothing more appears.
    for r in [Resolution::Commit, Resolution::Rollback] {
        assert!(matches!(
            b.end_transaction(&h, r).await,
            Err(Error::TransactionEnded { .. })
        ));
    }
    env.clock.advance(Duration::from_secs(600));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 0, 0));
    assert_eq!(visible(&env).await, ["a"]);
    env.close();
}

#[tokio::test]
async fn a_rolled_back_half_is_never_visible() {
    let (_dir, env) = setup(options()).await;
    let b = &env.broker;
    let h = b
        .send_half("pg", half("r", "U-R"), QueueChoice::RoundRobin)
        .await
        .unwrap()
        .transaction;
    assert_eq!(
        b.end_transaction(&h, Resolution::Rollback).await.unwrap(),
        None
    );
    assert!(matches!(
        b.end_transaction(&h, Resolution::Commit).await,
        Err(Error::TransactionEnded { .. })
    ));
    env.clock.advance(Duration::from_secs(600));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 0, 0));
    assert!(visible(&env).await.is_empty());
    assert!(b.pop(pop_req()).await.unwrap().is_empty());
    assert!(matches!(
        b.message_by_id("U-R").await,
        Err(Error::MessageNotFound { .. })
    ));
    env.close();
}

#[tokio::test]
async fn bad_handles_and_bad_halves_are_clear_errors() {
    let (_dir, env) = setup(options()).await;
    let b = &env.broker;
    let h = b
        .send_half("pg", half("x", "U-X"), QueueChoice::Queue(0))
        .await
        .unwrap()
        .transaction;
    env.dispatched();
    let wrong_offset = TransactionHandle {
        commit_log_offset: h.commit_log_offset + 1,
        ..h.clone()
    };
    let wrong_queue = TransactionHandle {
        half_queue_offset: 99,
        ..h.clone()
    };
    for bad in [wrong_offset, wrong_queue] {
        assert!(matches!(
            b.end_transaction(&bad, Resolution::Commit).await,
            Err(Error::TransactionNotFound { .. })
        ));
    }
    assert!(matches!(
        "12".parse::<TransactionHandle>(),
        Err(Error::InvalidArgument(_))
    ));
    // Delayed transactional messages, bad groups and missing queues are refused.
    let delayed = half("d", "U-D").with_property(property::DELAY_TIME_LEVEL, "3");
    assert!(matches!(
        b.send_half("pg", delayed, QueueChoice::RoundRobin).await,
        Err(Error::InvalidMessage(_))
    ));
    assert!(matches!(
        b.send_half("bad group!", half("y", "U-Y"), QueueChoice::RoundRobin)
            .await,
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        b.send_half("pg", half("z", "U-Z"), QueueChoice::Queue(7))
            .await,
        Err(Error::QueueNotFound { .. })
    ));
    // The good one still commits.
    b.end_transaction(&h, Resolution::Commit).await.unwrap();
    assert_eq!(visible(&env).await, ["x"]);
    env.close();
}

#[tokio::test]
async fn the_checker_gets_the_half_and_answers_through_end_transaction() {
    let (_dir, env) = setup(options()).await;
    let b = &env.broker;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let registration = b
        .register_transaction_checker("pg", Arc::new(Chan(tx)))
        .await
        .unwrap();
    let sent = b
        .send_half("pg", half("c", "U-C"), QueueChoice::Queue(0))
        .await
        .unwrap();
    env.dispatched();
    // Younger than the transaction timeout (6 s): not checked yet.
    env.clock.advance(Duration::from_secs(5));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 0, 0));
    assert!(rx.try_recv().is_err());

    env.clock.advance(Duration::from_secs(2));
    assert_eq!(b.check_transactions().await.unwrap(), round(1, 0, 0));
    let checked = rx.try_recv().unwrap();
    assert_eq!(checked.producer_group, "pg");
    assert_eq!(checked.handle, sent.transaction);
    assert_eq!(checked.msg_id, "U-C");
    assert_eq!(checked.transaction_id.as_deref(), Some("U-C"));
    assert_eq!(checked.check_times, 1);
    let view = checked.view().unwrap();
    assert_eq!(view.property(property::REAL_TOPIC), Some("t"));
    assert_eq!(view.body(), b"c");
    assert!(visible(&env).await.is_empty());

    // The producer answers later, through the API.
    b.end_transaction(&checked.handle, Resolution::Commit)
        .await
        .unwrap();
    assert_eq!(visible(&env).await, ["c"]);
    env.clock.advance(Duration::from_secs(60));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 0, 0));

    // A dropped registration no longer gets checks.
    drop(registration);
    b.send_half("pg", half("d", "U-D"), QueueChoice::Queue(0))
        .await
        .unwrap();
    env.dispatched();
    env.clock.advance(Duration::from_secs(60));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 1, 0));
    assert!(rx.try_recv().is_err());
    env.close();
}

#[tokio::test]
async fn an_unanswered_half_is_rolled_back_after_the_last_check() {
    let opts = BrokerSettings {
        transaction_max_checks: 3,
        ..options()
    };
    let (_dir, env) = setup(opts).await;
    let b = &env.broker;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _registration = b
        .register_transaction_checker("pg", Arc::new(Chan(tx)))
        .await
        .unwrap();
    let h = b
        .send_half("pg", half("n", "U-N"), QueueChoice::Queue(0))
        .await
        .unwrap()
        .transaction;
    // Another producer group's half, with nobody to ask: counted, then rolled back.
    let other = b
        .send_half("other", half("o", "U-O"), QueueChoice::Queue(0))
        .await
        .unwrap()
        .transaction;
    env.dispatched();
    for n in 1..=3 {
        env.clock.advance(Duration::from_secs(60));
        assert_eq!(b.check_transactions().await.unwrap(), round(1, 1, 0));
        assert_eq!(rx.try_recv().unwrap().check_times, n);
    }
    env.clock.advance(Duration::from_secs(60));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 0, 2));
    assert!(rx.try_recv().is_err());
    for handle in [h, other] {
        assert!(matches!(
            b.end_transaction(&handle, Resolution::Commit).await,
            Err(Error::TransactionEnded { .. })
        ));
    }
    env.clock.advance(Duration::from_secs(60));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 0, 0));
    assert!(visible(&env).await.is_empty());
    env.close();
}

/// Two halves: `keep` stays undecided (checked once), `drop` is rolled back,
/// then the broker goes away (cleanly or not) and comes back on the same dir.
async fn restart_keeps_undecided_halves(crash: bool) {
    let opts = BrokerSettings {
        transaction_max_checks: 2,
        ..options()
    };
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), opts.clone());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let keep = b
        .send_half("pg", half("keep", "U-K"), QueueChoice::Queue(0))
        .await
        .unwrap()
        .transaction;
    let dropped = b
        .send_half("pg", half("drop", "U-D"), QueueChoice::Queue(0))
        .await
        .unwrap()
        .transaction;
    env.dispatched();
    env.clock.advance(Duration::from_secs(60));
    assert_eq!(b.check_transactions().await.unwrap(), round(0, 2, 0));
    b.end_transaction(&dropped, Resolution::Rollback)
        .await
        .unwrap();
    if crash {
        env.broker.halt_for_tests();
        env.store.halt_for_tests();
        drop(env);
    } else {
        env.close();
    }

    let env = open(dir.path(), opts);
    let b = &env.broker;
    env.dispatched();
    assert!(visible(&env).await.is_empty());
    // The rolled-back one stays ended (its op record is in the log).
    assert!(matches!(
        b.end_transaction(&dropped, Resolution::Commit).await,
        Err(Error::TransactionEnded { .. })
    ));
    // The undecided one is still checked, and can still be committed.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _registration = b
        .register_transaction_checker("pg", Arc::new(Chan(tx)))
        .await
        .unwrap();
    env.clock.advance(Duration::from_secs(60));
    assert_eq!(b.check_transactions().await.unwrap(), round(1, 0, 0));
    let checked = rx.try_recv().unwrap();
    assert_eq!(checked.handle, keep);
    if !crash {
        // Check counts are written at a clean close (a crash may lose them).
        assert_eq!(checked.check_times, 2);
    }
    b.end_transaction(&keep, Resolution::Commit)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(visible(&env).await, ["keep"]);
    env.close();
}

#[tokio::test]
async fn an_undecided_half_survives_a_restart() {
    restart_keeps_undecided_halves(false).await;
}

#[tokio::test]
async fn an_undecided_half_survives_a_crash() {
    restart_keeps_undecided_halves(true).await;
}

#[tokio::test]
async fn a_commit_after_a_restart_is_remembered_across_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let h = env
        .broker
        .send_half("pg", half("a", "U-A"), QueueChoice::Queue(0))
        .await
        .unwrap()
        .transaction;
    env.close();
    let env = open(dir.path(), options());
    env.broker
        .end_transaction(&h, Resolution::Commit)
        .await
        .unwrap();
    env.close();
    let env = open(dir.path(), options());
    assert!(matches!(
        env.broker.end_transaction(&h, Resolution::Commit).await,
        Err(Error::TransactionEnded { .. })
    ));
    env.clock.advance(Duration::from_secs(600));
    assert_eq!(
        env.broker.check_transactions().await.unwrap(),
        round(0, 0, 0)
    );
    assert_eq!(visible(&env).await, ["a"]);
    env.close();
}

#[tokio::test(start_paused = true)]
async fn the_check_loop_runs_rounds_on_its_interval() {
    let (_dir, env) = setup(options()).await;
    let b = &env.broker;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _registration = b
        .register_transaction_checker("pg", Arc::new(Chan(tx)))
        .await
        .unwrap();
    let h = b
        .send_half("pg", half("l", "U-L"), QueueChoice::Queue(0))
        .await
        .unwrap()
        .transaction;
    env.dispatched();
    env.clock.advance(Duration::from_secs(7));
    let task = b.spawn_transaction_checks();
    // Tokio's paused clock jumps to the loop's next tick (60 s) while idle.
    let checked = rx.recv().await.unwrap();
    assert_eq!((checked.handle, checked.check_times), (h.clone(), 1));
    let checked = rx.recv().await.unwrap();
    assert_eq!(checked.check_times, 2);
    b.end_transaction(&h, Resolution::Commit).await.unwrap();
    assert_eq!(visible(&env).await, ["l"]);
    env.close();
    // The loop ends by itself once the broker is closed.
    tokio::time::timeout(Duration::from_secs(600), task)
        .await
        .unwrap()
        .unwrap();
}
