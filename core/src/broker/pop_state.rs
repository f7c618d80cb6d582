//! The POP bookkeeping of every (group, topic, queue), as a pure state machine
//! with its file: what has been handed out, until when, how often, and what is
//! done. No I/O besides [`PopState::flush`]; time comes in as arguments.
//!
//! Per queue, a [`PopQueue`] keeps the *cursor* (the next queue offset never
//! examined for the group) and the *in-flight* leases (offset → deadline,
//! attempt, revision) of messages handed out and not acked.
//!
//! # Invariants
//! - Every offset in `[base, cursor)` is either in flight or done (acked, or
//!   skipped because the group's filter rejected it); `base` is the lowest
//!   in-flight offset, or the cursor when nothing is in flight. So the set of
//!   acked offsets above the low-water mark is implicit and costs nothing.
//! - `base` is what the broker writes to the group's consume offset: a process
//!   that knows nothing else resumes from the first message not yet acked.
//! - A lease is identified by `(attempt, revision)`: a redelivery raises the
//!   attempt, [`PopTable::change`] raises the revision. A receipt handle acts
//!   only on the lease it names, so a stale handle never acks a newer delivery.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::persist;
use super::receipt::ReceiptHandle;
use crate::sync::lock;
use crate::{Error, Result};

/// One handed-out, not yet acked message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Invisible to other POPs until then (ms since the epoch, broker clock).
    pub deadline_ms: i64,
    /// 1 on the first delivery, raised by each redelivery.
    pub attempt: u32,
    /// Raised by each change of invisibility within one delivery.
    pub revision: u32,
}

/// The POP state of one queue for one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PopQueue {
    /// The next queue offset never examined for this group.
    pub cursor: u64,
    /// Handed out and not acked, by queue offset.
    pub in_flight: BTreeMap<u64, Lease>,
}

impl PopQueue {
    /// The low-water mark: every offset below it is done.
    pub fn base(&self) -> u64 {
        self.in_flight.keys().next().copied().unwrap_or(self.cursor)
    }

    /// The lease `handle` names, or why it names none.
    fn lease_of(&self, handle: &ReceiptHandle) -> Result<Lease, &'static str> {
        let offset = handle.queue_offset;
        match self.in_flight.get(&offset) {
            Some(l) if l.attempt == handle.attempt && l.revision == handle.revision => Ok(*l),
            Some(_) => Err("superseded by a redelivery or a change of invisibility"),
            None if offset < self.cursor => Err("already acked"),
            None => Err("never delivered"),
        }
    }
}

/// What one scan of a queue from the cursor found, to be claimed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scanned {
    /// The cursor the scan started from (as stored, before clamping).
    pub cursor: u64,
    /// Past the last examined entry.
    pub next: u64,
    /// The examined offsets the filter accepted.
    pub matched: Vec<u64>,
}

/// What a POP of an ordered (FIFO) group may take from one queue
/// ([`PopTable::fifo_gate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FifoGate {
    /// Nothing in flight: new messages may go out.
    Open,
    /// An earlier message is in flight and invisible: nothing goes out.
    Blocked,
    /// The in-flight messages, leased again in queue order: `(offset, lease)`.
    Redeliver(Vec<(u64, Lease)>),
}

type Queues = BTreeMap<u32, PopQueue>;

#[derive(Serialize, Deserialize, Default)]
struct PopFile {
    version: u32,
    /// group -> topic -> queue id -> state.
    queues: BTreeMap<String, BTreeMap<String, Queues>>,
}

/// Every group's POP state. Not synchronized: [`PopState`] holds it under one lock.
#[derive(Debug)]
pub struct PopTable {
    path: PathBuf,
    queues: BTreeMap<String, BTreeMap<String, Queues>>,
    /// Where the next POP of (group, topic) starts looking, so one busy queue
    /// does not starve the others. Not persisted.
    rotation: HashMap<(String, String), u32>,
    /// Bumped on every change, so a flush can tell whether the file is behind.
    version: u64,
    /// On a slave: each queue's state as the master's records last set it, to tell
    /// the queues this node's own doors changed since. Not persisted.
    from_master: HashMap<(String, String, u32), PopQueue>,
}

impl PopTable {
    pub fn open(config_dir: &Path) -> Result<PopTable> {
        let path = config_dir.join("pop.json");
        let file: PopFile = persist::read_json(&path)?.unwrap_or_default();
        Ok(PopTable {
            path,
            queues: file.queues,
            rotation: HashMap::new(),
            version: 0,
            from_master: HashMap::new(),
        })
    }

    /// Messages handed out and not yet acked, per group (`/metrics`).
    pub fn in_flight_by_group(&self) -> Vec<(String, usize)> {
        self.queues
            .iter()
            .map(|(g, topics)| {
                let n = topics
                    .values()
                    .flat_map(|qs| qs.values())
                    .map(|q| q.in_flight.len())
                    .sum();
                (g.clone(), n)
            })
            .collect()
    }

    pub fn queue(&self, group: &str, topic: &str, queue_id: u32) -> Option<&PopQueue> {
        self.queues.get(group)?.get(topic)?.get(&queue_id)
    }

    fn queue_mut(&mut self, group: &str, topic: &str, queue_id: u32) -> Option<&mut PopQueue> {
        self.queues
            .get_mut(group)?
            .get_mut(topic)?
            .get_mut(&queue_id)
    }

    /// The state of a queue, created with its cursor at `start` on first use.
    fn queue_or_start(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        start: u64,
    ) -> &mut PopQueue {
        self.queues
            .entry(group.to_owned())
            .or_default()
            .entry(topic.to_owned())
            .or_default()
            .entry(queue_id)
            .or_insert_with(|| PopQueue {
                cursor: start,
                in_flight: BTreeMap::new(),
            })
    }

    /// Moves every cursor past its queue's end (`end(topic, queue)`) back to that end,
    /// dropping what was in flight at or past it (those offsets hold other messages
    /// now, or none); returns how many queues moved. See
    /// [`OffsetTable::clamp_to_ends`](super::offsets::OffsetTable::clamp_to_ends).
    pub fn clamp_to_ends(&mut self, end: impl Fn(&str, u32) -> u64) -> usize {
        let mut moved = 0;
        for topics in self.queues.values_mut() {
            for (topic, queues) in topics.iter_mut() {
                for (q, state) in queues.iter_mut() {
                    let e = end(topic, *q);
                    if state.cursor > e {
                        state.cursor = e;
                        state.in_flight.retain(|offset, _| *offset < e);
                        moved += 1;
                    }
                }
            }
        }
        if moved > 0 {
            self.version += 1;
        }
        moved
    }

    /// The cursor of a queue (`start` if the group never popped it).
    pub fn cursor(&self, group: &str, topic: &str, queue_id: u32, start: u64) -> u64 {
        self.queue(group, topic, queue_id)
            .map_or(start, |q| q.cursor)
    }

    /// The first queue a POP of (group, topic) looks at; moves on by one each call.
    pub fn rotate(&mut self, group: &str, topic: &str, queues: u32) -> u32 {
        let next = self
            .rotation
            .entry((group.to_owned(), topic.to_owned()))
            .or_insert(0);
        let first = *next % queues.max(1);
        *next = first + 1;
        first
    }

    /// Leases again up to `max` in-flight messages whose deadline has passed,
    /// with their attempt raised. Returns `(offset, new lease)`.
    pub fn claim_expired(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        now_ms: i64,
        deadline_ms: i64,
        max: usize,
    ) -> Vec<(u64, Lease)> {
        let Some(q) = self.queue_mut(group, topic, queue_id) else {
            return Vec::new();
        };
        let mut claimed = Vec::new();
        for (offset, lease) in q.in_flight.iter_mut() {
            if claimed.len() >= max {
                break;
            }
            if lease.deadline_ms <= now_ms {
                *lease = Lease {
                    deadline_ms,
                    attempt: lease.attempt.saturating_add(1),
                    revision: 0,
                };
                claimed.push((*offset, *lease));
            }
        }
        if !claimed.is_empty() {
            self.version += 1;
        }
        claimed
    }

    /// The ordered (FIFO) gate of one queue: what a POP of a FIFO group may take
    /// from it before anything new. Nothing in flight: [`FifoGate::Open`]. The
    /// lowest in-flight message still invisible: [`FifoGate::Blocked`] (nothing
    /// after it goes out while it is held). The lowest one due again (timed out or
    /// nacked): the in-flight messages are leased again in queue order, up to
    /// `max`, each with its attempt raised; the ones past `max` are made due now
    /// with their revision raised, so whoever held them can no longer ack them
    /// ahead of the redelivered ones, and they follow once those are acked.
    pub fn fifo_gate(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        now_ms: i64,
        deadline_ms: i64,
        max: usize,
    ) -> FifoGate {
        let Some(q) = self.queue_mut(group, topic, queue_id) else {
            return FifoGate::Open;
        };
        match q.in_flight.values().next() {
            None => return FifoGate::Open,
            Some(head) if head.deadline_ms > now_ms => return FifoGate::Blocked,
            Some(_) => {}
        }
        let mut again = Vec::new();
        for (offset, lease) in q.in_flight.iter_mut() {
            if again.len() < max {
                *lease = Lease {
                    deadline_ms,
                    attempt: lease.attempt.saturating_add(1),
                    revision: 0,
                };
                again.push((*offset, *lease));
            } else {
                lease.deadline_ms = lease.deadline_ms.min(now_ms);
                lease.revision = lease.revision.wrapping_add(1);
            }
        }
        self.version += 1;
        FifoGate::Redeliver(again)
    }

    /// [`PopTable::claim_new`] for a FIFO group: claims only while nothing of
    /// the queue is in flight (`None`: something is, take nothing new).
    pub fn claim_new_idle(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        start: u64,
        scan: &Scanned,
        deadline_ms: i64,
    ) -> Option<bool> {
        if self
            .queue(group, topic, queue_id)
            .is_some_and(|q| !q.in_flight.is_empty())
        {
            return None;
        }
        Some(self.claim_new(group, topic, queue_id, start, scan, deadline_ms))
    }

    /// Hands out `scan.matched` and marks the rest of `[scan.cursor, scan.next)`
    /// done, if the cursor is still `scan.cursor`; `false` if another POP moved
    /// it meanwhile (the caller scans again). `start` is the cursor of a queue
    /// the group never popped.
    pub fn claim_new(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        start: u64,
        scan: &Scanned,
        deadline_ms: i64,
    ) -> bool {
        let q = self.queue_or_start(group, topic, queue_id, start);
        if q.cursor != scan.cursor {
            return false;
        }
        q.cursor = scan.next.max(q.cursor);
        for offset in &scan.matched {
            q.in_flight.insert(
                *offset,
                Lease {
                    deadline_ms,
                    attempt: 1,
                    revision: 0,
                },
            );
        }
        self.version += 1;
        true
    }

    /// Moves a queue's cursor to `offset` (an offset reset) and drops its
    /// leases: everything from `offset` is delivered again, handles issued
    /// before are stale. A queue the group never popped is left alone (it starts
    /// at the committed offset, which the reset moved too).
    pub fn reset(&mut self, group: &str, topic: &str, queue_id: u32, offset: u64) {
        if let Some(q) = self.queue_mut(group, topic, queue_id) {
            q.cursor = offset;
            q.in_flight.clear();
            self.version += 1;
        }
    }

    /// On a master: the group's consumers got to `offset` of this queue on a slave
    /// while the master was away (its OFFSETS frame). Moves the cursor up to
    /// `offset` and drops the leases below it: the slave's low-water mark says
    /// those messages were acked there, so the master must not hand them out (or
    /// out again) once the group is back. A queue the group never popped here is
    /// left alone (it starts at the committed offset, which moved too). Returns
    /// whether anything changed.
    pub fn advance_to(&mut self, group: &str, topic: &str, queue_id: u32, offset: u64) -> bool {
        let Some(q) = self.queue_mut(group, topic, queue_id) else {
            return false;
        };
        let before = (q.cursor, q.in_flight.len());
        q.in_flight = q.in_flight.split_off(&offset);
        q.cursor = q.cursor.max(offset);
        let changed = before != (q.cursor, q.in_flight.len());
        if changed {
            self.version += 1;
        }
        changed
    }

    /// Forgets an in-flight message whose record is gone (retention deleted
    /// it), or that was sent back for a retry.
    pub fn forget(&mut self, group: &str, topic: &str, queue_id: u32, offset: u64) {
        if let Some(q) = self.queue_mut(group, topic, queue_id)
            && q.in_flight.remove(&offset).is_some()
        {
            self.version += 1;
        }
    }

    /// Acks the delivery `handle` names. Returns the queue's new low-water mark.
    pub fn ack(&mut self, handle: &ReceiptHandle) -> Result<u64> {
        let q = self.lease_holder(handle)?;
        q.in_flight.remove(&handle.queue_offset);
        let base = q.base();
        self.version += 1;
        Ok(base)
    }

    /// Moves the deadline of the delivery `handle` names; returns the new handle
    /// (the old one stops working).
    pub fn change(&mut self, handle: &ReceiptHandle, deadline_ms: i64) -> Result<ReceiptHandle> {
        let q = self.lease_holder(handle)?;
        let lease = q
            .in_flight
            .get_mut(&handle.queue_offset)
            .ok_or_else(|| stale(handle, "never delivered"))?;
        lease.deadline_ms = deadline_ms;
        lease.revision = lease.revision.wrapping_add(1);
        let renewed = ReceiptHandle {
            invisible_until_ms: deadline_ms,
            revision: lease.revision,
            ..handle.clone()
        };
        self.version += 1;
        Ok(renewed)
    }

    /// A FIFO nack's tail: every in-flight message of the handle's queue after
    /// it is due by `deadline_ms` at the latest, its revision raised (whoever
    /// holds it can no longer ack it ahead of the nacked one).
    pub fn release_after(&mut self, handle: &ReceiptHandle, deadline_ms: i64) {
        let Some(q) = self.queue_mut(&handle.group, &handle.topic, handle.queue_id) else {
            return;
        };
        for (_, lease) in q.in_flight.range_mut(handle.queue_offset + 1..) {
            lease.deadline_ms = lease.deadline_ms.min(deadline_ms);
            lease.revision = lease.revision.wrapping_add(1);
        }
        self.version += 1;
    }

    fn lease_holder(&mut self, handle: &ReceiptHandle) -> Result<&mut PopQueue> {
        let q = self
            .queue_mut(&handle.group, &handle.topic, handle.queue_id)
            .ok_or_else(|| stale(handle, "the group never popped this queue"))?;
        q.lease_of(handle).map_err(|why| stale(handle, why))?;
        Ok(q)
    }

    /// The earliest deadline of an in-flight message of (group, topic).
    pub fn next_expiry(&self, group: &str, topic: &str) -> Option<i64> {
        self.queues
            .get(group)?
            .get(topic)?
            .values()
            .flat_map(|q| q.in_flight.values().map(|l| l.deadline_ms))
            .min()
    }

    /// Forgets every group's POP state of a deleted topic.
    pub fn remove_topic(&mut self, topic: &str) {
        for topics in self.queues.values_mut() {
            if topics.remove(topic).is_some() {
                self.version += 1;
            }
        }
        self.queues.retain(|_, t| !t.is_empty());
        self.rotation.retain(|(_, t), _| t != topic);
    }

    /// Forgets a deleted group's cursors and in-flight leases (its receipt handles go
    /// stale). Returns how many queue states went.
    pub fn remove_group(&mut self, group: &str) -> usize {
        let Some(topics) = self.queues.remove(group) else {
            return 0;
        };
        self.rotation.retain(|(g, _), _| g != group);
        self.version += 1;
        topics.values().map(|q| q.len()).sum()
    }

    /// Whether `group` has any POP state.
    pub fn has_group(&self, group: &str) -> bool {
        self.queues.contains_key(group)
    }

    /// Bumped on every change (a publisher compares it to skip unchanged tables).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Every queue's state: group -> topic -> queue id -> state (a copy).
    pub fn all(&self) -> BTreeMap<String, BTreeMap<String, BTreeMap<u32, PopQueue>>> {
        self.queues.clone()
    }

    /// On a slave: sets one queue's state to the master's (`None`: the master
    /// forgot it). A queue this slave's own doors changed since the master's last
    /// state for it (a group that consumed here while the master was away) keeps
    /// its state until the master's cursor is not behind it: the master's record is
    /// older news then, and applying it would deliver those messages again.
    /// Returns whether anything changed.
    pub fn set_from_master(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        state: Option<&PopQueue>,
    ) -> bool {
        let key = (group.to_owned(), topic.to_owned(), queue_id);
        let now = self.queue(group, topic, queue_id).cloned();
        let local = now.is_some() && now.as_ref() != self.from_master.get(&key);
        if local {
            let mine = now.as_ref().map_or(0, |q| q.cursor);
            if state.is_none_or(|s| s.cursor < mine) {
                return false;
            }
        }
        match state {
            Some(s) => {
                self.from_master.insert(key, s.clone());
                if now.as_ref() == Some(s) {
                    return false;
                }
                *self.queue_or_start(group, topic, queue_id, s.cursor) = s.clone();
            }
            None => {
                self.from_master.remove(&key);
                if now.is_none() {
                    return false;
                }
                if let Some(topics) = self.queues.get_mut(group) {
                    if let Some(queues) = topics.get_mut(topic) {
                        queues.remove(&queue_id);
                        if queues.is_empty() {
                            topics.remove(topic);
                        }
                    }
                    if topics.is_empty() {
                        self.queues.remove(group);
                    }
                }
            }
        }
        self.version += 1;
        true
    }

    /// On a slave: forgets every queue state `keep` (the master's full record) does
    /// not name, as [`PopTable::set_from_master`] with `None`. Returns how many went.
    pub fn retain_from_master(
        &mut self,
        keep: &BTreeMap<String, BTreeMap<String, BTreeMap<u32, Option<PopQueue>>>>,
    ) -> usize {
        let mut gone = Vec::new();
        for (group, topics) in &self.queues {
            for (topic, queues) in topics {
                for q in queues.keys() {
                    let named = keep
                        .get(group)
                        .and_then(|t| t.get(topic))
                        .and_then(|qs| qs.get(q))
                        .is_some_and(|s| s.is_some());
                    if !named {
                        gone.push((group.clone(), topic.clone(), *q));
                    }
                }
            }
        }
        gone.into_iter()
            .filter(|(g, t, q)| self.set_from_master(g, t, *q, None))
            .count()
    }

    fn snapshot(&self) -> Result<(Vec<u8>, u64)> {
        let file = PopFile {
            version: 1,
            queues: self.queues.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&file)
            .map_err(|e| Error::InvalidArgument(format!("cannot encode POP state: {e}")))?;
        Ok((bytes, self.version))
    }
}

fn stale(handle: &ReceiptHandle, reason: &'static str) -> Error {
    Error::StaleReceiptHandle {
        handle: handle.to_string(),
        reason,
    }
}

/// The POP table shared by poppers, ackers and the background flusher.
#[derive(Debug)]
pub struct PopState {
    /// One short lock around the table: POPs, acks and changes of invisibility
    /// of every group go through it, and each holds it only for map updates
    /// (never across an `.await`, a store read or a file write).
    table: Mutex<PopTable>,
    /// The table version `pop.json` holds. Held while the file is written, so
    /// two flushes never race and an older snapshot never replaces a newer one.
    file: Mutex<u64>,
    /// Bumped when a lease becomes visible sooner than planned (a nack or a
    /// shorter invisibility), so waiting POPs look again instead of sleeping
    /// until the deadline they knew.
    sooner: tokio::sync::watch::Sender<u64>,
}

impl PopState {
    pub fn open(config_dir: &Path) -> Result<PopState> {
        Ok(PopState {
            table: Mutex::new(PopTable::open(config_dir)?),
            file: Mutex::new(0),
            sooner: tokio::sync::watch::channel(0).0,
        })
    }

    /// Wakes every waiting POP: some lease became visible sooner.
    pub fn lease_sooner(&self) {
        self.sooner.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Changes with every [`PopState::lease_sooner`].
    pub fn watch_sooner(&self) -> tokio::sync::watch::Receiver<u64> {
        self.sooner.subscribe()
    }

    pub fn table(&self) -> MutexGuard<'_, PopTable> {
        lock(&self.table)
    }

    /// Writes the file if the table changed since the last write.
    pub fn flush(&self) -> Result<()> {
        let mut written = lock(&self.file);
        let (bytes, version, path) = {
            let t = self.table();
            if t.version == *written {
                return Ok(());
            }
            let (bytes, version) = t.snapshot()?;
            (bytes, version, t.path.clone())
        };
        persist::write_raw(&path, &bytes)?;
        *written = version;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(cursor: u64, next: u64, matched: &[u64]) -> Scanned {
        Scanned {
            cursor,
            next,
            matched: matched.to_vec(),
        }
    }

    fn handle(offset: u64, lease: Lease) -> ReceiptHandle {
        ReceiptHandle {
            group: "g".into(),
            topic: "t".into(),
            queue_id: 0,
            queue_offset: offset,
            invisible_until_ms: lease.deadline_ms,
            attempt: lease.attempt,
            revision: lease.revision,
            broker: None,
        }
    }

    fn table() -> (tempfile::TempDir, PopTable) {
        let dir = tempfile::tempdir().unwrap();
        let t = PopTable::open(dir.path()).unwrap();
        (dir, t)
    }

    #[test]
    fn the_low_water_mark_is_the_first_unacked_offset() {
        let (_d, mut t) = table();
        // Offsets 0..5 examined; 1 and 3 rejected by the filter.
        assert!(t.claim_new("g", "t", 0, 0, &scanned(0, 5, &[0, 2, 4]), 100));
        let lease = t.queue("g", "t", 0).unwrap().in_flight[&2];
        assert_eq!(t.ack(&handle(2, lease)).unwrap(), 0);
        let lease = t.queue("g", "t", 0).unwrap().in_flight[&0];
        assert_eq!(t.ack(&handle(0, lease)).unwrap(), 4);
        let lease = t.queue("g", "t", 0).unwrap().in_flight[&4];
        assert_eq!(t.ack(&handle(4, lease)).unwrap(), 5);
        let err = t.ack(&handle(4, lease)).unwrap_err();
        assert!(matches!(
            err,
            Error::StaleReceiptHandle {
                reason: "already acked",
                ..
            }
        ));
    }

    #[test]
    fn a_moved_cursor_refuses_the_claim() {
        let (_d, mut t) = table();
        assert!(t.claim_new("g", "t", 0, 0, &scanned(0, 2, &[0, 1]), 100));
        assert!(!t.claim_new("g", "t", 0, 0, &scanned(0, 2, &[0, 1]), 100));
        assert_eq!(t.cursor("g", "t", 0, 0), 2);
    }

    #[test]
    fn expiry_redelivers_and_stales_the_old_handle() {
        let (_d, mut t) = table();
        assert!(t.claim_new("g", "t", 0, 0, &scanned(0, 1, &[0]), 100));
        let first = handle(0, t.queue("g", "t", 0).unwrap().in_flight[&0]);
        assert!(t.claim_expired("g", "t", 0, 99, 200, 10).is_empty());
        let again = t.claim_expired("g", "t", 0, 100, 200, 10);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].1.attempt, 2);
        assert!(t.ack(&first).is_err());
        let changed = t.change(&handle(0, again[0].1), 100).unwrap();
        assert!(t.ack(&handle(0, again[0].1)).is_err());
        assert_eq!(t.ack(&changed).unwrap(), 1);
    }

    #[test]
    fn state_survives_a_flush_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let state = PopState::open(dir.path()).unwrap();
        assert!(
            state
                .table()
                .claim_new("g", "t", 1, 3, &scanned(3, 6, &[3, 5]), 100)
        );
        state.flush().unwrap();
        let t = PopTable::open(dir.path()).unwrap();
        let q = t.queue("g", "t", 1).unwrap();
        assert_eq!(q.cursor, 6);
        assert_eq!(q.base(), 3);
        assert_eq!(q.in_flight.keys().copied().collect::<Vec<_>>(), [3, 5]);
    }

    #[test]
    fn a_master_record_does_not_undo_what_the_slave_served_itself() {
        let (_d, mut t) = table();
        let master = PopQueue {
            cursor: 4,
            in_flight: BTreeMap::new(),
        };
        assert!(t.set_from_master("g", "t", 0, Some(&master)));
        assert!(!t.set_from_master("g", "t", 0, Some(&master)));
        // The slave's door serves the group: cursor 4 -> 9.
        assert!(t.claim_new("g", "t", 0, 0, &scanned(4, 9, &[]), 100));
        // An older master record (a full one on a rejoin) leaves it alone.
        assert!(!t.set_from_master("g", "t", 0, Some(&master)));
        assert_eq!(t.retain_from_master(&BTreeMap::new()), 0);
        assert_eq!(t.cursor("g", "t", 0, 0), 9);
        // Once the master is not behind, its state wins again.
        let ahead = PopQueue {
            cursor: 12,
            in_flight: BTreeMap::new(),
        };
        assert!(t.set_from_master("g", "t", 0, Some(&ahead)));
        assert_eq!(t.cursor("g", "t", 0, 0), 12);
        // A queue the master forgot goes with its full record.
        assert_eq!(t.retain_from_master(&BTreeMap::new()), 1);
        assert!(t.queue("g", "t", 0).is_none());
    }
}
