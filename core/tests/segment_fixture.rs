//! The checked-in segment fixture (`tests/fixtures/segment-v1.bin`) pins the
//! on-disk format: the current encoder must produce exactly its bytes, the
//! decoder must read every field back, and the commit log must open it. A
//! format change shows up here as a failing test and a regenerated binary in
//! the diff. Regenerate with
//! `ROCKETGATE_REGENERATE_FIXTURES=1 cargo test -p rocketgate-core --test segment_fixture`.
//!
//! Also the decoder's no-panic property test over random and damaged bytes.

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rocketgate_core::store::commit_log::{CommitLog, CommitLogSettings, Recovery};
use rocketgate_core::store::record::{
    self, Header, Message, RecordView, Stamp, property, read_header, sys_flag,
};

const SEGMENT_SIZE: usize = 64 * 1024;
const STORE_TS: i64 = 1_700_000_000_500;

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/segment-v1.bin")
}

fn store_host() -> SocketAddr {
    "10.0.0.1:10911".parse().unwrap()
}

const NON_UTF8: &[u8] = &[0xff, 0x00, 0xfe, 0x80, 0xc3, 0x28, 0x01, 0x02];

/// The fixture's messages, with the queue offsets the log would assign.
fn messages() -> Vec<(Message, u64)> {
    let mut hello = Message::new("TopicTest", 0, &b"hello rocketgate"[..])
        .with_tags("TagA")
        .with_keys(["order-1", "user-7"])
        .with_property(
            property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
            "0A000001000018B4AAC2",
        );
    hello.born_timestamp = 1_700_000_000_000;
    hello.born_host = "192.168.1.10:50000".parse().unwrap();

    let mut empty = Message::new("TopicTest", 1, Bytes::new())
        .with_tags("TagB")
        .with_property(property::DELAY_TIME_LEVEL, "3");
    empty.born_timestamp = 1_700_000_000_100;
    empty.born_host = "192.168.1.10:50000".parse().unwrap();

    let mut binary = Message::new("sensors", 0, NON_UTF8)
        .with_tags("room1/temp")
        .with_property("region", "eu")
        .with_property(property::TRANSACTION_PREPARED, "true")
        .with_property(property::PRODUCER_GROUP, "pg-1")
        .with_property(property::START_DELIVER_TIME, "1700000005000");
    binary.sys_flag = sys_flag::TRANSACTION_PREPARED_TYPE;
    binary.born_timestamp = 1_700_000_000_200;
    binary.born_host = "[2001:db8::42]:40000".parse().unwrap();

    let mut retry = Message::new("TopicTest", 0, &b"retry me"[..]).with_tags("TagA");
    retry.flag = 5;
    retry.reconsume_times = 3;
    retry.prepared_transaction_offset = 777;
    retry.born_timestamp = 1_700_000_000_300;
    retry.born_host = "192.168.1.11:50001".parse().unwrap();

    vec![(hello, 0), (empty, 0), (binary, 0), (retry, 1)]
}

/// Builds the fixture segment with the current encoder: the records back to
/// back from offset 0, then a blank filler to the end of the segment.
fn build_fixture() -> Vec<u8> {
    let mut seg = Vec::with_capacity(SEGMENT_SIZE);
    for (msg, queue_offset) in messages() {
        let start = seg.len();
        let enc = record::encode(&msg, &store_host(), &mut seg).unwrap();
        let stamp = Stamp {
            queue_offset,
            phys_offset: start as u64,
            store_timestamp: STORE_TS,
        };
        enc.stamp(&mut seg[start..], &stamp).unwrap();
    }
    let mut blank = [0u8; 8];
    record::write_blank(&mut blank, (SEGMENT_SIZE - seg.len()) as u32);
    seg.extend_from_slice(&blank);
    seg.resize(SEGMENT_SIZE, 0);
    seg
}

#[test]
fn encoder_still_produces_the_fixture_bytes() {
    if std::env::var_os("ROCKETGATE_REGENERATE_FIXTURES").is_some() {
        // A deliberate format change: rewrite the fixture, then check it as usual.
        std::fs::write(fixture_path(), build_fixture()).unwrap();
    }
    let on_disk = std::fs::read(fixture_path()).unwrap();
    assert!(
        on_disk == build_fixture(),
        "the encoder no longer produces tests/fixtures/segment-v1.bin: \
         a storage format change must be deliberate (see the module docs)"
    );
}

#[test]
fn decoder_reads_every_field_of_the_fixture() {
    let seg = std::fs::read(fixture_path()).unwrap();
    assert_eq!(seg.len(), SEGMENT_SIZE);
    let mut pos = 0;
    for (i, (msg, queue_offset)) in messages().into_iter().enumerate() {
        let view = record::decode(&seg[pos..]).unwrap();
        view.verify_strict().unwrap();
        assert_eq!(view.phys_offset(), pos as i64, "record {i}");
        assert_eq!(view.queue_offset(), queue_offset as i64);
        assert_eq!(view.store_timestamp(), STORE_TS);
        assert_eq!(view.store_host(), store_host());
        assert_eq!(view.topic(), msg.topic);
        assert_eq!(view.queue_id(), msg.queue_id as i32);
        assert_eq!(view.flag(), msg.flag);
        assert_eq!(view.body(), &msg.body[..]);
        assert_eq!(view.born_timestamp(), msg.born_timestamp);
        assert_eq!(view.born_host(), msg.born_host);
        assert_eq!(view.reconsume_times(), msg.reconsume_times);
        assert_eq!(
            view.prepared_transaction_offset(),
            msg.prepared_transaction_offset
        );
        assert_eq!(view.tags(), msg.tags());
        assert_eq!(
            view.keys().collect::<Vec<_>>(),
            msg.keys().collect::<Vec<_>>()
        );
        assert_eq!(view.to_message(), msg);
        pos += view.total_size() as usize;
    }
    // Spot checks against literal values, independent of `messages()`.
    let first = RecordView::parse(&seg).unwrap();
    assert_eq!(first.keys().collect::<Vec<_>>(), ["order-1", "user-7"]);
    assert_eq!(first.body(), b"hello rocketgate");
    let second = RecordView::parse(&seg[first.total_size() as usize..]).unwrap();
    assert!(second.body().is_empty());
    assert_eq!(second.property("DELAY"), Some("3"));
    let third_at = (first.total_size() + second.total_size()) as usize;
    let third = RecordView::parse(&seg[third_at..]).unwrap();
    assert_eq!(third.body(), NON_UTF8);
    assert_eq!(third.topic(), "sensors");
    assert_eq!(third.tags(), Some("room1/temp"));
    assert_eq!(third.property("__STARTDELIVERTIME"), Some("1700000005000"));
    assert_eq!(
        third.sys_flag(),
        sys_flag::TRANSACTION_PREPARED_TYPE | sys_flag::BORNHOST_V6_FLAG
    );
    assert_eq!(&seg[4..8], &[0xDA, 0xA3, 0x20, 0xA7]);

    assert_eq!(
        read_header(&seg[pos..]),
        Ok(Header::Blank {
            size: (SEGMENT_SIZE - pos) as u32
        })
    );
    assert_eq!(&seg[pos + 4..pos + 8], &[0xCB, 0xD4, 0x31, 0x94]);
    assert!(seg[pos + 8..].iter().all(|b| *b == 0));
}

#[test]
fn commit_log_opens_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture_path(), dir.path().join("00000000000000000000")).unwrap();
    let config = CommitLogSettings {
        segment_size: SEGMENT_SIZE as u64,
        max_message_size: 4096,
        write_through: false,
        store_host: store_host(),
    };
    let (log, report) = CommitLog::open(dir.path(), config.clone(), Recovery::Full).unwrap();
    assert_eq!(report.records_scanned, 4);
    assert_eq!(report.recovered_end, SEGMENT_SIZE as u64);
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(report.next_queue_offsets[&("TopicTest".to_owned(), 0)], 2);
    assert_eq!(report.next_queue_offsets[&("sensors".to_owned(), 0)], 1);
    let seg = std::fs::read(fixture_path()).unwrap();
    let records: Vec<_> = log.records_from(0).map(Result::unwrap).collect();
    assert_eq!(records.len(), 4);
    for r in &records {
        let at = r.phys_offset() as usize;
        assert_eq!(&r[..], &seg[at..at + r.len()]);
    }
    // The next append starts the next segment, continuing the queue offsets.
    let next = log
        .append(&Message::new("TopicTest", 0, &b"after"[..]))
        .unwrap();
    assert_eq!(next.phys_offset, SEGMENT_SIZE as u64);
    assert_eq!(next.queue_offset, 2);
}

#[test]
fn decoder_never_panics_on_random_or_damaged_bytes() {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let valid = build_fixture();
    let first_len = RecordView::parse(&valid).unwrap().total_size() as usize;
    let records_end = valid.len() - 8 - valid.iter().rev().take_while(|b| **b == 0).count();
    for _ in 0..20_000 {
        let mut buf: Vec<u8> = match rng.random_range(0..4) {
            // Pure noise.
            0 => {
                let len = rng.random_range(0..400);
                (0..len).map(|_| rng.random()).collect()
            }
            // A valid record, truncated anywhere.
            1 => valid[..rng.random_range(0..first_len)].to_vec(),
            // Valid records with random bytes overwritten.
            2 => {
                let mut b = valid[..records_end].to_vec();
                for _ in 0..rng.random_range(1..6) {
                    let i = rng.random_range(0..b.len());
                    b[i] = rng.random();
                }
                b
            }
            // A plausible header (message magic, random size) then noise.
            _ => {
                let mut b: Vec<u8> = (0..rng.random_range(8..300))
                    .map(|_| rng.random())
                    .collect();
                let size: i32 = rng.random_range(-10..400);
                b[..4].copy_from_slice(&size.to_be_bytes());
                b[4..8].copy_from_slice(&record::MESSAGE_MAGIC_CODE.to_be_bytes());
                b
            }
        };
        if rng.random_bool(0.3) {
            let cut = rng.random_range(0..=buf.len());
            buf.truncate(cut);
        }
        let _ = read_header(&buf);
        if let Ok(view) = RecordView::parse(&buf) {
            // Every accessor must be safe on whatever parsed.
            let _ = (view.verify(), view.verify_strict(), view.to_message());
            let _ = (view.born_host(), view.store_host(), view.keys().count());
        }
        let _ = record::decode_msg_id(&String::from_utf8_lossy(&buf));
    }
}
