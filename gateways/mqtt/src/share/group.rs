//! A shared group's task on this node: the one owner of the group's cursors, of
//! who holds which message, and of its committed positions (see the parent
//! module's docs).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rocketgate_core::broker::{
    ConsumeMode, Delivered, Heartbeat, MessagingApi, PullStatus, Subscription,
};
use tokio::sync::{Notify, mpsc};

use super::{Cmd, Key, Offer, Offered, Registry};
use crate::router::{Batch, Feed, Inbox, Interest, mqtt_name, mqtt_names, read_log};
use crate::topic::TopicFilter;
use rocketgate_core::sync::lock;

/// Read no more live batches while this many messages wait for a member.
const WAITING_HIGH: usize = 2048;
/// Catch up by pulling while fewer than this many wait.
const WAITING_LOW: usize = 512;
const PULL_BATCH: usize = 256;
/// Pulls per turn of the group's loop, so commands are not held up behind a long
/// catch-up (a backlog the filter mostly rejects adds nothing to `waiting`).
const PULLS_PER_TURN: usize = 8;
/// How often a group commits its positions.
const COMMIT_EVERY: Duration = Duration::from_secs(1);

struct Member {
    id: u64,
    offers: mpsc::Sender<Offer>,
    credit: usize,
    /// Handed out and not settled.
    holding: usize,
    /// Its channel was full: skipped until it settles something.
    blocked: bool,
    client_slow: Arc<AtomicBool>,
    /// Its subscription is QoS 0.
    at_most_once: Arc<AtomicBool>,
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
    /// Missed live batches while every member took QoS 0 only: rejoins the live
    /// stream at the next batch, dropping the gap (see [`Group::recheck`]).
    skipping: bool,
    /// Read and not settled, by offset; the first key is the group's position.
    out: BTreeMap<u64, Out>,
}

impl QueueState {
    fn position(&self) -> u64 {
        self.out.keys().next().copied().unwrap_or(self.cursor)
    }
}

/// A shared group's task on this node (see the module docs).
pub(super) struct Group<B> {
    /// Where the group finds the core and the router, and unregisters itself.
    registry: Arc<Registry<B>>,
    key: Key,
    filter: TopicFilter,
    inbox: Inbox,
    queues: BTreeMap<u32, QueueState>,
    members: Vec<Member>,
    /// Round-robin position in `members`.
    turn: usize,
    waiting: VecDeque<Offered>,
    committed: HashMap<u32, u64>,
    /// The queue the next catch-up pull starts looking from.
    pull_from: u32,
    /// The queues the core assigns this door (`None`: not known, or the core
    /// cannot say: every queue).
    assigned: Option<BTreeSet<u32>>,
    /// The topic did not exist at the last rebalance: its first batch asks
    /// the core again at once.
    topic_missing: bool,
    rebalance_soon: bool,
    /// An ordered (FIFO) group: a queue's messages go to one member at a time,
    /// the next member only once everything it was given is settled (read from
    /// the core group's setting at start and at every join).
    fifo: bool,
}

impl<B: MessagingApi + 'static> Group<B> {
    pub(super) async fn run(
        registry: Arc<Registry<B>>,
        key: Key,
        filter: TopicFilter,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
        inbox_id: u64,
    ) {
        let (tx, mut batches) = mpsc::channel::<Feed>(64);
        let lagged = Arc::new(Notify::new());
        let inbox = Inbox {
            id: inbox_id,
            tx,
            lagged: lagged.clone(),
            overflowed: Default::default(),
            client_slow: Default::default(),
        };
        let mut g = Group {
            registry,
            key,
            filter,
            inbox,
            queues: BTreeMap::new(),
            members: Vec::new(),
            turn: 0,
            waiting: VecDeque::new(),
            committed: HashMap::new(),
            pull_from: 0,
            assigned: None,
            topic_missing: false,
            rebalance_soon: false,
            fifo: false,
        };
        g.read_fifo().await;
        g.rebalance().await;
        g.add_queues().await;
        // Every message of the topic: the group matches its own filter (wildcards).
        g.registry
            .router
            .join(&g.key.1, g.inbox.clone(), Interest::All);
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
                    g.on_batch(&b.batch);
                    while g.waiting.len() < WAITING_HIGH && let Ok(b) = batches.try_recv() {
                        g.on_batch(&b.batch);
                    }
                }
                _ = lagged.notified() => g.recheck().await,
                _ = tick.tick() => {
                    g.rebalance().await;
                    g.commit().await;
                }
                // More to read from the log: go round again, after letting
                // the other tasks of this worker run.
                _ = std::future::ready(()), if g.reading() => tokio::task::yield_now().await,
            }
            if g.rebalance_soon {
                g.rebalance_soon = false;
                g.rebalance().await;
            }
            if g.members.is_empty() && g.end(&mut cmds).await {
                break;
            }
        }
        g.registry.router.leave(&g.key.1, g.inbox.id);
    }

    /// Tells the core this door serves the group (a heartbeat) and asks which
    /// of the topic's queues are this door's; queues it lost are committed and
    /// dropped (what members hold of them may still be acknowledged), queues
    /// it gained are followed from the group's committed offset.
    async fn rebalance(&mut self) {
        let (group, topic) = (self.key.0.clone(), self.key.1.clone());
        let api = &self.registry.api;
        let hb = Heartbeat {
            group: group.clone(),
            member: self.registry.member.clone(),
            mode: ConsumeMode::Clustering,
            subscriptions: vec![Subscription::tag(&*topic, "*")],
        };
        let assigned = match api.heartbeat(hb).await {
            Ok(()) => match api.assignment(&group, &self.registry.member, &topic).await {
                Ok(a) => {
                    self.topic_missing = false;
                    Some(a.into_iter().collect::<BTreeSet<u32>>())
                }
                // Not created yet: nothing is this door's until the core says
                // so (taken as everything, the first messages went to a member
                // on every door).
                Err(rocketgate_core::Error::TopicNotFound { .. }) => {
                    self.topic_missing = true;
                    Some(BTreeSet::new())
                }
                Err(_) => None,
            },
            Err(_) => None,
        };
        if assigned == self.assigned {
            return;
        }
        self.assigned = assigned;
        let lost: Vec<u32> = self
            .queues
            .keys()
            .copied()
            .filter(|q| !self.owns(*q))
            .collect();
        for q in lost {
            let Some(qs) = self.queues.remove(&q) else {
                continue;
            };
            let at = qs.position();
            if self.committed.get(&q) != Some(&at) {
                let _ = api.commit_offset(&group, "", &topic, q, at).await;
            }
            self.committed.remove(&q);
            for o in qs.out.into_values() {
                if let Some(m) = o
                    .member
                    .and_then(|id| self.members.iter_mut().find(|m| m.id == id))
                {
                    m.holding = m.holding.saturating_sub(1);
                    m.blocked = false;
                }
            }
            self.waiting.retain(|w| w.queue != q);
        }
        self.add_queues().await;
    }

    /// Whether queue `q` is this door's to serve.
    fn owns(&self, q: u32) -> bool {
        self.assigned.as_ref().is_none_or(|a| a.contains(&q))
    }

    /// No member left: commits, and ends unless a join came in meanwhile.
    async fn end(&mut self, cmds: &mut mpsc::UnboundedReceiver<Cmd>) -> bool {
        self.commit().await;
        let next = {
            let mut reg = lock(&self.registry.groups);
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
            None => {
                let _ = self
                    .registry
                    .api
                    .unregister(&self.key.0, &self.registry.member)
                    .await;
                true
            }
        }
    }

    /// Starts following queues it does not know yet: at the group's committed
    /// offset, else at the oldest stored message (a new group starts at
    /// `earliest`, as on every door — docs/broker.md "Where a new group starts";
    /// a subscriber's `start` user property moved the committed offsets before it
    /// joined), and a queue that appeared after the group started is all new to it.
    async fn add_queues(&mut self) {
        let (group, topic) = (&self.key.0, &*self.key.1);
        let Ok(config) = self.registry.api.topic(topic).await else {
            return; // not created yet: its queues appear in router batches
        };
        let mut offsets = Vec::new();
        for q in 0..config.read_queues {
            if self.queues.contains_key(&q) || !self.owns(q) {
                continue;
            }
            let committed = self
                .registry
                .api
                .query_offset(group, "", topic, q)
                .await
                .ok()
                .flatten();
            offsets.push((q, committed));
        }
        for (q, committed) in offsets {
            if let Some(at) = committed {
                // Known as the core has it, so a later change is seen as a reset.
                self.committed.insert(q, at);
            }
            let (cursor, catching_up) = match committed {
                Some(at) => (at, true),
                None => (0, true),
            };
            // Not marked committed: the first commit writes it, so a new group's
            // start is durable too (it resumes there, not at the end, next time).
            self.queues.insert(
                q,
                QueueState {
                    cursor,
                    catching_up,
                    ..QueueState::default()
                },
            );
        }
    }

    /// Whether the core group is an ordered (FIFO) one.
    async fn read_fifo(&mut self) {
        self.fifo = self
            .registry
            .api
            .group_info(&self.key.0)
            .await
            .is_ok_and(|g| g.fifo);
    }

    async fn on_cmd(&mut self, cmd: Cmd) {
        if matches!(cmd, Cmd::Join { .. }) {
            // A member may have opted in (or an operator changed it) since.
            self.read_fifo().await;
        }
        match cmd {
            Cmd::Join {
                member,
                offers,
                credit,
                client_slow,
                at_most_once,
                joined,
            } => {
                self.members.push(Member {
                    id: member,
                    offers,
                    credit,
                    holding: 0,
                    blocked: false,
                    client_slow,
                    at_most_once,
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
            let name = mqtt_name(&Delivered {
                queue_id: queue,
                queue_offset: offset,
                record: record.clone(),
            });
            self.waiting.push_front(Offered {
                queue,
                offset,
                record,
                name: name.unwrap_or_else(|| Arc::from("")),
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
        if self.fifo {
            self.assign_in_order(&mut batches);
        }
        'messages: while !self.fifo
            && let Some(msg) = self.waiting.pop_front()
        {
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
        self.offer(batches);
    }

    /// [`Self::assign`] for an ordered (FIFO) group: a queue's waiting messages,
    /// in queue order, go to the member that holds unsettled messages of that
    /// queue (MQTT delivers a session's messages in order), or to the next member
    /// with credit when none does; a message that cannot go out holds back the
    /// rest of its queue, never another queue.
    fn assign_in_order(&mut self, batches: &mut [Vec<Offered>]) {
        let n = self.members.len();
        let mut holder: HashMap<u32, u64> = HashMap::new();
        for (q, qs) in &self.queues {
            if let Some(m) = qs.out.values().find_map(|o| o.member) {
                holder.insert(*q, m);
            }
        }
        let mut stuck: std::collections::HashSet<u32> = Default::default();
        let mut kept = VecDeque::new();
        while let Some(msg) = self.waiting.pop_front() {
            if stuck.contains(&msg.queue) {
                kept.push_back(msg);
                continue;
            }
            let free = |m: &Member| !m.blocked && m.holding < m.credit;
            let pick = match holder.get(&msg.queue) {
                Some(id) => self
                    .members
                    .iter()
                    .position(|m| m.id == *id)
                    .filter(|&i| free(&self.members[i])),
                None => {
                    // A queue nobody holds goes to the next member in turn.
                    let i = (0..n)
                        .map(|s| (self.turn + s) % n)
                        .find(|&i| free(&self.members[i]));
                    if let Some(i) = i {
                        self.turn = (i + 1) % n;
                    }
                    i
                }
            };
            let Some(i) = pick else {
                stuck.insert(msg.queue);
                kept.push_back(msg);
                continue;
            };
            let m = &mut self.members[i];
            m.holding += 1;
            holder.insert(msg.queue, m.id);
            if let Some(qs) = self.queues.get_mut(&msg.queue)
                && let Some(o) = qs.out.get_mut(&msg.offset)
            {
                o.member = Some(m.id);
            }
            batches[i].push(msg);
        }
        self.waiting = kept;
    }

    /// Sends each member its offer; what a member's connection does not take
    /// waits for a member again.
    fn offer(&mut self, batches: Vec<Vec<Offered>>) {
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
        let owned = self.owns(b.queue);
        let Some(qs) = self.queues.get_mut(&b.queue) else {
            if self.topic_missing {
                // Created since: which queues are this door's? (The messages
                // are read back from the log once it knows.)
                self.rebalance_soon = true;
                return;
            }
            if !owned {
                return; // another door's
            }
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
        if b.from > qs.cursor && qs.skipping {
            // Overflowed (the batches still in the channel come first, then the
            // gap): QoS 0 only rejoins the live stream here.
            qs.skipping = false;
            if at_most_once(&self.members) {
                skipped(&self.key, b.from - qs.cursor);
                qs.cursor = b.from;
            }
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
                take(qs, &mut self.waiting, b.queue, m, name);
            }
        }
    }

    /// Missed batches (or a reader started): every queue reads from the log
    /// until it has caught up; queues that appeared are followed. A group whose
    /// members all take QoS 0 and whose channel overflowed does not read the
    /// backlog back (MQTT lets QoS 0 be dropped; a plain QoS 0 session does the
    /// same): each queue rejoins the live stream at the next batch, so a group
    /// that cannot keep up with a flood stays seconds, not minutes, behind.
    async fn recheck(&mut self) {
        let overflowed = self.inbox.overflowed.swap(false, Ordering::AcqRel);
        let skip = overflowed && at_most_once(&self.members);
        self.add_queues().await;
        for qs in self.queues.values_mut() {
            qs.catching_up = !skip;
            qs.skipping = skip;
        }
    }

    /// True while a lagging queue can be read now.
    fn reading(&self) -> bool {
        self.waiting.len() < WAITING_LOW
            && !self.members.is_empty()
            && self.queues.values().any(|q| q.catching_up)
    }

    /// Reads lagging queues from the log while few messages wait (a few pulls
    /// per turn).
    async fn catch_up(&mut self) {
        for _ in 0..PULLS_PER_TURN {
            if self.waiting.len() >= WAITING_LOW || self.members.is_empty() {
                return;
            }
            // Round the lagging queues, so one busy queue does not keep
            // the others behind.
            let lagging = |(_, qs): &(&u32, &QueueState)| qs.catching_up;
            let next = self
                .queues
                .range(self.pull_from..)
                .find(lagging)
                .or_else(|| self.queues.iter().find(lagging));
            let Some((&q, qs)) = next else {
                return;
            };
            self.pull_from = q + 1;
            let cursor = qs.cursor;
            let r = read_log(
                &*self.registry.api,
                &self.key.1,
                q,
                cursor,
                PULL_BATCH,
                Duration::ZERO,
            )
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
            let names: Vec<Option<Arc<str>>> = mqtt_names(&r.messages);
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
                    take(qs, &mut self.waiting, q, m, &name);
                }
            }
        }
    }

    /// Commits each queue's position (its first unsettled offset) as the
    /// clustering group's consumer offset.
    async fn commit(&mut self) {
        self.adopt_resets().await;
        let (group, topic) = (&self.key.0, &*self.key.1);
        for (q, qs) in &self.queues {
            let at = qs.position();
            if self.committed.get(q) == Some(&at) {
                continue;
            }
            match self
                .registry
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

    /// Nothing but this task and an operator write the group's offsets: a core
    /// offset other than the one last committed is a reset
    /// (`POST /v1/groups/{group}/offsets/reset`), and the queue moves there.
    /// What members hold of it may still be acknowledged but no longer holds
    /// the position back.
    async fn adopt_resets(&mut self) {
        let (group, topic) = (self.key.0.clone(), self.key.1.clone());
        let known: Vec<(u32, u64)> = self.committed.iter().map(|(q, at)| (*q, *at)).collect();
        for (q, mine) in known {
            let Ok(Some(core)) = self.registry.api.query_offset(&group, "", &topic, q).await else {
                continue;
            };
            if core == mine {
                continue;
            }
            tracing::info!(group = %group, topic = %topic, queue = q, from = mine, to = core, "a shared group adopts an offset reset");
            if let Some(qs) = self.queues.get_mut(&q) {
                for o in std::mem::take(&mut qs.out).into_values() {
                    if let Some(m) = o
                        .member
                        .and_then(|id| self.members.iter_mut().find(|m| m.id == id))
                    {
                        m.holding = m.holding.saturating_sub(1);
                        m.blocked = false;
                    }
                }
                qs.cursor = core;
                qs.catching_up = true;
            }
            self.waiting.retain(|w| w.queue != q);
            self.committed.insert(q, core);
        }
    }
}

/// True when every member's subscription is QoS 0: the group may then drop
/// messages it cannot keep up with instead of catching up.
fn at_most_once(members: &[Member]) -> bool {
    !members.is_empty()
        && members
            .iter()
            .all(|m| m.at_most_once.load(Ordering::Acquire))
}

/// Counts log entries a QoS 0 group skipped (with plain sessions' skips).
fn skipped(key: &Key, n: u64) {
    metrics::counter!("rocketgate_mqtt_qos0_skipped_total").increment(n);
    tracing::debug!(group = %key.0, topic = %key.1, entries = n, "QoS 0 shared group too slow: skipped ahead");
}

/// A message read for the group (live or from the log): unsettled until a member
/// settles it, and waiting for one.
fn take(
    qs: &mut QueueState,
    waiting: &mut VecDeque<Offered>,
    queue: u32,
    m: &Delivered,
    name: &Arc<str>,
) {
    qs.out.insert(
        m.queue_offset,
        Out {
            member: None,
            record: m.record.clone(),
        },
    );
    waiting.push_back(Offered {
        queue,
        offset: m.queue_offset,
        record: m.record.clone(),
        name: name.clone(),
    });
}
