//! The broker's sense of time, injectable so that heartbeat expiry, queue-lock
//! leases and offset resets by timestamp are tested without sleeping.
//!
//! Wall-clock milliseconds since the epoch, the unit RocketMQ uses everywhere
//! (store timestamps, heartbeats, lock leases). Long polling does not use this
//! clock: it waits on tokio time, so `tokio::time::pause()` drives it in tests.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A source of wall-clock milliseconds.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Self {
        ManualClock {
            now: AtomicI64::new(start_ms),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }

    pub fn set(&self, now_ms: i64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}
