//! How runs and acks flow on the replication stream (docs/replication.md, "The
//! stream"): a master woken by its log ships a sync send at once and gathers under
//! async replication; a slave acks what it holds without waiting for the next frame,
//! and runs read back to back share one ack.
//!
//! Several tests run on a paused clock: the clock moves only when every task waits
//! for a timer, so "shipped while the clock stands still" means "shipped without
//! waiting for any poll interval" — no wall-clock timing is asserted.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use rocketgate_remoting::ha::{Frame, VERSION_1, master, slave};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// A master's log in memory that wakes its streams when it grows, as the broker's
/// store does.
#[derive(Default)]
struct GrowingSource {
    log: Mutex<Vec<u8>>,
    grown: Notify,
}

impl GrowingSource {
    fn with(len: usize) -> Arc<GrowingSource> {
        let s = GrowingSource::default();
        s.log.lock().unwrap().resize(len, 7);
        Arc::new(s)
    }

    fn append(&self, n: usize) {
        let mut log = self.log.lock().unwrap();
        let len = log.len();
        log.resize(len + n, 9);
        drop(log);
        self.grown.notify_waiters();
    }

    fn len(&self) -> u64 {
        self.log.lock().unwrap().len() as u64
    }
}

impl master::Source for GrowingSource {
    fn bounds(&self) -> (u64, u64) {
        (0, self.len())
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
        // Runs of whole records stop short of the batch (records of 100 bytes here),
        // as the broker's do.
        let to = (from + max - max % 100).min(log.len());
        Ok(Some((log[from..to].to_vec().into(), to as u64)))
    }
    async fn wait_shippable(&self, from: u64) {
        loop {
            let grown = self.grown.notified();
            if self.len() > from {
                return;
            }
            grown.await;
        }
    }
    fn confirmed(&self) -> u64 {
        0
    }
    fn joined(&self, _conn: u64, _broker_id: u64, _peer: SocketAddr, _offset: u64) {}
    fn acked(&self, _conn: u64, offset: u64) -> Result<(), String> {
        if offset > self.len() {
            return Err(format!("offset {offset} beyond the end"));
        }
        Ok(())
    }
    fn left(&self, _conn: u64) {}
}

/// A slave's log in memory that remembers every run it was given.
#[derive(Default)]
struct RunLog {
    log: Mutex<Vec<u8>>,
    /// `(offset, length)` of every appended run.
    runs: Mutex<Vec<(u64, usize)>>,
}

impl RunLog {
    fn len(&self) -> u64 {
        self.log.lock().unwrap().len() as u64
    }
}

impl slave::Target for RunLog {
    fn log_end(&self) -> u64 {
        self.len()
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
        self.runs.lock().unwrap().push((offset, bytes.len()));
        Ok(log.len() as u64)
    }
}

const SECRET: &[u8] = b"s3cret";
/// Long enough that no heartbeat (nor its ack) happens during a test.
const HEARTBEAT: Duration = Duration::from_secs(60);

async fn start_master(
    source: Arc<GrowingSource>,
    gather: Duration,
) -> (SocketAddr, master::Handle) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let settings = master::Settings {
        group: "broker-a".into(),
        secret: SECRET.to_vec(),
        heartbeat: HEARTBEAT,
        batch: 1 << 20,
        gather,
    };
    (addr, master::serve(listener, source, settings))
}

fn follow(master: String, target: Arc<RunLog>) -> slave::Handle {
    slave::spawn(
        target,
        slave::Settings {
            master,
            group: "broker-a".into(),
            broker_id: 1,
            secret: SECRET.to_vec(),
            heartbeat: HEARTBEAT,
            tls: None,
        },
    )
}

/// Waits on the (paused) clock until `f` holds.
async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Whether `f` comes to hold while the clock stands still: only tasks that need no
/// timer get to run (each yield also polls the sockets).
async fn holds_without_a_clock_tick(mut f: impl FnMut() -> bool) -> bool {
    let t0 = tokio::time::Instant::now();
    for _ in 0..100_000 {
        if f() {
            assert_eq!(tokio::time::Instant::now(), t0, "the clock moved");
            return true;
        }
        tokio::task::yield_now().await;
    }
    false
}

#[tokio::test(start_paused = true)]
async fn a_sync_append_is_shipped_without_waiting_for_a_poll_tick() {
    let source = GrowingSource::with(1000);
    let (addr, server) = start_master(source.clone(), Duration::ZERO).await;
    let target = Arc::new(RunLog::default());
    let follower = follow(addr.to_string(), target.clone());
    wait_until("the slave to copy the log", || target.len() == 1000).await;

    // Let every task due at this instant run first (a stream that polls has a timer
    // due now too), so the stream is idle, waiting, when the append comes.
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    // A send under sync replication waits for its copy: the append wakes the stream,
    // which ships it before any timer fires.
    source.append(300);
    assert!(
        holds_without_a_clock_tick(|| target.len() == 1300).await,
        "the append was not shipped until the clock moved (the stream polls instead of being woken)"
    );
    assert_eq!(*target.runs.lock().unwrap().last().unwrap(), (1000, 300));

    follower.stop().await;
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_async_master_gathers_appends_that_arrive_together_into_one_run() {
    let source = GrowingSource::with(1000);
    let (addr, server) = start_master(source.clone(), Duration::from_millis(1)).await;
    let target = Arc::new(RunLog::default());
    let follower = follow(addr.to_string(), target.clone());
    wait_until("the slave to copy the log", || target.len() == 1000).await;
    let runs_before = target.runs.lock().unwrap().len();

    // Woken by the first append, the stream waits (1 ms) before shipping: the
    // second append, made before the clock moves, goes in the same run.
    source.append(100);
    assert!(!holds_without_a_clock_tick(|| target.len() > 1000).await);
    source.append(100);
    wait_until("the slave to copy both appends", || target.len() == 1200).await;
    assert_eq!(
        target.runs.lock().unwrap()[runs_before..],
        [(1000, 200)],
        "the two appends were not shipped as one run"
    );

    follower.stop().await;
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_backlog_of_many_runs_is_shipped_back_to_back_after_one_gather() {
    let source = GrowingSource::with(1000);
    let (addr, server) = start_master(source.clone(), Duration::from_millis(1)).await;
    let target = Arc::new(RunLog::default());
    let follower = follow(addr.to_string(), target.clone());
    wait_until("the slave to copy the log", || target.len() == 1000).await;

    // 5 MiB at once: five full runs. Only a stream that ran out of log gathers; a run
    // the batch cut short is followed by the next at once (a 1 ms pause per 1 MiB run
    // capped a new slave's catch-up and let async slaves fall behind under load).
    let t0 = tokio::time::Instant::now();
    source.append(5 << 20);
    let mut gathered = None;
    for _ in 0..1000 {
        if target.len() == 1000 + (5 << 20) {
            gathered = Some(t0.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    let took = gathered.expect("the backlog was not shipped");
    assert!(
        took <= Duration::from_millis(2),
        "the backlog took {took:?} of the (paused) clock: a gather per run"
    );
    assert!(target.runs.lock().unwrap().len() >= 6);

    follower.stop().await;
    server.stop().await;
}

/// A master played by the test: accepts the slave, answers its HELLO, and hands the
/// socket over.
async fn fake_master() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

async fn admit(listener: &TcpListener, master_end: u64) -> (TcpStream, BytesMut) {
    let (mut sock, _) = listener.accept().await.unwrap();
    let mut buf = BytesMut::new();
    match next_frame(&mut sock, &mut buf).await {
        Frame::Hello(h) => assert_eq!(h.log_end, 0),
        other => panic!("expected HELLO, got {other:?}"),
    }
    let mut out = Vec::new();
    Frame::Welcome {
        version: VERSION_1,
        start: 0,
        master_end,
        epoch: 0,
        epochs: vec![],
    }
    .encode(&mut out);
    sock.write_all(&out).await.unwrap();
    (sock, buf)
}

async fn next_frame(sock: &mut TcpStream, buf: &mut BytesMut) -> Frame {
    loop {
        if let Some(frame) = Frame::decode_from(buf).unwrap() {
            return frame;
        }
        assert!(sock.read_buf(buf).await.unwrap() > 0, "the slave closed");
    }
}

fn data(offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    Frame::Data {
        offset,
        confirmed: 0,
        bytes: vec![5u8; len].into(),
    }
    .encode(&mut out);
    out
}

#[tokio::test]
async fn a_slave_acks_a_run_while_the_next_frame_is_partly_read() {
    let (listener, addr) = fake_master().await;
    let target = Arc::new(RunLog::default());
    let follower = follow(addr, target.clone());
    let (mut sock, mut buf) = admit(&listener, 200).await;

    // One write: a whole run, then the first bytes of the next frame. A sync send
    // waits for the first run's ack, which must not wait for the rest of the second
    // frame (nor for a heartbeat: none is due for a minute).
    let first = data(0, 100);
    let second = data(100, 100);
    let mut wire = first.clone();
    wire.extend_from_slice(&second[..30]);
    sock.write_all(&wire).await.unwrap();
    let ack = tokio::time::timeout(Duration::from_secs(20), next_frame(&mut sock, &mut buf))
        .await
        .expect("no ack for a whole run while the next frame was partly read");
    assert_eq!(ack, Frame::Ack { log_end: 100 });

    sock.write_all(&second[30..]).await.unwrap();
    let ack = tokio::time::timeout(Duration::from_secs(20), next_frame(&mut sock, &mut buf))
        .await
        .expect("no ack for the second run");
    assert_eq!(ack, Frame::Ack { log_end: 200 });
    assert_eq!(target.len(), 200);
    follower.stop().await;
}

#[tokio::test(start_paused = true)]
async fn runs_read_back_to_back_share_one_ack() {
    let (listener, addr) = fake_master().await;
    let target = Arc::new(RunLog::default());
    let follower = follow(addr, target.clone());
    let (mut sock, mut buf) = admit(&listener, 5000).await;

    // 50 runs in one write: the slave appends them one by one but acks once, for all
    // of them (the clock stands still, so its 1 ms bound does not cut in).
    let wire: Vec<u8> = (0..50).flat_map(|i| data(i * 100, 100)).collect();
    sock.write_all(&wire).await.unwrap();
    assert_eq!(
        next_frame(&mut sock, &mut buf).await,
        Frame::Ack { log_end: 5000 }
    );
    assert_eq!(target.runs.lock().unwrap().len(), 50);
    follower.stop().await;
}
