//! Server-Sent Events and replay by queue offset.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_pushes_messages_as_they_arrive_and_acks_work() {
    let node = start().await;
    let a = node.addr;
    publish(a, "ev", "?tag=x", "before").await;
    let mut stream = events(a, "/v1/groups/g/topics/ev/stream?invisible_ms=1000").await;
    let (name, m) = stream.next().await;
    assert_eq!(name, "message");
    assert_eq!(body_of(&m), b"before");
    assert_eq!(m["tag"], "x");
    assert_eq!(
        ack(a, "g", &[m["receipt_handle"].as_str().unwrap()])
            .await
            .status,
        200
    );
    // Published while the stream is open: pushed.
    publish(a, "ev", "", [0u8, 0xff].to_vec()).await;
    let (_, m2) = stream.next().await;
    assert_eq!(body_of(&m2), [0, 0xff]);
    assert_eq!(m2["delivery_attempt"], 1);
    // Not acked: it reappears on the stream with attempt 2.
    let (_, m3) = stream.next().await;
    assert_eq!(m3["msg_id"], m2["msg_id"]);
    assert_eq!(m3["delivery_attempt"], 2);
    assert_eq!(
        ack(a, "g", &[m3["receipt_handle"].as_str().unwrap()])
            .await
            .status,
        200
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_an_unknown_topic_is_a_404_before_it_starts() {
    let node = start().await;
    get(node.addr, "/v1/groups/g/topics/nope/stream")
        .await
        .expect_error(404, "topic_not_found");
    get(
        node.addr,
        "/v1/groups/g/topics/nope/stream?filter=%28&filter_type=sql",
    )
    .await
    .expect_error(400, "bad_request");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reads_a_queue_by_offset_without_group_state() {
    let node = start().await;
    let a = node.addr;
    for i in 0..5 {
        publish(a, "r", &format!("?queue=1&tag=t{}", i % 2), format!("m{i}")).await;
    }
    let r = get(a, "/v1/topics/r/queues/1/messages?offset=1&max=2").await;
    assert_eq!(r.status, 200);
    let page = r.json();
    assert_eq!(page["status"], "found");
    let offsets: Vec<u64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["queue_offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [1, 2]);
    assert_eq!(page["next_offset"], 3);
    assert_eq!(page["min_offset"], 0);
    assert_eq!(page["max_offset"], 5);
    assert!(page["messages"][0].get("receipt_handle").is_none());
    // Again, same answer: replay holds no state.
    assert_eq!(
        get(a, "/v1/topics/r/queues/1/messages?offset=1&max=2")
            .await
            .json(),
        page
    );
    // With a filter.
    let page = get(
        a,
        "/v1/topics/r/queues/1/messages?offset=0&max=10&filter=t1",
    )
    .await
    .json();
    let bodies: Vec<Vec<u8>> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(body_of)
        .collect();
    assert_eq!(bodies, [b"m1".to_vec(), b"m3".to_vec()]);
    // At the end: nothing new.
    let page = get(a, "/v1/topics/r/queues/1/messages?offset=5")
        .await
        .json();
    assert_eq!(page["status"], "no_new_message");
    assert_eq!(page["messages"], json!([]));
    // Beyond the end: where to go on.
    let page = get(a, "/v1/topics/r/queues/1/messages?offset=99")
        .await
        .json();
    assert_eq!(page["status"], "offset_moved");
    assert_eq!(page["next_offset"], 5);
    get(a, "/v1/topics/r/queues/7/messages")
        .await
        .expect_error(404, "queue_not_found");
    get(a, "/v1/topics/r/queues/x/messages")
        .await
        .expect_error(400, "bad_request");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_gateway_ends_streams_and_long_polls() {
    // One request at a time, so a 429 tells that the long poll is parked.
    let mut s = settings();
    s.max_inflight = 1;
    let node = start_with(s, broker_options()).await;
    let a = node.addr;
    publish(a, "s", "", "x").await;
    let mut stream = events(a, "/v1/groups/g/topics/s/stream").await;
    stream.next().await;
    // Group h has nothing left, so its long poll waits.
    let got = receive_n(a, "h", "s", 1).await;
    ack(a, "h", &[got[0]["receipt_handle"].as_str().unwrap()]).await;
    let poll =
        tokio::spawn(async move { get(a, "/v1/groups/h/topics/s/messages?wait_ms=30000").await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while get(a, "/v1/topics").await.status != 429 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the poll never parked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::timeout(Duration::from_secs(15), node.stop())
        .await
        .expect("stop returns while a stream and a long poll are open");
    let r = tokio::time::timeout(Duration::from_secs(15), poll)
        .await
        .expect("the long poll ended")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["messages"], json!([]));
    tokio::time::timeout(Duration::from_secs(15), stream.closed())
        .await
        .expect("the stream ended");
}
