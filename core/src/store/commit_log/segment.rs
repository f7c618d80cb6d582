//! One segment file of the commit log: a fixed-size, pre-zeroed file named by
//! its start offset and memory-mapped read-write. Owns the mapping and the raw
//! byte access to it; knows nothing about records or positions, which
//! [`CommitLog`](super::CommitLog) tracks and publishes.

use std::fs::{File, OpenOptions};
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Error, Result};
use crate::store::io::Files;

/// Suffix of a segment file still being created (see [`Segment::create`]).
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// File name of the segment starting at `start`: 20 digits, zero-padded.
pub(crate) fn file_name(start: u64) -> String {
    format!("{start:020}")
}

/// Start offset encoded in a segment file name, if it is one.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    if name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok()
    } else {
        None
    }
}

/// A mapped segment. Shared as `Arc<Segment>`: the log's segment list, the
/// appender, and every outstanding [`RecordRef`] hold one, so a segment deleted
/// by retention stays mapped until the last reader drops it.
///
/// Byte access is split by the log's positions: bytes below the published
/// written position are immutable and may be read by anyone; bytes above it are
/// written only by the appender holding the log's append lock (or by recovery
/// before the log is shared). That discipline is what makes the raw accesses
/// below free of data races.
pub(crate) struct Segment {
    start: u64,
    size: usize,
    path: PathBuf,
    map: MmapRaw,
    /// Store timestamp of the newest record appended or recovered in this
    /// process (0 = unknown); retention falls back to the file mtime.
    last_store_timestamp: AtomicI64,
    /// The directory entry of a newly created file is not durable until the
    /// directory is fsynced; the flusher does that once and clears this.
    needs_dir_sync: AtomicBool,
    /// Kept for write-through mode (see `write_through`).
    file: File,
    /// Write with `pwrite` and sync with `fdatasync` instead of a memcpy into the
    /// mapping and `msync`. Reads always use the mapping (same page cache). Chosen
    /// for sync flush: `msync` write-protects the pages it cleans, so the next
    /// append into a just-synced page takes a fault; under group commit that is
    /// every round. A memcpy is cheaper when syncs are rare (async flush).
    write_through: bool,
    /// The file operations (production: the syscalls; tests inject faults).
    files: Files,
}

impl Segment {
    /// Creates `dir/<start>` of exactly `size` zero bytes and maps it. The
    /// blocks are reserved up front (where the file system supports it) so a
    /// full disk is an error here, not a SIGBUS on a later write to a hole.
    ///
    /// The file is sized under a temporary name and renamed into place, so a
    /// crash mid-creation leaves a `*.tmp` file (removed at the next open), never
    /// a short segment that would make the log refuse to open. A half-created
    /// file is removed, so a retry can succeed.
    pub(crate) fn create(
        dir: &Path,
        start: u64,
        size: usize,
        write_through: bool,
        files: &Files,
    ) -> Result<Segment> {
        let path = dir.join(file_name(start));
        let tmp = dir.join(format!("{}{TMP_SUFFIX}", file_name(start)));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
        let sized = files
            .allocate(&file, &tmp, Some(size as u64), 0, size as u64, false)
            .map_err(|e| Error::io(&tmp, e))
            .and_then(|()| {
                if path.exists() {
                    return Err(Error::io(
                        &path,
                        std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                    ));
                }
                std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
            });
        if let Err(e) = sized {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        match Segment::map(file, path.clone(), start, size, write_through, files) {
            Ok(seg) => {
                seg.needs_dir_sync.store(true, Ordering::Relaxed);
                Ok(seg)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Opens an existing segment file, which must be exactly `size` bytes.
    pub(crate) fn open(
        path: PathBuf,
        start: u64,
        size: usize,
        write_through: bool,
        files: &Files,
    ) -> Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        if len != size as u64 {
            return Err(Error::Corrupt {
                path,
                offset: 0,
                reason: format!("segment file is {len} bytes; the segment size is {size}"),
            });
        }
        // A copy made with holes (`cp --sparse`, a restore) would SIGBUS at the first
        // touch of a hole on a full disk; allocated files make this a no-op.
        files
            .allocate(&file, &path, None, 0, size as u64, false)
            .map_err(|e| Error::io(&path, e))?;
        Segment::map(file, path, start, size, write_through, files)
    }

    fn map(
        file: File,
        path: PathBuf,
        start: u64,
        size: usize,
        write_through: bool,
        files: &Files,
    ) -> Result<Segment> {
        let map = MmapOptions::new()
            .len(size)
            .map_raw(&file)
            .map_err(|e| Error::io(&path, e))?;
        Ok(Segment {
            start,
            size,
            path,
            map,
            last_store_timestamp: AtomicI64::new(0),
            needs_dir_sync: AtomicBool::new(false),
            file,
            write_through,
            files: files.clone(),
        })
    }

    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    pub(crate) fn end(&self) -> u64 {
        self.start + self.size as u64
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn contains(&self, phys: u64) -> bool {
        phys >= self.start && phys < self.end()
    }

    /// The bytes at `range` (segment-relative).
    ///
    /// Callers pass only ranges below the published written position (or are
    /// the appender/recovery), so nothing writes these bytes concurrently. The
    /// range is clamped to the segment rather than trusted.
    pub(crate) fn bytes(&self, range: Range<usize>) -> &[u8] {
        let end = range.end.min(self.size);
        let start = range.start.min(end);
        // SAFETY: the mapping is `size` bytes long and lives as long as `self`;
        // start..end is inside it; see the type docs for why no write races.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(start), end - start) }
    }

    /// Whether the bytes at `range` can be read (see
    /// [`FileOps::check_read`](crate::store::io::FileOps::check_read)).
    pub(crate) fn check_read(&self, range: Range<usize>) -> Result<()> {
        self.files
            .check_read(&self.path, range.start as u64, range.len())
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Copies `data` to segment-relative offset `at`. Only the appender (under
    /// the log's append lock) and recovery (before the log is shared) call this,
    /// and only above the published written position.
    pub(crate) fn write(&self, at: usize, data: &[u8]) -> Result<()> {
        if self.write_through {
            return self.write_file(at, data);
        }
        self.check_bounds(at, data.len())?;
        // SAFETY: in bounds (checked above); no reader looks above the written
        // position and only one writer exists (see the type docs).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_mut_ptr().add(at), data.len());
        }
        Ok(())
    }

    /// Writes `data` at segment-relative `at` with `pwrite` in either mode (reads
    /// still go through the mapping: same page cache). For a slave's appends of
    /// whole shipped runs, tens of KiB to a MiB each: one system call per run
    /// instead of a memcpy into the mapping, which takes a page fault per fresh
    /// page and has the kernel zero it first only for the copy to overwrite it, and
    /// which leaves the pages writable in the page tables, so every `msync` must
    /// write-protect them again (a TLB shootdown on the other cores). A page that
    /// `pwrite` fills whole is never zeroed. Same bytes, same page cache, same
    /// flush (`msync` and `fdatasync` sync the file's dirty pages however they
    /// were dirtied).
    pub(crate) fn write_file(&self, at: usize, data: &[u8]) -> Result<()> {
        self.check_bounds(at, data.len())?;
        self.files
            .write_at(&self.file, &self.path, at as u64, data)
            .map_err(|e| Error::io(&self.path, e))
    }

    fn check_bounds(&self, at: usize, len: usize) -> Result<()> {
        if at.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::InvalidArgument(format!(
                "write of {len} bytes at {at} overruns segment {}",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Drops the pages of the segment-relative range from the process's
    /// resident set; the bytes stay what they are (see `store::resident`).
    /// Called only for durable ranges below the written position.
    pub(crate) fn release(&self, range: Range<usize>) {
        // SAFETY: `map` is this segment's live shared file mapping of `size` bytes.
        unsafe { crate::store::resident::release(self.map.as_mut_ptr(), self.size, range) }
    }

    /// Makes the segment-relative range durable (`msync`, or `fdatasync` in
    /// write-through mode).
    pub(crate) fn flush_range(&self, range: Range<usize>) -> Result<()> {
        let end = range.end.min(self.size);
        let start = range.start.min(end);
        if end > start {
            if self.write_through {
                self.files
                    .sync_data(&self.file, &self.path, (start as u64, end as u64))
                    .map_err(|e| Error::io(&self.path, e))?;
            } else {
                self.files
                    .sync_mapped(&self.map, &self.path, start, end - start)
                    .map_err(|e| Error::io(&self.path, e))?;
            }
        }
        Ok(())
    }

    /// Faults the segment-relative `range` into the page tables writable, ahead of
    /// the appender (RocketMQ's `warmMappedFile`): the kernel allocates and zeroes
    /// each fresh page here, on the caller's thread, instead of in a page fault
    /// inside the appender's memcpy under the append lock. `MADV_POPULATE_WRITE`
    /// does not change the bytes, so it may run while the appender writes.
    pub(crate) fn prefault(&self, range: Range<usize>) -> std::io::Result<()> {
        let end = range.end.min(self.size);
        let start = range.start.min(end);
        if end == start || self.write_through {
            // Write-through appends use `pwrite`, and `fdatasync` would write the
            // pre-faulted (dirty, still zero) pages out every round.
            return Ok(());
        }
        #[cfg(target_os = "linux")]
        {
            self.map
                .advise_range(memmap2::Advice::PopulateWrite, start, end - start)
        }
        #[cfg(not(target_os = "linux"))]
        Ok(())
    }

    /// Turns read-ahead off for the part of the segment from `from` on, where
    /// appends go. Every page there is a hole until written, and a fault on a
    /// hole in a mapping with read-ahead zeroes a whole read-ahead window of fresh
    /// page cache in one step: with `read_ahead_kb` at 8 MiB (our VMs' virtio disks)
    /// one append in every 8 MiB, or one pre-fault call, took ~20 ms of the core
    /// without yielding it. Advice only: a refusal changes no behaviour.
    pub(crate) fn advise_appending(&self, from: usize) {
        if self.write_through {
            // `pwrite` fills holes a page at a time; the mapping is only read.
            return;
        }
        // (The range is widened to whole pages by `advise_range`.)
        let from = from.min(self.size);
        if let Err(e) = self
            .map
            .advise_range(memmap2::Advice::Random, from, self.size - from)
        {
            tracing::debug!(path = %self.path.display(), error = %e, "MADV_RANDOM refused");
        }
    }

    /// Gives a segment that stopped taking appends normal read-ahead back, for
    /// consumers that read it from disk later.
    pub(crate) fn advise_sealed(&self) {
        if self.write_through {
            return;
        }
        if let Err(e) = self.map.advise(memmap2::Advice::Normal) {
            tracing::debug!(path = %self.path.display(), error = %e, "MADV_NORMAL refused");
        }
    }

    pub(crate) fn take_needs_dir_sync(&self) -> bool {
        self.needs_dir_sync.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn restore_needs_dir_sync(&self) {
        self.needs_dir_sync.store(true, Ordering::Release);
    }

    pub(crate) fn note_store_timestamp(&self, ts: i64) {
        self.last_store_timestamp.fetch_max(ts, Ordering::Relaxed);
    }

    pub(crate) fn last_store_timestamp(&self) -> Option<i64> {
        Some(self.last_store_timestamp.load(Ordering::Relaxed)).filter(|t| *t > 0)
    }
}

/// A zero-copy handle on one stored record (or on a run of whole records shipped to
/// a slave, `replica.rs`). Keeps its segment mapped (even if
/// retention deleted the file) for as long as it lives.
#[derive(Clone)]
pub struct RecordRef {
    pub(crate) segment: Arc<Segment>,
    pub(crate) range: Range<usize>,
}

impl RecordRef {
    /// Physical (log-wide) offset of the record.
    pub fn phys_offset(&self) -> u64 {
        self.segment.start + self.range.start as u64
    }

    /// Offset just past the record.
    pub fn end_offset(&self) -> u64 {
        self.segment.start + self.range.end as u64
    }

    /// Parses the record (structure only; recovery verified checksums).
    pub fn view(&self) -> Result<crate::store::record::RecordView<'_>> {
        crate::store::record::RecordView::parse(self).map_err(|e| Error::Corrupt {
            path: self.segment.path.clone(),
            offset: self.phys_offset(),
            reason: e.to_string(),
        })
    }

    /// The record as `Bytes` without copying: the `Bytes` owns this handle.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl Deref for RecordRef {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.segment.bytes(self.range.clone())
    }
}

impl AsRef<[u8]> for RecordRef {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for RecordRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordRef")
            .field("phys_offset", &self.phys_offset())
            .field("len", &self.range.len())
            .finish()
    }
}
