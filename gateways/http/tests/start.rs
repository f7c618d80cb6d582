//! Where a new group starts over HTTP: at the earliest message by default;
//! `start=latest` or `start=<ms>` on a receive moves a group with no position
//! yet; a group that has one ignores it.

mod support;

use serde_json::json;
use support::{get, post_json, publish, receive, start};

fn bodies(msgs: &[serde_json::Value]) -> Vec<String> {
    msgs.iter()
        .map(|m| String::from_utf8(support::body_of(m)).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_starts_at_earliest_unless_the_receive_says_otherwise() {
    let node = start().await;
    let a = node.addr;
    let r = post_json(a, "/v1/topics", json!({ "name": "log", "queues": 1 })).await;
    assert_eq!(r.status, 201);
    publish(a, "log", "", "old-1").await;
    publish(a, "log", "", "old-2").await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let cut = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    publish(a, "log", "", "new-1").await;

    // The default: a new group reads from the oldest stored message.
    let got = receive(a, "plain", "log", "?max=10").await;
    assert_eq!(bodies(&got), ["old-1", "old-2", "new-1"]);
    // `latest`: only what comes after.
    assert!(
        receive(a, "tail", "log", "?start=latest&max=10")
            .await
            .is_empty()
    );
    publish(a, "log", "", "new-2").await;
    let got = receive(a, "tail", "log", "?start=latest&max=10&wait_ms=5000").await;
    assert_eq!(bodies(&got), ["new-2"]);
    // A time: the first message stored at or after it.
    let got = receive(a, "since", "log", &format!("?start={cut}&max=10")).await;
    assert_eq!(bodies(&got), ["new-1", "new-2"]);
    // A group with a position keeps it: `start` is for new groups only.
    assert!(
        receive(a, "since", "log", "?start=earliest&max=10")
            .await
            .is_empty()
    );

    get(a, "/v1/groups/g/topics/log/messages?start=yesterday")
        .await
        .expect_error(400, "bad_request");
    node.stop().await;
}
