//! POP: message-level load balancing. Any number of consumers of a group take
//! messages from any readable queue of a topic; each message is leased to one of
//! them until it is acked or its invisibility time runs out, then it reappears
//! with its attempt raised. Stateless gateways (HTTP, WebSocket, MQTT shared
//! subscriptions) use this instead of queue allocation.
//!
//! The bookkeeping is [`PopState`](super::pop_state::PopState): a per-queue
//! cursor and the in-flight leases. A POP takes its lock only to claim: it reads
//! and filters the consume queue with the lock released, then claims the
//! scanned range if the cursor did not move meanwhile (otherwise it scans again),
//! so two POPs never hand out the same message and no store read happens under
//! the lock. Deadlines use the broker's [`Clock`](super::Clock); the long-poll
//! wait uses tokio time, like `pull`, and like `pull` it waits on the arrivals of
//! the topic's own queues, not on the node-wide dispatch position: with a waiter
//! per HTTP or WebSocket consumer, that woke every one of them, on every topic,
//! for each append anywhere.

use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::local::Broker;
use super::pop_state::{FifoGate, Lease, Scanned};
use super::pull::read_if_matches;
use super::receipt::ReceiptHandle;
use super::schedule;
use super::values::{Delivered, PopRequest, Popped};
use crate::{Error, Result};

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Broker {
    pub(super) async fn pop_waiting(&self, req: PopRequest) -> Result<Vec<Popped>> {
        schedule::validate_group(&req.group)?;
        if req.max_messages == 0 {
            return Err(Error::InvalidArgument(
                "a POP asks for at least one message".into(),
            ));
        }
        let deadline = Instant::now() + req.wait;
        let mut topics = self.watch_topics();
        let mut sooner = self.pop.watch_sooner();
        loop {
            topics.borrow_and_update();
            sooner.borrow_and_update();
            // Read each round: the topic may be updated or deleted while we wait.
            let config = self.topic_config(&req.topic)?;
            if !config.perm.is_readable() {
                return Err(Error::NoPermission {
                    topic: req.topic.clone(),
                    operation: "read",
                });
            }
            let queues = config.read_queues;
            // Armed before the queues are read, so that an entry dispatched in
            // between still wakes this POP; only its own topic's queues do.
            let arrivals = (0..queues)
                .map(|q| self.store.queue_arrivals(&req.topic, q))
                .collect::<Result<Vec<_>>>()?;
            let mut armed: Vec<_> = arrivals
                .iter()
                .map(|q| Box::pin(q.arrivals().notified()))
                .collect();
            for n in &mut armed {
                n.as_mut().enable();
            }
            let now = self.clock.now_ms();
            let until = now.saturating_add(millis(req.invisible));
            let first = self.pop.table().rotate(&req.group, &req.topic, queues);
            let fifo = self.is_fifo(&req.group);
            let mut out = Vec::new();
            let mut dead = Vec::new();
            let mut behind = false;
            for i in 0..queues {
                if out.len() >= req.max_messages {
                    break;
                }
                let queue_id = (first + i) % queues;
                let at = At {
                    queue_id,
                    now,
                    until,
                };
                behind |= if fifo {
                    self.pop_queue_fifo(&req, at, &mut out, &mut dead)?
                } else {
                    self.pop_queue(&req, queue_id, now, until, &mut out, &mut dead)?
                };
            }
            if !dead.is_empty() {
                // Rare, and a send: boxed, so that a waiting POP (what an idle
                // WebSocket clustering subscription holds) does not carry its state.
                Box::pin(self.dead_letter_expired(&req, dead)).await;
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
            if behind {
                // The filter rejected a whole batch; let others run, go on.
                tokio::task::yield_now().await;
                continue;
            }
            // Wait for a dispatch, or until a leased message becomes visible again.
            let wake = match self.pop.table().next_expiry(&req.group, &req.topic) {
                Some(at) if at > now => {
                    let after = Duration::from_millis(u64::try_from(at - now).unwrap_or(0));
                    deadline.min(Instant::now() + after)
                }
                _ => deadline,
            };
            // Woken by a dispatch to one of the topic's queues, a lease made
            // visible sooner, a change of the topic table, or the time.
            let arrived = std::future::poll_fn(|cx| {
                if armed.iter_mut().any(|n| n.as_mut().poll(cx).is_ready()) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            let woken = tokio::time::timeout_at(wake, async {
                tokio::select! {
                    () = arrived => true,
                    r = sooner.changed() => r.is_ok(),
                    r = topics.changed() => r.is_ok(),
                }
            })
            .await;
            if woken == Ok(false) {
                return Ok(out); // the broker is gone
            }
        }
    }

    /// Takes what one queue has for the POP: first messages whose invisibility
    /// ran out, then never-delivered ones from the cursor (one scan batch).
    /// Returns whether the cursor is still behind the end of the queue.
    fn pop_queue(
        &self,
        req: &PopRequest,
        queue_id: u32,
        now: i64,
        until: i64,
        out: &mut Vec<Popped>,
        dead: &mut Vec<OutOfAttempts>,
    ) -> Result<bool> {
        let (group, topic) = (req.group.as_str(), req.topic.as_str());
        let want = req.max_messages - out.len();
        let expired = self
            .pop
            .table()
            .claim_expired(group, topic, queue_id, now, until, want);
        for (offset, lease) in expired {
            self.redeliver(req, queue_id, offset, lease, out, dead)?;
        }

        let (min, max) = self.store.queue_bounds(topic, queue_id);
        let start = self
            .offsets
            .table()
            .get(group, topic, queue_id)
            .unwrap_or(min);
        let mut behind = false;
        loop {
            let want = req.max_messages - out.len();
            let cursor = self.pop.table().cursor(group, topic, queue_id, start);
            let from = cursor.max(min);
            if want == 0 || from >= max {
                break;
            }
            let (scan, found) = self.scan_new(req, queue_id, cursor, from, want)?;
            let lease = Lease {
                deadline_ms: until,
                attempt: 1,
                revision: 0,
            };
            if self
                .pop
                .table()
                .claim_new(group, topic, queue_id, start, &scan, until)
            {
                behind = scan.next < max;
                out.extend(
                    found
                        .into_iter()
                        .map(|(offset, record)| popped(req, queue_id, offset, record, lease)),
                );
                break;
            }
            // Another POP claimed from this cursor first: scan again from its end.
        }
        self.sync_consume_offset(group, topic, queue_id);
        Ok(behind)
    }

    /// [`Self::pop_queue`] for an ordered (FIFO) group: while a message of the
    /// queue is in flight nothing after it goes out; once the first in-flight
    /// one is due again (timed out, nacked) the in-flight ones go out again, in
    /// queue order, before anything new; only with nothing in flight does a scan
    /// hand out new messages (a batch of them, in order, to this one POP).
    fn pop_queue_fifo(
        &self,
        req: &PopRequest,
        at: At,
        out: &mut Vec<Popped>,
        dead: &mut Vec<OutOfAttempts>,
    ) -> Result<bool> {
        let (group, topic, queue_id) = (req.group.as_str(), req.topic.as_str(), at.queue_id);
        let want = req.max_messages - out.len();
        let gate = self
            .pop
            .table()
            .fifo_gate(group, topic, queue_id, at.now, at.until, want);
        match gate {
            FifoGate::Blocked => return Ok(false),
            FifoGate::Redeliver(again) => {
                for (offset, lease) in again {
                    self.redeliver(req, queue_id, offset, lease, out, dead)?;
                }
                self.sync_consume_offset(group, topic, queue_id);
                return Ok(false);
            }
            FifoGate::Open => {}
        }
        let (min, max) = self.store.queue_bounds(topic, queue_id);
        let start = self
            .offsets
            .table()
            .get(group, topic, queue_id)
            .unwrap_or(min);
        let mut behind = false;
        loop {
            let want = req.max_messages - out.len();
            let cursor = self.pop.table().cursor(group, topic, queue_id, start);
            let from = cursor.max(min);
            if want == 0 || from >= max {
                break;
            }
            let (scan, found) = self.scan_new(req, queue_id, cursor, from, want)?;
            let lease = Lease {
                deadline_ms: at.until,
                attempt: 1,
                revision: 0,
            };
            let claimed = self
                .pop
                .table()
                .claim_new_idle(group, topic, queue_id, start, &scan, at.until);
            match claimed {
                // Another POP took a batch of this queue meanwhile: it waits for that.
                None => break,
                Some(true) => {
                    behind = scan.next < max && found.is_empty();
                    out.extend(
                        found
                            .into_iter()
                            .map(|(offset, record)| popped(req, queue_id, offset, record, lease)),
                    );
                    break;
                }
                // The cursor moved (a scan that matched nothing): look again.
                Some(false) => {}
            }
        }
        self.sync_consume_offset(group, topic, queue_id);
        Ok(behind)
    }

    /// Hands out one message leased again, or dead-letters it when its last
    /// allowed delivery ran out.
    fn redeliver(
        &self,
        req: &PopRequest,
        queue_id: u32,
        offset: u64,
        lease: Lease,
        out: &mut Vec<Popped>,
        dead: &mut Vec<OutOfAttempts>,
    ) -> Result<()> {
        let (group, topic) = (req.group.as_str(), req.topic.as_str());
        match self.read_at(topic, queue_id, offset)? {
            Some(record) if lease.attempt > self.max_pop_deliveries(group) => {
                dead.push(OutOfAttempts {
                    queue_id,
                    offset,
                    record,
                    attempt: lease.attempt - 1,
                });
            }
            Some(record) => out.push(popped(req, queue_id, offset, record, lease)),
            // Retention removed it: nothing left to deliver.
            None => self.pop.table().forget(group, topic, queue_id, offset),
        }
        Ok(())
    }

    /// How often a POP message is delivered before an expiry dead-letters it:
    /// once, then `max_reconsume_times` redeliveries, as with send-back.
    fn max_pop_deliveries(&self, group: &str) -> u32 {
        self.max_reconsume_times(group).saturating_add(1)
    }

    /// Moves messages whose last allowed delivery expired to `%DLQ%<group>`,
    /// then forgets their leases. A message whose DLQ append fails keeps its
    /// (fresh, unhanded) lease and is tried again when that runs out, so it is
    /// never dropped; a crash between append and forget may dead-letter it twice.
    async fn dead_letter_expired(&self, req: &PopRequest, dead: Vec<OutOfAttempts>) {
        for d in dead {
            match self
                .dead_letter_popped(&req.group, &d.record, d.attempt)
                .await
            {
                Ok(_) => {
                    self.pop
                        .table()
                        .forget(&req.group, &req.topic, d.queue_id, d.offset);
                    self.sync_consume_offset(&req.group, &req.topic, d.queue_id);
                }
                Err(e) => tracing::error!(
                    error = %e,
                    group = req.group,
                    topic = req.topic,
                    offset = d.offset,
                    "dead-lettering a POP message failed; retried at its next expiry"
                ),
            }
        }
    }

    /// Reads one batch of the queue from `from` (the cursor `cursor`, clamped to
    /// the queue's minimum), keeping up to `want` entries the filter accepts.
    fn scan_new(
        &self,
        req: &PopRequest,
        queue_id: u32,
        cursor: u64,
        from: u64,
        want: usize,
    ) -> Result<(Scanned, Vec<(u64, bytes::Bytes)>)> {
        let read = self.store.read_queue_entries(
            &req.topic,
            queue_id,
            from,
            self.opts.pull_scan_batch.max(want),
        )?;
        let mut scan = Scanned {
            cursor,
            next: read.next_offset,
            matched: Vec::new(),
        };
        let mut found = Vec::new();
        for (offset, entry) in read.entries {
            if found.len() >= want {
                scan.next = offset;
                break;
            }
            scan.next = offset + 1;
            let at = (req.topic.as_str(), queue_id, offset);
            if let Some(record) = read_if_matches(&self.store, &req.filter, at, &entry)? {
                scan.matched.push(offset);
                found.push((offset, record.into_bytes()));
            }
        }
        Ok((scan, found))
    }

    /// The record at one queue offset, `None` if retention removed it.
    pub(super) fn read_at(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Result<Option<bytes::Bytes>> {
        let read = self.store.read_queue(topic, queue_id, offset, 1)?;
        match read.entries.into_iter().next() {
            Some((at, entry)) if at == offset => {
                Ok(Some(self.store.read_entry(&entry)?.into_bytes()))
            }
            _ => Ok(None),
        }
    }

    /// Writes the queue's POP low-water mark to the group's consume offset, so
    /// anything that reads offsets (and a restart without `pop.json`) resumes at
    /// the first message not yet acked.
    pub(super) fn sync_consume_offset(&self, group: &str, topic: &str, queue_id: u32) {
        let base = self
            .pop
            .table()
            .queue(group, topic, queue_id)
            .map(|q| q.base());
        if let Some(base) = base {
            let mut offsets = self.offsets.table();
            if offsets.get(group, topic, queue_id) != Some(base) {
                offsets.set(group, topic, queue_id, base);
            }
        }
    }

    pub(super) fn ack_receipt(&self, handle: &ReceiptHandle) -> Result<()> {
        self.pop.table().ack(handle)?;
        self.sync_consume_offset(&handle.group, &handle.topic, handle.queue_id);
        if self.is_fifo(&handle.group) {
            // The queue may be open again: a POP waiting on it looks now, not at
            // the end of its long poll.
            self.pop.lease_sooner();
        }
        Ok(())
    }

    /// A nack: the delivery is due again after `delay`; in a FIFO group the
    /// later in-flight messages of its queue go back with it.
    pub(super) fn nack_receipt(&self, handle: &ReceiptHandle, delay: Duration) -> Result<()> {
        let until = self.clock.now_ms().saturating_add(millis(delay));
        {
            let mut table = self.pop.table();
            table.change(handle, until)?;
            if self.is_fifo(&handle.group) {
                table.release_after(handle, until);
            }
        }
        self.pop.lease_sooner();
        Ok(())
    }

    pub(super) fn renew_receipt(
        &self,
        handle: &ReceiptHandle,
        invisible: Duration,
    ) -> Result<ReceiptHandle> {
        let until = self.clock.now_ms().saturating_add(millis(invisible));
        let renewed = self.pop.table().change(handle, until)?;
        // A POP waiting for the old deadline must see the new one (a nack is
        // a renewal to now: the message is due again at once).
        self.pop.lease_sooner();
        Ok(renewed)
    }
}

/// Which queue a POP looks at, and its clock: now, and the deadline it leases to.
#[derive(Clone, Copy)]
struct At {
    queue_id: u32,
    now: i64,
    until: i64,
}

/// A POP message whose invisibility expired after its last allowed delivery.
struct OutOfAttempts {
    queue_id: u32,
    offset: u64,
    record: bytes::Bytes,
    /// Deliveries so far.
    attempt: u32,
}

fn popped(
    req: &PopRequest,
    queue_id: u32,
    queue_offset: u64,
    record: bytes::Bytes,
    lease: Lease,
) -> Popped {
    Popped {
        message: Delivered {
            queue_id,
            queue_offset,
            record,
        },
        receipt: ReceiptHandle {
            group: req.group.clone(),
            topic: req.topic.clone(),
            queue_id,
            queue_offset,
            invisible_until_ms: lease.deadline_ms,
            attempt: lease.attempt,
            revision: lease.revision,
            broker: None,
        },
    }
}
