//! The replication stream over loopback sockets, with in-memory logs on both ends:
//! handshake checks, streaming with acks, and refusals of bogus clients.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketgate_remoting::ha::{Frame, Hello, RefuseCode, VERSION, master, slave};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A master's log in memory: any bytes, shipped in runs of at most `batch`.
#[derive(Default)]
struct MemSource {
    log: Mutex<Vec<u8>>,
    acks: Mutex<Vec<(u64, u64)>>,
    joined: Mutex<Vec<(u64, u64)>>,
}

impl master::Source for MemSource {
    fn bounds(&self) -> (u64, u64) {
        (0, self.log.lock().unwrap().len() as u64)
    }
    fn segment_size(&self) -> u64 {
        1 << 20
    }
    fn ship(&self, from: u64, max: usize) -> Result<Option<(Vec<u8>, u64)>, String> {
        let log = self.log.lock().unwrap();
        let from = from as usize;
        if from >= log.len() {
            return Ok(None);
        }
        let to = (from + max).min(log.len());
        Ok(Some((log[from..to].to_vec(), to as u64)))
    }
    fn confirmed(&self) -> u64 {
        0
    }
    fn joined(&self, conn: u64, _broker_id: u64, _peer: SocketAddr, offset: u64) {
        self.joined.lock().unwrap().push((conn, offset));
    }
    fn acked(&self, conn: u64, offset: u64) -> Result<(), String> {
        if offset > self.log.lock().unwrap().len() as u64 {
            return Err(format!("offset {offset} beyond the end"));
        }
        self.acks.lock().unwrap().push((conn, offset));
        Ok(())
    }
    fn left(&self, _conn: u64) {}
}

#[derive(Default)]
struct MemTarget {
    log: Mutex<Vec<u8>>,
}

impl slave::Target for MemTarget {
    fn log_end(&self) -> u64 {
        self.log.lock().unwrap().len() as u64
    }
    fn segment_size(&self) -> u64 {
        1 << 20
    }
    fn restart_at(&self, _start: u64) -> Result<(), String> {
        Err("not supported".into())
    }
    async fn append(&self, offset: u64, bytes: bytes::Bytes) -> Result<u64, String> {
        let mut log = self.log.lock().unwrap();
        if offset != log.len() as u64 {
            return Err(format!("gap: {offset} != {}", log.len()));
        }
        log.extend_from_slice(&bytes);
        Ok(log.len() as u64)
    }
}

fn settings() -> master::Settings {
    master::Settings {
        group: "broker-a".into(),
        secret: b"s3cret".to_vec(),
        heartbeat: Duration::from_millis(100),
        batch: 1000,
    }
}

async fn start_master(source: Arc<MemSource>) -> (SocketAddr, master::Handle) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, master::serve(listener, source, settings()))
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_slave_copies_the_log_and_acknowledges_it() {
    let source = Arc::new(MemSource::default());
    *source.log.lock().unwrap() = (0..10_000u32).map(|i| i as u8).collect();
    let (addr, server) = start_master(source.clone()).await;
    let target = Arc::new(MemTarget::default());
    let follower = slave::spawn(
        target.clone(),
        slave::Settings {
            master: addr.to_string(),
            group: "broker-a".into(),
            broker_id: 1,
            secret: b"s3cret".to_vec(),
            heartbeat: Duration::from_millis(100),
            tls: None,
        },
    );
    wait_until("the first 10,000 bytes", || {
        target.log.lock().unwrap().len() == 10_000
    })
    .await;
    source.log.lock().unwrap().extend_from_slice(&[7u8; 2500]);
    wait_until("the appended bytes", || {
        target.log.lock().unwrap().len() == 12_500
    })
    .await;
    assert_eq!(*target.log.lock().unwrap(), *source.log.lock().unwrap());
    wait_until("an ack of everything", || {
        source
            .acks
            .lock()
            .unwrap()
            .iter()
            .any(|(_, o)| *o == 12_500)
    })
    .await;
    follower.stop().await;
    server.stop().await;
}

/// Sends `bytes` and returns the first frame the master answers.
async fn answer_to(addr: SocketAddr, bytes: &[u8]) -> Option<Frame> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    Frame::decode(&buf).ok().flatten().map(|(f, _)| f)
}

fn hello(secret: &[u8], log_end: u64, group: &str) -> Vec<u8> {
    let mut out = Vec::new();
    Frame::Hello(Hello {
        version: VERSION,
        broker_id: 1,
        log_end,
        segment_size: 1 << 20,
        group: group.into(),
        secret: secret.to_vec(),
    })
    .encode(&mut out);
    out
}

#[tokio::test]
async fn bogus_clients_are_refused_and_change_nothing() {
    let source = Arc::new(MemSource::default());
    *source.log.lock().unwrap() = vec![1u8; 500];
    let (addr, server) = start_master(source.clone()).await;

    let refused = |f: Option<Frame>, want: RefuseCode| match f {
        Some(Frame::Refuse { code, .. }) => assert_eq!(code, want),
        other => panic!("expected a refusal {want:?}, got {other:?}"),
    };
    refused(
        answer_to(addr, &hello(b"wrong", 0, "broker-a")).await,
        RefuseCode::Secret,
    );
    refused(
        answer_to(addr, &hello(b"s3cret", 501, "broker-a")).await,
        RefuseCode::BeyondEnd,
    );
    refused(
        answer_to(addr, &hello(b"s3cret", 0, "broker-b")).await,
        RefuseCode::Group,
    );
    refused(
        answer_to(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await,
        RefuseCode::Protocol,
    );
    assert!(source.joined.lock().unwrap().is_empty(), "nobody joined");

    // Admitted, then an ack beyond the master's end: dropped, the ack not recorded.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut bytes = hello(b"s3cret", 0, "broker-a");
    Frame::Ack { log_end: 10_000 }.encode(&mut bytes);
    s.write_all(&bytes).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let mut frames = Vec::new();
    let mut at = 0;
    while let Ok(Some((f, n))) = Frame::decode(&buf[at..]) {
        frames.push(f);
        at += n;
    }
    assert!(
        frames.iter().any(|f| matches!(
            f,
            Frame::Refuse {
                code: RefuseCode::BeyondEnd,
                ..
            }
        )),
        "{frames:?}"
    );
    assert!(source.acks.lock().unwrap().iter().all(|(_, o)| *o <= 500));
    server.stop().await;
}
