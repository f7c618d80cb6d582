//! Unit tests of append, read, roll and the queue-offset table on one log.

use super::*;
use crate::store::record::RecordView;

pub(crate) fn config() -> CommitLogConfig {
    CommitLogConfig {
        segment_size: MIN_SEGMENT_SIZE,
        max_message_size: 16 * 1024,
        write_through: true,
        store_host: "127.0.0.1:10911".parse().unwrap(),
    }
}

fn open(dir: &Path) -> CommitLog {
    CommitLog::open(dir, config(), Recovery::Full).unwrap().0
}

fn msg(topic: &str, qid: u32, body_len: usize) -> Message {
    Message::new(topic, qid, vec![b'x'; body_len]).with_tags("T")
}

#[test]
fn append_then_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    assert_eq!(
        (log.min_offset(), log.max_offset(), log.flushed_offset()),
        (0, 0, 0)
    );
    let a = log.append(&msg("a", 0, 10)).unwrap();
    let b = log.append(&msg("a", 0, 20)).unwrap();
    let c = log.append(&msg("b", 1, 0)).unwrap();
    assert_eq!(a.phys_offset, 0);
    assert_eq!(b.phys_offset, a.end_offset);
    assert_eq!((a.queue_offset, b.queue_offset, c.queue_offset), (0, 1, 0));
    assert_eq!(log.max_offset(), c.end_offset);
    assert_eq!(log.next_queue_offset("a", 0), 2);
    assert_eq!(
        record::decode_msg_id(&b.msg_id).unwrap(),
        (config().store_host, b.phys_offset)
    );

    let rec = log.read(b.phys_offset, b.size).unwrap();
    let view = rec.view().unwrap();
    view.verify_strict().unwrap();
    assert_eq!(view.body(), &[b'x'; 20][..]);
    assert_eq!(view.queue_offset(), 1);
    assert_eq!(view.phys_offset(), b.phys_offset as i64);
    assert_eq!(view.store_timestamp(), b.store_timestamp);
    assert_eq!(
        &log.read_at(c.phys_offset).unwrap()[..],
        &log.read(c.phys_offset, c.size).unwrap()[..]
    );
    assert_eq!(log.flush().unwrap(), c.end_offset);
    assert_eq!(log.flushed_offset(), c.end_offset);
}

#[test]
fn into_bytes_is_zero_copy_and_outlives_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let a = log.append(&msg("a", 0, 100)).unwrap();
    let rec = log.read_at(a.phys_offset).unwrap();
    let ptr = rec.as_ptr();
    let bytes = rec.into_bytes();
    assert_eq!(bytes.as_ptr(), ptr);
    drop(log);
    assert_eq!(RecordView::parse(&bytes).unwrap().body().len(), 100);
}

#[test]
fn batch_is_contiguous_and_rolls_whole() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    // Fill most of the first segment, then a batch that cannot fit the rest.
    let fill: Vec<Message> = (0..4).map(|_| msg("f", 0, 15_000)).collect();
    let fill = log.append_batch(&fill).unwrap();
    let first = log.append(&msg("a", 0, 100)).unwrap();
    let batch: Vec<Message> = (0..4).map(|i| msg("a", i % 2, 2_000)).collect();
    let results = log.append_batch(&batch).unwrap();
    assert_eq!(results[0].phys_offset, MIN_SEGMENT_SIZE);
    for w in results.windows(2) {
        assert_eq!(w[0].end_offset, w[1].phys_offset);
    }
    let qos: Vec<u64> = results.iter().map(|r| r.queue_offset).collect();
    assert_eq!(qos, [1, 0, 2, 1]);
    // The rest of segment 0 is a blank filler the cursor steps over.
    let seen: Vec<u64> = log
        .records_from(0)
        .map(|r| r.unwrap().phys_offset())
        .collect();
    let mut expected: Vec<u64> = fill.iter().map(|r| r.phys_offset).collect();
    expected.push(first.phys_offset);
    expected.extend(results.iter().map(|r| r.phys_offset));
    assert_eq!(seen, expected);
    assert!(matches!(
        log.read_at(first.end_offset),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(log.segments().len(), 2);
}

#[test]
fn too_large_is_refused_without_side_effects() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let err = log.append(&msg("a", 0, 20_000)).unwrap_err();
    assert!(
        matches!(err, Error::MessageTooLarge { max: 16384, .. }),
        "{err}"
    );
    let batch: Vec<Message> = (0..6).map(|_| msg("a", 0, 12_000)).collect();
    assert!(matches!(
        log.append_batch(&batch),
        Err(Error::MessageTooLarge { .. })
    ));
    assert_eq!(log.max_offset(), 0);
    assert_eq!(log.next_queue_offset("a", 0), 0);
    assert!(log.append_batch(&[]).unwrap().is_empty());
}

#[test]
fn reads_out_of_range_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    assert!(matches!(
        log.read_at(0),
        Err(Error::OffsetOutOfRange { .. })
    ));
    let a = log.append(&msg("a", 0, 10)).unwrap();
    assert!(matches!(
        log.read_at(a.end_offset),
        Err(Error::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        log.read(a.phys_offset, a.size + 1),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        log.read_at(u64::MAX),
        Err(Error::OffsetOutOfRange { .. })
    ));
    assert!(matches!(log.read_at(3), Err(Error::Corrupt { .. })));
}

#[test]
fn queue_offset_table_can_be_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    log.set_next_queue_offsets(HashMap::from([(("a".to_owned(), 2), 40)]));
    assert_eq!(log.append(&msg("a", 2, 1)).unwrap().queue_offset, 40);
    assert_eq!(log.next_queue_offsets()[&("a".to_owned(), 2)], 41);
}
