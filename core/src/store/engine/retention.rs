//! Retention and the disk-full policy: which commit-log segments may go, and
//! when appends are refused.
//!
//! - **Time**: a segment whose newest record is older than `retention` goes,
//!   read or not (the configured retention is a promise to the operator).
//! - **Disk pressure** (usage above the soft ratio): what may go depends on
//!   [`DiskFullPolicy`]. Under `Refuse` (the default) only segments every record of
//!   which some reader has consumed; under `DeleteOldest` the oldest segment
//!   anyway, with a warning and [`Store::unread_dropped`](super::Store::unread_dropped)
//!   counting the unread messages it took.
//! - **Hard ratio**, or the file system answering `ENOSPC`: appends fail with
//!   [`Error::DiskFull`] until the usage is below the hard ratio again.
//!
//! "Unread" comes from [`ReadProgress`] (the broker's committed consumer offsets):
//! a message is unread while some group that consumes its topic has not committed
//! past it, and every message of a topic no group has ever committed an offset for
//! is unread (a user publishing to a topic before its consumers first connect
//! expects them to find the messages). docs/reliability.md has the whole story.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Error, Inner, Result};

/// What the store does when the disk fills up (`store.disk_full_policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DiskFullPolicy {
    /// Never delete an unread message for space: refuse new writes past the hard
    /// ratio instead, and take them again once space is back.
    #[default]
    Refuse,
    /// Kafka's and RocketMQ's way: delete the oldest segment above the soft ratio
    /// whether or not it was read; every unread message dropped is logged and counted.
    DeleteOldest,
}

/// How far consumers have read, as the store needs it to tell read from unread.
pub trait ReadProgress: Send + Sync {
    /// The lowest queue offset of `(topic, queue_id)` that some consumer of the
    /// topic has not consumed yet; `None` when no consumer ever committed an
    /// offset for the topic (then every message of it is unread).
    fn consumed_below(&self, topic: &str, queue_id: u32) -> Option<u64>;
}

/// The progress before a broker attaches its offsets: nothing is known read, so
/// under [`DiskFullPolicy::Refuse`] disk pressure deletes nothing.
pub(super) struct NothingRead;

impl ReadProgress for NothingRead {
    fn consumed_below(&self, _topic: &str, _queue_id: u32) -> Option<u64> {
        None
    }
}

/// Entries read per step while counting what a deletion drops.
const COUNT_BATCH: usize = 4096;

/// Entries read per step while looking for a queue's first unread one (more
/// than one only to get past holes).
const FLOOR_BATCH: usize = 16;

impl Inner {
    pub(super) fn disk_full_error(&self) -> Error {
        Error::DiskFull {
            usage_percent: self.disk_usage_bp.load(Ordering::Relaxed) as f64 / 100.0,
            limit_percent: self.opts.disk_hard_ratio * 100.0,
        }
    }

    /// An append that the file system refused for lack of space becomes
    /// [`Error::DiskFull`] and stops further appends until the next disk check sees
    /// space again (a full file system below the hard ratio: the ratio is of the
    /// whole disk, the blocks a segment needs may not be there).
    pub(super) fn out_of_space(&self, e: Error) -> Error {
        if !e.is_out_of_space() {
            return e;
        }
        if !self.disk_full.swap(true, Ordering::AcqRel) {
            tracing::error!(error = %e, "the file system is full: refusing appends");
        }
        self.disk_full_error()
    }

    fn progress(&self) -> Arc<dyn ReadProgress> {
        crate::sync::read(&self.progress).clone()
    }

    /// The lowest commit-log offset of a message some consumer has not read
    /// (`u64::MAX` when everything is read).
    fn unread_floor(&self, progress: &dyn ReadProgress) -> Result<u64> {
        let mut floor = u64::MAX;
        for (topic, qid, q) in self.queues.queues() {
            let (min, max) = (q.min_offset(), q.max_offset());
            let from = progress.consumed_below(&topic, qid).unwrap_or(0).max(min);
            // Holes are skipped by reads; the first real entry is the floor.
            let mut at = from;
            while at < max {
                let batch = q.read(at, FLOOR_BATCH)?;
                if let Some((_, e)) = batch.entries.first() {
                    floor = floor.min(e.phys_offset);
                    break;
                }
                if batch.next_offset <= at {
                    break;
                }
                at = batch.next_offset;
            }
        }
        Ok(floor)
    }

    /// Unread messages stored in `phys` (what deleting that segment drops).
    fn unread_in(&self, progress: &dyn ReadProgress, phys: std::ops::Range<u64>) -> Result<u64> {
        let mut dropped = 0;
        for (topic, qid, q) in self.queues.queues() {
            let max = q.max_offset();
            let mut from = progress
                .consumed_below(&topic, qid)
                .unwrap_or(0)
                .max(q.min_offset());
            'queue: while from < max {
                let batch = q.read(from, COUNT_BATCH)?;
                for (_, e) in &batch.entries {
                    if e.phys_offset >= phys.end {
                        break 'queue;
                    }
                    // Earlier segments deleted in this pass still have entries
                    // (queues are trimmed after the pass): counted already.
                    if e.phys_offset >= phys.start {
                        dropped += 1;
                    }
                }
                if batch.next_offset <= from {
                    break;
                }
                from = batch.next_offset;
            }
        }
        Ok(dropped)
    }

    /// Deletes expired segments, and the oldest ones while above the soft disk
    /// ratio as far as the [`DiskFullPolicy`] allows.
    pub(super) fn retain(&self) -> Result<usize> {
        let now = self.deps.clock.now_ms();
        let cutoff = now - self.opts.retention.as_millis() as i64;
        let mut deleted = 0;
        // Never delete what is not yet dispatched or durable: recovery needs it.
        let safe_below = self
            .dispatched
            .load(Ordering::Acquire)
            .min(self.log.flushed_offset());
        let progress = self.progress();
        loop {
            let segs = self.log.segments();
            let Some(oldest) = segs.first() else { break };
            let seg_end = oldest.start + oldest.written;
            if segs.len() < 2 || seg_end > safe_below {
                break;
            }
            // The newest message's store time when this process saw it, else the file's
            // modification time (mmap writes update it).
            let newest = oldest.last_store_timestamp.or_else(|| {
                oldest
                    .modified
                    .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as i64)
            });
            let expired = newest.is_some_and(|t| t < cutoff);
            let over_soft = self.usage() > self.opts.disk_soft_ratio;
            if !expired && !over_soft {
                break;
            }
            if !expired {
                match self.opts.disk_full_policy {
                    DiskFullPolicy::Refuse => {
                        if self.unread_floor(progress.as_ref())? < seg_end {
                            tracing::debug!(
                                segment = %oldest.path.display(),
                                "disk above the soft ratio, but the oldest segment holds unread messages: kept"
                            );
                            break;
                        }
                    }
                    DiskFullPolicy::DeleteOldest => {
                        let unread = self.unread_in(progress.as_ref(), oldest.start..seg_end)?;
                        if unread > 0 {
                            self.counters
                                .unread_dropped
                                .fetch_add(unread, Ordering::Relaxed);
                            tracing::warn!(
                                segment = %oldest.path.display(),
                                unread,
                                "disk_full_policy = delete_oldest: deleting a segment with unread messages"
                            );
                        }
                    }
                }
            }
            tracing::info!(
                segment = %oldest.path.display(),
                reason = if expired { "retention time" } else { "disk usage" },
                "deleting commit-log segment"
            );
            self.log.delete_oldest_segment()?;
            deleted += 1;
        }
        if deleted > 0 {
            let min = self.log.min_offset();
            self.queues.delete_all_before_phys(min)?;
            self.index.delete_files_before_phys(min)?;
        }
        Ok(deleted)
    }

    pub(super) fn usage(&self) -> f64 {
        match self.deps.disk.usage_ratio(&self.dir) {
            Ok(r) => {
                self.disk_usage_bp
                    .store((r * 10_000.0) as u64, Ordering::Relaxed);
                r
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read disk usage");
                self.disk_usage_bp.load(Ordering::Relaxed) as f64 / 10_000.0
            }
        }
    }

    /// Sets or clears the disk-full flag. Deletes old segments first when above soft.
    pub(super) fn check_disk(&self) {
        let mut r = self.usage();
        if r > self.opts.disk_soft_ratio {
            if let Err(e) = self.retain() {
                tracing::error!(error = %e, "freeing disk space failed");
            }
            r = self.usage();
        }
        let full = r > self.opts.disk_hard_ratio;
        let was = self.disk_full.swap(full, Ordering::AcqRel);
        if full && !was {
            tracing::error!(
                usage = r,
                limit = self.opts.disk_hard_ratio,
                "disk full: refusing appends"
            );
        } else if was && !full {
            tracing::info!(usage = r, "disk space is back: accepting appends");
        }
    }
}
