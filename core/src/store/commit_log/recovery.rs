//! Opening the commit log's directory and recovering its tail: load and check
//! the segment files, scan forward verifying records, truncate at the first one
//! that is not whole, and rebuild the next-queue-offset table for what was
//! scanned. Runs before the log is shared, so it may write anywhere.
//! The algorithm is described in `docs/storage-format.md`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::CommitLogSettings;
use super::segment::{self, Segment};
use crate::error::{Error, Result};
use crate::store::io::Files;
use crate::store::record::{self, END_FILE_MIN_BLANK_LENGTH, Header, RecordView};

/// Where recovery starts verifying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// No checkpoint: verify every record from the first segment.
    Full,
    /// The store's checkpoint says everything below this offset was durable.
    /// Records wholly below it are only walked (structure, not CRCs); from it
    /// on every record is verified. Damage below it is an error, not a
    /// truncation: it would silently drop acknowledged messages.
    FromCheckpoint(u64),
}

impl From<Option<u64>> for Recovery {
    /// `None` (no checkpoint) is [`Recovery::Full`].
    fn from(checkpoint: Option<u64>) -> Self {
        checkpoint.map_or(Recovery::Full, Recovery::FromCheckpoint)
    }
}

/// What recovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Offset the scan started at (start of the segment holding the checkpoint,
    /// or of the first segment).
    pub scanned_from: u64,
    /// The written position after recovery.
    pub recovered_end: u64,
    /// Bytes discarded past `recovered_end`: in its segment, up to the last
    /// non-zero byte; plus the whole size of every later segment removed.
    pub truncated_bytes: u64,
    /// Records walked or verified (blank fillers not counted).
    pub records_scanned: u64,
    /// max(queue offset) + 1 per (topic, queue id) over the scanned records;
    /// the store merges it with what its consume queues say.
    pub next_queue_offsets: HashMap<(String, u32), u64>,
}

pub(super) struct Recovered {
    pub(super) segments: Vec<Arc<Segment>>,
    pub(super) report: RecoveryReport,
    /// Position known durable before recovery's own sync.
    pub(super) durable: u64,
}

fn load_segments(
    dir: &Path,
    config: &CommitLogSettings,
    files: &Files,
) -> Result<Vec<Arc<Segment>>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let size = config.segment_size;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name();
        match name.to_str().and_then(segment::parse_file_name) {
            Some(start) => found.push((start, entry.path())),
            None if name
                .to_str()
                .is_some_and(|n| n.ends_with(segment::TMP_SUFFIX)) =>
            {
                // A segment whose creation was interrupted: it never held data.
                tracing::warn!(file = ?entry.path(), "removing an unfinished segment file");
                std::fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
            }
            None => {
                tracing::warn!(file = ?entry.path(), "ignoring a file that is not a commit log segment")
            }
        }
    }
    found.sort();
    let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(found.len());
    for (start, path) in found {
        let expected = segments.last().map(|s| s.end());
        if start % size != 0 || expected.is_some_and(|e| e != start) {
            return Err(Error::Corrupt {
                path,
                offset: start,
                reason: format!(
                    "segment does not follow the previous one (expected start {}, segment size {size})",
                    expected.unwrap_or(0)
                ),
            });
        }
        segments.push(Arc::new(Segment::open(
            path,
            start,
            size as usize,
            config.write_through,
            files,
        )?));
    }
    if segments.is_empty() {
        segments.push(Arc::new(Segment::create(
            dir,
            0,
            size as usize,
            config.write_through,
            files,
        )?));
    }
    Ok(segments)
}

/// Why the scan stopped at a position.
enum Stop {
    /// Clean end: a zero header or the end of the last segment.
    End,
    Invalid(String),
}

pub(super) fn recover(
    dir: &Path,
    config: &CommitLogSettings,
    how: Recovery,
    files: &Files,
) -> Result<Recovered> {
    let mut segments = load_segments(dir, config, files)?;
    let first = segments[0].start();
    let last_end = segments[segments.len() - 1].end();
    let verify_from = match how {
        Recovery::Full => first,
        Recovery::FromCheckpoint(c) if c > last_end => {
            return Err(Error::Corrupt {
                path: dir.to_owned(),
                offset: c,
                reason: format!("the checkpoint is past the end of the segment files ({last_end})"),
            });
        }
        Recovery::FromCheckpoint(c) => c.max(first),
    };
    let mut idx = segments
        .partition_point(|s| s.start() <= verify_from)
        .saturating_sub(1);
    let scanned_from = segments[idx].start();

    let mut pos = scanned_from;
    let mut records = 0u64;
    let mut queues: HashMap<(String, u32), u64> = HashMap::new();
    let stop = loop {
        let seg = &segments[idx];
        let remaining = seg.end() - pos;
        if remaining < END_FILE_MIN_BLANK_LENGTH as u64 {
            // Writers never leave 1..8 bytes; either way nothing fits here.
            if idx + 1 < segments.len() {
                idx += 1;
                pos = segments[idx].start();
                continue;
            }
            pos = seg.end();
            break Stop::End;
        }
        let rel = (pos - seg.start()) as usize;
        let size = match record::read_header(seg.bytes(rel..rel + 8)) {
            Ok(Header::Zero) => break Stop::End,
            Ok(Header::Blank { size }) if u64::from(size) == remaining => {
                pos = seg.end();
                continue;
            }
            Ok(Header::Message { size })
                if u64::from(size) + END_FILE_MIN_BLANK_LENGTH as u64 <= remaining =>
            {
                size as usize
            }
            Ok(h) => break Stop::Invalid(format!("{h:?} does not fit the segment")),
            Err(e) => break Stop::Invalid(e.to_string()),
        };
        let trusted = pos + size as u64 <= verify_from;
        let checked = RecordView::parse(seg.bytes(rel..rel + size)).and_then(|view| {
            if !trusted {
                view.verify_strict()?;
            }
            Ok(view)
        });
        let view = match checked {
            Ok(v) if v.phys_offset() == pos as i64 => v,
            Ok(v) => {
                break Stop::Invalid(format!("record claims physical offset {}", v.phys_offset()));
            }
            Err(e) => break Stop::Invalid(e.to_string()),
        };
        records += 1;
        seg.note_store_timestamp(view.store_timestamp());
        let next = u64::try_from(view.queue_offset()).unwrap_or(0) + 1;
        let key = (view.topic().to_owned(), view.queue_id().max(0) as u32);
        let slot = queues.entry(key).or_insert(0);
        *slot = (*slot).max(next);
        pos += size as u64;
    };

    if let Stop::Invalid(reason) = &stop {
        if pos < verify_from {
            return Err(Error::Corrupt {
                path: segments[idx].path().to_owned(),
                offset: pos,
                reason: format!(
                    "damaged record below the durable checkpoint {verify_from}: {reason}; \
                     refusing to truncate acknowledged data"
                ),
            });
        }
        tracing::warn!(offset = pos, %reason, "commit log tail is torn; truncating");
    }
    let truncated_bytes = truncate(dir, &mut segments, idx, pos, files)?;
    Ok(Recovered {
        segments,
        report: RecoveryReport {
            scanned_from,
            recovered_end: pos,
            truncated_bytes,
            records_scanned: records,
            next_queue_offsets: queues,
        },
        durable: verify_from.min(pos),
    })
}

/// Zeroes segment `idx` from `end` (so no later scan sees stale bytes) and
/// removes every later segment. Returns the bytes discarded.
fn truncate(
    dir: &Path,
    segments: &mut Vec<Arc<Segment>>,
    idx: usize,
    end: u64,
    files: &Files,
) -> Result<u64> {
    let mut discarded = 0u64;
    for seg in segments.drain(idx + 1..).rev() {
        discarded += seg.end() - seg.start();
        std::fs::remove_file(seg.path()).map_err(|e| Error::io(seg.path(), e))?;
        tracing::warn!(file = ?seg.path(), "removed a commit log segment past the recovered end");
    }
    let seg = &segments[idx];
    let from = (end - seg.start()) as usize;
    let len = (seg.end() - seg.start()) as usize;
    const CHUNK: usize = 64 * 1024;
    let zeros = [0u8; CHUNK];
    let mut last_nonzero = None;
    // Only the parts of the file that may hold data are read: reading a 1 GiB
    // segment's never-written tail would fault every page in for nothing.
    for range in data_ranges(seg.path(), from, len) {
        let mut at = range.start;
        while at < range.end {
            let to = (at + CHUNK - at % CHUNK).min(range.end);
            let chunk = seg.bytes(at..to);
            if let Some(i) = chunk.iter().rposition(|b| *b != 0) {
                last_nonzero = Some(at + i);
                seg.write(at, &zeros[..to - at])?;
            }
            at = to;
        }
    }
    if let Some(last) = last_nonzero {
        discarded += (last + 1 - from) as u64;
        seg.flush_range(from..last + 1)?;
    }
    if discarded > 0 {
        files.sync_dir(dir).map_err(|e| Error::io(dir, e))?;
    }
    Ok(discarded)
}

/// The byte ranges of `[from, len)` of the file at `path` that may hold data, by
/// `SEEK_DATA`/`SEEK_HOLE` (holes and never-written preallocated extents read as
/// zero and are skipped; pages still in the page cache count as data). Falls back
/// to the whole range where the file system cannot tell.
fn data_ranges(path: &Path, from: usize, len: usize) -> Vec<std::ops::Range<usize>> {
    let whole = std::iter::once(from..len).collect();
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let Ok(file) = std::fs::File::open(path) else {
            return whole;
        };
        let fd = file.as_raw_fd();
        let mut out = Vec::new();
        let mut at = from;
        while at < len {
            // SAFETY: plain lseek calls on a descriptor we own.
            let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
            if data < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::ENXIO) {
                    break; // no data past `at`
                }
                return whole;
            }
            // SAFETY: as above; `fd` stays open while `file` lives, and lseek
            // only moves this descriptor's position.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            if hole < 0 {
                return whole;
            }
            let (start, end) = ((data as usize).max(at), (hole as usize).min(len));
            if start < end {
                out.push(start..end);
            }
            if end <= at {
                break;
            }
            at = end;
        }
        out
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        whole
    }
}
