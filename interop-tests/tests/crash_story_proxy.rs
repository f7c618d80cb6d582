//! The story of issue #9 through proxies (issue #29), on one cluster of two broker
//! groups and two `rocketgate proxy` nodes ([`interop_tests::cluster::Cluster`]):
//! publish 1,000 through proxy 1 → consume and ack 500 through **proxy 2** →
//! `kill -9` proxy 2 → the consumer comes back through **proxy 1** and consumes the
//! rest: nothing lost, and nothing acked comes again unless its ack was inside the
//! at-least-once window → reset the group to a timestamp through proxy 1 and read
//! exactly the messages stored after it again.
//!
//! What `kill -9` means here: a proxy keeps no store, so the crash that matters to a
//! consumer of a proxy door is the proxy it was using dying under it. The brokers keep
//! running, so the window is what the dead proxy had not yet handed to a broker:
//!
//! - HTTP receive and WebSocket clustering (POP): an ack is answered after the broker
//!   took it, so the window is empty — no acked message may come again;
//! - MQTT persistent session: the session's position is committed to the brokers
//!   (group `mqtt%c%<client id>`) after acks, so the window is the acked messages
//!   at or past the committed offsets the brokers report (through proxy 1) right
//!   after the kill; the first 450 are waited for until committed.
//!
//! And the other crash that matters: `kill -9` of one broker group's master
//! (`broker-b`) while the consumer reads through proxy 1, and its restart on the same
//! data directory and ports. Then the window is what broker-b had not yet written to its
//! state file (`config/pop.json`, `config/offsets.json`, in its own local queue ids:
//! the cluster's global queues 2 and 3 are broker-b's 0 and 1), exactly as on one node;
//! an acked message of broker-a (alive throughout) may never come again.
//!
//! The native door has no proxy (our client reads the NameServer routes and talks to
//! the brokers), so the story runs through the three doors of a proxy. The doors run
//! one after the other on one cluster per crash kind (the crashed node restarted
//! between them).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use interop_tests::cluster::Cluster;
use interop_tests::doors::{Door, curl};
use interop_tests::story::{
    self, FIRST_ACKS, Persisted, Pos, SPLIT, Seen, StoryConsumer, TOTAL, WINDOW_ACKS,
};
use interop_tests::{Node, wait_for};
use serde_json::Value;

/// The tests of this file run one at a time: four processes each.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What is killed with `kill -9`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    /// Proxy 2, the one the consumer reads through; it comes back through proxy 1.
    ConsumersProxy,
    /// broker-b, one group's master; restarted, the consumer stays on proxy 1.
    BrokerB,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn story_through_proxies_with_kill_9_of_the_consumers_proxy() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    run(Crash::ConsumersProxy).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn story_through_proxies_with_kill_9_of_a_broker_group_master() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    run(Crash::BrokerB).await
}

async fn run(crash: Crash) -> anyhow::Result<()> {
    let mut c = Cluster::start()?;
    for door in [Door::Http, Door::Ws, Door::Mqtt] {
        if let Err(e) = story(&mut c, door, crash).await {
            for n in [&c.p1, &c.b] {
                eprintln!("{}", n.log_tail());
            }
            return Err(e.context(format!(
                "the story through the {door} door of a proxy ({crash:?})"
            )));
        }
        if crash == Crash::ConsumersProxy {
            c.restart_proxy(false)?;
        }
    }
    Ok(())
}

/// broker-b's local queue id of a global one (broker-a hosts 0 and 1, broker-b 2 and 3).
fn on_b(p: Pos) -> Option<Pos> {
    p.queue.checked_sub(2).map(|queue| Pos {
        queue,
        offset: p.offset,
    })
}

/// A group's committed offsets as the brokers report them (through `node`), in the
/// cluster's global queue ids.
fn committed(node: &Node, group: &str, topic: &str) -> anyhow::Result<Vec<(u32, Option<u64>)>> {
    let (status, text) = curl(&[&format!(
        "http://{}/v1/groups/{group}/progress",
        node.addr("http")
    )])?;
    ensure!(status == 200, "group progress: HTTP {status}: {text}");
    let v: Value = serde_json::from_str(&text)?;
    Ok(v["queues"]
        .as_array()
        .context("no queues")?
        .iter()
        .filter(|q| q["topic"].as_str() == Some(topic))
        .filter_map(|q| {
            Some((
                u32::try_from(q["queue_id"].as_u64()?).ok()?,
                q["consumer_offset"].as_u64(),
            ))
        })
        .collect())
}

fn done(offsets: &[(u32, Option<u64>)], p: Pos) -> bool {
    offsets
        .iter()
        .any(|(q, c)| *q == p.queue && c.is_some_and(|c| p.offset < c))
}

async fn story(c: &mut Cluster, door: Door, crash: Crash) -> anyhow::Result<()> {
    let kind = match crash {
        Crash::ConsumersProxy => "p",
        Crash::BrokerB => "b",
    };
    let topic = format!("{kind}story_{}", door.short());
    let group = format!("{kind}story-{}", door.short());
    let ledger = StoryConsumer::ledger(door, &group);
    c.topic(&topic, 2).await?;
    let first_proxy = match crash {
        Crash::ConsumersProxy => &c.p2,
        Crash::BrokerB => &c.p1,
    };
    let mut consumer = StoryConsumer::open(door, first_proxy, &topic, &group).await?;
    let published = story::publish(&c.p1, &topic).await?;
    let queues: BTreeSet<u32> = published.pos.values().map(|p| p.queue).collect();
    ensure!(
        queues.iter().any(|q| *q < 2) && queues.iter().any(|q| *q >= 2),
        "the 1,000 messages went to queues {queues:?}, not to both groups"
    );
    let pos = |s: &Seen| -> anyhow::Result<Pos> {
        let p = *published.pos.get(&s.n).context("an unknown message")?;
        if let Some(said) = s.pos {
            ensure!(
                said == p,
                "message {} delivered as {said:?}, stored at {p:?}",
                s.n
            );
        }
        Ok(p)
    };
    // The MQTT session's group as the brokers name it (URL-encoded).
    let mqtt_group = format!("mqtt%25c%25{group}");

    // Ack 450 (proxy kill, MQTT: until the brokers have the position; broker kill:
    // until broker-b wrote its share down), 50 more, kill -9.
    let first = consumer.take_exact(FIRST_ACKS).await?;
    if crash == Crash::BrokerB {
        wait_for(
            "the first acks in broker-b's state file",
            Duration::from_secs(20),
            || {
                let file = Persisted::read(c.b.data_dir(), &ledger, &topic).ok()?;
                first
                    .iter()
                    .all(|s| pos(s).is_ok_and(|p| on_b(p).is_none_or(|p| file.done(p))))
                    .then_some(())
            },
        )
        .with_context(|| format!("state files: {}", Persisted::dump(c.b.data_dir())))?;
    } else if door == Door::Mqtt {
        wait_for(
            "the session's position committed to the brokers",
            Duration::from_secs(20),
            || {
                let offsets = committed(&c.p1, &mqtt_group, &topic).ok()?;
                first
                    .iter()
                    .all(|s| pos(s).is_ok_and(|p| done(&offsets, p)))
                    .then_some(())
            },
        )?;
    }
    let last = consumer.take_exact(WINDOW_ACKS).await?;
    let at_crash = match crash {
        Crash::ConsumersProxy => {
            c.p2.kill9()?;
            None
        }
        Crash::BrokerB => {
            c.b.kill9()?;
            Some(Persisted::read(c.b.data_dir(), &ledger, &topic)?)
        }
    };
    consumer.close().await;

    let acked: BTreeSet<u32> = first.iter().chain(&last).map(|s| s.n).collect();
    ensure!(
        acked.len() == FIRST_ACKS + WINDOW_ACKS,
        "the first 500 deliveries repeated messages"
    );
    let mut window = BTreeSet::new();
    if let Some(file) = &at_crash {
        for s in first.iter().chain(&last) {
            if on_b(pos(s)?).is_some_and(|p| !file.done(p)) {
                window.insert(s.n);
            }
        }
        ensure!(
            first.iter().all(|s| !window.contains(&s.n)),
            "broker-b's state file went backwards"
        );
        c.b.restart()?;
        c.b.set_addr("namesrv", c.a.addr("namesrv"));
    } else if door == Door::Mqtt {
        let at_crash = committed(&c.p1, &mqtt_group, &topic)?;
        for s in first.iter().chain(&last) {
            if !done(&at_crash, pos(s)?) {
                window.insert(s.n);
            }
        }
        ensure!(
            first.iter().all(|s| !window.contains(&s.n)),
            "the committed position went backwards"
        );
    }

    // The consumer comes back through proxy 1 (broker kill: it stays there).
    let mut consumer = StoryConsumer::open(door, &c.p1, &topic, &group).await?;
    let after = consumer
        .take_until(|seen| {
            let mut all = acked.clone();
            all.extend(seen.iter().map(|s| s.n));
            Ok(all.len() == TOTAL as usize)
        })
        .await
        .context("consuming the rest after the crash")?;
    let mut again = BTreeSet::new();
    for s in &after {
        pos(s)?;
        if acked.contains(&s.n) {
            ensure!(
                window.contains(&s.n),
                "message {} was acked before the crash, outside the at-least-once window, and came again",
                s.n
            );
            again.insert(s.n);
        }
    }
    eprintln!(
        "proxy story {door} ({crash:?}): acked {} before the kill -9 ({} in the \
         at-least-once window); after it, through proxy 1, {} deliveries, {} of them \
         repeats (all in the window); all {TOTAL} seen",
        acked.len(),
        window.len(),
        after.len(),
        again.len(),
    );

    // Back to the reset timestamp through proxy 1: exactly the messages stored after it.
    consumer
        .reset_to(&c.p1, &topic, &group, published.reset_ms)
        .await?;
    let replay = consumer
        .take_until(|seen| {
            let mut got = BTreeSet::new();
            for s in seen {
                ensure!(
                    s.n > SPLIT,
                    "after the reset to the time of message {}, message {} came",
                    SPLIT + 1,
                    s.n
                );
                got.insert(s.n);
            }
            Ok(got.len() == (TOTAL - SPLIT) as usize)
        })
        .await
        .context("re-reading after the offset reset")?;
    eprintln!(
        "proxy story {door} ({crash:?}): reset to {} ms: {} deliveries, messages {}..={TOTAL} all again",
        published.reset_ms,
        replay.len(),
        SPLIT + 1
    );
    consumer.close().await;
    Ok(())
}
