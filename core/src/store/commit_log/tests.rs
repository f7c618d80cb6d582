//! Unit tests of append, read, roll and the queue-offset table on one log.

use super::*;
use crate::store::record::RecordView;
use bytes::Bytes;

pub(crate) fn config() -> CommitLogSettings {
    CommitLogSettings {
        segment_size: MIN_SEGMENT_SIZE,
        max_message_size: 16 * 1024,
        write_through: true,
        store_host: "127.0.0.1:10911".parse().unwrap(),
    }
}

/// Memory-mapped appends (async flush), where pre-faulting and the mapping's
/// advice apply.
fn mapped_config() -> CommitLogSettings {
    CommitLogSettings {
        write_through: false,
        ..config()
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

fn encoded_batch(entries: &[(&[u8], &[u8])]) -> record::EncodedBatch {
    record::EncodedBatch {
        topic: "ignored".into(),
        sys_flag: 0,
        born_timestamp: 1_700_000_000_000,
        born_host: "10.0.0.9:4242".parse().unwrap(),
        reconsume_times: 0,
        entries: entries
            .iter()
            .enumerate()
            .map(|(i, (body, props))| record::EncodedEntry {
                flag: i as i32,
                body: Bytes::copy_from_slice(body),
                properties: Bytes::copy_from_slice(props),
            })
            .collect(),
    }
}

#[test]
fn an_encoded_batch_is_stored_as_sent_in_one_queue() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    log.append(&msg("E", 3, 10)).unwrap();
    let entries: [(&[u8], &[u8]); 3] = [
        (b"one", b"TAGS\x01t\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U1\x02"),
        (b"", b""),
        (b"three", b"region\x01eu\x02"),
    ];
    let batch = encoded_batch(&entries);
    let plain = record::PlainBatch::check(&batch, &[]).unwrap();
    let (ts, placed) = log.append_encoded(plain, "E", 3).unwrap();
    let qos: Vec<u64> = placed.iter().map(|p| p.queue_offset).collect();
    assert_eq!(qos, [1, 2, 3]);
    assert_eq!(log.next_queue_offset("E", 3), 4);
    for (p, (i, (body, props))) in placed.iter().zip(entries.iter().enumerate()) {
        let rec = log.read(p.phys_offset, p.size).unwrap();
        let view = record::decode(&rec).unwrap();
        view.verify_strict().unwrap();
        assert_eq!(view.body(), *body);
        let raw = view.properties_raw();
        assert_eq!(&raw[..raw.len() - record::CRC32_PROPERTY_LEN], *props);
        assert_eq!(
            (view.topic(), view.queue_id(), view.flag()),
            ("E", 3, i as i32)
        );
        assert_eq!(view.queue_offset() as u64, p.queue_offset);
        assert_eq!(view.store_timestamp(), ts);
        assert_eq!(view.born_host().to_string(), "10.0.0.9:4242");
    }
}

#[test]
fn a_batch_with_one_entry_not_in_the_stored_form_is_not_plain() {
    let entries: [(&[u8], &[u8]); 2] = [(b"ok", b"A\x011\x02"), (b"bad", b"A\x011")];
    let batch = encoded_batch(&entries);
    assert!(record::PlainBatch::check(&batch, &[]).is_none());
    assert!(record::PlainBatch::check(&encoded_batch(&entries[..1]), &["A"]).is_none());
    assert!(record::PlainBatch::check(&encoded_batch(&entries[..1]), &["B"]).is_some());
}

#[test]
fn pre_faulting_ahead_changes_no_byte_and_recovers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = mapped_config();
    let (log, _) = CommitLog::open(dir.path(), cfg.clone(), Recovery::Full).unwrap();
    let mut written = Vec::new();
    // Warm, append, warm again, across several segment rolls.
    for round in 0..12 {
        while log.warm_ahead(1 << 20, 64 << 10).unwrap() > 0 {}
        let batch: Vec<Message> = (0..3).map(|i| msg("w", i, 5_000 + round)).collect();
        written.extend(log.append_batch(&batch).unwrap());
    }
    assert!(log.segments().len() > 1);
    while log.warm_ahead(1 << 20, 64 << 10).unwrap() > 0 {}
    let end = log.max_offset();
    // Nothing above the written position was changed.
    let last = log.segments().last().cloned().unwrap();
    let tail = std::fs::read(&last.path).unwrap();
    assert!(tail[last.written as usize..].iter().all(|b| *b == 0));
    log.flush().unwrap();
    drop(log);

    let (log, report) = CommitLog::open(dir.path(), cfg, Recovery::Full).unwrap();
    assert_eq!(report.recovered_end, end);
    assert_eq!(log.max_offset(), end);
    let seen: Vec<u64> = log
        .records_from(0)
        .map(|r| {
            let r = r.unwrap();
            record::decode(&r).unwrap().verify_strict().unwrap();
            r.phys_offset()
        })
        .collect();
    let expected: Vec<u64> = written.iter().map(|r| r.phys_offset).collect();
    assert_eq!(seen, expected);
}

#[cfg(target_os = "linux")]
#[test]
fn appends_go_where_read_ahead_is_off_and_a_full_segment_gets_it_back() {
    use crate::store::resident::mapping_flags;
    let dir = tempfile::tempdir().unwrap();
    let cfg = mapped_config();
    let (log, _) = CommitLog::open(dir.path(), cfg.clone(), Recovery::Full).unwrap();
    let first = log.segments()[0].path.clone();
    // The fresh segment takes appends: all of it random-access ("rr").
    let flags = mapping_flags(&first);
    assert!(!flags.is_empty(), "the segment is mapped");
    assert!(
        flags.iter().all(|(_, f)| f.iter().any(|x| x == "rr")),
        "{flags:?}"
    );
    // Roll past it: the full one gets normal read-ahead back, the new one has none.
    let mut appended = 0;
    while log.segments().len() < 2 {
        log.append_batch(&[msg("ra", 0, 2_000)]).unwrap();
        appended += 1;
    }
    let flags = mapping_flags(&first);
    assert!(
        flags.iter().all(|(_, f)| !f.iter().any(|x| x == "rr")),
        "{flags:?}"
    );
    let second = log.segments()[1].path.clone();
    let flags = mapping_flags(&second);
    assert!(
        flags.iter().all(|(_, f)| f.iter().any(|x| x == "rr")),
        "{flags:?}"
    );
    for _ in 0..4 {
        log.append_batch(&[msg("ra", 0, 2_000)]).unwrap();
        appended += 1;
    }
    log.flush().unwrap();
    let written = log.segments()[1].written;
    assert!(written > 4096);
    drop(log);

    // Reopened, the active segment keeps read-ahead for what it holds (consumers
    // read it from disk now) and has none from the page of the write position on.
    let (log, _) = CommitLog::open(dir.path(), cfg, Recovery::Full).unwrap();
    let flags = mapping_flags(&second);
    assert_eq!(flags.len(), 2, "split at the write position: {flags:?}");
    assert!(!flags[0].1.iter().any(|x| x == "rr"), "{flags:?}");
    assert_eq!(flags[1].0, written & !4095);
    assert!(flags[1].1.iter().any(|x| x == "rr"), "{flags:?}");
    // And the records are all there.
    let bodies = log
        .records_from(0)
        .map(|r| RecordView::parse(&r.unwrap()).unwrap().body().len())
        .collect::<Vec<_>>();
    assert_eq!(bodies, vec![2_000; appended]);
}
