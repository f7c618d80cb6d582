//! Delayed delivery through the `MessagingApi`, driven by a manual clock: delay
//! levels, arbitrary delivery times in time order, the maximum delay, bad levels,
//! and a delayed message surviving a restart to be delivered exactly once.

mod broker_support;

use std::time::Duration;

use broker_support::{drain, open, options};
use rocketgate_core::Error;
use rocketgate_core::broker::{Broker, MessagingApi, QueueChoice, TopicConfig};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::property;

fn msg(body: &str) -> Message {
    Message::new("t", 0, body.as_bytes().to_vec())
}

async fn send(b: &Broker, m: Message) {
    b.send(m, QueueChoice::Queue(0)).await.unwrap();
}

/// Everything in queue 0 of "t" from the start.
async fn visible(env: &broker_support::Env) -> Vec<String> {
    env.dispatched();
    drain(&env.broker, "g", "", "t", 0, 0).await.0
}

/// Moves the clock, delivers what is due, waits for it to be readable.
async fn advance(env: &broker_support::Env, by: Duration) -> usize {
    env.clock.advance(by);
    env.dispatched();
    let n = env.broker.deliver_due().await.unwrap();
    env.dispatched();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_3_message_appears_after_10_seconds_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    send(
        b,
        msg("late").with_property(property::DELAY_TIME_LEVEL, "3"),
    )
    .await;
    send(b, msg("now")).await;

    assert_eq!(visible(&env).await, ["now"]);
    assert_eq!(advance(&env, Duration::from_millis(9_999)).await, 0);
    assert_eq!(visible(&env).await, ["now"]);
    assert_eq!(advance(&env, Duration::from_millis(1)).await, 1);
    assert_eq!(visible(&env).await, ["now", "late"]);

    // Delivered with its properties back and the delay ones gone, once.
    let r = b
        .pull(broker_support::pull_req("g", "", "t", 0, 1))
        .await
        .unwrap();
    let view = r.messages[0].view().unwrap();
    assert_eq!(view.topic(), "t");
    assert_eq!(view.property(property::REAL_TOPIC), None);
    assert_eq!(view.property(property::DELAY_TIME_LEVEL), None);
    assert_eq!(advance(&env, Duration::from_secs(60)).await, 0);
    assert_eq!(visible(&env).await, ["now", "late"]);
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_times_come_out_in_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let now = 1_000_000_i64; // the support clock's start
    send(b, msg("c").with_property(property::TIMER_DELAY_SEC, "30")).await;
    send(b, msg("a").with_property(property::TIMER_DELAY_MS, "5000")).await;
    send(
        b,
        msg("d").with_property(property::TIMER_DELIVER_MS, (now + 90_000).to_string()),
    )
    .await;
    send(
        b,
        msg("b").with_property(property::START_DELIVER_TIME, (now + 20_000).to_string()),
    )
    .await;
    // A level message interleaves with them by its deadline.
    send(b, msg("L").with_property(property::DELAY_TIME_LEVEL, "5")).await; // 1 min

    assert_eq!(advance(&env, Duration::from_secs(4)).await, 0);
    assert!(visible(&env).await.is_empty());
    assert_eq!(advance(&env, Duration::from_secs(1)).await, 1);
    assert_eq!(visible(&env).await, ["a"]);
    // One tick that finds several due delivers them in deadline order.
    assert_eq!(advance(&env, Duration::from_secs(120)).await, 4);
    assert_eq!(visible(&env).await, ["a", "b", "c", "L", "d"]);
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_survive_a_restart_and_are_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    {
        let env = open(dir.path(), options());
        let b = &env.broker;
        b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
        send(b, msg("lvl").with_property(property::DELAY_TIME_LEVEL, "2")).await; // 5 s
        send(b, msg("tmr").with_property(property::TIMER_DELAY_SEC, "8")).await;
        send(
            b,
            msg("early").with_property(property::TIMER_DELAY_SEC, "1"),
        )
        .await;
        assert_eq!(advance(&env, Duration::from_secs(1)).await, 1);
        assert_eq!(visible(&env).await, ["early"]);
        env.close();
    }
    {
        let env = open(dir.path(), options()); // its clock starts at 1_000_000 again
        assert_eq!(visible(&env).await, ["early"]);
        assert_eq!(advance(&env, Duration::from_secs(5)).await, 1);
        assert_eq!(visible(&env).await, ["early", "lvl"]);
        assert_eq!(advance(&env, Duration::from_secs(5)).await, 1);
        assert_eq!(visible(&env).await, ["early", "lvl", "tmr"]);
        env.close();
    }
    {
        // Nothing is delivered a second time after another restart.
        let env = open(dir.path(), options());
        assert_eq!(advance(&env, Duration::from_secs(3600)).await, 0);
        assert_eq!(visible(&env).await, ["early", "lvl", "tmr"]);
        env.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_beyond_the_maximum_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let four_days = (4 * 24 * 3600).to_string();
    let err = b
        .send(
            msg("x").with_property(property::TIMER_DELAY_SEC, four_days),
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DelayTooLong { .. }), "{err:?}");
    // Just under the 3-day default is accepted.
    let three_days = (3 * 24 * 3600).to_string();
    send(
        b,
        msg("ok").with_property(property::TIMER_DELAY_SEC, three_days),
    )
    .await;
    assert_eq!(advance(&env, Duration::from_secs(3 * 24 * 3600)).await, 1);
    assert_eq!(visible(&env).await, ["ok"]);
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn levels_above_the_table_are_clamped_and_garbage_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    // RocketMQ clamps a level above the table to the last one (18: 2 h).
    send(
        b,
        msg("top").with_property(property::DELAY_TIME_LEVEL, "99"),
    )
    .await;
    // Level 0 (or below) is not delayed.
    send(
        b,
        msg("zero").with_property(property::DELAY_TIME_LEVEL, "0"),
    )
    .await;
    let err = b
        .send(
            msg("bad").with_property(property::DELAY_TIME_LEVEL, "soon"),
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidMessage(_)), "{err:?}");
    assert_eq!(visible(&env).await, ["zero"]);
    assert_eq!(advance(&env, Duration::from_secs(7199)).await, 0);
    assert_eq!(advance(&env, Duration::from_secs(1)).await, 1);
    assert_eq!(visible(&env).await, ["zero", "top"]);
    env.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_loop_delivers_and_batches_cannot_be_delayed() {
    let dir = tempfile::tempdir().unwrap();
    let env = open(dir.path(), options());
    let b = &env.broker;
    b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let err = b
        .send_batch(
            vec![msg("x").with_property(property::DELAY_TIME_LEVEL, "1")],
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidMessage(_)), "{err:?}");

    let task = b.spawn_delay_delivery();
    send(b, msg("m").with_property(property::DELAY_TIME_LEVEL, "1")).await;
    env.clock.advance(Duration::from_secs(1));
    let mut got = Vec::new();
    for _ in 0..200 {
        got = visible(&env).await;
        if !got.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got, ["m"]);
    env.close();
    task.await.unwrap();
}
