//! The replication stream over loopback sockets, with in-memory logs on both ends:
//! handshake checks, streaming with acks, and refusals of bogus clients.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketgate_remoting::ha::{Frame, Hello, RefuseCode, VERSION, VERSION_1, master, slave};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A master's log in memory: any bytes, shipped in runs of at most `batch`.
#[derive(Default)]
struct MemSource {
    log: Mutex<Vec<u8>>,
    acks: Mutex<Vec<(u64, u64)>>,
    joined: Mutex<Vec<(u64, u64)>>,
    /// Controller mode: this master's epoch and epoch file (0 / empty: without).
    epoch: AtomicU64,
    epochs: Mutex<Vec<(u64, u64)>>,
}

/// The epoch a list gives offset `at` (0 before its first entry).
fn label(epochs: &[(u64, u64)], at: u64) -> u64 {
    epochs
        .iter()
        .rev()
        .find(|(_, s)| *s <= at)
        .map_or(0, |(e, _)| *e)
}

/// The test's own divergence, offset by offset (the broker uses core's
/// `store::epoch::divergence`, checked there against random histories).
fn first_difference(
    slave: &[(u64, u64)],
    slave_end: u64,
    master: &[(u64, u64)],
    master_end: u64,
) -> u64 {
    let cap = slave_end.min(master_end);
    (0..cap)
        .find(|&at| label(slave, at) != label(master, at))
        .unwrap_or(cap)
}

impl master::Source for MemSource {
    fn bounds(&self) -> (u64, u64) {
        (0, self.log.lock().unwrap().len() as u64)
    }
    fn segment_size(&self) -> u64 {
        1 << 20
    }
    fn ship(&self, from: u64, max: usize) -> Result<Option<(bytes::Bytes, u64)>, String> {
        let log = self.log.lock().unwrap();
        let from = from as usize;
        if from >= log.len() {
            return Ok(None);
        }
        let to = (from + max).min(log.len());
        Ok(Some((log[from..to].to_vec().into(), to as u64)))
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
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }
    fn epochs(&self) -> Vec<(u64, u64)> {
        self.epochs.lock().unwrap().clone()
    }
    fn divergence(
        &self,
        slave: &[(u64, u64)],
        slave_end: u64,
        master: &[(u64, u64)],
        master_end: u64,
    ) -> u64 {
        first_difference(slave, slave_end, master, master_end)
    }
}

/// A slave's log in memory; in controller mode with an epoch file, a known epoch, and
/// a truncation that cuts at once (what the broker's supervisor does, durably).
#[derive(Default)]
struct MemTarget {
    log: Mutex<Vec<u8>>,
    known: AtomicU64,
    epochs: Mutex<Vec<(u64, u64)>>,
    /// The master's list from the last WELCOME, recorded as its bytes arrive.
    pending: Mutex<Vec<(u64, u64)>>,
    truncations: Mutex<Vec<u64>>,
    adopted: Mutex<Vec<Vec<(u64, u64)>>>,
}

impl MemTarget {
    fn controlled(known: u64, epochs: &[(u64, u64)], log: Vec<u8>) -> MemTarget {
        MemTarget {
            log: Mutex::new(log),
            known: AtomicU64::new(known),
            epochs: Mutex::new(epochs.to_vec()),
            ..MemTarget::default()
        }
    }
    fn record_upto(&self, upto: u64) {
        let pending = self.pending.lock().unwrap();
        if !pending.is_empty() {
            *self.epochs.lock().unwrap() = pending
                .iter()
                .copied()
                .filter(|(_, s)| *s <= upto)
                .collect();
        }
    }
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
        self.record_upto(offset + bytes.len() as u64);
        let mut log = self.log.lock().unwrap();
        if offset != log.len() as u64 {
            return Err(format!("gap: {offset} != {}", log.len()));
        }
        log.extend_from_slice(&bytes);
        Ok(log.len() as u64)
    }
    fn known_epoch(&self) -> u64 {
        self.known.load(Ordering::SeqCst)
    }
    fn epochs(&self) -> Vec<(u64, u64)> {
        self.epochs.lock().unwrap().clone()
    }
    fn truncate(&self, to: u64) -> Result<(), String> {
        self.truncations.lock().unwrap().push(to);
        self.log.lock().unwrap().truncate(to as usize);
        self.epochs.lock().unwrap().retain(|(_, s)| *s <= to);
        Ok(())
    }
    fn adopt_epochs(&self, master: &[(u64, u64)]) -> Result<(), String> {
        self.adopted.lock().unwrap().push(master.to_vec());
        *self.pending.lock().unwrap() = master.to_vec();
        self.record_upto(self.log.lock().unwrap().len() as u64);
        Ok(())
    }
}

fn settings() -> master::Settings {
    master::Settings {
        group: "broker-a".into(),
        secret: b"s3cret".to_vec(),
        heartbeat: Duration::from_millis(100),
        batch: 1000,
        gather: Duration::ZERO,
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
        version: VERSION_1,
        broker_id: 1,
        log_end,
        segment_size: 1 << 20,
        group: group.into(),
        secret: secret.to_vec(),
        epoch: 0,
        epochs: vec![],
    })
    .encode(&mut out);
    out
}

fn hello_v(version: u16, log_end: u64, epoch: u64, epochs: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    Frame::Hello(Hello {
        version,
        broker_id: 1,
        log_end,
        segment_size: 1 << 20,
        group: "broker-a".into(),
        secret: b"s3cret".to_vec(),
        epoch,
        epochs: epochs.to_vec(),
    })
    .encode(&mut out);
    out
}

fn slave_settings(addr: SocketAddr) -> slave::Settings {
    slave::Settings {
        master: addr.to_string(),
        group: "broker-a".into(),
        broker_id: 1,
        secret: b"s3cret".to_vec(),
        heartbeat: Duration::from_millis(100),
        tls: None,
    }
}

/// A master in controller mode at `epoch` with `epochs`, holding `log`.
fn controlled_source(epoch: u64, epochs: &[(u64, u64)], log: Vec<u8>) -> Arc<MemSource> {
    Arc::new(MemSource {
        log: Mutex::new(log),
        epoch: AtomicU64::new(epoch),
        epochs: Mutex::new(epochs.to_vec()),
        ..MemSource::default()
    })
}

fn refused_with(f: Option<Frame>, want: RefuseCode) -> String {
    match f {
        Some(Frame::Refuse { code, reason }) if code == want => reason,
        other => panic!("expected a refusal {want:?}, got {other:?}"),
    }
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

// ---- Controller mode: epochs in the handshake (docs/replication.md, protocol version 2).

/// Bytes `0..n` of a log written by "writer" `w` (logs that part hold other bytes).
fn bytes_of(w: u8, range: std::ops::Range<usize>) -> Vec<u8> {
    range.map(|i| (i as u8).wrapping_mul(31) ^ w).collect()
}

#[tokio::test]
async fn a_stale_master_is_refused_and_gathers_no_copies() {
    // This master took writes at epoch 2; the controller has since elected epoch 3.
    let source = controlled_source(2, &[(1, 0), (2, 100)], bytes_of(1, 0..300));
    let (addr, server) = start_master(source.clone()).await;
    let reason = refused_with(
        answer_to(addr, &hello_v(VERSION, 0, 3, &[(1, 0), (2, 100)])).await,
        RefuseCode::StaleMaster,
    );
    assert!(
        reason.contains("epoch 2") && reason.contains("epoch 3"),
        "{reason}"
    );
    // A node whose own file has a newer epoch (it was master at 3) is refused too,
    // even before it heard from the controller.
    refused_with(
        answer_to(
            addr,
            &hello_v(VERSION, 150, 0, &[(1, 0), (2, 100), (3, 150)]),
        )
        .await,
        RefuseCode::StaleMaster,
    );

    // A real slave that knows epoch 3 copies nothing from it, so no ack counts.
    let target = Arc::new(MemTarget::controlled(3, &[(1, 0), (2, 100)], vec![]));
    let follower = slave::spawn(target.clone(), slave_settings(addr));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(target.log.lock().unwrap().is_empty());
    assert!(source.joined.lock().unwrap().is_empty(), "nobody joined");
    assert!(source.acks.lock().unwrap().is_empty(), "no acknowledgement");
    assert!(!follower.status.connected.load(Ordering::Acquire));
    // The same node elected at epoch 3 (it begins epoch 3 at its end): followed.
    source.epochs.lock().unwrap().push((3, 300));
    source.epoch.store(3, Ordering::SeqCst);
    wait_until("the slave's copy", || {
        target.log.lock().unwrap().len() == 300
    })
    .await;
    assert_eq!(
        *target.epochs.lock().unwrap(),
        vec![(1, 0), (2, 100), (3, 300)]
    );
    follower.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_diverged_slave_truncates_to_the_common_point_then_follows() {
    // Epoch 1: the old master wrote to 400, this master had copied 200 when it was
    // elected at epoch 2, then wrote to 600.
    let mut master_log = bytes_of(1, 0..200);
    master_log.extend(bytes_of(2, 200..600));
    let source = controlled_source(2, &[(1, 0), (2, 200)], master_log.clone());
    let (addr, server) = start_master(source.clone()).await;
    // The old master comes back as a slave: its tail 200..400 was never acknowledged.
    let target = Arc::new(MemTarget::controlled(2, &[(1, 0)], bytes_of(1, 0..400)));
    let follower = slave::spawn(target.clone(), slave_settings(addr));
    wait_until("the copy of the master's log", || {
        *target.log.lock().unwrap() == master_log
    })
    .await;
    assert_eq!(*target.truncations.lock().unwrap(), vec![200]);
    assert_eq!(*target.epochs.lock().unwrap(), vec![(1, 0), (2, 200)]);
    // Counted as a copy only from the common point on, never from its old end.
    assert_eq!(
        source
            .joined
            .lock()
            .unwrap()
            .iter()
            .map(|j| j.1)
            .collect::<Vec<_>>(),
        vec![200]
    );
    assert!(source.acks.lock().unwrap().iter().all(|(_, o)| *o <= 600));
    follower.stop().await;

    // A slave ahead of the master in the master's own epoch (bytes the master lost):
    // cut at the master's end instead of being refused as BeyondEnd.
    let mut ahead = master_log.clone();
    ahead.extend(bytes_of(9, 600..700));
    let target = Arc::new(MemTarget::controlled(2, &[(1, 0), (2, 200)], ahead));
    let follower = slave::spawn(target.clone(), slave_settings(addr));
    wait_until("the cut at the master's end", || {
        *target.truncations.lock().unwrap() == vec![600]
    })
    .await;
    source.log.lock().unwrap().extend(bytes_of(2, 600..650));
    wait_until("the new bytes", || target.log.lock().unwrap().len() == 650).await;
    assert_eq!(*target.log.lock().unwrap(), *source.log.lock().unwrap());
    follower.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_slave_without_truncation_keeps_its_log_and_is_not_counted() {
    // The default Target cannot truncate: it reconnects, holds its bytes, acks nothing.
    #[derive(Default)]
    struct Plain(Mutex<Vec<u8>>);
    impl slave::Target for Plain {
        fn log_end(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn segment_size(&self) -> u64 {
            1 << 20
        }
        fn restart_at(&self, _start: u64) -> Result<(), String> {
            Err("no".into())
        }
        async fn append(&self, _offset: u64, _bytes: bytes::Bytes) -> Result<u64, String> {
            Err("must not append".into())
        }
        fn known_epoch(&self) -> u64 {
            2
        }
        fn epochs(&self) -> Vec<(u64, u64)> {
            vec![(1, 0)]
        }
    }
    let source = controlled_source(2, &[(1, 0), (2, 100)], bytes_of(2, 0..300));
    let (addr, server) = start_master(source.clone()).await;
    let target = Arc::new(Plain(Mutex::new(bytes_of(1, 0..250))));
    let follower = slave::spawn(target.clone(), slave_settings(addr));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*target.0.lock().unwrap(), bytes_of(1, 0..250));
    assert!(source.joined.lock().unwrap().is_empty());
    assert!(source.acks.lock().unwrap().is_empty());
    follower.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn a_slave_refuses_a_master_below_its_known_epoch() {
    // A master that does not check epochs (or did not yet learn of the election)
    // welcomes the slave at epoch 1 and streams at once.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        let hello = loop {
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
            if let Some((Frame::Hello(h), used)) = Frame::decode(&got).unwrap() {
                got.drain(..used);
                break h;
            }
        };
        let mut out = Vec::new();
        Frame::Welcome {
            version: hello.version,
            start: 0,
            master_end: 100,
            epoch: 1,
            epochs: vec![(1, 0)],
        }
        .encode(&mut out);
        Frame::Data {
            offset: 0,
            confirmed: 0,
            bytes: bytes::Bytes::from(vec![5u8; 100]),
        }
        .encode(&mut out);
        s.write_all(&out).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
        let mut frames = Vec::new();
        while let Ok(Some((f, n))) = Frame::decode(&got) {
            frames.push(f);
            got.drain(..n);
        }
        (hello, frames)
    });
    let target = Arc::new(MemTarget::controlled(2, &[(1, 0)], vec![]));
    let follower = slave::spawn(target.clone(), slave_settings(addr));
    let (hello, frames) = tokio::time::timeout(Duration::from_secs(10), fake)
        .await
        .expect("the slave closed the connection")
        .unwrap();
    assert_eq!((hello.version, hello.epoch), (VERSION, 2));
    assert_eq!(hello.epochs, vec![(1, 0)]);
    assert!(frames.is_empty(), "the slave sent {frames:?}");
    assert!(target.log.lock().unwrap().is_empty());
    assert!(target.adopted.lock().unwrap().is_empty());
    follower.stop().await;
}

#[tokio::test]
async fn a_slave_leaves_its_master_when_a_newer_epoch_is_elected() {
    let source = controlled_source(2, &[(1, 0), (2, 100)], bytes_of(2, 0..300));
    let (addr, server) = start_master(source.clone()).await;
    let target = Arc::new(MemTarget::controlled(2, &[], vec![]));
    let follower = slave::spawn(target.clone(), slave_settings(addr));
    wait_until("the copy", || target.log.lock().unwrap().len() == 300).await;
    assert_eq!(*target.epochs.lock().unwrap(), vec![(1, 0), (2, 100)]);
    // The controller elects epoch 3 elsewhere; this slave learns it mid-stream.
    target.known.store(3, Ordering::SeqCst);
    wait_until("the slave leaving", || {
        !follower.status.connected.load(Ordering::Acquire)
    })
    .await;
    source.log.lock().unwrap().extend(bytes_of(2, 300..400));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        target.log.lock().unwrap().len(),
        300,
        "nothing from the old master"
    );
    assert!(
        source.acks.lock().unwrap().iter().all(|(_, o)| *o <= 300),
        "no ack of the old master's new bytes"
    );

    // Its own epoch changing closes a master's streams: the slaves learn the list.
    target.known.store(0, Ordering::SeqCst);
    wait_until("following again", || {
        target.log.lock().unwrap().len() == 400
    })
    .await;
    source.epochs.lock().unwrap().push((4, 400));
    source.epoch.store(4, Ordering::SeqCst);
    source.log.lock().unwrap().extend(bytes_of(4, 400..450));
    wait_until("the epoch-4 bytes", || {
        target.log.lock().unwrap().len() == 450
    })
    .await;
    assert_eq!(
        *target.epochs.lock().unwrap(),
        vec![(1, 0), (2, 100), (4, 400)]
    );
    assert_eq!(*target.log.lock().unwrap(), *source.log.lock().unwrap());
    follower.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn version_1_slaves_still_follow_a_master_in_controller_mode() {
    let source = controlled_source(5, &[(1, 0), (5, 100)], bytes_of(5, 0..2000));
    let (addr, server) = start_master(source.clone()).await;
    // A version-1 HELLO (an older slave, or one outside controller mode) gets a
    // version-1 WELCOME: no epoch fields, and no epoch checks.
    match answer_to(addr, &hello(b"s3cret", 0, "broker-a")).await {
        Some(Frame::Welcome {
            version,
            start,
            master_end,
            epoch,
            epochs,
        }) => {
            assert_eq!((version, start, master_end), (VERSION_1, 0, 2000));
            assert_eq!((epoch, epochs), (0, vec![]));
        }
        other => panic!("{other:?}"),
    }
    // A version this master does not speak is refused by name.
    let reason = refused_with(
        answer_to(addr, &hello_v(3, 0, 0, &[])).await,
        RefuseCode::Version,
    );
    assert!(reason.contains("version 3"), "{reason}");
    // Without epochs, the old rule: a log beyond the master's end is refused.
    refused_with(
        answer_to(addr, &hello_v(VERSION, 2001, 0, &[])).await,
        RefuseCode::BeyondEnd,
    );
    // An epoch list out of order is refused, not trusted.
    refused_with(
        answer_to(addr, &hello_v(VERSION, 10, 0, &[(2, 0), (1, 5)])).await,
        RefuseCode::Protocol,
    );
    // The stream itself: a slave without epochs copies everything.
    let target = Arc::new(MemTarget::default());
    let follower = slave::spawn(target.clone(), slave_settings(addr));
    wait_until("the copy", || target.log.lock().unwrap().len() == 2000).await;
    assert_eq!(*target.log.lock().unwrap(), *source.log.lock().unwrap());
    assert!(
        target.adopted.lock().unwrap().is_empty(),
        "version 1 carries no epochs"
    );
    follower.stop().await;
    server.stop().await;
}
