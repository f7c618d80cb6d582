//! `rocketgate bench prefault`: how long first writes into a fresh shared file mapping
//! take, per call. The probe behind the commit log's `MADV_RANDOM` (docs/bench-log,
//! session 7, "the stalls were the kernel's read-ahead"): a write fault on a hole of a
//! shared mapping first reads the page through read-ahead, so with the default advice
//! one call per `read_ahead_kb` zeroes that much page cache at once (~20 ms of CPU per
//! 8 MiB on our VMs); with `--random-advice` no call should. Worth re-running on a new
//! kernel or host before trusting the store's latency figures there.
//!
//! Each call is `MADV_POPULATE_WRITE` (Linux 5.14+) over the next chunk, timed by the
//! wall clock and this thread's CPU clock.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use memmap2::{Advice, MmapMut};

#[derive(Debug, Clone, Args)]
pub struct PrefaultArgs {
    /// File to map (created or truncated, deleted after).
    #[arg(long, default_value = "bench-data/prefault-probe.tmp")]
    pub file: PathBuf,
    /// Size of the mapping.
    #[arg(long, default_value_t = 1024, value_name = "MiB")]
    pub size_mib: u64,
    /// Bytes populated per call.
    #[arg(long, default_value_t = 64, value_name = "KiB")]
    pub chunk_kib: u64,
    /// `MADV_RANDOM` on the whole mapping first (what the commit log does).
    #[arg(long)]
    pub random_advice: bool,
    /// Print every call slower than this (wall clock).
    #[arg(long, default_value_t = 3.0, value_name = "MS")]
    pub slow_ms: f64,
}

/// One call slower than the threshold.
#[derive(Debug)]
pub struct SlowCall {
    pub offset: u64,
    pub wall: Duration,
    pub cpu: Duration,
}

/// What one probe measured.
#[derive(Debug)]
pub struct Report {
    pub calls: u64,
    pub total: Duration,
    pub slowest: Duration,
    pub slow: Vec<SlowCall>,
}

pub fn run(args: PrefaultArgs) -> anyhow::Result<()> {
    if let Some(dir) = args.file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let slow = Duration::from_secs_f64(args.slow_ms.max(0.0) / 1e3);
    let result = probe(
        &args.file,
        args.size_mib << 20,
        args.chunk_kib << 10,
        args.random_advice,
        slow,
    );
    let _ = std::fs::remove_file(&args.file);
    let report = result?;
    for c in &report.slow {
        println!(
            "call at {} MiB: wall {:.2} ms, cpu {:.2} ms",
            c.offset >> 20,
            ms(c.wall),
            ms(c.cpu)
        );
    }
    println!(
        "{} MiB in {} KiB calls{}: {:.1} ms, slowest call {:.2} ms",
        args.size_mib,
        args.chunk_kib,
        if args.random_advice {
            " (MADV_RANDOM)"
        } else {
            ""
        },
        ms(report.total),
        ms(report.slowest)
    );
    Ok(())
}

/// Maps `size` bytes of a fresh `path` and populates it `chunk` bytes per call.
pub fn probe(
    path: &Path,
    size: u64,
    chunk: u64,
    random_advice: bool,
    slow: Duration,
) -> anyhow::Result<Report> {
    if size == 0 || chunk == 0 {
        bail!("--size-mib and --chunk-kib must be at least 1");
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.set_len(size)
        .with_context(|| format!("sizing {}", path.display()))?;
    // SAFETY: the file was just created for this probe and nothing else maps it.
    let map = unsafe { MmapMut::map_mut(&file) }.context("mmap")?;
    if random_advice {
        map.advise(Advice::Random).context("MADV_RANDOM")?;
    }
    let mut report = Report {
        calls: 0,
        total: Duration::ZERO,
        slowest: Duration::ZERO,
        slow: Vec::new(),
    };
    let mut offset = 0u64;
    while offset < size {
        let len = chunk.min(size - offset);
        let (wall0, cpu0) = (Instant::now(), thread_cpu());
        map.advise_range(Advice::PopulateWrite, offset as usize, len as usize)
            .context("MADV_POPULATE_WRITE (needs Linux 5.14 or later)")?;
        let (wall, cpu) = (wall0.elapsed(), thread_cpu().saturating_sub(cpu0));
        report.calls += 1;
        report.total += wall;
        report.slowest = report.slowest.max(wall);
        if wall > slow {
            report.slow.push(SlowCall { offset, wall, cpu });
        }
        offset += len;
    }
    Ok(report)
}

/// CPU time of the calling thread: a slow call that burnt CPU was the kernel zeroing
/// pages, one that did not was waiting.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; the clock id is a constant Linux knows.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_populated_once_and_a_short_tail_counts() {
        let dir = std::env::temp_dir().join(format!("rg-prefault-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("probe");
        // 1 MiB + 4 KiB in 64 KiB calls: 16 full chunks and a 4 KiB tail.
        let size = (1 << 20) + 4096;
        let report = probe(&path, size, 64 << 10, true, Duration::MAX).unwrap();
        assert_eq!(report.calls, 17);
        assert!(report.slow.is_empty());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_zero_chunk_is_refused() {
        let path = std::env::temp_dir().join("rg-prefault-never-created");
        assert!(probe(&path, 1 << 20, 0, false, Duration::ZERO).is_err());
        assert!(!path.exists());
    }
}
