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

/// Pending delayed messages are listed soonest first by their real topic, and a
/// cancelled one (level or timer, by offset id or `UNIQ_KEY`) is never delivered,
/// also after a restart, while the others around it are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_delays_are_listed_and_a_cancel_holds_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let env = open(dir.path(), options());
        let b = &env.broker;
        b.create_topic(TopicConfig::new("t", 1)).await.unwrap();
        b.create_topic(TopicConfig::new("other", 1)).await.unwrap();
        let lvl1 = msg("lvl-a").with_property(property::DELAY_TIME_LEVEL, "2"); // 5 s
        let lvl2 = msg("lvl-b").with_property(property::DELAY_TIME_LEVEL, "2");
        let tmr = msg("tmr")
            .with_property(property::TIMER_DELAY_SEC, "3")
            .with_property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "UNIQ-TMR");
        let id_lvl1 = b
            .send(lvl1, QueueChoice::Queue(0))
            .await
            .unwrap()
            .append
            .msg_id;
        b.send(lvl2, QueueChoice::Queue(0)).await.unwrap();
        b.send(tmr, QueueChoice::Queue(0)).await.unwrap();
        let mut elsewhere = Message::new("other", 0, b"x".to_vec());
        elsewhere.insert_property(property::TIMER_DELAY_SEC, "1");
        b.send(elsewhere, QueueChoice::Queue(0)).await.unwrap();
        env.dispatched();

        let pending = b.delayed("t", 10).await.unwrap();
        let at: Vec<i64> = pending
            .iter()
            .map(|d| d.deliver_at_ms - 1_000_000)
            .collect();
        assert_eq!(at, [3_000, 5_000, 5_000]);
        assert_eq!(pending[0].uniq_key.as_deref(), Some("UNIQ-TMR"));
        assert!(pending.iter().all(|d| d.topic == "t" && d.body_size > 0));
        assert_eq!(b.delayed("t", 1).await.unwrap().len(), 1);
        assert!(matches!(
            b.delayed("missing", 10).await,
            Err(Error::TopicNotFound { .. })
        ));

        // The first of two equal-level entries (FIFO queue) and the timer one.
        assert_eq!(b.cancel_delayed(&id_lvl1).await.unwrap().topic, "t");
        assert_eq!(
            b.cancel_delayed("UNIQ-TMR").await.unwrap().deliver_at_ms,
            1_003_000
        );
        for again in [id_lvl1.as_str(), "UNIQ-TMR", "no-such-id"] {
            assert!(
                matches!(
                    b.cancel_delayed(again).await,
                    Err(Error::MessageNotFound { .. })
                ),
                "{again}"
            );
        }
        assert_eq!(b.delayed("t", 10).await.unwrap().len(), 1);
        env.close();
    }
    {
        // The clock starts at 1_000_000 again: nothing is due yet.
        let env = open(dir.path(), options());
        assert_eq!(env.broker.delayed("t", 10).await.unwrap().len(), 1);
        assert_eq!(advance(&env, Duration::from_secs(3)).await, 1); // "other"'s
        assert_eq!(visible(&env).await, Vec::<String>::new());
        assert_eq!(advance(&env, Duration::from_secs(2)).await, 1);
        assert_eq!(visible(&env).await, ["lvl-b"]);
        assert!(env.broker.delayed("t", 10).await.unwrap().is_empty());
        assert_eq!(advance(&env, Duration::from_secs(3600)).await, 0);
        assert_eq!(visible(&env).await, ["lvl-b"]);
        env.close();
    }
}

/// The doors' strict check: levels only from the table, no time in the past,
/// nothing beyond the maximum — never a clamp.
#[test]
fn delay_limits_refuse_instead_of_clamping() {
    use rocketgate_core::broker::{DelayRequest, DelaySettings};
    let limits = DelaySettings::default().limits();
    let now = 1_000_000;
    let p = |r| limits.property(r, now);
    assert_eq!(
        p(DelayRequest::Level(18)).unwrap(),
        Some((property::DELAY_TIME_LEVEL, "18".to_string()))
    );
    for level in [0, 19] {
        let e = p(DelayRequest::Level(level)).unwrap_err();
        assert!(e.to_string().contains("levels are 1..18"), "{e}");
    }
    assert_eq!(
        p(DelayRequest::After(Duration::from_secs(60))).unwrap(),
        Some((property::TIMER_DELAY_MS, "60000".to_string()))
    );
    assert_eq!(p(DelayRequest::After(Duration::ZERO)).unwrap(), None);
    let max = limits.max_delay;
    assert!(p(DelayRequest::After(max)).is_ok());
    assert!(matches!(
        p(DelayRequest::After(max + Duration::from_millis(1))),
        Err(Error::DelayTooLong { .. })
    ));
    assert!(p(DelayRequest::At(now)).is_ok());
    assert!(matches!(
        p(DelayRequest::At(now - 1)),
        Err(Error::InvalidArgument(m)) if m.contains("in the past")
    ));
    assert!(matches!(
        p(DelayRequest::At(now + max.as_millis() as i64 + 1)),
        Err(Error::DelayTooLong { .. })
    ));
}
