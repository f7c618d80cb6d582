//! The offline check and repair (`store::check`, behind `rocketgate verify` /
//! `repair`) on damage the binary test does not cover: the record structure
//! broken *inside* the log (later segments hold data), and index entries. The
//! binary test (`tests/reliability.rs`) covers a damaged record, a bad tail and
//! a wrong consume-queue entry.

use std::path::Path;
use std::time::Duration;

use rocketgate_core::store::check::{repair, verify};
use rocketgate_core::store::{FlushMode, Message, RecordView, Store, StoreDeps, StoreSettings};

fn settings() -> StoreSettings {
    StoreSettings {
        segment_size: 64 * 1024,
        max_message_size: 8 * 1024,
        flush: FlushMode::Sync {
            timeout: Duration::from_secs(10),
        },
        consume_queue_entries_per_file: 256,
        index_slots: 16,
        index_entries_per_file: 1024,
        ..StoreSettings::default()
    }
}

fn bodies(dir: &Path) -> Vec<String> {
    let (store, _) = Store::open(dir, settings(), StoreDeps::fixed_usage(0.1)).unwrap();
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    let (min, max) = store.queue_bounds("c", 0);
    let read = store.read_queue("c", 0, min, (max - min) as usize).unwrap();
    let out = read
        .entries
        .iter()
        .map(|(_, e)| {
            let rec = store.read_entry(e).unwrap();
            let v = RecordView::parse(&rec).unwrap();
            String::from_utf8_lossy(&v.body()[..8]).into_owned()
        })
        .collect();
    store.close().unwrap();
    out
}

/// Record `i`: `m0000017` and filler, ~2 KiB, keyed for the index.
fn message(i: usize) -> Message {
    let mut body = format!("m{i:07}").into_bytes();
    body.resize(2000, b'.');
    Message::new("c", 0, body).with_keys([format!("k{i}")])
}

#[test]
fn a_broken_structure_inside_the_log_is_quarantined_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), settings(), StoreDeps::fixed_usage(0.1)).unwrap();
    let mut phys = Vec::new();
    for i in 0..80 {
        phys.push(store.put(&message(i)).unwrap().phys_offset);
    }
    assert!(store.wait_dispatched(Duration::from_secs(10)));
    store.close().unwrap();
    drop(store);
    let clean = verify(dir.path(), &settings()).unwrap();
    assert_eq!(clean.problems(), 0, "{}", clean.to_text());
    assert!(clean.segments >= 3, "{}", clean.to_text());
    assert!(clean.index_entries >= 80, "{}", clean.to_text());

    // Break the header (size and magic) of record 10, in the first segment.
    let seg0 = dir.path().join("commitlog").join(format!("{:020}", 0));
    let mut bytes = std::fs::read(&seg0).unwrap();
    let at = phys[10] as usize;
    bytes[at..at + 8].copy_from_slice(&[0x7f; 8]);
    std::fs::write(&seg0, &bytes).unwrap();

    let found = verify(dir.path(), &settings()).unwrap();
    assert_eq!(found.unreadable.len(), 1, "{}", found.to_text());
    assert!(!found.unreadable[0].tail, "{}", found.to_text());
    assert!(found.problems() > 0);

    let report = repair(dir.path(), &settings()).unwrap();
    assert!(
        report.actions.iter().any(|a| a.contains("a filler")),
        "{:?}",
        report.actions
    );
    let after = verify(dir.path(), &settings()).unwrap();
    assert_eq!(after.problems(), 0, "{}", after.to_text());
    assert!(dir.path().join("quarantine").read_dir().unwrap().count() >= 1);

    // Records 0..10 and everything of the later segments are served; the rest
    // of the first segment is in quarantine.
    let got = bodies(dir.path());
    let first_of_seg1 = phys.iter().position(|p| *p >= 64 * 1024).unwrap();
    let mut want: Vec<String> = (0..10).map(|i| format!("m{i:07}")).collect();
    want.extend((first_of_seg1..80).map(|i| format!("m{i:07}")));
    assert_eq!(got, want);
    // And the log takes appends after a repair.
    let (store, _) = Store::open(dir.path(), settings(), StoreDeps::fixed_usage(0.1)).unwrap();
    store.put(&message(80)).unwrap();
    store.close().unwrap();
}
