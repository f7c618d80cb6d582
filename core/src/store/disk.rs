//! How full the disk under the store is. A trait so tests can inject a tiny quota
//! instead of filling a real disk.

use std::path::Path;

/// Reports the share of the file system in use under a path, in `[0, 1]`.
pub trait DiskSpace: Send + Sync {
    fn usage_ratio(&self, path: &Path) -> std::io::Result<f64>;
}

/// The real file system, via `statvfs(3)`, with the ratio `df` prints as `Use%`:
/// used / (used + available to us). Blocks reserved for root, or held back by the
/// file system, count on neither side, so the ratio matches what operators see.
#[derive(Debug, Default, Clone, Copy)]
pub struct Statvfs;

impl DiskSpace for Statvfs {
    fn usage_ratio(&self, path: &Path) -> std::io::Result<f64> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `statvfs` is a C struct of integers only, for which all-zero
        // bytes are a valid value; the call below overwrites it anyway.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(df_ratio(
            st.f_blocks as u64,
            st.f_bfree as u64,
            st.f_bavail as u64,
        ))
    }
}

/// A disk that always reports the same fill level. For tests and benchmarks: a
/// store refuses appends past its hard ratio, and whether a test passes must not
/// depend on how full the machine's disk happens to be (the real file system still
/// answers `ENOSPC` when it is truly full).
#[derive(Debug, Clone, Copy)]
pub struct FixedUsage(pub f64);

impl DiskSpace for FixedUsage {
    fn usage_ratio(&self, _path: &Path) -> std::io::Result<f64> {
        Ok(self.0)
    }
}

/// Bytes available to us and the file system's size under `path` (`df`'s
/// `Avail` and `Size`), for `/metrics`.
pub fn space(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: as in `Statvfs::usage_ratio`: all-zero bytes are a valid statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

/// `df`'s `Use%` from block counts: `used / (used + avail)`, `used = total - free`.
pub fn df_ratio(total: u64, free: u64, avail: u64) -> f64 {
    let used = total.saturating_sub(free);
    let denom = used + avail;
    if denom == 0 {
        return 0.0;
    }
    (used as f64 / denom as f64).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_is_dfs_use_percent() {
        // A disk as seen here: 252G total, 28G used, 64G available (the rest is
        // reserved): df says 30%, not 75%.
        let g = 1 << 30;
        let r = df_ratio(252 * g, 252 * g - 28 * g, 64 * g);
        assert!((r - 28.0 / 92.0).abs() < 1e-9, "{r}");
        assert_eq!(df_ratio(0, 0, 0), 0.0);
        assert_eq!(df_ratio(100, 0, 0), 1.0);
    }

    #[test]
    fn statvfs_reads_a_ratio() {
        let r = Statvfs.usage_ratio(Path::new("/")).unwrap();
        assert!((0.0..=1.0).contains(&r));
        assert!(Statvfs.usage_ratio(Path::new("/no/such/dir")).is_err());
    }
}
