//! The crash test: a child process appends under `sync` flush and prints every
//! acknowledged message; the parent kills it with SIGKILL at a random moment, reopens
//! the store, and checks that every acknowledged message is there with the right bytes.
//! Repeated for many cycles on the same data directory.
//!
//! The child is this same test binary, re-executed to run only `crash_child` with an
//! environment variable that tells it where to write.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rocketgate_core::store::{FlushMode, Message, RecordView, Store, StoreDeps, StoreSettings};

const CHILD_DIR: &str = "RG_TEST_CRASH_CHILD_DIR";
const CHILD_START: &str = "RG_TEST_CRASH_CHILD_START";
const QUEUES: u32 = 3;

fn options() -> StoreSettings {
    StoreSettings {
        segment_size: 64 * 1024,
        max_message_size: 16 * 1024,
        flush: FlushMode::Sync {
            timeout: Duration::from_secs(10),
        },
        checkpoint_interval: Duration::from_millis(30),
        consume_queue_entries_per_file: 64,
        index_slots: 64,
        index_entries_per_file: 256,
        ..StoreSettings::default()
    }
}

/// The body of message `i`: deterministic, 0 to ~3 KiB, binary.
fn body(i: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(i);
    let len = if i.is_multiple_of(17) {
        0
    } else {
        rng.random_range(1..3000)
    };
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    b
}

fn message(i: u64) -> Message {
    Message::new("crash", (i % QUEUES as u64) as u32, body(i)).with_keys([format!("k{i}")])
}

/// Runs only when re-executed by the parent test: appends until killed.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let start: u64 = std::env::var(CHILD_START).unwrap().parse().unwrap();
    let (store, _) = Store::open(Path::new(&dir), options(), StoreDeps::fixed_usage(0.1)).unwrap();
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for i in start.. {
        let r = store.put(&message(i)).unwrap();
        writeln!(out, "ACK {i} {} {}", i % QUEUES as u64, r.queue_offset).unwrap();
        out.flush().unwrap();
    }
}

struct Ack {
    i: u64,
    queue: u32,
    offset: u64,
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut it = line.strip_prefix("ACK ")?.split(' ');
    Some(Ack {
        i: it.next()?.parse().ok()?,
        queue: it.next()?.parse().ok()?,
        offset: it.next()?.parse().ok()?,
    })
}

#[test]
fn sigkill_during_sync_appends_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC0FFEE);
    let mut acked: Vec<Ack> = Vec::new();
    let mut next = 0u64;
    const CYCLES: usize = 24;
    for cycle in 0..CYCLES {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, dir.path())
            .env(CHILD_START, next.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(a) = parse_ack(&line) {
                    let _ = tx.send(a);
                }
            }
        });
        // Wait for the child to be appending, then kill it at a random moment.
        let first = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("cycle {cycle}: the child never acknowledged a message"));
        let mut got = vec![first];
        std::thread::sleep(Duration::from_millis(rng.random_range(0..80)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        got.extend(rx.try_iter());
        next = got.iter().map(|a| a.i).max().unwrap() + 1;
        acked.extend(got);

        // Reopen as a restarted broker would and check every acknowledged message.
        let (store, report) =
            Store::open(dir.path(), options(), StoreDeps::fixed_usage(0.1)).unwrap();
        assert!(
            report.unclean_shutdown,
            "cycle {cycle}: the kill must look unclean"
        );
        for a in &acked {
            let read = store.read_queue("crash", a.queue, a.offset, 1).unwrap();
            let (off, entry) = read.entries.first().unwrap_or_else(|| {
                panic!(
                    "cycle {cycle}: acked message {} (queue {} offset {}) is gone",
                    a.i, a.queue, a.offset
                )
            });
            assert_eq!(*off, a.offset);
            let rec = store.read_entry(entry).unwrap();
            let view = RecordView::parse(&rec).unwrap();
            assert_eq!(
                view.body(),
                &body(a.i)[..],
                "cycle {cycle}: message {} has other bytes",
                a.i
            );
            assert_eq!(view.queue_offset() as u64, a.offset);
        }
        // Nothing corrupt is served anywhere in the queues.
        for q in 0..QUEUES {
            let (min, max) = store.queue_bounds("crash", q);
            let read = store
                .read_queue("crash", q, min, (max - min) as usize)
                .unwrap();
            assert_eq!(read.entries.len() as u64, max - min);
            for (_, e) in &read.entries {
                let rec = store.read_entry(e).unwrap();
                RecordView::parse(&rec).unwrap();
            }
        }
        store.close().unwrap();
    }
    assert!(acked.len() >= CYCLES, "every cycle acknowledged something");
}
