//! The one clock of the core: wall-clock milliseconds since the epoch, the unit
//! RocketMQ uses everywhere (store timestamps, heartbeats, lock leases, delay
//! deadlines, retention ages). Injectable, so heartbeat expiry, queue-lock leases,
//! delayed delivery and retention are tested without sleeping.
//!
//! Long polling does not use this clock: it waits on tokio time, so
//! `tokio::time::pause()` drives it in tests. Other crates take [`now_ms`] from
//! here rather than keeping their own copy.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Milliseconds since the Unix epoch by the system clock (0 if the system clock
/// is set before 1970).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A source of wall-clock milliseconds. Any `Fn() -> i64` is one, so a test can
/// pass a closure over its own counter.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> i64;
}

impl<F: Fn() -> i64 + Send + Sync> Clock for F {
    fn now_ms(&self) -> i64 {
        self()
    }
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closures_manual_and_system_clocks_agree_on_the_unit() {
        let manual = ManualClock::new(1_000);
        manual.advance(Duration::from_secs(2));
        assert_eq!(manual.now_ms(), 3_000);
        let fixed = || 42_i64;
        assert_eq!(Clock::now_ms(&fixed), 42);
        // Milliseconds, not seconds or micros: after 2001 and before 2286.
        let now = SystemClock.now_ms();
        assert!(
            (1_000_000_000_000..10_000_000_000_000).contains(&now),
            "{now}"
        );
    }
}
