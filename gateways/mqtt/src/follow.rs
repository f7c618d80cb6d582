//! What a connection follows of the log for its session's plain
//! subscriptions: its inbox at the router, the core queues it follows, and
//! catching up by pulling from the session's cursors when it is behind the
//! router's stream (then rejoining it). Also commits the session's positions
//! as its group's core offsets (`offsets.rs` adopts resets). Messages it reads
//! go to the connection's ready queue; the window (`window.rs`) takes them from
//! there. Owns only its own state; the session and the ready queue are handed
//! in by the connection task.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rocketgate_core::broker::{MessagingApi, PullStatus};
use tokio::sync::{Notify, mpsc};

mod offsets;

use crate::ready::ReadyQueue;
use crate::router::{Feed, Inbox, batch_of, no_feeds, queue_end, read_log};
use crate::session::{Session, Source};
use crate::shared::Shared;

/// Stop taking router batches above this many messages waiting for the window.
pub const READY_HIGH: usize = 1024;
/// Catch up by pulling while fewer than this many are waiting.
pub const READY_LOW: usize = 256;
/// A session catching up from further back than this does not hold the router
/// (and so the publishers) back while it does (see `conn.rs`).
const FAR_BEHIND: u64 = 16 * 1024;
const PULL_BATCH: usize = 128;

/// (core topic, queue).
type Key = (Arc<str>, u32);

/// How a topic's cursors start when it is followed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// At the end of the log: a topic only new subscriptions cover. A topic an
    /// earlier subscription already covered is never started here (a SUBSCRIBE
    /// repeating a filter keeps the session's place, see `conn/packets.rs`).
    End,
    /// Where the session was (in memory, or the core's committed offset), else at 0
    /// (the topic appeared after the subscription).
    Resume,
}

pub(crate) struct Following {
    /// Its id is the connection's.
    inbox: Inbox,
    /// Feeds from the router; made when the session first follows a topic
    /// ([`Following::router_inbox`]), as most connections of a device fleet
    /// follow few or none and a channel costs each about a kilobyte.
    feeds: Option<mpsc::Receiver<Feed>>,
    // B-tree sets here: empty, they take 24 bytes where a hash set takes 48,
    // and most connections keep them empty (memory per connection).
    /// The core topics followed at the router.
    joined: BTreeSet<Arc<str>>,
    /// Queues catching up by pulling.
    pending: BTreeSet<Key>,
    /// Queues of a QoS 0 session that overflowed: they skip ahead to live.
    skipping: BTreeSet<Key>,
    /// The last catch-up pull ended far from the end of its queue.
    far_behind: bool,
}

impl Following {
    /// `id`: the connection's, unique on the node.
    pub fn new(id: u64) -> Following {
        Following {
            inbox: Inbox {
                id,
                tx: no_feeds(),
                lagged: Arc::new(Notify::new()),
                overflowed: Arc::new(AtomicBool::new(false)),
                client_slow: Arc::new(AtomicBool::new(false)),
            },
            feeds: None,
            joined: BTreeSet::new(),
            pending: BTreeSet::new(),
            skipping: BTreeSet::new(),
            far_behind: false,
        }
    }

    /// The connection's id.
    pub fn id(&self) -> u64 {
        self.inbox.id
    }

    /// Notified by the router when feeds were missed (see [`Following::recheck`]).
    pub fn lagged(&self) -> Arc<Notify> {
        self.inbox.lagged.clone()
    }

    /// Set while the client does not take messages fast enough: the router and
    /// shared groups do not wait for it.
    pub fn client_slow(&self) -> &Arc<AtomicBool> {
        &self.inbox.client_slow
    }

    /// Some queue is catching up by pulling.
    pub fn catching_up(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The last catch-up pull ended far from the end of its queue.
    pub fn far_behind(&self) -> bool {
        self.far_behind
    }

    /// The next feed of the router; pending forever while the session follows
    /// nothing (the channel is made at the first join).
    pub async fn next_feed(&mut self) -> Option<Feed> {
        match &mut self.feeds {
            Some(r) => r.recv().await,
            None => std::future::pending().await,
        }
    }

    /// A feed already waiting.
    pub fn try_feed(&mut self) -> Option<Feed> {
        self.feeds.as_mut().and_then(|f| f.try_recv().ok())
    }

    /// The session's inbox for joining the router, its channel made now if
    /// it has none yet.
    fn router_inbox(&mut self) -> Inbox {
        if self.feeds.is_none() {
            let (tx, rx) = mpsc::channel(64);
            self.inbox.tx = tx;
            self.feeds = Some(rx);
        }
        self.inbox.clone()
    }

    /// Tells the router what the subscriptions want of each followed core topic
    /// (after they changed), so the session is handed only what it may match.
    pub fn refresh_interest<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &Session,
    ) {
        let inbox = self.router_inbox();
        for t in &self.joined {
            shared.router.join(t, inbox.clone(), session.interest(t));
        }
    }

    /// Follows every topic of `topics` the plain subscriptions for which `which`
    /// holds cover, starting not-yet-followed ones per `start`.
    pub async fn follow_all<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
        topics: &[String],
        start: Start,
        which: impl Fn(&crate::session::Sub) -> bool,
    ) {
        let mut wanted: Vec<String> = Vec::new();
        for sub in session
            .subs
            .iter()
            .filter(|s| s.filter.share.is_none() && which(s))
        {
            let covered: Vec<String> = match sub.filter.core_topic() {
                Some(t) => vec![t.to_owned()],
                None => topics.to_vec(),
            };
            for t in covered {
                if !wanted.contains(&t) {
                    wanted.push(t);
                }
            }
        }
        for t in wanted {
            if !self.joined.contains(t.as_str()) {
                self.follow(shared, session, &t, start).await;
            }
        }
    }

    async fn follow<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
        topic: &str,
        start: Start,
    ) {
        let name: Arc<str> = Arc::from(topic);
        if let Ok(config) = shared.api.topic(topic).await {
            for q in 0..config.read_queues {
                let key = (name.clone(), q);
                // What the core holds now, so a later change is seen as a reset.
                let core = shared
                    .api
                    .query_offset(&session.group, "", topic, q)
                    .await
                    .ok()
                    .flatten();
                let at = match start {
                    Start::End => {
                        session.committed.insert(key.clone(), core);
                        queue_end(&*shared.api, topic, q).await
                    }
                    Start::Resume if session.cursors.contains_key(&key) => {
                        session.committed.entry(key.clone()).or_insert(core);
                        None
                    }
                    Start::Resume => {
                        session.committed.insert(key.clone(), core);
                        Some(core.unwrap_or(0))
                    }
                };
                if let Some(at) = at {
                    session.cursors.insert(key.clone(), at);
                }
                self.pending.insert(key);
            }
        }
        let interest = session.interest(topic);
        let inbox = self.router_inbox();
        shared.router.join(topic, inbox, interest);
        self.joined.insert(name);
    }

    /// Stops following topics no plain subscription covers any more (after an
    /// UNSUBSCRIBE), and forgets the session's positions in them.
    pub fn drop_uncovered<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
    ) {
        let joined: Vec<Arc<str>> = self.joined.iter().cloned().collect();
        for t in joined {
            if !session.follows(&t) {
                shared.router.leave(&t, self.inbox.id);
                self.joined.remove(&t);
                self.pending.retain(|(pt, _)| *pt != t);
                self.skipping.retain(|(pt, _)| *pt != t);
                session.cursors.retain(|(ct, _), _| *ct != t);
                session.committed.retain(|(ct, _), _| *ct != t);
            }
        }
    }

    /// Told by the router that batches were missed (or a reader started): every
    /// followed queue catches up by pulling (a QoS 0 session that overflowed
    /// skips ahead instead); topics that had no queues yet get their cursors now.
    pub async fn recheck<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
    ) {
        let joined: Vec<Arc<str>> = self.joined.iter().cloned().collect();
        for t in joined {
            if !session.cursors.keys().any(|(ct, _)| *ct == t) {
                self.joined.remove(&t);
                self.follow(shared, session, &t, Start::Resume).await;
            }
        }
        // A QoS 0 session whose channel overflowed does not read the backlog
        // back: each queue skips to the next live batch (or to the end of the
        // queue when it is already catching up).
        let skip = self.inbox.overflowed.swap(false, Ordering::AcqRel) && session.qos0_only();
        for k in session.cursors.keys() {
            if self.joined.contains(&k.0) {
                if skip {
                    self.skipping.insert(k.clone());
                } else {
                    self.pending.insert(k.clone());
                }
            }
        }
    }

    pub fn on_batch(&mut self, feed: Feed, session: &mut Session, ready: &mut ReadyQueue) {
        let b = &*feed.batch;
        let key = (b.topic.clone(), b.queue);
        if !self.joined.contains(&b.topic) {
            return;
        }
        if self.pending.contains(&key) {
            // Catching up: rejoin the shared stream as soon as a feed covers the
            // cursor (pulling alone may never overtake a busy queue).
            let covers = session
                .cursors
                .get(&key)
                .is_some_and(|&c| feed.from <= c && c < b.next);
            if !covers || ready.len() >= READY_HIGH {
                return;
            }
            self.pending.remove(&key);
        }
        let Some(&cur) = session.cursors.get(&key) else {
            // A queue first seen now: its messages are all new to the session.
            session.cursors.insert(key.clone(), 0);
            self.pending.insert(key);
            return;
        };
        if b.next <= cur {
            return;
        }
        let mut cur = cur;
        // The feed covers `feed.from..b.next`: the router handed the session
        // every message of that range it may match (only those).
        if feed.from > cur && self.skipping.remove(&key) && session.qos0_only() {
            // QoS 0 only and overflowed: rejoin the live stream, dropping the gap.
            skipped(session, feed.from - cur);
            cur = feed.from;
        }
        if feed.from > cur || ready.len() >= READY_HIGH {
            self.pending.insert(key);
            return;
        }
        let next = b.next;
        // Matched as the window takes them (see `ready.rs`).
        ready.push_run(feed.batch, feed.picks, cur);
        session.cursors.insert(key, next);
    }

    /// Catches lagging cursors up by pulling, while there is room.
    pub async fn fill_ready<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
        ready: &mut ReadyQueue,
    ) {
        while ready.len() < READY_LOW {
            let Some(key) = self.pending.iter().next().cloned() else {
                return;
            };
            let cur = session.cursors.get(&key).copied().unwrap_or(0);
            if !self.skipping.contains(&key)
                && let Some(b) = shared.router.recent(&key.0, key.1, cur)
            {
                // Near the end: what the router read lately, shared with every
                // session behind it, instead of a read of the log of our own.
                let next = b.next;
                ready.push_run(b, None, cur);
                session.cursors.insert(key.clone(), next);
                self.far_behind = false;
                continue;
            }
            let r = read_log(&*shared.api, &key.0, key.1, cur, PULL_BATCH, Duration::ZERO).await;
            match r {
                Ok(r) => {
                    if self.skipping.remove(&key) && session.qos0_only() && r.max_offset > cur {
                        // QoS 0 only and overflowed: drop the backlog, go on live.
                        skipped(session, r.max_offset - cur);
                        session.cursors.insert(key.clone(), r.max_offset);
                        self.pending.remove(&key);
                        continue;
                    }
                    if !r.messages.is_empty() {
                        // Which sessions read the log on their own, and how far behind
                        // (`RUST_LOG=rocketgate_mqtt::follow=debug`; docs/benchmarks.md,
                        // "The QoS 0 fan-out's ramp").
                        tracing::debug!(
                            session = self.inbox.id,
                            topic = %key.0,
                            queue = key.1,
                            from = cur,
                            to = r.next_offset,
                            behind = r.max_offset.saturating_sub(r.next_offset),
                            "a catch-up read from the log"
                        );
                        let batch = batch_of(key.0.clone(), key.1, cur, r.next_offset, r.messages);
                        ready.push_run(Arc::new(batch), None, cur);
                    }
                    session.cursors.insert(key.clone(), r.next_offset);
                    self.far_behind = r.max_offset.saturating_sub(r.next_offset) > FAR_BEHIND;
                    let done =
                        r.status == PullStatus::NoNewMessage || r.next_offset >= r.max_offset;
                    if done || r.next_offset == cur && r.status != PullStatus::Found {
                        self.pending.remove(&key);
                    }
                }
                Err(e) => {
                    tracing::debug!(topic = %key.0, queue = key.1, error = %e, "catch-up pull failed");
                    self.pending.remove(&key);
                }
            }
        }
    }

    /// Where each followed queue is settled up to: the cursor, or the oldest
    /// message of it still waiting or in flight.
    fn positions(session: &Session, ready: &ReadyQueue) -> foldhash::HashMap<Key, u64> {
        let mut pos = session.cursors.clone();
        let sources = session
            .inflight
            .values()
            .filter_map(|f| match &f.source {
                Source::Log {
                    topic,
                    queue,
                    offset,
                } => Some((topic, *queue, *offset)),
                _ => None,
            })
            .chain(ready.log_positions());
        for (topic, queue, offset) in sources {
            let e = pos.entry((topic.clone(), queue)).or_insert(offset);
            *e = (*e).min(offset);
        }
        pos
    }

    /// Commits the settled positions as the session group's core offsets.
    pub async fn commit<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
        ready: &mut ReadyQueue,
    ) {
        if session.expiry == 0 {
            return;
        }
        self.adopt_resets(shared, session, ready).await;
        for ((topic, q), offset) in Self::positions(session, ready) {
            if session.committed.get(&(topic.clone(), q)) == Some(&Some(offset)) {
                continue;
            }
            match shared
                .api
                .commit_offset(&session.group, "", &topic, q, offset)
                .await
            {
                Ok(()) => {
                    session.committed.insert((topic, q), Some(offset));
                }
                Err(e) => {
                    tracing::debug!(topic = %topic, queue = q, error = %e, "committing an offset failed")
                }
            }
        }
    }

    /// Leaves the router; messages not yet sent go back to the cursors (they
    /// are read again on resumption).
    pub async fn detach<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
        ready: &mut ReadyQueue,
    ) {
        self.commit(shared, session, ready).await;
        let waiting = ready.take();
        for (topic, queue, offset) in waiting.log_positions() {
            let c = session
                .cursors
                .entry((topic.clone(), queue))
                .or_insert(offset);
            *c = (*c).min(offset);
        }
        // In-flight log messages stay in the session (resent on resumption); the
        // cursors above already point past them, so they are not read twice.
        for t in std::mem::take(&mut self.joined) {
            shared.router.leave(&t, self.inbox.id);
        }
        self.skipping.clear();
    }
}

/// Counts log entries a QoS 0 session skipped because it could not keep up.
fn skipped(session: &Session, n: u64) {
    if n == 0 {
        return;
    }
    metrics::counter!("rocketgate_mqtt_qos0_skipped_total").increment(n);
    tracing::debug!(client = %session.client_id, entries = n, "QoS 0 subscriber too slow: skipped ahead");
}
