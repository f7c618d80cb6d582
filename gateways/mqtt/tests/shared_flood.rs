//! A QoS 0 flood into a shared subscription, through the socket: raw-socket
//! publishers writing flat out and rumqttc v5 members. In its own test binary:
//! the flood takes the machine's CPU for a few seconds, which must not slow the
//! other shared-subscription tests running beside it.

mod clients;
mod support;

use clients::*;
use rumqttc::v5::mqttbytes::v5 as p5;
use support::Node;

/// QoS 0 publishers writing flat out (many PUBLISHes per socket write, as a
/// load generator does) into a group must not starve the group's members: the
/// broker runs on one worker thread, where one publisher's task used to handle
/// hundreds of thousands of messages per poll and the members' tasks went
/// unpolled for seconds, so the group stopped delivering.
#[test]
fn a_qos0_flood_does_not_stop_a_group() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};

    let dir = tempfile::tempdir().unwrap();
    // The broker on a runtime of its own with one worker, as on a one-core box
    // (or a broker pinned to one core).
    let broker_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let node = broker_rt.block_on(Node::start(dir.path()));
    let addr = node.addr;
    let clients = tokio::runtime::Runtime::new().unwrap();
    let mut members = clients.block_on(async {
        vec![
            share_member(&node, "flood-m0").await,
            share_member(&node, "flood-m1").await,
        ]
    });

    // A CONNECT, then PUBLISHes in 64 KiB writes until told to stop.
    const PUBLISHERS: usize = 64;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|i| {
            let stop = stop.clone();
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let sock = s.try_clone().unwrap();
            let thread = std::thread::spawn(move || {
                let mut buf = bytes::BytesMut::new();
                mqttbytes::v4::Connect::new(format!("flood-p{i}"))
                    .write(&mut buf)
                    .unwrap();
                s.write_all(&buf).unwrap();
                let mut chunk = bytes::BytesMut::new();
                while chunk.len() < 64 * 1024 {
                    let p = mqttbytes::v4::Publish::new(
                        format!("jobs/p{i}"),
                        mqttbytes::QoS::AtMostOnce,
                        b"0123456789abcdef".to_vec(),
                    );
                    p.write(&mut chunk).unwrap();
                }
                while !stop.load(Ordering::Relaxed) {
                    if s.write_all(&chunk).is_err() {
                        break;
                    }
                }
            });
            (sock, thread)
        })
        .collect();

    // Once the flood is under way (its start fills buffers), the group must
    // still be delivering.
    let got = clients.block_on(async {
        let start = tokio::time::Instant::now();
        let window = start + std::time::Duration::from_secs(3);
        let deadline = window + std::time::Duration::from_secs(5);
        let mut got = 0usize;
        while got < 2000 && tokio::time::Instant::now() < deadline {
            for m in members.iter_mut() {
                while let Ok(p) = m.rx.try_recv() {
                    if matches!(p, p5::Packet::Publish(_)) && tokio::time::Instant::now() >= window
                    {
                        got += 1;
                    }
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        got
    });
    stop.store(true, Ordering::Relaxed);
    for (sock, thread) in publishers {
        // Ends a write blocked on a full socket.
        let _ = sock.shutdown(std::net::Shutdown::Both);
        thread.join().unwrap();
    }
    assert!(
        got >= 2000,
        "the group delivered {got} messages in seconds 3 to 8 of a QoS 0 flood"
    );
    clients.block_on(async {
        for m in members {
            m.task.abort();
        }
    });
    broker_rt.block_on(node.stop());
}
