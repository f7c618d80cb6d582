//! Ordered (FIFO) groups over `/v1/ws`: two subscribers of one FIFO group
//! (`"order": "fifo"`), each nacking some messages and timing out on others,
//! see every sharding key's messages acknowledged in publish order.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::{Client, Env};

const KEYS: usize = 4;
const PER_KEY: usize = 12;

/// Acks in the order they were sent: (subscriber, ack request id, key, n). An
/// ack the server refused (its lease was gone) is taken out again.
type Log = Arc<Mutex<Vec<(usize, String, usize, usize)>>>;

fn done(log: &Log) -> bool {
    log.lock().unwrap().len() >= KEYS * PER_KEY
}

/// A refused ack (an error frame answering it): that message was not acked here.
fn refused(log: &Log, me: usize, f: &serde_json::Value) {
    assert_eq!(f["code"], "stale_receipt", "{f}");
    let req = f["req"].as_str().unwrap_or_default();
    let mut l = log.lock().unwrap();
    if let Some(at) = l.iter().position(|e| e.0 == me && e.1 == req) {
        l.remove(at);
    }
}

/// One subscriber: works through what it is pushed, in order, one at a time.
/// Every 7th message it nacks; on every 11th it takes longer than the message's
/// invisibility (a timeout) before acking. What it then tries to ack of the same
/// queue the broker refuses (those went back with the nacked or timed-out one,
/// and come again after it), and the refused acks are taken out of the log.
async fn subscriber(mut c: Client, me: usize, log: Log, redelivered: Arc<Mutex<u32>>) {
    let mut count = 0usize;
    let mut acks = 0u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "subscriber {me} ran out of time"
        );
        if done(&log) {
            // Every ack sent is answered (a refusal is an error frame) before a
            // ping's pong: done only if none of them was refused.
            let others = c.barrier().await;
            for f in others.iter().filter(|f| f["type"] == "error") {
                refused(&log, me, f);
            }
            if others.is_empty() && done(&log) {
                return;
            }
            continue; // the messages that came first are handled by `recv`
        }
        let Ok(f) = tokio::time::timeout(Duration::from_millis(300), c.recv()).await else {
            continue;
        };
        if f["type"] == "error" {
            refused(&log, me, &f);
            continue;
        }
        assert_eq!(f["type"], "message", "{f}");
        c.send(json!({"op": "credit", "id": "s", "n": 1})).await;
        if f["attempt"].as_u64().unwrap() > 1 {
            *redelivered.lock().unwrap() += 1;
        }
        count += 1;
        if count.is_multiple_of(7) {
            c.send(json!({"op": "nack", "receipt": f["receipt"]})).await;
            continue;
        }
        if count.is_multiple_of(11) {
            tokio::time::sleep(Duration::from_millis(1300)).await; // past its invisibility
        }
        let body = f["body"].as_str().unwrap();
        let (k, n) = body.split_once(':').unwrap();
        acks += 1;
        let req = format!("ack{acks}");
        log.lock()
            .unwrap()
            .push((me, req.clone(), k.parse().unwrap(), n.parse().unwrap()));
        c.send(json!({"op": "ack", "receipt": f["receipt"], "req": req}))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_subscribers_of_a_fifo_group_ack_every_key_in_order() {
    let env = Env::start().await;
    env.topic("orders", 4).await;
    let mut subs = Vec::new();
    for _ in 0..2 {
        let mut c = env.client().await;
        c.subscribe(json!({
            "id": "s", "topic": "orders", "group": "web", "order": "fifo",
            "credit": 3, "invisible_ms": 1000, "start": "earliest"
        }))
        .await;
        subs.push(c);
    }
    let mut p = env.client().await;
    for n in 0..PER_KEY {
        for k in 0..KEYS {
            let (answer, _) = p
                .call(
                    json!({"op": "publish", "topic": "orders", "body": format!("{k}:{n}"),
                    "sharding_key": format!("key{k}")}),
                )
                .await;
            assert_eq!(answer["type"], "send_result", "{answer}");
        }
    }
    let log: Log = Arc::default();
    let redelivered = Arc::new(Mutex::new(0));
    let tasks: Vec<_> = subs
        .into_iter()
        .enumerate()
        .map(|(i, c)| tokio::spawn(subscriber(c, i, log.clone(), redelivered.clone())))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    let mut by_key: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (_, _, k, n) in &log {
        by_key.entry(*k).or_default().push(*n);
    }
    for k in 0..KEYS {
        assert_eq!(
            by_key.get(&k).cloned().unwrap_or_default(),
            (0..PER_KEY).collect::<Vec<_>>(),
            "key {k} acked out of order or not exactly once: {:?}",
            log.iter().filter(|e| e.2 == k).collect::<Vec<_>>()
        );
    }
    assert!(
        *redelivered.lock().unwrap() > 0,
        "nacks and timeouts redelivered"
    );
    assert!(log.iter().any(|e| e.0 == 0) && log.iter().any(|e| e.0 == 1));
    let info = rocketgate_core::broker::MessagingApi::group_info(&*env.broker, "web")
        .await
        .unwrap();
    assert!(info.fifo);
}

#[tokio::test]
async fn order_fifo_is_refused_for_broadcasting_and_unknown_words() {
    let env = Env::start().await;
    env.topic("orders", 1).await;
    let mut c = env.client().await;
    for (order, mode) in [("fifo", "broadcasting"), ("sometimes", "clustering")] {
        let (answer, _) = c
            .call(
                json!({"op": "subscribe", "id": "s", "topic": "orders", "group": "g",
                "mode": mode, "order": order}),
            )
            .await;
        assert_eq!(answer["type"], "error", "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains("order"),
            "{answer}"
        );
    }
}

/// `nack` up to an offset of a FIFO subscription's batch: the messages go back
/// (latest first, so no nack of it is refused) and come again in queue order,
/// attempts raised, with the batch's later message that was not named after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_up_to_an_offset_gives_a_fifo_batch_back_in_order() {
    let env = Env::start().await;
    env.topic("steps", 1).await;
    // Published first: a FIFO queue hands out nothing after a message in flight,
    // so the batch is what is there at the first fetch.
    let mut p = env.client().await;
    for n in 0..5 {
        p.publish("steps", &format!("step {n}")).await;
    }
    let mut c = env.client().await;
    c.subscribe(json!({
        "id": "s", "topic": "steps", "group": "stepper", "order": "fifo",
        "credit": 5, "invisible_ms": 30000, "start": "earliest"
    }))
    .await;
    let first = c.messages(5).await;
    assert_eq!(
        support::bodies(&first),
        ["step 0", "step 1", "step 2", "step 3", "step 4"]
    );
    c.send(json!({"op": "ack", "receipt": first[0]["receipt"]}))
        .await;
    c.send(json!({"op": "nack", "id": "s", "queue_id": 0, "offset": first[3]["queue_offset"]}))
        .await;
    c.send(json!({"op": "credit", "id": "s", "n": 5})).await;
    let again = c.messages(4).await;
    assert_eq!(
        support::bodies(&again),
        ["step 1", "step 2", "step 3", "step 4"]
    );
    for f in &again {
        assert_eq!(f["attempt"], 2, "{f}");
    }
    // Nothing else (no error frame for a refused nack, no other message).
    assert!(c.barrier().await.is_empty());
}
