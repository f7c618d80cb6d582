//! Abuse limits: failed logins slow down per source address and per user name
//! (never a permanent lock-out: the delay is capped and failures are forgotten),
//! and connections per address.
//!
//! After `burst` failures in a row, each further attempt from that address or for
//! that user waits `100 ms × 2^(failures − burst)`, at most `max_delay`, before it is
//! even checked; a success clears the user's and the address's count, and a count
//! is forgotten after a minute without failures.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketgate_base::sync::lock;

const FORGET_AFTER: Duration = Duration::from_secs(60);
const MAX_TRACKED: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// Failed-login counts. One std lock, held for a map lookup.
#[derive(Debug)]
pub struct LoginLimiter {
    burst: u32,
    max_delay: Duration,
    by_addr: Mutex<HashMap<IpAddr, Failures>>,
    by_user: Mutex<HashMap<String, Failures>>,
}

impl LoginLimiter {
    pub fn new(burst: u32, max_delay: Duration) -> LoginLimiter {
        LoginLimiter {
            burst,
            max_delay,
            by_addr: Mutex::default(),
            by_user: Mutex::default(),
        }
    }

    fn delay_for(&self, f: Option<Failures>, now: Instant) -> Duration {
        match f {
            Some(f) if now.duration_since(f.last) < FORGET_AFTER && f.count >= self.burst => {
                let exp = (f.count - self.burst).min(16);
                Duration::from_millis(100u64 << exp).min(self.max_delay)
            }
            _ => Duration::ZERO,
        }
    }

    /// How long an attempt from `addr` for `user` waits before it is checked.
    pub fn delay(&self, addr: IpAddr, user: Option<&str>) -> Duration {
        let now = Instant::now();
        let a = self.delay_for(lock(&self.by_addr).get(&addr).copied(), now);
        let u = user
            .map(|u| self.delay_for(lock(&self.by_user).get(u).copied(), now))
            .unwrap_or_default();
        a.max(u)
    }

    pub fn failed(&self, addr: IpAddr, user: Option<&str>) {
        let now = Instant::now();
        fn bump<K: std::hash::Hash + Eq>(m: &mut HashMap<K, Failures>, k: K, now: Instant) {
            if m.len() >= MAX_TRACKED {
                m.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            }
            let f = m.entry(k).or_insert(Failures {
                count: 0,
                last: now,
            });
            if now.duration_since(f.last) >= FORGET_AFTER {
                f.count = 0;
            }
            f.count = f.count.saturating_add(1);
            f.last = now;
        }
        bump(&mut lock(&self.by_addr), addr, now);
        if let Some(u) = user {
            bump(&mut lock(&self.by_user), u.to_owned(), now);
        }
    }

    pub fn succeeded(&self, addr: IpAddr, user: &str) {
        lock(&self.by_addr).remove(&addr);
        lock(&self.by_user).remove(user);
    }
}

/// Open connections per address (one door's count).
#[derive(Debug, Default)]
pub struct ConnectionLimit {
    max: u32,
    open: Arc<Mutex<HashMap<IpAddr, u32>>>,
}

/// Holds one connection's place; dropping it frees the place.
#[derive(Debug)]
pub struct ConnectionSlot {
    addr: IpAddr,
    open: Option<Arc<Mutex<HashMap<IpAddr, u32>>>>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some(open) = &self.open {
            let mut m = lock(open);
            if let Some(n) = m.get_mut(&self.addr) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&self.addr);
                }
            }
        }
    }
}

impl ConnectionLimit {
    /// `max` connections per address; 0: no limit.
    pub fn new(max: u32) -> ConnectionLimit {
        ConnectionLimit {
            max,
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `addr`, or `None` when it has `max`.
    pub fn admit(&self, addr: IpAddr) -> Option<ConnectionSlot> {
        if self.max == 0 {
            return Some(ConnectionSlot { addr, open: None });
        }
        let mut m = lock(&self.open);
        let n = m.entry(addr).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(ConnectionSlot {
            addr,
            open: Some(self.open.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_slow_down_up_to_a_cap_and_success_clears() {
        let l = LoginLimiter::new(3, Duration::from_secs(2));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(l.delay(ip, Some("bob")), Duration::ZERO);
            l.failed(ip, Some("bob"));
        }
        assert_eq!(l.delay(ip, Some("bob")), Duration::from_millis(100));
        // Another address guessing bob's password is slowed too.
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(l.delay(other, Some("bob")), Duration::from_millis(100));
        for _ in 0..20 {
            l.failed(ip, Some("bob"));
        }
        assert_eq!(
            l.delay(ip, Some("bob")),
            Duration::from_secs(2),
            "capped, never a lock-out"
        );
        l.succeeded(ip, "bob");
        assert_eq!(l.delay(ip, Some("bob")), Duration::ZERO);
    }

    #[test]
    fn connections_per_address() {
        let c = ConnectionLimit::new(2);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let a = c.admit(ip).unwrap();
        let _b = c.admit(ip).unwrap();
        assert!(c.admit(ip).is_none());
        assert!(c.admit("10.0.0.2".parse().unwrap()).is_some());
        drop(a);
        assert!(c.admit(ip).is_some());
    }
}
