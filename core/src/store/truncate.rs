//! Durable truncation of a stopped node's commit log at a record boundary
//! (`rocketgate truncate`; docs/reliability.md, "Truncation").
//!
//! What it is for: a broker whose log ends beyond what it shares with its group's
//! master — an old master that returns as a slave after a failover, or a slave refused
//! with `BeyondEnd` — must cut its log back to the last common offset before it can
//! follow again. The cut must be durable before the node acknowledges anything, and a
//! crash at any point must neither bring the cut tail back nor leave queues pointing
//! past the log (the bug RocketMQ's controller mode shipped: apache/rocketmq#9689,
//! #10666, where the truncation lived in memory and the stale tail returned).
//!
//! How, in order, each step durable before the next:
//! 1. the intent (`truncate.json`: the offset) is written and synced;
//! 2. the bytes past the offset are copied to `quarantine/truncated-<offset>/` (an
//!    operator can still read what was cut), then zeroed in the segment holding the
//!    offset (synced); later segments are moved there too (directory synced);
//! 3. the consume queues and the index are removed and a checkpoint that makes the next
//!    start dispatch the whole log again is written;
//! 4. the log is marked cut ([`CUT_MARKER`]: the broker then moves consumer, POP and
//!    delay positions past a queue's new end back to it, or it would skip what is
//!    written next at those offsets) and the intent is removed.
//!
//! A crash before step 4 leaves the intent: the next [`crate::store::Store::open`]
//! finishes the steps (each is idempotent) before it reads anything. A crash after
//! step 4 leaves no consume queues: the next start rebuilds them from the truncated
//! log. [`truncate`] itself ends by opening and closing the store, so that rebuild is
//! done when it returns.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checkpoint::{Checkpoint, sync_dir};
use super::commit_log::{DIR_NAME as LOG_DIR, parse_segment_name};
use super::lock::DirLock;
use super::record::{self, Header};
use super::{StoreDeps, StoreSettings};
use crate::{Error, Result};

/// The intent file in the data directory while a truncation is under way.
pub const INTENT: &str = "truncate.json";

/// Left in the data directory when the log was cut (a truncation, or recovery cutting
/// a torn tail) until the broker has moved positions past the new ends back
/// ([`crate::store::Store::log_was_cut`]).
pub const CUT_MARKER: &str = "log-cut";

/// Marks the log as cut (durably). See [`CUT_MARKER`].
pub(crate) fn mark_cut(dir: &Path) -> Result<()> {
    let path = dir.join(CUT_MARKER);
    fs::write(&path, b"positions past the queues' ends must move back\n")
        .map_err(|e| Error::io(&path, e))?;
    fs::File::open(&path)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(&path, e))?;
    sync_dir(dir)
}

#[derive(Debug, Serialize, Deserialize)]
struct Intent {
    version: u32,
    to: u64,
}

/// What [`truncate`] did.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TruncateReport {
    /// Where the log ended before.
    pub old_end: u64,
    /// Where it ends now.
    pub new_end: u64,
    /// Bytes of records cut (`old_end - new_end`, fillers included).
    pub removed_bytes: u64,
    /// Where the cut bytes were kept.
    pub kept_in: PathBuf,
    /// Records dispatched again into the rebuilt consume queues and index.
    pub redispatched_records: u64,
}

struct Segment {
    start: u64,
    path: PathBuf,
    len: u64,
}

fn segments(dir: &Path) -> Result<Vec<Segment>> {
    let log = dir.join(LOG_DIR);
    let mut out = Vec::new();
    let rd = match fs::read_dir(&log) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(&log, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(&log, e))?;
        let Some(start) = entry.file_name().to_str().and_then(parse_segment_name) else {
            continue;
        };
        let path = entry.path();
        let len = entry.metadata().map_err(|e| Error::io(&path, e))?.len();
        out.push(Segment { start, path, len });
    }
    out.sort_by_key(|s| s.start);
    Ok(out)
}

/// Walks `seg`'s records from `from` (a boundary) by their headers; returns where
/// the written part of the segment ends (at a zero header, a filler's end, or the
/// first bytes that are not a record header), and whether `stop_at` was passed as a
/// boundary on the way.
fn walk(data: &[u8], from: usize, stop_at: Option<usize>) -> (usize, bool) {
    let mut pos = from;
    let mut hit = stop_at == Some(pos);
    while pos + 8 <= data.len() {
        match record::read_header(&data[pos..]) {
            Ok(Header::Message { size }) if pos + size as usize <= data.len() => {
                pos += size as usize;
            }
            Ok(Header::Blank { .. }) => return (data.len(), hit),
            _ => break,
        }
        if stop_at == Some(pos) {
            hit = true;
        }
    }
    (pos, hit)
}

/// Truncates the log of the stopped node in `dir` at `to`, which must be a record
/// boundary at or below the log's end, then rebuilds the consume queues and the index
/// (see the module docs). Takes the data directory's lock: refuses a directory in use.
pub fn truncate(dir: &Path, settings: &StoreSettings, to: u64) -> Result<TruncateReport> {
    if !dir.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "{} is not a data directory",
            dir.display()
        )));
    }
    let lock = DirLock::acquire(dir)?;
    // An earlier truncation that did not finish comes first.
    finish_interrupted(dir)?;
    let segs = segments(dir)?;
    let (Some(first), Some(last)) = (segs.first(), segs.last()) else {
        return Err(Error::InvalidArgument(
            "the data directory has no commit log".into(),
        ));
    };
    let log_start = first.start;
    let last_data = fs::read(&last.path).map_err(|e| Error::io(&last.path, e))?;
    let old_end = last.start + walk(&last_data, 0, None).0 as u64;
    if to > old_end {
        return Err(Error::InvalidArgument(format!(
            "offset {to} is beyond the log's end {old_end}"
        )));
    }
    if to < log_start {
        return Err(Error::InvalidArgument(format!(
            "offset {to} is below the log's start {log_start} (retention deleted it)"
        )));
    }
    let holder = segs
        .iter()
        .rev()
        .find(|s| s.start <= to)
        .expect("a segment at or below `to`: checked against the log's start");
    if to > holder.start && to < holder.start + holder.len {
        let data = fs::read(&holder.path).map_err(|e| Error::io(&holder.path, e))?;
        let rel = (to - holder.start) as usize;
        if !walk(&data, 0, Some(rel)).1 {
            return Err(Error::InvalidArgument(format!(
                "offset {to} is not the start of a record (truncate at a record boundary)"
            )));
        }
    }
    if to == old_end {
        drop(lock);
        return Ok(TruncateReport {
            old_end,
            new_end: to,
            removed_bytes: 0,
            kept_in: PathBuf::new(),
            redispatched_records: 0,
        });
    }
    let intent = dir.join(INTENT);
    let body = serde_json::to_vec(&Intent { version: 1, to })
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let tmp = dir.join(format!("{INTENT}.tmp"));
    fs::write(&tmp, body).map_err(|e| Error::io(&tmp, e))?;
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(&tmp, e))?;
    fs::rename(&tmp, &intent).map_err(|e| Error::io(&intent, e))?;
    sync_dir(dir)?;
    let kept_in = apply(dir, to)?;
    drop(lock);
    // Rebuild the queues and the index now, so the node starts as fast as ever.
    let (store, opened) = super::Store::open(dir, settings.clone(), StoreDeps::default())?;
    let new_end = store.positions().written;
    store.close()?;
    if new_end != to {
        return Err(Error::InvalidArgument(format!(
            "after truncating at {to} the log ends at {new_end}"
        )));
    }
    Ok(TruncateReport {
        old_end,
        new_end,
        removed_bytes: old_end - to,
        kept_in,
        redispatched_records: opened.redispatched_records,
    })
}

/// Finishes a truncation a crash interrupted (its intent file is there). Called with
/// the data directory's lock held, before anything reads the log. Returns the offset
/// the log was truncated at, if there was one to finish.
pub(crate) fn finish_interrupted(dir: &Path) -> Result<Option<u64>> {
    let intent = dir.join(INTENT);
    let bytes = match fs::read(&intent) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&intent, e)),
    };
    let Intent { to, .. } = serde_json::from_slice(&bytes).map_err(|e| {
        Error::InvalidArgument(format!(
            "{}: unreadable truncation intent: {e}",
            intent.display()
        ))
    })?;
    tracing::warn!(to, "finishing a log truncation that was interrupted");
    apply(dir, to)?;
    Ok(Some(to))
}

/// Steps 2–4 of the module docs; idempotent.
fn apply(dir: &Path, to: u64) -> Result<PathBuf> {
    let kept = dir.join("quarantine").join(format!("truncated-{to:020}"));
    fs::create_dir_all(&kept).map_err(|e| Error::io(&kept, e))?;
    let log_dir = dir.join(LOG_DIR);
    let segs = segments(dir)?;
    let log_start = segs.first().map_or(to, |s| s.start);
    for seg in &segs {
        let name = seg.path.file_name().expect("segment file name");
        if seg.start > to || (seg.start == to && seg.start > log_start) {
            // Wholly past the cut (a segment starting at the cut, other than the only
            // one, is empty now): moved out of the log.
            let dest = kept.join(name);
            fs::rename(&seg.path, &dest).map_err(|e| Error::io(&dest, e))?;
            continue;
        }
        if seg.start + seg.len <= to {
            continue;
        }
        // The segment holding the cut: keep a copy of what goes, then zero it.
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&seg.path)
            .map_err(|e| Error::io(&seg.path, e))?;
        let data = fs::read(&seg.path).map_err(|e| Error::io(&seg.path, e))?;
        let rel = (to - seg.start) as usize;
        let (end, _) = walk(&data, rel, None);
        let end = end.max(rel);
        if end > rel {
            let part = kept.join(format!("{}.tail", name.to_string_lossy()));
            if !part.exists() {
                fs::write(&part, &data[rel..end]).map_err(|e| Error::io(&part, e))?;
            }
            file.write_all_at(&vec![0u8; end - rel], rel as u64)
                .map_err(|e| Error::io(&seg.path, e))?;
            file.sync_all().map_err(|e| Error::io(&seg.path, e))?;
        }
    }
    sync_dir(&log_dir)?;
    sync_dir(&kept)?;
    for sub in ["consumequeue", "index"] {
        let p = dir.join(sub);
        if p.exists() {
            fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Checkpoint {
        version: 1,
        log_flushed: to,
        dispatched: log_start,
        written_at_ms: crate::clock::now_ms(),
    }
    .store(dir)?;
    mark_cut(dir)?;
    let intent = dir.join(INTENT);
    match fs::remove_file(&intent) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(&intent, e)),
    }
    sync_dir(dir)?;
    Ok(kept)
}
