//! Group commit against an in-memory twin of the log, including failed syncs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;

/// In-memory twin of the commit log's durability: `write` moves the written
/// position, `sync` makes it durable unless told to fail.
#[derive(Default)]
struct MemLog {
    written: AtomicU64,
    durable: AtomicU64,
    fail: AtomicBool,
    syncs: AtomicU64,
}

impl MemLog {
    fn write(&self, n: u64) -> u64 {
        self.written.fetch_add(n, Ordering::SeqCst) + n
    }
}

impl FlushTarget for MemLog {
    fn written_offset(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }
    fn durable_offset(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }
    fn sync(&self) -> Result<u64> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::FlushFailed("injected EIO".into()));
        }
        let w = self.written_offset();
        self.durable.fetch_max(w, Ordering::SeqCst);
        Ok(self.durable_offset())
    }
}

const LONG: Duration = Duration::from_secs(30);

#[test]
fn sync_mode_waiters_are_acknowledged_once_durable() {
    let log = Arc::new(MemLog::default());
    let gc = GroupCommit::start(log.clone(), FlushMode::Sync).unwrap();
    let end = log.write(100);
    gc.wait_durable(end, LONG).unwrap();
    assert!(log.durable_offset() >= end);
    assert!(gc.sync_count() >= 1);
    // Already durable: returns at once, no new sync needed.
    gc.wait_durable(end, Duration::ZERO).unwrap();
}

#[test]
fn waiting_past_the_written_position_is_an_error() {
    let log = Arc::new(MemLog::default());
    let gc = GroupCommit::start(log.clone(), FlushMode::Sync).unwrap();
    assert!(matches!(
        gc.wait_durable(10, LONG),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn a_failed_sync_fails_the_covered_waiters_and_is_retried() {
    let log = Arc::new(MemLog::default());
    log.fail.store(true, Ordering::SeqCst);
    let gc = GroupCommit::start(log.clone(), FlushMode::Sync).unwrap();
    let end = log.write(64);
    let err = gc.wait_durable(end, LONG).unwrap_err();
    assert!(matches!(err, Error::FlushFailed(_)), "{err}");
    assert_eq!(
        log.durable_offset(),
        0,
        "a failure is never an acknowledgement"
    );
    // The disk recovers: a new waiter for the same bytes succeeds.
    log.fail.store(false, Ordering::SeqCst);
    gc.wait_durable(end, LONG).unwrap();
    assert_eq!(log.durable_offset(), end);
}

#[test]
fn async_mode_flushes_on_its_own() {
    let log = Arc::new(MemLog::default());
    let gc = GroupCommit::start(
        log.clone(),
        FlushMode::Async {
            interval: Duration::from_millis(1),
        },
    )
    .unwrap();
    let end = log.write(10);
    let mut rx = gc.subscribe();
    while rx.borrow_and_update().offset < end {
        futures_block_on_changed(&mut rx);
    }
    assert_eq!(log.durable_offset(), end);
}

fn futures_block_on_changed(rx: &mut watch::Receiver<Durable>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(rx.changed()).unwrap();
}

#[tokio::test]
async fn async_waiters_share_the_flusher() {
    let log = Arc::new(MemLog::default());
    let gc = Arc::new(GroupCommit::start(log.clone(), FlushMode::Sync).unwrap());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let end = log.write(10);
        let gc = gc.clone();
        tasks.push(tokio::spawn(
            async move { gc.wait_durable_async(end).await },
        ));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(log.durable_offset(), 160);
    let syncs = gc.sync_count();
    assert!(syncs > 0 && syncs <= 16, "{syncs}");
}

#[test]
fn close_flushes_and_later_waiters_see_shutdown() {
    let log = Arc::new(MemLog::default());
    let gc = GroupCommit::start(
        log.clone(),
        FlushMode::Async {
            interval: Duration::from_secs(3600),
        },
    )
    .unwrap();
    let end = log.write(10);
    assert_eq!(gc.close().unwrap(), end);
    assert_eq!(log.durable_offset(), end);
    gc.wait_durable(end, LONG).unwrap();
    let more = log.write(1);
    assert!(matches!(gc.wait_durable(more, LONG), Err(Error::ShutDown)));
    assert!(gc.subscribe().borrow().closed);
}
