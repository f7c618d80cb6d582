//! [`PushConsumer`]: messages are pulled for you (long polling, one task per assigned
//! queue) and handed to a listener.
//!
//! Shape: one coordinator task owns the set of running queues. It rebalances (every
//! `rebalance_interval`, and when a broker says the group changed), commits offsets
//! every `commit_interval`, and on shutdown stops the queue tasks, lets in-flight
//! consumption finish, commits, and leaves the group. Each queue task pulls into its
//! [`Progress`] (the offsets being consumed); the committable offset of a queue is the
//! smallest offset still being consumed, so a commit never skips an unconsumed message
//! (a crash re-delivers, never loses). Flow control: a queue task stops pulling while
//! `max_cached_per_queue` of its messages are unconsumed.

use rocketgate_core::sync::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketgate_core::store::record::property;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use super::ClientSettings;
use super::consume::{Broker, ConsumeFrom, Expression, Pulled, allocate, start_offset};
use super::link::Pushed;
use super::offset_store::{self, LocalOffsets, Persisted};
use super::progress::Progress;
use super::session::Session;
use crate::Error;
use crate::message::ReceivedMessage;
use rocketgate_remoting::body::{ConsumerData, MessageQueue, SubscriptionData};
use rocketgate_remoting::code::request;

/// How a group shares messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumeMode {
    /// Each message to one member; queues shared out (average allocation).
    #[default]
    Clustering,
    /// Every member gets every message; each member keeps its offsets in a local file
    /// (see [`PushConsumerSettings::offset_store_dir`]).
    Broadcasting,
}

/// A concurrent listener's verdict on a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeResult {
    Success,
    /// Redeliver later: the batch is sent back to the broker's retry queue.
    Retry,
}

/// An orderly listener's verdict on a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderlyResult {
    Success,
    /// Stop this queue for `suspend_on_failure`, then retry the same batch (up to
    /// `max_reconsume_times`, after which it is sent back and the queue moves on).
    SuspendMoment,
}

type Concurrent = dyn Fn(&[ReceivedMessage]) -> ConsumeResult + Send + Sync;
type Orderly = dyn Fn(&[ReceivedMessage]) -> OrderlyResult + Send + Sync;

#[derive(Clone)]
enum Listener {
    Concurrent(Arc<Concurrent>),
    Orderly(Arc<Orderly>),
}

/// What a push consumer subscribes to and how it behaves.
#[derive(Debug, Clone)]
pub struct PushConsumerSettings {
    pub group: String,
    /// Topic → tag expression.
    pub subscriptions: BTreeMap<String, String>,
    pub mode: ConsumeMode,
    pub consume_from: ConsumeFrom,
    /// Flow control: a queue stops pulling while this many of its messages are
    /// unconsumed (RocketMQ `pullThresholdForQueue`).
    pub max_cached_per_queue: usize,
    /// Messages per listener call.
    pub batch_size: usize,
    /// Messages per pull.
    pub pull_batch: u32,
    /// Listener calls running at once (concurrent mode).
    pub concurrency: usize,
    pub commit_interval: Duration,
    pub rebalance_interval: Duration,
    /// How long a broker may hold a pull when there is nothing.
    pub long_poll: Duration,
    /// Delay level of a retry (0: the broker's back-off by reconsume times).
    pub retry_delay_level: i32,
    /// Orderly mode: local retries of a failing batch before it is sent back.
    pub max_reconsume_times: u32,
    pub suspend_on_failure: Duration,
    /// Broadcasting: offsets live in `<dir>/<client id>/<group>/offsets.json`
    /// (default `~/.rocketmq_offsets`). Give the consumer a stable
    /// [`ClientSettings::with_client_id`] to resume there after a restart.
    pub offset_store_dir: PathBuf,
}

impl PushConsumerSettings {
    pub fn new(group: impl Into<String>) -> Self {
        PushConsumerSettings {
            group: group.into(),
            subscriptions: BTreeMap::new(),
            mode: ConsumeMode::Clustering,
            consume_from: ConsumeFrom::First,
            max_cached_per_queue: 1000,
            batch_size: 1,
            pull_batch: 32,
            concurrency: 16,
            commit_interval: Duration::from_secs(5),
            rebalance_interval: Duration::from_secs(20),
            long_poll: Duration::from_secs(15),
            retry_delay_level: 0,
            max_reconsume_times: 16,
            suspend_on_failure: Duration::from_secs(1),
            offset_store_dir: offset_store::default_dir(),
        }
    }

    pub fn subscribe(mut self, topic: impl Into<String>, tags: impl Into<String>) -> Self {
        self.subscriptions.insert(topic.into(), tags.into());
        self
    }

    pub fn mode(mut self, mode: ConsumeMode) -> Self {
        self.mode = mode;
        self
    }

    pub fn consume_from(mut self, from: ConsumeFrom) -> Self {
        self.consume_from = from;
        self
    }
}

/// Completes once the stop flag is set (the `Ref` of `wait_for` must not live across
/// an await in a `Send` future).
async fn stopping(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

struct Running {
    progress: Arc<Progress>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    committed: Option<u64>,
}

impl Drop for Running {
    /// A queue task never outlives its entry (graceful paths await it first; an
    /// aborted coordinator drops the entries).
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Shared by the coordinator and the queue tasks.
struct Shared {
    broker: Broker,
    opts: PushConsumerSettings,
    listener: Listener,
    expressions: BTreeMap<String, Expression>,
    permits: Arc<Semaphore>,
    /// Queue tasks ask for a rebalance soon (e.g. a retry topic appeared).
    kick: Notify,
}

/// A running push consumer. [`PushConsumer::shutdown`] stops it gracefully.
///
/// ```no_run
/// use rocketgate_native::client::{ClientSettings, ConsumeResult, PushConsumer, PushConsumerSettings};
///
/// # async fn demo() -> Result<(), rocketgate_native::Error> {
/// let options = PushConsumerSettings::new("billing").subscribe("orders", "created || paid");
/// let consumer = PushConsumer::start_concurrent(
///     ClientSettings::new(["127.0.0.1:9876"]),
///     options,
///     |msgs| {
///         for m in msgs {
///             println!("{} {:?}", m.msg_id, m.body);
///         }
///         ConsumeResult::Success
///     },
/// )
/// .await?;
/// // ... later
/// consumer.shutdown().await;
/// # Ok(()) }
/// ```
pub struct PushConsumer {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    coordinator: JoinHandle<()>,
    assignment: Arc<Mutex<Vec<MessageQueue>>>,
}

impl PushConsumer {
    /// Starts a consumer whose listener handles batches from many queues at once.
    pub async fn start_concurrent(
        config: ClientSettings,
        options: PushConsumerSettings,
        listener: impl Fn(&[ReceivedMessage]) -> ConsumeResult + Send + Sync + 'static,
    ) -> Result<PushConsumer, Error> {
        Self::start(config, options, Listener::Concurrent(Arc::new(listener))).await
    }

    /// Starts a consumer that handles each queue's messages one batch at a time, in
    /// queue order, holding a broker lock on each queue it consumes.
    pub async fn start_orderly(
        config: ClientSettings,
        options: PushConsumerSettings,
        listener: impl Fn(&[ReceivedMessage]) -> OrderlyResult + Send + Sync + 'static,
    ) -> Result<PushConsumer, Error> {
        Self::start(config, options, Listener::Orderly(Arc::new(listener))).await
    }

    async fn start(
        config: ClientSettings,
        mut opts: PushConsumerSettings,
        listener: Listener,
    ) -> Result<PushConsumer, Error> {
        if opts.subscriptions.is_empty() {
            return Err(Error::InvalidArgument(
                "subscribe to at least one topic".into(),
            ));
        }
        let (session, pushes) = Session::start(config);
        for topic in opts.subscriptions.keys() {
            // A topic without a route yet is picked up by a later rebalance.
            match session.route(topic).await {
                Ok(_) | Err(Error::NoRoute { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if opts.mode == ConsumeMode::Clustering {
            // Failed messages come back through the group's retry topic.
            opts.subscriptions
                .insert(format!("%RETRY%{}", opts.group), "*".into());
        }
        let expressions: BTreeMap<String, Expression> = opts
            .subscriptions
            .iter()
            .map(|(t, e)| (t.clone(), Expression::tag(e.clone())))
            .collect();
        let group = opts.group.clone();
        let model = match opts.mode {
            ConsumeMode::Clustering => "CLUSTERING",
            ConsumeMode::Broadcasting => "BROADCASTING",
        };
        session.update_heartbeat(|hb| {
            hb.consumer_data_set.push(ConsumerData {
                consume_from_where: "CONSUME_FROM_FIRST_OFFSET".into(),
                consume_type: "CONSUME_PASSIVELY".into(),
                group_name: group.clone(),
                message_model: model.into(),
                subscription_data_set: expressions
                    .iter()
                    .map(|(t, e)| SubscriptionData {
                        expression_type: e.kind.into(),
                        sub_string: e.text.clone(),
                        topic: t.clone(),
                        ..Default::default()
                    })
                    .collect(),
                unit_mode: false,
            })
        });
        session.heartbeat_now().await?;
        let shared = Arc::new(Shared {
            broker: Broker::new(session, group),
            permits: Arc::new(Semaphore::new(opts.concurrency.max(1))),
            opts,
            listener,
            expressions,
            kick: Notify::new(),
        });
        let (stop, stopped) = watch::channel(false);
        let assignment: Arc<Mutex<Vec<MessageQueue>>> = Arc::default();
        let coordinator = tokio::spawn(coordinate(
            shared.clone(),
            pushes,
            stopped,
            assignment.clone(),
        ));
        Ok(PushConsumer {
            shared,
            stop,
            coordinator,
            assignment,
        })
    }

    /// The queues this member consumes now.
    pub fn assignment(&self) -> Vec<MessageQueue> {
        lock(&self.assignment).clone()
    }

    pub fn client_id(&self) -> &str {
        self.shared.broker.session.client_id()
    }

    /// Stops at once, like a crash: no final commit, no goodbye to the brokers (the
    /// group learns from the closed connections). For failover drills and tests.
    pub async fn abort(self) {
        self.coordinator.abort();
        let _ = self.coordinator.await;
        self.shared.broker.session.links.close_all();
    }

    /// Stops pulling, waits for in-flight consumption, commits the offsets, leaves
    /// the group and closes the connections.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        let _ = self.coordinator.await;
        self.shared.broker.session.links.close_all();
    }
}

async fn coordinate(
    shared: Arc<Shared>,
    mut pushes: mpsc::UnboundedReceiver<Pushed>,
    mut stopped: watch::Receiver<bool>,
    assignment: Arc<Mutex<Vec<MessageQueue>>>,
) {
    let opts = &shared.opts;
    let mut running: BTreeMap<MessageQueue, Running> = BTreeMap::new();
    // Broadcasting keeps offsets here, backed by a local file.
    let (mut file, mut local_offsets) = match opts.mode {
        ConsumeMode::Broadcasting => {
            let me = shared.broker.session.client_id();
            let (f, o) =
                Persisted::open(LocalOffsets::new(&opts.offset_store_dir, me, &opts.group));
            (Some(f), o)
        }
        ConsumeMode::Clustering => (None, BTreeMap::new()),
    };
    let mut rebalance = tokio::time::interval(opts.rebalance_interval);
    let mut commit = tokio::time::interval(opts.commit_interval);
    commit.tick().await;
    loop {
        tokio::select! {
            _ = rebalance.tick() => {
                do_rebalance(&shared, &mut running, &mut local_offsets).await;
                *lock(&assignment) = running.keys().cloned().collect();
            }
            _ = shared.kick.notified() => {
                rebalance.reset_immediately();
            }
            Some(p) = pushes.recv() => {
                if p.command.code == request::NOTIFY_CONSUMER_IDS_CHANGED {
                    debug!(group = opts.group, "group changed; rebalancing");
                    rebalance.reset_immediately();
                }
            }
            _ = commit.tick() => {
                commit_all(&shared, &mut running, &mut local_offsets).await;
                if let Some(f) = &mut file {
                    f.sync(&local_offsets).await;
                }
            }
            _ = stopping(&mut stopped) => break,
        }
    }
    // Graceful stop: no more pulls, let consumption finish, commit, leave.
    let queues: Vec<MessageQueue> = running.keys().cloned().collect();
    for q in &queues {
        if let Some(r) = running.get(q) {
            r.stop.send_replace(true);
        }
    }
    for q in &queues {
        if let Some(r) = running.get_mut(q) {
            let _ = (&mut r.task).await;
        }
    }
    commit_all(&shared, &mut running, &mut local_offsets).await;
    if let Some(f) = &mut file {
        f.sync(&local_offsets).await;
    }
    if matches!(shared.listener, Listener::Orderly(_)) {
        unlock(&shared, &queues).await;
    }
    if opts.mode == ConsumeMode::Clustering {
        shared.broker.unregister().await;
    }
}

async fn unlock(shared: &Shared, queues: &[MessageQueue]) {
    let mut by_broker: BTreeMap<&str, Vec<MessageQueue>> = BTreeMap::new();
    for q in queues {
        by_broker.entry(&q.broker_name).or_default().push(q.clone());
    }
    for qs in by_broker.values() {
        let _ = shared.broker.unlock(qs).await;
    }
}

/// The queues this member should consume now: fresh routes, a heartbeat (so the
/// brokers list us), then our share of each topic's queues.
/// Topics whose share could not be computed are returned apart: their current queues
/// are kept rather than dropped on a transient failure.
async fn wanted(shared: &Shared) -> (BTreeSet<MessageQueue>, BTreeSet<String>) {
    let me = shared.broker.session.client_id();
    let mut routes = Vec::new();
    let mut undecided = BTreeSet::new();
    for topic in shared.expressions.keys() {
        match shared.broker.session.refresh_route(topic).await {
            Ok(r) => routes.push((topic, r)),
            // A retry topic appears with the first failure.
            Err(Error::NoRoute { .. }) => continue,
            Err(e) => {
                debug!(topic, error = %e, "route refresh failed; keeping this topic's queues");
                undecided.insert(topic.clone());
            }
        }
    }
    if let Err(e) = shared.broker.session.heartbeat_now().await {
        debug!(error = %e, "heartbeat failed");
    }
    let mut out = BTreeSet::new();
    for (topic, route) in routes {
        let all = &route.read_queues;
        match shared.opts.mode {
            ConsumeMode::Broadcasting => out.extend(all.iter().cloned()),
            ConsumeMode::Clustering => {
                let Some(first) = all.first() else { continue };
                let members = match shared.broker.members(first).await {
                    Ok(m) => m,
                    Err(e) => {
                        debug!(topic, error = %e, "member list unavailable");
                        undecided.insert(topic.clone());
                        continue;
                    }
                };
                out.extend(allocate(me, &members, all));
            }
        }
    }
    (out, undecided)
}

async fn do_rebalance(
    shared: &Arc<Shared>,
    running: &mut BTreeMap<MessageQueue, Running>,
    local_offsets: &mut BTreeMap<MessageQueue, u64>,
) {
    let (mut want, undecided) = wanted(shared).await;
    want.extend(
        running
            .keys()
            .filter(|q| undecided.contains(&q.topic))
            .cloned(),
    );
    let orderly = matches!(shared.listener, Listener::Orderly(_));
    if orderly {
        // Take or renew the broker locks; consume only what we hold.
        let mut by_broker: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
        for q in &want {
            by_broker
                .entry(q.broker_name.clone())
                .or_default()
                .push(q.clone());
        }
        let mut held = BTreeSet::new();
        for qs in by_broker.values() {
            match shared.broker.lock(qs).await {
                Ok(l) => held.extend(l),
                Err(e) => debug!(error = %e, "lock failed"),
            }
        }
        want = held;
    }
    // Stop queues no longer ours: commit what was consumed.
    let gone: Vec<MessageQueue> = running
        .keys()
        .filter(|q| !want.contains(*q))
        .cloned()
        .collect();
    for q in &gone {
        if let Some(mut r) = running.remove(q) {
            r.stop.send_replace(true);
            let _ = (&mut r.task).await;
            let offset = r.progress.committable();
            commit_one(shared, q, offset, local_offsets).await;
            debug!(queue = ?q, offset, "queue released");
        }
    }
    if orderly {
        unlock(shared, &gone).await;
    }
    for q in want {
        if running.contains_key(&q) {
            continue;
        }
        let start = match start_of(shared, &q, local_offsets).await {
            Ok(s) => s,
            Err(e) => {
                debug!(queue = ?q, error = %e, "cannot resolve the start offset");
                continue;
            }
        };
        let progress = Arc::new(Progress::new(start));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run_queue(
            shared.clone(),
            q.clone(),
            progress.clone(),
            stopped,
        ));
        running.insert(
            q,
            Running {
                progress,
                stop,
                task,
                committed: Some(start),
            },
        );
    }
}

async fn start_of(
    shared: &Shared,
    q: &MessageQueue,
    local_offsets: &BTreeMap<MessageQueue, u64>,
) -> Result<u64, Error> {
    if shared.opts.mode == ConsumeMode::Broadcasting {
        if let Some(o) = local_offsets.get(q) {
            return Ok(*o);
        }
    } else if let Some(o) = shared.broker.query_offset(q).await? {
        return Ok(o);
    }
    let from = if q.topic.starts_with("%RETRY%") {
        ConsumeFrom::First
    } else {
        shared.opts.consume_from
    };
    start_offset(&shared.broker, q, from).await
}

async fn commit_one(
    shared: &Shared,
    q: &MessageQueue,
    offset: u64,
    local_offsets: &mut BTreeMap<MessageQueue, u64>,
) -> bool {
    match shared.opts.mode {
        ConsumeMode::Broadcasting => {
            local_offsets.insert(q.clone(), offset);
            true
        }
        ConsumeMode::Clustering => match shared.broker.commit_offset(q, offset).await {
            Ok(()) => true,
            Err(e) => {
                warn!(queue = ?q, offset, error = %e, "offset commit failed");
                false
            }
        },
    }
}

async fn commit_all(
    shared: &Shared,
    running: &mut BTreeMap<MessageQueue, Running>,
    local_offsets: &mut BTreeMap<MessageQueue, u64>,
) {
    for (q, r) in running.iter_mut() {
        let offset = r.progress.committable();
        if r.committed != Some(offset) && commit_one(shared, q, offset, local_offsets).await {
            r.committed = Some(offset);
        }
    }
}

/// Pulls one queue until told to stop, handing messages to the listener.
async fn run_queue(
    shared: Arc<Shared>,
    q: MessageQueue,
    progress: Arc<Progress>,
    mut stopped: watch::Receiver<bool>,
) {
    let opts = &shared.opts;
    let Some(expression) = shared.expressions.get(&q.topic).cloned() else {
        return;
    };
    let mut consuming = JoinSet::new();
    let mut backoff = Duration::from_millis(100);
    loop {
        if *stopped.borrow() {
            break;
        }
        // Flow control.
        while progress.cached() >= opts.max_cached_per_queue {
            let consumed = progress.consumed.notified();
            if progress.cached() < opts.max_cached_per_queue {
                break;
            }
            tokio::select! {
                _ = consumed => {}
                _ = stopping(&mut stopped) => break,
            }
        }
        if *stopped.borrow() {
            break;
        }
        let offset = lock(&progress.offsets).next;
        let pulled = tokio::select! {
            r = shared.broker.pull(&q, offset, opts.pull_batch, &expression, Some(opts.long_poll), None) => r,
            _ = stopping(&mut stopped) => break,
        };
        let messages = match pulled {
            Ok(Pulled::Found { messages, next }) => {
                backoff = Duration::from_millis(100);
                let mut o = lock(&progress.offsets);
                o.next = next;
                o.inflight.extend(messages.iter().map(|m| m.queue_offset));
                messages
            }
            Ok(Pulled::Nothing { next } | Pulled::Moved { next }) => {
                lock(&progress.offsets).next = next;
                continue;
            }
            Err(e) => {
                debug!(queue = ?q, error = %e, "pull failed; backing off");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopping(&mut stopped) => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(3));
                continue;
            }
        };
        let messages: Vec<ReceivedMessage> = messages.into_iter().map(restore_topic).collect();
        match &shared.listener {
            Listener::Concurrent(f) => {
                for batch in messages.chunks(opts.batch_size.max(1)) {
                    let Ok(permit) = shared.permits.clone().acquire_owned().await else {
                        break;
                    };
                    let (shared, progress, f, batch) =
                        (shared.clone(), progress.clone(), f.clone(), batch.to_vec());
                    consuming.spawn(async move {
                        consume_concurrently(&shared, &progress, f, batch).await;
                        drop(permit);
                    });
                }
                while consuming.try_join_next().is_some() {}
            }
            Listener::Orderly(f) => {
                for batch in messages.chunks(opts.batch_size.max(1)) {
                    consume_orderly(&shared, &progress, f.clone(), batch.to_vec()).await;
                }
            }
        }
    }
    // Let in-flight consumption finish so its offsets count.
    while consuming.join_next().await.is_some() {}
}

/// A message from the retry topic is shown with its original topic, as RocketMQ does.
fn restore_topic(mut m: ReceivedMessage) -> ReceivedMessage {
    if let Some(t) = m.properties.get(property::RETRY_TOPIC) {
        m.topic = t.clone();
    }
    m
}

async fn call<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    // The listener is user code that may block: keep it off the async workers.
    tokio::task::spawn_blocking(f).await.ok()
}

async fn consume_concurrently(
    shared: &Shared,
    progress: &Progress,
    f: Arc<Concurrent>,
    batch: Vec<ReceivedMessage>,
) {
    let offsets: Vec<u64> = batch.iter().map(|m| m.queue_offset).collect();
    let (result, batch) = call(move || (f(&batch), batch))
        .await
        .unwrap_or((ConsumeResult::Retry, Vec::new()));
    let mut done = offsets;
    if result == ConsumeResult::Retry {
        for m in &batch {
            if !send_back(shared, m).await {
                // Not handed back: keep it uncommitted rather than lose it.
                done.retain(|o| *o != m.queue_offset);
            }
        }
    }
    progress.done(done);
}

async fn consume_orderly(
    shared: &Shared,
    progress: &Progress,
    f: Arc<Orderly>,
    batch: Vec<ReceivedMessage>,
) {
    let offsets: Vec<u64> = batch.iter().map(|m| m.queue_offset).collect();
    let mut batch = batch;
    let mut attempts = 0u32;
    loop {
        let g = f.clone();
        let (result, b) = call(move || (g(&batch), batch))
            .await
            .unwrap_or((OrderlyResult::SuspendMoment, Vec::new()));
        batch = b;
        if result == OrderlyResult::Success || batch.is_empty() {
            break;
        }
        attempts += 1;
        if attempts > shared.opts.max_reconsume_times {
            let mut kept = Vec::new();
            for m in &batch {
                if !send_back(shared, m).await {
                    kept.push(m.queue_offset);
                }
            }
            progress.done(offsets.into_iter().filter(|o| !kept.contains(o)));
            return;
        }
        for m in &mut batch {
            m.reconsume_times += 1;
        }
        tokio::time::sleep(shared.opts.suspend_on_failure).await;
    }
    progress.done(offsets);
}

/// Hands a failed message back for a later retry; keeps trying (the message must
/// not be lost), then asks for a rebalance so the retry topic is picked up.
async fn send_back(shared: &Shared, m: &ReceivedMessage) -> bool {
    let mut wait = Duration::from_millis(200);
    for _ in 0..10 {
        match shared
            .broker
            .send_back(m, shared.opts.retry_delay_level)
            .await
        {
            Ok(()) => {
                shared.kick.notify_one();
                return true;
            }
            Err(e) => {
                debug!(msg = m.msg_id, error = %e, "send back failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
    warn!(
        msg = m.msg_id,
        "send back kept failing; its offset stays uncommitted"
    );
    false
}
