//! The key index: find messages by business key (`KEYS` property) or unique id
//! (`UNIQ_KEY`) within a time range, for the admin "find this message" queries.
//! It owns the files under `<root>/index/`, RocketMQ's IndexFile design: a
//! memory-mapped hash table with chained entries, so memory use does not grow
//! with the number of messages. It returns *candidate* commit-log offsets and
//! knows no commit-log type: hashes collide, so callers confirm each candidate
//! by reading the message. Start with [`IndexStore`]; the layout is in
//! `docs/storage-queues.md`.

mod file;

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use tracing::{debug, warn};

use self::file::IndexFile;
use crate::error::{Error, Result};
use crate::store::consume_queue::{java_string_hash, java_string_hash_from};
use crate::store::io::Files;

/// RocketMQ's default hash slots per index file.
pub const DEFAULT_SLOTS: u32 = 5_000_000;
/// RocketMQ's default entries per index file.
pub const DEFAULT_MAX_ENTRIES: u32 = 20_000_000;

const NAME_DIGITS: usize = 20;

/// What only the writer touches.
#[derive(Debug, Default)]
struct WriterState {
    /// Files with entries not yet flushed (the active one, plus any just rolled).
    dirty: Vec<Arc<IndexFile>>,
}

/// All index files, the last one active.
///
/// # Invariants
///
/// - **One writer, many readers.** `put`, `flush` and `delete_files_before_phys`
///   serialise on `writer` (only the store's dispatcher calls `put`). `query`
///   takes no lock but a short read lock on `files` to clone the list.
/// - **Publish after write.** `put` writes the 20-byte entry and the header
///   fields first, then stores the entry count and then the slot's chain head,
///   both with `Release`. Readers load the count or the head with `Acquire`, so
///   any entry they reach is fully written. Published entries are never
///   modified again (only whole files are deleted), so chains are stable.
/// - Entry numbers start at 1; 0 in a slot or a `prev` field ends a chain. A
///   chain's `prev` numbers strictly decrease; readers stop on anything else,
///   so a damaged file cannot loop a query.
/// - Phys offsets and timestamps grow from file to file; within a file, the
///   header holds the min/max of what it indexed. The last file is never
///   deleted.
#[derive(Debug)]
pub struct IndexStore {
    dir: PathBuf,
    slots: u32,
    max_entries: u32,
    /// Ordered by name. An `RwLock` because a query clones the `Arc`s under a
    /// read lock and the writer takes it only to push a new file or drop old
    /// ones (never across file I/O). A dropped file stays mapped until its
    /// last reader lets go.
    files: RwLock<Vec<Arc<IndexFile>>>,
    /// Serialises writers; holds what only the writer needs.
    writer: Mutex<WriterState>,
    /// File operations (production: the syscalls; tests inject faults).
    io: Files,
}

impl IndexStore {
    /// Opens `<root>/index/` (created on the first put). Files whose name is not
    /// 20 digits are ignored with a warning; a file of the wrong size or with a
    /// header that does not parse is [`Error::Corrupt`]. `slots` and
    /// `max_entries` must match what the files were created with.
    pub fn open(root: &Path, slots: u32, max_entries: u32) -> Result<Self> {
        Self::open_with(root, slots, max_entries, Files::os())
    }

    /// [`IndexStore::open`] with the given file operations.
    pub fn open_with(root: &Path, slots: u32, max_entries: u32, io: Files) -> Result<Self> {
        if slots == 0
            || slots > i32::MAX as u32
            || max_entries == 0
            || max_entries > i32::MAX as u32
        {
            return Err(Error::InvalidArgument(format!(
                "index slots ({slots}) and max entries ({max_entries}) must be in 1..=i32::MAX"
            )));
        }
        if file::file_size(slots, max_entries).is_none() {
            return Err(Error::InvalidArgument(
                "index file size overflows usize".into(),
            ));
        }
        let dir = root.join("index");
        let mut files = Vec::new();
        let read_dir = match fs::read_dir(&dir) {
            Ok(rd) => Some(rd),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(&dir, e)),
        };
        for dent in read_dir.into_iter().flatten() {
            let dent = dent.map_err(|e| Error::io(&dir, e))?;
            let path = dent.path();
            let name = dent
                .file_name()
                .to_str()
                .filter(|n| n.len() == NAME_DIGITS && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u64>().ok());
            match name {
                Some(name) => files.push(Arc::new(IndexFile::open(
                    &path,
                    name,
                    slots,
                    max_entries,
                    &io,
                )?)),
                None => {
                    if !crate::store::mapped::remove_if_unfinished(&path)? {
                        warn!(path = %path.display(), "ignoring unexpected file in index directory")
                    }
                }
            }
        }
        files.sort_by_key(|f| f.name);
        Ok(Self {
            dir,
            slots,
            max_entries,
            files: RwLock::new(files),
            writer: Mutex::new(WriterState::default()),
            io,
        })
    }

    fn lock_writer(&self) -> MutexGuard<'_, WriterState> {
        // Only a list of files to flush; still valid after a panic.
        crate::sync::lock(&self.writer)
    }

    fn snapshot(&self) -> Vec<Arc<IndexFile>> {
        crate::sync::read(&self.files).clone()
    }

    /// Indexes `<topic>#<key>` for the message at `phys_offset` stored at
    /// `store_ts_ms`. Empty keys are ignored. Re-indexing a (key, phys) already
    /// in the active file (re-dispatch after a crash) is skipped; duplicates in
    /// older files are removed by `query`.
    pub fn put(&self, topic: &str, key: &str, phys_offset: u64, store_ts_ms: i64) -> Result<()> {
        if key.is_empty() {
            return Ok(());
        }
        if phys_offset > i64::MAX as u64 {
            return Err(Error::InvalidArgument(format!(
                "phys offset {phys_offset} exceeds i64::MAX"
            )));
        }
        let hash = key_hash(topic, key);
        let mut w = self.lock_writer();
        let last = crate::sync::read(&self.files).last().cloned();
        let active = match last {
            Some(f) if !f.is_full() => f,
            last => self.roll(last.map(|f| f.name), store_ts_ms)?,
        };
        let header = active.header();
        if header.count > 0
            && phys_offset as i64 <= header.end_phys
            && self.chain_has(&active, hash, phys_offset)
        {
            return Ok(());
        }
        active.append(hash, phys_offset, store_ts_ms)?;
        if !w.dirty.iter().any(|f| Arc::ptr_eq(f, &active)) {
            w.dirty.push(active);
        }
        Ok(())
    }

    /// Creates the next file, named by `ts_ms` (bumped past the previous name
    /// so names stay unique and ordered).
    fn roll(&self, prev_name: Option<u64>, ts_ms: i64) -> Result<Arc<IndexFile>> {
        let name = (ts_ms.max(0) as u64).max(prev_name.map_or(0, |p| p + 1));
        fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let path = self.dir.join(format!("{name:0NAME_DIGITS$}"));
        let file = Arc::new(IndexFile::create(
            &path,
            name,
            self.slots,
            self.max_entries,
            &self.io,
        )?);
        crate::sync::write(&self.files).push(file.clone());
        debug!(path = %path.display(), "new index file");
        Ok(file)
    }

    /// Whether `file` already has (hash, phys) in that hash's chain. Chains are
    /// newest first and phys offsets grow, so the walk stops below `phys`.
    fn chain_has(&self, file: &IndexFile, hash: i32, phys: u64) -> bool {
        let mut found = false;
        walk_chain(file, file.slot_of(hash), |e| {
            if e.phys_offset < phys {
                return false;
            }
            found = e.key_hash == hash && e.phys_offset == phys;
            !found
        });
        found
    }

    /// Candidate phys offsets of messages with `key` in `topic` stored within
    /// `[begin_ms, end_ms]`, newest first, deduplicated, at most `max`.
    ///
    /// Candidates may be false positives: other keys with the same hash, and
    /// messages up to 999 ms outside the range (times are kept in whole seconds
    /// from the file's begin timestamp). Callers read each message and check its
    /// keys and timestamp.
    pub fn query(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<u64>> {
        let hash = key_hash(topic, key);
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for file in self.snapshot().iter().rev() {
            if out.len() >= max {
                break;
            }
            let h = file.header();
            if h.count == 0 || h.begin_ts > end_ms || h.end_ts < begin_ms {
                continue;
            }
            walk_chain(file, file.slot_of(hash), |e| {
                let lo = h.begin_ts.saturating_add(i64::from(e.time_diff_s) * 1000);
                let in_range = lo <= end_ms && lo.saturating_add(999) >= begin_ms;
                if e.key_hash == hash && in_range && seen.insert(e.phys_offset) {
                    out.push(e.phys_offset);
                }
                out.len() < max
            });
        }
        Ok(out)
    }

    /// msyncs every file with unflushed entries.
    pub fn flush(&self) -> Result<()> {
        let dirty = std::mem::take(&mut self.lock_writer().dirty);
        for (i, file) in dirty.iter().enumerate() {
            if let Err(e) = file.flush() {
                let mut w = self.lock_writer();
                for f in &dirty[i..] {
                    if !w.dirty.iter().any(|d| Arc::ptr_eq(d, f)) {
                        w.dirty.push(f.clone());
                    }
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Deletes whole files whose highest indexed phys offset is below
    /// `min_phys` (retention followed the commit log). The active (last) file
    /// is never deleted. Returns the number of files deleted.
    pub fn delete_files_before_phys(&self, min_phys: u64) -> Result<usize> {
        let mut w = self.lock_writer();
        let files = self.snapshot();
        let doomed = files
            .iter()
            .take(files.len().saturating_sub(1))
            .take_while(|f| {
                let h = f.header();
                h.count == 0 || (h.end_phys as u64) < min_phys
            })
            .count();
        if doomed == 0 {
            return Ok(0);
        }
        crate::sync::write(&self.files).drain(..doomed);
        w.dirty
            .retain(|d| !files[..doomed].iter().any(|f| Arc::ptr_eq(d, f)));
        drop(w);
        for f in &files[..doomed] {
            fs::remove_file(f.path()).map_err(|e| Error::io(f.path(), e))?;
        }
        Ok(doomed)
    }

    /// The highest phys offset indexed, `None` if nothing is. After a crash the
    /// store re-indexes from the message *at* this offset (inclusive: it may
    /// have more keys than were indexed); duplicates are skipped.
    pub fn max_phys_offset(&self) -> Option<u64> {
        self.snapshot()
            .iter()
            .map(|f| f.header())
            .filter(|h| h.count > 0)
            .map(|h| h.end_phys as u64)
            .max()
    }

    /// Number of index files (for metrics and tests).
    pub fn file_count(&self) -> usize {
        crate::sync::read(&self.files).len()
    }
}

/// RocketMQ's indexed key: `topic#key`.
/// RocketMQ's hash of the index key `<topic>#<key>` (Java `String.hashCode()`).
fn key_hash(topic: &str, key: &str) -> i32 {
    java_string_hash_from(java_string_hash_from(java_string_hash(topic), "#"), key)
}

/// Visits a slot's chain newest first while `visit` returns true. Stops at a
/// `prev` that does not decrease (a damaged file) instead of looping.
fn walk_chain(file: &IndexFile, slot: u32, mut visit: impl FnMut(file::IndexEntry) -> bool) {
    let mut n = file.head(slot);
    while n != 0 {
        let e = file.entry(n);
        if !visit(e) {
            return;
        }
        if e.prev >= n {
            warn!(path = %file.path().display(), entry = n, prev = e.prev,
                "index chain does not decrease; stopping");
            return;
        }
        n = e.prev;
    }
}
