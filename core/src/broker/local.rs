//! [`Broker`]: the in-process implementation of [`MessagingApi`] over a
//! [`Store`]. It owns the topic table, consumer offsets and consumer groups, and
//! turns gateway calls into store appends and consume-queue reads.
//!
//! State and its locks (std locks, never held across an `.await`):
//! - `topics`: an `RwLock` — read on every send and pull, written by admin calls
//!   (each change is persisted before the lock is released);
//! - `offsets`: see [`Offsets`]; written to disk by a background thread every
//!   `offset_flush_interval` and on [`Broker::close`];
//! - `groups`: one `Mutex` around the pure [`ConsumerGroups`] state machine,
//!   driven by the injected [`Clock`];
//! - `round_robin`: one `Mutex` around per-topic send counters;
//! - `pop`: see [`PopState`]; written to disk with the offsets.
//! - `delay`: see [`DelayState`]; its progress is written with the offsets, up to
//!   what the commit log has flushed.
//! - `txn`: see [`TxnState`]; written the same way.
//!
//! Every lock is taken through [`crate::sync`]. Pulling (long polling) is in
//! `pull.rs`, POP in `pop.rs`, send-back in `retry.rs`, admin lookups in
//! `inspect.rs`; delayed delivery and transactions are their own types (they
//! see this broker only as a `TopicLookup`), run on timers by `tasks.rs`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use super::allocate::{self, MessageQueue};
use super::api::{self, MessagingApi, SEND_TIME_PROPERTIES};
use super::delay::{self, DelayState};
use super::group_config::GroupConfigs;
use super::groups::{ConsumeMode, ConsumerGroups, Heartbeat};
use super::offsets::{Offsets, owner_key};
use super::pop_state::PopState;
use super::receipt::ReceiptHandle;
use super::schedule::{self, validate_group};
use super::settings::BrokerSettings;
use super::topics::{Perm, TopicConfig, TopicKind, TopicLookup, TopicTable};
use super::transaction::TxnState;
use super::values::{
    CheckerRegistration, DeadLetters, Delivered, GroupDeleted, GroupDeletion, GroupInfo, HalfSent,
    OffsetReset, PopRequest, Popped, PullRequest, PullResult, QueueChoice, QueueStats, Resolution,
    SendBackResult, SendResult, TransactionChecker, TransactionHandle,
};
use crate::clock::Clock;
use crate::store::consume_queue::java_string_hash;
use crate::store::record::{BatchSent, EncodedBatch, PlainBatch};
use crate::store::{Message, Store};
use crate::sync::{self, lock};
use crate::{Error, Result};

/// The local broker. Share it as `Arc<Broker>`; call [`Broker::close`] (or drop
/// it) to write the final offsets.
pub struct Broker {
    pub(super) store: Arc<Store>,
    pub(super) opts: BrokerSettings,
    pub(super) clock: Arc<dyn Clock>,
    topics: RwLock<TopicTable>,
    /// Bumped after every change of the topic table (any door, auto-create included),
    /// so the node can re-register with the NameServers at once.
    topics_changed: tokio::sync::watch::Sender<u64>,
    pub(super) offsets: Arc<Offsets>,
    /// POP cursors and leases of every group; its own short lock (see [`PopState`]).
    pub(super) pop: Arc<PopState>,
    /// Delayed delivery: scheduler and progress (see [`super::delay`]).
    pub(super) delay: Arc<DelayState>,
    /// Transactions: decisions, check counts, checkers (see [`super::transaction`]).
    pub(super) txn: Arc<TxnState>,
    pub(super) groups: Mutex<ConsumerGroups>,
    /// Modes and settings of groups, kept while no member is live (`groups.json`).
    pub(super) group_configs: GroupConfigs,
    round_robin: Mutex<HashMap<String, u64>>,
    /// Stops the offset flusher (dropping the sender) and joins it. Locked only at close.
    flusher: Mutex<Option<(mpsc::Sender<()>, JoinHandle<()>)>>,
    /// Set by [`Broker::halt_for_tests`]: close writes nothing.
    halted: std::sync::atomic::AtomicBool,
}

impl Broker {
    /// Opens the broker's state in `<store dir>/config/` and starts the offset
    /// flusher thread.
    pub fn open(store: Arc<Store>, opts: BrokerSettings, clock: Arc<dyn Clock>) -> Result<Broker> {
        if opts.default_queues == 0 || opts.default_queues > super::topics::MAX_QUEUES {
            return Err(Error::InvalidArgument(format!(
                "default_queues is {}; it must be between 1 and {}",
                opts.default_queues,
                super::topics::MAX_QUEUES
            )));
        }
        let config_dir: PathBuf = store.dir().join("config");
        let topics = TopicTable::open(&config_dir)?;
        let offsets = Arc::new(Offsets::open(&config_dir)?);
        // Commits on a slave are local changes that go back to its master (kept
        // across restarts); a master's are not. The role is the store's gate, which
        // the node attaches before it opens the broker.
        let replica = store
            .replication()
            .is_some_and(|g| matches!(g.role(), crate::store::ha::Role::Slave { .. }));
        offsets.table().set_replica(replica);
        store.follow_progress(offsets.clone());
        let pop = Arc::new(PopState::open(&config_dir)?);
        // Positions past the end of their queue (the log was truncated under them:
        // `rocketgate truncate`, failover) go back to the end, or the group would skip
        // what is written next at those queue offsets.
        // Only after the log was cut: a client may commit any offset it likes, and
        // that is kept as it is otherwise.
        let cut = store.log_was_cut();
        if cut {
            let end = |topic: &str, q: u32| store.queue_bounds(topic, q).1;
            let clamped = offsets.table().clamp_to_ends(end) + pop.table().clamp_to_ends(end);
            tracing::warn!(
                clamped,
                "the log was cut: consumer positions past the end of their queues moved back to the end"
            );
        }
        {
            let weak = Arc::downgrade(&pop);
            crate::meter::register_family(
                "rocketgate_pop_inflight",
                "Messages handed out by POP (HTTP receive, WebSocket clustering, MQTT shared groups) and not yet acked.",
                "group",
                move || {
                    let pop = weak.upgrade()?;
                    let groups = pop.table().in_flight_by_group();
                    Some(
                        groups
                            .into_iter()
                            .map(|(g, n)| (crate::labels::group(&g), n as f64))
                            .collect(),
                    )
                },
            );
        }
        let delay = Arc::new(DelayState::open(
            &config_dir,
            store.clone(),
            opts.delay.clone(),
            clock.clone(),
        )?);
        let txn = Arc::new(TxnState::open(
            &config_dir,
            store.clone(),
            clock.clone(),
            opts.transaction_timeout,
            opts.transaction_max_checks,
        )?);
        let group_configs = GroupConfigs::open(&config_dir)?;
        if cut {
            // Durable before the mark goes, so a crash now cannot lose the move.
            offsets.flush()?;
            pop.flush()?;
            delay.flush(0)?;
            store.clear_log_cut()?;
        }
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let flusher = {
            let offsets = offsets.clone();
            let pop = pop.clone();
            let delay = delay.clone();
            let txn = txn.clone();
            let store = store.clone();
            let every = opts.offset_flush_interval;
            std::thread::Builder::new()
                .name("rg-offsets".into())
                .spawn(move || {
                    // Runs until the sender is dropped (or sends) at close.
                    while let Err(mpsc::RecvTimeoutError::Timeout) = stop_rx.recv_timeout(every) {
                        if let Err(e) = offsets.flush() {
                            tracing::error!(error = %e, "writing consumer offsets failed");
                        }
                        if let Err(e) = pop.flush() {
                            tracing::error!(error = %e, "writing POP state failed");
                        }
                        let flushed = store.positions().flushed;
                        if let Err(e) = delay.flush(flushed) {
                            tracing::error!(error = %e, "writing delay progress failed");
                        }
                        if let Err(e) = txn.flush() {
                            tracing::error!(error = %e, "writing transaction state failed");
                        }
                    }
                })
                .map_err(|e| Error::io(&config_dir, e))?
        };
        let member_timeout_ms = opts.member_timeout.as_millis() as i64;
        Ok(Broker {
            store,
            opts,
            clock,
            topics: RwLock::new(topics),
            topics_changed: tokio::sync::watch::channel(0).0,
            offsets,
            pop,
            delay,
            txn,
            groups: Mutex::new(ConsumerGroups::new(member_timeout_ms)),
            group_configs,
            round_robin: Mutex::new(HashMap::new()),
            flusher: Mutex::new(Some((stop_tx, flusher))),
            halted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Stops the flusher and writes the offsets and the POP state. The store
    /// stays open (its owner closes it). Idempotent.
    pub fn close(&self) -> Result<()> {
        if let Some((stop, thread)) = lock(&self.flusher).take() {
            drop(stop);
            let _ = thread.join();
        }
        if self.halted.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let offsets = self.offsets.flush();
        self.pop.flush()?;
        self.flush_progress(true)?;
        offsets
    }

    /// Simulates a crash for tests: stops the flusher and makes `close` (and
    /// drop) write nothing, so the state files stay as the last flush left them.
    #[doc(hidden)]
    pub fn halt_for_tests(&self) {
        self.halted
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some((stop, thread)) = lock(&self.flusher).take() {
            drop(stop);
            let _ = thread.join();
        }
    }

    /// True once [`Broker::close`] ran.
    pub(super) fn is_closed(&self) -> bool {
        lock(&self.flusher).is_none()
    }

    /// Writes the delay progress and transaction decisions the commit log has
    /// made durable. At close, waits a little for the store's flusher so recent
    /// deliveries and decisions are not repeated after a restart.
    fn flush_progress(&self, closing: bool) -> Result<()> {
        if closing {
            let want = self.delay.pending_end().max(self.txn.pending_end());
            let until = std::time::Instant::now() + Duration::from_secs(2);
            while self.store.positions().flushed < want && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let flushed = self.store.positions().flushed;
        self.delay.flush(flushed)?;
        self.txn.flush()
    }

    /// Writes changed offsets and POP state now (the flusher does this periodically).
    pub fn flush_offsets(&self) -> Result<()> {
        self.offsets.flush()?;
        self.pop.flush()?;
        self.flush_progress(false)
    }

    /// The topic table right now, without awaiting (for the NameServer registration,
    /// which runs on a timer and must not block on anything).
    pub fn topic_snapshot(&self, kind: TopicKind) -> Vec<TopicConfig> {
        self.topics_read().list(kind)
    }

    /// The topics to register with the NameServers: the table, plus RocketMQ's default
    /// topic route (`TBW102`) when topics are auto-created, which a RocketMQ producer
    /// asks for when its topic has no route yet (then its send creates the topic). Not
    /// a table entry: nothing is stored under it, and auto-create off withdraws it.
    pub fn route_snapshot(&self) -> Vec<TopicConfig> {
        let mut topics = self.topic_snapshot(TopicKind::All);
        if self.opts.auto_create_topics {
            topics.push(
                TopicConfig::new(schedule::AUTO_CREATE_TOPIC, self.opts.default_queues)
                    // PERM_INHERIT (perm 7, as Java): the template new topics are made from.
                    .with_perm(Perm(Perm::READ_WRITE.0 | Perm::INHERIT.0)),
            );
        }
        topics
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn topics_read(&self) -> std::sync::RwLockReadGuard<'_, TopicTable> {
        sync::read(&self.topics)
    }

    pub(super) fn topics_write(&self) -> std::sync::RwLockWriteGuard<'_, TopicTable> {
        sync::write(&self.topics)
    }

    pub(super) fn topic_config(&self, topic: &str) -> Result<TopicConfig> {
        self.topics_read()
            .get(topic)
            .cloned()
            .ok_or_else(|| Error::TopicNotFound {
                topic: topic.to_owned(),
            })
    }

    /// The topic a send goes to, created on the way when that is allowed.
    pub(super) fn writable_topic(&self, topic: &str) -> Result<TopicConfig> {
        schedule::validate_topic(topic)?;
        let no_write = || Error::NoPermission {
            topic: topic.to_owned(),
            operation: "write",
        };
        if schedule::is_send_forbidden(topic) {
            return Err(no_write());
        }
        let existing = self.topics_read().get(topic).cloned();
        let config = match existing {
            Some(c) => c,
            None => self.auto_create(topic)?,
        };
        if !config.perm.is_writable() {
            return Err(no_write());
        }
        Ok(config)
    }

    fn auto_create(&self, topic: &str) -> Result<TopicConfig> {
        let retry_or_dlq = schedule::retry_topic_group(topic).is_some()
            || schedule::dlq_topic_group(topic).is_some();
        let mut table = self.topics_write();
        if let Some(c) = table.get(topic) {
            return Ok(c.clone()); // created by a concurrent send
        }
        // Consumers send failed messages back to their retry topic, which is
        // created on demand whatever the auto-create setting (one queue, as RocketMQ).
        let created = if retry_or_dlq {
            table.create_system(TopicConfig::new(topic, 1))?
        } else if self.opts.auto_create_topics && !schedule::is_system_topic(topic) {
            table.create(TopicConfig::new(topic, self.opts.default_queues))?
        } else {
            return Err(Error::TopicNotFound {
                topic: topic.to_owned(),
            });
        };
        drop(table);
        tracing::info!(topic, queues = created.write_queues, "auto-created topic");
        self.note_topics_changed();
        Ok(created)
    }

    pub(super) fn note_topics_changed(&self) {
        self.topics_changed.send_modify(|v| *v += 1);
    }

    /// Changes whenever the topic table changes (created, updated, deleted,
    /// auto-created), whichever door caused it.
    pub fn watch_topics(&self) -> tokio::sync::watch::Receiver<u64> {
        self.topics_changed.subscribe()
    }

    pub(super) fn choose_queue(&self, config: &TopicConfig, choice: &QueueChoice) -> Result<u32> {
        let n = config.write_queues;
        match choice {
            QueueChoice::RoundRobin => {
                let mut rr = lock(&self.round_robin);
                // Looked up by `&str` first: `entry` wanted an owned name per send.
                let next = match rr.get_mut(config.name.as_str()) {
                    Some(next) => next,
                    None => rr.entry(config.name.clone()).or_insert(0),
                };
                let q = (*next % u64::from(n)) as u32;
                *next = next.wrapping_add(1);
                Ok(q)
            }
            QueueChoice::ShardingKey(key) => Ok(sharding_queue(key, n)),
            QueueChoice::Queue(q) if *q < n => Ok(*q),
            QueueChoice::Queue(q) => Err(Error::QueueNotFound {
                topic: config.name.clone(),
                queue_id: *q,
                queues: n,
            }),
        }
    }

    /// The offset owner for `member` of `group`: see [`owner_key`].
    fn offset_owner(&self, group: &str, member: &str) -> Result<String> {
        schedule::validate_group(group)?;
        let broadcasting = self.group_mode(group) == Some(ConsumeMode::Broadcasting);
        if broadcasting && member.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "group {group:?} is broadcasting: offsets belong to a member, and none was given"
            )));
        }
        Ok(owner_key(group, member, broadcasting))
    }

    /// The mode of the group's live members, else the one it last had
    /// (remembered across restarts), else `None` (never seen).
    pub(super) fn group_mode(&self, group: &str) -> Option<ConsumeMode> {
        let live = {
            let mut groups = lock(&self.groups);
            groups.expire(self.clock.now_ms());
            groups.mode(group)
        };
        live.or_else(|| self.group_configs.get(group).mode)
    }

    /// Whether `group` is an ordered (FIFO) group.
    pub(super) fn is_fifo(&self, group: &str) -> bool {
        self.group_configs.fifo(group)
    }

    /// How often a message of `group` is retried before it is dead-lettered:
    /// the group's own setting, else `BrokerSettings::max_reconsume_times`.
    pub(super) fn max_reconsume_times(&self, group: &str) -> u32 {
        self.group_configs
            .get(group)
            .max_reconsume_times
            .unwrap_or(self.opts.max_reconsume_times)
    }

    pub(super) fn readable_queue(&self, topic: &str, queue_id: u32) -> Result<TopicConfig> {
        let config = self.topic_config(topic)?;
        if queue_id >= config.read_queues {
            return Err(Error::QueueNotFound {
                topic: topic.to_owned(),
                queue_id,
                queues: config.read_queues,
            });
        }
        Ok(config)
    }
}

/// RocketMQ's `SelectMessageQueueByHash`: `|hashCode(key) % n|`, with Java's
/// `String.hashCode()` — stable across processes and shared with Java producers.
pub fn sharding_queue(key: &str, queues: u32) -> u32 {
    let n = i64::from(queues.max(1));
    (i64::from(java_string_hash(key)) % n).unsigned_abs() as u32
}

impl TopicLookup for Broker {
    fn topic_config(&self, topic: &str) -> Result<TopicConfig> {
        Broker::topic_config(self, topic)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "writing consumer offsets at shutdown failed");
        }
    }
}

impl MessagingApi for Broker {
    async fn create_topic(&self, config: TopicConfig) -> Result<TopicConfig> {
        let created = if schedule::is_door_state_topic(&config.name) {
            schedule::validate_topic(&config.name)?;
            self.topics_write().create_system(config)?
        } else {
            self.topics_write().create(config)?
        };
        self.note_topics_changed();
        Ok(created)
    }

    async fn update_topic(&self, config: TopicConfig) -> Result<TopicConfig> {
        let updated = self.topics_write().update(config)?;
        self.note_topics_changed();
        Ok(updated)
    }

    async fn delete_topic(&self, topic: &str) -> Result<()> {
        self.topics_write().delete(topic)?;
        self.note_topics_changed();
        self.offsets.table().remove_topic(topic);
        self.pop.table().remove_topic(topic);
        lock(&self.round_robin).remove(topic);
        self.store.remove_topic(topic)
    }

    async fn topic(&self, topic: &str) -> Result<TopicConfig> {
        self.topic_config(topic)
    }

    async fn topics(&self, kind: TopicKind) -> Result<Vec<TopicConfig>> {
        Ok(self.topics_read().list(kind))
    }

    async fn send(&self, mut message: Message, queue: QueueChoice) -> Result<SendResult> {
        let config = self.writable_topic(&message.topic)?;
        let queue_id = self.choose_queue(&config, &queue)?;
        message.topic.clone_from(&config.name);
        message.queue_id = queue_id;
        let plan = delay::plan(&message, &self.opts.delay, self.clock.now_ms())?;
        delay::divert(&mut message, plan);
        let append = self
            .store
            .put_batch_async(std::slice::from_ref(&message))
            .await?
            .pop()
            .ok_or_else(|| Error::InvalidMessage("nothing appended".into()))?;
        Ok(SendResult {
            topic: config.name,
            queue_id,
            append,
        })
    }

    async fn send_batch(
        &self,
        mut messages: Vec<Message>,
        queue: QueueChoice,
    ) -> Result<Vec<SendResult>> {
        let Some(first) = messages.first() else {
            return Err(Error::InvalidMessage("an empty batch".into()));
        };
        let topic = first.topic.clone();
        if let Some(other) = messages.iter().find(|m| m.topic != topic) {
            return Err(Error::InvalidArgument(format!(
                "a batch goes to one topic; it mixes {topic:?} and {:?}",
                other.topic
            )));
        }
        let now = self.clock.now_ms();
        for m in &messages {
            if delay::plan(m, &self.opts.delay, now)? != delay::Plan::Now {
                return Err(Error::InvalidMessage(
                    "a batch cannot be delayed; send delayed messages one by one".into(),
                ));
            }
        }
        let config = self.writable_topic(&topic)?;
        let queue_id = self.choose_queue(&config, &queue)?;
        for m in &mut messages {
            m.queue_id = queue_id;
        }
        let appended = self.store.put_batch_async(&messages).await?;
        Ok(appended
            .into_iter()
            .map(|append| SendResult {
                topic: topic.clone(),
                queue_id,
                append,
            })
            .collect())
    }

    async fn send_encoded(&self, batch: EncodedBatch, queue: QueueChoice) -> Result<BatchSent> {
        let plain = match PlainBatch::check(&batch, &SEND_TIME_PROPERTIES) {
            Some(p) if !batch.entries.is_empty() => p,
            _ => return api::send_general(self, batch, queue).await,
        };
        let config = self.writable_topic(&batch.topic)?;
        let queue_id = self.choose_queue(&config, &queue)?;
        let (store_timestamp, records) = self
            .store
            .put_encoded_async(plain, &config.name, queue_id)
            .await?;
        Ok(BatchSent {
            topic: config.name,
            queue_id,
            store_host: self.store.store_host(),
            store_timestamp,
            records,
        })
    }

    async fn send_back(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        delay_level: Option<u8>,
    ) -> Result<SendBackResult> {
        self.send_back_message(group, topic, queue_id, offset, delay_level)
            .await
    }

    async fn resend_dead_letters(
        &self,
        group: &str,
        which: DeadLetters,
    ) -> Result<Vec<SendResult>> {
        self.resend_dead_letters_from(group, which).await
    }

    // Not `async fn`s around the waiting ones: an async fn keeps its arguments for
    // its whole life, so each wait (a WebSocket subscription holds one per queue
    // while idle) carried the 248-byte request twice (issue #33).
    fn pull(&self, request: PullRequest) -> impl Future<Output = Result<PullResult>> + Send {
        self.pull_waiting(request)
    }

    fn pop(&self, request: PopRequest) -> impl Future<Output = Result<Vec<Popped>>> + Send {
        self.pop_waiting(request)
    }

    async fn wait_for_arrivals(&self, topic: &str, next: Vec<u64>, wait: Duration) -> Result<bool> {
        self.wait_for_topic(topic, &next, wait).await?;
        Ok(true)
    }

    async fn ack(&self, receipt: &str) -> Result<()> {
        self.ack_receipt(&receipt.parse()?)
    }

    async fn change_invisibility(
        &self,
        receipt: &str,
        invisible: Duration,
    ) -> Result<ReceiptHandle> {
        self.renew_receipt(&receipt.parse()?, invisible)
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<()> {
        self.nack_receipt(&receipt.parse()?, delay)
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<()> {
        let changed = lock(&self.groups).heartbeat(&heartbeat, self.clock.now_ms())?;
        if changed {
            tracing::debug!(
                group = heartbeat.group,
                member = heartbeat.member,
                "consumer group changed"
            );
            // Remembered for offset calls made while no member is live (after a
            // restart); written only when it changes.
            let mode = heartbeat.mode;
            if let Err(e) = self
                .group_configs
                .update(&heartbeat.group, |c| c.mode = Some(mode))
            {
                tracing::error!(error = %e, group = heartbeat.group, "writing the group's mode failed");
            }
        }
        Ok(())
    }

    async fn unregister(&self, group: &str, member: &str) -> Result<()> {
        lock(&self.groups).unregister(group, member);
        Ok(())
    }

    async fn assignment(&self, group: &str, member: &str, topic: &str) -> Result<Vec<u32>> {
        let config = self.topic_config(topic)?;
        let (mode, members) = {
            let mut groups = lock(&self.groups);
            groups.expire(self.clock.now_ms());
            if !groups.is_member(group, member) {
                return Err(Error::MemberNotFound {
                    group: group.to_owned(),
                    member: member.to_owned(),
                });
            }
            (groups.mode(group), groups.members_of(group, topic))
        };
        if !members.iter().any(|m| m == member) {
            return Ok(Vec::new()); // not subscribed to this topic
        }
        let all = 0..config.read_queues;
        if mode == Some(ConsumeMode::Broadcasting) {
            return Ok(all.collect());
        }
        let queues: Vec<MessageQueue> = all
            .map(|q| MessageQueue::new(topic, self.opts.broker_name.as_str(), q))
            .collect();
        Ok(
            allocate::allocate(&self.opts.allocate, member, &members, &queues)
                .into_iter()
                .map(|q| q.queue_id)
                .collect(),
        )
    }

    async fn query_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<u64>> {
        let owner = self.offset_owner(group, member)?;
        Ok(self.offsets.table().get(&owner, topic, queue_id))
    }

    async fn commit_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Result<()> {
        self.readable_queue(topic, queue_id)?;
        let owner = self.offset_owner(group, member)?;
        self.offsets.table().set(&owner, topic, queue_id, offset);
        Ok(())
    }

    async fn reset_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        to: OffsetReset,
    ) -> Result<Vec<(u32, u64)>> {
        let config = self.topic_config(topic)?;
        let owner = self.offset_owner(group, member)?;
        let mut moved = Vec::new();
        for q in 0..config.read_queues {
            let (min, max) = self.store.queue_bounds(topic, q);
            let offset = match to {
                OffsetReset::Earliest => min,
                OffsetReset::Latest => max,
                OffsetReset::Timestamp(ts) => self
                    .store
                    .queue_offset_by_time(topic, q, ts)?
                    .clamp(min, max),
            };
            moved.push((q, offset));
        }
        {
            let mut table = self.offsets.table();
            for (q, offset) in &moved {
                table.set(&owner, topic, *q, *offset);
            }
        }
        if owner == group {
            // POP consumers of the group re-read from the same point.
            let mut pop = self.pop.table();
            for (q, offset) in &moved {
                pop.reset(group, topic, *q, *offset);
            }
        }
        Ok(moved)
    }

    async fn lock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<()> {
        self.readable_queue(topic, queue_id)?;
        let lease = self.opts.lock_lease.as_millis() as i64;
        lock(&self.groups).lock(group, member, topic, queue_id, self.clock.now_ms(), lease)
    }

    async fn unlock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<()> {
        lock(&self.groups).unlock(group, member, topic, queue_id);
        Ok(())
    }

    async fn send_half(
        &self,
        producer_group: &str,
        message: Message,
        queue: QueueChoice,
    ) -> Result<HalfSent> {
        validate_group(producer_group)?;
        let now = self.clock.now_ms();
        if delay::plan(&message, &self.opts.delay, now)? != delay::Plan::Now {
            return Err(Error::InvalidMessage(
                "a transactional message cannot be delayed".into(),
            ));
        }
        let config = self.writable_topic(&message.topic)?;
        let queue_id = self.choose_queue(&config, &queue)?;
        self.txn
            .store_half(producer_group, message, config.name, queue_id, now)
            .await
    }

    async fn end_transaction(
        &self,
        handle: &TransactionHandle,
        resolution: Resolution,
    ) -> Result<Option<SendResult>> {
        self.txn.end_half(self, handle, resolution).await
    }

    async fn register_transaction_checker(
        &self,
        producer_group: &str,
        checker: Arc<dyn TransactionChecker>,
    ) -> Result<CheckerRegistration> {
        self.txn.add_checker(producer_group, checker)
    }

    async fn queue_stats(&self, topic: &str) -> Result<Vec<QueueStats>> {
        self.queue_stats_of(topic)
    }

    async fn offset_by_time(&self, topic: &str, queue_id: u32, ts_ms: i64) -> Result<u64> {
        self.offset_at_time(topic, queue_id, ts_ms)
    }

    async fn set_max_reconsume_times(&self, group: &str, max: Option<u32>) -> Result<()> {
        self.set_group_max_reconsume_times(group, max)
    }

    async fn set_fifo(&self, group: &str, fifo: bool) -> Result<()> {
        self.set_group_fifo(group, fifo)
    }

    async fn delete_group(&self, group: &str, how: GroupDeletion) -> Result<GroupDeleted> {
        self.delete_group_now(group, how).await
    }

    async fn groups(&self) -> Result<Vec<String>> {
        Ok(self.group_names())
    }

    async fn group_info(&self, group: &str) -> Result<GroupInfo> {
        self.describe_group(group)
    }

    fn delay_limits(&self) -> delay::DelayLimits {
        self.opts.delay.limits()
    }

    async fn delayed(&self, topic: &str, max: usize) -> Result<Vec<delay::Delayed>> {
        self.topic_config(topic)?;
        self.delay.pending(topic, max).await
    }

    async fn cancel_delayed(&self, id: &str) -> Result<delay::Delayed> {
        self.delay.cancel(id).await
    }

    async fn message_by_id(&self, msg_id: &str) -> Result<Delivered> {
        self.lookup_id(msg_id)
    }

    async fn messages_by_key(&self, topic: &str, key: &str, max: usize) -> Result<Vec<Delivered>> {
        self.lookup_key(topic, key, max)
    }

    async fn messages_by_time(
        &self,
        topic: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<Delivered>> {
        self.lookup_time(topic, begin_ms, end_ms, max)
    }

    async fn sync_visible(&self) {
        if !self.store.visible(Duration::from_secs(5)).await {
            tracing::warn!("consume queues lag the commit log by more than 5 s");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharding_matches_rocketmqs_select_by_hash() {
        // Java: Math.abs("order-42".hashCode() % 8)
        let h = java_string_hash("order-42");
        assert_eq!(sharding_queue("order-42", 8), (h % 8).unsigned_abs());
        for key in ["a", "b", "", "é", "long-key-with-many-chars"] {
            assert!(sharding_queue(key, 3) < 3);
            assert_eq!(sharding_queue(key, 3), sharding_queue(key, 3));
        }
    }
}
