//! Latency percentiles and peak memory for benchmark reports.

use std::time::Duration;

/// Per-operation latencies in nanoseconds, in a log-linear histogram: exact below
/// 256 ns, then 128 buckets per power of two (a percentile is within 0.4 % of
/// the sample's value). Fixed memory, however many samples: the raw samples this
/// kept before (8 bytes each, in vectors that doubled) were most of what a
/// 1,000-subscriber fan-out generator did, first-touching fresh pages, while the
/// broker waited (docs/benchmarks.md, issue #33 fan-out).
#[derive(Debug, Default)]
pub struct Latencies {
    /// Made on the first sample ([`BUCKETS`] counters).
    counts: Vec<u32>,
    n: u64,
    max: u64,
}

/// Sub-buckets per power of two: 2^7.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
/// Values below `SUB` one bucket each, then `SUB` per power of two up to 2^64.
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB as usize;

/// The bucket of `v` (ns).
fn bucket(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let shift = 63 - v.leading_zeros() - SUB_BITS;
    let mantissa = (v >> shift) & (SUB - 1);
    (shift as usize + 1) * SUB as usize + mantissa as usize
}

/// The smallest and largest value of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    let (block, m) = ((i as u64) / SUB, (i as u64) % SUB);
    if block == 0 {
        return (m, m);
    }
    let shift = block - 1;
    let lo = (SUB + m) << shift;
    (lo, lo + ((1u64 << shift) - 1))
}

impl Latencies {
    /// `n`: the samples expected (kept for the callers that say so; the histogram's
    /// size does not depend on it).
    pub fn with_capacity(_n: usize) -> Self {
        Latencies::default()
    }

    pub fn record(&mut self, d: Duration) {
        let v = d.as_nanos().min(u64::MAX as u128) as u64;
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS];
        }
        let c = &mut self.counts[bucket(v)];
        *c = c.saturating_add(1);
        self.n += 1;
        self.max = self.max.max(v);
    }

    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn merge(&mut self, other: Latencies) {
        if other.n == 0 {
            return;
        }
        if self.counts.is_empty() {
            *self = other;
            return;
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
        self.n += other.n;
        self.max = self.max.max(other.max);
    }

    /// (p50, p99, p999, max): the sample of rank `round((n - 1) * q)` as sorting
    /// would pick it, to its bucket's middle (the max exact).
    pub fn summary(&mut self) -> Summary {
        let at = |q: f64| -> Duration {
            if self.n == 0 {
                return Duration::ZERO;
            }
            let rank = ((self.n as f64 - 1.0) * q).round() as u64;
            let mut seen = 0u64;
            for (i, &c) in self.counts.iter().enumerate() {
                seen += u64::from(c);
                if seen > rank {
                    let (lo, hi) = bounds(i);
                    return Duration::from_nanos((lo + (hi - lo) / 2).min(self.max));
                }
            }
            Duration::from_nanos(self.max)
        };
        Summary {
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: Duration::from_nanos(self.max),
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

    /// Within the histogram's resolution (half a bucket: 1/256 of the value).
    fn close(got: Duration, want: Duration) {
        let (g, w) = (got.as_nanos() as f64, want.as_nanos() as f64);
        assert!((g - w).abs() <= w / 256.0 + 1.0, "{got:?} is not {want:?}");
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut l = Latencies::default();
        for i in 1..=1000u64 {
            l.record(Duration::from_micros(i));
        }
        let s = l.summary();
        close(s.p50, Duration::from_micros(501));
        close(s.p99, Duration::from_micros(990));
        close(s.p999, Duration::from_micros(999));
        assert_eq!(s.max, Duration::from_micros(1000));
        assert_eq!(l.len(), 1000);
    }

    #[test]
    fn every_value_falls_in_its_buckets_bounds() {
        let mut prev_hi = None;
        for i in 0..BUCKETS {
            let (lo, hi) = bounds(i);
            assert!(lo <= hi);
            if let Some(p) = prev_hi {
                assert_eq!(lo, p + 1, "bucket {i} does not follow the one before");
            }
            assert_eq!(bucket(lo), i);
            assert_eq!(bucket(hi), i);
            prev_hi = Some(hi);
        }
        assert_eq!(prev_hi, Some(u64::MAX));
        for v in [0, 1, 127, 128, 255, 256, 257, 1_000_003, u64::MAX / 3] {
            let (lo, hi) = bounds(bucket(v));
            assert!(lo <= v && v <= hi, "{v} outside [{lo}, {hi}]");
        }
    }

    #[test]
    fn agrees_with_sorting_the_samples() {
        // A spread from 200 ns to ~50 ms, skewed like a latency distribution.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut samples = Vec::new();
        let (mut a, mut b) = (Latencies::default(), Latencies::default());
        for i in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = 200 + (x % 1_000) * (x % 50_000) / 1_000 * (1 + (x % 7));
            samples.push(v);
            // Two halves merged, as the generator merges its subscribers.
            if i % 2 == 0 { &mut a } else { &mut b }.record(Duration::from_nanos(v));
        }
        a.merge(b);
        samples.sort_unstable();
        let exact = |q: f64| {
            Duration::from_nanos(samples[((samples.len() as f64 - 1.0) * q).round() as usize])
        };
        let s = a.summary();
        close(s.p50, exact(0.5));
        close(s.p99, exact(0.99));
        close(s.p999, exact(0.999));
        assert_eq!(s.max, exact(1.0));
        assert_eq!(a.len(), samples.len());
    }

    #[test]
    fn empty_and_merged_into_empty() {
        let mut e = Latencies::default();
        assert_eq!(e.len(), 0);
        assert_eq!(e.summary().p99, Duration::ZERO);
        let mut one = Latencies::default();
        one.record(Duration::from_millis(3));
        e.merge(one);
        assert_eq!(e.len(), 1);
        close(e.summary().p50, Duration::from_millis(3));
    }
}
