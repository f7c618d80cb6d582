//! The commit log as a replication source and target (docs/replication.md).
//!
//! A master *ships* its log as runs of whole records read straight from the segments
//! ([`CommitLog::ship`]); a slave *appends* those bytes at the same offsets
//! ([`CommitLog::append_replicated`]) after checking every record's structure, CRCs
//! and stored physical offset, so a slave's log is byte-for-byte the master's.
//!
//! # Invariants
//! - A shipped run starts at a record boundary (or a segment start) and holds whole
//!   records; when it reaches an end-of-segment filler it ends with that filler's
//!   8-byte header, and the next run starts at the next segment.
//! - A slave appends a run only at its own written position; nothing of a run that
//!   fails a check is written (the run is checked whole before the first byte lands).
//! - Queue offsets are taken from the records (the master assigned them), so the
//!   slave's next-queue-offset table equals the master's after the same bytes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::segment::{RecordRef, Segment};
use super::{CommitLog, Error, Result};
use crate::store::record::{self, END_FILE_MIN_BLANK_LENGTH, Header, RecordView};

/// Why a shipped run was refused by the slave's log.
fn refused(offset: u64, reason: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!(
        "replicated bytes at offset {offset} refused: {reason}"
    ))
}

/// A run of the master's log, as [`CommitLog::ship`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shipment {
    /// Where the run starts in the log.
    pub offset: u64,
    /// Whole records (and possibly a final 8-byte filler header), straight from the
    /// mapped segment: no copy is made, and the segment stays mapped while the
    /// bytes live (so a run can be written to a socket as it is).
    pub bytes: Bytes,
    /// Where the next run starts: past the run, or the next segment after a filler.
    pub next: u64,
}

/// What a slave's log did with a shipped run ([`CommitLog::append_replicated`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The log's written position after the run.
    pub end: u64,
    /// The run's records by the master's store timestamp (ms), in log order, one
    /// entry per stretch of records that share it: `(store_ms, records)`. The
    /// checks read every record anyway; the slave's lag histogram is computed from
    /// this once the run is written, so nothing is parsed twice.
    pub stamps: Vec<(i64, u32)>,
}

impl CommitLog {
    /// Up to `max` bytes of whole records from `from` (a record boundary) up to
    /// `limit` (at most the written position), always at least one record when one is
    /// there, even a bigger one. `None` when nothing is there yet. `from` below the
    /// oldest segment, or inside no record boundary known to the log, is an error.
    pub fn ship(&self, from: u64, limit: u64, max: usize) -> Result<Option<Shipment>> {
        let limit = limit.min(self.max_offset());
        if from >= limit {
            return Ok(None);
        }
        let seg = self
            .segment_for(from)
            .ok_or_else(|| self.out_of_range(from))?;
        let mut pos = from;
        let mut next = from;
        let end = limit.min(seg.end());
        while pos + END_FILE_MIN_BLANK_LENGTH as u64 <= end {
            let rel = (pos - seg.start()) as usize;
            match record::read_header(seg.bytes(rel..rel + END_FILE_MIN_BLANK_LENGTH)) {
                Ok(Header::Blank { size }) if pos + u64::from(size) == seg.end() => {
                    // The filler's header ends the run; the log continues at the next segment.
                    pos += END_FILE_MIN_BLANK_LENGTH as u64;
                    next = seg.end();
                    break;
                }
                Ok(Header::Message { size }) => {
                    let rec_end = pos + u64::from(size);
                    if rec_end > end {
                        break;
                    }
                    if rec_end - from > max as u64 && pos > from {
                        break;
                    }
                    pos = rec_end;
                    next = rec_end;
                }
                Ok(h) => return Err(Self::corrupt(&seg, pos, format!("unexpected {h:?}"))),
                Err(e) => return Err(Self::corrupt(&seg, pos, e)),
            }
        }
        if pos == from {
            return Ok(None);
        }
        // Bytes below the written position never change (see `Segment`): the run is
        // shared with the mapping instead of copied.
        let range = (from - seg.start()) as usize..(pos - seg.start()) as usize;
        let run = RecordRef {
            segment: seg,
            range,
        };
        Ok(Some(Shipment {
            offset: from,
            bytes: run.into_bytes(),
            next,
        }))
    }

    /// Appends a run shipped by the master at `offset`, which must be this log's
    /// written position. Every record is checked (header, size, CRCs, its stored
    /// physical offset) before anything is written; an 8-byte filler header ends the
    /// segment and the log rolls to the next. Returns the new written position and
    /// the run's store timestamps.
    pub fn append_replicated(&self, offset: u64, bytes: &[u8]) -> Result<Appended> {
        // A slave whose own sync failed takes no more of the stream either.
        self.check_running()?;
        let mut st = self.lock_append();
        if st.pos != offset {
            return Err(refused(
                offset,
                format!("this log ends at {}; runs must continue it", st.pos),
            ));
        }
        let seg_end = st.active.end();
        // Check the whole run first: nothing of a bad run is written.
        let mut i = 0usize;
        let mut filler: Option<u32> = None;
        let mut queues: Vec<(String, u32, u64)> = Vec::new();
        let mut stamps: Vec<(i64, u32)> = Vec::new();
        while i < bytes.len() {
            let pos = offset + i as u64;
            let rest = &bytes[i..];
            if rest.len() < END_FILE_MIN_BLANK_LENGTH {
                return Err(refused(pos, "a partial record header"));
            }
            match record::read_header(&rest[..END_FILE_MIN_BLANK_LENGTH]) {
                Ok(Header::Blank { size }) => {
                    if pos + u64::from(size) != seg_end || rest.len() != END_FILE_MIN_BLANK_LENGTH {
                        return Err(refused(
                            pos,
                            format!(
                                "a filler of {size} bytes that does not end the segment (which ends at {seg_end}) or the run"
                            ),
                        ));
                    }
                    filler = Some(size);
                    i += END_FILE_MIN_BLANK_LENGTH;
                }
                Ok(Header::Message { size }) => {
                    let size = size as usize;
                    if size > rest.len() {
                        return Err(refused(
                            pos,
                            format!("a record of {size} bytes cut at {}", rest.len()),
                        ));
                    }
                    if pos + (size + END_FILE_MIN_BLANK_LENGTH) as u64 > seg_end {
                        return Err(refused(
                            pos,
                            "a record that leaves no room for the segment's filler",
                        ));
                    }
                    let view = RecordView::parse(&rest[..size]).map_err(|e| refused(pos, e))?;
                    view.verify().map_err(|e| refused(pos, e))?;
                    if view.phys_offset() != pos as i64 {
                        return Err(refused(
                            pos,
                            format!("the record says it is at offset {}", view.phys_offset()),
                        ));
                    }
                    let (topic, qid) = (view.topic(), view.queue_id() as u32);
                    let next = view.queue_offset() as u64 + 1;
                    match queues.iter_mut().find(|(t, q, _)| t == topic && *q == qid) {
                        Some(slot) => slot.2 = slot.2.max(next),
                        None => queues.push((topic.to_owned(), qid, next)),
                    }
                    let ts = view.store_timestamp();
                    match stamps.last_mut() {
                        Some((last, n)) if *last == ts => *n += 1,
                        _ => stamps.push((ts, 1)),
                    }
                    i += size;
                }
                Ok(Header::Zero) => return Err(refused(pos, "a zero header")),
                Err(e) => return Err(refused(pos, e)),
            }
        }
        let active = st.active.clone();
        // Whole runs: one `pwrite`, not a memcpy into the mapping (see `write_file`).
        active.write_file((offset - active.start()) as usize, bytes)?;
        if let Some(&(ts, _)) = stamps.last() {
            active.note_store_timestamp(ts);
        }
        for (topic, qid, next) in queues {
            let now = st.queue_offsets.get(&topic, qid);
            st.queue_offsets.set(&topic, qid, now.max(next));
        }
        st.pos = offset + bytes.len() as u64;
        if filler.is_some() {
            let next = Arc::new(Segment::create(
                &self.dir,
                seg_end,
                self.config.segment_size as usize,
                self.config.write_through,
                &self.files,
            )?);
            crate::sync::write(&self.segments).push(next.clone());
            next.advise_appending(0);
            let sealed = std::mem::replace(&mut st.active, next);
            sealed.advise_sealed();
            st.pos = seg_end;
        }
        self.written.store(st.pos, Ordering::Release);
        Ok(Appended {
            end: st.pos,
            stamps,
        })
    }

    /// Moves an empty log's start to `start` (a segment boundary): a brand-new slave
    /// of a master whose oldest retained segment starts there. Refused unless the log
    /// holds nothing.
    pub fn restart_empty_at(&self, start: u64) -> Result<()> {
        if !start.is_multiple_of(self.config.segment_size) {
            return Err(Error::InvalidArgument(format!(
                "log start {start} is not a multiple of the segment size {}",
                self.config.segment_size
            )));
        }
        let mut st = self.lock_append();
        let mut segs = crate::sync::write(&self.segments);
        if segs.len() != 1 || st.pos != segs[0].start() {
            return Err(Error::InvalidArgument(format!(
                "only an empty log can restart at {start} (this one ends at {})",
                st.pos
            )));
        }
        if segs[0].start() == start {
            return Ok(());
        }
        let fresh = Arc::new(Segment::create(
            &self.dir,
            start,
            self.config.segment_size as usize,
            self.config.write_through,
            &self.files,
        )?);
        let old = std::mem::replace(&mut segs[0], fresh.clone());
        std::fs::remove_file(old.path()).map_err(|e| Error::io(old.path(), e))?;
        fresh.advise_appending(0);
        st.active = fresh;
        st.pos = start;
        self.written.store(start, Ordering::Release);
        self.flushed.store(start, Ordering::Release);
        self.warmed.store(0, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::tests::config;
    use super::super::{CommitLog, Recovery};
    use crate::store::record::Message;

    fn open(dir: &Path) -> CommitLog {
        CommitLog::open(dir, config(), Recovery::Full).unwrap().0
    }

    fn fill(log: &CommitLog, n: usize) {
        for i in 0..n {
            let m = Message::new(
                format!("t{}", i % 3),
                (i % 2) as u32,
                vec![b'a' + (i % 26) as u8; 700 + i % 300],
            );
            log.append(&m).unwrap();
        }
    }

    /// Ships everything from `master` to `slave` in runs of at most `max` bytes;
    /// the runs, and the store timestamps the slave reported, `(store_ms, records)`.
    fn ship_all(master: &CommitLog, slave: &CommitLog, max: usize) -> (usize, Vec<(i64, u32)>) {
        let mut runs = 0;
        let mut stamps = Vec::new();
        let mut from = slave.max_offset();
        while let Some(s) = master.ship(from, u64::MAX, max).unwrap() {
            assert_eq!(s.offset, from);
            let appended = slave.append_replicated(s.offset, &s.bytes).unwrap();
            assert_eq!(slave.max_offset(), s.next);
            assert_eq!(appended.end, slave.max_offset());
            stamps.extend(appended.stamps);
            from = s.next;
            runs += 1;
        }
        (runs, stamps)
    }

    fn segment_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    e.file_name().into_string().unwrap(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_slave_log_is_byte_identical_across_segment_rolls() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let master = open(a.path());
        let slave = open(b.path());
        // ~170 KiB in 64 KiB segments: two rolls with fillers.
        let before = super::super::now_millis();
        fill(&master, 200);
        let after = super::super::now_millis();
        assert!(master.segments().len() >= 3);
        let (runs, stamps) = ship_all(&master, &slave, 16 << 10);
        assert!(runs > 3, "shipped in {runs} runs");
        // Every record's store timestamp is reported once (what the lag histogram
        // counts), fillers none, and they are the master's.
        let records: u32 = stamps.iter().map(|(_, n)| n).sum();
        assert_eq!(records, 200, "{stamps:?}");
        assert!(
            stamps.iter().all(|(ts, _)| (before..=after).contains(ts)),
            "{stamps:?} outside {before}..={after}"
        );
        fill(&master, 50);
        let (_, stamps) = ship_all(&master, &slave, 1);
        assert_eq!(stamps.iter().map(|(_, n)| n).sum::<u32>(), 50);
        assert_eq!(slave.max_offset(), master.max_offset());
        assert_eq!(slave.next_queue_offsets(), master.next_queue_offsets());
        slave.flush().unwrap();
        master.flush().unwrap();
        assert_eq!(segment_bytes(a.path()), segment_bytes(b.path()));
        // And it reopens (recovery agrees the records are whole).
        drop(slave);
        let again = open(b.path());
        assert_eq!(again.max_offset(), master.max_offset());
    }

    #[test]
    fn bad_runs_are_refused_and_write_nothing() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let master = open(a.path());
        let slave = open(b.path());
        fill(&master, 5);
        let run = master.ship(0, u64::MAX, 1 << 20).unwrap().unwrap();
        // Not at the slave's end.
        assert!(slave.append_replicated(run.offset + 1, &run.bytes).is_err());
        // A flipped body byte (CRC).
        let mut bad = run.bytes.to_vec();
        let last = bad.len() - 40;
        bad[last] ^= 0xff;
        let e = slave.append_replicated(0, &bad).unwrap_err().to_string();
        assert!(e.contains("CRC"), "{e}");
        // Cut in the middle of a record.
        assert!(
            slave
                .append_replicated(0, &run.bytes[..run.bytes.len() - 3])
                .is_err()
        );
        // Garbage.
        assert!(slave.append_replicated(0, &[0x42; 64]).is_err());
        // Records valid in themselves but for other offsets.
        let second = master.ship(run.bytes.len() as u64 / 2, u64::MAX, 1 << 20);
        assert!(
            second.is_err()
                || second
                    .unwrap()
                    .is_none_or(|s| slave.append_replicated(0, &s.bytes).is_err())
        );
        assert_eq!(slave.max_offset(), 0);
        slave.append_replicated(0, &run.bytes).unwrap();
        assert_eq!(slave.max_offset(), master.max_offset());
    }

    #[test]
    fn an_empty_log_restarts_at_a_segment_boundary_only() {
        let b = tempfile::tempdir().unwrap();
        let slave = open(b.path());
        let seg = config().segment_size;
        assert!(slave.restart_empty_at(seg + 1).is_err());
        slave.restart_empty_at(2 * seg).unwrap();
        assert_eq!((slave.min_offset(), slave.max_offset()), (2 * seg, 2 * seg));
        drop(slave);
        let again = open(b.path());
        assert_eq!(again.max_offset(), 2 * seg);
        fill(&again, 1);
        assert!(again.restart_empty_at(0).is_err());
    }
}
