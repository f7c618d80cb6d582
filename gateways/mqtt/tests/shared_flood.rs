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

const FLOOD: u64 = 60_000;

/// A shared group whose members all take QoS 0 drops what it cannot deliver, as
/// a plain QoS 0 session does (MQTT allows it): a member that stops reading
/// while messages pour in gets, once it reads again, what was already on its
/// way and then the live stream, not the whole backlog read back from the log.
#[test]
fn a_qos0_group_that_cannot_keep_up_rejoins_the_live_stream() {
    let seqs = flood_a_member_that_stops_reading(false);
    let flood = seqs.iter().filter(|&&s| s < FLOOD).count() as u64;
    assert!(
        flood < FLOOD * 3 / 4,
        "the member got {flood} of the {FLOOD} flood messages: the group read its backlog back instead of skipping"
    );
}

/// The same group once its member subscribed again at QoS 1 may not drop
/// anything: it reads the backlog back from the log, every message once.
#[test]
fn a_group_with_a_qos1_member_reads_its_backlog_back() {
    let seqs = flood_a_member_that_stops_reading(true);
    let flood = seqs.iter().filter(|&&s| s < FLOOD).count() as u64;
    assert_eq!(
        flood, FLOOD,
        "every flood message reached the QoS 1 member once"
    );
}

/// One member of `$share/g/skip/t` (QoS 0, then QoS 1 if `resubscribe_at_qos1`)
/// that does not read while [`FLOOD`] QoS 0 publishes of 1 KiB pour in, then
/// reads until live messages published after the flood reach it: the sequence
/// numbers it got, checked to be in order.
fn flood_a_member_that_stops_reading(resubscribe_at_qos1: bool) -> Vec<u64> {
    use bytes::BytesMut;
    use mqttbytes::{QoS, v4};
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const N: u64 = FLOOD;
    const PAYLOAD: usize = 1024;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(dir.path()).await;

        // The member: a small receive buffer, so it is full after a few messages.
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let mut member = sock.connect(node.addr).await.unwrap();
        let mut out = BytesMut::new();
        v4::Connect::new("skip-member").write(&mut out).unwrap();
        let mut sub = v4::Subscribe::new("$share/g/skip/t", QoS::AtMostOnce);
        sub.pkid = 1;
        sub.write(&mut out).unwrap();
        member.write_all(&out).await.unwrap();
        let mut inbuf = BytesMut::new();
        let next = async |s: &mut tokio::net::TcpStream, buf: &mut BytesMut| loop {
            match v4::read(buf, 1 << 20) {
                Ok(p) => return Some(p),
                Err(mqttbytes::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("bad packet: {e:?}"),
            }
            match tokio::time::timeout(Duration::from_secs(2), s.read_buf(buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => panic!("the broker closed the member"),
                Ok(Ok(_)) => {}
                Err(_) => return None, // quiet
            }
        };
        assert!(matches!(
            next(&mut member, &mut inbuf).await,
            Some(v4::Packet::ConnAck(_))
        ));
        assert!(matches!(
            next(&mut member, &mut inbuf).await,
            Some(v4::Packet::SubAck(_))
        ));
        if resubscribe_at_qos1 {
            let mut out = BytesMut::new();
            let mut sub = v4::Subscribe::new("$share/g/skip/t", QoS::AtLeastOnce);
            sub.pkid = 2;
            sub.write(&mut out).unwrap();
            member.write_all(&out).await.unwrap();
            assert!(matches!(
                next(&mut member, &mut inbuf).await,
                Some(v4::Packet::SubAck(_))
            ));
        }

        // The flood, while the member reads nothing.
        let mut publisher = tokio::net::TcpStream::connect(node.addr).await.unwrap();
        let mut out = BytesMut::new();
        v4::Connect::new("skip-publisher").write(&mut out).unwrap();
        publisher.write_all(&out).await.unwrap();
        let publish = |seq: u64, out: &mut BytesMut| {
            let mut body = format!("{seq:08}").into_bytes();
            body.resize(PAYLOAD, b'.');
            v4::Publish::new("skip/t", QoS::AtMostOnce, body)
                .write(out)
                .unwrap();
        };
        for chunk in (0..N).collect::<Vec<_>>().chunks(256) {
            let mut out = BytesMut::new();
            for &seq in chunk {
                publish(seq, &mut out);
            }
            publisher.write_all(&out).await.unwrap();
        }

        // Now it reads: what it gets ends with live messages published from now on.
        let mut seqs: Vec<u64> = Vec::new();
        let mut seq = N;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(
                Instant::now() < deadline,
                "no live message reached the member after the flood"
            );
            let mut out = BytesMut::new();
            publish(seq, &mut out);
            publisher.write_all(&out).await.unwrap();
            seq += 1;
            while let Some(p) = next(&mut member, &mut inbuf).await {
                if let v4::Packet::Publish(p) = p {
                    let s: u64 = std::str::from_utf8(&p.payload[..8])
                        .unwrap()
                        .parse()
                        .unwrap();
                    seqs.push(s);
                }
                if inbuf.is_empty() {
                    break;
                }
            }
            if seqs.last().is_some_and(|&s| s >= N) {
                break;
            }
        }
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "one member's stream stays in order"
        );
        node.stop().await;
        seqs
    })
}
