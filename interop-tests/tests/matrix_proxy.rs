//! The cross-door matrix through proxies (issue #29): the cells of `tests/matrix.rs`
//! (`interop_tests::matrix`) on one cluster — two broker groups and two
//! `rocketgate proxy` nodes ([`interop_tests::cluster::Cluster`]). Each message is
//! published through **proxy 1** and consumed through **proxy 2**, on a topic with two
//! queues on each broker group; the expectations are the single-node ones
//! ([`interop_tests::doors::Expect`]). A proxy has no native door: the native cells use
//! our client over the cluster's NameServer routes (both groups), as RocketMQ clients
//! do. After the cells, both broker groups must have stored some of the 16 messages.
//!
//! A custom harness (`harness = false`): it prints the 16-cell table at the end and
//! fails if any cell failed.

use interop_tests::cluster::{Cluster, stored_on};
use interop_tests::doors::Door;
use interop_tests::matrix;

fn main() {
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("matrix_proxy: the cluster did not start: {e:#}");
            std::process::exit(1);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let c = &cluster;
    let cells = matrix::run(
        &rt,
        "matrix_proxy",
        "cross-door matrix through proxies (publish on proxy 1, consume on proxy 2)",
        |publisher, consumer| async move {
            let topic = matrix::topic_of(publisher, consumer);
            c.topic(&topic, 2).await?;
            matrix::cell(&c.p1, &c.p2, &topic, publisher, consumer).await
        },
    );
    let mut failed = cells.values().any(Result::is_err);
    // The 16 messages went to both groups (round-robin over the four queues).
    let (mut on_a, mut on_b) = (0, 0);
    for p in Door::ALL {
        for q in Door::ALL {
            let topic = matrix::topic_of(p, q);
            on_a += stored_on(&c.a, &topic).unwrap_or(0);
            on_b += stored_on(&c.b, &topic).unwrap_or(0);
        }
    }
    println!("stored on broker-a: {on_a}, on broker-b: {on_b}");
    if on_a == 0 || on_b == 0 || on_a + on_b != 16 {
        println!("  the 16 messages were not spread over both broker groups");
        failed = true;
    }
    if failed {
        for n in [&c.p1, &c.p2, &c.a, &c.b] {
            eprintln!("{}", n.log_tail());
        }
        std::process::exit(1);
    }
}
