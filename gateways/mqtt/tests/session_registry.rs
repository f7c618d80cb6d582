//! The registry of sessions (what `GET /v1/mqtt/sessions` and `/v1/connections` list,
//! and what the dashboard shows): a session that ends with its connection (expiry 0)
//! leaves it when the connection ends, by DISCONNECT or by a dropped socket; a kept
//! session stays, offline. Before this was fixed every clean client stayed listed as
//! connected forever (one registry entry per client id ever seen).

mod support;

use std::time::{Duration, Instant};

use mqttbytes::v5::{self, Packet};
use support::{Node, Raw, connect_props};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ending_with_its_connection_leaves_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let streams = node.handle.streams();

    let (mut a, _) = Raw::connect_v5(node.addr, "clean-a", None).await;
    let (b, _) = Raw::connect_v5(node.addr, "clean-b", None).await;
    let mut props = connect_props();
    props.session_expiry_interval = Some(600);
    let (mut c, _) = Raw::connect_v5(node.addr, "kept-c", Some(props)).await;
    let listed = |id: &str| streams.sessions().into_iter().find(|s| s.client_id == id);
    assert!(listed("clean-a").is_some_and(|s| s.connected));
    assert!(listed("kept-c").is_some_and(|s| s.connected));

    a.send(Packet::Disconnect(v5::Disconnect::new())).await;
    drop(b);
    c.send(Packet::Disconnect(v5::Disconnect::new())).await;

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let gone = listed("clean-a").is_none() && listed("clean-b").is_none();
        let kept = listed("kept-c").is_some_and(|s| !s.connected);
        if gone && kept {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the connections ended: {:?}",
            streams
                .sessions()
                .iter()
                .map(|s| (&s.client_id, s.connected))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.stop().await;
}
