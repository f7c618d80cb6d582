//! The cross-door matrix (issue #9): for every (publisher door, consumer door) pair among
//! MQTT, HTTP, WebSocket and native, one message with a topic, a tag (MQTT: the rest of
//! the topic path), two keys, two user properties and a binary body (zero bytes,
//! non-UTF-8) goes in through one door and must come out of the other intact — as far
//! as the consuming protocol can carry it (MQTT has no keys; see the table in README).
//!
//! Each door is driven by a client nobody on this project wrote where one exists:
//! `mosquitto_pub` / `mosquitto_sub` for MQTT, `curl` for HTTP, `tokio-tungstenite` for
//! WebSocket; native uses our own client (the published `rocketmq-client-rust` runs in
//! the opt-in `scripts/interop-rocketmq-client-rust`). All against the real binary
//! started by [`interop_tests::Node`]. The cells are `interop_tests::matrix`;
//! `tests/matrix_proxy.rs` runs them through two proxies of a cluster.
//!
//! A custom harness (`harness = false`): it prints the 16-cell table at the end and
//! fails if any cell failed.

use interop_tests::{Node, doors, matrix};

fn main() {
    let node = match Node::start() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("matrix: the node did not start: {e:#}");
            std::process::exit(1);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let cells = matrix::run(&rt, "matrix", "cross-door matrix", |publisher, consumer| {
        let node = &node;
        async move {
            let topic = matrix::topic_of(publisher, consumer);
            doors::create_topic(node, &topic, 2).await?;
            matrix::cell(node, node, &topic, publisher, consumer).await
        }
    });
    if cells.values().any(Result::is_err) {
        eprintln!("{}", node.log_tail());
        std::process::exit(1);
    }
}
