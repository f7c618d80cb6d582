//! Consume queue behaviour a store (and so a consumer) would notice: entries
//! survive restart, torn tails and truncated logs are dropped, retention and
//! time search, and readers never see half-written entries.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rocketgate_core::Error;
use rocketgate_core::store::consume_queue::{ConsumeQueue, ConsumeQueues, CqEntry, tag_hash};

const EPF: u64 = 16;

/// Entry `i` of a test queue: messages of growing size laid end to end.
fn entry(i: u64) -> CqEntry {
    CqEntry::new(
        i * 1000,
        100 + (i % 7) as u32,
        tag_hash(&format!("tag{}", i % 3)),
    )
}

fn file_path(root: &Path, topic: &str, qid: u32, first_entry: u64) -> PathBuf {
    root.join("consumequeue")
        .join(topic)
        .join(qid.to_string())
        .join(format!("{:020}", first_entry * 20))
}

fn filled(root: &Path, n: u64) -> ConsumeQueue {
    let q = ConsumeQueue::open(root, "T", 0, EPF).unwrap();
    for i in 0..n {
        q.put(i, entry(i)).unwrap();
    }
    q
}

/// Overwrites bytes of a queue file, as a crash or a disk would.
fn patch(path: &Path, at: usize, bytes: &[u8]) {
    let mut data = std::fs::read(path).unwrap();
    data[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, data).unwrap();
}

#[test]
fn put_get_read_across_file_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let q = filled(dir.path(), 50);
    assert_eq!((q.min_offset(), q.max_offset()), (0, 50));
    for i in 0..50 {
        assert_eq!(q.get(i).unwrap(), Some(entry(i)), "entry {i}");
    }
    assert_eq!(q.get(50).unwrap(), None);

    let batch = q.read(10, 20).unwrap();
    assert_eq!(batch.next_offset, 30);
    let want: Vec<_> = (10..30).map(|i| (i, entry(i))).collect();
    assert_eq!(batch.entries, want);

    // Short at the end, empty at max, errors past it.
    let tail = q.read(45, 100).unwrap();
    assert_eq!((tail.entries.len(), tail.next_offset), (5, 50));
    assert!(q.read(50, 10).unwrap().entries.is_empty());
    assert!(matches!(
        q.read(51, 10),
        Err(Error::OffsetOutOfRange {
            offset: 51,
            min: 0,
            max: 50
        })
    ));

    // Files named by the logical byte offset of their first entry, pre-sized.
    for first in [0, 16, 32, 48] {
        let meta = std::fs::metadata(file_path(dir.path(), "T", 0, first)).unwrap();
        assert_eq!(meta.len(), EPF * 20);
    }
}

#[test]
fn on_disk_layout_is_big_endian_20_byte_entries() {
    let dir = tempfile::tempdir().unwrap();
    let q = ConsumeQueue::open(dir.path(), "T", 3, EPF).unwrap();
    q.put(0, CqEntry::new(0, 77, tag_hash("TagA"))).unwrap();
    q.put(1, CqEntry::new(0x0102_0304_0506_0708, 0x0a0b_0c0d, -1))
        .unwrap();
    q.flush().unwrap();
    let bytes = std::fs::read(file_path(dir.path(), "T", 3, 0)).unwrap();
    let mut want = Vec::new();
    want.extend_from_slice(&0i64.to_be_bytes());
    want.extend_from_slice(&77i32.to_be_bytes());
    want.extend_from_slice(&2_598_919i64.to_be_bytes());
    want.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d]);
    want.extend_from_slice(&[0xff; 8]);
    assert_eq!(&bytes[..40], &want[..]);
    assert!(bytes[40..].iter().all(|&b| b == 0));
}

#[test]
fn reopen_keeps_min_and_max() {
    let dir = tempfile::tempdir().unwrap();
    {
        let q = filled(dir.path(), 40);
        q.flush().unwrap();
    }
    let q = ConsumeQueue::open(dir.path(), "T", 0, EPF).unwrap();
    assert_eq!((q.min_offset(), q.max_offset()), (0, 40));
    assert_eq!(q.get(39).unwrap(), Some(entry(39)));
    // Appending continues where it stopped, into the existing third file.
    q.put(40, entry(40)).unwrap();
    assert_eq!(q.read(38, 10).unwrap().entries.len(), 3);
}

#[test]
fn torn_tail_is_dropped_on_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 20));
    let path = file_path(dir.path(), "T", 0, 16);
    // Entry 19 fully zeroed.
    patch(&path, 3 * 20, &[0; 20]);
    let q = ConsumeQueue::open(dir.path(), "T", 0, EPF).unwrap();
    assert_eq!(q.max_offset(), 19);
    drop(q);

    // Entry 18 with only its size written as zero (partial write).
    patch(&path, 2 * 20 + 8, &[0; 4]);
    let q = ConsumeQueue::open(dir.path(), "T", 0, EPF).unwrap();
    assert_eq!(q.max_offset(), 18);
    drop(q);

    // Entry 17 with its phys offset lost but its size present: it no longer
    // follows entry 16 in the log, so it is torn too.
    patch(&path, 20, &[0; 8]);
    let q = ConsumeQueue::open(dir.path(), "T", 0, EPF).unwrap();
    assert_eq!(q.max_offset(), 17);
    assert_eq!(q.get(16).unwrap(), Some(entry(16)));

    // The torn bytes were zeroed, so re-dispatch and a later gap see clean slots.
    q.put(17, entry(17)).unwrap();
    assert_eq!(q.get(17).unwrap(), Some(entry(17)));
    assert_eq!(q.max_offset(), 18);
}

#[test]
fn truncate_from_phys_then_reopen_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let q = filled(dir.path(), 40);
    // Keep entries 0..=24: entry 24 ends at 24_000 + 103.
    let end_24 = entry(24).phys_end();
    assert_eq!(q.truncate_from_phys(end_24 + 50).unwrap(), 15);
    assert_eq!(q.max_offset(), 25);
    assert_eq!(q.get(25).unwrap(), None);
    // A message that straddles the new end is dropped too.
    assert_eq!(q.truncate_from_phys(end_24 - 1).unwrap(), 1);
    assert_eq!(q.max_offset(), 24);
    drop(q);

    let q = ConsumeQueue::open(dir.path(), "T", 0, EPF).unwrap();
    assert_eq!((q.min_offset(), q.max_offset()), (0, 24));
    // Re-dispatch of the recovered log refills from there.
    q.put(24, entry(24)).unwrap();
    assert_eq!(q.max_offset(), 25);

    // Truncating everything leaves an empty queue at its min offset.
    assert_eq!(q.truncate_from_phys(0).unwrap(), 25);
    assert_eq!((q.min_offset(), q.max_offset()), (0, 0));
    assert!(q.read(0, 10).unwrap().entries.is_empty());
}

#[test]
fn retention_deletes_whole_files_and_advances_min() {
    let dir = tempfile::tempdir().unwrap();
    let q = filled(dir.path(), 50); // files at 0, 16, 32, 48
    // The commit log now starts at the message of entry 20.
    assert_eq!(q.delete_before_phys(entry(20).phys_offset).unwrap(), 1);
    assert_eq!(q.min_offset(), 20);
    assert!(!file_path(dir.path(), "T", 0, 0).exists());
    assert!(file_path(dir.path(), "T", 0, 16).exists());
    assert!(matches!(
        q.read(5, 10),
        Err(Error::OffsetOutOfRange {
            offset: 5,
            min: 20,
            ..
        })
    ));
    assert_eq!(q.get(19).unwrap(), None);
    assert_eq!(q.read(20, 1).unwrap().entries, vec![(20, entry(20))]);

    // Everything expired: all files but the last go, the queue is empty but
    // keeps its position.
    assert_eq!(q.delete_before_phys(u64::MAX / 2).unwrap(), 2);
    assert_eq!((q.min_offset(), q.max_offset()), (50, 50));
    q.put(50, entry(50)).unwrap();
    assert_eq!(q.read(50, 10).unwrap().entries, vec![(50, entry(50))]);
    drop(q);

    // On restart min is the first entry on disk until the store re-applies
    // retention with the commit log's min offset.
    let q = ConsumeQueue::open(dir.path(), "T", 0, EPF).unwrap();
    assert_eq!((q.min_offset(), q.max_offset()), (48, 51));
    assert_eq!(q.delete_before_phys(entry(50).phys_offset).unwrap(), 0);
    assert_eq!(q.min_offset(), 50);
}

#[test]
fn time_search() {
    let dir = tempfile::tempdir().unwrap();
    let q = filled(dir.path(), 40);
    // Store timestamps: entry i stored at 1000 + (i / 2) * 10, so pairs share a
    // timestamp (duplicates) and the queue spans three files.
    let ts_of = |phys: u64, _size: u32| -> rocketgate_core::Result<i64> {
        Ok(1000 + (phys / 1000 / 2) as i64 * 10)
    };
    assert_eq!(
        q.offset_at_or_after_time(0, ts_of).unwrap(),
        0,
        "before the first"
    );
    assert_eq!(
        q.offset_at_or_after_time(1000, ts_of).unwrap(),
        0,
        "exact first"
    );
    assert_eq!(q.offset_at_or_after_time(1001, ts_of).unwrap(), 2);
    assert_eq!(
        q.offset_at_or_after_time(1080, ts_of).unwrap(),
        16,
        "exact, first of duplicates, file boundary"
    );
    assert_eq!(q.offset_at_or_after_time(1075, ts_of).unwrap(), 16);
    assert_eq!(
        q.offset_at_or_after_time(1190, ts_of).unwrap(),
        38,
        "exact last"
    );
    assert_eq!(
        q.offset_at_or_after_time(1191, ts_of).unwrap(),
        40,
        "after the last"
    );
    for i in 0..40u64 {
        let ts = 1000 + (i / 2) as i64 * 10;
        assert_eq!(q.offset_at_or_after_time(ts, ts_of).unwrap(), i / 2 * 2);
    }
    // Errors from the commit log propagate.
    let failing = |_: u64, _: u32| -> rocketgate_core::Result<i64> { Err(Error::ShutDown) };
    assert!(matches!(
        q.offset_at_or_after_time(1050, failing),
        Err(Error::ShutDown)
    ));

    // After retention the search starts at the new min.
    q.delete_before_phys(entry(17).phys_offset).unwrap();
    assert_eq!(q.offset_at_or_after_time(0, ts_of).unwrap(), 17);
    let empty = ConsumeQueue::open(dir.path(), "T", 1, EPF).unwrap();
    assert_eq!(empty.offset_at_or_after_time(5, ts_of).unwrap(), 0);
}

#[test]
fn wrong_size_or_missing_file_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(filled(dir.path(), 40));
    let path = file_path(dir.path(), "T", 0, 16);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(EPF * 20 - 3).unwrap();
    match ConsumeQueue::open(dir.path(), "T", 0, EPF) {
        Err(Error::Corrupt { path: p, .. }) => assert_eq!(p, path),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A different entries_per_file than the files were written with.
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        ConsumeQueue::open(dir.path(), "T", 0, 8),
        Err(Error::Corrupt { .. })
    ));
    // A hole in the file sequence.
    match ConsumeQueue::open(dir.path(), "T", 0, EPF) {
        Err(Error::Corrupt { reason, .. }) => assert!(reason.contains("missing"), "{reason}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn redispatch_is_idempotent_and_rewrites_torn_entries() {
    let dir = tempfile::tempdir().unwrap();
    let q = filled(dir.path(), 10);
    q.put(5, entry(5)).unwrap();
    assert_eq!((q.max_offset(), q.get(5).unwrap()), (10, Some(entry(5))));
    let fixed = CqEntry::new(5000, 999, 1);
    q.put(5, fixed).unwrap();
    assert_eq!(q.get(5).unwrap(), Some(fixed));
    assert_eq!(q.max_offset(), 10);
    assert!(matches!(
        q.put(10, CqEntry::new(1, 0, 0)),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn forward_gap_leaves_holes() {
    let dir = tempfile::tempdir().unwrap();
    let q = filled(dir.path(), 10);
    q.put(40, entry(40)).unwrap(); // skips 10..40, across two files
    assert_eq!((q.min_offset(), q.max_offset()), (0, 41));
    assert_eq!(q.get(20).unwrap(), None);
    let batch = q.read(8, 100).unwrap();
    assert_eq!(
        batch.entries,
        vec![(8, entry(8)), (9, entry(9)), (40, entry(40))]
    );
    assert_eq!(batch.next_offset, 41);
    // Holes count towards `max`, so a consumer always makes progress.
    let batch = q.read(10, 5).unwrap();
    assert!(batch.entries.is_empty());
    assert_eq!(batch.next_offset, 15);
    assert_eq!(
        q.offset_at_or_after_time(35_000, |p, _| Ok(p as i64))
            .unwrap(),
        40
    );
    drop(q);
    let q = ConsumeQueue::open(dir.path(), "T", 0, EPF).unwrap();
    assert_eq!((q.min_offset(), q.max_offset()), (0, 41));

    // An empty queue that starts late simply starts there.
    let late = ConsumeQueue::open(dir.path(), "T", 7, EPF).unwrap();
    late.put(1000, entry(1000)).unwrap();
    assert_eq!((late.min_offset(), late.max_offset()), (1000, 1001));
    assert_eq!(std::fs::read_dir(late.dir()).unwrap().count(), 1);
    drop(late);
    let late = ConsumeQueue::open(dir.path(), "T", 7, EPF).unwrap();
    assert_eq!((late.min_offset(), late.max_offset()), (1000, 1001));
}

#[test]
fn concurrent_reader_sees_only_complete_entries() {
    const N: u64 = 10_000;
    // Entries whose every field depends on the offset, so a torn read shows.
    fn e(i: u64) -> CqEntry {
        CqEntry::new(
            i * 4096 + 17,
            1 + (i % 4000) as u32,
            -((i * 2_654_435_761) as i64),
        )
    }
    let dir = tempfile::tempdir().unwrap();
    let q = Arc::new(ConsumeQueue::open(dir.path(), "T", 0, 64).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (q, done) = (q.clone(), done.clone());
        std::thread::spawn(move || {
            let mut from = 0;
            let mut seen = 0u64;
            loop {
                let finished = done.load(Ordering::Acquire);
                let batch = q.read(from, 37).unwrap();
                // No holes: the batch is exactly the slots from..next_offset.
                assert_eq!(batch.entries.len() as u64, batch.next_offset - from);
                for (i, (o, got)) in batch.entries.iter().enumerate() {
                    assert_eq!(*o, from + i as u64);
                    assert_eq!(*got, e(*o), "entry {o}");
                    seen += 1;
                }
                assert!(batch.next_offset <= q.max_offset());
                from = batch.next_offset;
                if finished && from == N {
                    return seen;
                }
                std::thread::yield_now();
            }
        })
    };
    for i in 0..N {
        q.put(i, e(i)).unwrap();
    }
    done.store(true, Ordering::Release);
    assert_eq!(reader.join().unwrap(), N);
}

#[test]
fn table_loads_skips_junk_and_removes_topics() {
    let dir = tempfile::tempdir().unwrap();
    {
        let t = ConsumeQueues::open(dir.path(), EPF).unwrap();
        for (topic, qid, n) in [("A", 0, 5), ("A", 1, 20), ("B", 3, 1)] {
            let q = t.get_or_create(topic, qid).unwrap();
            for i in 0..n {
                q.put(i, entry(i)).unwrap();
            }
        }
        assert!(t.get("A", 2).is_none());
        let _unwritten = t.get_or_create("C", 0).unwrap();
        t.flush_all().unwrap();
        assert!(matches!(
            t.get_or_create("../x", 0),
            Err(Error::InvalidTopicName { .. })
        ));
        assert!(matches!(
            t.get_or_create("", 0),
            Err(Error::InvalidTopicName { .. })
        ));
    }
    // Junk that is not ours: a stray file and a non-numeric queue dir.
    let base = dir.path().join("consumequeue");
    std::fs::write(base.join("README"), "x").unwrap();
    std::fs::create_dir_all(base.join("A").join("tmp")).unwrap();

    let t = ConsumeQueues::open(dir.path(), EPF).unwrap();
    let names: Vec<_> = t.queues().into_iter().map(|(t, q, _)| (t, q)).collect();
    assert_eq!(
        names,
        vec![
            ("A".to_string(), 0),
            ("A".to_string(), 1),
            ("B".to_string(), 3)
        ]
    );
    let next = t.next_offsets();
    assert_eq!(next[&("A".to_string(), 1)], 20);
    assert_eq!(next[&("B".to_string(), 3)], 1);
    assert!(Arc::ptr_eq(
        &t.get("A", 1).unwrap(),
        &t.get_or_create("A", 1).unwrap()
    ));

    assert_eq!(
        t.truncate_all_from_phys(entry(3).phys_end()).unwrap(),
        1 + 16
    );
    assert_eq!(t.get("A", 1).unwrap().max_offset(), 4);
    assert_eq!(t.delete_all_before_phys(entry(2).phys_offset).unwrap(), 0);
    assert_eq!(t.get("A", 0).unwrap().min_offset(), 2);

    t.remove_topic("A").unwrap();
    assert!(t.get("A", 0).is_none());
    assert!(!base.join("A").exists());
    drop(t);
    let t = ConsumeQueues::open(dir.path(), EPF).unwrap();
    assert_eq!(t.queues().len(), 1);
}
