//! The store as a whole: append, dispatch, lookups, restart, recovery of a torn tail,
//! retention and disk watermarks — everything a broker on top would notice.

#[cfg(target_os = "linux")]
mod smaps_support;
#[cfg(target_os = "linux")]
use rocketgate_core::clock::now_ms;
use smaps_support::mapped_rss_kib;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use rocketgate_core::Error;
use rocketgate_core::store::{
    Clock, DiskFullPolicy, DiskSpace, FlushMode, Message, ReadProgress, RecordView, Store,
    StoreDeps, StoreSettings,
};

fn small(flush: FlushMode) -> StoreSettings {
    StoreSettings {
        segment_size: 64 * 1024,
        max_message_size: 8 * 1024,
        flush,
        checkpoint_interval: Duration::from_millis(50),
        retention_check_interval: Duration::from_secs(3600),
        consume_queue_entries_per_file: 32,
        index_slots: 16,
        index_entries_per_file: 64,
        ..StoreSettings::default()
    }
}

fn sync() -> FlushMode {
    FlushMode::Sync {
        timeout: Duration::from_secs(10),
    }
}

fn asynchronous() -> FlushMode {
    FlushMode::Async {
        interval: Duration::from_millis(10),
    }
}

fn open(dir: &Path, flush: FlushMode) -> Store {
    Store::open(dir, small(flush), StoreDeps::fixed_usage(0.1))
        .unwrap()
        .0
}

fn bodies_of(store: &Store, topic: &str, queue: u32) -> Vec<Vec<u8>> {
    let (min, max) = store.queue_bounds(topic, queue);
    let read = store
        .read_queue(topic, queue, min, (max - min) as usize)
        .unwrap();
    read.entries
        .iter()
        .map(|(_, e)| {
            let rec = store.read_entry(e).unwrap();
            RecordView::parse(&rec).unwrap().body().to_vec()
        })
        .collect()
}

#[test]
fn appended_messages_are_read_back_in_order_across_restarts() {
    for flush in [sync(), asynchronous()] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), flush);
        let mut expected = Vec::new();
        for i in 0..500u32 {
            let body = format!("message {i}").into_bytes();
            let r = store
                .put(&Message::new("orders", i % 2, body.clone()).with_tags("TagA"))
                .unwrap();
            if i % 2 == 0 {
                assert_eq!(r.queue_offset, (i / 2) as u64);
                expected.push(body);
            }
        }
        assert!(store.wait_dispatched(Duration::from_secs(10)));
        assert_eq!(bodies_of(&store, "orders", 0), expected);
        store.close().unwrap();

        let store = open(dir.path(), flush);
        assert_eq!(bodies_of(&store, "orders", 0), expected);
        // Queue offsets continue where they were.
        let r = store
            .put(&Message::new("orders", 0, b"next".to_vec()))
            .unwrap();
        assert_eq!(r.queue_offset, 250);
    }
}

#[test]
fn batch_is_contiguous_and_lookups_work_by_id_key_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), sync());
    let before = now_ms() - 1;
    let batch: Vec<Message> = (0..10)
        .map(|i| {
            Message::new("t", 0, vec![i as u8; 100])
                .with_keys([format!("order-{i}"), "shared".to_string()])
        })
        .collect();
    let results = store.put_batch(&batch).unwrap();
    for w in results.windows(2) {
        assert_eq!(
            w[0].end_offset, w[1].phys_offset,
            "batch records are contiguous"
        );
    }
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    let after = now_ms() + 1;

    let rec = store.read_by_msg_id(&results[3].msg_id).unwrap();
    assert_eq!(RecordView::parse(&rec).unwrap().body(), &[3u8; 100][..]);

    let found = store
        .query_by_key("t", "order-7", before, after, 10)
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(
        RecordView::parse(&found[0]).unwrap().body(),
        &[7u8; 100][..]
    );
    assert_eq!(
        store
            .query_by_key("t", "shared", before, after, 100)
            .unwrap()
            .len(),
        10
    );
    assert_eq!(
        store
            .query_by_key("t", "shared", before, after, 4)
            .unwrap()
            .len(),
        4
    );
    assert!(
        store
            .query_by_key("other", "order-7", before, after, 10)
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .query_by_key("t", "order-7", after + 1000, after + 2000, 10)
            .unwrap()
            .is_empty()
    );

    // Back-tracking by time: the first message stored at or after a timestamp.
    assert_eq!(store.queue_offset_by_time("t", 0, before).unwrap(), 0);
    assert_eq!(
        store.queue_offset_by_time("t", 0, after + 10_000).unwrap(),
        10
    );

    // The index survives a restart.
    store.close().unwrap();
    let store = open(dir.path(), sync());
    assert_eq!(
        store
            .query_by_key("t", "order-2", before, after, 10)
            .unwrap()
            .len(),
        1
    );
    assert!(store.read_by_msg_id("not-a-msg-id").is_err());
}

#[test]
fn a_torn_tail_after_an_unclean_stop_is_cut_and_its_queue_offset_reused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), asynchronous());
    for i in 0..20u8 {
        store.put(&Message::new("t", 0, vec![i; 1000])).unwrap();
    }
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    let last = store.put(&Message::new("t", 0, vec![20; 1000])).unwrap();
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    store.halt_for_tests(); // a crash: no final flush, no checkpoint, abort marker stays
    drop(store);

    // Tear the last record in the segment file.
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&seg).unwrap();
    let start = last.phys_offset as usize + 50;
    bytes[start..last.end_offset as usize].fill(0);
    std::fs::write(&seg, &bytes).unwrap();
    // Make recovery look at the tail even if a checkpoint covered it.
    let _ = std::fs::remove_file(dir.path().join("checkpoint"));

    let (store, report) = Store::open(
        dir.path(),
        small(asynchronous()),
        StoreDeps::fixed_usage(0.1),
    )
    .unwrap();
    assert!(report.unclean_shutdown);
    assert!(report.truncated_bytes > 0);
    let bodies = bodies_of(&store, "t", 0);
    assert_eq!(
        bodies.len(),
        20,
        "every whole record kept, the torn one dropped"
    );
    let r = store.put(&Message::new("t", 0, b"after".to_vec())).unwrap();
    assert_eq!(r.queue_offset, 20);
    assert_eq!(r.phys_offset, last.phys_offset);
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    assert_eq!(bodies_of(&store, "t", 0).last().unwrap(), b"after");
}

struct FakeClock(AtomicI64);

#[test]
fn retention_deletes_expired_segments_and_moves_readers_up() {
    let dir = tempfile::tempdir().unwrap();
    let clock_state = Arc::new(FakeClock(AtomicI64::new(now_ms())));
    let c = clock_state.clone();
    let clock: Arc<dyn Clock> = Arc::new(move || c.0.load(Ordering::SeqCst));
    let deps = StoreDeps {
        clock,
        ..StoreDeps::fixed_usage(0.1)
    };
    let mut opts = small(asynchronous());
    opts.retention = Duration::from_secs(3600);
    let (store, _) = Store::open(dir.path(), opts, deps).unwrap();
    // ~6 segments of 64 KiB.
    for i in 0..400u32 {
        store
            .put(&Message::new("t", 0, vec![(i % 251) as u8; 1000]).with_keys([format!("k{i}")]))
            .unwrap();
    }
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    store.close().unwrap();
    let (store, _) = {
        let c = clock_state.clone();
        let clock: Arc<dyn Clock> = Arc::new(move || c.0.load(Ordering::SeqCst));
        let mut opts = small(asynchronous());
        opts.retention = Duration::from_secs(3600);
        Store::open(
            dir.path(),
            opts,
            StoreDeps {
                clock,
                ..StoreDeps::fixed_usage(0.1)
            },
        )
        .unwrap()
    };
    let segments_before = std::fs::read_dir(dir.path().join("commitlog"))
        .unwrap()
        .count();
    assert!(segments_before >= 5);
    assert_eq!(store.run_retention().unwrap(), 0, "nothing is old yet");

    clock_state.0.fetch_add(2 * 3600 * 1000, Ordering::SeqCst);
    let deleted = store.run_retention().unwrap();
    assert_eq!(
        deleted,
        segments_before - 1,
        "all but the active segment go"
    );
    let (min, max) = store.queue_bounds("t", 0);
    assert!(min > 0 && min < max, "queue min moved up: {min}..{max}");
    let read = store.read_queue("t", 0, 0, 5).unwrap();
    assert_eq!(
        read.entries.first().map(|e| e.0),
        Some(min),
        "a reader behind is moved to the minimum"
    );
    assert!(
        store
            .query_by_key("t", "k0", 0, i64::MAX, 10)
            .unwrap()
            .is_empty()
    );
    // Still consistent after a restart.
    store.close().unwrap();
    let store = open(dir.path(), asynchronous());
    assert_eq!(store.queue_bounds("t", 0), (min, max));
}

/// A disk whose usage the test sets.
struct Gauge(AtomicU64);
impl DiskSpace for Gauge {
    fn usage_ratio(&self, _: &Path) -> std::io::Result<f64> {
        Ok(self.0.load(Ordering::SeqCst) as f64 / 100.0)
    }
}

#[test]
fn above_the_hard_ratio_appends_are_refused_then_resume() {
    let dir = tempfile::tempdir().unwrap();
    let gauge = Arc::new(Gauge(AtomicU64::new(50)));
    let deps = StoreDeps {
        disk: gauge.clone(),
        ..StoreDeps::fixed_usage(0.1)
    };
    let (store, _) = Store::open(dir.path(), small(sync()), deps).unwrap();
    store
        .put(&Message::new("t", 0, b"before".to_vec()))
        .unwrap();
    gauge.0.store(95, Ordering::SeqCst);
    store.run_retention().unwrap();
    let err = store
        .put(&Message::new("t", 0, b"refused".to_vec()))
        .unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("disk full"));
    gauge.0.store(60, Ordering::SeqCst);
    store.run_retention().unwrap();
    store.put(&Message::new("t", 0, b"after".to_vec())).unwrap();
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    assert_eq!(
        bodies_of(&store, "t", 0),
        vec![b"before".to_vec(), b"after".to_vec()]
    );
}

/// 300 unread 1000-byte messages in queue ("t", 0) over several 64 KiB segments,
/// reopened with `policy` and a disk gauge at 10 %.
fn backlog(dir: &Path, policy: DiskFullPolicy) -> (Store, Arc<Gauge>) {
    let gauge = Arc::new(Gauge(AtomicU64::new(10)));
    let deps = StoreDeps {
        disk: gauge.clone(),
        ..StoreDeps::fixed_usage(0.1)
    };
    let (store, _) = Store::open(dir, small(asynchronous()), deps).unwrap();
    for i in 0..300u32 {
        store
            .put(&Message::new("t", 0, vec![(i % 7) as u8; 1000]))
            .unwrap();
    }
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    store.close().unwrap();
    drop(store);
    let deps = StoreDeps {
        disk: gauge.clone(),
        ..StoreDeps::fixed_usage(0.1)
    };
    let opts = StoreSettings {
        disk_full_policy: policy,
        ..small(asynchronous())
    };
    (Store::open(dir, opts, deps).unwrap().0, gauge)
}

#[test]
fn under_delete_oldest_the_oldest_segments_go_first_and_unread_drops_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gauge) = backlog(dir.path(), DiskFullPolicy::DeleteOldest);
    let before = store.positions().min;
    gauge.0.store(80, Ordering::SeqCst); // above soft (75%), below hard
    // The gauge never drops (a fake), so every segment but the active one goes.
    assert!(store.run_retention().unwrap() >= 1);
    assert!(store.positions().min > before);
    // Nobody read anything: every message deleted was unread, and counted.
    let (queue_min, _) = store.queue_bounds("t", 0);
    assert!(queue_min > 0);
    assert_eq!(store.unread_dropped(), queue_min);
    store
        .put(&Message::new("t", 0, b"still accepted".to_vec()))
        .unwrap();
}

/// Consumers have read queue ("t", 0) below a fixed offset.
struct ReadBelow(u64);

impl ReadProgress for ReadBelow {
    fn consumed_below(&self, topic: &str, queue_id: u32) -> Option<u64> {
        (topic == "t" && queue_id == 0).then_some(self.0)
    }
}

#[test]
fn under_refuse_disk_pressure_deletes_only_what_every_reader_consumed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gauge) = backlog(dir.path(), DiskFullPolicy::Refuse);
    let before = store.positions().min;
    gauge.0.store(80, Ordering::SeqCst); // above soft (75%), below hard
    // Nothing is known read: nothing goes, however full.
    assert_eq!(store.run_retention().unwrap(), 0);
    assert_eq!(store.positions().min, before);
    assert_eq!(store.queue_bounds("t", 0).0, 0);

    // Read up to 150: the segments wholly below message 150 go, none above.
    store.follow_progress(Arc::new(ReadBelow(150)));
    assert!(store.run_retention().unwrap() >= 1);
    let (queue_min, _) = store.queue_bounds("t", 0);
    assert!(queue_min > 0 && queue_min <= 150, "{queue_min}");
    let read = store.read_queue("t", 0, 150, 1).unwrap();
    assert_eq!(read.entries[0].0, 150);
    assert_eq!(store.unread_dropped(), 0);

    // Past the hard ratio writes are refused, not made room for.
    gauge.0.store(95, Ordering::SeqCst);
    store.run_retention().unwrap();
    let err = store
        .put(&Message::new("t", 0, b"refused".to_vec()))
        .unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    assert!(store.read_queue("t", 0, 150, 1).unwrap().entries[0].0 == 150);
}

#[test]
fn a_topic_that_cannot_be_a_queue_directory_is_refused_before_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), asynchronous());
    for bad in ["../escape", "a/b", ""] {
        let err = store.put(&Message::new(bad, 0, b"x".to_vec())).unwrap_err();
        assert!(
            matches!(err, Error::InvalidTopicName { .. }),
            "{bad:?}: {err}"
        );
    }
    // Dispatch is not stalled: a good message still becomes readable.
    store.put(&Message::new("good", 0, b"ok".to_vec())).unwrap();
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    assert_eq!(bodies_of(&store, "good", 0), vec![b"ok".to_vec()]);
}

#[test]
fn a_segment_whose_creation_was_interrupted_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), sync());
    store.put(&Message::new("t", 0, b"kept".to_vec())).unwrap();
    store.halt_for_tests();
    drop(store);
    // What a kill between creating and sizing the next segment leaves behind.
    let stray = dir
        .path()
        .join("commitlog")
        .join(format!("{:020}.tmp", 64 * 1024));
    std::fs::write(&stray, b"").unwrap();
    let store = open(dir.path(), sync());
    assert!(!stray.exists());
    assert_eq!(bodies_of(&store, "t", 0), vec![b"kept".to_vec()]);
}

#[cfg(target_os = "linux")]
#[test]
fn the_log_tail_is_pre_faulted_by_an_idle_priority_thread() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreSettings {
        segment_size: 64 << 20,
        ..small(asynchronous())
    };
    let store = Store::open(dir.path(), opts, StoreDeps::fixed_usage(0.1))
        .unwrap()
        .0;
    store
        .put(&Message::new("warm", 0, b"one".to_vec()))
        .unwrap();
    // The only file there: one 64 MiB segment.
    let log_dir = dir.path().join("commitlog");
    // The pre-faulter keeps the next 16 MiB past the written position mapped (it
    // refills at half), so appends do not fault; at idle priority it may wait for
    // a busy machine's cores, hence the long deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while mapped_rss_kib(&log_dir) < 8 << 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} KiB of the log's tail pre-faulted",
            mapped_rss_kib(&log_dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Never past the window: a 64 MiB segment is not pre-faulted whole.
    assert!(
        mapped_rss_kib(&log_dir) <= 17 << 10,
        "{} KiB",
        mapped_rss_kib(&log_dir)
    );

    // It runs at SCHED_IDLE (policy 5), so it only takes a core nobody else wants.
    let idle = std::fs::read_dir("/proc/self/task").unwrap().any(|t| {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        let sched = std::fs::read_to_string(t.join("sched")).unwrap_or_default();
        comm.trim() == "rg-prefault"
            && sched
                .lines()
                .any(|l| l.starts_with("policy") && l.split(':').nth(1).map(str::trim) == Some("5"))
    });
    assert!(idle, "no rg-prefault thread at SCHED_IDLE");
    store.close().unwrap();
}
