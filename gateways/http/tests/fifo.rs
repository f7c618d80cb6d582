//! Ordered (FIFO) groups over HTTP: two receivers of one FIFO group, each
//! nacking or timing out some messages, see every sharding key's messages
//! acknowledged in publish order; the group setting is visible and changeable.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::{get, patch_json, post_json, publish, receive, start};

const KEYS: usize = 4;
const PER_KEY: usize = 15;

/// Successful acks in the order they were made: (receiver, key, n); an entry whose
/// ack failed (its lease was gone) is taken out again.
type Log = Arc<Mutex<Vec<(usize, usize, usize)>>>;

fn key_and_n(m: &Value) -> (usize, usize) {
    let body = String::from_utf8(support::body_of(m)).unwrap();
    let (k, n) = body.split_once(':').unwrap();
    (k.parse().unwrap(), n.parse().unwrap())
}

/// One receiver: receives batches of the FIFO group and works through each in
/// order; every 7th message (by its own count) it nacks, every 11th it drops
/// (a timeout), and either way it stops working on the rest of that batch, as a
/// FIFO consumer must. Ends when every key is done.
async fn receiver(addr: std::net::SocketAddr, me: usize, log: Log, redelivered: Arc<Mutex<u32>>) {
    let mut count = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if log.lock().unwrap().len() >= KEYS * PER_KEY {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "receiver {me} ran out of time"
        );
        let batch = receive(
            addr,
            "billing",
            "orders",
            "?order=fifo&max=3&wait_ms=200&invisible_ms=600",
        )
        .await;
        for m in batch {
            count += 1;
            if m["delivery_attempt"].as_u64().unwrap() > 1 {
                *redelivered.lock().unwrap() += 1;
            }
            let handle = m["receipt_handle"].as_str().unwrap().to_owned();
            if count.is_multiple_of(11) {
                break; // dropped: it comes back when its invisibility runs out
            }
            if count.is_multiple_of(7) {
                let r = post_json(
                    addr,
                    "/v1/groups/billing/nacks",
                    json!({ "receipt_handles": [handle] }),
                )
                .await;
                assert_eq!(r.status, 200, "{}", r.json());
                break;
            }
            let (k, n) = key_and_n(&m);
            let entry = (me, k, n);
            log.lock().unwrap().push(entry);
            let r = post_json(
                addr,
                "/v1/groups/billing/acks",
                json!({ "receipt_handles": [handle] }),
            )
            .await;
            if r.status != 200 {
                // Its lease ran out and it went to someone else: not acked here.
                let mut l = log.lock().unwrap();
                let at = l.iter().rposition(|e| *e == entry).unwrap();
                l.remove(at);
                break;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_of_a_fifo_group_ack_every_key_in_order() {
    let node = start().await;
    let a = node.addr;
    let r = post_json(a, "/v1/topics", json!({ "name": "orders", "queues": 4 })).await;
    assert_eq!(r.status, 201);
    // The group is made FIFO by its first receive (`order=fifo`); nothing is
    // published before, so that receive is an empty one.
    assert!(
        receive(a, "billing", "orders", "?order=fifo")
            .await
            .is_empty()
    );
    assert_eq!(
        get(a, "/v1/groups/billing").await.json()["fifo"],
        true,
        "made FIFO"
    );
    for n in 0..PER_KEY {
        for k in 0..KEYS {
            publish(
                a,
                "orders",
                &format!("?sharding_key=key{k}"),
                format!("{k}:{n}"),
            )
            .await;
        }
    }
    let log: Log = Arc::default();
    let redelivered = Arc::new(Mutex::new(0));
    let (r1, r2) = tokio::join!(
        tokio::spawn(receiver(a, 0, log.clone(), redelivered.clone())),
        tokio::spawn(receiver(a, 1, log.clone(), redelivered.clone())),
    );
    r1.unwrap();
    r2.unwrap();

    let log = log.lock().unwrap().clone();
    let mut by_key: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (_, k, n) in &log {
        by_key.entry(*k).or_default().push(*n);
    }
    for k in 0..KEYS {
        assert_eq!(
            by_key.get(&k).cloned().unwrap_or_default(),
            (0..PER_KEY).collect::<Vec<_>>(),
            "key {k} acked out of order or not exactly once"
        );
    }
    assert!(
        *redelivered.lock().unwrap() > 0,
        "nacks and timeouts redelivered"
    );
    assert!(
        log.iter().any(|e| e.0 == 0) && log.iter().any(|e| e.0 == 1),
        "both receivers took part"
    );

    // The setting is the group's: PATCH turns it off (and leaves max_reconsume_times).
    let before = get(a, "/v1/groups/billing").await.json()["max_reconsume_times"].clone();
    let r = patch_json(a, "/v1/groups/billing", json!({ "fifo": false })).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["fifo"], false);
    assert_eq!(r.json()["max_reconsume_times"], before);
    let r = get(
        a,
        "/v1/groups/billing/topics/orders/messages?order=sometimes",
    )
    .await;
    r.expect_error(400, "bad_request");
    node.stop().await;
}

/// A nack of several handles of one queue in one request (a FIFO receiver giving
/// back the rest of its batch) is accepted whole, whatever the handles' order in
/// it: the messages come back in queue order, attempts raised, and the batch's
/// later message the request did not name comes back after them (its old handle
/// is stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_nack_of_a_fifo_queue_is_accepted_and_redelivers_in_order() {
    let node = start().await;
    let a = node.addr;
    let r = post_json(a, "/v1/topics", json!({ "name": "steps", "queues": 1 })).await;
    assert_eq!(r.status, 201);
    assert!(
        receive(a, "steppers", "steps", "?order=fifo")
            .await
            .is_empty()
    );
    for n in 0..5 {
        publish(a, "steps", "", format!("step {n}")).await;
    }
    let batch = receive(a, "steppers", "steps", "?max=5&wait_ms=2000").await;
    assert_eq!(batch.len(), 5);
    let handle = |i: usize| batch[i]["receipt_handle"].as_str().unwrap().to_owned();
    let r = post_json(
        a,
        "/v1/groups/steppers/acks",
        json!({ "receipt_handles": [handle(0)] }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    // 1..=3 given back, named out of order; 4 is not named.
    let r = post_json(
        a,
        "/v1/groups/steppers/nacks",
        json!({ "receipt_handles": [handle(2), handle(1), handle(3)] }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json(), json!({ "nacked": 3 }));
    // The old handle of 4 went back with them.
    let r = post_json(
        a,
        "/v1/groups/steppers/acks",
        json!({ "receipt_handles": [handle(4)] }),
    )
    .await;
    assert_eq!(r.status, 410, "{}", r.json());
    let again = receive(a, "steppers", "steps", "?max=5&wait_ms=2000").await;
    let got: Vec<(String, u64)> = again
        .iter()
        .map(|m| {
            (
                String::from_utf8(support::body_of(m)).unwrap(),
                m["delivery_attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("step 1".to_owned(), 2),
            ("step 2".to_owned(), 2),
            ("step 3".to_owned(), 2),
            ("step 4".to_owned(), 2),
        ]
    );
    // A handle that is stale for its own reason still fails, alone: the others of
    // the request are nacked, and the answer says which one failed.
    let h = |i: usize| again[i]["receipt_handle"].as_str().unwrap().to_owned();
    let r = post_json(
        a,
        "/v1/groups/steppers/acks",
        json!({ "receipt_handles": [h(0)] }),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = post_json(
        a,
        "/v1/groups/steppers/nacks",
        json!({ "receipt_handles": [h(0), h(1), h(2)] }),
    )
    .await;
    assert_eq!(r.status, 410, "{}", r.json());
    let results = r.json()["results"].clone();
    let oks: Vec<bool> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["ok"].as_bool().unwrap())
        .collect();
    assert_eq!(oks, [false, true, true], "{results}");
    node.stop().await;
}
