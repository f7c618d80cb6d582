//! Shared subscriptions (`$share/<g>/<filter>`): each message to one member of
//! the group, fed from the router's live batches.
//!
//! One task per (core group, core topic) on this node, a [`Group`]: an actor fed
//! by one command channel (joins, settlements, leaves) and by the router like a
//! session. It keeps one cursor per core queue, matches each message against the
//! group's filter once (the router already worked out the MQTT name), and hands
//! the matching ones out round-robin to members that have credit, one `Vec` per
//! member per router batch. Every message handed out is kept (a `Bytes` of the
//! stored record) until its member settles it (PUBACK / PUBCOMP, sent at QoS 0,
//! or discarded); the lowest unsettled offset of each queue is committed as the
//! consumer offset of the core clustering group `mqtt%s%<g>/<filter>`, so a
//! restart resumes there (at-least-once for what was in flight). A member that
//! leaves (disconnect, unsubscribe, take-over) gives back what it had not
//! settled, and that goes to the other members. When the last member leaves,
//! the task commits and ends; the next member starts a new one at the committed
//! offsets.
//!
//! A group falls back to pulling from the log (like a session that lagged) when
//! it missed router batches or its members have no credit left, so a slow group
//! never holds more than a bounded number of messages and never slows the
//! router. Why this and not the core's POP is in docs/mqtt.md ("Shared
//! subscriptions").

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mqttbytes::QoS;
use mqttbytes::v5::Publish;
use rocketgate_core::broker::{MessagingApi, PullRequest, PullStatus, filter::Filter};
use rocketgate_core::store::RecordView;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::codec::Version;
use crate::conn::Conn;
use crate::deliver::{Ready, min_qos};
use crate::message::{self, empty_props};
use crate::router::{Batch, Inbox, READER_GROUP, mqtt_name, queue_end};
use crate::server::{Shared, lock};
use crate::session::Source;
use crate::state::share_group;
use crate::topic::TopicFilter;

/// Read no more live batches while this many messages wait for a member.
const WAITING_HIGH: usize = 2048;
/// Catch up by pulling while fewer than this many wait.
const WAITING_LOW: usize = 512;
const PULL_BATCH: usize = 256;
/// How often a group commits its positions.
const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// How long a member waits for its group to take a join or a leave.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// (core group, core topic).
type Key = (String, Arc<str>);

/// The group tasks of this node. One short std lock: a joiner looks up the task
/// and sends its `Join` under it, and a task removes itself under it only after
/// checking its channel is empty, so a join never reaches a task that ends.
#[derive(Default)]
pub(crate) struct Registry(Mutex<HashMap<Key, mpsc::UnboundedSender<Cmd>>>);

/// What a member tells its group. Unbounded: settlements are bounded by the
/// member's credit, joins and leaves by the subscriptions.
pub(crate) enum Cmd {
    Join {
        member: u64,
        offers: mpsc::Sender<Offer>,
        credit: usize,
        /// Set by the member's connection while its client does not read.
        client_slow: Arc<AtomicBool>,
        joined: oneshot::Sender<()>,
    },
    /// Done with these (queue, offset)s.
    Settled { member: u64, done: Vec<(u32, u64)> },
    /// Gone: what it has not settled goes to the other members.
    Leave {
        member: u64,
        left: oneshot::Sender<()>,
    },
}

/// Messages a group hands to one member (one membership of a connection).
pub(crate) struct Offer {
    pub member: u64,
    pub messages: Vec<Offered>,
}

pub(crate) struct Offered {
    pub queue: u32,
    pub offset: u64,
    pub record: Bytes,
    /// The MQTT topic name.
    pub name: String,
}

/// A member's way back to its group; what a shared message's [`Source`] names.
#[derive(Debug)]
pub struct Link {
    pub member: u64,
    tx: mpsc::UnboundedSender<Cmd>,
}

/// One shared subscription of a connection on one core topic.
struct Membership {
    raw: Arc<str>,
    topic: String,
    link: Arc<Link>,
}

/// A connection's side of its shared subscriptions.
pub(crate) struct Members {
    /// Every group this connection is a member of sends here.
    offers: mpsc::Sender<Offer>,
    joined: HashMap<u64, Membership>,
    /// Settled since the last loop turn, sent to the groups in one message each.
    settled: Vec<(Arc<Link>, u32, u64)>,
}

impl Members {
    pub fn new(offers: mpsc::Sender<Offer>) -> Members {
        Members {
            offers,
            joined: HashMap::new(),
            settled: Vec::new(),
        }
    }
}

/// Messages a member may hold unsettled: its client's window plus what waits
/// in its ready queue.
fn credit(window: usize) -> usize {
    window.saturating_add(256).min(2048)
}

impl<B: MessagingApi + 'static> Conn<B> {
    /// Joins the group of a shared subscription for one core topic (starting its
    /// task on this node if it has none). Returns once the group has its start
    /// positions, so a message published after the SUBACK is not missed.
    pub(crate) async fn start_share(&mut self, raw: Arc<str>, topic: String) {
        let known = self
            .shares
            .joined
            .values()
            .any(|m| *m.raw == *raw && m.topic == topic);
        if known {
            return;
        }
        let Some(sub) = self.session.subs.iter().find(|s| *s.filter.raw == *raw) else {
            return;
        };
        let share = sub.filter.share.clone().unwrap_or_default();
        let group = share_group(&share, &sub.filter.filter);
        let filter = sub.filter.clone();
        let member = self.shared.next_id();
        let (joined, answer) = oneshot::channel();
        let join = Cmd::Join {
            member,
            offers: self.shares.offers.clone(),
            credit: credit(self.client_receive_max),
            client_slow: self.inbox.client_slow.clone(),
            joined,
        };
        let tx = join_group(
            &self.shared,
            (group, Arc::from(topic.as_str())),
            filter,
            join,
        );
        if tokio::time::timeout(ANSWER_WAIT, answer).await.is_err() {
            tracing::warn!(client = %self.session.client_id, filter = %raw, "a shared group did not answer a join in time");
        }
        let link = Arc::new(Link { member, tx });
        self.shares
            .joined
            .insert(member, Membership { raw, topic, link });
    }

    /// Messages a group handed to this connection become ready to send.
    pub(crate) fn on_offer(&mut self, offer: Offer) {
        let Some(m) = self.shares.joined.get(&offer.member) else {
            return; // left meanwhile: the group gave these to others
        };
        let link = m.link.clone();
        let Some(sub) = self.session.subs.iter().find(|s| *s.filter.raw == *m.raw) else {
            return;
        };
        let (sub_qos, sub_id) = (sub.qos, sub.id);
        let v5 = self.version == Version::V5;
        let now = message::now_ms();
        for o in offer.messages {
            let Ok(view) = RecordView::parse(&o.record) else {
                self.shares.settled.push((link.clone(), o.queue, o.offset));
                continue;
            };
            let mut props = empty_props();
            let meta = message::read_meta(view.properties(), v5.then_some(&mut props));
            let Ok(expiry) = message::remaining_expiry(meta.expiry_at, now) else {
                self.shares.settled.push((link.clone(), o.queue, o.offset));
                continue;
            };
            props.message_expiry_interval = expiry;
            props.subscription_identifiers = sub_id.into_iter().collect();
            let publish = Publish {
                dup: false,
                qos: min_qos(sub_qos, meta.qos.unwrap_or(QoS::ExactlyOnce)),
                retain: false,
                topic: o.name,
                pkid: 0,
                payload: o.record.slice_ref(view.body()),
                properties: v5.then_some(props),
            };
            self.ready.push_back(Ready {
                publish,
                source: Source::Share {
                    link: link.clone(),
                    queue: o.queue,
                    offset: o.offset,
                },
            });
        }
    }

    /// A shared message is done with (acknowledged, sent at QoS 0, or discarded).
    pub(crate) fn settle_shared(&mut self, link: Arc<Link>, queue: u32, offset: u64) {
        self.shares.settled.push((link, queue, offset));
    }

    /// Tells each group what this connection settled since the last turn.
    pub(crate) fn settle_acks(&mut self) {
        let mut settled = std::mem::take(&mut self.shares.settled).into_iter();
        let Some((mut link, q, o)) = settled.next() else {
            return;
        };
        let mut done = vec![(q, o)];
        for (l, q, o) in settled {
            if !Arc::ptr_eq(&l, &link) {
                let batch = std::mem::take(&mut done);
                send_settled(&link, batch);
                link = l;
            }
            done.push((q, o));
        }
        send_settled(&link, done);
    }

    /// Leaves the groups of a shared subscription that was removed; its messages
    /// not yet sent go to the other members.
    pub(crate) async fn leave_shares_of(&mut self, raw: &str) {
        let ids: Vec<u64> = self
            .shares
            .joined
            .iter()
            .filter(|(_, m)| *m.raw == *raw)
            .map(|(id, _)| *id)
            .collect();
        self.ready.retain(
            |r| !matches!(&r.source, Source::Share { link, .. } if ids.contains(&link.member)),
        );
        self.leave(ids).await;
    }

    /// Leaves every group (the connection ends). Messages in flight and ready
    /// go to the other members; the session does not keep them.
    pub(crate) async fn leave_all_shares(&mut self) {
        self.ready
            .retain(|r| !matches!(r.source, Source::Share { .. }));
        self.session
            .inflight
            .retain(|_, f| !matches!(f.source, Source::Share { .. }));
        let ids: Vec<u64> = self.shares.joined.keys().copied().collect();
        self.leave(ids).await;
    }

    async fn leave(&mut self, ids: Vec<u64>) {
        // Settlements first (the channel keeps order), so nothing already
        // acknowledged is given to another member.
        self.settle_acks();
        let mut answers = Vec::new();
        for id in ids {
            if let Some(m) = self.shares.joined.remove(&id) {
                let (left, answer) = oneshot::channel();
                if m.link.tx.send(Cmd::Leave { member: id, left }).is_ok() {
                    answers.push(answer);
                }
            }
        }
        // Waited for so a clean stop commits the groups' positions before the
        // core writes its offsets.
        for a in answers {
            let _ = tokio::time::timeout(ANSWER_WAIT, a).await;
        }
    }
}

fn send_settled(link: &Link, done: Vec<(u32, u64)>) {
    let _ = link.tx.send(Cmd::Settled {
        member: link.member,
        done,
    });
}

/// Sends `join` to the group's task, starting one if the group has none here.
fn join_group<B: MessagingApi + 'static>(
    shared: &Arc<Shared<B>>,
    key: Key,
    filter: TopicFilter,
    join: Cmd,
) -> mpsc::UnboundedSender<Cmd> {
    let mut reg = lock(&shared.shares.0);
    let join = match reg.get(&key) {
        Some(tx) => match tx.send(join) {
            Ok(()) => return tx.clone(),
            Err(mpsc::error::SendError(join)) => join, // ended without unregistering
        },
        None => join,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(join);
    reg.insert(key.clone(), tx.clone());
    tokio::spawn(Group::run(shared.clone(), key, filter, rx));
    tx
}

struct Member {
    id: u64,
    offers: mpsc::Sender<Offer>,
    credit: usize,
    /// Handed out and not settled.
    holding: usize,
    /// Its channel was full: skipped until it settles something.
    blocked: bool,
    client_slow: Arc<AtomicBool>,
}

/// A message read for the group and not settled yet.
struct Out {
    /// Who has it (`None`: waiting for a member).
    member: Option<u64>,
    record: Bytes,
}

#[derive(Default)]
struct QueueState {
    /// The next queue offset to read.
    cursor: u64,
    /// Missed live batches: reads from the log until it has caught up.
    catching_up: bool,
    /// Read and not settled, by offset; the first key is the group's position.
    out: BTreeMap<u64, Out>,
}

impl QueueState {
    fn position(&self) -> u64 {
        self.out.keys().next().copied().unwrap_or(self.cursor)
    }
}

/// A shared group's task on this node (see the module docs).
struct Group<B> {
    shared: Arc<Shared<B>>,
    key: Key,
    filter: TopicFilter,
    inbox: Inbox,
    queues: BTreeMap<u32, QueueState>,
    members: Vec<Member>,
    /// Round-robin position in `members`.
    turn: usize,
    waiting: VecDeque<Offered>,
    committed: HashMap<u32, u64>,
}

impl<B: MessagingApi + 'static> Group<B> {
    async fn run(
        shared: Arc<Shared<B>>,
        key: Key,
        filter: TopicFilter,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
    ) {
        let (tx, mut batches) = mpsc::channel::<Arc<Batch>>(64);
        let lagged = Arc::new(Notify::new());
        let inbox = Inbox {
            id: shared.next_id(),
            tx,
            lagged: lagged.clone(),
            overflowed: Default::default(),
            client_slow: Default::default(),
        };
        let mut g = Group {
            shared,
            key,
            filter,
            inbox,
            queues: BTreeMap::new(),
            members: Vec::new(),
            turn: 0,
            waiting: VecDeque::new(),
            committed: HashMap::new(),
        };
        g.add_queues(true).await;
        g.shared.router.join(&g.key.1, g.inbox.clone());
        let mut tick = tokio::time::interval(COMMIT_EVERY);
        loop {
            g.assign();
            g.catch_up().await;
            g.assign();
            // While reading the log, live batches are of no use; left in the
            // channel, they overflow it and the router slows the publishers
            // (unless the members' clients are the slow ones), so a group that
            // fell behind catches up instead of falling further behind.
            let room = g.waiting.len() < WAITING_HIGH && !g.queues.values().any(|q| q.catching_up);
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => g.on_cmd(cmd).await,
                    None => break,
                },
                Some(b) = batches.recv(), if room => {
                    g.on_batch(&b);
                    while g.waiting.len() < WAITING_HIGH && let Ok(b) = batches.try_recv() {
                        g.on_batch(&b);
                    }
                }
                _ = lagged.notified() => g.recheck().await,
                _ = tick.tick() => g.commit().await,
            }
            if g.members.is_empty() && g.end(&mut cmds).await {
                break;
            }
        }
        g.shared.router.leave(&g.key.1, g.inbox.id);
    }

    /// No member left: commits, and ends unless a join came in meanwhile.
    async fn end(&mut self, cmds: &mut mpsc::UnboundedReceiver<Cmd>) -> bool {
        self.commit().await;
        let next = {
            let mut reg = lock(&self.shared.shares.0);
            match cmds.try_recv() {
                Ok(cmd) => Some(cmd),
                Err(_) => {
                    reg.remove(&self.key);
                    None
                }
            }
        };
        match next {
            Some(cmd) => {
                self.on_cmd(cmd).await;
                false
            }
            None => true,
        }
    }

    /// Starts following queues it does not know yet: at the group's committed
    /// offset, else at the end of the queue when the group starts (a new group
    /// takes new messages only), else at 0 (the topic or queue appeared after the
    /// group started: all its messages are new to it).
    async fn add_queues(&mut self, starting: bool) {
        let (group, topic) = (&self.key.0, &*self.key.1);
        let Ok(config) = self.shared.api.topic(topic).await else {
            return; // not created yet: its queues appear in router batches
        };
        for q in 0..config.read_queues {
            if self.queues.contains_key(&q) {
                continue;
            }
            let committed = self
                .shared
                .api
                .query_offset(group, "", topic, q)
                .await
                .ok()
                .flatten();
            let (cursor, catching_up) = match committed {
                Some(at) => (at, true),
                None if starting => (
                    queue_end(&*self.shared.api, topic, q).await.unwrap_or(0),
                    false,
                ),
                None => (0, true),
            };
            // Not marked committed: the first commit writes it, so a new group's
            // start is durable too (it resumes there, not at the end, next time).
            self.queues.insert(
                q,
                QueueState {
                    cursor,
                    catching_up,
                    out: BTreeMap::new(),
                },
            );
        }
    }

    async fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Join {
                member,
                offers,
                credit,
                client_slow,
                joined,
            } => {
                self.members.push(Member {
                    id: member,
                    offers,
                    credit,
                    holding: 0,
                    blocked: false,
                    client_slow,
                });
                let _ = joined.send(());
            }
            Cmd::Settled { member, done } => {
                let mut n = 0;
                for (q, offset) in done {
                    if let Some(qs) = self.queues.get_mut(&q)
                        && let Some(o) = qs.out.get(&offset)
                        && o.member == Some(member)
                    {
                        qs.out.remove(&offset);
                        n += 1;
                    }
                }
                if let Some(m) = self.members.iter_mut().find(|m| m.id == member) {
                    m.holding = m.holding.saturating_sub(n);
                    m.blocked = false;
                }
            }
            Cmd::Leave { member, left } => {
                self.drop_member(member);
                if self.members.is_empty() {
                    self.commit().await;
                }
                let _ = left.send(());
            }
        }
    }

    /// Removes a member; what it had not settled waits for the others.
    fn drop_member(&mut self, member: u64) {
        self.members.retain(|m| m.id != member);
        let mut back = Vec::new();
        for (q, qs) in &mut self.queues {
            for (offset, o) in qs.out.iter_mut() {
                if o.member == Some(member) {
                    o.member = None;
                    back.push((*q, *offset, o.record.clone()));
                }
            }
        }
        // Oldest first, ahead of what was read since.
        for (queue, offset, record) in back.into_iter().rev() {
            let name = mqtt_name(&rocketgate_core::broker::Delivered {
                queue_id: queue,
                queue_offset: offset,
                record: record.clone(),
            });
            self.waiting.push_front(Offered {
                queue,
                offset,
                record,
                name: name.map(String::from).unwrap_or_default(),
            });
        }
    }

    /// Hands waiting messages to members with credit, round-robin, one offer
    /// per member.
    fn assign(&mut self) {
        if self.waiting.is_empty() || self.members.is_empty() {
            self.mark_slow();
            return;
        }
        let n = self.members.len();
        let mut batches: Vec<Vec<Offered>> = (0..n).map(|_| Vec::new()).collect();
        'messages: while let Some(msg) = self.waiting.pop_front() {
            for step in 0..n {
                let i = (self.turn + step) % n;
                let m = &mut self.members[i];
                if m.blocked || m.holding >= m.credit {
                    continue;
                }
                m.holding += 1;
                if let Some(qs) = self.queues.get_mut(&msg.queue)
                    && let Some(o) = qs.out.get_mut(&msg.offset)
                {
                    o.member = Some(m.id);
                }
                batches[i].push(msg);
                self.turn = (i + 1) % n;
                continue 'messages;
            }
            self.waiting.push_front(msg);
            break;
        }
        let mut gone = Vec::new();
        for (i, messages) in batches.into_iter().enumerate() {
            if messages.is_empty() {
                continue;
            }
            let m = &mut self.members[i];
            let offer = Offer {
                member: m.id,
                messages,
            };
            if let Err(e) = m.offers.try_send(offer) {
                // Its connection is not taking offers now: the messages wait
                // for a member again.
                m.blocked = true;
                let offer = match e {
                    mpsc::error::TrySendError::Full(o) => o,
                    mpsc::error::TrySendError::Closed(o) => {
                        // The connection ended without leaving (its task failed).
                        gone.push(m.id);
                        o
                    }
                };
                m.holding = m.holding.saturating_sub(offer.messages.len());
                for msg in offer.messages.into_iter().rev() {
                    if let Some(qs) = self.queues.get_mut(&msg.queue)
                        && let Some(o) = qs.out.get_mut(&msg.offset)
                    {
                        o.member = None;
                    }
                    self.waiting.push_front(msg);
                }
            }
        }
        for id in gone {
            self.drop_member(id);
        }
        self.mark_slow();
    }

    /// Tells the router whether an overflow of this group's channel is its
    /// clients' doing (every member is out of credit and its client does not
    /// read) or the node's (members' clients read, but the node does not get
    /// round to them: publishers should pause, as for a session).
    fn mark_slow(&self) {
        let clients = self
            .members
            .iter()
            .all(|m| (m.blocked || m.holding >= m.credit) && m.client_slow.load(Ordering::Acquire));
        self.inbox.client_slow.store(clients, Ordering::Release);
    }

    /// Takes the matching messages of a live batch, or falls back to reading the
    /// log when the batch does not start where the group is.
    fn on_batch(&mut self, b: &Batch) {
        let Some(qs) = self.queues.get_mut(&b.queue) else {
            // A queue first seen now (the topic was created after the group
            // started): all its messages are new to the group.
            self.queues.insert(
                b.queue,
                QueueState {
                    catching_up: true,
                    ..QueueState::default()
                },
            );
            return;
        };
        if qs.catching_up || b.next <= qs.cursor {
            return;
        }
        if b.from > qs.cursor || self.waiting.len() >= WAITING_HIGH {
            qs.catching_up = true;
            return;
        }
        let cursor = qs.cursor;
        qs.cursor = b.next;
        for (m, name) in b.messages.iter().zip(&b.names) {
            if m.queue_offset >= cursor
                && let Some(name) = name
                && self.filter.matches(name)
            {
                qs.out.insert(
                    m.queue_offset,
                    Out {
                        member: None,
                        record: m.record.clone(),
                    },
                );
                self.waiting.push_back(Offered {
                    queue: b.queue,
                    offset: m.queue_offset,
                    record: m.record.clone(),
                    name: name.to_string(),
                });
            }
        }
    }

    /// Missed batches (or a reader started): every queue reads from the log
    /// until it has caught up; queues that appeared are followed.
    async fn recheck(&mut self) {
        self.inbox.overflowed.store(false, Ordering::Release);
        self.add_queues(false).await;
        for qs in self.queues.values_mut() {
            qs.catching_up = true;
        }
    }

    /// Reads lagging queues from the log while few messages wait.
    async fn catch_up(&mut self) {
        while self.waiting.len() < WAITING_LOW && !self.members.is_empty() {
            let Some((&q, qs)) = self.queues.iter().find(|(_, qs)| qs.catching_up) else {
                return;
            };
            let cursor = qs.cursor;
            let r = self
                .shared
                .api
                .pull(PullRequest {
                    group: READER_GROUP.into(),
                    member: String::new(),
                    topic: self.key.1.to_string(),
                    queue_id: q,
                    offset: cursor,
                    max_messages: PULL_BATCH,
                    filter: Filter::all(),
                    wait: Duration::ZERO,
                })
                .await;
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(topic = %self.key.1, queue = q, error = %e, "shared group catch-up pull failed");
                    if let Some(qs) = self.queues.get_mut(&q) {
                        qs.catching_up = false;
                    }
                    continue;
                }
            };
            let done = r.status == PullStatus::NoNewMessage
                || r.next_offset >= r.max_offset
                || (r.next_offset == cursor && r.status != PullStatus::Found);
            let names: Vec<Option<Box<str>>> = r.messages.iter().map(mqtt_name).collect();
            let Some(qs) = self.queues.get_mut(&q) else {
                return;
            };
            qs.cursor = r.next_offset.max(cursor);
            qs.catching_up = !done;
            for (m, name) in r.messages.iter().zip(names) {
                if m.queue_offset >= cursor
                    && let Some(name) = name
                    && self.filter.matches(&name)
                {
                    qs.out.insert(
                        m.queue_offset,
                        Out {
                            member: None,
                            record: m.record.clone(),
                        },
                    );
                    self.waiting.push_back(Offered {
                        queue: q,
                        offset: m.queue_offset,
                        record: m.record.clone(),
                        name: String::from(name),
                    });
                }
            }
        }
    }

    /// Commits each queue's position (its first unsettled offset) as the
    /// clustering group's consumer offset.
    async fn commit(&mut self) {
        let (group, topic) = (&self.key.0, &*self.key.1);
        for (q, qs) in &self.queues {
            let at = qs.position();
            if self.committed.get(q) == Some(&at) {
                continue;
            }
            match self
                .shared
                .api
                .commit_offset(group, "", topic, *q, at)
                .await
            {
                Ok(()) => {
                    self.committed.insert(*q, at);
                }
                Err(e) => {
                    tracing::debug!(group = %group, topic = %topic, queue = q, error = %e, "committing a shared group's offset failed")
                }
            }
        }
    }
}
