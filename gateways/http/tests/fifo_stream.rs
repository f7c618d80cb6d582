//! Ordered (FIFO) groups through the Server-Sent Events stream: two streams of one
//! FIFO group, each nacking or letting time out some messages, see every sharding
//! key's messages acknowledged in publish order, and a message given up on comes
//! back before anything after it in its queue.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::{events, get, post_json, publish, receive, start};

const KEYS: usize = 4;
const PER_KEY: usize = 12;
const INVISIBLE_MS: u64 = 1000;

/// What the two readers saw, under one lock so its order is the order things
/// happened in.
#[derive(Default)]
struct Seen {
    /// Successful acks in order: (reader, key, n).
    acked: Vec<(usize, usize, usize)>,
    /// Per queue: the offset given up on (nacked or let time out) whose
    /// redelivery must be the next message of the queue anyone works on.
    due: HashMap<u64, u64>,
    /// How often that held (and how often a message came again at all).
    redelivered_first: usize,
    nacks: usize,
    drops: usize,
    /// Acks of a nacked batch's later handles, refused as stale.
    refused_after_nack: usize,
}

fn key_and_n(m: &Value) -> (usize, usize) {
    let body = String::from_utf8(support::body_of(m)).unwrap();
    let (k, n) = body.split_once(':').unwrap();
    (k.parse().unwrap(), n.parse().unwrap())
}

/// One SSE reader of the FIFO group. Every 7th message (by its own count) it
/// nacks, every 11th it lets time out; either way it gives up on the rest of
/// that queue's batch (the messages of the queue with the same lease, which the
/// stream sent right after), as a FIFO consumer must: after a nack it tries to
/// ack the next one of them once, which must be refused. Ends when every
/// message is acked.
async fn reader(addr: std::net::SocketAddr, me: usize, seen: Arc<Mutex<Seen>>) {
    let path = format!(
        "/v1/groups/ledger/topics/orders/stream?order=fifo&max=3&invisible_ms={INVISIBLE_MS}"
    );
    let mut stream = events(addr, &path).await;
    let mut count = 0usize;
    // Per queue: the lease (`invisible_until`) and offset of a batch given up on,
    // and whether it was nacked (its later handles are stale at once).
    let mut given_up: HashMap<u64, (i64, u64, bool)> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if seen.lock().unwrap().acked.len() >= KEYS * PER_KEY {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reader {me} ran out of time"
        );
        let Some((name, m)) = stream.next_within(Duration::from_millis(300)).await else {
            continue;
        };
        assert_eq!(name, "message", "{m}");
        let queue = m["queue_id"].as_u64().unwrap();
        let offset = m["queue_offset"].as_u64().unwrap();
        let lease = m["invisible_until"].as_i64().unwrap();
        let attempt = m["delivery_attempt"].as_u64().unwrap();
        let handle = m["receipt_handle"].as_str().unwrap().to_owned();
        if let Some(&(l, o, nacked)) = given_up.get(&queue)
            && l == lease
            && offset > o
        {
            // The rest of a batch given up on: not worked on.
            if nacked {
                given_up.insert(queue, (l, o, false));
                let r = post_json(
                    addr,
                    "/v1/groups/ledger/acks",
                    json!({ "receipt_handles": [handle] }),
                )
                .await;
                assert_eq!(
                    r.status,
                    410,
                    "acked after its nacked predecessor: {}",
                    r.json()
                );
                seen.lock().unwrap().refused_after_nack += 1;
            }
            continue;
        }
        given_up.remove(&queue);
        {
            let mut s = seen.lock().unwrap();
            if let Some(due) = s.due.remove(&queue) {
                assert_eq!(
                    offset, due,
                    "queue {queue}: {offset} worked on before {due}, which was given up on"
                );
                assert!(attempt > 1, "a redelivery has its attempt raised: {m}");
                s.redelivered_first += 1;
            }
        }
        count += 1;
        if count.is_multiple_of(11) || count.is_multiple_of(7) {
            let nack = count.is_multiple_of(7);
            {
                let mut s = seen.lock().unwrap();
                s.due.insert(queue, offset);
                if nack {
                    s.nacks += 1;
                } else {
                    s.drops += 1;
                }
            }
            given_up.insert(queue, (lease, offset, nack));
            if nack {
                let r = post_json(
                    addr,
                    "/v1/groups/ledger/nacks",
                    json!({ "receipt_handles": [handle] }),
                )
                .await;
                assert_eq!(r.status, 200, "{}", r.json());
            }
            continue;
        }
        let (k, n) = key_and_n(&m);
        let entry = (me, k, n);
        seen.lock().unwrap().acked.push(entry);
        let r = post_json(
            addr,
            "/v1/groups/ledger/acks",
            json!({ "receipt_handles": [handle] }),
        )
        .await;
        if r.status != 200 {
            // Its lease ran out first (a slow machine): it comes again, before
            // the rest of its queue, like a message let time out.
            assert_eq!(r.status, 410, "{}", r.json());
            // (Not checked as `due`: it may have come again already.)
            let mut s = seen.lock().unwrap();
            let at = s.acked.iter().rposition(|e| *e == entry).unwrap();
            s.acked.remove(at);
            given_up.insert(queue, (lease, offset, false));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_of_a_fifo_group_ack_every_key_in_order() {
    let node = start().await;
    let a = node.addr;
    let r = post_json(a, "/v1/topics", json!({ "name": "orders", "queues": 4 })).await;
    assert_eq!(r.status, 201);
    assert!(
        receive(a, "ledger", "orders", "?order=fifo")
            .await
            .is_empty()
    );
    assert_eq!(get(a, "/v1/groups/ledger").await.json()["fifo"], true);
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
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (r1, r2) = tokio::join!(
        tokio::spawn(reader(a, 0, seen.clone())),
        tokio::spawn(reader(a, 1, seen.clone())),
    );
    r1.unwrap();
    r2.unwrap();

    {
        let s = seen.lock().unwrap();
        let mut by_key: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (_, k, n) in &s.acked {
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
            s.nacks > 0 && s.drops > 0,
            "nacks and timeouts were injected"
        );
        assert_eq!(
            s.redelivered_first,
            s.nacks + s.drops,
            "every message given up on came back, before the rest of its queue"
        );
        assert!(s.due.is_empty());
        assert!(
            s.acked.iter().any(|e| e.0 == 0) && s.acked.iter().any(|e| e.0 == 1),
            "both streams took part"
        );
    }
    node.stop().await;
}
