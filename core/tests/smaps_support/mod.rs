//! `/proc/self/smaps` for the store tests (Linux): how much of the store's files
//! this process has mapped in.

use std::path::Path;

/// Resident KiB of the mappings of files under `dir` (Linux `/proc/self/smaps`).
pub fn mapped_rss_kib(dir: &Path) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let dir = dir.to_str().unwrap();
    let mut total = 0;
    let mut ours = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            ours = line.contains(dir);
        } else if ours && let Some(kib) = line.strip_prefix("Rss:") {
            total += kib
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap();
        }
    }
    total
}
