//! Latency percentiles and peak memory for benchmark reports.

use std::time::Duration;

/// Per-operation latencies in nanoseconds; percentiles by sorting (exact, fine for
/// the few million samples a run takes).
#[derive(Debug, Default)]
pub struct Latencies(Vec<u64>);

impl Latencies {
    pub fn with_capacity(n: usize) -> Self {
        Latencies(Vec::with_capacity(n))
    }

    pub fn record(&mut self, d: Duration) {
        self.0.push(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn merge(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    /// Sorts and returns (p50, p99, p999, max).
    pub fn summary(&mut self) -> Summary {
        self.0.sort_unstable();
        let at = |q: f64| -> Duration {
            if self.is_empty() {
                return Duration::ZERO;
            }
            let i = ((self.0.len() as f64 - 1.0) * q).round() as usize;
            Duration::from_nanos(self.0[i])
        };
        Summary {
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: at(1.0),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
}

/// Peak resident memory of this process (Linux `VmHWM`), resettable between scenarios.
pub struct PeakRss;

impl PeakRss {
    /// Resets the high-water mark to the current RSS (Linux ≥ 4.0; ignored elsewhere).
    pub fn reset() {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }

    /// Peak RSS in bytes since start or the last reset; 0 when unknown.
    pub fn bytes() -> u64 {
        let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
            return 0;
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    }
}

pub fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1}µs")
    } else {
        format!("{:.2}ms", us / 1000.0)
    }
}

pub fn fmt_bytes(b: u64) -> String {
    let mib = b as f64 / (1024.0 * 1024.0);
    format!("{mib:.0}MiB")
}

/// Resident memory of another process (Linux `VmRSS`).
pub(crate) fn rss_of(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS")
}

/// A field of `/proc/PID/status` in bytes (`VmRSS`, `RssAnon`).
pub(crate) fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// This process's open-file limit (`None`: unlimited or unknown).
pub(crate) fn fd_limit() -> Option<u64> {
    // SAFETY: getrlimit with a valid, initialised struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur != libc::RLIM_INFINITY)
            .then_some(lim.rlim_cur)
    }
}

/// Another process's soft open-file limit, from `/proc/PID/limits`.
pub(crate) fn fd_limit_of(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Many connections need many descriptors: raise the soft limit to the hard one.
pub(crate) fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut l = Latencies::default();
        for i in 1..=1000u64 {
            l.record(Duration::from_micros(i));
        }
        let s = l.summary();
        assert_eq!(s.p50, Duration::from_micros(501));
        assert_eq!(s.p99, Duration::from_micros(990));
        assert_eq!(s.max, Duration::from_micros(1000));
    }
}
