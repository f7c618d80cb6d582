//! The commit log: every message of every topic appended, in RocketMQ's record
//! layout, to one log of fixed-size memory-mapped segment files in
//! `<data_dir>/commitlog/`. This module owns appending (offset and queue-offset
//! assignment, segment roll with blank fillers), zero-copy reads, the written
//! and durable positions, and the retention hooks. It does not decide policy:
//! when to flush (the `flush` module, which drives this one), what to delete, and what the
//! consume queues say are the store's business.
//!
//! Start with [`CommitLog::open`], [`CommitLog::append_batch`] and
//! [`CommitLog::records_from`]. Recovery lives in `commit_log/recovery.rs`, the
//! mapped file in `commit_log/segment.rs`; the on-disk format is described in
//! `docs/storage-format.md`.

mod recovery;
mod replica;
mod segment;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

pub use recovery::{Recovery, RecoveryReport};
pub use replica::{Appended, Shipment};
pub use segment::RecordRef;
use segment::Segment;
pub(crate) use segment::parse_file_name as parse_segment_name;

use crate::error::{Error, Result};
use crate::store::io::Files;
use crate::store::record::{
    self, END_FILE_MIN_BLANK_LENGTH, Header, Message, Parts, Placed, PlainBatch, Props, Stamp,
};

/// Name of the commit log's directory inside the data directory.
pub const DIR_NAME: &str = "commitlog";
/// Smallest segment accepted (the config crate's minimum too).
pub const MIN_SEGMENT_SIZE: u64 = 64 * 1024;
/// Largest segment: a blank filler's TOTALSIZE is an i32.
pub const MAX_SEGMENT_SIZE: u64 = i32::MAX as u64;

/// How the log is laid out and what it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitLogSettings {
    /// Size of every segment file, `MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE`.
    pub segment_size: u64,
    /// Largest encoded record accepted; at most `segment_size - 8`.
    pub max_message_size: usize,
    /// Append with `pwrite` and sync with `fdatasync` rather than memcpy into the
    /// mapping and `msync`; the better choice under sync flush (see `Segment`).
    pub write_through: bool,
    /// This broker's address, stored in STOREHOST and in message ids.
    pub store_host: SocketAddr,
}

impl CommitLogSettings {
    pub fn validate(&self) -> Result<()> {
        if !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&self.segment_size) {
            return Err(Error::InvalidArgument(format!(
                "commit log segment size {} must be in {MIN_SEGMENT_SIZE}..={MAX_SEGMENT_SIZE}",
                self.segment_size
            )));
        }
        let max = self.segment_size - END_FILE_MIN_BLANK_LENGTH as u64;
        if self.max_message_size as u64 > max || self.max_message_size < record::MIN_RECORD_LEN {
            return Err(Error::InvalidArgument(format!(
                "max message size {} must be in {}..={max} for segments of {}",
                self.max_message_size,
                record::MIN_RECORD_LEN,
                self.segment_size
            )));
        }
        Ok(())
    }
}

/// Where an appended message landed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AppendResult {
    pub phys_offset: u64,
    pub size: u32,
    pub queue_offset: u64,
    pub store_timestamp: i64,
    /// RocketMQ offset message id (store host + physical offset).
    pub msg_id: String,
    /// `phys_offset + size`: what a durability wait needs.
    pub end_offset: u64,
}

/// One segment file, as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub start: u64,
    /// File size (the segment size).
    pub size: u64,
    /// Bytes of this segment below the written position.
    pub written: u64,
    /// Newest store timestamp appended or recovered in this process, if known.
    pub last_store_timestamp: Option<i64>,
    /// File modification time, the fallback when the timestamp is unknown.
    pub modified: Option<SystemTime>,
    pub path: PathBuf,
}

/// Next queue offset per (topic, queue id): RocketMQ's topicQueueTable.
/// Nested so the hot path can look up by `&str` without allocating; foldhash
/// because it is read and written for every message appended.
#[derive(Debug, Default)]
struct QueueOffsets(foldhash::HashMap<String, foldhash::HashMap<u32, u64>>);

impl QueueOffsets {
    fn from_flat(flat: HashMap<(String, u32), u64>) -> Self {
        let mut t = QueueOffsets::default();
        for ((topic, qid), next) in flat {
            t.0.entry(topic).or_default().insert(qid, next);
        }
        t
    }

    fn to_flat(&self) -> HashMap<(String, u32), u64> {
        let mut flat = HashMap::new();
        for (topic, queues) in &self.0 {
            for (qid, next) in queues {
                flat.insert((topic.clone(), *qid), *next);
            }
        }
        flat
    }

    fn get(&self, topic: &str, qid: u32) -> u64 {
        self.0
            .get(topic)
            .and_then(|q| q.get(&qid))
            .copied()
            .unwrap_or(0)
    }

    fn set(&mut self, topic: &str, qid: u32, next: u64) {
        match self.0.get_mut(topic) {
            Some(queues) => {
                queues.insert(qid, next);
            }
            None => {
                self.0
                    .entry(topic.to_owned())
                    .or_default()
                    .insert(qid, next);
            }
        }
    }
}

/// What the appender owns, behind the append lock.
struct AppendState {
    /// The segment being written (always the last in `CommitLog::segments`).
    active: Arc<Segment>,
    /// Next write position; equals the published `written` between appends.
    pos: u64,
    queue_offsets: QueueOffsets,
}

/// The append-only, memory-mapped log of every message.
///
/// # Invariants
/// - `min_offset() <= flushed_offset() <= max_offset()` (min <= durable <= written).
/// - Bytes in `min_offset()..max_offset()` are whole records and blank fillers,
///   never half-copied: the written position is published with a Release store
///   after the memcpy, and readers load it with Acquire.
/// - Bytes below `flushed_offset()` are durable (msynced, and the segment's
///   directory entry fsynced).
/// - Every segment file is exactly `segment_size` bytes, segments are contiguous,
///   and each one except the last ends with a blank filler (or is exactly full).
/// - A record never crosses a segment and leaves at least 8 bytes after it in
///   its segment, so there is always room for the filler.
/// - Bytes at and above the written position are zero after `open` (recovery
///   zeroes a torn tail), and are touched only by the appender; a write that
///   fails part way is zeroed again before the next one (or the log stops).
/// - After a failed sync the log is *stopped* ([`CommitLog::stopped`]) for good:
///   no append and no sync is accepted, so nothing is acknowledged on the word
///   of a retried `fsync` (the kernel may have dropped the dirty pages and
///   cleared the error). Reopening runs crash recovery from the durable point.
pub struct CommitLog {
    dir: PathBuf,
    config: CommitLogSettings,
    /// Oldest first, contiguous, never empty. A reader holds the lock only to
    /// clone an `Arc`; the appender takes it for writing only when rolling to a
    /// new segment, retention only to drop the oldest ones.
    segments: RwLock<Vec<Arc<Segment>>>,
    /// Serialises appenders for offset assignment, stamping and the memcpy; the
    /// only I/O under it is creating the next segment file at a roll. A std
    /// mutex: append is synchronous, so it is never held across an `.await`.
    append: Mutex<AppendState>,
    /// End of the last whole record (Release-published by the appender).
    written: AtomicU64,
    /// Durable position (advanced by `flush` only after a successful msync).
    flushed: AtomicU64,
    /// Pages of the active segment below this offset are pre-faulted (see
    /// [`CommitLog::warm_ahead`]); `u64::MAX` once pre-faulting failed (an old
    /// kernel without `MADV_POPULATE_WRITE`): not tried again.
    warmed: AtomicU64,
    /// File operations (production: the syscalls; tests inject faults).
    files: Files,
    /// Why the log stopped taking writes (a failed sync or an unrepairable
    /// partial write); set once, never cleared while open.
    stopped: std::sync::OnceLock<String>,
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl CommitLog {
    /// Opens (or creates) the log in `dir` (normally `<data_dir>/commitlog`),
    /// recovering its tail as `recovery` says. See [`Recovery`].
    pub fn open(
        dir: impl Into<PathBuf>,
        config: CommitLogSettings,
        recovery: Recovery,
    ) -> Result<(CommitLog, RecoveryReport)> {
        Self::open_with(dir, config, recovery, Files::os())
    }

    /// [`CommitLog::open`] with the given file operations (tests inject faults).
    pub fn open_with(
        dir: impl Into<PathBuf>,
        config: CommitLogSettings,
        recovery: Recovery,
        files: Files,
    ) -> Result<(CommitLog, RecoveryReport)> {
        config.validate()?;
        let dir = dir.into();
        let recovered = recovery::recover(&dir, &config, recovery, &files)?;
        let active = recovered
            .segments
            .last()
            .cloned()
            .ok_or_else(|| Error::InvalidArgument("recovery returned no segment".into()))?;
        let end = recovered.report.recovered_end;
        active.advise_appending(end.saturating_sub(active.start()) as usize);
        let log = CommitLog {
            dir,
            config,
            segments: RwLock::new(recovered.segments),
            append: Mutex::new(AppendState {
                active,
                pos: end,
                queue_offsets: QueueOffsets::from_flat(recovered.report.next_queue_offsets.clone()),
            }),
            written: AtomicU64::new(end),
            flushed: AtomicU64::new(recovered.durable.min(end)),
            warmed: AtomicU64::new(0),
            files,
            stopped: std::sync::OnceLock::new(),
        };
        // What recovery kept past the checkpoint may only be in the page cache
        // (a process crash); make it durable before anyone relies on it.
        log.flush()?;
        Ok((log, recovered.report))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &CommitLogSettings {
        &self.config
    }

    fn lock_append(&self) -> MutexGuard<'_, AppendState> {
        // A panic under the lock happens before `written` is published, so the
        // state is still consistent: keep going rather than poison every append.
        crate::sync::lock(&self.append)
    }

    fn segment_list(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Segment>>> {
        crate::sync::read(&self.segments)
    }

    /// Appends one message. Not durable until `flushed_offset() >= end_offset`.
    pub fn append(&self, msg: &Message) -> Result<AppendResult> {
        let mut results = self.append_batch(std::slice::from_ref(msg))?;
        results
            .pop()
            .ok_or_else(|| Error::InvalidArgument("empty append".into()))
    }

    /// Appends messages as one contiguous write in one segment (rolling first if
    /// they do not fit the rest of the current one). Either all are appended or
    /// none.
    pub fn append_batch(&self, msgs: &[Message]) -> Result<Vec<AppendResult>> {
        let host = self.config.store_host;
        let (store_timestamp, placed) = self.append_parts(msgs.len(), |i| Parts::of(&msgs[i]))?;
        Ok(placed
            .into_iter()
            .map(|p| AppendResult {
                phys_offset: p.phys_offset,
                size: p.size,
                queue_offset: p.queue_offset,
                store_timestamp,
                msg_id: record::encode_msg_id(host, p.phys_offset),
                end_offset: p.phys_offset + u64::from(p.size),
            })
            .collect())
    }

    /// Appends every entry of `batch` to queue `queue_id` of `topic` (the batch's
    /// own topic is not looked at), contiguously, all or none, copying each
    /// entry's pre-encoded properties through (checked plain: [`PlainBatch`]).
    /// Returns the store timestamp and where each record landed.
    pub fn append_encoded(
        &self,
        plain: PlainBatch<'_>,
        topic: &str,
        queue_id: u32,
    ) -> Result<(i64, Vec<Placed>)> {
        let batch = plain.batch();
        self.append_parts(batch.entries.len(), |i| {
            let e = &batch.entries[i];
            Parts {
                topic,
                queue_id,
                flag: e.flag,
                body: &e.body,
                properties: Props::Encoded(&e.properties),
                sys_flag: batch.sys_flag,
                born_timestamp: batch.born_timestamp,
                born_host: &batch.born_host,
                reconsume_times: batch.reconsume_times,
                prepared_transaction_offset: 0,
            }
        })
    }

    /// Encodes `n` records (outside the lock), then under the append lock assigns
    /// offsets, stamps and copies them into the segment in one write.
    fn append_parts<'a>(
        &self,
        n: usize,
        part: impl Fn(usize) -> Parts<'a>,
    ) -> Result<(i64, Vec<Placed>)> {
        let host = self.config.store_host;
        let mut buf = Vec::with_capacity((0..n).map(|i| part(i).size_hint()).sum());
        let mut encoded = Vec::with_capacity(n);
        for i in 0..n {
            let start = buf.len();
            let enc = record::encode_parts(&part(i), &host, &mut buf)?;
            if enc.len() > self.config.max_message_size {
                return Err(Error::MessageTooLarge {
                    size: enc.len(),
                    max: self.config.max_message_size,
                });
            }
            encoded.push((start, enc));
        }
        if encoded.is_empty() {
            return Ok((now_millis(), Vec::new()));
        }
        let max_batch = (self.config.segment_size as usize) - END_FILE_MIN_BLANK_LENGTH;
        if buf.len() > max_batch {
            return Err(Error::MessageTooLarge {
                size: buf.len(),
                max: max_batch,
            });
        }

        let mut st = self.lock_append();
        self.check_running()?;
        let (segment, base) = self.position_for(&mut st, buf.len() as u64)?;
        let store_timestamp = now_millis();
        // Stamp every record against a scratch copy of the touched queue offsets,
        // committed only after the write, so a failure leaves no gap in any queue.
        // A short list, not a map: a batch touches one queue (hashing the topic per
        // record showed in batch profiles).
        let mut touched: Vec<((&str, u32), u64)> = Vec::with_capacity(1);
        let mut placed = Vec::with_capacity(encoded.len());
        for (i, (start, enc)) in encoded.iter().enumerate() {
            let p = part(i);
            let key = (p.topic, p.queue_id);
            let slot = match touched.iter().position(|(k, _)| *k == key) {
                Some(j) => j,
                None => {
                    touched.push((key, st.queue_offsets.get(p.topic, p.queue_id)));
                    touched.len() - 1
                }
            };
            let stamp = Stamp {
                queue_offset: touched[slot].1,
                phys_offset: base + *start as u64,
                store_timestamp,
            };
            touched[slot].1 += 1;
            enc.stamp(&mut buf[*start..*start + enc.len()], &stamp)
                .map_err(|e| Error::InvalidMessage(e.to_string()))?;
            placed.push(Placed {
                phys_offset: stamp.phys_offset,
                size: enc.len() as u32,
                queue_offset: stamp.queue_offset,
            });
        }
        let at = (base - segment.start()) as usize;
        if let Err(e) = segment.write(at, &buf) {
            // Part of it may be in the file: whole records of a batch nobody
            // was told is stored, which a later recovery would find and serve.
            // Zero it (the bytes above the written position must be zero);
            // if even that fails, stop: the log's tail is unknown.
            if let Err(z) = segment.write(at, &vec![0u8; buf.len()]) {
                self.stop(format!(
                    "a failed append ({e}) could not be undone ({z}); the tail of the log is unknown"
                ));
            }
            return Err(e);
        }
        for ((topic, qid), next) in touched {
            st.queue_offsets.set(topic, qid, next);
        }
        segment.note_store_timestamp(store_timestamp);
        st.pos = base + buf.len() as u64;
        self.written.store(st.pos, Ordering::Release);
        drop(st);
        Ok((store_timestamp, placed))
    }

    /// The segment and position for a write of `len` bytes, rolling to a new
    /// segment (after a blank filler) when it does not fit with 8 bytes to spare.
    fn position_for(&self, st: &mut AppendState, len: u64) -> Result<(Arc<Segment>, u64)> {
        let remaining = st.active.end() - st.pos;
        if len + END_FILE_MIN_BLANK_LENGTH as u64 <= remaining {
            return Ok((st.active.clone(), st.pos));
        }
        let next = Arc::new(Segment::create(
            &self.dir,
            st.active.end(),
            self.config.segment_size as usize,
            self.config.write_through,
            &self.files,
        )?);
        if remaining >= END_FILE_MIN_BLANK_LENGTH as u64 {
            let mut blank = [0u8; 8];
            record::write_blank(&mut blank, remaining as u32);
            st.active
                .write((st.pos - st.active.start()) as usize, &blank)?;
        }
        crate::sync::write(&self.segments).push(next.clone());
        st.pos = st.active.end();
        next.advise_appending(0);
        let sealed = std::mem::replace(&mut st.active, next);
        sealed.advise_sealed();
        // The filler is whole; publishing it now keeps `written == pos`.
        self.written.store(st.pos, Ordering::Release);
        Ok((st.active.clone(), st.pos))
    }

    /// Pre-faults at most `step` more bytes of the active segment, continuing from
    /// what is already warm, toward `ahead` bytes past the written position (not
    /// into the next segment), so appends do not take a page fault and the
    /// kernel's zeroing of a fresh page per 4 KiB written. Returns how many bytes it
    /// pre-faulted: 0 when the window is warm. Run by the store's `rg-prefault`
    /// thread in small steps. A failure is returned once and
    /// then pre-faulting stops (appends still work: they fault their pages
    /// themselves).
    pub fn warm_ahead(&self, ahead: u64, step: u64) -> Result<u64> {
        let warmed = self.warmed.load(Ordering::Acquire);
        if warmed == u64::MAX {
            return Ok(0);
        }
        let written = self.max_offset();
        let Some(seg) = self
            .segment_for(written)
            .or_else(|| self.segment_list().last().cloned())
        else {
            return Ok(0);
        };
        let from = warmed.max(written).max(seg.start());
        let to = (written + ahead)
            .min(seg.end())
            .min(from.saturating_add(step));
        if to <= from {
            return Ok(0);
        }
        let rel = |p: u64| (p - seg.start()) as usize;
        if let Err(e) = seg.prefault(rel(from)..rel(to)) {
            self.warmed.store(u64::MAX, Ordering::Release);
            return Err(Error::io(seg.path(), e));
        }
        self.warmed.fetch_max(to, Ordering::AcqRel);
        Ok(to - from)
    }

    /// How many bytes past the written position are pre-faulted (0 after a
    /// segment roll until the new segment is warmed; `u64::MAX` when pre-faulting
    /// is off).
    pub fn warm_margin(&self) -> u64 {
        let warmed = self.warmed.load(Ordering::Acquire);
        if warmed == u64::MAX {
            return u64::MAX;
        }
        warmed.saturating_sub(self.max_offset())
    }

    /// Next queue offset the log will assign to (topic, queue id).
    pub fn next_queue_offset(&self, topic: &str, queue_id: u32) -> u64 {
        self.lock_append().queue_offsets.get(topic, queue_id)
    }

    /// A snapshot of the whole next-queue-offset table.
    pub fn next_queue_offsets(&self) -> HashMap<(String, u32), u64> {
        self.lock_append().queue_offsets.to_flat()
    }

    /// Replaces the next-queue-offset table. The store calls this after
    /// recovery, merging what the consume queues say with
    /// [`RecoveryReport::next_queue_offsets`].
    pub fn set_next_queue_offsets(&self, table: HashMap<(String, u32), u64>) {
        self.lock_append().queue_offsets = QueueOffsets::from_flat(table);
    }

    /// Start of the oldest segment.
    pub fn min_offset(&self) -> u64 {
        self.segment_list().first().map_or(0, |s| s.start())
    }

    /// The written position: end of the last whole record.
    pub fn max_offset(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// The durable position.
    pub fn flushed_offset(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// Why the log stopped taking writes, if it did (see the type's invariants).
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.get().map(String::as_str)
    }

    fn stop(&self, reason: String) {
        if self.stopped.set(reason.clone()).is_ok() {
            tracing::error!(
                dir = %self.dir.display(),
                %reason,
                "the commit log stopped taking writes; restart the node to recover from its last durable point"
            );
        }
    }

    fn check_running(&self) -> Result<()> {
        match self.stopped.get() {
            None => Ok(()),
            Some(reason) => Err(Error::FlushFailed(format!(
                "writes are stopped: {reason}; restart the node to recover from its last durable point"
            ))),
        }
    }

    fn out_of_range(&self, offset: u64) -> Error {
        Error::OffsetOutOfRange {
            offset,
            min: self.min_offset(),
            max: self.max_offset(),
        }
    }

    fn segment_for(&self, phys: u64) -> Option<Arc<Segment>> {
        let segs = self.segment_list();
        let i = segs.partition_point(|s| s.start() <= phys).checked_sub(1)?;
        segs.get(i).filter(|s| s.contains(phys)).cloned()
    }

    fn corrupt(seg: &Segment, offset: u64, reason: impl std::fmt::Display) -> Error {
        Error::Corrupt {
            path: seg.path().to_owned(),
            offset,
            reason: reason.to_string(),
        }
    }

    /// The message record at `phys` of `size` bytes (as a consume queue entry
    /// gives them). Checks the header agrees.
    pub fn read(&self, phys: u64, size: u32) -> Result<RecordRef> {
        let rec = self.read_at(phys)?;
        if rec.len() != size as usize {
            return Err(Self::corrupt(
                &rec.segment,
                phys,
                format!("record is {} bytes, caller expected {size}", rec.len()),
            ));
        }
        Ok(rec)
    }

    /// The message record at `phys`, its size taken from its header.
    pub fn read_at(&self, phys: u64) -> Result<RecordRef> {
        let written = self.max_offset();
        if phys.saturating_add(END_FILE_MIN_BLANK_LENGTH as u64) > written {
            return Err(self.out_of_range(phys));
        }
        let seg = self
            .segment_for(phys)
            .ok_or_else(|| self.out_of_range(phys))?;
        let rel = (phys - seg.start()) as usize;
        seg.check_read(rel..rel + 8)?;
        match record::read_header(seg.bytes(rel..rel + 8)) {
            Ok(Header::Message { size }) => {
                let end = phys + u64::from(size);
                if end > written || end > seg.end() {
                    return Err(Self::corrupt(
                        &seg,
                        phys,
                        format!("record size {size} runs past the written data"),
                    ));
                }
                seg.check_read(rel..rel + size as usize)?;
                Ok(RecordRef {
                    range: rel..rel + size as usize,
                    segment: seg,
                })
            }
            Ok(Header::Blank { .. }) => Err(Error::InvalidArgument(format!(
                "commit log offset {phys} holds an end-of-segment filler, not a message"
            ))),
            Ok(Header::Zero) => Err(Self::corrupt(
                &seg,
                phys,
                "zero header below the written position",
            )),
            Err(e) => Err(Self::corrupt(&seg, phys, e)),
        }
    }

    /// Walks records in order from `phys` (a record boundary), stepping over
    /// blank fillers, up to the written position. `next()` returns `None` at the
    /// written position and continues if more is appended later; it stops for
    /// good after an error.
    pub fn records_from(&self, phys: u64) -> Records<'_> {
        Records {
            log: self,
            pos: phys,
            segment: None,
            failed: false,
        }
    }

    /// Unmaps the log's pages below `flushed_offset() - keep` (they stay on disk
    /// and in the page cache, see `store::resident`), so a long backlog does not
    /// sit in the resident set.
    pub fn release_cold(&self, keep: u64) {
        let limit = self.flushed_offset().saturating_sub(keep);
        let segments: Vec<Arc<Segment>> = self.segment_list().clone();
        for seg in segments {
            if seg.start() >= limit {
                break;
            }
            let end = limit.min(seg.end()) - seg.start();
            seg.release(0..end as usize);
        }
    }

    /// msyncs everything written but not yet durable, and fsyncs the directory
    /// if a segment file was created since. Returns the new durable position;
    /// on error the durable position does not move. Safe to call concurrently.
    pub fn flush(&self) -> Result<u64> {
        // Never sync again after a failed sync: a retry that succeeds says
        // nothing about pages the kernel dropped after the first one failed.
        self.check_running()?;
        let target = self.max_offset();
        let from = self.flushed_offset();
        if target <= from {
            return Ok(from);
        }
        let touched: Vec<Arc<Segment>> = self
            .segment_list()
            .iter()
            .filter(|s| s.end() > from && s.start() < target)
            .cloned()
            .collect();
        let mut new_files = Vec::new();
        let result = (|| {
            for seg in &touched {
                if seg.take_needs_dir_sync() {
                    new_files.push(seg.clone());
                }
                let lo = from.max(seg.start()) - seg.start();
                let hi = target.min(seg.end()) - seg.start();
                seg.flush_range(lo as usize..hi as usize)?;
            }
            if !new_files.is_empty() {
                self.files
                    .sync_dir(&self.dir)
                    .map_err(|e| Error::io(&self.dir, e))?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            new_files.iter().for_each(|s| s.restore_needs_dir_sync());
            self.stop(format!("a commit-log sync failed: {e}"));
            return Err(e);
        }
        self.flushed.fetch_max(target, Ordering::AcqRel);
        Ok(target)
    }

    /// Every segment, oldest first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let written = self.max_offset();
        self.segment_list()
            .iter()
            .map(|s| Self::info(s, written))
            .collect()
    }

    fn info(seg: &Segment, written: u64) -> SegmentInfo {
        SegmentInfo {
            start: seg.start(),
            size: seg.end() - seg.start(),
            written: written.clamp(seg.start(), seg.end()) - seg.start(),
            last_store_timestamp: seg.last_store_timestamp(),
            modified: std::fs::metadata(seg.path())
                .and_then(|m| m.modified())
                .ok(),
            path: seg.path().to_owned(),
        }
    }

    /// Deletes segments from the oldest while `pred` says yes, stopping at the
    /// first it refuses. Never deletes the segment being written, nor one not
    /// yet wholly durable. Readers holding a [`RecordRef`] into a deleted
    /// segment keep its mapping. Returns what was deleted.
    pub fn delete_segments_where(
        &self,
        mut pred: impl FnMut(&SegmentInfo) -> bool,
    ) -> Result<Vec<SegmentInfo>> {
        let mut deleted = Vec::new();
        let written = self.max_offset();
        let flushed = self.flushed_offset();
        let mut segs = crate::sync::write(&self.segments);
        while segs.len() > 1 && segs[0].end() <= flushed {
            let info = Self::info(&segs[0], written);
            if !pred(&info) {
                break;
            }
            std::fs::remove_file(&info.path).map_err(|e| Error::io(&info.path, e))?;
            segs.remove(0);
            deleted.push(info);
        }
        Ok(deleted)
    }

    /// Deletes the oldest segment if allowed (see [`Self::delete_segments_where`]).
    pub fn delete_oldest_segment(&self) -> Result<Option<SegmentInfo>> {
        let mut first = true;
        let mut deleted = self.delete_segments_where(|_| std::mem::take(&mut first))?;
        Ok(deleted.pop())
    }
}

impl std::fmt::Debug for CommitLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitLog")
            .field("dir", &self.dir)
            .field("min", &self.min_offset())
            .field("flushed", &self.flushed_offset())
            .field("written", &self.max_offset())
            .finish()
    }
}

/// Cursor over records, from [`CommitLog::records_from`].
pub struct Records<'a> {
    log: &'a CommitLog,
    pos: u64,
    segment: Option<Arc<Segment>>,
    failed: bool,
}

impl Records<'_> {
    /// Offset of the next record (where a dispatcher resumes).
    pub fn position(&self) -> u64 {
        self.pos
    }

    fn step(&mut self) -> Option<Result<RecordRef>> {
        loop {
            let written = self.log.max_offset();
            if self.pos >= written {
                return None;
            }
            let seg = match self.segment.take().filter(|s| s.contains(self.pos)) {
                Some(s) => s,
                None => match self.log.segment_for(self.pos) {
                    Some(s) => s,
                    None => return Some(Err(self.log.out_of_range(self.pos))),
                },
            };
            self.segment = Some(seg.clone());
            let rel = (self.pos - seg.start()) as usize;
            let header = record::read_header(seg.bytes(rel..rel + 8));
            match header {
                Ok(Header::Blank { size }) if self.pos + u64::from(size) == seg.end() => {
                    self.pos = seg.end();
                }
                Ok(Header::Message { size })
                    if self.pos + u64::from(size) <= written.min(seg.end()) =>
                {
                    self.pos += u64::from(size);
                    return Some(Ok(RecordRef {
                        range: rel..rel + size as usize,
                        segment: seg,
                    }));
                }
                Ok(h) => {
                    let reason = format!("unexpected {h:?} below the written position");
                    return Some(Err(CommitLog::corrupt(&seg, self.pos, reason)));
                }
                Err(e) => return Some(Err(CommitLog::corrupt(&seg, self.pos, e))),
            }
        }
    }
}

impl Iterator for Records<'_> {
    type Item = Result<RecordRef>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = self.step();
        if matches!(item, Some(Err(_))) {
            self.failed = true;
        }
        item
    }
}

#[cfg(test)]
mod tests;
