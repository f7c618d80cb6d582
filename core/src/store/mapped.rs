//! A fixed-size memory-mapped file accessed only through 32- and 64-bit atomics.
//!
//! The consume queue and the index both share their mapped bytes between one
//! writer and many readers. Plain `&[u8]`/`&mut [u8]` views of memory another
//! thread is writing would be a data race (undefined behaviour), so every load and
//! store goes through an atomic word. Ordering between words is the caller's job:
//! each caller publishes with a `Release` store of its own counter, and documents
//! that under `# Invariants`.
//!
//! Used by the consume queues and the index alike; it depends on neither.
//!
//! Bytes are stored so that the *file* is big-endian: a word holding bytes
//! `b0..b3` is `u32::from_ne_bytes([b0, b1, b2, b3])`.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Error, Result};
use crate::store::io::Files;

/// Suffix of a mapped file still being created (see [`MappedFile::create`]).
pub(crate) const UNFINISHED_SUFFIX: &str = ".tmp";

/// Removes `path` if it is a file whose creation was interrupted (it never held
/// data); returns whether it was one.
pub(crate) fn remove_if_unfinished(path: &Path) -> Result<bool> {
    let unfinished = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(UNFINISHED_SUFFIX));
    if unfinished {
        tracing::warn!(path = %path.display(), "removing an unfinished file");
        std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
    }
    Ok(unfinished)
}

/// Blocks are allocated ahead of writes in steps of this much (see
/// [`MappedFile::allocate_to`]).
const ALLOCATE_STEP: usize = 1 << 20;

/// A mapped file of a fixed length, pre-sized on creation. Only its first
/// `allocated` bytes may be touched; writers past them call
/// [`allocate_to`](MappedFile::allocate_to) first.
#[derive(Debug)]
pub(crate) struct MappedFile {
    path: PathBuf,
    len: usize,
    /// Bytes from the start known to have blocks on disk. Only grows.
    allocated: AtomicUsize,
    /// `MmapRaw` is `Send + Sync` and hands out a raw pointer; all access goes
    /// through the atomic helpers below, never through a slice.
    map: MmapRaw,
    /// Kept so the descriptor's lifetime matches the mapping's (one open file
    /// per mapped file, easy to account), and for [`Self::allocate_to`].
    _file: File,
    /// File operations (production: the syscalls; tests inject faults). Every
    /// byte this file maps and touches is allocated through `allocate`
    /// (`posix_fallocate`; glibc writes zeros where the file system cannot
    /// allocate): a page of a shared mapping with no block behind it is a SIGBUS
    /// at first touch when the disk is full (on tmpfs even a read of it is), so
    /// a full disk is an `ENOSPC` error instead of a signal.
    files: Files,
}

impl MappedFile {
    /// Creates a file of exactly `len` bytes, allocates its first `allocate`
    /// bytes and maps it; the rest is sparse until [`allocate_to`](Self::allocate_to)
    /// is asked for it. It is sized under a temporary name
    /// ([`UNFINISHED_SUFFIX`]) and renamed into place, so a crash mid-creation
    /// leaves a file the loaders remove ([`remove_if_unfinished`]), never a short
    /// file that would make the queue refuse to open.
    pub(crate) fn create(
        path: &Path,
        len: usize,
        allocate_len: usize,
        files: &Files,
    ) -> Result<Self> {
        if path.exists() {
            return Err(Error::io(
                path,
                std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            ));
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(UNFINISHED_SUFFIX);
        let tmp = PathBuf::from(tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
        if let Err(e) = files
            .allocate(
                &file,
                &tmp,
                Some(len as u64),
                0,
                allocate_len.min(len) as u64,
                true,
            )
            .and_then(|()| std::fs::rename(&tmp, path))
        {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(path, e));
        }
        let mapped = Self::map(path, file, len, files)?;
        mapped
            .allocated
            .store(allocate_len.min(len), Ordering::Release);
        // A fresh file is all holes: without this, the first fault on it reads
        // around the faulting page, i.e. zeroes up to `read_ahead_kb` of page cache
        // in one uninterruptible step (8 MiB, ~20 ms on our VMs), and the index's
        // scattered slot writes would do so again and again. Nothing here is ever
        // read that was not written in this process first, so read-ahead buys
        // nothing. Advice only: a refusal changes no behaviour.
        if let Err(e) = mapped.map.advise(memmap2::Advice::Random) {
            tracing::debug!(path = %path.display(), error = %e, "MADV_RANDOM refused");
        }
        Ok(mapped)
    }

    /// Opens an existing file, which must be exactly `len` bytes long, and makes
    /// sure its first `allocate_len` bytes have blocks (a file written before
    /// this version, or on a file system that dropped the allocation, may be
    /// sparse; touching a hole on a full disk is a SIGBUS).
    pub(crate) fn open(
        path: &Path,
        len: usize,
        allocate_len: usize,
        files: &Files,
    ) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let actual = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if actual != len as u64 {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                offset: 0,
                reason: format!("file is {actual} bytes, expected exactly {len}"),
            });
        }
        let allocate_len = allocate_len.min(len);
        files
            .allocate(&file, path, None, 0, allocate_len as u64, true)
            .map_err(|e| Error::io(path, e))?;
        let mapped = Self::map(path, file, len, files)?;
        mapped.allocated.store(allocate_len, Ordering::Release);
        Ok(mapped)
    }

    /// Makes sure bytes `[0, end)` have blocks on disk before the caller touches
    /// them, allocating in [`ALLOCATE_STEP`]s. Only the file's single writer
    /// calls this, so the check-then-store on `allocated` does not race.
    pub(crate) fn allocate_to(&self, end: usize) -> Result<()> {
        let have = self.allocated.load(Ordering::Acquire);
        if end <= have {
            return Ok(());
        }
        let to = end.next_multiple_of(ALLOCATE_STEP).min(self.len).max(end);
        self.files
            .allocate(&self._file, &self.path, None, have as u64, to as u64, true)
            .map_err(|e| Error::io(&self.path, e))?;
        self.allocated.store(to, Ordering::Release);
        Ok(())
    }

    fn map(path: &Path, file: File, len: usize, files: &Files) -> Result<Self> {
        if len == 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: a mapped file cannot be empty",
                path.display()
            )));
        }
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| Error::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            len,
            allocated: AtomicUsize::new(0),
            map,
            _file: file,
            files: files.clone(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn word32(&self, pos: usize) -> &AtomicU32 {
        assert!(
            pos.is_multiple_of(4) && pos + 4 <= self.len,
            "word32 at {pos} outside a {} byte map",
            self.len
        );
        // SAFETY: the map is page-aligned and `pos` is a multiple of 4 inside it,
        // so the pointer is valid and aligned for a u32 for as long as `self`
        // (which owns the mapping) lives. The memory is only ever accessed
        // atomically, so there are no data races.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(pos).cast::<u32>()) }
    }

    fn word64(&self, pos: usize) -> &AtomicU64 {
        assert!(
            pos.is_multiple_of(8) && pos + 8 <= self.len,
            "word64 at {pos} outside a {} byte map",
            self.len
        );
        // SAFETY: as in `word32`, with 8-byte alignment.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(pos).cast::<u64>()) }
    }

    /// Loads `N` bytes (a multiple of 4) at the 4-aligned byte position `pos`.
    pub(crate) fn load<const N: usize>(&self, pos: usize, order: Ordering) -> [u8; N] {
        let mut out = [0u8; N];
        for (i, chunk) in out.chunks_exact_mut(4).enumerate() {
            chunk.copy_from_slice(&self.word32(pos + i * 4).load(order).to_ne_bytes());
        }
        out
    }

    /// Stores `N` bytes (a multiple of 4) at the 4-aligned byte position `pos`.
    pub(crate) fn store<const N: usize>(&self, pos: usize, bytes: &[u8; N], order: Ordering) {
        for (i, chunk) in bytes.chunks_exact(4).enumerate() {
            let word = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            self.word32(pos + i * 4).store(word, order);
        }
    }

    pub(crate) fn load_i32(&self, pos: usize, order: Ordering) -> i32 {
        i32::from_be_bytes(self.word32(pos).load(order).to_ne_bytes())
    }

    pub(crate) fn store_i32(&self, pos: usize, value: i32, order: Ordering) {
        self.word32(pos)
            .store(u32::from_ne_bytes(value.to_be_bytes()), order);
    }

    pub(crate) fn load_i64(&self, pos: usize, order: Ordering) -> i64 {
        i64::from_be_bytes(self.word64(pos).load(order).to_ne_bytes())
    }

    pub(crate) fn store_i64(&self, pos: usize, value: i64, order: Ordering) {
        self.word64(pos)
            .store(u64::from_ne_bytes(value.to_be_bytes()), order);
    }

    /// msync of the byte range `[pos, pos + len)`.
    pub(crate) fn flush_range(&self, pos: usize, len: usize) -> Result<()> {
        let end = (pos + len).min(self.len);
        if end <= pos {
            return Ok(());
        }
        self.files
            .sync_mapped(&self.map, &self.path, pos, end - pos)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Drops the pages of `[pos, pos + len)` from the resident set (the bytes
    /// stay what they are, see `store::resident`).
    pub(crate) fn release(&self, pos: usize, len: usize) {
        // SAFETY: `map` is this file's live shared mapping of `self.len` bytes.
        unsafe { crate::store::resident::release(self.map.as_mut_ptr(), self.len, pos..pos + len) }
    }

    pub(crate) fn flush(&self) -> Result<()> {
        self.files
            .sync_mapped(&self.map, &self.path, 0, self.len)
            .map_err(|e| Error::io(&self.path, e))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_file_is_mapped_without_read_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        let file = MappedFile::create(&path, 1 << 20, 1 << 20, &Files::os()).unwrap();
        let flags = crate::store::resident::mapping_flags(&path);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].1.iter().any(|f| f == "rr"), "{flags:?}");
        drop(file);
        // Reopened (after a restart) it keeps the kernel's default read-ahead.
        let _file = MappedFile::open(&path, 1 << 20, 1 << 20, &Files::os()).unwrap();
        let flags = crate::store::resident::mapping_flags(&path);
        assert!(
            flags.iter().all(|(_, f)| !f.iter().any(|x| x == "rr")),
            "{flags:?}"
        );
    }
}
