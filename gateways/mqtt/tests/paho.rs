//! The gateway driven by Eclipse Paho for Python (paho-mqtt 2.x): the scenarios
//! are in `tests/py/paho_check.py`, each run against a fresh server.

mod support;

use support::{Node, WAIT};
use tokio::process::Command;

async fn scenario(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/paho_check.py");
    let out = tokio::time::timeout(
        WAIT * 2,
        Command::new("python3")
            .args([script, "127.0.0.1", &node.port().to_string(), name])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the paho scenario finished in time")
    .expect("python3 runs (paho-mqtt installed by scripts/install-test-deps)");
    assert!(
        out.status.success(),
        "paho scenario {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v311_every_qos() {
    scenario("qos-v311").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_every_qos() {
    scenario("qos-v5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_request_response_with_properties() {
    scenario("request-response").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_topic_alias() {
    scenario("topic-alias").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_will_on_dropped_connection() {
    scenario("will").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_shared_subscription() {
    scenario("shared").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v311_any_topic_name_round_trips() {
    scenario("names-v311").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_any_topic_name_round_trips() {
    scenario("names-v5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v311_refused_publish_is_acked_and_dropped_not_disconnected() {
    scenario("refusals-v311").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_refused_publish_gets_0x90_and_a_reason_string() {
    scenario("refusals-v5").await;
}

/// Three paho members of an ordered shared group (`order` = `fifo` on SUBSCRIBE):
/// each publisher's messages are acknowledged in order across the members, with
/// members of different pace and one dropping its connection holding a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_ordered_shared_subscription_keeps_each_publishers_order() {
    scenario("fifo-shared").await;
}

/// Where a new shared group starts: earliest by default, `start` = `latest` or a
/// time in ms as a SUBSCRIBE user property, a bad value refused with 0x83.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_new_shared_group_start_position() {
    scenario("shared-start").await;
}
