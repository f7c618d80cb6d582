//! The harness itself: a standalone node starts on free ports, survives `kill -9` and
//! restarts on the same data directory and ports, and stops cleanly.

use interop_tests::Node;

#[test]
fn a_node_starts_crashes_restarts_and_stops() {
    let mut node = Node::start().expect("start");
    let ns = node.addr("namesrv");
    assert!(node.data_dir().join("abort").exists(), "the store is open");

    node.kill9().expect("kill -9");
    assert!(
        node.data_dir().join("abort").exists(),
        "a crash leaves the abort marker"
    );
    node.restart().expect("restart after a crash");
    assert_eq!(node.addr("namesrv"), ns, "the same ports after a restart");

    node.stop().expect("clean stop");
    assert!(
        !node.data_dir().join("abort").exists(),
        "a clean stop removes the abort marker"
    );
}
