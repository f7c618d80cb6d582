//! One queue's consumption progress in the push consumer: what was pulled, what is
//! still being consumed, and so which offset may be committed.

use rocketgate_core::sync::lock;
use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::Notify;

/// Offsets of one queue: pulled up to `next`, `inflight` not yet consumed.
#[derive(Default)]
pub(super) struct Offsets {
    pub next: u64,
    pub inflight: BTreeSet<u64>,
}

/// One queue's consumption progress. Std lock, set operations only.
pub(super) struct Progress {
    pub offsets: Mutex<Offsets>,
    /// Signalled whenever consumption finishes a batch (flow control waits on it).
    pub consumed: Notify,
}

impl Progress {
    pub fn new(start: u64) -> Self {
        Progress {
            offsets: Mutex::new(Offsets {
                next: start,
                inflight: BTreeSet::new(),
            }),
            consumed: Notify::new(),
        }
    }

    pub fn committable(&self) -> u64 {
        let o = lock(&self.offsets);
        o.inflight.first().copied().unwrap_or(o.next)
    }

    pub fn cached(&self) -> usize {
        lock(&self.offsets).inflight.len()
    }

    pub fn done(&self, offsets: impl IntoIterator<Item = u64>) {
        let mut o = lock(&self.offsets);
        for off in offsets {
            o.inflight.remove(&off);
        }
        drop(o);
        self.consumed.notify_waiters();
    }
}
