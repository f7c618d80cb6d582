//! The store's file operations behind one seam ([`FileOps`]), so tests can make
//! them fail the way disks do (issue #25, item 5) and can simulate a power loss
//! (item 6) without a real crash.
//!
//! Every write, sync, allocation and metadata write the commit log, the consume
//! queues, the index and the checkpoint make goes through a [`Files`] handle;
//! production uses [`OsFiles`] (the plain syscalls, nothing else), tests use
//! [`faults::FaultyFiles`], which injects errors (`EIO` on sync or read,
//! `ENOSPC` at append, roll or metadata write, a torn write that stops part way)
//! and remembers what each sync made durable so a "power loss" can throw the
//! rest away page by page.
//!
//! Reads go through the mapping, where a real `EIO` is a `SIGBUS`, not an
//! error; [`FileOps::check_read`] is where the seam answers what a `read(2)`
//! of the same bytes would (production: always fine, one inlined call).
//!
//! What the seam does **not** cover: the memcpy of an async-flush append into
//! the mapping and the consume queues' and index's atomic stores into theirs
//! (no syscall to fail; their durability is still decided by the syncs that go
//! through here), and files outside the store (broker offsets, MQTT sessions).

use std::fmt;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use memmap2::MmapRaw;

pub mod faults;

/// The file operations of the store. Every method has the production behaviour
/// as its default, so a test implementation overrides only what it injects into.
pub trait FileOps: Send + Sync + fmt::Debug + 'static {
    /// `pwrite` of all of `data` at `offset` (write-through appends, recovery).
    fn write_at(&self, file: &File, path: &Path, offset: u64, data: &[u8]) -> io::Result<()> {
        let _ = path;
        use std::os::unix::fs::FileExt;
        file.write_all_at(data, offset)
    }

    /// `fdatasync` of a file. `range` is the part the caller needs durable
    /// (the rest of the file may be synced too, as the kernel does).
    fn sync_data(&self, file: &File, path: &Path, range: (u64, u64)) -> io::Result<()> {
        let _ = (path, range);
        file.sync_data()
    }

    /// `msync` of `len` bytes at `offset` of a shared mapping of `path`.
    fn sync_mapped(&self, map: &MmapRaw, path: &Path, offset: usize, len: usize) -> io::Result<()> {
        let _ = path;
        map.flush_range(offset, len)
    }

    /// Sizes a file to `len` bytes (`ftruncate`) when `set_len`, and allocates the
    /// blocks of `[from, to)` (`posix_fallocate`): a file system that cannot
    /// allocate (`EINVAL`, `EOPNOTSUPP`) is fine when `strict` is false.
    fn allocate(
        &self,
        file: &File,
        path: &Path,
        set_len: Option<u64>,
        from: u64,
        to: u64,
        strict: bool,
    ) -> io::Result<()> {
        let _ = path;
        if let Some(len) = set_len {
            file.set_len(len)?;
        }
        fallocate(file, from, to, strict)
    }

    /// `fsync` of a directory (after a file in it was created or renamed).
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir).and_then(|d| d.sync_all())
    }

    /// Atomically replaces a small metadata file: write `tmp`, sync it, rename it
    /// to `path`, sync the directory.
    fn replace_file(&self, path: &Path, tmp: &Path, data: &[u8]) -> io::Result<()> {
        use std::io::Write;
        let mut f = File::create(tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(tmp, path)?;
        match path.parent() {
            Some(dir) => self.sync_dir(dir),
            None => Ok(()),
        }
    }

    /// Whether `len` bytes at `offset` of `path` can be read (what `read(2)`
    /// would say; the bytes themselves come from the mapping).
    #[inline]
    fn check_read(&self, path: &Path, offset: u64, len: usize) -> io::Result<()> {
        let _ = (path, offset, len);
        Ok(())
    }
}

/// The production file operations: the syscalls, nothing else.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsFiles;

impl FileOps for OsFiles {}

/// A shared handle on the file operations a store uses.
#[derive(Clone, Debug)]
pub struct Files(Arc<dyn FileOps>);

impl Files {
    pub fn new(ops: Arc<dyn FileOps>) -> Self {
        Files(ops)
    }

    /// The production operations ([`OsFiles`]).
    pub fn os() -> Self {
        Files(Arc::new(OsFiles))
    }
}

impl Default for Files {
    fn default() -> Self {
        Files::os()
    }
}

impl std::ops::Deref for Files {
    type Target = dyn FileOps;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// `posix_fallocate` of `[from, to)`; `strict` false accepts a file system that
/// cannot allocate (the file stays sparse there).
#[cfg(target_os = "linux")]
pub(crate) fn fallocate(file: &File, from: u64, to: u64, strict: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if to <= from {
        return Ok(());
    }
    let off = libc::off_t::try_from(from).map_err(io::Error::other)?;
    let len = libc::off_t::try_from(to - from).map_err(io::Error::other)?;
    // SAFETY: a plain syscall on a file descriptor the caller owns.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), off, len) } {
        0 => Ok(()),
        libc::EINVAL | libc::EOPNOTSUPP if !strict => Ok(()),
        code => Err(io::Error::from_raw_os_error(code)),
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn fallocate(_file: &File, _from: u64, _to: u64, _strict: bool) -> io::Result<()> {
    Ok(())
}
