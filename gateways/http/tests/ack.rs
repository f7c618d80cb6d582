//! Stateless consumption: acks, nacks, invisibility, redelivery, sharing a
//! group between receivers, and gateways acking each other's receipts.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use support::*;

fn handle(m: &serde_json::Value) -> &str {
    m["receipt_handle"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_messages_never_return_and_unacked_ones_reappear() {
    let node = start().await;
    let a = node.addr;
    publish(a, "t", "?queue=0", "one").await;
    publish(a, "t", "?queue=0", "two").await;
    let got = receive(a, "g", "t", "?wait_ms=10000&max=2&invisible_ms=500").await;
    assert_eq!(got.len(), 2);
    let r = ack(a, "g", &[handle(&got[0])]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({ "acked": 1 }));
    // The unacked one comes back after its invisibility, with attempt 2.
    let again = receive_n(a, "g", "t", 1).await;
    assert_eq!(again.len(), 1);
    assert_eq!(body_of(&again[0]), body_of(&got[1]));
    assert_eq!(again[0]["delivery_attempt"], 2);
    assert_eq!(again[0]["msg_id"], got[1]["msg_id"]);
    // Its old handle is stale now; the new one acks.
    ack(a, "g", &[handle(&got[1])])
        .await
        .expect_error(410, "stale_receipt_handle");
    assert_eq!(ack(a, "g", &[handle(&again[0])]).await.status, 200);
    // Acking twice: stale.
    ack(a, "g", &[handle(&again[0])])
        .await
        .expect_error(410, "stale_receipt_handle");
    assert!(receive(a, "g", "t", "").await.is_empty());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_redelivers_now_or_after_a_delay() {
    let node = start().await;
    let a = node.addr;
    publish(a, "n", "", "retry me").await;
    let got = receive_n(a, "g", "n", 1).await;
    let r = post_json(
        a,
        "/v1/groups/g/nacks",
        json!({ "receipt_handle": handle(&got[0]) }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json(), json!({ "nacked": 1 }));
    let again = receive_n(a, "g", "n", 1).await;
    assert_eq!(again[0]["delivery_attempt"], 2);
    // With a delay it stays away for that long (here: long enough to check).
    let r = post_json(
        a,
        "/v1/groups/g/nacks",
        json!({ "receipt_handles": [handle(&again[0])], "delay_ms": 60000 }),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(receive(a, "g", "n", "?wait_ms=300").await.is_empty());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invisibility_can_be_extended_and_replaces_the_handle() {
    let node = start().await;
    let a = node.addr;
    publish(a, "inv", "", "slow work").await;
    let got = receive(a, "g", "inv", "?wait_ms=10000&invisible_ms=1000").await;
    let old = handle(&got[0]).to_owned();
    let r = patch_json(
        a,
        "/v1/groups/g/invisibility",
        json!({ "receipt_handle": old, "invisible_ms": 60000 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    let renewed = r.json();
    let new = renewed["receipt_handle"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    assert!(
        renewed["invisible_until"].as_i64().unwrap() > got[0]["invisible_until"].as_i64().unwrap()
    );
    // Past the first deadline it is still invisible (the new one is a minute away).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(receive(a, "g", "inv", "").await.is_empty());
    ack(a, "g", &[&old])
        .await
        .expect_error(410, "stale_receipt_handle");
    assert_eq!(ack(a, "g", &[&new]).await.status, 200);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_of_a_group_split_the_messages_without_duplicates() {
    let node = start().await;
    let a = node.addr;
    let n = 40;
    for i in 0..n {
        publish(a, "split", "", format!("m{i}")).await;
    }
    let consumer = move || async move {
        let mut got = Vec::new();
        loop {
            let batch = receive(a, "workers", "split", "?max=3&invisible_ms=60000").await;
            if batch.is_empty() {
                return got;
            }
            for m in &batch {
                assert_eq!(ack(a, "workers", &[handle(m)]).await.status, 200);
            }
            got.extend(batch.iter().map(|m| String::from_utf8(body_of(m)).unwrap()));
        }
    };
    let (x, y) = tokio::join!(tokio::spawn(consumer()), tokio::spawn(consumer()));
    let (x, y) = (x.unwrap(), y.unwrap());
    let all: BTreeSet<String> = x.iter().chain(&y).cloned().collect();
    assert_eq!(x.len() + y.len(), n, "no duplicates");
    assert_eq!(all, (0..n).map(|i| format!("m{i}")).collect());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_gateway_acks_what_another_handed_out() {
    let node = start().await;
    let (other, b) = gateway(&node.broker, &node.store, node.settings.clone()).await;
    let a = node.addr;
    publish(a, "s", "", "from a").await;
    publish(b, "s", "", "from b").await;
    // Received through gateway A, acked through gateway B, and the reverse.
    let via_a = receive(a, "g", "s", "?wait_ms=10000&max=1").await;
    let via_b = receive_n(b, "g", "s", 1).await;
    assert_eq!(ack(b, "g", &[handle(&via_a[0])]).await.status, 200);
    assert_eq!(
        patch_json(
            a,
            "/v1/groups/g/invisibility",
            json!({ "receipt_handle": handle(&via_b[0]), "invisible_ms": 500 }),
        )
        .await
        .status,
        200
    );
    // The one B handed out reappears (its new deadline passed) and either gateway serves it.
    let again = receive_n(a, "g", "s", 1).await;
    assert_eq!(body_of(&again[0]), body_of(&via_b[0]));
    assert_eq!(ack(b, "g", &[handle(&again[0])]).await.status, 200);
    assert!(receive(b, "g", "s", "").await.is_empty());
    assert!(receive(a, "g", "s", "").await.is_empty());
    other.stop().await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_failed_ack_says_what_happened_to_each_handle() {
    let node = start().await;
    let a = node.addr;
    publish(a, "p", "", "x").await;
    let got = receive_n(a, "g", "p", 1).await;
    let good = handle(&got[0]).to_owned();
    let stale = format!("{}:7:0", good.strip_suffix(":1:0").unwrap());
    let r = ack(a, "g", &[&good, &stale]).await;
    let v = r.expect_error(410, "stale_receipt_handle");
    assert_eq!(v["results"][0]["ok"], true);
    assert_eq!(v["results"][1]["ok"], false);
    assert_eq!(v["results"][1]["error"]["code"], "stale_receipt_handle");
    // The good one was acked.
    node.stop().await;
}
