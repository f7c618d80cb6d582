//! Pull with long polling: read matching messages from one consume queue, and
//! when there are none, wait for the store's dispatcher to publish more.
//!
//! The wait is on the queue's own arrivals
//! ([`Store::queue_arrivals`](crate::store::Store::queue_arrivals)), not a poll
//! interval, and keyed by queue as RocketMQ's `PullRequestHoldService` keys its
//! waiters: only the dispatch of this queue's entries wakes the puller. The
//! wait is armed *before* the queue is read, so a message dispatched between the
//! read and the wait still wakes it. (Waiting on the node-wide dispatch position
//! instead woke every poller of every queue for each append: with the MQTT
//! router's reader per queue, a tenth of the broker's CPU at 10k msgs/s went to
//! wake-ups that found nothing; issue #10.)
//!
//! Filtering is two-step: the tag hash in the consume-queue entry first (no
//! commit-log read), then the real tag or the properties on the record.

use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::filter::Filter;
use super::local::Broker;
use super::values::{Delivered, PullRequest, PullResult, PullStatus};
use crate::store::{CqEntry, RecordRef, Store};
use crate::sync::lock;
use crate::{Error, Result};

/// One scan of a queue.
struct Scan {
    messages: Vec<Delivered>,
    next_offset: u64,
    /// The commit-log end of the last entry examined (0: none).
    read_to: u64,
}

impl Broker {
    pub(super) async fn pull_waiting(&self, req: PullRequest) -> Result<PullResult> {
        let config = self.topic_config(&req.topic)?;
        if !config.perm.is_readable() {
            return Err(Error::NoPermission {
                topic: req.topic.clone(),
                operation: "read",
            });
        }
        if req.queue_id >= config.read_queues {
            return Err(Error::QueueNotFound {
                topic: req.topic.clone(),
                queue_id: req.queue_id,
                queues: config.read_queues,
            });
        }
        self.check_queue_lock(&req)?;

        let deadline = Instant::now() + req.wait;
        let queue = self.store.queue_arrivals(&req.topic, req.queue_id)?;
        let mut offset = req.offset;
        loop {
            let arrived = queue.arrivals().notified();
            let mut arrived = std::pin::pin!(arrived);
            arrived.as_mut().enable();
            let (min, max) = self.store.queue_bounds(&req.topic, req.queue_id);
            if offset < min || offset > max {
                return Ok(PullResult {
                    status: PullStatus::OffsetMoved,
                    messages: Vec::new(),
                    next_offset: offset.clamp(min, max),
                    min_offset: min,
                    max_offset: max,
                    behind_bytes: 0,
                });
            }
            if offset < max {
                let scan = self.scan(&req, offset)?;
                offset = scan.next_offset;
                if !scan.messages.is_empty() {
                    let (min, max) = self.store.queue_bounds(&req.topic, req.queue_id);
                    let written = self.store.positions().written;
                    return Ok(PullResult {
                        status: PullStatus::Found,
                        messages: scan.messages,
                        next_offset: offset,
                        min_offset: min,
                        max_offset: max,
                        behind_bytes: written.saturating_sub(scan.read_to),
                    });
                }
                if offset < max {
                    // The filter rejected a whole batch; let others run, go on.
                    if Instant::now() >= deadline {
                        return Ok(no_new(offset, min, max));
                    }
                    tokio::task::yield_now().await;
                    continue;
                }
            }
            // Caught up: wait for the dispatcher (or give up at the deadline).
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Ok(no_new(offset, min, max));
            }
        }
    }

    /// Waits until one of `topic`'s queues has an entry at or past `next[queue]`
    /// (or `next[queue]` is outside its range), or `wait` passes. Armed before
    /// the queues are looked at, as a pull is, so an entry dispatched in between
    /// still wakes it; only the topic's own queues do.
    pub(super) async fn wait_for_topic(
        &self,
        topic: &str,
        next: &[u64],
        wait: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + wait;
        let queues = u32::try_from(next.len())
            .unwrap_or(u32::MAX)
            .min(self.topic_config(topic)?.read_queues);
        let arrivals = (0..queues)
            .map(|q| self.store.queue_arrivals(topic, q))
            .collect::<Result<Vec<_>>>()?;
        let mut armed: Vec<_> = arrivals
            .iter()
            .map(|q| Box::pin(q.arrivals().notified()))
            .collect();
        for n in &mut armed {
            n.as_mut().enable();
        }
        for (q, &offset) in (0..queues).zip(next) {
            let (_, max) = self.store.queue_bounds(topic, q);
            if offset != max {
                // More to read, or an offset a pull will move.
                return Ok(());
            }
        }
        let arrived = std::future::poll_fn(|cx| {
            if armed.iter_mut().any(|n| n.as_mut().poll(cx).is_ready()) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        let _ = tokio::time::timeout_at(deadline, arrived).await;
        Ok(())
    }

    /// Refuses a pull of a queue another member holds an orderly lock on.
    fn check_queue_lock(&self, req: &PullRequest) -> Result<()> {
        let groups = lock(&self.groups);
        match groups.lock_owner(&req.group, &req.topic, req.queue_id, self.clock.now_ms()) {
            Some(owner) if owner != req.member => Err(Error::QueueLocked {
                group: req.group.clone(),
                topic: req.topic.clone(),
                queue_id: req.queue_id,
                owner: owner.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Reads at most one batch of entries from `from`, keeping those the filter
    /// accepts, up to `max_messages`.
    fn scan(&self, req: &PullRequest, from: u64) -> Result<Scan> {
        let want = req.max_messages.max(1);
        let read = self.store.read_queue_entries(
            &req.topic,
            req.queue_id,
            from,
            self.opts.pull_scan_batch.max(want),
        )?;
        let mut scan = Scan {
            messages: Vec::with_capacity(want.min(read.entries.len())),
            next_offset: read.next_offset,
            read_to: 0,
        };
        for (queue_offset, entry) in read.entries {
            if scan.messages.len() >= want {
                scan.next_offset = queue_offset;
                break;
            }
            scan.next_offset = queue_offset + 1;
            scan.read_to = entry.phys_offset + u64::from(entry.size);
            let at = (req.topic.as_str(), req.queue_id, queue_offset);
            let Some(record) = read_if_matches(&self.store, &req.filter, at, &entry)? else {
                continue;
            };
            scan.messages.push(Delivered {
                queue_id: req.queue_id,
                queue_offset,
                record: record.into_bytes(),
            });
        }
        Ok(scan)
    }
}

fn no_new(next_offset: u64, min_offset: u64, max_offset: u64) -> PullResult {
    PullResult {
        status: PullStatus::NoNewMessage,
        messages: Vec::new(),
        next_offset,
        min_offset,
        max_offset,
        behind_bytes: 0,
    }
}

/// The two-step filter every read path uses: the consume-queue tag hash first (no
/// commit-log read for a non-matching tag), then the real tag and properties from the
/// record (hashes collide). The record when it matches.
///
/// This is also where the record is verified, once
/// ([`Store::read_queued`]: checksums, and that it is the message entry `at`
/// = (topic, queue id, queue offset) names): a damaged one is reported and
/// skipped like a non-matching one, an I/O error is an error (the reader keeps
/// its place). Verifying here rather than in the queue read means one log read,
/// one parse and one CRC per delivered message, and none for an entry the tag
/// hash rejects.
pub(super) fn read_if_matches(
    store: &Store,
    filter: &Filter,
    at: (&str, u32, u64),
    entry: &CqEntry,
) -> Result<Option<RecordRef>> {
    if !filter.matches_tag_hash(entry.tag_hash) {
        return Ok(None);
    }
    let (topic, queue_id, queue_offset) = at;
    let found = store.read_queued(topic, queue_id, queue_offset, entry, |view| {
        filter.matches_with(view.tags(), |name| view.property(name))
    })?;
    Ok(found.and_then(|(record, matched)| matched.then_some(record)))
}
