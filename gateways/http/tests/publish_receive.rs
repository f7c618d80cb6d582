//! Publishing and receiving over real HTTP: bodies byte for byte, tags, keys,
//! properties, batches, sharding, delay, and the long poll.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_bodies_round_trip_byte_for_byte() {
    let node = start().await;
    let a = node.addr;
    let binary: Vec<u8> = vec![0, 0xff, 0xfe, 0, 1, 2, 0x80, b'\n', 0];
    let cases: Vec<Vec<u8>> = vec![
        Vec::new(),
        binary.clone(),
        "héllo wörld".as_bytes().to_vec(),
    ];
    for body in &cases {
        let p = publish(a, "bin", "?queue=0", body.clone()).await;
        assert_eq!(p["topic"], "bin");
        assert_eq!(p["queue_id"], 0);
        assert!(p["msg_id"].as_str().unwrap().len() >= 32);
    }
    let got = receive_n(a, "g", "bin", cases.len()).await;
    let bodies: Vec<Vec<u8>> = got.iter().map(body_of).collect();
    assert_eq!(bodies, cases);
    // Valid UTF-8 comes as text, anything else as base64.
    assert_eq!(got[0]["body_encoding"], "utf8");
    assert_eq!(got[1]["body_encoding"], "base64");
    assert_eq!(got[2]["body"], "héllo wörld");
    // encoding=base64 forces base64 for everything.
    let r = get(
        a,
        "/v1/topics/bin/queues/0/messages?offset=2&encoding=base64",
    )
    .await;
    let m = &r.json()["messages"][0];
    assert_eq!(m["body_encoding"], "base64");
    assert_eq!(body_of(m), cases[2]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_keys_and_properties_travel_with_the_message() {
    let node = start().await;
    let a = node.addr;
    let r = call(
        a,
        "POST",
        "/v1/topics/orders/messages?tag=created&keys=order-1,cust-9",
        &[
            ("x-rg-prop-region", "eu"),
            ("x-rg-prop-Price", "12"),
            ("content-type", "text/plain"),
        ],
        "payload",
    )
    .await;
    assert_eq!(r.status, 201);
    let published = r.json();
    let got = receive_n(a, "g", "orders", 1).await;
    let m = &got[0];
    assert_eq!(m["msg_id"], published["msg_id"]);
    assert_eq!(m["queue_offset"], published["queue_offset"]);
    assert_eq!(m["tag"], "created");
    assert_eq!(m["keys"], json!(["order-1", "cust-9"]));
    assert_eq!(m["properties"]["region"], "eu");
    assert_eq!(
        m["properties"]["price"], "12",
        "header names arrive lowercased"
    );
    assert_eq!(m["delivery_attempt"], 1);
    assert!(m["born_timestamp"].as_i64().unwrap() > 0);
    assert!(m["store_timestamp"].as_i64().unwrap() >= m["born_timestamp"].as_i64().unwrap());
    assert!(
        m["receipt_handle"]
            .as_str()
            .unwrap()
            .starts_with("v1:g:orders:")
    );
    // Tag and SQL filters select on them.
    publish(a, "orders", "?tag=paid", "p").await;
    let r = get(
        a,
        "/v1/groups/g2/topics/orders/messages?filter=paid&wait_ms=10000",
    )
    .await;
    let ms = r.json()["messages"].as_array().unwrap().clone();
    assert_eq!(ms.len(), 1);
    assert_eq!(ms[0]["tag"], "paid");
    let r = get(
        a,
        "/v1/groups/g3/topics/orders/messages?filter=region%20%3D%20%27eu%27&filter_type=sql&wait_ms=10000",
    )
    .await;
    let ms = r.json()["messages"].as_array().unwrap().clone();
    assert_eq!(ms.len(), 1);
    assert_eq!(ms[0]["properties"]["region"], "eu");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_contiguous_append() {
    let node = start().await;
    let a = node.addr;
    let batch = json!([
        { "body": "first", "tag": "t1", "keys": ["k1"] },
        { "body": "AAEC/w==", "body_encoding": "base64", "properties": { "n": "2" } },
        { "body": "third" }
    ]);
    let r = post_json(a, "/v1/topics/b/messages/batch?sharding_key=abc", batch).await;
    assert_eq!(r.status, 201, "{:?}", r.json());
    let sent = r.json()["messages"].as_array().unwrap().clone();
    assert_eq!(sent.len(), 3);
    let q = sent[0]["queue_id"].as_u64().unwrap();
    for (i, s) in sent.iter().enumerate() {
        assert_eq!(s["queue_id"].as_u64().unwrap(), q);
        assert_eq!(s["queue_offset"].as_u64().unwrap(), i as u64);
    }
    // Replay reads what the dispatcher indexed, which trails the append.
    assert!(node.store.wait_dispatched(Duration::from_secs(10)));
    let r = get(
        a,
        &format!("/v1/topics/b/queues/{q}/messages?offset=0&max=10"),
    )
    .await;
    let ms = r.json()["messages"].as_array().unwrap().clone();
    assert_eq!(ms.len(), 3);
    assert_eq!(body_of(&ms[0]), b"first");
    assert_eq!(ms[0]["keys"], json!(["k1"]));
    assert_eq!(body_of(&ms[1]), [0, 1, 2, 0xff]);
    assert_eq!(ms[1]["properties"]["n"], "2");
    // The same sharding key lands in the same queue again.
    let p = publish(a, "b", "?sharding_key=abc", "again").await;
    assert_eq!(p["queue_id"].as_u64().unwrap(), q);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_when_a_message_is_published() {
    let node = start().await;
    let a = node.addr;
    // The topic exists (a receive on an unknown topic is a 404).
    publish(a, "lp", "", "warm-up").await;
    let first = receive_n(a, "g", "lp", 1).await;
    ack(a, "g", &[first[0]["receipt_handle"].as_str().unwrap()]).await;
    // wait_ms is the server's maximum (30 s); the test gives the poll 20 s in
    // total, so only a wake-up on publish can satisfy it.
    let poll = tokio::spawn(async move { receive(a, "g", "lp", "?wait_ms=30000").await });
    // Publish once the poll is parked (any time works: the message is found either way).
    tokio::time::sleep(Duration::from_millis(200)).await;
    publish(a, "lp", "", "wake up").await;
    let got = tokio::time::timeout(Duration::from_secs(20), poll)
        .await
        .expect("the long poll returned on publish")
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(body_of(&got[0]), b"wake up");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_arrive_later() {
    let node = start().await;
    let a = node.addr;
    publish(a, "d", "?delay=5s", "later").await;
    publish(a, "d", "?delay_level=2", "level two").await;
    publish(a, "d", "?delay=5", "five seconds").await;
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 5000;
    publish(a, "d", &format!("?deliver_at={at}"), "at a time").await;
    // Not delivered right away (every delay is 5 s).
    assert!(receive(a, "g", "d", "").await.is_empty());
    let got = receive_n(a, "g", "d", 4).await;
    let mut bodies: Vec<Vec<u8>> = got.iter().map(body_of).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        [
            b"at a time".to_vec(),
            b"five seconds".to_vec(),
            b"later".to_vec(),
            b"level two".to_vec()
        ]
    );
    for m in &got {
        assert_eq!(m["topic"], "d");
        let delivered_at = m["store_timestamp"].as_i64().unwrap();
        assert!(delivered_at >= m["born_timestamp"].as_i64().unwrap());
    }
    node.stop().await;
}
