//! Live heap of a server under test, for the memory-per-connection tests (issue
//! #33): a counting global allocator that counts only the threads of a runtime
//! built by [`server_runtime`], so the clients on the test's own thread are not
//! counted. A test binary installs it with
//! `#[global_allocator] static GLOBAL: Counting = Counting;`.
//!
//! Beside the live bytes it counts live allocations by size (16-byte steps), so a
//! test that fails can say which allocation grew.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

thread_local! {
    /// Set on the server runtime's threads.
    static SERVER: Cell<bool> = const { Cell::new(false) };
}

/// Live bytes allocated (minus freed) on server threads.
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// Live allocations by size in 16-byte steps (the last slot: 16 KiB and more).
const SLOTS: usize = 1025;
static BY_SIZE: [AtomicIsize; SLOTS] = [const { AtomicIsize::new(0) }; SLOTS];

fn counted() -> bool {
    SERVER.try_with(Cell::get).unwrap_or(false)
}

fn add(size: usize, n: isize) {
    LIVE.fetch_add(size as isize * n, Ordering::Relaxed);
    BY_SIZE[size.div_ceil(16).min(SLOTS - 1)].fetch_add(n, Ordering::Relaxed);
}

/// The system allocator, counting what the server runtime's threads hold.
pub struct Counting;

// SAFETY: every call is passed unchanged to `System`; the counting touches only
// atomics and a thread-local flag, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted() {
            add(layout.size(), 1);
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counted() {
            add(layout.size(), -1);
        }
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counted() {
            add(layout.size(), -1);
            add(new_size, 1);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// A two-thread runtime whose threads are the counted ones.
pub fn server_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| SERVER.with(|s| s.set(true)))
        .enable_all()
        .build()
        .unwrap()
}

/// The counted threads' live heap: bytes, and allocations by size.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub bytes: isize,
    by_size: Vec<isize>,
}

impl Snapshot {
    fn now() -> Snapshot {
        Snapshot {
            bytes: LIVE.load(Ordering::Relaxed),
            by_size: BY_SIZE.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        }
    }

    /// The live heap once what the test set off has settled: the same figures
    /// twice 200 ms apart (a loaded machine runs the server late).
    pub fn settled() -> Snapshot {
        let mut last = Snapshot::now();
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(200));
            let now = Snapshot::now();
            if now == last {
                break;
            }
            last = now;
        }
        last
    }

    /// The allocations `n` connections opened between `before` and `self` each
    /// hold, by size (those at least 0.9 per connection; the rest is the maps'
    /// amortised growth), one line each.
    pub fn per_connection_table(&self, before: &Snapshot, n: usize) -> String {
        let mut table = String::new();
        for (s, (a, b)) in self.by_size.iter().zip(&before.by_size).enumerate() {
            let count = (a - b) as f64 / n as f64;
            if count.abs() >= 0.9 {
                table.push_str(&format!(
                    "\n  {:>5.2} × {}–{} B",
                    count,
                    s * 16 - 15,
                    s * 16
                ));
            }
        }
        table
    }
}
