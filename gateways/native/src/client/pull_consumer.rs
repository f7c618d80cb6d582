//! [`PullConsumer`]: the application drives consumption — assign queues (or subscribe
//! and let the group share them out), `poll`, `commit`, `seek`.

use rocketgate_core::sync::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::ClientSettings;
use super::consume::{Broker, ConsumeFrom, Expression, Pulled, allocate, start_offset};
use super::session::Session;
use crate::Error;
use crate::message::ReceivedMessage;
use rocketgate_remoting::body::{ConsumerData, MessageQueue, SubscriptionData};
use rocketgate_remoting::code::request;

/// How long one suspended pull of a poll may be held by the broker at most.
const MAX_SUSPEND: Duration = Duration::from_secs(15);
/// How often a subscribed consumer re-computes its share of the queues.
const REBALANCE_EVERY: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Default)]
struct Position {
    /// Where the next pull starts; `None` until resolved from the committed offset.
    next: Option<u64>,
    /// What was last committed (or read from the broker).
    committed: Option<u64>,
}

#[derive(Default)]
struct State {
    /// Subscribed topics (group-managed mode); empty when queues were assigned.
    subscriptions: BTreeMap<String, Expression>,
    queues: BTreeMap<MessageQueue, Position>,
    /// Expression per topic of assigned queues.
    expressions: BTreeMap<String, Expression>,
    cursor: usize,
    rebalance_due: Option<Instant>,
}

/// A pull consumer of one group. Call [`PullConsumer::poll`] from one task at a time.
///
/// ```no_run
/// use std::time::Duration;
/// use rocketgate_native::client::{ClientSettings, PullConsumer};
///
/// # async fn demo() -> Result<(), rocketgate_native::Error> {
/// let consumer = PullConsumer::start(ClientSettings::new(["127.0.0.1:9876"]), "readers").await?;
/// let queues = consumer.queues("orders").await?;
/// consumer.assign(queues, "*").await?;
/// let batch = consumer.poll(Duration::from_secs(5)).await?;
/// for m in &batch {
///     println!("{} {:?}", m.queue_offset, m.body);
/// }
/// consumer.commit().await?;
/// # Ok(()) }
/// ```
pub struct PullConsumer {
    broker: Broker,
    /// Std lock, never held across an await: snapshots out, results back in.
    state: Arc<Mutex<State>>,
    consume_from: ConsumeFrom,
    batch: u32,
}

impl PullConsumer {
    /// Starts a consumer of `group`; new queues start from their first message.
    pub async fn start(config: ClientSettings, group: impl Into<String>) -> Result<Self, Error> {
        let (session, mut pushes) = Session::start(config);
        let state: Arc<Mutex<State>> = Arc::default();
        let weak = Arc::downgrade(&state);
        // A member joined or left: rebalance at the next poll.
        tokio::spawn(async move {
            while let Some(p) = pushes.recv().await {
                if p.command.code == request::NOTIFY_CONSUMER_IDS_CHANGED {
                    let Some(state) = weak.upgrade() else { return };
                    lock(&state).rebalance_due = Some(Instant::now());
                }
            }
        });
        Ok(PullConsumer {
            broker: Broker::new(session, group.into()),
            state,
            consume_from: ConsumeFrom::First,
            batch: 32,
        })
    }

    /// Where a queue with no committed offset starts (default: its first message).
    pub fn with_consume_from(mut self, from: ConsumeFrom) -> Self {
        self.consume_from = from;
        self
    }

    /// At most this many messages per queue per poll (default 32).
    pub fn with_batch_size(mut self, n: u32) -> Self {
        self.batch = n.max(1);
        self
    }

    /// The readable queues of `topic`.
    pub async fn queues(&self, topic: &str) -> Result<Vec<MessageQueue>, Error> {
        Ok(self.broker.session.route(topic).await?.read_queues.clone())
    }

    /// Consumes exactly these queues (no group sharing), filtered by a tag expression.
    pub async fn assign(&self, queues: Vec<MessageQueue>, tags: &str) -> Result<(), Error> {
        for t in queues.iter().map(|q| q.topic.clone()) {
            self.broker.session.route(&t).await?;
        }
        let mut s = lock(&self.state);
        s.subscriptions.clear();
        s.queues.retain(|q, _| queues.contains(q));
        for q in queues {
            s.expressions.insert(q.topic.clone(), Expression::tag(tags));
            s.queues.entry(q).or_default();
        }
        Ok(())
    }

    /// Joins the group for `topic`: queues are shared among the group's members and
    /// re-shared when members come and go.
    pub async fn subscribe(&self, topic: &str, tags: &str) -> Result<(), Error> {
        self.broker.session.route(topic).await?;
        let subs = {
            let mut s = lock(&self.state);
            s.subscriptions
                .insert(topic.to_owned(), Expression::tag(tags));
            s.rebalance_due = Some(Instant::now());
            s.subscriptions.clone()
        };
        let group = self.broker.group.clone();
        self.broker.session.update_heartbeat(|hb| {
            hb.consumer_data_set.retain(|c| c.group_name != group);
            hb.consumer_data_set.push(ConsumerData {
                consume_from_where: "CONSUME_FROM_FIRST_OFFSET".into(),
                consume_type: "CONSUME_ACTIVELY".into(),
                group_name: group.clone(),
                message_model: "CLUSTERING".into(),
                subscription_data_set: subs
                    .iter()
                    .map(|(t, e)| SubscriptionData {
                        expression_type: e.kind.into(),
                        sub_string: e.text.clone(),
                        topic: t.clone(),
                        ..Default::default()
                    })
                    .collect(),
                unit_mode: false,
            });
        });
        self.broker.session.heartbeat_now().await
    }

    /// The broker id (in the queue's broker group) the next pull of `mq` goes to
    /// first: what the last pull answer suggested (`suggestWhichBrokerId`), 0 = the
    /// master. When that member cannot be reached the pull goes to the next one.
    pub fn reading_from(&self, mq: &MessageQueue) -> u64 {
        self.broker.suggested(mq)
    }

    /// The queues this consumer reads now.
    pub fn assignment(&self) -> Vec<MessageQueue> {
        lock(&self.state).queues.keys().cloned().collect()
    }

    async fn rebalance_if_due(&self) -> Result<(), Error> {
        let (due, subs) = {
            let s = lock(&self.state);
            let due = s.rebalance_due.is_some_and(|d| d <= Instant::now());
            (due, s.subscriptions.clone())
        };
        if !due || subs.is_empty() {
            return Ok(());
        }
        let me = self.broker.session.client_id().to_owned();
        let mut mine = Vec::new();
        for topic in subs.keys() {
            let all = self.broker.session.route(topic).await?.read_queues.clone();
            let Some(first) = all.first() else { continue };
            let members = self.broker.members(first).await.unwrap_or_default();
            mine.extend(allocate(&me, &members, &all));
        }
        let mut s = lock(&self.state);
        s.queues.retain(|q, _| mine.contains(q));
        for q in mine {
            if let Some(e) = subs.get(&q.topic) {
                s.expressions.insert(q.topic.clone(), e.clone());
            }
            s.queues.entry(q).or_default();
        }
        s.rebalance_due = Some(Instant::now() + REBALANCE_EVERY);
        Ok(())
    }

    /// Where a queue with no position starts: its committed offset, else per
    /// [`ConsumeFrom`].
    async fn resolve(&self, mq: &MessageQueue) -> Result<u64, Error> {
        if let Some(c) = self.broker.query_offset(mq).await? {
            if let Some(p) = lock(&self.state).queues.get_mut(mq) {
                p.committed = Some(c);
            }
            return Ok(c);
        }
        start_offset(&self.broker, mq, self.consume_from).await
    }

    /// Waits up to `timeout` for messages from the assigned queues; an empty result
    /// means none arrived in time.
    pub async fn poll(&self, timeout: Duration) -> Result<Vec<ReceivedMessage>, Error> {
        let deadline = Instant::now() + timeout;
        self.rebalance_if_due().await?;
        let (queues, cursor) = {
            let s = lock(&self.state);
            let q: Vec<(MessageQueue, Option<u64>, Expression)> = s
                .queues
                .iter()
                .map(|(q, p)| {
                    let e = s
                        .expressions
                        .get(&q.topic)
                        .cloned()
                        .unwrap_or_else(|| Expression::tag("*"));
                    (q.clone(), p.next, e)
                })
                .collect();
            (q, s.cursor)
        };
        if queues.is_empty() {
            tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(100)))
                .await;
            return Ok(Vec::new());
        }
        let mut resolved = Vec::with_capacity(queues.len());
        for (q, next, e) in queues {
            let next = match next {
                Some(n) => n,
                None => self.resolve(&q).await?,
            };
            resolved.push((q, next, e));
        }
        // One pass without waiting, starting after the queue served last time.
        let n = resolved.len();
        for i in 0..n {
            let (q, offset, e) = &resolved[(cursor + i) % n];
            let pulled = self
                .broker
                .pull(q, *offset, self.batch, e, None, None)
                .await?;
            if let Some(found) = self.absorb(q, pulled) {
                lock(&self.state).cursor = (cursor + i + 1) % n;
                return Ok(found);
            }
        }
        // Nothing anywhere: hold a pull on every queue, take the first that finds.
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Ok(Vec::new());
        }
        let suspend = remaining.min(MAX_SUSPEND);
        let mut pulls = JoinSet::new();
        for (q, _, e) in resolved {
            let next = lock(&self.state).queues.get(&q).and_then(|p| p.next);
            let Some(offset) = next else { continue };
            let broker = self.broker.clone();
            let batch = self.batch;
            pulls.spawn(async move {
                let r = broker
                    .pull(&q, offset, batch, &e, Some(suspend), None)
                    .await;
                (q, r)
            });
        }
        while let Some(done) = pulls.join_next().await {
            let Ok((q, r)) = done else { continue };
            match r {
                Ok(pulled) => {
                    if let Some(found) = self.absorb(&q, pulled) {
                        return Ok(found);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Vec::new())
    }

    /// Records where a queue continues; the messages if any.
    fn absorb(&self, q: &MessageQueue, pulled: Pulled) -> Option<Vec<ReceivedMessage>> {
        let mut s = lock(&self.state);
        let pos = s.queues.get_mut(q)?;
        match pulled {
            Pulled::Found { messages, next } => {
                pos.next = Some(next);
                Some(messages).filter(|m| !m.is_empty())
            }
            Pulled::Nothing { next } | Pulled::Moved { next } => {
                pos.next = Some(next);
                None
            }
        }
    }

    /// Commits the position of every queue that moved since its last commit.
    pub async fn commit(&self) -> Result<(), Error> {
        let todo: Vec<(MessageQueue, u64)> = lock(&self.state)
            .queues
            .iter()
            .filter_map(|(q, p)| match (p.next, p.committed) {
                (Some(n), Some(c)) if n == c => None,
                (Some(n), _) => Some((q.clone(), n)),
                _ => None,
            })
            .collect();
        for (q, offset) in todo {
            self.broker.commit_offset(&q, offset).await?;
            if let Some(p) = lock(&self.state).queues.get_mut(&q) {
                p.committed = Some(offset);
            }
        }
        Ok(())
    }

    /// The group's committed offset of a queue, as the broker has it.
    pub async fn committed(&self, mq: &MessageQueue) -> Result<Option<u64>, Error> {
        self.broker.query_offset(mq).await
    }

    /// Continues `mq` from `offset` at the next poll.
    pub fn seek(&self, mq: &MessageQueue, offset: u64) -> Result<(), Error> {
        let mut s = lock(&self.state);
        let pos = s
            .queues
            .get_mut(mq)
            .ok_or_else(|| Error::InvalidArgument(format!("{mq:?} is not assigned")))?;
        pos.next = Some(offset);
        Ok(())
    }

    /// Continues `mq` from the first message stored at or after `ts_ms` (ms since the
    /// epoch); returns that offset.
    pub async fn seek_to_timestamp(&self, mq: &MessageQueue, ts_ms: i64) -> Result<u64, Error> {
        let offset = self.broker.offset_by_time(mq, ts_ms).await?;
        self.seek(mq, offset)?;
        Ok(offset)
    }

    /// Continues `mq` from its oldest stored message; returns that offset.
    pub async fn seek_to_begin(&self, mq: &MessageQueue) -> Result<u64, Error> {
        let offset = self.broker.min_offset(mq).await?;
        self.seek(mq, offset)?;
        Ok(offset)
    }

    /// Leaves the group (if subscribed) and closes the connections. Does not commit.
    pub async fn shutdown(self) {
        if !lock(&self.state).subscriptions.is_empty() {
            self.broker.unregister().await;
        }
        self.broker.session.links.close_all();
    }
}
