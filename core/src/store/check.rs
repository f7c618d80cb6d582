//! Offline check and repair of a data directory (`rocketgate verify` and
//! `rocketgate repair`; issue #25). Runs on a stopped node: it takes the data
//! directory's lock like a node does, so it refuses a directory in use.
//!
//! **Verify** reads, without changing anything:
//! - every commit-log record: its structure, its body CRC and its whole-record
//!   `__CRC32#` (a *damaged record*, or *unreadable bytes* where the structure
//!   breaks and the records that follow cannot be found);
//! - every consume-queue entry against the log: it must point at an intact
//!   record that is the message it names (topic, queue, queue offset) with the
//!   entry's size; and every record of a queue that exists must have its entry
//!   (records past the checkpoint's dispatch position are only counted: the
//!   next start dispatches them);
//! - every index entry: it must point at a record (or below the log's start,
//!   where retention deleted it).
//!
//! **Repair**, per this policy (docs/reliability.md):
//! - a *damaged record* is copied to `<data_dir>/quarantine/` and listed in
//!   `quarantine/quarantine.json`; it stays in the log (the offsets after it do
//!   not move), where the read path never serves it; verify then reports it as
//!   quarantined, not as a problem;
//! - *unreadable bytes* are copied to `quarantine/` too; at the log's tail they
//!   are truncated (zeroed: the log ends at the last whole record); inside the
//!   log (later segments hold data) a blank filler replaces them, so the segment
//!   ends early and the log goes on with the next one;
//! - when any queue or index entry disagrees with the log (or the log was
//!   changed), the consume queues and the index are rebuilt from the log: both
//!   directories are removed and the store's own recovery dispatches every
//!   record again (entries land at the queue offsets the records carry, so
//!   consumer offsets stay valid).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use super::checkpoint::Checkpoint;
use super::commit_log::DIR_NAME as LOG_DIR;
use super::consume_queue::ENTRY_SIZE as CQ_ENTRY;
use super::lock::DirLock;
use super::record::{self, Header, RecordView};
use super::{StoreDeps, StoreSettings};
use crate::{Error, Result};

/// Most problems of one kind listed in a report (the counts are complete).
const LIST_MAX: usize = 100;

/// A record whose checksums do not hold.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DamagedRecord {
    pub offset: u64,
    pub size: u32,
    pub segment: PathBuf,
    pub reason: String,
    /// Already copied to `quarantine/` by an earlier repair.
    pub quarantined: bool,
}

/// Bytes of a segment where the record structure breaks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Unreadable {
    /// Log offsets `[from, to)`: from the break to the last non-zero byte.
    pub from: u64,
    pub to: u64,
    pub segment: PathBuf,
    pub reason: String,
    /// At the log's tail (no later segment holds data).
    pub tail: bool,
}

/// What verify found (and, for repair, what it did).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub data_dir: PathBuf,
    pub segments: usize,
    /// Log offsets of the first record and one past the last.
    pub log_start: u64,
    pub log_end: u64,
    pub records: u64,
    pub damaged_records: Vec<DamagedRecord>,
    pub damaged_count: u64,
    /// Of them, copied to `quarantine/` by an earlier repair.
    pub quarantined_count: u64,
    pub unreadable: Vec<Unreadable>,
    pub queues: usize,
    pub queue_entries: u64,
    /// Queue entries that disagree with the log (examples; the count is complete).
    pub queue_problems: Vec<String>,
    pub queue_problem_count: u64,
    /// Records of an existing queue without their entry, below the checkpoint.
    pub missing_queue_entries: u64,
    /// Records past the checkpoint's dispatch position (the next start adds them).
    pub undispatched_records: u64,
    pub index_entries: u64,
    pub index_problems: Vec<String>,
    pub index_problem_count: u64,
    /// What repair did, in order (empty for verify).
    pub actions: Vec<String>,
}

impl CheckReport {
    /// Problems found (quarantined records are not problems any more).
    pub fn problems(&self) -> u64 {
        self.damaged_count - self.quarantined_count
            + self.unreadable.len() as u64
            + self.queue_problem_count
            + self.missing_queue_entries
            + self.index_problem_count
    }

    /// Whether queues or index disagree with the log.
    fn needs_rebuild(&self) -> bool {
        self.queue_problem_count > 0
            || self.missing_queue_entries > 0
            || self.index_problem_count > 0
    }

    /// A report for people.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "data directory: {}", self.data_dir.display());
        let _ = writeln!(
            s,
            "commit log: {} segments, {} records, offsets {}..{}",
            self.segments, self.records, self.log_start, self.log_end
        );
        for d in &self.damaged_records {
            let _ = writeln!(
                s,
                "  damaged record at {} ({} bytes, {}): {}{}",
                d.offset,
                d.size,
                d.segment.display(),
                d.reason,
                if d.quarantined { " [quarantined]" } else { "" }
            );
        }
        for u in &self.unreadable {
            let _ = writeln!(
                s,
                "  unreadable bytes {}..{} ({}{}): {}",
                u.from,
                u.to,
                u.segment.display(),
                if u.tail { ", the log's tail" } else { "" },
                u.reason
            );
        }
        let _ = writeln!(
            s,
            "consume queues: {} queues, {} entries, {} disagree with the log, {} records without their entry, {} records not yet dispatched",
            self.queues,
            self.queue_entries,
            self.queue_problem_count,
            self.missing_queue_entries,
            self.undispatched_records
        );
        for p in &self.queue_problems {
            let _ = writeln!(s, "  {p}");
        }
        let _ = writeln!(
            s,
            "index: {} entries, {} point at no record",
            self.index_entries, self.index_problem_count
        );
        for p in &self.index_problems {
            let _ = writeln!(s, "  {p}");
        }
        for a in &self.actions {
            let _ = writeln!(s, "repaired: {a}");
        }
        let _ = writeln!(
            s,
            "{}",
            match self.problems() {
                0 => "OK: no problems".to_owned(),
                n => format!("PROBLEMS: {n}"),
            }
        );
        s
    }
}

/// One segment file, mapped read-only.
struct Seg {
    start: u64,
    path: PathBuf,
    map: Mmap,
}

/// The commit log as verify reads it.
struct Log {
    segs: Vec<Seg>,
}

impl Log {
    fn open(dir: &Path) -> Result<Log> {
        let dir = dir.join(LOG_DIR);
        let mut found = Vec::new();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Log { segs: vec![] }),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let name = entry.file_name();
            if let Some(start) = name
                .to_str()
                .and_then(super::commit_log::parse_segment_name)
            {
                found.push((start, entry.path()));
            }
        }
        found.sort();
        let mut segs = Vec::new();
        for (start, path) in found {
            let file = fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: read-only map of a file no process writes (we hold the
            // data directory's lock; repair writes through `fs`, after this
            // map is dropped).
            let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
            segs.push(Seg { start, path, map });
        }
        Ok(Log { segs })
    }

    /// The segment holding `phys`.
    fn seg(&self, phys: u64) -> Option<&Seg> {
        let i = self
            .segs
            .partition_point(|s| s.start <= phys)
            .checked_sub(1)?;
        let s = &self.segs[i];
        (phys < s.start + s.map.len() as u64).then_some(s)
    }

    /// The record at `phys`, parsed, if one starts there.
    fn record(&self, phys: u64) -> std::result::Result<(&[u8], RecordView<'_>), String> {
        let seg = self.seg(phys).ok_or("no segment holds it")?;
        let rel = (phys - seg.start) as usize;
        let bytes = &seg.map[rel..];
        match record::read_header(bytes).map_err(|e| e.to_string())? {
            Header::Message { size } if size as usize <= bytes.len() => {
                let b = &bytes[..size as usize];
                let view = RecordView::parse(b).map_err(|e| e.to_string())?;
                Ok((b, view))
            }
            h => Err(format!("{h:?} where a record should start")),
        }
    }
}

/// One consume queue's files, mapped read-only.
struct Queue {
    /// (queue offset of the first entry, map).
    files: Vec<(u64, Mmap)>,
}

impl Queue {
    fn entry(&self, offset: u64) -> Option<(u64, u32)> {
        let i = self
            .files
            .partition_point(|(f, _)| *f <= offset)
            .checked_sub(1)?;
        let (first, map) = &self.files[i];
        let pos = ((offset - first) as usize).checked_mul(CQ_ENTRY)?;
        let e = map.get(pos..pos + CQ_ENTRY)?;
        let phys = i64::from_be_bytes(e[0..8].try_into().ok()?);
        let size = i32::from_be_bytes(e[8..12].try_into().ok()?);
        (size > 0 && phys >= 0).then_some((phys as u64, size as u32))
    }
}

fn map_ro(path: &Path) -> Result<Mmap> {
    let file = fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map; see `Log::open`.
    unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))
}

fn load_queues(dir: &Path) -> Result<HashMap<(String, u32), Queue>> {
    let base = dir.join("consumequeue");
    let mut out = HashMap::new();
    let Ok(topics) = fs::read_dir(&base) else {
        return Ok(out);
    };
    for t in topics.flatten() {
        let Some(topic) = t.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Ok(qs) = fs::read_dir(t.path()) else {
            continue;
        };
        for q in qs.flatten() {
            let Some(qid) = q.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let mut files = Vec::new();
            for f in fs::read_dir(q.path())
                .map_err(|e| Error::io(q.path(), e))?
                .flatten()
            {
                let Some(byte_offset) = f
                    .file_name()
                    .to_str()
                    .filter(|n| n.len() == 20 && n.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                files.push((byte_offset / CQ_ENTRY as u64, map_ro(&f.path())?));
            }
            files.sort_by_key(|(first, _)| *first);
            out.insert((topic.clone(), qid), Queue { files });
        }
    }
    Ok(out)
}

fn quarantine_list(dir: &Path) -> Vec<DamagedRecord> {
    fs::read(dir.join("quarantine").join("quarantine.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn push_limited<T>(list: &mut Vec<T>, item: T) {
    if list.len() < LIST_MAX {
        list.push(item);
    }
}

/// Checks the data directory `dir` (see the module docs); changes nothing.
pub fn verify(dir: &Path, settings: &StoreSettings) -> Result<CheckReport> {
    if !dir.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "{} is not a data directory",
            dir.display()
        )));
    }
    let _lock = DirLock::acquire(dir)?;
    verify_locked(dir, settings)
}

fn verify_locked(dir: &Path, settings: &StoreSettings) -> Result<CheckReport> {
    let mut report = CheckReport {
        data_dir: dir.to_path_buf(),
        ..CheckReport::default()
    };
    let log = Log::open(dir)?;
    let queues = load_queues(dir)?;
    let quarantined: HashMap<u64, DamagedRecord> = quarantine_list(dir)
        .into_iter()
        .map(|d| (d.offset, d))
        .collect();
    let dispatched = Checkpoint::load(dir).map_or(0, |c| c.dispatched);
    report.segments = log.segs.len();
    report.queues = queues.len();
    report.log_start = log.segs.first().map_or(0, |s| s.start);
    report.log_end = report.log_start;

    // The last segment with any data: a break before it is inside the log.
    let last_with_data = log
        .segs
        .iter()
        .rposition(|s| s.map.iter().any(|b| *b != 0))
        .unwrap_or(0);
    // Log -> queues.
    for (i, seg) in log.segs.iter().enumerate() {
        let len = seg.map.len();
        let mut pos = 0usize;
        let unreadable = |from: usize, reason: String| {
            let last = seg.map[from..]
                .iter()
                .rposition(|b| *b != 0)
                .map(|r| from + r + 1);
            last.map(|to| Unreadable {
                from: seg.start + from as u64,
                to: seg.start + to as u64,
                segment: seg.path.clone(),
                reason,
                tail: i >= last_with_data,
            })
        };
        while pos + 8 <= len {
            match record::read_header(&seg.map[pos..pos + 8]) {
                Ok(Header::Zero) => {
                    if let Some(u) = unreadable(pos, "data after the end of the records".into()) {
                        report.unreadable.push(u);
                    } else if i < last_with_data {
                        report.unreadable.push(Unreadable {
                            from: seg.start + pos as u64,
                            to: seg.start + pos as u64,
                            segment: seg.path.clone(),
                            reason:
                                "the segment ends early (no filler) but later segments hold data"
                                    .into(),
                            tail: false,
                        });
                    }
                    break;
                }
                Ok(Header::Blank { size }) if pos + size as usize == len => break,
                Ok(Header::Blank { size }) => {
                    report.unreadable.extend(unreadable(
                        pos,
                        format!("a filler of {size} bytes that does not end the segment"),
                    ));
                    break;
                }
                Ok(Header::Message { size }) if pos + size as usize <= len => {
                    let phys = seg.start + pos as u64;
                    let b = &seg.map[pos..pos + size as usize];
                    let checked = RecordView::parse(b)
                        .map_err(|e| e.to_string())
                        .and_then(|v| {
                            v.verify().map_err(|e| e.to_string())?;
                            Ok(v)
                        });
                    report.records += 1;
                    report.log_end = phys + u64::from(size);
                    match checked {
                        Ok(v) => {
                            let key = (v.topic().to_owned(), v.queue_id() as u32);
                            if let Some(q) = queues.get(&key) {
                                let qoff = v.queue_offset() as u64;
                                let has = q.entry(qoff) == Some((phys, size));
                                if phys >= dispatched && !has {
                                    report.undispatched_records += 1;
                                } else if !has {
                                    report.missing_queue_entries += 1;
                                    push_limited(
                                        &mut report.queue_problems,
                                        format!(
                                            "record at {phys} ({}/{}@{qoff}) has no consume-queue entry",
                                            key.0, key.1
                                        ),
                                    );
                                }
                            } else if phys >= dispatched {
                                report.undispatched_records += 1;
                            }
                        }
                        Err(reason) => {
                            report.damaged_count += 1;
                            report.quarantined_count += u64::from(quarantined.contains_key(&phys));
                            push_limited(
                                &mut report.damaged_records,
                                DamagedRecord {
                                    offset: phys,
                                    size,
                                    segment: seg.path.clone(),
                                    reason,
                                    quarantined: quarantined.contains_key(&phys),
                                },
                            );
                        }
                    }
                    pos += size as usize;
                }
                Ok(h) => {
                    report
                        .unreadable
                        .extend(unreadable(pos, format!("{h:?} does not fit the segment")));
                    break;
                }
                Err(e) => {
                    report.unreadable.extend(unreadable(pos, e.to_string()));
                    break;
                }
            }
        }
    }
    // Queues -> log.
    for ((topic, qid), q) in &queues {
        for (first, map) in &q.files {
            for n in 0..map.len() / CQ_ENTRY {
                let qoff = first + n as u64;
                let Some((phys, size)) = q.entry(qoff) else {
                    continue;
                };
                report.queue_entries += 1;
                if phys < report.log_start {
                    continue; // deleted by retention
                }
                let problem = match log.record(phys) {
                    Err(e) => Some(format!("points at {phys}: {e}")),
                    Ok((b, v)) => {
                        if b.len() != size as usize {
                            Some(format!("size {size}, the record at {phys} is {}", b.len()))
                        } else if v.topic() != topic
                            || v.queue_id() != *qid as i32
                            || v.queue_offset() != qoff as i64
                        {
                            Some(format!(
                                "points at a record of {}/{}@{}",
                                v.topic(),
                                v.queue_id(),
                                v.queue_offset()
                            ))
                        } else {
                            None
                        }
                    }
                };
                if let Some(p) = problem {
                    report.queue_problem_count += 1;
                    push_limited(
                        &mut report.queue_problems,
                        format!("consume queue {topic}/{qid}@{qoff}: {p}"),
                    );
                }
            }
        }
    }

    // Index -> log.
    let index_dir = dir.join("index");
    let slots = settings.index_slots as usize;
    for f in fs::read_dir(&index_dir).into_iter().flatten().flatten() {
        let name = f.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.len() == 20 && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let map = map_ro(&f.path())?;
        let count = map.get(36..40).map_or(0, |b| {
            i32::from_be_bytes(b.try_into().unwrap_or([0; 4])).max(0)
        }) as usize;
        let base = 40 + slots * 4;
        for n in 0..count {
            let at = base + n * 20;
            let Some(e) = map.get(at..at + 20) else {
                report.index_problem_count += 1;
                push_limited(
                    &mut report.index_problems,
                    format!(
                        "{}: entry {} is past the end of the file",
                        f.path().display(),
                        n + 1
                    ),
                );
                break;
            };
            report.index_entries += 1;
            let phys = i64::from_be_bytes(e[4..12].try_into().unwrap_or([0; 8])).max(0) as u64;
            if phys < report.log_start || phys >= report.log_end {
                // Deleted by retention, or past the log (not yet dispatched).
                if phys >= report.log_end {
                    report.index_problem_count += 1;
                    push_limited(
                        &mut report.index_problems,
                        format!("index entry {} points past the log's end: {phys}", n + 1),
                    );
                }
                continue;
            }
            if let Err(e) = log.record(phys) {
                report.index_problem_count += 1;
                push_limited(
                    &mut report.index_problems,
                    format!("index entry {} points at {phys}: {e}", n + 1),
                );
            }
        }
    }
    Ok(report)
}

/// Repairs `dir` per the module's policy and returns what verify found then,
/// with the actions taken; verify it again to see the result.
pub fn repair(dir: &Path, settings: &StoreSettings) -> Result<CheckReport> {
    if !dir.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "{} is not a data directory",
            dir.display()
        )));
    }
    let lock = DirLock::acquire(dir)?;
    let mut report = verify_locked(dir, settings)?;
    let quarantine = dir.join("quarantine");
    let mut log_changed = false;

    // Damaged records: copied out, listed, left in place.
    let mut listed = quarantine_list(dir);
    let fresh: Vec<DamagedRecord> = report
        .damaged_records
        .iter()
        .filter(|d| !d.quarantined)
        .cloned()
        .collect();
    if !fresh.is_empty() {
        fs::create_dir_all(&quarantine).map_err(|e| Error::io(&quarantine, e))?;
        let log = Log::open(dir)?;
        for d in fresh {
            let seg = log.seg(d.offset).ok_or_else(|| {
                Error::InvalidArgument(format!("no segment holds offset {}", d.offset))
            })?;
            let rel = (d.offset - seg.start) as usize;
            let path = quarantine.join(format!("{:020}.record", d.offset));
            fs::write(&path, &seg.map[rel..rel + d.size as usize])
                .map_err(|e| Error::io(&path, e))?;
            report.actions.push(format!(
                "damaged record at {} quarantined to {} (left in the log, never served)",
                d.offset,
                path.display()
            ));
            listed.push(DamagedRecord {
                quarantined: true,
                ..d
            });
        }
        let list = quarantine.join("quarantine.json");
        let json = serde_json::to_vec_pretty(&listed)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        fs::write(&list, json).map_err(|e| Error::io(&list, e))?;
    }

    // Unreadable bytes: copied out; truncated at the tail, a filler inside.
    for u in report.unreadable.clone() {
        fs::create_dir_all(&quarantine).map_err(|e| Error::io(&quarantine, e))?;
        let seg_start = u
            .segment
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(super::commit_log::parse_segment_name)
            .unwrap_or(0);
        let data = fs::read(&u.segment).map_err(|e| Error::io(&u.segment, e))?;
        let from = (u.from - seg_start) as usize;
        let to = (u.to - seg_start) as usize;
        if to > from {
            let path = quarantine.join(format!("{:020}.bytes", u.from));
            fs::write(&path, &data[from..to]).map_err(|e| Error::io(&path, e))?;
        }
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&u.segment)
            .map_err(|e| Error::io(&u.segment, e))?;
        use std::os::unix::fs::FileExt;
        if u.tail {
            file.write_all_at(&vec![0u8; to.saturating_sub(from)], from as u64)
                .map_err(|e| Error::io(&u.segment, e))?;
            report.actions.push(format!(
                "truncated the log's tail at {} ({} bytes quarantined)",
                u.from,
                to.saturating_sub(from)
            ));
        } else {
            let mut blank = [0u8; 8];
            record::write_blank(&mut blank, (data.len() - from) as u32);
            file.write_all_at(&blank, from as u64)
                .map_err(|e| Error::io(&u.segment, e))?;
            report.actions.push(format!(
                "unreadable bytes {}..{} quarantined; the segment {} now ends at {} (a filler)",
                u.from,
                u.to,
                u.segment.display(),
                u.from
            ));
        }
        file.sync_all().map_err(|e| Error::io(&u.segment, e))?;
        log_changed = true;
    }

    // Queues and index rebuilt from the log.
    if report.needs_rebuild() || log_changed {
        for sub in ["consumequeue", "index"] {
            let p = dir.join(sub);
            if p.exists() {
                fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
            }
        }
        let after = verify_locked(dir, settings)?;
        // Everything in the log is durable (it is on disk and we synced what we
        // changed); dispatch all of it again. A checkpoint makes recovery walk
        // the log rather than truncate at the first (quarantined) damaged record.
        Checkpoint {
            version: 1,
            log_flushed: after.log_end,
            dispatched: after.log_start,
            written_at_ms: crate::clock::now_ms(),
        }
        .store(dir)?;
        drop(lock);
        let (store, opened) = super::Store::open(dir, settings.clone(), StoreDeps::default())?;
        store.close()?;
        report.actions.push(format!(
            "rebuilt the consume queues and the index from the log ({} records dispatched)",
            opened.redispatched_records
        ));
    }
    Ok(report)
}

/// Damaged records listed in `quarantine/quarantine.json` (for tests and tools).
pub fn quarantined(dir: &Path) -> BTreeMap<u64, DamagedRecord> {
    quarantine_list(dir)
        .into_iter()
        .map(|d| (d.offset, d))
        .collect()
}
