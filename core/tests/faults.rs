//! Fault injection (issue #25, item 5): the store's file operations fail the way
//! disks fail ([`FaultyFiles`]), and nothing is acknowledged that is not stored,
//! nothing stored is lost, and a failed `fsync` is never retried and trusted.
//!
//! Each test "restarts" the way a crashed process does: `halt_for_tests` (no final
//! flush, no checkpoint), then a fresh `Store::open` with the plain file operations,
//! which runs crash recovery.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::Error;
use rocketgate_core::store::io::Files;
use rocketgate_core::store::io::faults::{FaultyFiles, Op};
use rocketgate_core::store::{FlushMode, Message, RecordView, Store, StoreDeps, StoreSettings};

fn settings(flush: FlushMode) -> StoreSettings {
    StoreSettings {
        segment_size: 64 * 1024,
        max_message_size: 8 * 1024,
        flush,
        checkpoint_interval: Duration::from_millis(50),
        retention_check_interval: Duration::from_secs(3600),
        consume_queue_entries_per_file: 64,
        index_slots: 16,
        index_entries_per_file: 256,
        ..StoreSettings::default()
    }
}

fn sync() -> FlushMode {
    FlushMode::Sync {
        timeout: Duration::from_secs(10),
    }
}

fn open_with(dir: &Path, flush: FlushMode, faults: &Arc<FaultyFiles>) -> Store {
    let deps = StoreDeps {
        files: Files::new(faults.clone()),
        ..StoreDeps::fixed_usage(0.1)
    };
    Store::open(dir, settings(flush), deps).unwrap().0
}

/// A crash of the process: no final flush or checkpoint; then a plain reopen.
fn crash_and_reopen(store: Store, dir: &Path, flush: FlushMode) -> Store {
    store.halt_for_tests();
    drop(store);
    Store::open(dir, settings(flush), StoreDeps::fixed_usage(0.1))
        .unwrap()
        .0
}

fn bodies(store: &Store, topic: &str) -> Vec<String> {
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    let (min, max) = store.queue_bounds(topic, 0);
    let read = store
        .read_queue(topic, 0, min, (max - min) as usize)
        .unwrap();
    read.entries
        .iter()
        .map(|(_, e)| {
            let rec = store.read_entry(e).unwrap();
            String::from_utf8(RecordView::parse(&rec).unwrap().body().to_vec()).unwrap()
        })
        .collect()
}

fn msg(topic: &str, body: &str) -> Message {
    Message::new(topic, 0, body.as_bytes().to_vec())
}

/// `fsync` fails once: the append it covered is not acknowledged; the store stops
/// taking writes (later appends fail although the disk "works" again) and never
/// calls `fsync` again to trust a retry; a restart recovers from the last durable
/// point, every acknowledged message is there, and writes are acknowledged again.
#[test]
fn a_failed_fsync_is_never_acked_nor_retried_and_writes_stop_until_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let store = open_with(dir.path(), sync(), &faults);
    for i in 0..5 {
        store.put(&msg("f", &format!("acked {i}"))).unwrap();
    }
    faults.fail(Op::Sync, Some("commitlog"), libc::EIO, 0, 1);
    let err = store
        .put(&msg("f", "covered by the failed sync"))
        .unwrap_err();
    assert!(matches!(err, Error::FlushFailed(_)), "{err}");
    let syncs_after_failure = faults.calls_on(Op::Sync, "commitlog");
    let flushed = store.positions().flushed;
    // The disk works again, but the store does not trust it.
    for _ in 0..3 {
        let err = store.put(&msg("f", "refused")).unwrap_err();
        assert!(
            err.to_string().contains("writes are stopped"),
            "a clear error: {err}"
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(store.write_stopped().is_some());
    assert_eq!(
        faults.calls_on(Op::Sync, "commitlog"),
        syncs_after_failure,
        "the commit log is never synced again after a failed sync"
    );
    assert_eq!(
        store.positions().flushed,
        flushed,
        "nothing more is durable"
    );

    let store = crash_and_reopen(store, dir.path(), sync());
    let got = bodies(&store, "f");
    let acked: Vec<String> = (0..5).map(|i| format!("acked {i}")).collect();
    assert_eq!(&got[..5], &acked[..], "every acknowledged message survives");
    assert!(got[5..].iter().all(|b| b == "covered by the failed sync"));
    store.put(&msg("f", "after recovery")).unwrap();
    assert_eq!(bodies(&store, "f").last().unwrap(), "after recovery");
}

/// The same under async flush: the append is acknowledged at once, but after the
/// flusher's `fsync` fails no further append is accepted until a restart.
#[test]
fn a_failed_fsync_under_async_flush_stops_writes() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let flush = FlushMode::Async {
        interval: Duration::from_millis(10),
    };
    let store = open_with(dir.path(), flush, &faults);
    store.put(&msg("a", "one")).unwrap();
    faults.fail(Op::Sync, Some("commitlog"), libc::EIO, 0, 1);
    store.put(&msg("a", "two")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.write_stopped().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the failed sync was noticed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let err = store.put(&msg("a", "three")).unwrap_err();
    assert!(err.to_string().contains("writes are stopped"), "{err}");
    let store = crash_and_reopen(store, dir.path(), flush);
    assert_eq!(bodies(&store, "a")[0], "one");
    store.put(&msg("a", "four")).unwrap();
}

/// `ENOSPC` from the append's write: a clear disk-full error, nothing stored of
/// it, and appends resume once the disk check sees space again.
#[test]
fn no_space_at_append_is_disk_full_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let store = open_with(dir.path(), sync(), &faults);
    store.put(&msg("n", "before")).unwrap();
    faults.fail(Op::Write, Some("commitlog"), libc::ENOSPC, 0, 1);
    let err = store.put(&msg("n", "refused")).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    store.run_retention().unwrap(); // the disk check: there is space again
    store.put(&msg("n", "after")).unwrap();
    let store = crash_and_reopen(store, dir.path(), sync());
    assert_eq!(bodies(&store, "n"), ["before", "after"]);
}

/// A write that stops part way (the first records of a batch written, then
/// `ENOSPC`): the batch is refused, and its whole records must not come back
/// after a crash, even when the next append (same size) lands on the same bytes.
#[test]
fn a_batch_written_in_part_is_never_resurrected_by_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let store = open_with(dir.path(), sync(), &faults);
    store.put(&msg("p", "first")).unwrap();
    let one = store.put(&msg("p", "probe")).unwrap().size as usize;
    let batch: Vec<Message> = ["b-1", "b-2", "b-3"]
        .iter()
        .map(|b| msg("p", &format!("{b}..")))
        .collect();
    // Two whole records and half of the third reach the file.
    faults.short_write(2 * one + one / 2, libc::ENOSPC);
    assert!(store.put_batch(&batch).is_err());
    store.run_retention().unwrap();
    store.put(&msg("p", "next.")).unwrap(); // same size as a batch record
    let store = crash_and_reopen(store, dir.path(), sync());
    assert_eq!(bodies(&store, "p"), ["first", "probe", "next."]);
}

/// `ENOSPC` when the log rolls to a new segment: refused, nothing half-made.
#[test]
fn no_space_at_segment_roll_is_disk_full_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let store = open_with(dir.path(), sync(), &faults);
    let body = "x".repeat(3000);
    let mut acked = 0;
    faults.fail(Op::Allocate, Some("commitlog"), libc::ENOSPC, 0, u64::MAX);
    let err = loop {
        match store.put(&msg("r", &body)) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 100, "the first segment is 64 KiB");
    };
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    faults.clear();
    store.run_retention().unwrap();
    store.put(&msg("r", &body)).unwrap();
    acked += 1;
    let store = crash_and_reopen(store, dir.path(), sync());
    assert_eq!(bodies(&store, "r").len(), acked);
}

/// `ENOSPC` writing the checkpoint (a metadata write): a clear error from the
/// checkpoint, appends still acknowledged only when durable, and a restart
/// recovers them from the older checkpoint.
#[test]
fn no_space_at_checkpoint_write_is_an_error_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let store = open_with(dir.path(), sync(), &faults);
    faults.fail(Op::Metadata, None, libc::ENOSPC, 0, u64::MAX);
    for i in 0..20 {
        store.put(&msg("c", &format!("m{i}"))).unwrap();
    }
    std::thread::sleep(Duration::from_millis(120)); // checkpoints were tried
    assert!(faults.calls(Op::Metadata) > 0);
    let err = store.close().unwrap_err();
    assert!(
        err.to_string().contains("checkpoint") && err.to_string().contains("No space left"),
        "{err}"
    );
    drop(store);
    let store = Store::open(dir.path(), settings(sync()), StoreDeps::fixed_usage(0.1))
        .unwrap()
        .0;
    assert_eq!(bodies(&store, "c").len(), 20);
}

/// `EIO` reading a stored record: the queue read fails (the reader keeps its
/// place) instead of skipping the message; once the disk reads again it is served.
#[test]
fn an_io_error_on_read_fails_the_read_and_never_skips_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(FaultyFiles::new());
    let store = open_with(dir.path(), sync(), &faults);
    let r = store.put(&msg("e", "kept")).unwrap();
    assert!(store.wait_dispatched(Duration::from_secs(5)));
    faults.fail(Op::Read, Some("commitlog"), libc::EIO, 0, u64::MAX);
    let err = store.read_queue("e", 0, 0, 10).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    let entries = store.read_queue_entries("e", 0, 0, 10).unwrap().entries;
    assert_eq!(entries.len(), 1);
    let (at, entry) = &entries[0];
    let err = store.read_queued("e", 0, *at, entry, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(store.read_at(r.phys_offset).is_err());
    assert_eq!(
        store.corrupt_records(),
        0,
        "an I/O error is not a damaged record"
    );
    faults.clear();
    assert_eq!(bodies(&store, "e"), ["kept"]);
}

/// A torn write at every offset of a record: the process dies with only the
/// first `k` bytes of the record in the file, for every `k`. Recovery truncates
/// to the last whole record; every acknowledged one survives; the torn one is
/// back only when it was written whole.
#[test]
fn a_torn_write_at_every_offset_of_a_record_recovers_to_the_last_whole_record() {
    let probe = tempfile::tempdir().unwrap();
    let len = {
        let store = Store::open(probe.path(), settings(sync()), StoreDeps::fixed_usage(0.1))
            .unwrap()
            .0;
        store.put(&msg("t", "torn record")).unwrap().size as usize
    };
    for keep in 0..=len {
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(FaultyFiles::new());
        let store = open_with(dir.path(), sync(), &faults);
        store.put(&msg("t", "acked 1")).unwrap();
        store.put(&msg("t", "acked 2")).unwrap();
        faults.tear_next_write(keep);
        assert!(store.put(&msg("t", "torn record")).is_err(), "keep {keep}");
        let store = crash_and_reopen(store, dir.path(), sync());
        let got = bodies(&store, "t");
        if keep == len {
            assert_eq!(got, ["acked 1", "acked 2", "torn record"], "keep {keep}");
        } else {
            assert_eq!(got, ["acked 1", "acked 2"], "keep {keep} of {len}");
        }
        // And the log takes appends where the whole records end.
        store.put(&msg("t", "after")).unwrap();
        assert_eq!(bodies(&store, "t").last().unwrap(), "after", "keep {keep}");
        let set: BTreeSet<String> = bodies(&store, "t").into_iter().collect();
        assert!(set.contains("acked 1") && set.contains("acked 2"));
    }
}
