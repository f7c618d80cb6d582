//! [`MessagingApi`]: the one narrow surface every gateway talks to. The plain
//! values that cross it are in `values.rs`; this module depends only on them.
//!
//! The local [`super::Broker`] implements it over a [`crate::store::Store`]; a
//! later remote implementation (the native client talking to a broker cluster,
//! as RocketMQ 5's proxy does in cluster mode) can implement the same trait, so a
//! gateway is written once against `impl MessagingApi`. Everything crossing it is
//! therefore an owned value with no reference into the store: records travel as
//! [`Bytes`] in RocketMQ's stored layout (parse them with
//! [`RecordView::parse`]), filters as expressions.
//!
//! Methods return `impl Future + Send` rather than being `async fn`, so the
//! futures are `Send` and usable from any tokio task. The trait is meant for
//! generic use (`G: MessagingApi`), not `dyn`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::delay::{DelayLimits, Delayed};
use super::groups::Heartbeat;
use super::receipt::ReceiptHandle;
use super::topics::{TopicConfig, TopicKind};
use super::values::{
    CheckerRegistration, DeadLetters, Delivered, GroupDeleted, GroupDeletion, GroupInfo, HalfSent,
    OffsetReset, PopRequest, Popped, PullRequest, PullResult, QueueChoice, QueueStats, Resolution,
    SendBackResult, SendResult, TransactionChecker, TransactionHandle,
};
use crate::Result;
use crate::store::Message;
use crate::store::record::{self, BatchSent, EncodedBatch, Placed, property};

/// The broker as a gateway sees it. See the module docs for why it is a trait.
pub trait MessagingApi: Send + Sync {
    // ---- topics ----

    /// Creates a user topic, or a door-state system topic
    /// ([`super::schedule::DOOR_STATE_TOPIC_PREFIX`]); [`crate::Error::TopicExists`]
    /// if it exists.
    fn create_topic(&self, config: TopicConfig)
    -> impl Future<Output = Result<TopicConfig>> + Send;
    /// Changes queue counts or permission; [`crate::Error::TopicNotFound`] if absent.
    fn update_topic(&self, config: TopicConfig)
    -> impl Future<Output = Result<TopicConfig>> + Send;
    /// Deletes a topic, its consume queues and its consumer offsets.
    fn delete_topic(&self, topic: &str) -> impl Future<Output = Result<()>> + Send;
    fn topic(&self, topic: &str) -> impl Future<Output = Result<TopicConfig>> + Send;
    fn topics(&self, kind: TopicKind) -> impl Future<Output = Result<Vec<TopicConfig>>> + Send;

    // ---- producing ----

    /// Stores one message in its topic (`message.topic`); the queue id in the
    /// message is ignored in favour of `queue`.
    fn send(
        &self,
        message: Message,
        queue: QueueChoice,
    ) -> impl Future<Output = Result<SendResult>> + Send;
    /// Stores a batch in one queue of one topic, contiguously.
    fn send_batch(
        &self,
        messages: Vec<Message>,
        queue: QueueChoice,
    ) -> impl Future<Output = Result<Vec<SendResult>>> + Send;

    /// [`MessagingApi::send_batch`] of messages whose properties arrive
    /// pre-encoded, as a RocketMQ producer puts them on the wire: stored in one
    /// queue of `batch.topic`, contiguously. When every entry's properties are
    /// plain ([`record::is_plain_properties`], naming none of
    /// [`SEND_TIME_PROPERTIES`]) they are copied into the records as they are;
    /// otherwise every entry is parsed into a [`Message`] (Java's rules for
    /// malformed items) and stored by `send_batch`, which refuses delays. A batch
    /// cannot hold transactional messages ([`crate::Error::InvalidMessage`]).
    /// The default implementation always takes the general way.
    fn send_encoded(
        &self,
        batch: EncodedBatch,
        queue: QueueChoice,
    ) -> impl Future<Output = Result<BatchSent>> + Send {
        send_general(self, batch, queue)
    }

    // ---- retry and dead letters ----

    /// RocketMQ's `CONSUMER_SEND_MSG_BACK`: consuming the message at `offset` of
    /// `queue_id` of `topic` failed for `group`. It comes back through
    /// `%RETRY%<group>` after the back-off of its reconsume times (or after
    /// `delay_level`, when given and not 0), or, once the group's attempts are
    /// used up, goes to `%DLQ%<group>`. Fails with
    /// [`crate::Error::MessageNotFound`] if there is no such record.
    fn send_back(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        delay_level: Option<u8>,
    ) -> impl Future<Output = Result<SendBackResult>> + Send;
    /// Re-sends dead letters of `group` to their original topic, reconsume times
    /// reset; returns where each went.
    fn resend_dead_letters(
        &self,
        group: &str,
        which: DeadLetters,
    ) -> impl Future<Output = Result<Vec<SendResult>>> + Send;

    // ---- consuming ----

    /// Reads matching messages from one queue, waiting up to `wait` for one.
    fn pull(&self, request: PullRequest) -> impl Future<Output = Result<PullResult>> + Send;

    /// Waits until one of `topic`'s queues has an entry at or past the offset
    /// `next[queue id]` says (or that offset is out of the queue's range), or
    /// until `wait` passes; either way `Ok(true)`: pull each queue without waiting
    /// then. One waiter for the whole topic, where a pull per queue would keep a
    /// long poll each (what a caught-up broadcasting reader holds while idle,
    /// issue #33). `Ok(false)` at once when this broker cannot wait on a topic
    /// (the default: a remote one), and the caller long-polls each queue.
    fn wait_for_arrivals(
        &self,
        topic: &str,
        next: Vec<u64>,
        wait: Duration,
    ) -> impl Future<Output = Result<bool>> + Send {
        let _ = (topic, next, wait);
        std::future::ready(Ok(false))
    }

    /// Receives up to `max_messages` matching messages of the topic for the
    /// group, from any readable queue, waiting up to `wait` when there is none.
    /// An empty result means the wait ran out.
    fn pop(&self, request: PopRequest) -> impl Future<Output = Result<Vec<Popped>>> + Send;
    /// Acks the delivery a receipt handle names. A garbled handle fails with
    /// [`crate::Error::InvalidReceiptHandle`]; one already acked or replaced
    /// (redelivered, or its invisibility changed) with
    /// [`crate::Error::StaleReceiptHandle`], and nothing is acked.
    fn ack(&self, receipt: &str) -> impl Future<Output = Result<()>> + Send;
    /// Makes the delivery a receipt handle names invisible for `invisible` from
    /// now; returns the handle that replaces it (the old one becomes stale).
    fn change_invisibility(
        &self,
        receipt: &str,
        invisible: Duration,
    ) -> impl Future<Output = Result<ReceiptHandle>> + Send;
    /// Gives back the delivery a receipt handle names: it is due again after
    /// `delay`. In an ordered (FIFO) group the later messages of its queue the
    /// group has out are given back with it (their handles go stale), so nothing
    /// after it is acked before it comes again. The default implementation is a
    /// change of invisibility.
    fn nack(&self, receipt: &str, delay: Duration) -> impl Future<Output = Result<()>> + Send {
        let changed = self.change_invisibility(receipt, delay);
        async move { changed.await.map(|_| ()) }
    }

    /// Registers or refreshes a consumer; rejects malformed filters.
    fn heartbeat(&self, heartbeat: Heartbeat) -> impl Future<Output = Result<()>> + Send;
    /// Removes a consumer now (instead of waiting for its heartbeat to expire).
    fn unregister(&self, group: &str, member: &str) -> impl Future<Output = Result<()>> + Send;
    /// The queue ids of `topic` that `member` should consume now.
    fn assignment(
        &self,
        group: &str,
        member: &str,
        topic: &str,
    ) -> impl Future<Output = Result<Vec<u32>>> + Send;

    /// The committed offset of a queue (`None`: never committed).
    fn query_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> impl Future<Output = Result<Option<u64>>> + Send;
    fn commit_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Moves the offsets of every read queue of `topic`; returns `(queue, offset)`.
    fn reset_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        to: OffsetReset,
    ) -> impl Future<Output = Result<Vec<(u32, u64)>>> + Send;

    // ---- orderly consumption ----

    /// Takes or renews a lease on a queue so only `member` consumes it.
    fn lock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> impl Future<Output = Result<()>> + Send;
    fn unlock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> impl Future<Output = Result<()>> + Send;

    // ---- transactions ----

    /// Stores a half message of `producer_group`'s transaction: durable, but
    /// invisible to every consumer and lookup until committed. The real topic
    /// and queue are chosen (and checked, auto-created) as for [`Self::send`];
    /// a delayed message is refused.
    fn send_half(
        &self,
        producer_group: &str,
        message: Message,
        queue: QueueChoice,
    ) -> impl Future<Output = Result<HalfSent>> + Send;
    /// Commits (the message becomes visible in its real topic and queue, with
    /// the same `UNIQ_KEY`; returns where it went) or rolls back (`None`).
    /// [`crate::Error::TransactionEnded`] if it was already ended,
    /// [`crate::Error::TransactionNotFound`] if the handle names no half message.
    fn end_transaction(
        &self,
        handle: &TransactionHandle,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Option<SendResult>>> + Send;
    /// Registers who answers check-backs of `producer_group`'s undecided
    /// transactions until the returned registration is dropped. Several may be
    /// registered for one group; they take turns.
    fn register_transaction_checker(
        &self,
        producer_group: &str,
        checker: Arc<dyn TransactionChecker>,
    ) -> impl Future<Output = Result<CheckerRegistration>> + Send;

    // ---- inspection and lookup (admin) ----

    /// Bounds and newest store time of every queue of a topic (the larger of
    /// its read and write queue counts); [`crate::Error::TopicNotFound`] if absent.
    fn queue_stats(&self, topic: &str) -> impl Future<Output = Result<Vec<QueueStats>>> + Send;
    /// The first offset of a queue whose message was stored at or after `ts_ms`
    /// (the queue's maximum when every message is older).
    fn offset_by_time(
        &self,
        topic: &str,
        queue_id: u32,
        ts_ms: i64,
    ) -> impl Future<Output = Result<u64>> + Send;
    /// Sets how often a message of `group` is retried before it goes to its
    /// DLQ (RocketMQ `retryMaxTimes` of a subscription group), for send-back
    /// and POP alike; `None` returns to the broker-wide default. Persisted.
    fn set_max_reconsume_times(
        &self,
        group: &str,
        max: Option<u32>,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Makes `group` an ordered (FIFO) group, or a concurrent one again: in a
    /// FIFO group a POP hands out the next message of a queue only when nothing
    /// earlier of that queue is in flight for the group, and a nacked or timed-out
    /// message comes back before anything after it. Persisted. The default
    /// implementation refuses (a broker that cannot order POPs says so).
    fn set_fifo(&self, group: &str, fifo: bool) -> impl Future<Output = Result<()>> + Send {
        let _ = (group, fifo);
        async {
            Err(crate::Error::InvalidArgument(
                "this broker has no ordered (FIFO) POP".into(),
            ))
        }
    }
    /// Deletes a consumer group: its settings, committed offsets (every owner),
    /// POP cursors and in-flight leases, its retry topic `%RETRY%<group>` and, when
    /// asked, its dead-letter topic. A group that consumes again afterwards starts
    /// as a new one (docs/broker.md, "Where a new group starts"). Refused with
    /// [`crate::Error::GroupInUse`] while it has live consumers unless `force`;
    /// [`crate::Error::GroupNotFound`] when there is nothing to delete. On a
    /// replicated broker group it is a master's change (a slave refuses it) and
    /// reaches the slaves through the replicated log. The default implementation
    /// refuses (a broker that cannot delete groups says so).
    fn delete_group(
        &self,
        group: &str,
        how: GroupDeletion,
    ) -> impl Future<Output = Result<GroupDeleted>> + Send {
        let _ = (group, how);
        async {
            Err(crate::Error::InvalidArgument(
                "this broker cannot delete consumer groups".into(),
            ))
        }
    }
    /// Every consumer group with a live member, committed offsets or
    /// remembered settings, sorted.
    fn groups(&self) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Mode, members and progress of a group; [`crate::Error::GroupNotFound`]
    /// when the broker knows nothing of it.
    fn group_info(&self, group: &str) -> impl Future<Output = Result<GroupInfo>> + Send;
    /// The message with this id: the offset message id a send returned
    /// (store host + commit-log offset), or the producer's `UNIQ_KEY`. Messages
    /// of uncommitted transactions are not found:
    /// [`crate::Error::MessageNotFound`].
    fn message_by_id(&self, msg_id: &str) -> impl Future<Output = Result<Delivered>> + Send;
    /// Messages of `topic` whose `KEYS` contain `key` (or whose `UNIQ_KEY` is
    /// `key`), newest first, at most `max`.
    fn messages_by_key(
        &self,
        topic: &str,
        key: &str,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivered>>> + Send;
    /// Messages of `topic` stored in `[begin_ms, end_ms]`, oldest first, at most `max`.
    fn messages_by_time(
        &self,
        topic: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> impl Future<Output = Result<Vec<Delivered>>> + Send;

    // ---- delayed messages ----

    /// What a delay may be: the level table and the longest delay. Doors check a
    /// user's delay against it and refuse what does not fit.
    fn delay_limits(&self) -> DelayLimits;
    /// The delayed messages of `topic` not delivered yet, soonest first, at most
    /// `max`; [`crate::Error::TopicNotFound`] for an unknown topic.
    fn delayed(&self, topic: &str, max: usize)
    -> impl Future<Output = Result<Vec<Delayed>>> + Send;
    /// Cancels a pending delayed message, named by the id its send answered (or
    /// its `UNIQ_KEY`); written down before it returns, so it holds across a
    /// restart. [`crate::Error::MessageNotFound`] when no such message is pending.
    fn cancel_delayed(&self, id: &str) -> impl Future<Output = Result<Delayed>> + Send;

    // ---- MQTT gateway ----

    /// Waits until every message whose `send` completed before this call is visible
    /// to `pull` (`max_offset`) and `queue_stats` — the consume queues are built
    /// just after the append. A subscription that starts at "the end" asks this
    /// first, so a message acknowledged to its publisher before the subscription
    /// existed is not then delivered to it as new. Best effort: after a few seconds
    /// of a stalled dispatcher it returns anyway.
    fn sync_visible(&self) -> impl Future<Output = ()> + Send;
}

/// Properties a broker acts on when a message is sent: an entry naming one of
/// these goes the general way in [`MessagingApi::send_encoded`].
pub const SEND_TIME_PROPERTIES: [&str; 6] = [
    property::DELAY_TIME_LEVEL,
    property::TIMER_DELIVER_MS,
    property::START_DELIVER_TIME,
    property::TIMER_DELAY_MS,
    property::TIMER_DELAY_SEC,
    property::TRANSACTION_PREPARED,
];

fn empty() -> crate::Error {
    crate::Error::InvalidMessage("an empty batch".into())
}

/// [`MessagingApi::send_encoded`] the general way: every entry parsed into a
/// [`Message`], then `send_batch`.
pub(crate) async fn send_general<A: MessagingApi + ?Sized>(
    api: &A,
    batch: EncodedBatch,
    queue: QueueChoice,
) -> Result<BatchSent> {
    let messages = general_messages(&batch)?;
    batch_sent(api.send_batch(messages, queue).await?)
}

/// The entries of `batch` as messages for the general send path (queue ids are
/// chosen by the send).
fn general_messages(batch: &EncodedBatch) -> Result<Vec<Message>> {
    if batch.entries.is_empty() {
        return Err(empty());
    }
    let messages = batch.messages(0)?;
    if messages
        .iter()
        .any(|m| m.property(property::TRANSACTION_PREPARED) == Some("true"))
    {
        return Err(crate::Error::InvalidMessage(
            "a batch cannot hold transactional messages".into(),
        ));
    }
    Ok(messages)
}

/// What the general path returned, as a [`BatchSent`] (the store host comes back
/// out of the first offset message id).
fn batch_sent(sent: Vec<SendResult>) -> Result<BatchSent> {
    let first = sent
        .first()
        .ok_or_else(|| crate::Error::InvalidMessage("nothing was stored".into()))?;
    let (store_host, _) = record::decode_msg_id(&first.append.msg_id)?;
    Ok(BatchSent {
        topic: first.topic.clone(),
        queue_id: first.queue_id,
        store_host,
        store_timestamp: first.append.store_timestamp,
        records: sent
            .iter()
            .map(|s| Placed {
                phys_offset: s.append.phys_offset,
                size: s.append.size,
                queue_offset: s.append.queue_offset,
            })
            .collect(),
    })
}
