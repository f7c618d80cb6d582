//! Key index behaviour an admin "find this message" query would notice:
//! collisions, time ranges, rolling, restart, re-indexing and retention.

use std::path::Path;
use std::sync::Arc;

use rocketgate_core::Error;
use rocketgate_core::store::index::IndexStore;

const T0: i64 = 1_700_000_000_000;
const SLOTS: u32 = 8;
const ENTRIES: u32 = 16;

fn open(root: &Path) -> IndexStore {
    IndexStore::open(root, SLOTS, ENTRIES).unwrap()
}

fn all(ix: &IndexStore, key: &str) -> Vec<u64> {
    ix.query("T", key, i64::MIN, i64::MAX, usize::MAX).unwrap()
}

fn index_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(root.join("index"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn put_and_query_with_slot_collisions() {
    let dir = tempfile::tempdir().unwrap();
    let ix = open(dir.path());
    assert_eq!(ix.max_phys_offset(), None);
    // 12 keys in 8 slots: chains share slots.
    for i in 0..12u64 {
        ix.put("T", &format!("order-{i}"), i * 100, T0 + i as i64 * 1000)
            .unwrap();
    }
    for i in 0..12u64 {
        assert_eq!(all(&ix, &format!("order-{i}")), vec![i * 100], "order-{i}");
    }
    assert!(all(&ix, "order-99").is_empty());
    // The topic is part of the key.
    assert!(
        ix.query("U", "order-1", i64::MIN, i64::MAX, 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(ix.max_phys_offset(), Some(1100));
}

#[test]
fn same_key_many_messages_newest_first_and_max() {
    let dir = tempfile::tempdir().unwrap();
    let ix = open(dir.path());
    for i in 0..6u64 {
        ix.put("T", "k", i * 10, T0 + i as i64).unwrap();
        ix.put("T", "other", i * 10 + 5, T0 + i as i64).unwrap();
    }
    assert_eq!(all(&ix, "k"), vec![50, 40, 30, 20, 10, 0]);
    assert_eq!(
        ix.query("T", "k", i64::MIN, i64::MAX, 2).unwrap(),
        vec![50, 40]
    );
    // Empty keys are not indexed.
    ix.put("T", "", 999, T0).unwrap();
    assert!(all(&ix, "").is_empty());
}

#[test]
fn hash_collisions_are_candidates_for_the_caller_to_confirm() {
    let dir = tempfile::tempdir().unwrap();
    let ix = open(dir.path());
    // "Aa" and "BB" have the same Java hashCode, so "T#Aa" and "T#BB" too.
    ix.put("T", "Aa", 1, T0).unwrap();
    ix.put("T", "BB", 2, T0).unwrap();
    assert_eq!(all(&ix, "Aa"), vec![2, 1]);
    assert_eq!(all(&ix, "BB"), vec![2, 1]);
}

#[test]
fn time_range_filtering() {
    let dir = tempfile::tempdir().unwrap();
    let ix = open(dir.path());
    // One message a minute for 10 minutes, all with the same key.
    for i in 0..10u64 {
        ix.put("T", "k", i, T0 + i as i64 * 60_000).unwrap();
    }
    let q = |b: i64, e: i64| ix.query("T", "k", b, e, 100).unwrap();
    assert_eq!(q(T0 + 120_000, T0 + 240_000), vec![4, 3, 2]);
    assert_eq!(q(T0 + 121_000, T0 + 239_999), vec![3]);
    // Times are kept in whole seconds: a message up to 999 ms before the range
    // is still a candidate (callers confirm with the stored timestamp).
    assert_eq!(q(T0 + 120_500, T0 + 239_999), vec![3, 2]);
    assert!(q(T0 - 10_000, T0 - 1_000).is_empty());
    assert!(q(T0 + 600_000, T0 + 700_000).is_empty());
    assert_eq!(q(T0 + 540_000, i64::MAX), vec![9]);
}

#[test]
fn rolls_to_new_files_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ix = open(dir.path());
        // 40 entries at 16 per file: 3 files, all created within the same ms.
        for i in 0..40u64 {
            ix.put("T", &format!("k{}", i % 5), i * 10, T0).unwrap();
        }
        assert_eq!(ix.file_count(), 3);
        ix.flush().unwrap();
    }
    let files = index_files(dir.path());
    let names: Vec<_> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        vec![
            format!("{:020}", T0),
            format!("{:020}", T0 + 1),
            format!("{:020}", T0 + 2)
        ]
    );
    let size = 40 + 4 * SLOTS as u64 + 20 * ENTRIES as u64;
    for f in &files {
        assert_eq!(std::fs::metadata(f).unwrap().len(), size);
    }

    let ix = open(dir.path());
    assert_eq!(ix.file_count(), 3);
    let want: Vec<u64> = (0..40u64)
        .rev()
        .filter(|i| i % 5 == 3)
        .map(|i| i * 10)
        .collect();
    assert_eq!(all(&ix, "k3"), want);
    assert_eq!(ix.max_phys_offset(), Some(390));
    // Writing resumes in the last, partly filled file.
    ix.put("T", "k3", 400, T0 + 5).unwrap();
    assert_eq!(ix.file_count(), 3);
    assert_eq!(all(&ix, "k3")[0], 400);
}

#[test]
fn reindexing_after_a_crash_does_not_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ix = open(dir.path());
        for i in 0..10u64 {
            ix.put("T", "k", i * 10, T0 + i as i64).unwrap();
        }
    }
    let ix = open(dir.path());
    let from = ix.max_phys_offset().unwrap();
    assert_eq!(from, 90);
    // The store re-dispatches from a checkpoint a bit earlier than that.
    for i in 7..14u64 {
        ix.put("T", "k", i * 10, T0 + i as i64).unwrap();
    }
    let want: Vec<u64> = (0..14u64).rev().map(|i| i * 10).collect();
    assert_eq!(all(&ix, "k"), want);
    // Skipped re-puts used no space: 14 entries still fit in the first file.
    assert_eq!(ix.file_count(), 1);

    // A duplicate that lands in a newer file (after a roll) is removed by query.
    for i in 14..16u64 {
        ix.put("T", "k", i * 10, T0).unwrap();
    }
    ix.put("T", "j", 0, T0).unwrap(); // rolls
    ix.put("T", "k", 150, T0).unwrap();
    assert_eq!(ix.file_count(), 2);
    assert_eq!(all(&ix, "k").iter().filter(|&&p| p == 150).count(), 1);
}

#[test]
fn retention_deletes_old_files_but_never_the_active_one() {
    let dir = tempfile::tempdir().unwrap();
    let ix = open(dir.path());
    for i in 0..40u64 {
        ix.put("T", "k", i * 10, T0 + i as i64 * 1000).unwrap();
    }
    assert_eq!(ix.file_count(), 3); // phys 0..=150, 160..=310, 320..=390
    assert_eq!(ix.delete_files_before_phys(150).unwrap(), 0);
    assert_eq!(ix.delete_files_before_phys(151).unwrap(), 1);
    assert_eq!(index_files(dir.path()).len(), 2);
    assert_eq!(all(&ix, "k").last(), Some(&160));
    assert_eq!(ix.delete_files_before_phys(u64::MAX).unwrap(), 1);
    assert_eq!(ix.file_count(), 1);
    assert_eq!(all(&ix, "k").len(), 8);
    assert_eq!(ix.max_phys_offset(), Some(390));
    drop(ix);
    assert_eq!(open(dir.path()).file_count(), 1);
}

#[test]
fn wrong_size_or_bad_header_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ix = open(dir.path());
        ix.put("T", "k", 1, T0).unwrap();
        ix.flush().unwrap();
    }
    let path = index_files(dir.path()).remove(0);

    // Header: begin ts, end ts, begin phys, end phys, slots used, count.
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[0..8], &T0.to_be_bytes());
    assert_eq!(&bytes[8..16], &T0.to_be_bytes());
    assert_eq!(&bytes[16..24], &1i64.to_be_bytes());
    assert_eq!(&bytes[24..32], &1i64.to_be_bytes());
    assert_eq!(&bytes[32..40], &[0, 0, 0, 1, 0, 0, 0, 1]);

    // Opened with other sizes than it was written with.
    match IndexStore::open(dir.path(), SLOTS * 2, ENTRIES) {
        Err(Error::Corrupt { path: p, .. }) => assert_eq!(p, path),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // An entry count beyond the file's capacity.
    let mut bad = bytes.clone();
    bad[36..40].copy_from_slice(&(ENTRIES as i32 + 1).to_be_bytes());
    std::fs::write(&path, &bad).unwrap();
    assert!(matches!(
        IndexStore::open(dir.path(), SLOTS, ENTRIES),
        Err(Error::Corrupt { .. })
    ));
    // Time range running backwards.
    let mut bad = bytes.clone();
    bad[8..16].copy_from_slice(&(T0 - 1).to_be_bytes());
    std::fs::write(&path, &bad).unwrap();
    assert!(matches!(
        IndexStore::open(dir.path(), SLOTS, ENTRIES),
        Err(Error::Corrupt { .. })
    ));
    // A chain pointing at itself does not hang a query.
    let mut bad = bytes.clone();
    let entry1 = 40 + 4 * SLOTS as usize;
    bad[entry1 + 16..entry1 + 20].copy_from_slice(&1i32.to_be_bytes());
    std::fs::write(&path, &bad).unwrap();
    let ix = open(dir.path());
    assert_eq!(all(&ix, "k"), vec![1]);

    assert!(matches!(
        IndexStore::open(dir.path(), 0, ENTRIES),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn concurrent_queries_see_complete_entries() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(IndexStore::open(dir.path(), 64, 256).unwrap());
    const N: u64 = 2_000;
    let reader = {
        let ix = ix.clone();
        std::thread::spawn(move || {
            let mut last = 0;
            while last < 100 {
                // Key "k" is put every 20 messages at phys i * 7.
                let got = ix.query("T", "k", i64::MIN, i64::MAX, usize::MAX).unwrap();
                for p in &got {
                    assert_eq!(p % (20 * 7), 0, "torn or foreign phys {p}");
                }
                assert!(got.windows(2).all(|w| w[0] > w[1]), "newest first");
                last = got.len();
                std::thread::yield_now();
            }
        })
    };
    for i in 0..N {
        let key = if i % 20 == 0 {
            "k".to_string()
        } else {
            format!("x{i}")
        };
        ix.put("T", &key, i * 7, T0 + i as i64).unwrap();
    }
    reader.join().unwrap();
}
