//! Integrity on every read: a record's checksums are verified before the store
//! hands it to anyone (replay, id lookup, pull, POP, MQTT delivery all read
//! through [`Store`](super::Store)).
//!
//! Recovery verifies only the log past the checkpoint, so a bit flipped on disk
//! below it (a bad sector, a stray write) used to be served as if it were the
//! message (issue #25). Now:
//! - a record whose body CRC or whole-record `__CRC32#` does not match is never
//!   returned: the single-record reads fail with [`Error::Corrupt`];
//! - a consume-queue read drops entries whose record is damaged or is not the
//!   message the entry names (another topic, queue or queue offset: an entry the
//!   log disagrees with), and moves past them, so a consumer is not stuck behind
//!   one bad record. The policy is "skip and report": each one is logged and
//!   counted in [`Store::corrupt_records`](super::Store::corrupt_records).
//!
//! Cost: one CRC32 (SIMD, `crc32fast`) over the record
//! ([`RecordView::verify_once`]). A consumer reads a queue batch and then each
//! record of it, so the verdict is cached ([`Verdicts`]): a record verified by the
//! queue read is not hashed again a moment later. Figures in docs/reliability.md.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{CqEntry, Error, Inner, RecordRef, Result};
use crate::store::record::RecordView;

/// Slots of the verdict cache (a power of two): 32 KiB, a few consumers' batches.
const VERDICT_SLOTS: usize = 4096;

/// Records that passed verification recently, by commit-log offset: a
/// direct-mapped table of `offset + 1` (0 = empty). A collision only costs a
/// second verification. Offsets are never reused while the store is open (the log
/// only grows; recovery truncates before anyone reads), so a hit is always the
/// same bytes. Only good verdicts are kept: a bad record is reported every time.
pub(super) struct Verdicts {
    slots: Box<[AtomicU64]>,
}

impl Verdicts {
    pub(super) fn new() -> Self {
        Verdicts {
            slots: (0..VERDICT_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, phys: u64) -> &AtomicU64 {
        // Records are at least tens of bytes apart: mix the bits so neighbours spread.
        let h = phys.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52;
        &self.slots[h as usize % VERDICT_SLOTS]
    }

    fn is_good(&self, phys: u64) -> bool {
        self.slot(phys).load(Ordering::Relaxed) == phys + 1
    }

    fn set_good(&self, phys: u64) {
        self.slot(phys).store(phys + 1, Ordering::Relaxed);
    }
}

impl Inner {
    /// `rec` if its checksums hold; else reported and [`Error::Corrupt`].
    pub(super) fn verified(&self, rec: RecordRef) -> Result<RecordRef> {
        let phys = rec.phys_offset();
        if self.verdicts.is_good(phys) {
            return Ok(rec);
        }
        let bad = match RecordView::parse(&rec) {
            Ok(view) => view.verify_once().err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        match bad {
            None => {
                self.verdicts.set_good(phys);
                Ok(rec)
            }
            Some(reason) => Err(self.report_corrupt(&rec, reason)),
        }
    }

    /// The record `e` points at, if it is intact and the one `e` names.
    pub(super) fn verified_entry(
        &self,
        topic: &str,
        queue_id: u32,
        queue_offset: u64,
        e: &CqEntry,
    ) -> Result<RecordRef> {
        self.verified_entry_with(topic, queue_id, queue_offset, e, |_| ())
            .map(|(rec, ())| rec)
    }

    /// [`Self::verified_entry`], running `inspect` on the record's parsed view
    /// (the one parse of the record this read does): a reader that needs the
    /// record's fields (a filter) gets them without a second parse.
    pub(super) fn verified_entry_with<T>(
        &self,
        topic: &str,
        queue_id: u32,
        queue_offset: u64,
        e: &CqEntry,
        inspect: impl FnOnce(&RecordView<'_>) -> T,
    ) -> Result<(RecordRef, T)> {
        let rec = match self.log.read(e.phys_offset, e.size) {
            Ok(rec) => rec,
            // The entry's size or offset disagrees with the record there.
            Err(err @ Error::Corrupt { .. }) => return Err(self.count_corrupt(err)),
            Err(e) => return Err(e),
        };
        let phys = rec.phys_offset();
        let mut out = None;
        // One parse for both checks: a second `RecordView::parse` per message was
        // ~2 % of a native consume's CPU.
        let bad = match RecordView::parse(&rec) {
            Err(e) => Some(e.to_string()),
            Ok(view) => {
                let verdict = if self.verdicts.is_good(phys) {
                    Ok(())
                } else {
                    view.verify_once()
                };
                match verdict {
                    Err(e) => Some(e.to_string()),
                    Ok(()) => {
                        self.verdicts.set_good(phys);
                        let names_it = view.topic() == topic
                            && view.queue_id() == queue_id as i32
                            && view.queue_offset() == queue_offset as i64;
                        if names_it {
                            out = Some(inspect(&view));
                            None
                        } else {
                            Some(format!(
                                "consume-queue entry {topic}/{queue_id}@{queue_offset} points at a record of {}/{}@{}",
                                view.topic(),
                                view.queue_id(),
                                view.queue_offset()
                            ))
                        }
                    }
                }
            }
        };
        match (bad, out) {
            (None, Some(out)) => Ok((rec, out)),
            (Some(reason), _) => Err(self.report_corrupt(&rec, reason)),
            (None, None) => Err(self.report_corrupt(&rec, "not inspected".into())),
        }
    }

    fn report_corrupt(&self, rec: &RecordRef, reason: String) -> Error {
        self.count_corrupt(Error::Corrupt {
            path: rec.segment.path().to_path_buf(),
            offset: rec.phys_offset(),
            reason,
        })
    }

    fn count_corrupt(&self, err: Error) -> Error {
        self.counters
            .corrupt_records
            .fetch_add(1, Ordering::Relaxed);
        tracing::error!(error = %err, "damaged record not served");
        err
    }
}
