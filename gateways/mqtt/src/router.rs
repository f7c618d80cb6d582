//! One reader per (core topic, queue), fanning each batch it reads out to every
//! connected session that follows the topic (rumqttd's router idea), instead of
//! every session long-polling the same queue.
//!
//! A batch carries the offset range it covers. A session that is exactly at the
//! batch's start takes the messages it matches and moves on; one that is behind
//! (it was offline, was slow and had a batch dropped, or follows a topic that just
//! appeared) catches up by pulling from its own cursor, then rejoins the shared
//! stream. A full session channel never slows the reader: the batch is dropped for
//! that session and it is told it lagged (and that it overflowed, so a session
//! that only takes QoS 0 can skip ahead instead of catching up, see `deliver.rs`).
//!
//! The reader also works out each message's MQTT topic name once per batch, so the
//! sessions following a topic only compare names instead of each parsing every
//! record (in point-to-point use many sessions follow one core topic and match
//! one tag each).
//!
//! Each reader also publishes how far it is behind the end of its queue. A reader
//! that falls behind means the node cannot read as fast as it stores (CPU
//! overload: publishers flooding, typically at QoS 0, which has no window); the
//! publishing connections then wait a little before reading more from their
//! sockets (see [`Router::behind`]), so TCP slows the publishers down, as a broker
//! that forwards inline would, instead of the live path falling ever further behind.
//!
//! The router also watches the topic list, so subscriptions whose first level is a
//! wildcard see new core topics as they appear.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rocketgate_core::broker::{
    Delivered, MessagingApi, PullRequest, PullStatus, TopicKind, filter::Filter,
};
use rocketgate_core::store::RecordView;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

/// Messages read from one queue: offsets `from..next` (some may be absent from
/// `messages` only if the core skipped them).
#[derive(Debug)]
pub struct Batch {
    pub topic: Arc<str>,
    pub queue: u32,
    pub from: u64,
    pub next: u64,
    pub messages: Vec<Delivered>,
    /// The MQTT topic name of each message (`None`: the record did not parse).
    pub names: Vec<Option<Box<str>>>,
}

/// A session's inbox at the router.
#[derive(Clone)]
pub struct Inbox {
    pub id: u64,
    pub tx: mpsc::Sender<Arc<Batch>>,
    pub lagged: Arc<Notify>,
    /// Set when a batch was dropped because the session's channel was full.
    pub overflowed: Arc<AtomicBool>,
    /// Set by the session while its client does not read fast enough (its
    /// outgoing channel is full): its overflows are the client's, not the node's.
    pub client_slow: Arc<AtomicBool>,
}

type Inboxes = Arc<RwLock<Vec<Inbox>>>;

struct TopicEntry {
    inboxes: Inboxes,
    /// Entries between each reader and the end of its queue.
    lag: Lag,
    task: JoinHandle<()>,
}

/// How a topic's readers keep up: entries behind per queue, and until when
/// publishers should pause because sessions overflowed although their clients read.
#[derive(Default)]
struct Progress {
    behind: Vec<u64>,
    congested_until: Option<tokio::time::Instant>,
}

type Lag = Arc<Mutex<Progress>>;

/// How long publishers pause after a session overflowed under CPU overload.
const CONGESTION_PAUSE: Duration = Duration::from_millis(5);

pub struct Router<B> {
    api: Arc<B>,
    topics: Mutex<HashMap<Arc<str>, TopicEntry>>,
    list: watch::Sender<Arc<Vec<String>>>,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

const READ_BATCH: usize = 256;
const WAIT: Duration = Duration::from_secs(10);
pub const READER_GROUP: &str = "mqtt%router";

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

    pub fn join(&self, topic: &str, inbox: Inbox) {
        let mut topics = lock(&self.topics);
        if let Some(entry) = topics.get(topic) {
            let mut v = entry.inboxes.write().unwrap_or_else(|p| p.into_inner());
            v.retain(|i| i.id != inbox.id);
            v.push(inbox);
            return;
        }
        let name: Arc<str> = Arc::from(topic);
        let inboxes: Inboxes = Arc::new(RwLock::new(vec![inbox]));
        let lag: Lag = Arc::default();
        let task = tokio::spawn(run_topic(
            self.api.clone(),
            name.clone(),
            inboxes.clone(),
            lag.clone(),
        ));
        topics.insert(name, TopicEntry { inboxes, lag, task });
    }

    /// How many entries the slowest reader of a core topic is behind the end of
    /// its queue (0 when nobody follows the topic).
    pub fn behind(&self, topic: &str) -> u64 {
        let topics = lock(&self.topics);
        topics
            .get(topic)
            .map(|e| {
                let p = lock(&e.lag);
                let congested = p
                    .congested_until
                    .is_some_and(|t| t > tokio::time::Instant::now());
                if congested {
                    u64::MAX
                } else {
                    p.behind.iter().copied().max().unwrap_or(0)
                }
            })
            .unwrap_or(0)
    }

    pub fn leave(&self, topic: &str, id: u64) {
        let mut topics = lock(&self.topics);
        let empty = match topics.get(topic) {
            Some(entry) => {
                let mut v = entry.inboxes.write().unwrap_or_else(|p| p.into_inner());
                v.retain(|i| i.id != id);
                v.is_empty()
            }
            None => false,
        };
        if empty && let Some(entry) = topics.remove(topic) {
            entry.task.abort();
        }
    }

    /// Stops every reader and the topic watcher.
    pub fn stop(&self) {
        for (_, entry) in lock(&self.topics).drain() {
            entry.task.abort();
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for the topic to exist, then reads each of its queues.
async fn run_topic<B: MessagingApi + 'static>(
    api: Arc<B>,
    topic: Arc<str>,
    inboxes: Inboxes,
    lag: Lag,
) {
    let queues = loop {
        match api.topic(&topic).await {
            Ok(c) => break c.read_queues,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    lock(&lag).behind = vec![0; queues as usize];
    let mut set = tokio::task::JoinSet::new();
    for q in 0..queues {
        set.spawn(read_queue(
            api.clone(),
            topic.clone(),
            q,
            inboxes.clone(),
            lag.clone(),
        ));
    }
    // Lives until aborted (dropping the set aborts the readers).
    while set.join_next().await.is_some() {}
}

/// The end of a queue (where a reader or a new subscription starts), counting every
/// publish already acknowledged (else a new subscriber would get it as new).
pub async fn queue_end<B: MessagingApi>(api: &B, topic: &str, queue: u32) -> Option<u64> {
    api.sync_visible().await;
    let r = api
        .pull(PullRequest {
            group: READER_GROUP.into(),
            member: String::new(),
            topic: topic.to_owned(),
            queue_id: queue,
            offset: u64::MAX,
            max_messages: 1,
            filter: Filter::all(),
            wait: Duration::ZERO,
        })
        .await
        .ok()?;
    Some(r.max_offset)
}

/// The MQTT topic name of a stored message (core topic `T` + tag `a/b` = `T/a/b`).
pub fn mqtt_name(m: &Delivered) -> Option<Box<str>> {
    let view = RecordView::parse(&m.record).ok()?;
    let mut name = String::with_capacity(view.topic().len() + 1 + view.tags().map_or(0, str::len));
    crate::topic::join_into(&mut name, view.topic(), view.tags());
    Some(name.into_boxed_str())
}

async fn read_queue<B: MessagingApi>(
    api: Arc<B>,
    topic: Arc<str>,
    queue: u32,
    inboxes: Inboxes,
    lag: Lag,
) {
    let mut offset = loop {
        match queue_end(&*api, &topic, queue).await {
            Some(o) => break o,
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    // Sessions that joined before this reader existed may be behind its start.
    for inbox in inboxes.read().unwrap_or_else(|p| p.into_inner()).iter() {
        inbox.lagged.notify_one();
    }
    loop {
        let r = api
            .pull(PullRequest {
                group: READER_GROUP.into(),
                member: String::new(),
                topic: topic.to_string(),
                queue_id: queue,
                offset,
                max_messages: READ_BATCH,
                filter: Filter::all(),
                wait: WAIT,
            })
            .await;
        let mut congested = false;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(topic = %topic, queue, error = %e, "router pull failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if r.status == PullStatus::Found {
            let names = r.messages.iter().map(mqtt_name).collect();
            let batch = Arc::new(Batch {
                topic: topic.clone(),
                queue,
                from: offset,
                next: r.next_offset,
                messages: r.messages,
                names,
            });
            let v = inboxes.read().unwrap_or_else(|p| p.into_inner());
            for inbox in v.iter() {
                if let Err(mpsc::error::TrySendError::Full(_)) = inbox.tx.try_send(batch.clone()) {
                    inbox.overflowed.store(true, Ordering::Release);
                    inbox.lagged.notify_one();
                    if !inbox.client_slow.load(Ordering::Acquire) {
                        // The session could not keep up although its client reads:
                        // the node is overloaded; publishers pause briefly.
                        congested = true;
                    }
                }
            }
        }
        offset = r.next_offset;
        let mut p = lock(&lag);
        if let Some(l) = p.behind.get_mut(queue as usize) {
            *l = r.max_offset.saturating_sub(offset);
        }
        if congested {
            p.congested_until = Some(tokio::time::Instant::now() + CONGESTION_PAUSE);
        }
    }
}
