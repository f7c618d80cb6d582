//! Durable truncation of a stopped node's log (`store::truncate`; docs/reliability.md):
//! the cut is at a record boundary, survives a crash at any step, moves what it cut to
//! `quarantine/`, rebuilds the queues, and the log and queues go on from the cut.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::Error;
use rocketgate_core::broker::{
    Broker, BrokerSettings, MessagingApi, PopRequest, QueueChoice, TopicConfig,
};
use rocketgate_core::clock::SystemClock;
use rocketgate_core::store::truncate::{INTENT, truncate};
use rocketgate_core::store::{FlushMode, Message, Store, StoreDeps, StoreSettings};

fn settings() -> StoreSettings {
    StoreSettings {
        // Small segments: 300 records span several, so cuts cross segments.
        segment_size: 64 * 1024,
        max_message_size: 4 * 1024,
        flush: FlushMode::Async {
            interval: Duration::from_millis(10),
        },
        consume_queue_entries_per_file: 64,
        index_slots: 16,
        index_entries_per_file: 64,
        ..StoreSettings::default()
    }
}

fn open(dir: &Path) -> Store {
    Store::open(dir, settings(), StoreDeps::fixed_usage(0.1))
        .unwrap()
        .0
}

/// Appends `n` messages to `t` queue 0; returns each one's end offset.
fn fill(store: &Store, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let m = Message::new("t", 0, format!("message {i:04} {}", "x".repeat(1000)));
            store.put(&m).unwrap().end_offset
        })
        .collect()
}

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("commitlog")).unwrap().count()
}

#[test]
fn a_cut_is_durable_moves_the_tail_aside_and_the_log_goes_on_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let ends = fill(&store, 300);
    let old_end = *ends.last().unwrap();
    store.close().unwrap();
    drop(store);
    let segments_before = segment_count(dir.path());
    assert!(segments_before >= 3, "{segments_before} segments");

    let to = ends[99];
    let r = truncate(dir.path(), &settings(), to).unwrap();
    assert_eq!((r.old_end, r.new_end), (old_end, to));
    assert_eq!(r.removed_bytes, old_end - to);
    assert!(r.redispatched_records >= 100);
    assert!(!dir.path().join(INTENT).exists());
    // What was cut is kept for an operator: the tail and the later segments.
    let kept: Vec<_> = std::fs::read_dir(&r.kept_in).unwrap().collect();
    assert!(!kept.is_empty());
    assert!(segment_count(dir.path()) < segments_before);

    let store = open(dir.path());
    assert_eq!(store.positions().written, to);
    assert_eq!(store.queue_bounds("t", 0), (0, 100));
    let last = store.read_queue("t", 0, 99, 1).unwrap();
    let rec = store.read_entry(&last.entries[0].1).unwrap();
    assert!(rec.view().unwrap().body().starts_with(b"message 0099"));
    // Appends continue at the cut, with the next queue offset.
    let m = Message::new("t", 0, "after the cut");
    let a = store.put(&m).unwrap();
    assert_eq!((a.phys_offset, a.queue_offset), (to, 100));
    store.close().unwrap();
    drop(store);
    // Nothing of the old tail comes back at a restart.
    let store = open(dir.path());
    assert_eq!(store.queue_bounds("t", 0), (0, 101));
    let after = store.read_queue("t", 0, 100, 10).unwrap();
    assert_eq!(after.entries.len(), 1);
    store.close().unwrap();
}

#[test]
fn only_a_record_boundary_inside_the_log_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let ends = fill(&store, 20);
    store.close().unwrap();
    drop(store);
    for (to, why) in [
        (ends[9] + 1, "not the start of a record"),
        (ends[19] + 8, "beyond the log's end"),
    ] {
        match truncate(dir.path(), &settings(), to) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("truncate at {to}: {other:?}"),
        }
    }
    // At the end: nothing to do, nothing changed.
    let r = truncate(dir.path(), &settings(), ends[19]).unwrap();
    assert_eq!(r.removed_bytes, 0);
    // A directory in use is refused.
    let store = open(dir.path());
    assert!(truncate(dir.path(), &settings(), ends[9]).is_err());
    assert_eq!(store.positions().written, ends[19]);
    store.close().unwrap();
}

#[test]
fn a_truncation_interrupted_by_a_crash_is_finished_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let ends = fill(&store, 200);
    store.close().unwrap();
    drop(store);
    // The state right after step 1: the intent is durable, nothing else happened
    // (a crash at any later step leaves a subset of the same, idempotent, work).
    let to = ends[49];
    std::fs::write(
        dir.path().join(INTENT),
        format!(r#"{{"version":1,"to":{to}}}"#),
    )
    .unwrap();
    let store = open(dir.path());
    assert!(!dir.path().join(INTENT).exists());
    assert_eq!(store.positions().written, to);
    assert_eq!(store.queue_bounds("t", 0), (0, 50));
    store.close().unwrap();
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.positions().written, to, "the cut tail came back");
    store.close().unwrap();
}

/// A consumer group whose offset was past the cut reads the messages written after
/// it at those queue offsets, rather than skipping them.
#[tokio::test]
async fn a_group_past_the_cut_receives_what_is_written_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let to = {
        let store = Arc::new(open(dir.path()));
        let broker = Broker::open(
            store.clone(),
            BrokerSettings::default(),
            Arc::new(SystemClock),
        )
        .unwrap();
        broker.create_topic(TopicConfig::new("t", 1)).await.unwrap();
        let ends = fill(&store, 100);
        broker.commit_offset("g", "m", "t", 0, 90).await.unwrap();
        broker.close().unwrap();
        drop(broker);
        store.close().unwrap();
        ends[59]
    };
    truncate(dir.path(), &settings(), to).unwrap();
    let store = Arc::new(open(dir.path()));
    let broker = Broker::open(
        store.clone(),
        BrokerSettings::default(),
        Arc::new(SystemClock),
    )
    .unwrap();
    for i in 0..10 {
        let m = Message::new("t", 0, format!("new {i}"));
        broker.send(m, QueueChoice::RoundRobin).await.unwrap();
    }
    let popped = broker
        .pop(PopRequest {
            group: "g".into(),
            topic: "t".into(),
            filter: Default::default(),
            max_messages: 32,
            invisible: Duration::from_secs(30),
            wait: Duration::ZERO,
        })
        .await
        .unwrap();
    assert!(!store.log_was_cut(), "the broker cleared the cut mark");
    let offsets: Vec<u64> = popped.iter().map(|p| p.message.queue_offset).collect();
    assert_eq!(offsets, (60..70).collect::<Vec<_>>());
    broker.close().unwrap();
    drop(broker);
    store.close().unwrap();
}

/// A log that ends with an end-of-segment filler (a crash after a segment was closed and
/// before the next one got a record; here: a cut at a segment's start) is dispatched to
/// its end. It used to stay "not yet dispatched" by the filler's size for ever, and every
/// wait for dispatch (a recovering broker, the power-loss test above 75 % disk) waited
/// for ever.
#[test]
fn a_log_that_ends_with_a_segment_filler_is_dispatched_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    fill(&store, 100);
    store.close().unwrap();
    drop(store);
    let segment = settings().segment_size;
    truncate(dir.path(), &settings(), segment).unwrap();
    let store = open(dir.path());
    assert_eq!(store.positions().written, segment);
    assert!(
        store.wait_dispatched(Duration::from_secs(5)),
        "dispatch stopped short of the log's end: {:?}",
        store.positions()
    );
    // And the log goes on in the next segment.
    let m = Message::new("t", 0, "after the filler");
    assert!(store.put(&m).unwrap().end_offset > segment);
    assert!(store.wait_dispatched(Duration::from_secs(5)));
    store.close().unwrap();
}
