//! How full the disk under the store is. A trait so tests can inject a tiny quota
//! instead of filling a real disk.

use std::path::Path;

/// Reports the share of the file system in use under a path, in `[0, 1]`.
pub trait DiskSpace: Send + Sync {
    fn usage_ratio(&self, path: &Path) -> std::io::Result<f64>;
}

/// The real file system, via `statvfs(3)`. Counts blocks reserved for root as used,
/// as `df` does, so the ratio matches what operators see.
#[derive(Debug, Default, Clone, Copy)]
pub struct Statvfs;

impl DiskSpace for Statvfs {
    fn usage_ratio(&self, path: &Path) -> std::io::Result<f64> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
        let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let total = st.f_blocks as f64;
        if total == 0.0 {
            return Ok(0.0);
        }
        let avail = st.f_bavail as f64;
        Ok(((total - avail) / total).clamp(0.0, 1.0))
    }
}

/// A disk of `capacity` bytes of which the store's own files are the only content:
/// usage is the size of the files under the path divided by the capacity. For tests
/// and for quota-style deployments.
#[derive(Debug, Clone, Copy)]
pub struct Quota {
    pub capacity: u64,
}

impl DiskSpace for Quota {
    fn usage_ratio(&self, path: &Path) -> std::io::Result<f64> {
        Ok((dir_size(path)? as f64 / self.capacity as f64).clamp(0.0, 1.0))
    }
}

/// Bytes allocated on disk by the files under `path` (sparse files count what they use).
pub fn dir_size(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            total += dir_size(&entry.path())?;
        } else {
            total += meta.blocks() * 512;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_reads_a_ratio() {
        let r = Statvfs.usage_ratio(Path::new("/")).unwrap();
        assert!((0.0..=1.0).contains(&r));
        assert!(Statvfs.usage_ratio(Path::new("/no/such/dir")).is_err());
    }
}
