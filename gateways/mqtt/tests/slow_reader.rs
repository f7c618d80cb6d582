//! A subscriber that reads slowly (a firehose outruns it) is alive: it keeps reading
//! and sends PINGREQ within its keep-alive. While its output is full the door stops
//! reading from it (backpressure), so its PINGREQs wait unread in the socket; the
//! keep-alive check must not take that for silence. Found by the hour-long soak
//! (`rocketgate bench soak`): its 60 slow readers were dropped with "keep-alive
//! timeout" every few minutes. A client that takes nothing at all is still dropped.

mod support;

use std::time::{Duration, Instant};

use support::Node;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// An MQTT 3.1.1 CONNECT (clean session) with `keep_alive` seconds.
fn connect(client_id: &str, keep_alive: u16) -> Vec<u8> {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x02];
    body.extend_from_slice(&keep_alive.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
    body.extend_from_slice(client_id.as_bytes());
    let mut p = vec![0x10, body.len() as u8];
    p.extend_from_slice(&body);
    p
}

/// SUBSCRIBE packet id 1 to `filter` at QoS 0.
fn subscribe(filter: &str) -> Vec<u8> {
    let mut body = vec![0, 1];
    body.extend_from_slice(&(filter.len() as u16).to_be_bytes());
    body.extend_from_slice(filter.as_bytes());
    body.push(0);
    let mut p = vec![0x82, body.len() as u8];
    p.extend_from_slice(&body);
    p
}

/// A QoS 0 PUBLISH of `size` bytes to `topic` (remaining length as a varint).
fn publish(topic: &str, size: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(size + topic.len() + 2);
    body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.resize(body.len() + size, b'x');
    let mut p = vec![0x30];
    let mut n = body.len();
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        p.push(b);
        if n == 0 {
            break;
        }
    }
    p.extend_from_slice(&body);
    p
}

/// Connects with a 4 KiB receive buffer, subscribes to `filter`, and waits for the
/// CONNACK and SUBACK (their 9 bytes).
async fn slow_subscriber(port: u16, id: &str, keep_alive: u16, filter: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
    s.write_all(&connect(id, keep_alive)).await.unwrap();
    s.write_all(&subscribe(filter)).await.unwrap();
    let mut acks = [0u8; 9];
    s.read_exact(&mut acks).await.unwrap();
    assert_eq!(acks[0], 0x20, "CONNACK first");
    assert_eq!(acks[4], 0x90, "then SUBACK");
    s
}

/// Publishes 1 KiB QoS 0 messages to `topic` as fast as the door takes them until
/// `until`.
async fn firehose(port: u16, topic: &'static str, until: Instant) {
    let mut p = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    p.write_all(&connect("hose-pub", 60)).await.unwrap();
    let mut ack = [0u8; 4];
    p.read_exact(&mut ack).await.unwrap();
    let batch: Vec<u8> = (0..64).flat_map(|_| publish(topic, 1024)).collect();
    while Instant::now() < until {
        if p.write_all(&batch).await.is_err() {
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_that_pings_is_not_dropped_for_keep_alive() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let port = node.port();
    // Keep-alive 2 s: the door drops a client it hears nothing from for 3 s.
    let slow = slow_subscriber(port, "slow-reader", 2, "hose/#").await;
    let dead = slow_subscriber(port, "dead-reader", 2, "hose/#").await;
    let run = Duration::from_secs(9);
    let until = Instant::now() + run;
    let hose = tokio::spawn(firehose(port, "hose/a", until));

    // The slow reader: 2 KiB every 50 ms (40 KiB/s, far below the firehose) and a
    // PINGREQ every second, for 9 s — three times the keep-alive's grace.
    let (mut rd, mut wr) = slow.into_split();
    let pinger = tokio::spawn(async move {
        while Instant::now() < until {
            if wr.write_all(&[0xC0, 0]).await.is_err() {
                return false;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        true
    });
    let mut received = 0usize;
    let mut buf = vec![0u8; 2048];
    let closed = loop {
        if Instant::now() >= until {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        match tokio::time::timeout(Duration::from_secs(1), rd.read(&mut buf)).await {
            Ok(Ok(0)) => break Some("closed".to_owned()),
            Ok(Err(e)) => break Some(e.to_string()),
            Ok(Ok(n)) => received += n,
            Err(_) => {}
        }
    };
    assert_eq!(
        closed, None,
        "the slow reader was dropped after {received} bytes although it read and pinged"
    );
    assert!(received > 64 * 1024, "it was fed: {received} bytes");
    assert!(pinger.await.unwrap(), "its PINGREQs were written");
    hose.await.unwrap();

    // The reader that took nothing for all that time (and sent nothing) is gone.
    let mut dead = dead;
    let mut sink = vec![0u8; 64 * 1024];
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match dead.read(&mut sink).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert_eq!(
        ended,
        Ok(true),
        "the silent, non-reading client was dropped"
    );
    node.stop().await;
}
