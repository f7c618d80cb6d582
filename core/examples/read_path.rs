//! CPU per message of a consumer's catch-up read, the two ways the store offers
//! (docs/reliability.md, "Figures"): `read_queue` (every entry verified in the
//! queue read) then `read_entry` and a parse for the filter, as the pull and POP
//! scans did; and `read_queue_entries` then `read_queued`, which verifies each
//! record once where it is read and runs the filter on that parse, as they do
//! now. Measured in the thread's own CPU time, so a busy machine changes little.
//!
//! `cargo run --release -p rocketgate-core --example read_path [MESSAGES] [BODY_BYTES]`

use std::time::Duration;

use rocketgate_core::store::{FlushMode, Message, RecordView, Store, StoreDeps, StoreSettings};

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain syscall writing into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const BATCH: usize = 32;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let size: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1024);
    let dir = tempfile::tempdir().unwrap();
    let settings = StoreSettings {
        segment_size: 256 << 20,
        flush: FlushMode::Async {
            interval: Duration::from_millis(100),
        },
        index_slots: 1 << 16,
        index_entries_per_file: 1 << 20,
        ..StoreSettings::default()
    };
    let (store, _) = Store::open(dir.path(), settings, StoreDeps::fixed_usage(0.1)).unwrap();
    let body = vec![b'x'; size];
    let batch: Vec<Message> = (0..100)
        .map(|_| Message::new("t", 0, body.clone()).with_tags("TagA"))
        .collect();
    for _ in 0..n / 100 {
        store.put_batch(&batch).unwrap();
    }
    assert!(store.wait_dispatched(Duration::from_secs(60)));
    let (_, max) = store.queue_bounds("t", 0);

    let before = |store: &Store| {
        let mut at = 0;
        let mut seen = 0u64;
        while at < max {
            let read = store.read_queue("t", 0, at, BATCH).unwrap();
            for (_, e) in &read.entries {
                let rec = store.read_entry(e).unwrap();
                let v = RecordView::parse(&rec).unwrap();
                seen += u64::from(v.tags() == Some("TagA"));
            }
            at = read.next_offset;
        }
        seen
    };
    let after = |store: &Store| {
        let mut at = 0;
        let mut seen = 0u64;
        while at < max {
            let read = store.read_queue_entries("t", 0, at, BATCH).unwrap();
            for (qoff, e) in &read.entries {
                let found = store
                    .read_queued("t", 0, *qoff, e, |v| v.tags() == Some("TagA"))
                    .unwrap();
                seen += u64::from(found.is_some_and(|(_, m)| m));
            }
            at = read.next_offset;
        }
        seen
    };
    let mut b = Vec::new();
    let mut a = Vec::new();
    for _ in 0..5 {
        let t = thread_cpu_ns();
        assert_eq!(before(&store), max);
        b.push((thread_cpu_ns() - t) as f64 / max as f64);
        let t = thread_cpu_ns();
        assert_eq!(after(&store), max);
        a.push((thread_cpu_ns() - t) as f64 / max as f64);
    }
    b.sort_by(f64::total_cmp);
    a.sort_by(f64::total_cmp);
    println!(
        "{max} messages of {size} B, batches of {BATCH}, thread CPU ns/message (median of 5, min..max):\n  \
         read_queue + read_entry + parse (before): {:.0} ({:.0}..{:.0})\n  \
         read_queue_entries + read_queued (after): {:.0} ({:.0}..{:.0})\n  after/before: {:.2}",
        b[2],
        b[0],
        b[4],
        a[2],
        a[0],
        a[4],
        a[2] / b[2]
    );
}
