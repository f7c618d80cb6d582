//! A commit-log sync that fails, seen through the HTTP door (issue #25, item 5):
//! the store stops taking writes until a restart, and the door says so — 503
//! `flush_failed` with a message, and `/health/ready` 503 with the reason.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rocketgate_core::store::io::Files;
use rocketgate_core::store::io::faults::{FaultyFiles, Op};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_answers_503_flush_failed_and_the_node_is_not_ready() {
    let faults = Arc::new(FaultyFiles::new());
    let node = start_on(settings(), broker_options(), Files::new(faults.clone())).await;
    let publish = |body: &'static str| {
        call(
            node.addr,
            "POST",
            "/v1/topics/fs/messages?queue=0",
            &[],
            body,
        )
    };
    assert_eq!(publish("before").await.status, 201);
    assert_eq!(get(node.addr, "/health/ready").await.status, 200);

    // The store's async flusher hits the failure within its 10 ms interval.
    faults.fail(Op::Sync, Some("commitlog"), libc::EIO, 0, 1);
    let _ = publish("covered").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let r = publish("after").await;
        if r.status != 201 {
            break r;
        }
        assert!(Instant::now() < deadline, "writes never stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let v = refused.expect_error(503, "flush_failed");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("restart the node"),
        "{v}"
    );
    let ready = get(node.addr, "/health/ready").await;
    assert_eq!(ready.status, 503);
    let body = ready.json();
    assert!(
        body["reasons"][0]
            .as_str()
            .unwrap()
            .contains("writes are stopped"),
        "{body}"
    );
    assert!(body["store"]["writes_stopped"].is_string(), "{body}");
    // Reads go on.
    let replay = get(node.addr, "/v1/topics/fs/queues/0/messages?offset=0&max=10").await;
    assert_eq!(replay.status, 200);
    assert!(String::from_utf8_lossy(&replay.body).contains("before"));
}
