//! One consume queue: the entries of one (topic, queue id), in mapped files.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tracing::{debug, warn};

use super::entry::{CqEntry, ENTRY_SIZE};
use super::validate_topic;
use crate::error::{Error, Result};
use crate::store::io::Files;
use crate::store::mapped::MappedFile;

const ZERO_ENTRY: [u8; ENTRY_SIZE] = [0; ENTRY_SIZE];
/// Width of a file name: the logical byte offset of its first entry.
const NAME_DIGITS: usize = 20;

/// A batch of entries read from a queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CqBatch {
    /// `(queue offset, entry)` in queue order. Holes (empty slots left by a
    /// forward gap, see [`ConsumeQueue::put`]) are skipped, so offsets may jump.
    pub entries: Vec<(u64, CqEntry)>,
    /// Where the next read should start: one past the last slot examined.
    pub next_offset: u64,
}

/// One mapped file of a queue.
#[derive(Debug)]
struct CqFile {
    /// Queue offset (entry number) of the file's first slot.
    first: u64,
    map: MappedFile,
}

impl CqFile {
    fn pos(&self, offset: u64) -> usize {
        (offset - self.first) as usize * ENTRY_SIZE
    }

    fn load_raw(&self, offset: u64) -> [u8; ENTRY_SIZE] {
        self.map.load(self.pos(offset), Ordering::Relaxed)
    }

    fn load(&self, offset: u64) -> Option<CqEntry> {
        CqEntry::decode(&self.load_raw(offset))
    }

    fn store(&self, offset: u64, bytes: &[u8; ENTRY_SIZE]) {
        self.map.store(self.pos(offset), bytes, Ordering::Relaxed);
    }
}

/// What only the writer touches.
#[derive(Debug, Default)]
struct WriterState {
    /// Queue offsets `[lo, hi)` written since the last successful flush.
    dirty: Option<(u64, u64)>,
}

impl WriterState {
    fn mark_dirty(&mut self, lo: u64, hi: u64) {
        self.dirty = Some(match self.dirty {
            None => (lo, hi),
            Some((a, b)) => (a.min(lo), b.max(hi)),
        });
    }
}

/// The consume queue of one (topic, queue id): entry N says where the N-th
/// message of the queue lives in the commit log.
///
/// # Invariants
///
/// - **One writer, many readers.** `put`, `truncate_from_phys`,
///   `delete_before_phys` and `flush` serialise on `writer` (in normal operation
///   only the store's dispatcher calls them, so the lock is uncontended). Readers
///   (`get`, `read`, `offset_at_or_after_time`) take no lock but a short read
///   lock on `files` to clone an `Arc`.
/// - **Publish after write.** A new entry's 20 bytes are stored first, then
///   `max_offset` is stored with `Release`. Readers load `max_offset` with
///   `Acquire` and read only slots below it, so they never see a half-written
///   new entry. Mapped bytes are accessed only through atomic words, so even a
///   racing access is not undefined behaviour.
/// - **Rewrites are fenced.** Bytes below `max_offset` change only when a put
///   rewrites an entry with different bytes (re-dispatch after a torn write) or
///   when `truncate_from_phys` zeroes the tail. Before either, the writer lowers
///   `max_offset` (truncation only), bumps `rewrites` (`Release`) and issues a
///   `Release` fence. Readers load `rewrites` (`Acquire`) before reading and
///   again after an `Acquire` fence; if it moved they retry. This is a seqlock:
///   a reader that observed any rewritten word also observes the bumped counter.
/// - **Empty beyond the end.** Every slot at or past `max_offset` is all zero:
///   `open` zeroes a torn tail, truncation zeroes what it drops. So a forward
///   gap never exposes stale bytes as entries.
/// - `min_offset <= max_offset`; both only move forward, except that truncation
///   lowers `max_offset` (never below `min_offset`).
/// - `files` is contiguous: `files[i].first == files[0].first + i * entries_per_file`,
///   which makes finding the file of an offset O(1). The file holding
///   `max_offset - 1` (and the last file) is never deleted.
/// - Entries' phys offsets strictly increase in queue order (the dispatcher
///   follows the commit log); retention, truncation and the torn-tail check on
///   `open` rely on it.
#[derive(Debug)]
pub struct ConsumeQueue {
    topic: String,
    queue_id: u32,
    dir: PathBuf,
    entries_per_file: u64,
    /// Mapped files in queue order. An `RwLock` because readers only clone an
    /// `Arc` under it and the writer holds it only to push a new file or drain
    /// deleted ones (never across file I/O). A deleted file stays mapped until
    /// its last reader drops the `Arc`.
    files: RwLock<Vec<Arc<CqFile>>>,
    /// First readable offset.
    min_offset: AtomicU64,
    /// One past the last published entry (see `# Invariants`).
    max_offset: AtomicU64,
    /// Seqlock counter, bumped before bytes below `max_offset` change.
    rewrites: AtomicU64,
    /// Serialises writers; holds what only the writer needs.
    writer: Mutex<WriterState>,
    /// Long-polling readers of this queue wait here; the dispatcher wakes them
    /// once per run of entries it published (see [`ConsumeQueue::arrivals`]).
    arrived: tokio::sync::Notify,
    /// File operations for the files this queue creates.
    io: Files,
}

impl ConsumeQueue {
    /// Opens the queue at `<root>/consumequeue/<topic>/<queue_id>/`, loading any
    /// existing files. The directory is created lazily on the first put.
    ///
    /// `min_offset` is the first valid entry on disk; the store then calls
    /// [`ConsumeQueue::delete_before_phys`] with the commit log's min offset to
    /// skip entries whose messages retention already deleted. `max_offset` is
    /// one past the last valid entry, dropping a torn tail (an entry whose phys
    /// offset does not follow its predecessor's end).
    pub fn open(root: &Path, topic: &str, queue_id: u32, entries_per_file: u64) -> Result<Self> {
        Self::open_with(root, topic, queue_id, entries_per_file, &Files::os())
    }

    /// [`ConsumeQueue::open`] with the given file operations (tests inject faults).
    pub fn open_with(
        root: &Path,
        topic: &str,
        queue_id: u32,
        entries_per_file: u64,
        io: &Files,
    ) -> Result<Self> {
        validate_topic(topic)?;
        if entries_per_file == 0 || entries_per_file > (i32::MAX as u64) / ENTRY_SIZE as u64 {
            return Err(Error::InvalidArgument(format!(
                "entries_per_file {entries_per_file} must be in 1..={}",
                i32::MAX as usize / ENTRY_SIZE
            )));
        }
        let dir = root
            .join("consumequeue")
            .join(topic)
            .join(queue_id.to_string());
        let files = load_files(&dir, entries_per_file, io)?;
        let queue = Self {
            io: io.clone(),
            topic: topic.to_string(),
            queue_id,
            dir,
            entries_per_file,
            files: RwLock::new(files),
            min_offset: AtomicU64::new(0),
            max_offset: AtomicU64::new(0),
            rewrites: AtomicU64::new(0),
            writer: Mutex::new(WriterState::default()),
            arrived: tokio::sync::Notify::new(),
        };
        queue.recover()?;
        Ok(queue)
    }

    /// Where a reader waits for entries past `max_offset`: enable a
    /// `notified()` future *before* reading the bounds, so entries published in
    /// between still wake it. Only this queue's entries wake its readers (as
    /// RocketMQ's `PullRequestHoldService` keys its waiters by queue), not every
    /// append of the node.
    pub fn arrivals(&self) -> &tokio::sync::Notify {
        &self.arrived
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn queue_id(&self) -> u32 {
        self.queue_id
    }

    /// The queue's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The first readable offset.
    pub fn min_offset(&self) -> u64 {
        self.min_offset.load(Ordering::Acquire)
    }

    /// One past the last entry (exclusive); the offset the next message gets.
    pub fn max_offset(&self) -> u64 {
        self.max_offset.load(Ordering::Acquire)
    }

    fn file_bytes(&self) -> usize {
        self.entries_per_file as usize * ENTRY_SIZE
    }

    fn lock_writer(&self) -> MutexGuard<'_, WriterState> {
        // WriterState is only a dirty range; after a panic it is still valid.
        crate::sync::lock(&self.writer)
    }

    /// The file holding `offset`, if it is mapped.
    fn file_of(&self, offset: u64) -> Option<Arc<CqFile>> {
        let files = crate::sync::read(&self.files);
        let first = files.first()?.first;
        if offset < first {
            return None;
        }
        files
            .get(((offset - first) / self.entries_per_file) as usize)
            .cloned()
    }

    /// Runs a read of mapped bytes until no rewrite overlapped it.
    fn consistent<T>(&self, mut read: impl FnMut() -> T) -> T {
        loop {
            let before = self.rewrites.load(Ordering::Acquire);
            let out = read();
            fence(Ordering::Acquire);
            if self.rewrites.load(Ordering::Relaxed) == before {
                return out;
            }
        }
    }

    /// The entry at `offset`; `None` when it is outside `[min, max)` or a hole.
    pub fn get(&self, offset: u64) -> Result<Option<CqEntry>> {
        Ok(self.consistent(|| {
            if offset < self.min_offset() || offset >= self.max_offset() {
                return None;
            }
            self.file_of(offset)?.load(offset)
        }))
    }

    /// Up to `max` slots from `from` (fewer at the end of the queue; holes are
    /// skipped but count towards `max`). Reading at `max_offset` returns an
    /// empty batch; below `min_offset` or past `max_offset` is
    /// [`Error::OffsetOutOfRange`], so a consumer can correct its offset.
    pub fn read(&self, from: u64, max: usize) -> Result<CqBatch> {
        self.consistent(|| self.read_once(from, max))
    }

    fn read_once(&self, from: u64, max: usize) -> Result<CqBatch> {
        let min_offset = self.min_offset();
        let max_offset = self.max_offset();
        let out_of_range = |min| Error::OffsetOutOfRange {
            offset: from,
            min,
            max: max_offset,
        };
        if from < min_offset || from > max_offset {
            return Err(out_of_range(min_offset));
        }
        let end = max_offset.min(from.saturating_add(max as u64));
        let mut entries = Vec::with_capacity((end - from) as usize);
        let mut offset = from;
        while offset < end {
            // Retention may have dropped the file since `min_offset` was read.
            let file = self
                .file_of(offset)
                .ok_or_else(|| out_of_range(self.min_offset()))?;
            let file_end = end.min(file.first + self.entries_per_file);
            for o in offset..file_end {
                if let Some(e) = file.load(o) {
                    entries.push((o, e));
                }
            }
            offset = file_end;
        }
        Ok(CqBatch {
            entries,
            next_offset: end,
        })
    }

    /// Writes `entry` at `queue_offset`.
    ///
    /// - At `max_offset` (normal operation): appends and publishes.
    /// - Below `max_offset`: idempotent re-dispatch after a crash. Same bytes is
    ///   a no-op; different bytes (a torn write) are rewritten, fenced for
    ///   readers. Below `min_offset` the entry has expired and is ignored.
    /// - Past `max_offset` (a gap): allowed, forward only. The skipped slots stay
    ///   empty *holes* that reads skip and `get` reports as `None`; on an empty
    ///   queue the gap simply moves `min_offset` to `queue_offset`. A warning is
    ///   logged because the store never does this in normal operation.
    pub fn put(&self, queue_offset: u64, entry: CqEntry) -> Result<()> {
        entry.validate()?;
        let mut w = self.lock_writer();
        let min = self.min_offset.load(Ordering::Relaxed);
        let max = self.max_offset.load(Ordering::Relaxed);
        let empty = min == max;
        if queue_offset < min {
            debug!(topic = %self.topic, queue_id = self.queue_id, queue_offset, min,
                "consume queue put below min offset ignored (expired)");
            return Ok(());
        }
        let bytes = entry.encode();
        if queue_offset < max {
            let file = self
                .file_of(queue_offset)
                .ok_or_else(|| self.missing(queue_offset))?;
            if file.load_raw(queue_offset) == bytes {
                return Ok(());
            }
            warn!(topic = %self.topic, queue_id = self.queue_id, queue_offset,
                "rewriting a consume queue entry with different bytes (torn write?)");
            self.rewrites.fetch_add(1, Ordering::Release);
            fence(Ordering::Release);
            file.store(queue_offset, &bytes);
            w.mark_dirty(queue_offset, queue_offset + 1);
            return Ok(());
        }
        if queue_offset > max && !empty {
            warn!(topic = %self.topic, queue_id = self.queue_id, queue_offset, max,
                "gap in consume queue: slots {max}..{queue_offset} stay empty");
        }
        let file = self.file_for_write(queue_offset)?;
        file.store(queue_offset, &bytes);
        if empty {
            self.min_offset.store(queue_offset, Ordering::Release);
        }
        self.max_offset.store(queue_offset + 1, Ordering::Release);
        w.mark_dirty(queue_offset, queue_offset + 1);
        Ok(())
    }

    fn missing(&self, offset: u64) -> Error {
        Error::Corrupt {
            path: self.dir.clone(),
            offset: offset * ENTRY_SIZE as u64,
            reason: format!("no mapped file holds queue offset {offset}"),
        }
    }

    /// The file for a new entry at `offset`, creating it (and any files between
    /// the last one and it, to keep `files` contiguous) if needed.
    fn file_for_write(&self, offset: u64) -> Result<Arc<CqFile>> {
        if let Some(f) = self.file_of(offset) {
            return Ok(f);
        }
        let epf = self.entries_per_file;
        let target = offset / epf * epf;
        let next = {
            let files = crate::sync::read(&self.files);
            match files.last() {
                Some(last) if target < last.first => return Err(self.missing(offset)),
                Some(last) => last.first + epf,
                None => target,
            }
        };
        fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let mut first = next;
        while first <= target {
            let path = self.dir.join(file_name(first));
            let map = MappedFile::create(&path, self.file_bytes(), self.file_bytes(), &self.io)?;
            // Push one by one: a reader never sees a file it cannot use.
            crate::sync::write(&self.files).push(Arc::new(CqFile { first, map }));
            first += epf;
        }
        self.file_of(offset).ok_or_else(|| self.missing(offset))
    }

    /// Unmaps the entries below `max_offset - keep` (they stay on disk and in
    /// the page cache; see `store::resident`).
    pub fn release_cold(&self, keep: u64) {
        let limit = self.max_offset().saturating_sub(keep);
        let files: Vec<Arc<CqFile>> = crate::sync::read(&self.files).clone();
        for f in files {
            if f.first >= limit {
                break;
            }
            let end = limit.min(f.first + self.entries_per_file);
            f.map.release(0, f.pos(end));
        }
    }

    /// msyncs every entry written since the last flush.
    pub fn flush(&self) -> Result<()> {
        let Some((lo, hi)) = self.lock_writer().dirty.take() else {
            return Ok(());
        };
        let result = self.flush_range(lo, hi);
        if result.is_err() {
            self.lock_writer().mark_dirty(lo, hi);
        }
        result
    }

    fn flush_range(&self, lo: u64, hi: u64) -> Result<()> {
        let mut offset = lo;
        while offset < hi {
            let Some(file) = self.file_of(offset) else {
                // Deleted by retention since it was written: nothing to flush.
                offset = (offset / self.entries_per_file + 1) * self.entries_per_file;
                continue;
            };
            let end = hi.min(file.first + self.entries_per_file);
            file.map
                .flush_range(file.pos(offset), (end - offset) as usize * ENTRY_SIZE)?;
            offset = end;
        }
        Ok(())
    }

    /// Drops every entry whose message ends beyond `phys_end` (after commit-log
    /// recovery truncated a torn tail), zeroes them on disk and flushes, so a
    /// restart agrees. Returns how many slots were dropped.
    pub fn truncate_from_phys(&self, phys_end: u64) -> Result<u64> {
        let mut w = self.lock_writer();
        let min = self.min_offset.load(Ordering::Relaxed);
        let max = self.max_offset.load(Ordering::Relaxed);
        let mut new_max = max;
        while new_max > min {
            let file = self
                .file_of(new_max - 1)
                .ok_or_else(|| self.missing(new_max - 1))?;
            match file.load(new_max - 1) {
                Some(e) if e.phys_end() <= phys_end => break,
                _ => new_max -= 1,
            }
        }
        if new_max == max {
            return Ok(0);
        }
        // Order matters (see `# Invariants`): stop new reads first, then bump
        // the seqlock, then change bytes.
        self.max_offset.store(new_max, Ordering::Release);
        self.rewrites.fetch_add(1, Ordering::Release);
        fence(Ordering::Release);
        for offset in new_max..max {
            if let Some(file) = self.file_of(offset) {
                file.store(offset, &ZERO_ENTRY);
            }
        }
        w.mark_dirty(new_max, max);
        let dirty = w.dirty.take();
        drop(w);
        if let Some((lo, hi)) = dirty
            && let Err(e) = self.flush_range(lo, hi)
        {
            self.lock_writer().mark_dirty(lo, hi);
            return Err(e);
        }
        debug!(topic = %self.topic, queue_id = self.queue_id, from = new_max, to = max,
            "consume queue truncated");
        Ok(max - new_max)
    }

    /// Retention: deletes whole files whose every entry points below `min_phys`
    /// (never the last file, nor the one holding the write position) and
    /// advances `min_offset` to the first entry with phys offset >= `min_phys`
    /// (to `max_offset` if there is none). Returns the number of files deleted.
    pub fn delete_before_phys(&self, min_phys: u64) -> Result<usize> {
        let _w = self.lock_writer();
        let min = self.min_offset.load(Ordering::Relaxed);
        let max = self.max_offset.load(Ordering::Relaxed);
        let epf = self.entries_per_file;
        let files: Vec<Arc<CqFile>> = crate::sync::read(&self.files).clone();
        let mut doomed = 0;
        for (i, file) in files.iter().enumerate() {
            let end = file.first + epf;
            if i + 1 == files.len() || end > max {
                break;
            }
            let last_valid = (file.first..end).rev().find_map(|o| file.load(o));
            match last_valid {
                Some(e) if e.phys_offset >= min_phys => break,
                _ => doomed += 1,
            }
        }
        let first_kept = files.get(doomed).map_or(min, |f| f.first);
        let new_min =
            self.lower_bound(min.max(first_kept), max, |e| Ok(e.phys_offset >= min_phys))?;
        if new_min > min {
            self.min_offset.store(new_min, Ordering::Release);
        }
        if doomed == 0 {
            return Ok(0);
        }
        // `min_offset` moved past these files before they leave the list.
        crate::sync::write(&self.files).drain(..doomed);
        for file in &files[..doomed] {
            fs::remove_file(file.map.path()).map_err(|e| Error::io(file.map.path(), e))?;
        }
        debug!(topic = %self.topic, queue_id = self.queue_id, files = doomed, new_min,
            "consume queue files deleted by retention");
        Ok(doomed)
    }

    /// The first valid offset in `[lo, hi)` whose entry satisfies `pred`, or
    /// `hi`. `pred` must be monotone (false..., true...) over valid entries;
    /// holes are stepped over.
    fn lower_bound(
        &self,
        mut lo: u64,
        mut hi: u64,
        mut pred: impl FnMut(CqEntry) -> Result<bool>,
    ) -> Result<u64> {
        let mut found = hi;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.next_valid(mid, hi)? {
                None => hi = mid,
                Some((probe, entry)) => {
                    if pred(entry)? {
                        found = probe;
                        hi = mid;
                    } else {
                        lo = probe + 1;
                    }
                }
            }
        }
        Ok(found)
    }

    /// The first valid entry in `[from, to)`.
    fn next_valid(&self, from: u64, to: u64) -> Result<Option<(u64, CqEntry)>> {
        let mut offset = from;
        while offset < to {
            let Some(file) = self.file_of(offset) else {
                return Err(Error::OffsetOutOfRange {
                    offset,
                    min: self.min_offset(),
                    max: self.max_offset(),
                });
            };
            let end = to.min(file.first + self.entries_per_file);
            for o in offset..end {
                if let Some(e) = file.load(o) {
                    return Ok(Some((o, e)));
                }
            }
            offset = end;
        }
        Ok(None)
    }

    /// The first offset whose message was stored at or after `ts_ms`:
    /// `min_offset` if `ts_ms` is before the first, `max_offset` if after the
    /// last. Binary search (O(log n) calls of `store_ts_of`), relying on store
    /// timestamps being non-decreasing in queue order; `store_ts_of(phys, size)`
    /// returns the store timestamp of the message at that commit-log position.
    pub fn offset_at_or_after_time(
        &self,
        ts_ms: i64,
        store_ts_of: impl Fn(u64, u32) -> Result<i64>,
    ) -> Result<u64> {
        self.consistent(|| {
            let (min, max) = (self.min_offset(), self.max_offset());
            self.lower_bound(min, max, |e| {
                Ok(store_ts_of(e.phys_offset, e.size)? >= ts_ms)
            })
        })
    }

    /// Deletes every file of this queue and its directory. Used by
    /// [`super::ConsumeQueues::remove_topic`] once the queue left the table.
    pub(super) fn destroy(&self) -> Result<()> {
        let _w = self.lock_writer();
        crate::sync::write(&self.files).clear();
        let max = self.max_offset.load(Ordering::Relaxed);
        self.min_offset.store(max, Ordering::Release);
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&self.dir, e)),
        }
    }

    /// Finds min/max on open, drops a torn tail and zeroes everything past it.
    fn recover(&self) -> Result<()> {
        let files = crate::sync::read(&self.files).clone();
        let (Some(first), Some(last)) = (files.first(), files.last()) else {
            return Ok(());
        };
        let start = first.first;
        let end = last.first + self.entries_per_file;
        let load = |o: u64| -> Option<CqEntry> {
            files[((o - start) / self.entries_per_file) as usize].load(o)
        };
        let prev_valid = |to: u64| (start..to).rev().find_map(|o| load(o).map(|e| (o, e)));

        let mut max = prev_valid(end).map_or(start, |(o, _)| o + 1);
        // Torn tail: the last entry must start at or after its predecessor's end.
        while let Some((last_off, last)) = prev_valid(max) {
            match prev_valid(last_off) {
                Some((_, prev)) if last.phys_offset < prev.phys_end() => {
                    warn!(topic = %self.topic, queue_id = self.queue_id, offset = last_off,
                        "dropping torn consume queue entry at the tail");
                    max = prev_valid(last_off).map_or(start, |(o, _)| o + 1);
                }
                _ => break,
            }
        }
        let min = (start..max).find(|&o| load(o).is_some()).unwrap_or(max);

        let mut zeroed = false;
        for o in max..end {
            let file = &files[((o - start) / self.entries_per_file) as usize];
            if file.load_raw(o) != ZERO_ENTRY {
                file.store(o, &ZERO_ENTRY);
                zeroed = true;
            }
        }
        self.min_offset.store(min, Ordering::Release);
        self.max_offset.store(max, Ordering::Release);
        if zeroed {
            self.flush_range(max, end)?;
        }
        Ok(())
    }
}

/// `00000000000000000000`-style name: the logical byte offset of the first entry.
fn file_name(first_entry: u64) -> String {
    format!(
        "{:0width$}",
        first_entry * ENTRY_SIZE as u64,
        width = NAME_DIGITS
    )
}

/// Maps the files of a queue directory, checking names, sizes and contiguity.
fn load_files(dir: &Path, entries_per_file: u64, io: &Files) -> Result<Vec<Arc<CqFile>>> {
    let read_dir = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let file_bytes = entries_per_file * ENTRY_SIZE as u64;
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for dent in read_dir {
        let dent = dent.map_err(|e| Error::io(dir, e))?;
        let path = dent.path();
        let name = dent.file_name();
        let parsed = name
            .to_str()
            .filter(|n| n.len() == NAME_DIGITS && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok());
        let Some(byte_offset) = parsed else {
            if !crate::store::mapped::remove_if_unfinished(&path)? {
                warn!(path = %path.display(), "ignoring unexpected file in consume queue directory");
            }
            continue;
        };
        if byte_offset % file_bytes != 0 {
            return Err(Error::Corrupt {
                path,
                offset: 0,
                reason: format!(
                    "name is not a multiple of the file size {file_bytes} \
                     (was entries_per_file changed?)"
                ),
            });
        }
        found.push((byte_offset / ENTRY_SIZE as u64, path));
    }
    found.sort();
    let mut files = Vec::with_capacity(found.len());
    for (i, (first, path)) in found.iter().enumerate() {
        if let Some((prev, _)) = i.checked_sub(1).map(|p| &found[p])
            && *first != prev + entries_per_file
        {
            return Err(Error::Corrupt {
                path: path.clone(),
                offset: 0,
                reason: format!(
                    "consume queue files are not contiguous: the file for queue offset {} is missing",
                    prev + entries_per_file
                ),
            });
        }
        let map = MappedFile::open(path, file_bytes as usize, file_bytes as usize, io)?;
        files.push(Arc::new(CqFile { first: *first, map }));
    }
    Ok(files)
}
