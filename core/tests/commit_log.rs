//! Commit log behaviour a user of the store would notice: concurrent producers,
//! crash recovery of a torn or damaged tail, retention, typed errors, and sync
//! flush with group commit.

#[cfg(target_os = "linux")]
mod smaps_support;
#[cfg(target_os = "linux")]
use smaps_support::mapped_rss_kib;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::Error;
use rocketgate_core::store::commit_log::{
    AppendResult, CommitLog, CommitLogSettings, Recovery, RecoveryReport,
};
use rocketgate_core::store::flush::{FlushMode, GroupCommit};
use rocketgate_core::store::record::{Message, RecordView};

const SEG: u64 = 64 * 1024;
const WAIT: Duration = Duration::from_secs(60);

fn config() -> CommitLogSettings {
    CommitLogSettings {
        segment_size: SEG,
        max_message_size: 8 * 1024,
        write_through: false,
        store_host: "127.0.0.1:10911".parse().unwrap(),
    }
}

fn open(dir: &Path, recovery: Recovery) -> (CommitLog, RecoveryReport) {
    CommitLog::open(dir, config(), recovery).unwrap()
}

fn message(i: usize) -> Message {
    let body: Vec<u8> = (0..(i * 37) % 700).map(|j| (i + j) as u8).collect();
    Message::new(format!("topic-{}", i % 3), (i % 4) as u32, body)
        .with_tags(format!("tag{}", i % 5))
        .with_keys([format!("key-{i}")])
}

fn segment_file(dir: &Path, start: u64) -> std::path::PathBuf {
    dir.join(format!("{start:020}"))
}

#[test]
fn concurrent_appends_are_whole_ordered_and_contiguous_per_queue() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 2000;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(dir.path(), Recovery::Full).0);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..PER_THREAD)
                    .map(|i| {
                        let body = format!("thread {t} message {i} {}", "p".repeat(i % 300));
                        let m = Message::new("orders", (t % 4) as u32, body)
                            .with_property("seq", format!("{t}:{i}"));
                        (m.clone(), log.append(&m).unwrap())
                    })
                    .collect::<Vec<(Message, AppendResult)>>()
            })
        })
        .collect();
    let appended: Vec<(Message, AppendResult)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(appended.len(), THREADS * PER_THREAD);

    // Every acknowledged record reads back with the bytes that were sent.
    for (m, r) in &appended {
        let rec = log.read(r.phys_offset, r.size).unwrap();
        let view = rec.view().unwrap();
        view.verify_strict().unwrap();
        assert_eq!(view.body(), &m.body[..]);
        assert_eq!(view.property("seq"), m.property("seq"));
        assert_eq!(view.queue_offset() as u64, r.queue_offset);
    }

    // Walking the log: strictly increasing offsets, across blank fillers, and
    // per-queue offsets 0, 1, 2, ... with no gap or repeat.
    let mut last = None;
    let mut per_queue: HashMap<i32, Vec<i64>> = HashMap::new();
    let mut count = 0;
    for rec in log.records_from(log.min_offset()) {
        let rec = rec.unwrap();
        assert!(last.is_none_or(|l| rec.phys_offset() > l));
        last = Some(rec.phys_offset());
        let view = rec.view().unwrap();
        per_queue
            .entry(view.queue_id())
            .or_default()
            .push(view.queue_offset());
        count += 1;
    }
    assert_eq!(count, THREADS * PER_THREAD);
    for (qid, offsets) in per_queue {
        let expected: Vec<i64> = (0..offsets.len() as i64).collect();
        assert_eq!(offsets, expected, "queue {qid}");
    }
    assert!(
        log.segments().len() > 10,
        "the test must cross many segments"
    );
    assert_eq!(log.next_queue_offset("orders", 0), 2 * PER_THREAD as u64);
}

/// N records in one segment, the log closed, its pristine file bytes, the
/// append results, and a checkpoint before the last record.
struct Scenario {
    dir: tempfile::TempDir,
    results: Vec<AppendResult>,
    pristine: Vec<u8>,
    checkpoint: u64,
}

fn scenario() -> Scenario {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), Recovery::Full);
    let results: Vec<AppendResult> = (0..6)
        .map(|i| log.append(&message(i + 1)).unwrap())
        .collect();
    log.flush().unwrap();
    drop(log);
    let pristine = std::fs::read(segment_file(dir.path(), 0)).unwrap();
    let checkpoint = results[2].end_offset;
    Scenario {
        dir,
        results,
        pristine,
        checkpoint,
    }
}

impl Scenario {
    fn last(&self) -> &AppendResult {
        self.results.last().unwrap()
    }

    /// Restores the pristine segment, damages it, recovers from the checkpoint
    /// and checks that exactly the whole records before `expected_end` survive.
    fn damage_and_recover(&self, what: &str, damage: impl FnOnce(&mut Vec<u8>), expected_end: u64) {
        let mut bytes = self.pristine.clone();
        damage(&mut bytes);
        std::fs::write(segment_file(self.dir.path(), 0), &bytes).unwrap();
        let (log, report) = open(self.dir.path(), Recovery::FromCheckpoint(self.checkpoint));
        assert_eq!(report.recovered_end, expected_end, "{what}");
        assert_eq!(log.max_offset(), expected_end, "{what}");
        assert_eq!(log.flushed_offset(), expected_end, "{what}");
        let kept: Vec<&AppendResult> = self
            .results
            .iter()
            .filter(|r| r.end_offset <= expected_end)
            .collect();
        for r in &kept {
            let rec = log.read(r.phys_offset, r.size).unwrap();
            let at = r.phys_offset as usize;
            assert_eq!(&rec[..], &self.pristine[at..at + r.size as usize], "{what}");
        }
        let walked: Vec<u64> = log
            .records_from(0)
            .map(|r| r.unwrap().phys_offset())
            .collect();
        assert_eq!(
            walked,
            kept.iter().map(|r| r.phys_offset).collect::<Vec<_>>(),
            "{what}"
        );
        if expected_end < self.last().end_offset {
            assert!(
                log.read_at(self.last().phys_offset).is_err(),
                "{what}: damaged record served"
            );
        }
        // The stale tail is gone from the file, not just hidden.
        let file = std::fs::read(segment_file(self.dir.path(), 0)).unwrap();
        assert!(
            file[expected_end as usize..].iter().all(|b| *b == 0),
            "{what}"
        );

        // Appending after recovery works and survives another reopen.
        let next = log.append(&message(99)).unwrap();
        assert_eq!(next.phys_offset, expected_end, "{what}");
        log.flush().unwrap();
        drop(log);
        let (log, report) = open(self.dir.path(), Recovery::Full);
        assert_eq!(report.recovered_end, next.end_offset, "{what}");
        assert_eq!(report.records_scanned as usize, kept.len() + 1, "{what}");
        let view_bytes = log.read(next.phys_offset, next.size).unwrap();
        let view = RecordView::parse(&view_bytes).unwrap();
        assert_eq!(view.body(), &message(99).body[..], "{what}");
        // Queue offsets continue from what recovery saw.
        let m = message(99);
        let expected_qo = kept
            .iter()
            .zip(1..)
            .filter(|(_, i)| message(*i).topic == m.topic && message(*i).queue_id == m.queue_id)
            .count() as u64;
        assert_eq!(next.queue_offset, expected_qo, "{what}");
    }
}

#[test]
fn recovery_truncates_a_torn_last_record_at_every_byte() {
    let s = scenario();
    let last = s.last().clone();
    for cut in last.phys_offset..last.end_offset {
        s.damage_and_recover(
            &format!("zeroed from {cut}"),
            |b| b[cut as usize..].fill(0),
            last.phys_offset,
        );
    }
}

#[test]
fn recovery_rejects_bit_flips_anywhere_in_the_last_record() {
    let s = scenario();
    let last = s.last().clone();
    let rec = &s.pristine[last.phys_offset as usize..last.end_offset as usize];
    let view = RecordView::parse(rec).unwrap();
    let body_at = view.body().as_ptr() as usize - rec.as_ptr() as usize;
    let topic_at = body_at + view.body().len() + 1;
    let props_at = topic_at + view.topic().len() + 2;
    let positions = [
        0,              // TOTALSIZE
        5,              // MAGICCODE
        9,              // BODYCRC
        13,             // QUEUEID
        22,             // QUEUEOFFSET
        30,             // PHYSICALOFFSET
        45,             // BORNTIMESTAMP
        50,             // BORNHOST
        58,             // STORETIMESTAMP
        body_at - 1,    // BODYLENGTH
        body_at,        // body
        body_at + 3,    // body
        topic_at - 1,   // TOPICLENGTH
        topic_at,       // topic
        props_at - 1,   // PROPERTIESLENGTH
        props_at + 1,   // a property name
        rec.len() - 15, // the CRC property's name
        rec.len() - 5,  // the CRC property's value
        rec.len() - 1,  // the last separator
    ];
    for at in positions {
        for bit in [0u8, 6] {
            let abs = last.phys_offset as usize + at;
            s.damage_and_recover(
                &format!("bit {bit} of byte {at}"),
                |b| b[abs] ^= 1 << bit,
                last.phys_offset,
            );
        }
    }
}

#[test]
fn recovery_truncates_garbage_after_the_last_record() {
    let s = scenario();
    let end = s.last().end_offset;
    s.damage_and_recover(
        "garbage after",
        |b| {
            for (i, x) in b[end as usize..end as usize + 500].iter_mut().enumerate() {
                *x = (i as u8).wrapping_mul(31).wrapping_add(7);
            }
        },
        end,
    );
    // A zero header followed by stale bytes further on: stale data must not
    // survive either.
    s.damage_and_recover(
        "stale bytes after a zero gap",
        |b| b[end as usize + 64] = 0xAB,
        end,
    );
}

#[test]
fn damage_below_the_checkpoint_is_refused_not_truncated() {
    let s = scenario();
    let mut bytes = s.pristine.clone();
    bytes[s.results[1].phys_offset as usize + 4] ^= 0xFF; // magic of record 1
    std::fs::write(segment_file(s.dir.path(), 0), &bytes).unwrap();
    let err = CommitLog::open(
        s.dir.path(),
        config(),
        Recovery::FromCheckpoint(s.checkpoint),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::Corrupt { offset, .. } if offset == s.results[1].phys_offset),
        "{err}"
    );
    // Without a checkpoint nothing is trusted: the damaged record is the end.
    let (_, report) = open(s.dir.path(), Recovery::Full);
    assert_eq!(report.recovered_end, s.results[1].phys_offset);
}

#[test]
fn recovery_removes_segments_after_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), Recovery::Full);
    let results: Vec<AppendResult> = (0..600).map(|i| log.append(&message(i)).unwrap()).collect();
    let segments = log.segments();
    assert!(segments.len() >= 3);
    drop(log);
    // Tear a record in the middle of the second segment.
    let victim = results
        .iter()
        .find(|r| r.phys_offset > SEG + 1000)
        .unwrap()
        .clone();
    let path = segment_file(dir.path(), SEG);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(victim.phys_offset - SEG) as usize + 40] ^= 1;
    std::fs::write(&path, bytes).unwrap();

    let (log, report) = open(dir.path(), Recovery::FromCheckpoint(SEG));
    assert_eq!(report.scanned_from, SEG);
    assert_eq!(report.recovered_end, victim.phys_offset);
    assert!(report.truncated_bytes > 0);
    assert_eq!(log.segments().len(), 2);
    assert!(!segment_file(dir.path(), 2 * SEG).exists());
    let kept = results
        .iter()
        .filter(|r| r.end_offset <= victim.phys_offset)
        .count();
    assert_eq!(log.records_from(0).count(), kept);
    // Recovery rebuilt the queue table from the scanned segment.
    for ((topic, qid), next) in &report.next_queue_offsets {
        assert_eq!(log.next_queue_offset(topic, *qid), *next);
    }
}

#[test]
fn wrong_size_segment_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(segment_file(dir.path(), 0), vec![0u8; 1000]).unwrap();
    let err = CommitLog::open(dir.path(), config(), Recovery::Full).unwrap_err();
    match err {
        Error::Corrupt { path, .. } => assert!(path.ends_with("00000000000000000000")),
        other => panic!("expected Corrupt, got {other}"),
    }
    // A gap between segments is one too.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(segment_file(dir.path(), 0), vec![0u8; SEG as usize]).unwrap();
    std::fs::write(segment_file(dir.path(), 2 * SEG), vec![0u8; SEG as usize]).unwrap();
    assert!(matches!(
        CommitLog::open(dir.path(), config(), Recovery::Full),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn checkpoint_past_the_files_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), Recovery::Full));
    assert!(matches!(
        CommitLog::open(dir.path(), config(), Recovery::FromCheckpoint(10 * SEG)),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn retention_deletes_old_segments_but_readers_keep_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), Recovery::Full);
    let results: Vec<AppendResult> = (0..600).map(|i| log.append(&message(i)).unwrap()).collect();
    let held = log.read(results[0].phys_offset, results[0].size).unwrap();
    let held_copy = held.to_vec();

    // Nothing is deleted while it is not durable.
    assert!(log.delete_segments_where(|_| true).unwrap().is_empty());
    log.flush().unwrap();
    let before = log.segments();
    assert!(
        before
            .iter()
            .all(|s| s.size == SEG && s.last_store_timestamp.is_some())
    );
    let deleted = log.delete_oldest_segment().unwrap().unwrap();
    assert_eq!(deleted.start, 0);
    assert!(!deleted.path.exists());
    assert_eq!(log.min_offset(), SEG);
    assert!(matches!(
        log.read_at(results[0].phys_offset),
        Err(Error::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        log.records_from(0).next(),
        Some(Err(Error::OffsetOutOfRange { .. }))
    ));
    assert_eq!(
        &held[..],
        &held_copy[..],
        "a held record outlives its segment file"
    );

    // Everything else may go, except the segment being written.
    log.delete_segments_where(|_| true).unwrap();
    let left = log.segments();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].start + left[0].written, log.max_offset());
    let last = results.last().unwrap();
    assert!(log.read(last.phys_offset, last.size).is_ok());
    assert!(log.min_offset() <= log.flushed_offset() && log.flushed_offset() <= log.max_offset());

    // Reopening starts from the oldest remaining segment.
    drop(log);
    let (log, report) = open(dir.path(), Recovery::Full);
    assert_eq!(report.scanned_from, left[0].start);
    assert_eq!(log.max_offset(), last.end_offset);
}

#[test]
fn sync_flush_acknowledges_only_durable_appends_with_group_commit() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(dir.path(), Recovery::Full).0);
    let flusher = Arc::new(GroupCommit::start(log.clone(), FlushMode::Sync).unwrap());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (log, flusher) = (log.clone(), flusher.clone());
            std::thread::spawn(move || {
                let mut max_end = 0;
                for i in 0..PER_THREAD {
                    let r = log.append(&message(t * PER_THREAD + i)).unwrap();
                    flusher.wait_durable(r.end_offset, WAIT).unwrap();
                    assert!(log.flushed_offset() >= r.end_offset);
                    max_end = max_end.max(r.end_offset);
                }
                max_end
            })
        })
        .collect();
    let max_end = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap();
    assert!(log.flushed_offset() >= max_end);
    let syncs = flusher.sync_count();
    assert!(
        syncs > 0 && syncs <= (THREADS * PER_THREAD) as u64,
        "{syncs}"
    );
    flusher.close().unwrap();
    assert_eq!(log.flushed_offset(), log.max_offset());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_waiters_are_acknowledged_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(open(dir.path(), Recovery::Full).0);
    let flusher = Arc::new(GroupCommit::start(log.clone(), FlushMode::Sync).unwrap());
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (log, flusher) = (log.clone(), flusher.clone());
        tasks.push(tokio::spawn(async move {
            let r = log.append(&message(i)).unwrap();
            flusher.wait_durable_async(r.end_offset).await.unwrap();
            assert!(log.flushed_offset() >= r.end_offset);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[test]
fn properties_named_finds_several_properties_in_one_pass_like_property_does() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), Recovery::Full);
    let msg = Message::new("t", 0, &b"x"[..])
        .with_tags("a/b")
        .with_keys(["k1", "k2"])
        .with_property("user", "v")
        .with_property("TAGS2", "not the tag");
    let at = log.append(&msg).unwrap();
    let bytes = log.read(at.phys_offset, at.size).unwrap();
    let view = RecordView::parse(&bytes).unwrap();
    let [tags, keys, user, missing] = view.properties_named(["TAGS", "KEYS", "user", "nope"]);
    assert_eq!(tags, view.property("TAGS"));
    assert_eq!(tags, Some("a/b"));
    assert_eq!(keys, Some("k1 k2"));
    assert_eq!(user, Some("v"));
    assert_eq!(missing, None);
    assert_eq!(view.keys().collect::<Vec<_>>(), ["k1", "k2"]);
}

#[test]
fn the_record_crc_is_right_for_small_and_large_records() {
    // Small records hash the stamped bytes, large ones combine CRCs computed before
    // the append lock: both must give the record's own CRC.
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = open(dir.path(), Recovery::Full);
    for size in [0usize, 100, 3_900, 4_096, 5_000, 7_000] {
        let body: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
        let msgs = [
            Message::new("crc", 0, body.clone()).with_tags("t"),
            Message::new("crc", 1, body).with_keys(["k"]),
        ];
        for at in log.append_batch(&msgs).unwrap() {
            let bytes = log.read(at.phys_offset, at.size).unwrap();
            RecordView::parse(&bytes).unwrap().verify_strict().unwrap();
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_flushed_backlog_leaves_the_resident_set_and_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let config = CommitLogSettings {
        segment_size: 4 << 20,
        ..config()
    };
    let log = CommitLog::open(dir.path(), config, Recovery::Full)
        .unwrap()
        .0;
    let body = vec![7u8; 4000];
    let mut appended = Vec::new();
    for i in 0..4000 {
        let m = Message::new("backlog", 0, body.clone()).with_property("n", i.to_string());
        appended.push(log.append(&m).unwrap());
    }
    log.flush().unwrap();
    let before = mapped_rss_kib(dir.path());
    assert!(
        before > 12 * 1024,
        "16 MB written through the mapping: {before} KiB resident"
    );

    // Keep nothing: every flushed page leaves the mapping.
    log.release_cold(0);
    let after = mapped_rss_kib(dir.path());
    assert!(
        after < 1024,
        "after release {after} KiB of {before} KiB still resident"
    );

    // The bytes are the same (the page cache / the file hold them), and the
    // log appends on as before.
    for (i, r) in appended.iter().enumerate() {
        let rec = log.read(r.phys_offset, r.size).unwrap();
        let view = rec.view().unwrap();
        view.verify_strict().unwrap();
        assert_eq!(view.body(), &body[..]);
        assert_eq!(view.property("n"), Some(i.to_string().as_str()));
    }
    let r = log.append(&Message::new("backlog", 0, "after")).unwrap();
    assert_eq!(r.queue_offset, 4000);
    // Reading the backlog faulted it back in; a release that keeps a window as
    // large as the log leaves it mapped.
    log.flush().unwrap();
    log.release_cold(u64::MAX);
    assert!(
        mapped_rss_kib(dir.path()) > 12 * 1024,
        "keep = everything releases nothing"
    );
}
