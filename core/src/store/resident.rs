//! Keeping the mapped files' resident set small.
//!
//! The commit log and the consume queues are read and written through shared
//! file mappings, and every page a mapping has touched counts in the process's
//! resident set (`VmRSS`) until the kernel reclaims it. With a backlog of
//! millions of messages that is gigabytes of RSS that is really page cache, and
//! it makes memory limits and `top` lie about what the broker holds. So the
//! maintenance thread drops the pages of cold ranges from the mappings
//! (`madvise(MADV_DONTNEED)`): on a shared file mapping that only unmaps them —
//! the data stays in the page cache (dirty pages are still written back) and the
//! next read of the range faults the same bytes back in. Only ranges that are
//! durable and well behind the write position are released, so the appender
//! and consumers at the tail never fault.

use std::ops::Range;

/// Commit-log bytes below the flushed position that stay mapped for consumers
/// reading near the tail.
pub const LOG_KEEP: u64 = 64 << 20;
/// Consume-queue entries below a queue's end that stay mapped.
pub const QUEUE_KEEP_ENTRIES: u64 = 64 * 1024;

const PAGE: usize = 4096;

/// Unmaps the whole pages inside `range` of the mapping at `base` (`len` bytes,
/// page-aligned). The range is clamped to the mapping.
///
/// # Safety
/// `base..base + len` must be one live `MAP_SHARED` file mapping. Its contents
/// are unchanged by this call (see the module docs); references into it stay
/// valid.
pub(crate) unsafe fn release(base: *mut u8, len: usize, range: Range<usize>) {
    let end = range.end.min(len) / PAGE * PAGE;
    let start = range.start.div_ceil(PAGE) * PAGE;
    if end <= start {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the caller guarantees a live shared file mapping; start..end is
        // page-aligned and inside it.
        let rc = unsafe { libc::madvise(base.add(start).cast(), end - start, libc::MADV_DONTNEED) };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "madvise(MADV_DONTNEED) failed");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = base;
}

/// The `VmFlags` of every mapping of `path` in this process, as (start offset in
/// the file, flags).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn mapping_flags(path: &std::path::Path) -> Vec<(u64, Vec<String>)> {
    use std::path::Path;
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let want = path.canonicalize().unwrap();
    let mut out = Vec::new();
    let mut current: Option<u64> = None;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(off) = current.take() {
                out.push((off, flags.split_whitespace().map(String::from).collect()));
            }
        } else if fields.len() >= 6 && fields[0].contains('-') && fields[1].len() == 4 {
            // A mapping header: range, perms, offset, device, inode, path.
            current =
                (Path::new(fields[5]) == want).then(|| u64::from_str_radix(fields[2], 16).unwrap());
        }
    }
    out.sort();
    out
}
