//! Transactional messages, RocketMQ's design: half messages, commit or
//! rollback, and the check-back of undecided ones.
//!
//! `TxnState` owns all of it and reaches the rest of the broker through the
//! store and a `TopicLookup` (the real topic's queue count and permission at
//! commit); the broker checks a half's group, delay and target queue, as for a
//! send, before handing it over.
//!
//! - `store_half`: the message is stored durably in
//!   `RMQ_SYS_TRANS_HALF_TOPIC` queue 0 with its real topic and queue in
//!   `REAL_TOPIC` / `REAL_QID`, its producer group in `PGROUP` and the broker
//!   clock in [`HALF_AT`]. The half topic is in no topic listing and cannot be
//!   pulled, popped or sent to, and lookups refuse it: consumers see nothing.
//! - `end_half`: a commit appends the message to its real topic and
//!   queue (properties restored, same `UNIQ_KEY`, sys flag "commit") *and* an op
//!   record to `RMQ_SYS_TRANS_OP_HALF_TOPIC` (body: the half's queue offset, tag
//!   `d`) as one contiguous append; a rollback appends the op record only. The op
//!   records are the durable truth of what was decided.
//! - `check` ([`Broker::check_transactions`]): every half older than the transaction
//!   timeout and still undecided is handed to a [`TransactionChecker`] its
//!   producer group registered (the gateway asks a producer, which answers
//!   through `end_transaction`), at most `transaction_max_checks` times; the
//!   next round rolls it back. [`Broker::spawn_transaction_checks`] runs a round
//!   every `transaction_check_interval`.
//!
//! State (`TxnState`): which half offsets and op offsets are applied, as
//! low-water marks with the few done above them, and each undecided half's check
//! count. `config/transactions.json` is written by the offset flusher and only
//! counts decisions whose op record the commit log has flushed; at open the op
//! queue is re-read from the file's op low-water mark, so a decision is never
//! lost or invented by a crash. Check counts are best effort (a crash can lose
//! the last interval's, so a half may be checked a little more often).
//!
//! [`Broker::check_transactions`]: super::Broker::check_transactions
//! [`Broker::spawn_transaction_checks`]: super::Broker::spawn_transaction_checks
//!
//! # Invariants
//! - A half is ended at most once: `ending` claims it under the state lock
//!   before any append, and a decided or claimed half is refused
//!   ([`crate::Error::TransactionEnded`]).
//! - A commit stores the real message before (in the same append as) its op
//!   record: a crash can lose the decision and cause a second check (and a
//!   duplicate if the producer commits again), never lose a committed message.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::persist;
use super::schedule::{TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC, validate_group};
use super::topics::TopicLookup;
use super::values::SendResult;
pub use super::values::{
    CheckRound, CheckerRegistration, HalfMessage, HalfSent, Resolution, TransactionChecker,
    TransactionHandle,
};
use crate::clock::Clock;
use crate::store::record::{encode_msg_id, property, sys_flag};
use crate::store::{Message, RecordView, Store};
use crate::sync::lock;
use crate::{Error, Result};

/// Property of a half record: the broker clock (ms) when it was stored; the
/// transaction timeout counts from it.
pub const HALF_AT: &str = "TRAN_HALF_AT";
/// RocketMQ's client-side transaction id property.
pub const TRANSACTION_ID: &str = "__transactionId__";
/// Tag of an op record (RocketMQ's `TransactionalMessageUtil.REMOVE_TAG`).
const OP_TAG: &str = "d";
/// Property of an op record naming the decision (for people reading the log).
const OP_RESOLUTION: &str = "TRAN_RESOLUTION";
/// Half-queue entries read per step of a check round.
const SCAN_BATCH: usize = 256;

/// A set of offsets as a low-water mark plus the members above it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Marks {
    base: u64,
    done: BTreeSet<u64>,
}

impl Marks {
    fn mark(&mut self, offset: u64) {
        if offset >= self.base {
            self.done.insert(offset);
        }
        while self.done.remove(&self.base) {
            self.base += 1;
        }
    }

    fn contains(&self, offset: u64) -> bool {
        offset < self.base || self.done.contains(&offset)
    }

    /// Everything below `min` counts as done (retention removed it).
    fn advance_to(&mut self, min: u64) {
        if min > self.base {
            self.base = min;
            self.done.retain(|o| *o >= min);
            while self.done.remove(&self.base) {
                self.base += 1;
            }
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Progress {
    /// Decided half-queue offsets.
    halves: Marks,
    /// Applied op-queue offsets.
    ops: Marks,
}

#[derive(Serialize, Deserialize)]
struct TxnFile {
    version: u32,
    progress: Progress,
    /// Check counts of undecided halves, by half-queue offset.
    checks: BTreeMap<u64, u32>,
}

#[derive(Debug, Default)]
struct Txns {
    live: Progress,
    /// Halves being ended right now (claimed before their appends).
    ending: HashSet<u64>,
    /// Decisions waiting for the commit log: (end offset of the op record, half, op).
    pending: Vec<(u64, u64, u64)>,
    /// Progress whose op records are flushed; what the file holds.
    durable: Progress,
    checks: BTreeMap<u64, u32>,
    /// Bumped on every change the file should reflect.
    version: u64,
}

/// A registered checker and the id its registration removes it by.
type Registered = (u64, Arc<dyn TransactionChecker>);

#[derive(Default)]
struct Checkers {
    next_id: u64,
    by_group: HashMap<String, Vec<Registered>>,
}

/// Transactions of a broker: their state and what checking them needs. See
/// the module docs.
pub(super) struct TxnState {
    path: PathBuf,
    store: Arc<Store>,
    /// The broker's clock: half ages count by it.
    clock: Arc<dyn Clock>,
    /// A half younger than this is not checked yet.
    timeout: Duration,
    /// Checks of one half before it is rolled back.
    max_checks: u32,
    txns: Mutex<Txns>,
    /// The `Txns::version` the file holds; held while writing.
    file: Mutex<u64>,
    checkers: Arc<Mutex<Checkers>>,
    /// One check round at a time.
    round: tokio::sync::Mutex<()>,
}

/// The half-queue offset an op record decides.
fn op_half_offset(store: &Store, entry: &crate::store::CqEntry) -> Result<Option<u64>> {
    let record = store.read_entry(entry)?;
    let view = record.view()?;
    Ok(std::str::from_utf8(view.body())
        .ok()
        .and_then(|b| b.trim().parse().ok()))
}

impl TxnState {
    /// Loads `transactions.json` and applies the op records written after it.
    pub(super) fn open(
        config_dir: &Path,
        store: Arc<Store>,
        clock: Arc<dyn Clock>,
        timeout: Duration,
        max_checks: u32,
    ) -> Result<TxnState> {
        let path = config_dir.join("transactions.json");
        let (mut progress, checks) = match persist::read_json::<TxnFile>(&path)? {
            Some(f) => (f.progress, f.checks),
            None => (Progress::default(), BTreeMap::new()),
        };
        let mut from = progress.ops.base;
        loop {
            let read = store.read_queue(TRANS_OP_HALF_TOPIC, 0, from, SCAN_BATCH)?;
            if read.entries.is_empty() {
                break;
            }
            for (op, entry) in read.entries {
                if progress.ops.contains(op) {
                    continue;
                }
                match op_half_offset(&store, &entry)? {
                    Some(half) => progress.halves.mark(half),
                    None => tracing::warn!(op, "transaction op record without a half offset"),
                }
                progress.ops.mark(op);
            }
            from = read.next_offset;
        }
        let checks = checks
            .into_iter()
            .filter(|(half, _)| !progress.halves.contains(*half))
            .collect();
        Ok(TxnState {
            path,
            store,
            clock,
            timeout,
            max_checks,
            txns: Mutex::new(Txns {
                live: progress.clone(),
                durable: progress,
                checks,
                ..Txns::default()
            }),
            file: Mutex::new(0),
            checkers: Arc::new(Mutex::new(Checkers::default())),
            round: tokio::sync::Mutex::new(()),
        })
    }

    /// Writes the decisions whose op records the commit log has flushed and the
    /// check counts, if something changed. Halves and op records retention
    /// removed count as done (a half that is gone can no longer be committed).
    pub(super) fn flush(&self) -> Result<()> {
        let store = &self.store;
        let flushed = store.positions().flushed;
        let half_min = store.queue_bounds(TRANS_HALF_TOPIC, 0).0;
        let op_min = store.queue_bounds(TRANS_OP_HALF_TOPIC, 0).0;
        let mut written = lock(&self.file);
        let bytes = {
            let mut t = lock(&self.txns);
            let mut moved = false;
            let mut durable = std::mem::take(&mut t.durable);
            t.pending.retain(|&(end, half, op)| {
                if end > flushed {
                    return true;
                }
                durable.halves.mark(half);
                durable.ops.mark(op);
                moved = true;
                false
            });
            for p in [&mut durable, &mut t.live] {
                if half_min > p.halves.base || op_min > p.ops.base {
                    p.halves.advance_to(half_min);
                    p.ops.advance_to(op_min);
                    moved = true;
                }
            }
            t.durable = durable;
            let before = t.checks.len();
            t.checks.retain(|half, _| *half >= half_min);
            if moved || t.checks.len() != before {
                t.version += 1;
            }
            if t.version == *written {
                return Ok(());
            }
            let file = TxnFile {
                version: 1,
                progress: t.durable.clone(),
                checks: t.checks.clone(),
            };
            let bytes = serde_json::to_vec_pretty(&file).map_err(|e| {
                Error::InvalidArgument(format!("cannot encode transaction state: {e}"))
            })?;
            *written = t.version;
            bytes
        };
        persist::write_raw(&self.path, &bytes)
    }

    /// The commit-log offset the pending decisions wait for (0: none).
    pub(super) fn pending_end(&self) -> u64 {
        lock(&self.txns)
            .pending
            .iter()
            .map(|p| p.0)
            .max()
            .unwrap_or(0)
    }

    /// The checker for the `n`-th check of a half of `group` (they take turns).
    fn checker(&self, group: &str, n: u32) -> Option<Arc<dyn TransactionChecker>> {
        let c = lock(&self.checkers);
        let list = c.by_group.get(group).filter(|l| !l.is_empty())?;
        Some(list[n as usize % list.len()].1.clone())
    }
}

/// The message a commit stores: real topic and queue back, half-only
/// properties gone, sys flag "commit", the half's offset as prepared offset.
fn committed_message(view: &RecordView<'_>, half_phys: u64) -> Option<Message> {
    let topic = view.property(property::REAL_TOPIC)?.to_owned();
    let queue_id = view.property(property::REAL_QUEUE_ID)?.parse().ok()?;
    let mut msg = view.to_message();
    msg.properties.retain(|(k, _)| {
        ![
            property::REAL_TOPIC,
            property::REAL_QUEUE_ID,
            property::TRANSACTION_CHECK_TIMES,
            HALF_AT,
        ]
        .contains(&k.as_str())
    });
    msg.topic = topic;
    msg.queue_id = queue_id;
    msg.sys_flag =
        (msg.sys_flag & !sys_flag::TRANSACTION_TYPE_MASK) | sys_flag::TRANSACTION_COMMIT_TYPE;
    msg.prepared_transaction_offset = i64::try_from(half_phys).unwrap_or(i64::MAX);
    Some(msg)
}

impl TxnState {
    /// Stores a half of `producer_group` that a commit puts into `queue_id` of
    /// `topic`. The broker has checked the group, the target (as for a send)
    /// and that no delay is asked for, at broker time `now`.
    pub(super) async fn store_half(
        &self,
        producer_group: &str,
        mut message: Message,
        topic: String,
        queue_id: u32,
        now: i64,
    ) -> Result<HalfSent> {
        message.insert_property(property::REAL_TOPIC, topic.clone());
        message.insert_property(property::REAL_QUEUE_ID, queue_id.to_string());
        message.insert_property(property::TRANSACTION_PREPARED, "true");
        message.insert_property(property::PRODUCER_GROUP, producer_group);
        message.insert_property(HALF_AT, now.to_string());
        message.remove_property(property::TRANSACTION_CHECK_TIMES);
        // Stored as a plain record so the half queue indexes it (RocketMQ does
        // the same); the half topic is what hides it.
        message.sys_flag &= !sys_flag::TRANSACTION_TYPE_MASK;
        message.topic = TRANS_HALF_TOPIC.to_owned();
        message.queue_id = 0;
        let append = self
            .store
            .put_batch_async(std::slice::from_ref(&message))
            .await?
            .pop()
            .ok_or_else(|| Error::InvalidMessage("nothing appended".into()))?;
        let transaction = TransactionHandle::at(append.phys_offset, append.queue_offset);
        Ok(HalfSent {
            sent: SendResult {
                topic,
                queue_id,
                append,
            },
            transaction,
        })
    }

    /// The half record a handle names. Read by commit-log offset, not through
    /// the half queue: a producer may end its transaction before the dispatcher
    /// has indexed the half. The record must be a half at that queue offset.
    fn half_record(&self, handle: &TransactionHandle) -> Result<Bytes> {
        let record = self
            .store
            .read_at(handle.commit_log_offset)
            .ok()
            .map(|r| r.into_bytes())
            .filter(|r| {
                RecordView::parse(r).is_ok_and(|v| {
                    v.topic() == TRANS_HALF_TOPIC
                        && u64::try_from(v.phys_offset()).ok() == Some(handle.commit_log_offset)
                        && u64::try_from(v.queue_offset()).ok() == Some(handle.half_queue_offset)
                })
            });
        record.ok_or_else(|| Error::TransactionNotFound {
            handle: handle.to_string(),
        })
    }

    pub(super) async fn end_half(
        &self,
        topics: &dyn TopicLookup,
        handle: &TransactionHandle,
        resolution: Resolution,
    ) -> Result<Option<SendResult>> {
        let record = self.half_record(handle)?;
        let half = handle.half_queue_offset;
        {
            let mut t = lock(&self.txns);
            if t.live.halves.contains(half) || !t.ending.insert(half) {
                return Err(Error::TransactionEnded {
                    handle: handle.to_string(),
                });
            }
        }
        let appended = self.append_end(topics, handle, &record, resolution).await;
        let mut t = lock(&self.txns);
        t.ending.remove(&half);
        let (sent, op_end, op) = appended?;
        t.live.halves.mark(half);
        t.live.ops.mark(op);
        t.pending.push((op_end, half, op));
        t.checks.remove(&half);
        t.version += 1;
        Ok(sent)
    }

    /// Appends the op record, after the real message on a commit; returns
    /// where the message went, the op record's end and its op-queue offset.
    async fn append_end(
        &self,
        topics: &dyn TopicLookup,
        handle: &TransactionHandle,
        record: &[u8],
        resolution: Resolution,
    ) -> Result<(Option<SendResult>, u64, u64)> {
        let op = Message::new(TRANS_OP_HALF_TOPIC, 0, handle.half_queue_offset.to_string())
            .with_tags(OP_TAG)
            .with_property(OP_RESOLUTION, resolution.as_str());
        let mut batch = Vec::with_capacity(2);
        let mut real = None;
        if resolution == Resolution::Commit {
            let view = RecordView::parse(record)?;
            let mut msg = committed_message(&view, handle.commit_log_offset).ok_or_else(|| {
                Error::InvalidMessage(format!(
                    "half message {handle} lacks its real topic or queue"
                ))
            })?;
            let config = topics.topic_config(&msg.topic)?;
            if !config.perm.is_writable() {
                return Err(Error::NoPermission {
                    topic: config.name,
                    operation: "write",
                });
            }
            if msg.queue_id >= config.write_queues {
                msg.queue_id %= config.write_queues.max(1);
            }
            real = Some((config.name, msg.queue_id));
            batch.push(msg);
        }
        batch.push(op);
        let mut appended = self.store.put_batch_async(&batch).await?;
        let op_append = appended
            .pop()
            .ok_or_else(|| Error::InvalidMessage("nothing appended".into()))?;
        let sent = match (real, appended.pop()) {
            (Some((topic, queue_id)), Some(append)) => Some(SendResult {
                topic,
                queue_id,
                append,
            }),
            _ => None,
        };
        Ok((sent, op_append.end_offset, op_append.queue_offset))
    }

    pub(super) fn add_checker(
        &self,
        producer_group: &str,
        checker: Arc<dyn TransactionChecker>,
    ) -> Result<CheckerRegistration> {
        validate_group(producer_group)?;
        let id = {
            let mut c = lock(&self.checkers);
            c.next_id += 1;
            let id = c.next_id;
            c.by_group
                .entry(producer_group.to_owned())
                .or_default()
                .push((id, checker));
            id
        };
        let checkers: Weak<Mutex<Checkers>> = Arc::downgrade(&self.checkers);
        let group = producer_group.to_owned();
        Ok(CheckerRegistration::new(move || {
            if let Some(c) = checkers.upgrade() {
                let mut c = lock(&c);
                if let Some(list) = c.by_group.get_mut(&group) {
                    list.retain(|(i, _)| *i != id);
                    if list.is_empty() {
                        c.by_group.remove(&group);
                    }
                }
            }
        }))
    }

    /// One check round (broker clock): every undecided half older than the
    /// transaction timeout (or its `CHECK_IMMUNITY_TIME_IN_SECONDS`) is handed
    /// to its producer group's checker, or rolled back once it has been checked
    /// `transaction_max_checks` times. Ends go to their real topics as
    /// `topics` has them now.
    pub(super) async fn check(&self, topics: &dyn TopicLookup) -> Result<CheckRound> {
        let _round = self.round.lock().await;
        let now = self.clock.now_ms();
        let timeout_ms = self.timeout.as_millis() as i64;
        let max_checks = self.max_checks;
        let mut due_rollback = Vec::new();
        let mut due_check = Vec::new();
        let mut from = lock(&self.txns).live.halves.base;
        loop {
            let read = self
                .store
                .read_queue(TRANS_HALF_TOPIC, 0, from, SCAN_BATCH)?;
            if read.entries.is_empty() {
                break;
            }
            for (at, entry) in read.entries {
                {
                    let t = lock(&self.txns);
                    if t.live.halves.contains(at) || t.ending.contains(&at) {
                        continue;
                    }
                }
                let record = self.store.read_entry(&entry)?.into_bytes();
                let view = RecordView::parse(&record)?;
                let stored_at = view
                    .property(HALF_AT)
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(i64::MIN);
                let wait_ms = view
                    .property(property::CHECK_IMMUNITY_TIME_IN_SECONDS)
                    .and_then(|v| v.parse::<i64>().ok())
                    .map_or(timeout_ms, |s| s.saturating_mul(1000));
                if now.saturating_sub(stored_at) < wait_ms {
                    continue;
                }
                let handle = TransactionHandle::at(entry.phys_offset, at);
                let checks = {
                    let mut t = lock(&self.txns);
                    if t.live.halves.contains(at) || t.ending.contains(&at) {
                        continue; // ended while its record was read
                    }
                    let c = t.checks.entry(at).or_insert(0);
                    if *c >= max_checks {
                        None
                    } else {
                        *c += 1;
                        let n = *c;
                        t.version += 1;
                        Some(n)
                    }
                };
                match checks {
                    None => due_rollback.push(handle),
                    Some(n) => due_check.push((handle, record, n)),
                }
            }
            from = read.next_offset;
        }
        let mut round = CheckRound::default();
        for handle in due_rollback {
            match self.end_half(topics, &handle, Resolution::Rollback).await {
                Ok(_) => {
                    tracing::warn!(%handle, max_checks, "undecided transaction rolled back");
                    round.rolled_back += 1;
                }
                Err(Error::TransactionEnded { .. }) => {} // decided meanwhile
                Err(e) => return Err(e),
            }
        }
        for (handle, record, n) in due_check {
            let Ok(view) = RecordView::parse(&record) else {
                continue;
            };
            let group = view.property(property::PRODUCER_GROUP).unwrap_or_default();
            let uniq = view.property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
            let half = HalfMessage {
                producer_group: group.to_owned(),
                msg_id: uniq.map_or_else(
                    || encode_msg_id(view.store_host(), handle.commit_log_offset),
                    str::to_owned,
                ),
                handle,
                transaction_id: view.property(TRANSACTION_ID).or(uniq).map(str::to_owned),
                check_times: n,
                record: record.clone(),
            };
            match self.checker(group, n - 1) {
                Some(checker) => {
                    checker.check(half);
                    round.checked += 1;
                }
                None => round.unchecked += 1,
            }
        }
        Ok(round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_reject_garbage() {
        let h = TransactionHandle::at(4096, 7);
        assert_eq!(h.to_string(), "4096-7");
        assert_eq!("4096-7".parse::<TransactionHandle>().unwrap(), h);
        let named = TransactionHandle {
            broker: Some("broker-a".into()),
            ..h.clone()
        };
        assert_eq!(named.to_string(), "broker-a@4096-7");
        assert_eq!(
            "broker-a@4096-7".parse::<TransactionHandle>().unwrap(),
            named
        );
        for bad in [
            "", "4096", "a-1", "1-", "-1", "1-2-3", "1--2", "@1-2", "b a@1-2", "a@b@1-2",
        ] {
            assert!(bad.parse::<TransactionHandle>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn marks_keep_a_low_water_mark() {
        let mut m = Marks::default();
        m.mark(1);
        assert!(!m.contains(0) && m.contains(1));
        m.mark(0);
        assert_eq!((m.base, m.done.len()), (2, 0));
        m.mark(5);
        m.advance_to(4);
        assert_eq!((m.base, m.done.len()), (4, 1));
        m.advance_to(5);
        assert_eq!((m.base, m.done.len()), (6, 0));
    }
}
