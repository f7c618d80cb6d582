//! One reader per (core topic, queue), handing each batch it reads to the
//! connected sessions that follow the topic (rumqttd's router idea), instead of
//! every session long-polling the same queue.
//!
//! **Who gets what.** The router keeps an index from exact MQTT topic name to the
//! sessions whose filters on that core topic are all exact ([`Interest::Names`]):
//! such a session is handed only the messages of a batch with one of its names
//! (in point-to-point use many sessions follow one core topic and match one tag
//! each; without the index each of them looked at every record). A session with
//! any wildcard filter on the topic ([`Interest::All`]) is handed every message.
//! The reader works out each message's MQTT name once per batch.
//!
//! **Cursors.** A [`Feed`] says which range of the queue it covers: `from` is
//! where the previous feed to that session ended, so the messages skipped in
//! between (none of them for the session) are covered too, and a session's
//! cursor still moves past records not for it. A session that is exactly at a
//! feed's `from` takes its messages and moves to the batch's end; one that is
//! behind (it was offline, had a feed dropped, or follows a topic that just
//! appeared) catches up by pulling from its own cursor, then rejoins. A session
//! handed nothing for a while gets an empty feed now and then, so its committed
//! offset does not stay far behind.
//!
//! **Backpressure.** A session whose channel is full although its client reads
//! (the node, not the client, is slow) is waited for (up to a second): the reader
//! slows down, and so do the publishers, which wait until the reader has handed
//! out what they stored (see [`Router::wait_handed`]) before reading more from
//! their sockets. So a publisher goes only as fast as the sessions of its topic
//! drain, as with a broker that forwards inline, instead of the node storing
//! what it then cannot deliver (QoS 0 publishers have no window). A session whose
//! client does not read (its outgoing socket is full, or its QoS 1/2 window is)
//! is never waited for: its feed is dropped and it is told it lagged (and that it
//! overflowed, so a session that only takes QoS 0 can skip ahead instead of
//! catching up, see `follow.rs`).
//!
//! The router also watches the topic list, so subscriptions whose first level is a
//! wildcard see new core topics as they appear, and each topic's reader looks once
//! a second whether the topic got more queues: a new queue is read from its start
//! (everything in it is newer than the sessions following the topic).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketgate_core::broker::{
    Delivered, MessagingApi, PullRequest, PullStatus, TopicKind, filter::Filter,
};
use rocketgate_core::store::RecordView;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use rocketgate_core::sync::lock;

/// Messages read from one queue: offsets `from..next` (some may be absent from
/// `messages` only if the core skipped them).
#[derive(Debug)]
pub struct Batch {
    pub topic: Arc<str>,
    pub queue: u32,
    pub from: u64,
    pub next: u64,
    pub messages: Vec<Delivered>,
    /// The MQTT topic name of each message (`None`: the record did not parse),
    /// shared by every session it goes to.
    pub names: Vec<Option<Arc<str>>>,
    /// What a 3.1.1 session needs of each message (empty or `None`: it parses
    /// the record itself).
    pub heads: Vec<Option<crate::message::Head>>,
}

/// What one session is handed of a batch.
#[derive(Debug)]
pub struct Feed {
    pub batch: Arc<Batch>,
    /// The session was handed everything of the queue it can match from here to
    /// `batch.next` (where the previous feed to it ended; `batch.from` or before).
    pub from: u64,
    /// The indices in `batch.messages` the session may match (`None`: all of them).
    pub picks: Option<Box<[u32]>>,
}

impl Feed {
    /// The messages of the batch handed to the session, with their MQTT names
    /// and heads (sessions take them through their ready queue, `ready.rs`).
    #[cfg(test)]
    pub fn messages(
        &self,
    ) -> impl Iterator<Item = (&Delivered, Option<&Arc<str>>, Option<&crate::message::Head>)> {
        let b = &*self.batch;
        let all = self.picks.is_none().then_some(0..b.messages.len());
        let picked = self
            .picks
            .iter()
            .flat_map(|p| p.iter().map(|&i| i as usize));
        all.into_iter()
            .flatten()
            .chain(picked)
            .filter_map(move |i| {
                Some((
                    b.messages.get(i)?,
                    b.names.get(i)?.as_ref(),
                    b.heads.get(i).and_then(Option::as_ref),
                ))
            })
    }
}

/// A session's inbox at the router.
#[derive(Clone)]
pub struct Inbox {
    pub id: u64,
    pub tx: mpsc::Sender<Feed>,
    pub lagged: Arc<Notify>,
    /// Set when a feed was dropped because the session's channel was full.
    pub overflowed: Arc<AtomicBool>,
    /// Set by the session while its client does not take messages fast enough
    /// (its outgoing socket or its QoS 1/2 window is full): the reader does not
    /// wait for it, so a client that does not read never slows the publishers.
    pub client_slow: Arc<AtomicBool>,
}

/// A sender whose channel is closed: the inbox of a session that follows no
/// topic yet (one shared placeholder instead of a channel per connection; the
/// session makes its own before it joins the router, and a feed sent here would
/// be discarded like one to a session that ended).
pub fn no_feeds() -> mpsc::Sender<Feed> {
    static CLOSED: std::sync::LazyLock<mpsc::Sender<Feed>> =
        std::sync::LazyLock::new(|| mpsc::channel(1).0);
    CLOSED.clone()
}

/// Which messages of a core topic a session may match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interest {
    /// Every message: a filter with a wildcard must look at each name.
    All,
    /// Only these MQTT names: every plain filter on the topic is exact.
    Names(Vec<Box<str>>),
}

#[derive(Clone)]
struct Member {
    inbox: Inbox,
    interest: Interest,
}

/// The sessions following one core topic and the index over their names.
/// Rebuilt on every join and leave (rare next to batches) and shared read-only
/// with the readers.
#[derive(Default)]
struct Members {
    list: Vec<Member>,
    /// Exact MQTT name -> the members (indices in `list`) wanting it. Looked
    /// up for every message: foldhash, as the other maps of the message path
    /// (SipHash was ~10 % of a message's instructions at light load).
    by_name: foldhash::HashMap<Box<str>, Vec<u32>>,
}

impl Members {
    fn build(list: Vec<Member>) -> Members {
        let mut by_name: foldhash::HashMap<Box<str>, Vec<u32>> = Default::default();
        for (i, m) in list.iter().enumerate() {
            if let Interest::Names(names) = &m.interest {
                for n in names {
                    by_name.entry(n.clone()).or_default().push(i as u32);
                }
            }
        }
        Members { list, by_name }
    }

    /// What each member (of `list`, in order) may match of the batch. A batch
    /// of one MQTT name (a fan-out's usual batch) is handed whole to the members
    /// wanting that name, without a list of indices for each of them (a
    /// thousand subscribers of one topic each held a copy of every batch's
    /// indices: a quarter of a fan-out broker's memory).
    fn pick(&self, batch: &Batch) -> Vec<Pick> {
        let mut picks: Vec<Pick> = self
            .list
            .iter()
            .map(|m| match m.interest {
                Interest::All => Pick::All,
                Interest::Names(_) => Pick::None,
            })
            .collect();
        if self.by_name.is_empty() {
            return picks;
        }
        if let Some(Some(first)) = batch.names.first()
            && batch.names.iter().all(|n| {
                n.as_ref()
                    .is_some_and(|n| Arc::ptr_eq(n, first) || **n == **first)
            })
        {
            for &m in self.by_name.get(&**first).into_iter().flatten() {
                picks[m as usize] = Pick::All;
            }
            return picks;
        }
        for (i, name) in batch.names.iter().enumerate() {
            let Some(ms) = name.as_deref().and_then(|n| self.by_name.get(n)) else {
                continue;
            };
            for &m in ms {
                match &mut picks[m as usize] {
                    Pick::Some(v) => v.push(i as u32),
                    p @ Pick::None => *p = Pick::Some(vec![i as u32]),
                    Pick::All => {}
                }
            }
        }
        picks
    }
}

/// What one member may match of a batch.
enum Pick {
    /// Every message.
    All,
    /// Nothing.
    None,
    /// The messages at these indices.
    Some(Vec<u32>),
}

/// Copy-on-write: the readers take the current `Arc` per batch (one short lock),
/// join and leave swap in a new one. Locked only briefly, never across an await.
type SharedMembers = Arc<Mutex<Arc<Members>>>;

/// How far each reader of a topic has handed out its queue, for the publishers
/// waiting on it.
#[derive(Default)]
pub struct Flow {
    /// Per queue: every entry below this was handed to the sessions (or dropped
    /// for those whose clients do not read). Short lock, never across an await.
    handed: Mutex<Vec<u64>>,
    moved: Notify,
    /// Per queue: the last batches the reader handed out, oldest first, for
    /// sessions catching up near the end (see [`Router::recent`]).
    recent: Mutex<foldhash::HashMap<u32, Recent>>,
    /// Poked by a publisher that stored into the topic before its readers
    /// started: the topic exists now (instead of waiting for the next look).
    appeared: Notify,
}

/// One queue's last batches and how many messages they hold.
#[derive(Default)]
struct Recent {
    batches: VecDeque<Arc<Batch>>,
    messages: usize,
}

impl Flow {
    fn forget(&self, queue: u32) {
        lock(&self.recent).remove(&queue);
    }

    fn remember(&self, batch: &Arc<Batch>) {
        let mut recent = lock(&self.recent);
        let r = recent.entry(batch.queue).or_default();
        r.messages += batch.messages.len();
        r.batches.push_back(batch.clone());
        while r.messages > RECENT_MESSAGES
            && let Some(old) = r.batches.pop_front()
        {
            r.messages -= old.messages.len();
        }
    }

    fn handed(&self, queue: u32) -> Option<u64> {
        lock(&self.handed).get(queue as usize).copied()
    }

    /// Nobody follows the topic any more: publishers waiting on it go on.
    fn close(&self) {
        lock(&self.handed).clear();
        self.moved.notify_waiters();
    }

    fn set(&self, queue: u32, at: u64) {
        if let Some(h) = lock(&self.handed).get_mut(queue as usize) {
            *h = at;
        }
        self.moved.notify_waiters();
    }
}

struct TopicEntry {
    members: SharedMembers,
    flow: Arc<Flow>,
    task: JoinHandle<()>,
}

pub struct Router<B> {
    api: Arc<B>,
    topics: Mutex<HashMap<Arc<str>, TopicEntry>>,
    list: watch::Sender<Arc<Vec<String>>>,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

const READ_BATCH: usize = 256;
/// How often a reader looks again for a followed topic that does not exist yet,
/// unless an MQTT publisher stores into it first (long in unit tests, so that
/// they see the publisher's poke work).
const TOPIC_RETRY: Duration = if cfg!(test) {
    Duration::from_secs(30)
} else {
    Duration::from_millis(200)
};
/// How often a running reader looks whether its topic got more queues (an
/// operator's topic update): their readers start within this.
const QUEUE_RECHECK: Duration = Duration::from_secs(1);
/// Messages a reader keeps per queue after handing them out (in the batches it
/// read, ~100 bytes each: the records stay in the mapped log): a session less
/// than this far behind the end catches up from them instead of reading the log
/// again.
const RECENT_MESSAGES: usize = 32 * 1024;
/// Batches read after the last dropped feed during which the reader keeps them.
const KEEP_AFTER_DROP: usize = 1024;
const WAIT: Duration = Duration::from_secs(10);
pub const READER_GROUP: &str = "mqtt%router";
/// While a reader waits for a session whose channel is full although its client
/// reads, how often it checks that the client still reads (a client that stops
/// reading is not waited for: its feed is dropped and it catches up, or skips
/// ahead at QoS 0).
const SESSION_WAIT: Duration = if cfg!(test) {
    // Long in unit tests, so a slow test machine does not look like a stuck session.
    Duration::from_secs(20)
} else {
    Duration::from_millis(100)
};
/// The longest a reader waits for one session whose client reads (checking
/// every [`SESSION_WAIT`] that it still does), then drops the feed as for a slow
/// client: only a session task that does not run at all gets there. It used to give up after one
/// `SESSION_WAIT` and drop the feeds: under a flood of QoS 0 publishers the
/// reader then ran free, so did the publishers, and they took the node from the
/// subscribers (a shared group of 10 under 1,000 publishers delivered nothing).
const NODE_WAIT: Duration = if cfg!(test) {
    Duration::from_secs(20)
} else {
    Duration::from_secs(1)
};
/// A session handed nothing for this many entries of a queue gets an empty feed,
/// so its cursor (and committed offset) follows the queue.
const PROGRESS_EVERY: u64 = 1024;

impl<B: MessagingApi + 'static> Router<B> {
    pub fn new(api: Arc<B>, topic_poll: Duration) -> Arc<Router<B>> {
        let (list, _) = watch::channel(Arc::new(Vec::new()));
        let router = Arc::new(Router {
            api,
            topics: Mutex::new(HashMap::new()),
            list,
            watcher: Mutex::new(None),
        });
        let weak = Arc::downgrade(&router);
        let task = tokio::spawn(async move {
            loop {
                let Some(r) = weak.upgrade() else { return };
                match r.api.topics(TopicKind::User).await {
                    Ok(topics) => {
                        let mut names: Vec<String> = topics.into_iter().map(|t| t.name).collect();
                        names.sort();
                        if **r.list.borrow() != names {
                            r.list.send_replace(Arc::new(names));
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "listing topics failed"),
                }
                drop(r);
                tokio::time::sleep(topic_poll).await;
            }
        });
        *lock(&router.watcher) = Some(task);
        router
    }

    /// The user topics, refreshed every poll interval.
    pub fn topic_list(&self) -> watch::Receiver<Arc<Vec<String>>> {
        self.list.subscribe()
    }

    /// Follows `topic` for `inbox`, or changes what it wants of it (same id).
    pub fn join(&self, topic: &str, inbox: Inbox, interest: Interest) {
        let mut topics = lock(&self.topics);
        let id = inbox.id;
        let member = Member { inbox, interest };
        if let Some(entry) = topics.get(topic) {
            let mut current = lock(&entry.members);
            let list = current
                .list
                .iter()
                .filter(|m| m.inbox.id != id)
                .cloned()
                .chain(std::iter::once(member))
                .collect();
            *current = Arc::new(Members::build(list));
            return;
        }
        let name: Arc<str> = Arc::from(topic);
        let members: SharedMembers = Arc::new(Mutex::new(Arc::new(Members::build(vec![member]))));
        let flow: Arc<Flow> = Arc::default();
        let task = tokio::spawn(run_topic(
            self.api.clone(),
            name.clone(),
            members.clone(),
            flow.clone(),
        ));
        topics.insert(
            name,
            TopicEntry {
                members,
                flow,
                task,
            },
        );
    }

    /// Waits (at most `max`) until the reader of `queue` of `topic` has handed
    /// out every entry below `offset`. Returns at once when nobody follows the
    /// topic or its reader has not started.
    pub async fn wait_handed(&self, topic: &str, queue: u32, offset: u64, max: Duration) {
        let Some(flow) = lock(&self.topics).get(topic).map(|e| e.flow.clone()) else {
            return;
        };
        if lock(&flow.handed).is_empty() {
            // Followed before it existed: the reader is still looking for it.
            flow.appeared.notify_one();
            return;
        }
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let moved = flow.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if flow.handed(queue).is_none_or(|h| h >= offset) {
                return;
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                return;
            }
        }
    }

    /// A batch the topic's reader handed out lately that holds `offset` of the
    /// queue. A session behind the stream (its feeds were dropped while its
    /// client's window was full) catches up from these first: with a thousand
    /// sessions behind one fan-out, each message is read from the log once for
    /// them all instead of once per session.
    pub fn recent(&self, topic: &str, queue: u32, offset: u64) -> Option<Arc<Batch>> {
        let flow = lock(&self.topics).get(topic)?.flow.clone();
        let recent = lock(&flow.recent);
        recent
            .get(&queue)?
            .batches
            .iter()
            .find(|b| b.from <= offset && offset < b.next)
            .cloned()
    }

    pub fn leave(&self, topic: &str, id: u64) {
        let mut topics = lock(&self.topics);
        let empty = match topics.get(topic) {
            Some(entry) => {
                let mut current = lock(&entry.members);
                let list: Vec<Member> = current
                    .list
                    .iter()
                    .filter(|m| m.inbox.id != id)
                    .cloned()
                    .collect();
                let empty = list.is_empty();
                *current = Arc::new(Members::build(list));
                empty
            }
            None => false,
        };
        if empty && let Some(entry) = topics.remove(topic) {
            entry.task.abort();
            entry.flow.close();
        }
    }

    /// Stops every reader and the topic watcher.
    pub fn stop(&self) {
        for (_, entry) in lock(&self.topics).drain() {
            entry.task.abort();
            entry.flow.close();
        }
        if let Some(w) = lock(&self.watcher).take() {
            w.abort();
        }
    }
}

impl<B> Drop for Router<B> {
    fn drop(&mut self) {
        for (_, entry) in lock(&self.topics).drain() {
            entry.task.abort();
        }
    }
}

/// Waits for the topic to exist, then reads each of its queues.
async fn run_topic<B: MessagingApi + 'static>(
    api: Arc<B>,
    topic: Arc<str>,
    members: SharedMembers,
    flow: Arc<Flow>,
) {
    // A topic that did not exist when its first session joined holds only
    // messages newer than every session following it: its readers start at the
    // beginning, so those sessions take them live instead of each catching up
    // from the log (under a flood that started with the topic, pulling would
    // never overtake the publishers).
    let mut from_start = false;
    let queues = loop {
        match api.topic(&topic).await {
            Ok(c) => break c.read_queues,
            Err(_) => {
                from_start = true;
                // Looked for again when a publisher stores into it, or after a while
                // (a topic made through another door).
                let _ = tokio::time::timeout(TOPIC_RETRY, flow.appeared.notified()).await;
            }
        }
    };
    let mut set = tokio::task::JoinSet::new();
    let mut reading = 0;
    let mut first = true;
    loop {
        let queues = if first {
            first = false;
            queues
        } else {
            tokio::time::sleep(QUEUE_RECHECK).await;
            match api.topic(&topic).await {
                Ok(c) => c.read_queues,
                Err(_) => continue,
            }
        };
        if queues <= reading {
            continue;
        }
        {
            // Until its reader starts, a queue holds no publisher back.
            let mut handed = lock(&flow.handed);
            handed.resize(queues as usize, u64::MAX);
        }
        for q in reading..queues {
            // A queue added while the topic was followed holds only messages
            // newer than every session following it: read from its start (a
            // session that is ahead of a batch skips it).
            set.spawn(read_queue(
                api.clone(),
                topic.clone(),
                q,
                from_start || reading > 0,
                members.clone(),
                flow.clone(),
            ));
        }
        reading = queues;
    }
    // Lives until aborted (dropping the set aborts the readers).
}

/// The end of a queue (where a reader or a new subscription starts), counting every
/// publish already acknowledged (else a new subscriber would get it as new).
pub async fn queue_end<B: MessagingApi>(api: &B, topic: &str, queue: u32) -> Option<u64> {
    api.sync_visible().await;
    let r = read_log(api, topic, queue, u64::MAX, 1, Duration::ZERO)
        .await
        .ok()?;
    Some(r.max_offset)
}

/// Reads a queue of the log as the MQTT door's reader group (no offsets of its
/// own, no filter): what the router's readers, catching-up sessions and shared
/// groups all do.
pub fn read_log<'a, B: MessagingApi>(
    api: &'a B,
    topic: &str,
    queue: u32,
    offset: u64,
    max_messages: usize,
    wait: Duration,
) -> impl Future<Output = rocketgate_core::Result<rocketgate_core::broker::PullResult>> + Send + 'a
{
    api.pull(PullRequest {
        group: READER_GROUP.into(),
        member: String::new(),
        topic: topic.to_owned(),
        queue_id: queue,
        offset,
        max_messages,
        filter: Filter::all(),
        wait,
    })
}

/// The MQTT topic name of a stored message (core topic `T` + tag `a/b` = `T/a/b`,
/// `T` decoded when escaped).
pub fn mqtt_name(m: &Delivered) -> Option<Arc<str>> {
    let view = RecordView::parse(&m.record).ok()?;
    Some(joined(&first_level(&view), view.tags()))
}

/// The MQTT first level of a stored message: its core topic, decoded when
/// escaped (plain topics, the common case, only pay a prefix compare).
fn first_level<'a>(view: &'a RecordView<'a>) -> Cow<'a, str> {
    let topic = view.topic();
    if !topic.starts_with(crate::topic::ESCAPED_PREFIX) {
        return Cow::Borrowed(topic);
    }
    let kept = crate::topic::is_shortened(topic)
        .then(|| {
            view.properties()
                .find(|(k, _)| *k == crate::message::P_FIRST_LEVEL)
                .map(|(_, v)| v)
        })
        .flatten();
    crate::topic::level_of(topic, kept)
}

fn joined(topic: &str, tag: Option<&str>) -> Arc<str> {
    let mut name = String::with_capacity(topic.len() + 1 + tag.map_or(0, str::len));
    crate::topic::join_into(&mut name, topic, tag);
    name.into()
}

/// The MQTT names of a batch's messages. A queue's messages mostly come in runs
/// from a few publishers, so the last few names are reused instead of
/// allocating one per message (and sessions get the same `Arc` for equal names).
pub fn mqtt_names(messages: &[Delivered]) -> Vec<Option<Arc<str>>> {
    names_and_heads(messages, None)
}

/// A batch of `messages` read from `queue` of `topic` (offsets `from..next`),
/// with their MQTT names and heads: what the router hands out, and what a
/// session catching up from the log reads for itself (one name shared by a run
/// of messages instead of one per message, and no parse per message for 3.1.1).
pub fn batch_of(
    topic: Arc<str>,
    queue: u32,
    from: u64,
    next: u64,
    messages: Vec<Delivered>,
) -> Batch {
    let mut heads = Vec::with_capacity(messages.len());
    let names = names_and_heads(&messages, Some(&mut heads));
    Batch {
        topic,
        queue,
        from,
        next,
        messages,
        names,
        heads,
    }
}

/// [`mqtt_names`], and with `heads` each message's [`crate::message::Head`] from
/// the same parse.
fn names_and_heads(
    messages: &[Delivered],
    mut heads: Option<&mut Vec<Option<crate::message::Head>>>,
) -> Vec<Option<Arc<str>>> {
    const KEEP: usize = 4;
    let mut last: [Option<Arc<str>>; KEEP] = Default::default();
    let mut next = 0;
    // The last escaped core topic and its MQTT first level.
    let mut decoded: Option<(String, String)> = None;
    messages
        .iter()
        .map(|m| {
            let view = RecordView::parse(&m.record).ok();
            if let Some(h) = heads.as_deref_mut() {
                h.push(
                    view.as_ref()
                        .and_then(|v| crate::message::Head::of(&m.record, v)),
                );
            }
            let view = view?;
            let tag = view.tags();
            let topic = view.topic();
            // A batch is one core topic: an escaped one is decoded once, not per
            // message (a shortened one per message: its kept level may differ).
            let topic: &str = if topic.starts_with(crate::topic::ESCAPED_PREFIX) {
                let stale = decoded
                    .as_ref()
                    .is_none_or(|(core, _)| core != topic || crate::topic::is_shortened(topic));
                if stale {
                    decoded = Some((topic.to_owned(), first_level(&view).into_owned()));
                }
                decoded.as_ref().map_or(topic, |(_, level)| level.as_str())
            } else {
                topic
            };
            let same = |n: &str| match tag {
                None => n == topic,
                Some(t) => {
                    n.len() == topic.len() + 1 + t.len()
                        && n.starts_with(topic)
                        && n.as_bytes()[topic.len()] == b'/'
                        && n.ends_with(t)
                }
            };
            if let Some(n) = last.iter().flatten().find(|n| same(n)) {
                return Some(n.clone());
            }
            let n = joined(topic, tag);
            last[next] = Some(n.clone());
            next = (next + 1) % KEEP;
            Some(n)
        })
        .collect()
}

async fn read_queue<B: MessagingApi>(
    api: Arc<B>,
    topic: Arc<str>,
    queue: u32,
    from_start: bool,
    members: SharedMembers,
    flow: Arc<Flow>,
) {
    let mut offset = loop {
        if from_start {
            break 0; // a moved offset is corrected by the first pull
        }
        match queue_end(&*api, &topic, queue).await {
            Some(o) => break o,
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    flow.set(queue, offset);
    // Sessions that joined before this reader existed may be behind its start.
    for m in &lock(&members).list {
        m.inbox.lagged.notify_one();
    }
    let mut fanout = Fanout::default();
    let mut keep = 0usize;
    loop {
        let r = read_log(&*api, &topic, queue, offset, READ_BATCH, WAIT).await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(topic = %topic, queue, error = %e, "router pull failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if r.status == PullStatus::Found {
            let batch = Arc::new(batch_of(
                topic.clone(),
                queue,
                offset,
                r.next_offset,
                r.messages,
            ));
            let current = lock(&members).clone();
            if fanout.hand(&current, batch.clone()).await {
                keep = KEEP_AFTER_DROP;
            }
            // Only while sessions are behind (a feed was dropped lately) are
            // batches kept for them to catch up from; otherwise they would
            // cost memory for nobody.
            // The lock is taken only then, not for every batch.
            if keep > 0 {
                keep -= 1;
                flow.remember(&batch);
                if keep == 0 {
                    flow.forget(queue);
                }
            }
        }
        offset = r.next_offset;
        flow.set(queue, offset);
    }
}

/// One reader's view of its sessions: where the last feed to each ended.
#[derive(Default)]
struct Fanout {
    /// Looked up for every member on every batch.
    covered: foldhash::HashMap<u64, u64>,
    /// The member list `covered` was last pruned against.
    seen: Option<Arc<Members>>,
}

impl Fanout {
    /// Hands a batch to every member that may match some of it; `true` if a
    /// member's feed was dropped (it will catch up).
    async fn hand(&mut self, members: &Arc<Members>, batch: Arc<Batch>) -> bool {
        let mut dropped = false;
        if !self.seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, members)) {
            let ids: foldhash::HashSet<u64> = members.list.iter().map(|m| m.inbox.id).collect();
            self.covered.retain(|id, _| ids.contains(id));
            self.seen = Some(members.clone());
        }
        let picks = members.pick(&batch);
        for (m, picked) in members.list.iter().zip(picks) {
            let from = *self.covered.entry(m.inbox.id).or_insert(batch.from);
            let picks = match picked {
                Pick::All => None,
                Pick::Some(v) => Some(v.into_boxed_slice()),
                // Nothing for it: only now and then an empty feed for its cursor.
                Pick::None if batch.next.saturating_sub(from) >= PROGRESS_EVERY => {
                    Some(Box::default())
                }
                Pick::None => continue,
            };
            let progress_only = picks.as_ref().is_some_and(|p| p.is_empty());
            let feed = Feed {
                batch: batch.clone(),
                from,
                picks,
            };
            match m.inbox.tx.try_send(feed) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
                // Dropping an empty feed loses nothing: the next one covers it.
                Err(mpsc::error::TrySendError::Full(_)) if progress_only => continue,
                Err(mpsc::error::TrySendError::Full(feed)) => {
                    // The node, not the client, is slow: wait for the session
                    // (which slows the publishers down through `Flow`), as long
                    // as its client reads, up to NODE_WAIT.
                    let mut sent = false;
                    let deadline = tokio::time::Instant::now() + NODE_WAIT;
                    while !m.inbox.client_slow.load(Ordering::Acquire)
                        && tokio::time::Instant::now() < deadline
                    {
                        match tokio::time::timeout(SESSION_WAIT, m.inbox.tx.reserve()).await {
                            Ok(Ok(permit)) => {
                                permit.send(feed);
                                sent = true;
                                break;
                            }
                            Ok(Err(_)) => break, // the session ended
                            Err(_) => {}
                        }
                    }
                    let waited = NODE_WAIT.saturating_sub(
                        deadline.saturating_duration_since(tokio::time::Instant::now()),
                    );
                    if sent && waited >= SESSION_WAIT / 2 {
                        tracing::debug!(
                            session = m.inbox.id,
                            waited_ms = waited.as_millis() as u64,
                            "the reader waited for a session"
                        );
                    }
                    if !sent {
                        tracing::debug!(
                            session = m.inbox.id,
                            client_slow = m.inbox.client_slow.load(Ordering::Relaxed),
                            waited_ms = waited.as_millis() as u64,
                            "a session's feed dropped: it catches up from the log"
                        );
                        m.inbox.overflowed.store(true, Ordering::Release);
                        m.inbox.lagged.notify_one();
                        dropped = true;
                    }
                }
            }
            self.covered.insert(m.inbox.id, batch.next);
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocketgate_core::broker::{Broker, BrokerSettings, QueueChoice, SystemClock};
    use rocketgate_core::store::record::property;
    use rocketgate_core::store::{Message, Store, StoreDeps, StoreSettings};

    fn node(dir: &std::path::Path) -> Arc<Broker> {
        let store = Arc::new(
            Store::open(dir, StoreSettings::default(), StoreDeps::fixed_usage(0.1))
                .unwrap()
                .0,
        );
        Arc::new(Broker::open(store, BrokerSettings::default(), Arc::new(SystemClock)).unwrap())
    }

    async fn send(api: &Broker, n: usize, tag: &str) {
        let msgs = (0..n)
            .map(|i| {
                let mut m = Message::new("t", 0, format!("{i}").into_bytes());
                m.insert_property(property::TAGS, tag);
                m
            })
            .collect();
        api.send_batch(msgs, QueueChoice::Queue(0)).await.unwrap();
    }

    fn inbox(id: u64, capacity: usize) -> (Inbox, mpsc::Receiver<Feed>) {
        let (tx, rx) = mpsc::channel(capacity);
        let inbox = Inbox {
            id,
            tx,
            lagged: Arc::new(Notify::new()),
            overflowed: Arc::default(),
            client_slow: Arc::default(),
        };
        (inbox, rx)
    }

    fn handed<B>(r: &Router<B>) -> Option<u64> {
        lock(&r.topics).get("t").and_then(|e| e.flow.handed(0))
    }

    /// The router with `inbox` following topic `t`, its reader of queue 0 started.
    async fn started(api: &Arc<Broker>, inbox: Inbox, interest: Interest) -> Arc<Router<Broker>> {
        send(api, 1, "x").await; // creates the topic
        let router = Router::new(api.clone(), Duration::from_secs(60));
        router.join("t", inbox, interest);
        while handed(&router).is_none_or(|h| h == u64::MAX) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        router
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_session_whose_client_reads_holds_the_reader_and_the_publishers() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let (ib, mut rx) = inbox(1, 2);
        let overflowed = ib.overflowed.clone();
        let router = started(&api, ib, Interest::All).await;
        let start = handed(&router).unwrap();
        send(&api, 3000, "x").await;
        let end = start + 3000;
        let waiter = {
            let router = router.clone();
            tokio::spawn(async move {
                router
                    .wait_handed("t", 0, end, Duration::from_secs(60))
                    .await
            })
        };
        // Nothing taken yet: the reader hands at most what fits in the channel
        // plus the batch it is waiting to hand, and the publisher waits.
        while rx.capacity() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let bound = start + 3 * READ_BATCH as u64;
        assert!(handed(&router).unwrap() <= bound);
        assert!(!waiter.is_finished(), "the publisher waits for delivery");
        // Taking feeds lets it go on, never dropping one.
        let mut next = start;
        while next < end {
            let f = rx.recv().await.unwrap();
            assert_eq!(f.from, next, "contiguous feeds");
            assert_eq!(f.batch.from, next);
            next = f.batch.next;
            assert!(handed(&router).unwrap() <= next + 3 * READ_BATCH as u64);
        }
        waiter.await.unwrap();
        assert!(!overflowed.load(Ordering::Acquire), "nothing was dropped");
        router.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_whose_client_does_not_read_never_holds_the_publishers() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let (ib, _rx) = inbox(1, 2);
        ib.client_slow.store(true, Ordering::Release);
        let overflowed = ib.overflowed.clone();
        let router = started(&api, ib, Interest::All).await;
        let start = handed(&router).unwrap();
        send(&api, 3000, "x").await;
        router
            .wait_handed("t", 0, start + 3000, Duration::from_secs(60))
            .await;
        assert_eq!(handed(&router), Some(start + 3000));
        assert!(overflowed.load(Ordering::Acquire), "told it lost feeds");
        router.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_batches_are_kept_for_sessions_catching_up() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        // A session whose client does not read: its feeds are dropped.
        let (ib, _rx) = inbox(1, 2);
        ib.client_slow.store(true, Ordering::Release);
        let router = started(&api, ib, Interest::All).await;
        let start = handed(&router).unwrap();
        let sends = (RECENT_MESSAGES + 8 * READ_BATCH) / 500 + 1;
        for _ in 0..sends {
            send(&api, 500, "x").await;
        }
        let end = start + sends as u64 * 500;
        router
            .wait_handed("t", 0, end, Duration::from_secs(60))
            .await;
        // Near the end: a kept batch holds the offset, with its messages and names.
        let at = end - 10;
        let b = router.recent("t", 0, at).expect("a recent batch");
        assert!(b.from <= at && at < b.next);
        let i = b
            .messages
            .iter()
            .position(|m| m.queue_offset == at)
            .unwrap();
        assert_eq!(b.names[i].as_deref(), Some("t/x"));
        // Far behind (more than is kept) or past the end: the log.
        assert!(router.recent("t", 0, start).is_none());
        assert!(router.recent("t", 0, end).is_none());
        assert!(router.recent("t", 1, at).is_none());
        assert!(router.recent("other", 0, at).is_none());
        router.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_is_kept_while_every_session_keeps_up() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let (ib, mut rx) = inbox(1, 4096);
        let router = started(&api, ib, Interest::All).await;
        let start = handed(&router).unwrap();
        send(&api, 2000, "x").await;
        router
            .wait_handed("t", 0, start + 2000, Duration::from_secs(60))
            .await;
        let mut n = 0;
        while let Ok(f) = rx.try_recv() {
            n += f.messages().count();
        }
        assert_eq!(n, 2000, "every message fed");
        assert!(router.recent("t", 0, start + 1990).is_none());
        router.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exact_sessions_get_only_their_messages_and_feeds_cover_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let (mine, mut rx_mine) = inbox(1, 64);
        let (all, mut rx_all) = inbox(2, 64);
        let router = started(&api, mine, Interest::Names(vec!["t/a".into()])).await;
        router.join("t", all, Interest::All);
        let start = handed(&router).unwrap();
        // Many batches of others' messages, then one of ours, then more others.
        send(&api, 2000, "b").await;
        send(&api, 1, "a").await;
        send(&api, 500, "b").await;
        let end = start + 2501;
        router
            .wait_handed("t", 0, end, Duration::from_secs(60))
            .await;
        let mut covered = start;
        let mut got = Vec::new();
        while let Ok(f) = rx_mine.try_recv() {
            assert_eq!(f.from, covered, "each feed starts where the last ended");
            covered = f.batch.next;
            for (m, name, _) in f.messages() {
                got.push((m.queue_offset, name.map(|n| n.to_string())));
            }
        }
        assert_eq!(got, [(start + 2000, Some("t/a".to_owned()))]);
        assert!(
            covered + PROGRESS_EVERY > end,
            "empty feeds keep the cursor near the end"
        );
        let mut n = 0;
        while let Ok(f) = rx_all.try_recv() {
            n += f.messages().count();
        }
        assert_eq!(n, 2501, "a wildcard session sees everything");
        router.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_one_name_goes_whole_to_its_sessions_without_a_list_of_picks() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let (a, mut rx_a) = inbox(1, 4096);
        let (b, mut rx_b) = inbox(2, 4096);
        let router = started(&api, a, Interest::Names(vec!["t/a".into()])).await;
        router.join("t", b, Interest::Names(vec!["t/b".into()]));
        let start = handed(&router).unwrap();
        send(&api, 300, "a").await;
        router
            .wait_handed("t", 0, start + 300, Duration::from_secs(60))
            .await;
        let mut n = 0;
        while let Ok(f) = rx_a.try_recv() {
            assert!(f.picks.is_none(), "all of a batch of t/a only");
            n += f.messages().count();
        }
        assert_eq!(n, 300);
        while let Ok(f) = rx_b.try_recv() {
            assert_eq!(f.messages().count(), 0, "nothing of t/a for t/b");
        }
        // Mixed names: each session is handed only the indices of its own.
        let msgs = (0..100)
            .map(|i| {
                let mut m = Message::new("t", 0, format!("{i}").into_bytes());
                m.insert_property(property::TAGS, if i % 2 == 0 { "a" } else { "b" });
                m
            })
            .collect();
        api.send_batch(msgs, QueueChoice::Queue(0)).await.unwrap();
        router
            .wait_handed("t", 0, start + 400, Duration::from_secs(60))
            .await;
        for rx in [&mut rx_a, &mut rx_b] {
            let mut n = 0;
            while let Ok(f) = rx.try_recv() {
                if f.batch.names.iter().any(|x| x.as_deref() == Some("t/a"))
                    && f.batch.names.iter().any(|x| x.as_deref() == Some("t/b"))
                {
                    assert!(f.picks.is_some(), "a mixed batch is picked from");
                }
                n += f.messages().count();
            }
            assert_eq!(n, 50);
        }
        router.stop();
    }

    #[tokio::test]
    async fn names_are_shared_within_a_batch_and_right_for_each_message() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        for tag in ["a/b", "c", "a/b", "a", "b", "c", "d", "e", "a/b"] {
            send(&api, 1, tag).await;
        }
        let mut plain = Message::new("t", 0, b"no tag".to_vec());
        plain.born_timestamp = 1;
        api.send_batch(vec![plain], QueueChoice::Queue(0))
            .await
            .unwrap();
        api.sync_visible().await;
        let r = read_log(&*api, "t", 0, 0, 100, Duration::ZERO)
            .await
            .unwrap();
        let names = mqtt_names(&r.messages);
        let got: Vec<&str> = names.iter().map(|n| n.as_deref().unwrap()).collect();
        assert_eq!(
            got,
            [
                "t/a/b", "t/c", "t/a/b", "t/a", "t/b", "t/c", "t/d", "t/e", "t/a/b", "t"
            ]
        );
        for (i, m) in r.messages.iter().enumerate() {
            assert_eq!(mqtt_name(m), names[i], "message {i}");
        }
        let n = |i: usize| names[i].as_ref().unwrap();
        assert!(Arc::ptr_eq(n(0), n(2)), "a recent name is shared");
        assert!(Arc::ptr_eq(n(1), n(5)));
    }

    #[tokio::test]
    async fn escaped_core_topics_are_named_by_their_mqtt_first_level() {
        use bytes::Bytes;
        use mqttbytes::QoS;
        use mqttbytes::v5::Publish;
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let long = format!("{}/t", "é".repeat(100));
        let peer = "127.0.0.1:1".parse().unwrap();
        for name in [
            "/devices/42/temp",
            "/devices/43/temp",
            "$TopicA/B",
            long.as_str(),
        ] {
            let p = Publish::new(name, QoS::AtLeastOnce, Bytes::from_static(b"x"));
            let m = crate::message::to_core(name, &p, "c", peer, 0).unwrap();
            let topic = m.topic.clone();
            api.send_batch(vec![m], QueueChoice::Queue(0))
                .await
                .unwrap();
            api.sync_visible().await;
            let r = read_log(&*api, &topic, 0, 0, 100, Duration::ZERO)
                .await
                .unwrap();
            let names = mqtt_names(&r.messages);
            let last = r.messages.len() - 1;
            assert_eq!(names[last].as_deref(), Some(name));
            assert_eq!(mqtt_name(&r.messages[last]).as_deref(), Some(name));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_topic_followed_before_it_exists_is_read_as_soon_as_a_publisher_stores_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let router = Router::new(api.clone(), Duration::from_secs(60));
        let (ib, mut rx) = inbox(1, 8);
        router.join("t", ib, Interest::All);
        tokio::time::sleep(Duration::from_millis(50)).await; // the reader looked once
        send(&api, 1, "first").await;
        // What an MQTT publisher does after storing (the throttle).
        router.wait_handed("t", 0, 1, Duration::from_secs(1)).await;
        let feed = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the reader started without waiting for its next look")
            .unwrap();
        let names: Vec<&str> = feed
            .messages()
            .filter_map(|(_, n, _)| n.map(|n| &**n))
            .collect();
        assert_eq!(names, ["t/first"], "read from the start of the new topic");
        router.stop();
    }

    #[tokio::test]
    async fn heads_say_what_each_record_says() {
        use crate::message::{self, Head};
        let dir = tempfile::tempdir().unwrap();
        let api = node(dir.path());
        let mut a = Message::new("t", 0, b"payload a".to_vec());
        a.insert_property(property::TAGS, "x");
        a.insert_property(message::P_QOS, "1");
        a.insert_property(message::P_CLIENT, "dev-7");
        a.insert_property(message::P_RETAIN, "1");
        a.insert_property(message::P_EXPIRY_AT, "1234567");
        let mut b = Message::new("t", 0, Vec::new()); // from another door: no mqtt.*
        b.insert_property(property::TAGS, "y");
        // What a v5 client is given: a user property, a content type.
        let mut c = Message::new("t", 0, b"c".to_vec());
        c.insert_property("colour", "blue");
        let mut d = Message::new("t", 0, b"d".to_vec());
        d.insert_property(message::P_CONTENT_TYPE, "text/plain");
        api.send_batch(vec![a, b, c, d], QueueChoice::Queue(0))
            .await
            .unwrap();
        // The consume queue is built just after the append: a read with no wait right
        // after the send may come before it (seen on a loaded CI machine).
        api.sync_visible().await;
        let r = read_log(&*api, "t", 0, 0, 10, Duration::ZERO)
            .await
            .unwrap();
        let mut heads = Vec::new();
        names_and_heads(&r.messages, Some(&mut heads));
        assert_eq!(heads.len(), 4);
        let v5: Vec<bool> = heads
            .iter()
            .map(|h| h.as_ref().unwrap().v5_properties)
            .collect();
        assert_eq!(
            v5,
            [false, false, true, true],
            "only c and d make a v5 session parse"
        );
        for (d, h) in r.messages.iter().zip(&heads) {
            let h: &Head = h.as_ref().unwrap();
            let view = RecordView::parse(&d.record).unwrap();
            let meta = message::read_meta(view.properties(), None);
            assert_eq!(
                (h.qos, h.retain, h.expiry_at),
                (meta.qos, meta.retain, meta.expiry_at)
            );
            assert_eq!(h.origin(&d.record), meta.origin);
            assert_eq!(&h.body(&d.record)[..], view.body());
        }
        assert_eq!(
            heads[0].as_ref().unwrap().origin(&r.messages[0].record),
            Some("dev-7")
        );
        assert_eq!(
            &heads[1].as_ref().unwrap().body(&r.messages[1].record)[..],
            b""
        );
    }
}
