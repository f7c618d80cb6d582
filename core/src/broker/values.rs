//! The plain values that cross [`MessagingApi`](super::MessagingApi): requests,
//! results and the transaction handles, checkers and registrations.
//!
//! They sit below everything that uses them (the trait, the local broker and its
//! parts) and depend only on the store's record types and the broker's pure
//! building blocks (filters, groups, receipts, topics, schedule tables), so a
//! gateway, the trait and a remote implementation can share them without
//! pulling in the local broker.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;

use super::filter::Filter;
use super::groups::{ConsumeMode, Subscription};
use super::receipt::ReceiptHandle;
use super::schedule::RetryDecision;
use crate::store::{AppendResult, RecordView};
use crate::{Error, Result};

/// How a send picks the queue of its topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum QueueChoice {
    /// The next write queue of the topic, round-robin.
    #[default]
    RoundRobin,
    /// A stable hash of the key modulo the write queue count, so every message
    /// with the same key lands in the same queue, in order. The hash is Java's
    /// `String.hashCode()`, as RocketMQ's `SelectMessageQueueByHash` uses, so a
    /// Java producer and this broker agree on the queue of a key.
    ShardingKey(String),
    /// This queue id (what RocketMQ clients that choose the queue themselves send).
    Queue(u32),
}

/// Where one sent message went.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SendResult {
    pub topic: String,
    pub queue_id: u32,
    pub append: AppendResult,
}

/// A pull from one queue.
#[derive(Debug, Clone)]
pub struct PullRequest {
    pub group: String,
    /// The pulling member; checked against orderly-consumption locks.
    pub member: String,
    pub topic: String,
    pub queue_id: u32,
    /// The queue offset to read from.
    pub offset: u64,
    /// At most this many messages are returned.
    pub max_messages: usize,
    pub filter: Filter,
    /// How long to wait for a matching message when there is none (zero: don't).
    pub wait: Duration,
}

/// What a pull found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullStatus {
    /// At least one matching message.
    Found,
    /// Nothing matching between the requested offset and the end of the queue
    /// before the wait ran out; `next_offset` may have moved past messages the
    /// filter rejected.
    NoNewMessage,
    /// The requested offset is below the queue's minimum (retention deleted it)
    /// or beyond its maximum; continue from `next_offset`.
    OffsetMoved,
}

/// One delivered message.
#[derive(Debug, Clone)]
pub struct Delivered {
    pub queue_id: u32,
    pub queue_offset: u64,
    /// The stored record, RocketMQ layout, without a copy from the log.
    pub record: Bytes,
}

impl Delivered {
    /// Parses the record (it was checked when it was read).
    pub fn view(&self) -> Result<RecordView<'_>> {
        Ok(RecordView::parse(&self.record)?)
    }
}

/// The answer to a [`PullRequest`].
#[derive(Debug, Clone)]
pub struct PullResult {
    pub status: PullStatus,
    pub messages: Vec<Delivered>,
    /// Where the next pull of this queue should start.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
    /// Bytes of the commit log after the last entry this pull examined (0 when it
    /// found nothing): how far behind the consumer reads, what the native door moves
    /// a far-behind consumer to a slave by (`ha.slave_read_lag_bytes`). 0 where it is
    /// not known (a remote broker).
    pub behind_bytes: u64,
}

/// A POP: receive matching messages from any readable queue of a topic, each
/// invisible to the group's other POPs until it is acked or its time runs out.
#[derive(Debug, Clone)]
pub struct PopRequest {
    pub group: String,
    pub topic: String,
    pub filter: Filter,
    /// At most this many messages are returned (at least 1).
    pub max_messages: usize,
    /// How long each returned message stays invisible without an ack.
    pub invisible: Duration,
    /// How long to wait for a message when there is none (zero: don't).
    pub wait: Duration,
}

/// One message handed out by a POP.
#[derive(Debug, Clone)]
pub struct Popped {
    pub message: Delivered,
    /// What acks it, or changes its invisibility; `to_string()` for the wire.
    pub receipt: ReceiptHandle,
}

impl Popped {
    /// 1 on the first delivery, raised each time the message reappears.
    pub fn attempt(&self) -> u32 {
        self.receipt.attempt
    }
}

/// What [`MessagingApi::send_back`](super::MessagingApi::send_back) did with a failed message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SendBackResult {
    /// Retried (to `%RETRY%<group>` after the delay) or dead-lettered (`%DLQ%<group>`).
    pub decision: RetryDecision,
    /// The reconsume times of the stored copy (the original's + 1).
    pub reconsume_times: u32,
    /// Where the copy was stored (the schedule topic while it waits for a retry).
    pub sent: SendResult,
}

/// Which dead letters [`MessagingApi::resend_dead_letters`](super::MessagingApi::resend_dead_letters) re-sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DeadLetters {
    /// The one at this offset of `%DLQ%<group>` (again, if it was re-sent before).
    One(u64),
    /// Every one not yet re-sent by `All` (the group's offset on its DLQ marks
    /// how far `All` got).
    All,
}

/// Where [`MessagingApi::reset_offset`](super::MessagingApi::reset_offset) moves a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OffsetReset {
    /// The oldest message still stored.
    Earliest,
    /// Past the newest message: only new messages are consumed.
    Latest,
    /// The first message stored at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// Where a new group starts, in the words every door takes (docs/broker.md,
/// "Where a new group starts"): `earliest`, `latest`, or a time in milliseconds
/// since the epoch.
impl std::str::FromStr for OffsetReset {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<OffsetReset, String> {
        match s {
            "earliest" => Ok(OffsetReset::Earliest),
            "latest" => Ok(OffsetReset::Latest),
            t => t.parse::<i64>().map(OffsetReset::Timestamp).map_err(|_| {
                format!("{s:?} is not `earliest`, `latest` or a time in ms since the epoch")
            }),
        }
    }
}

/// The state of one queue of a topic ([`MessagingApi::queue_stats`](super::MessagingApi::queue_stats)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueStats {
    pub queue_id: u32,
    /// The oldest offset still stored.
    pub min_offset: u64,
    /// One past the newest offset.
    pub max_offset: u64,
    /// Store time (ms since the epoch) of the newest message; `None` when empty.
    pub last_store_ms: Option<i64>,
}

/// A live member of a consumer group ([`MessagingApi::group_info`](super::MessagingApi::group_info)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberInfo {
    pub member: String,
    pub subscriptions: Vec<Subscription>,
    /// Broker clock (ms) of its last heartbeat.
    pub last_seen_ms: i64,
}

/// How far a group got in one queue ([`MessagingApi::group_info`](super::MessagingApi::group_info)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueProgress {
    pub topic: String,
    pub queue_id: u32,
    /// The committed offset (next to consume); `None`: never committed. For a
    /// broadcasting group, the lowest of its members' offsets.
    pub committed: Option<u64>,
    pub max_offset: u64,
    /// Messages not yet consumed: `max_offset - committed` (from the queue's
    /// minimum when nothing was committed).
    pub lag: u64,
}

/// A consumer group: mode and live members (while it has any) and its
/// progress on every topic it subscribes to or has offsets for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupInfo {
    pub group: String,
    /// The mode of the live members, else the one the group last had (kept
    /// across restarts); `None` for a group never seen in a heartbeat.
    pub mode: Option<ConsumeMode>,
    /// Retries before a message of the group is dead-lettered (its own
    /// setting, else the broker's).
    pub max_reconsume_times: u32,
    /// An ordered (FIFO) group ([`MessagingApi::set_fifo`](super::MessagingApi::set_fifo)).
    pub fifo: bool,
    pub members: Vec<MemberInfo>,
    pub progress: Vec<QueueProgress>,
}

/// How [`MessagingApi::delete_group`](super::MessagingApi::delete_group) deletes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupDeletion {
    /// Delete even while the group has live consumers (they are dropped; one that
    /// heartbeats again starts the group anew).
    pub force: bool,
    /// Delete the group's dead-letter topic `%DLQ%<group>` too (kept by default:
    /// dead letters are often what an operator still wants).
    pub dead_letters: bool,
}

/// What a group deletion removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupDeleted {
    pub group: String,
    /// Committed queue offsets dropped (every owner of the group: itself and its
    /// broadcasting members).
    pub offsets: usize,
    /// POP queue states (cursor and in-flight leases) dropped.
    pub pop_queues: usize,
    /// Live members dropped (only with `force`).
    pub members: usize,
    /// Topics deleted: `%RETRY%<group>`, and `%DLQ%<group>` when asked.
    pub topics: Vec<String>,
}

// ---- transactions ----

/// Names one half message: where it is in the commit log and in the half queue.
/// Self-describing, so any broker process over the same store can end it;
/// `to_string()` / `parse()` as `<commit_log_offset>-<half_queue_offset>`.
/// The native door builds it from END_TRANSACTION's `commitLogOffset` and
/// `tranStateTableOffset`. A proxy over several broker groups (the native crate's
/// `Cluster`) names the broker that stores the half in front:
/// `<broker>@<commit_log_offset>-<half_queue_offset>` (`@` is not a name character).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct TransactionHandle {
    pub commit_log_offset: u64,
    pub half_queue_offset: u64,
    /// The broker (group) holding the half message, when a proxy over several
    /// handed the handle out; `None` from a broker itself (which ignores it).
    pub broker: Option<String>,
}

impl TransactionHandle {
    /// The handle of the half at these offsets, naming no broker.
    pub fn at(commit_log_offset: u64, half_queue_offset: u64) -> Self {
        TransactionHandle {
            commit_log_offset,
            half_queue_offset,
            broker: None,
        }
    }
}

impl fmt::Display for TransactionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(broker) = &self.broker {
            write!(f, "{broker}@")?;
        }
        write!(f, "{}-{}", self.commit_log_offset, self.half_queue_offset)
    }
}

impl FromStr for TransactionHandle {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidArgument(format!(
                "malformed transaction handle {s:?}: expected [<broker>@]<commit log offset>-<half queue offset>"
            ))
        };
        let (broker, offsets) = match s.split_once('@') {
            Some((b, rest)) => {
                super::schedule::validate_topic(b).map_err(|_| bad())?;
                (Some(b.to_owned()), rest)
            }
            None => (None, s),
        };
        let (c, q) = offsets.split_once('-').ok_or_else(bad)?;
        Ok(TransactionHandle {
            commit_log_offset: c.parse().map_err(|_| bad())?,
            half_queue_offset: q.parse().map_err(|_| bad())?,
            broker,
        })
    }
}

/// How a transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Resolution {
    Commit,
    Rollback,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Commit => "COMMIT",
            Resolution::Rollback => "ROLLBACK",
        }
    }
}

/// What [`MessagingApi::send_half`](super::MessagingApi::send_half) stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HalfSent {
    /// `topic` / `queue_id`: where a commit will put the message; `append`: the
    /// half record (its `queue_offset` is the half-queue offset, its `msg_id`
    /// the half's offset message id, as RocketMQ answers a half send).
    pub sent: SendResult,
    pub transaction: TransactionHandle,
}

/// An undecided half message handed to a [`TransactionChecker`].
#[derive(Debug, Clone)]
pub struct HalfMessage {
    pub producer_group: String,
    pub handle: TransactionHandle,
    /// The producer's `UNIQ_KEY`, else the half's offset message id.
    pub msg_id: String,
    /// `__transactionId__`, else the `UNIQ_KEY` (RocketMQ's check header).
    pub transaction_id: Option<String>,
    /// The stored half record, RocketMQ layout: its topic is the half topic;
    /// `REAL_TOPIC` / `REAL_QID` name the real one.
    pub record: Bytes,
    /// 1 on the first check.
    pub check_times: u32,
}

impl HalfMessage {
    pub fn view(&self) -> Result<RecordView<'_>> {
        Ok(RecordView::parse(&self.record)?)
    }
}

/// What a gateway registers for a producer group to answer check-backs.
/// `check` must not block: it hands the half to a producer (the native door
/// sends CHECK_TRANSACTION_STATE) and the answer comes later through
/// `end_transaction`. No answer is fine: the half is checked again next round.
pub trait TransactionChecker: Send + Sync {
    fn check(&self, half: HalfMessage);
}

/// Keeps a [`TransactionChecker`] registered; dropping it unregisters.
pub struct CheckerRegistration {
    unregister: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl CheckerRegistration {
    /// A registration that runs `unregister` when dropped (for other
    /// implementations of the API).
    pub fn new(unregister: impl FnOnce() + Send + Sync + 'static) -> Self {
        CheckerRegistration {
            unregister: Some(Box::new(unregister)),
        }
    }
}

impl Drop for CheckerRegistration {
    fn drop(&mut self) {
        if let Some(f) = self.unregister.take() {
            f();
        }
    }
}

impl fmt::Debug for CheckerRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CheckerRegistration")
    }
}

/// What one [`Broker::check_transactions`](super::Broker::check_transactions) round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckRound {
    /// Halves handed to a registered checker.
    pub checked: usize,
    /// Halves due for a check whose producer group has no checker registered
    /// (the check still counts).
    pub unchecked: usize,
    /// Halves rolled back because their checks ran out.
    pub rolled_back: usize,
}
