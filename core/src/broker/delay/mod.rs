//! Delayed delivery: RocketMQ's 18 delay levels and delivery at an arbitrary
//! time (the RocketMQ 5 timer properties), with delivery progress persisted.
//!
//! On send, a delayed message is stored durably in the commit log under a system
//! topic instead of its own, with the real topic and queue in `REAL_TOPIC` /
//! `REAL_QID` and its delivery time (broker clock, ms) in `TIMER_OUT_MS`:
//! - a delay level `n` goes to `SCHEDULE_TOPIC_XXXX`, queue `n - 1`. One queue
//!   per level holds equal delays, so deadlines are in append order and each
//!   queue is delivered FIFO up to a *delivered offset*;
//! - an arbitrary time goes to `rmq_sys_wheel_timer`, queue 0. Deadlines there are
//!   in any order: an in-memory min-heap of `(deadline, offset)` is fed by scanning
//!   the queue, and rebuilt at open from the persisted low-water mark.
//!
//! `DelayState` owns the schedule's progress and reaches the rest of the broker
//! through two narrow things: the store (reads of the schedule queues, appends)
//! and a `TopicLookup` for the real topic's current queue count. Its
//! `deliver_due` (run by the loop of [`Broker::spawn_delay_delivery`], and by
//! [`Broker::deliver_due`] directly in tests with a manual clock) re-appends every
//! due message to its real topic and queue, properties restored, in
//! delivery-time order.
//!
//! Pending entries can be listed by real topic and cancelled (`pending.rs`); a
//! cancel is a delivery that appends nothing, written to `delay.json` before it
//! is answered, so it survives a restart.
//!
//! [`Broker::deliver_due`]: super::Broker::deliver_due
//! [`Broker::spawn_delay_delivery`]: super::Broker::spawn_delay_delivery
//!
//! # Invariants
//! - A message is re-appended only once its deadline is `<=` the broker clock:
//!   never early.
//! - [`Progress`] on disk only counts re-appends whose bytes the commit log has
//!   flushed, so a crash never loses a delayed message; it may deliver again
//!   those re-appended since the last durable progress (the crash window).
//! - Within one tick, due messages are re-appended in deadline order (ties: level
//!   queues first, then by offset).

mod pending;

pub use pending::Delayed;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::persist;
use super::schedule::{self, DelayLevels};
use super::topics::TopicLookup;
use crate::clock::Clock;
use crate::store::record::property;
use crate::store::{Message, RecordView, Store};
use crate::sync::lock;
use crate::{Error, Result};

/// The stored property holding a delayed message's delivery time (ms since the
/// epoch, broker clock); RocketMQ 5's name for it.
pub const DELIVER_AT: &str = "TIMER_OUT_MS";

/// Properties that ask for a delay; removed when the message is delivered (and
/// when a retry re-sends a message, which gets a delay of its own).
pub(crate) const DELAY_PROPERTIES: &[&str] = &[
    property::DELAY_TIME_LEVEL,
    property::TIMER_DELIVER_MS,
    property::TIMER_DELAY_MS,
    property::TIMER_DELAY_SEC,
    property::START_DELIVER_TIME,
    property::REAL_TOPIC,
    property::REAL_QUEUE_ID,
    DELIVER_AT,
];

/// How delayed delivery behaves.
#[derive(Debug, Clone)]
pub struct DelaySettings {
    /// The level table (RocketMQ `messageDelayLevel`).
    pub levels: DelayLevels,
    /// The longest delay a send may ask for; beyond it the send fails.
    pub max_delay: Duration,
    /// How often the background loop delivers due messages (the precision of
    /// delivery, besides the 1 s the timer guarantees).
    pub tick: Duration,
    /// Entries one tick reads per level queue and takes from the timer heap.
    pub batch: usize,
}

impl Default for DelaySettings {
    fn default() -> Self {
        DelaySettings {
            levels: DelayLevels::default(),
            max_delay: Duration::from_secs(3 * 24 * 3600),
            tick: Duration::from_millis(100),
            batch: 1024,
        }
    }
}

impl DelaySettings {
    /// What a user's delay is checked against.
    pub fn limits(&self) -> DelayLimits {
        DelayLimits {
            levels: self.levels.clone(),
            max_delay: self.max_delay,
        }
    }
}

/// Where a message sent now should wait, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Not delayed (no delay property, level 0, or a time already past).
    Now,
    /// Delay level (1-based, clamped to the table) and its deadline.
    Level { level: u32, deliver_ms: i64 },
    /// An arbitrary deadline.
    At { deliver_ms: i64 },
}

/// A delay as a user asked for it, before it is checked against [`DelayLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayRequest {
    /// A level of the table (1-based).
    Level(u32),
    /// This long after the send.
    After(Duration),
    /// At this time (ms since the epoch).
    At(i64),
}

/// What a delay may be: the level table and the longest delay the timer store
/// holds. The doors check a user's delay against it with [`DelayLimits::property`]
/// and refuse what does not fit; the core's own [`plan`] keeps RocketMQ's
/// lenience (levels clamped, past times now) for RocketMQ clients.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DelayLimits {
    pub levels: DelayLevels,
    pub max_delay: Duration,
}

impl DelayLimits {
    /// The message property asking for `request` (`None`: no delay, for a zero
    /// duration). A level outside the table or a time in the past is
    /// [`Error::InvalidArgument`], a delay beyond `max_delay`
    /// [`Error::DelayTooLong`]: never clamped, never silently immediate.
    pub fn property(
        &self,
        request: DelayRequest,
        now_ms: i64,
    ) -> Result<Option<(&'static str, String)>> {
        let too_long = |requested: Duration| Error::DelayTooLong {
            requested,
            max: self.max_delay,
        };
        match request {
            DelayRequest::Level(level) => {
                if level == 0 || level > self.levels.max_level() {
                    return Err(Error::InvalidArgument(format!(
                        "delay level {level} is not in the table: levels are 1..{} ({})",
                        self.levels.max_level(),
                        self.levels
                    )));
                }
                let delay = self.levels.delay_of(level).unwrap_or_default();
                if delay > self.max_delay {
                    return Err(too_long(delay));
                }
                Ok(Some((property::DELAY_TIME_LEVEL, level.to_string())))
            }
            DelayRequest::After(d) if d.is_zero() => Ok(None),
            DelayRequest::After(d) if d > self.max_delay => Err(too_long(d)),
            DelayRequest::After(d) => {
                Ok(Some((property::TIMER_DELAY_MS, d.as_millis().to_string())))
            }
            DelayRequest::At(at) if at < now_ms => Err(Error::InvalidArgument(format!(
                "{at} is {} ms in the past (broker time {now_ms})",
                now_ms.saturating_sub(at)
            ))),
            DelayRequest::At(at) => {
                let delay = Duration::from_millis(at.saturating_sub(now_ms).unsigned_abs());
                if delay > self.max_delay {
                    return Err(too_long(delay));
                }
                Ok(Some((property::TIMER_DELIVER_MS, at.to_string())))
            }
        }
    }
}

fn parse_i64(msg: &Message, name: &str) -> Result<Option<i64>> {
    msg.property(name)
        .map(|v| {
            v.trim().parse::<i64>().map_err(|_| {
                Error::InvalidMessage(format!("property {name} is {v:?}: expected an integer"))
            })
        })
        .transpose()
}

/// Decides a send's [`Plan`] from its properties (pure).
///
/// - `DELAY` (level): `<= 0` is not delayed; above the table it is clamped to the
///   last level, as the RocketMQ broker does; not a number is rejected.
/// - `TIMER_DELIVER_MS` / `__STARTDELIVERTIME` (absolute ms), `TIMER_DELAY_MS`,
///   `TIMER_DELAY_SEC` (relative): a time not in the future is delivered now; one
///   more than `max_delay` away fails with [`Error::DelayTooLong`].
/// - A level together with a delivery time is rejected.
pub fn plan(msg: &Message, opts: &DelaySettings, now_ms: i64) -> Result<Plan> {
    let at = if let Some(ms) = parse_i64(msg, property::TIMER_DELIVER_MS)? {
        Some(ms)
    } else if let Some(ms) = parse_i64(msg, property::START_DELIVER_TIME)? {
        Some(ms)
    } else if let Some(ms) = parse_i64(msg, property::TIMER_DELAY_MS)? {
        Some(now_ms.saturating_add(ms))
    } else {
        parse_i64(msg, property::TIMER_DELAY_SEC)?
            .map(|s| now_ms.saturating_add(s.saturating_mul(1000)))
    };
    let level = parse_i64(msg, property::DELAY_TIME_LEVEL)?;
    if at.is_some() && level.is_some_and(|l| l > 0) {
        return Err(Error::InvalidMessage(
            "a message has either a delay level or a delivery time, not both".into(),
        ));
    }
    if let Some(deliver_ms) = at {
        if deliver_ms <= now_ms {
            return Ok(Plan::Now);
        }
        let delay = Duration::from_millis((deliver_ms - now_ms) as u64);
        if delay > opts.max_delay {
            return Err(Error::DelayTooLong {
                requested: delay,
                max: opts.max_delay,
            });
        }
        return Ok(Plan::At { deliver_ms });
    }
    match level {
        Some(l) if l > 0 => {
            let level = opts
                .levels
                .effective_level(u32::try_from(l).unwrap_or(u32::MAX));
            let delay = opts.levels.delay_of(level).unwrap_or_default();
            if delay > opts.max_delay {
                return Err(Error::DelayTooLong {
                    requested: delay,
                    max: opts.max_delay,
                });
            }
            Ok(Plan::Level {
                level,
                deliver_ms: now_ms.saturating_add(delay.as_millis() as i64),
            })
        }
        _ => Ok(Plan::Now),
    }
}

/// Rewrites `msg` (already placed in its real topic and queue) to wait under the
/// schedule or timer topic.
pub fn divert(msg: &mut Message, plan: Plan) {
    let (topic, queue_id, deliver_ms) = match plan {
        Plan::Now => return,
        Plan::Level { level, deliver_ms } => (schedule::SCHEDULE_TOPIC, level - 1, deliver_ms),
        Plan::At { deliver_ms } => (schedule::TIMER_TOPIC, 0, deliver_ms),
    };
    msg.insert_property(property::REAL_TOPIC, msg.topic.clone());
    msg.insert_property(property::REAL_QUEUE_ID, msg.queue_id.to_string());
    msg.insert_property(DELIVER_AT, deliver_ms.to_string());
    msg.topic = topic.to_owned();
    msg.queue_id = queue_id;
}

/// The message to deliver for a stored delayed record: real topic and queue
/// back, delay properties gone. `None` if the record lacks them (not ours).
pub fn restore(view: &RecordView<'_>) -> Option<Message> {
    let topic = view.property(property::REAL_TOPIC)?.to_owned();
    let queue_id = view.property(property::REAL_QUEUE_ID)?.parse().ok()?;
    let mut msg = view.to_message();
    msg.properties
        .retain(|(k, _)| !DELAY_PROPERTIES.contains(&k.as_str()));
    msg.topic = topic;
    msg.queue_id = queue_id;
    Some(msg)
}

fn deliver_at(view: &RecordView<'_>) -> i64 {
    // A record without a readable deadline is delivered at once rather than held.
    view.property(DELIVER_AT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(i64::MIN)
}

/// One schedule entry, by where it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Entry {
    Level { level: u32, offset: u64 },
    Timer { offset: u64 },
}

/// Which schedule entries were delivered (or cancelled); the content of
/// `delay.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Level -> the next offset of its schedule queue to deliver (FIFO).
    pub levels: BTreeMap<u32, u64>,
    /// Every timer offset below it is delivered.
    pub timer_base: u64,
    /// Delivered timer offsets at or above `timer_base` (deadlines are not in
    /// offset order, so a few run ahead of the low-water mark). A cancelled
    /// timer entry is one of them: it is done, with nothing appended.
    pub timer_done: BTreeSet<u64>,
    /// Cancelled level entries `(level, offset)` at or above their level's next
    /// offset: a level queue is delivered in order, so a cancelled entry waits
    /// for its turn and is then skipped. Absent from files written before
    /// cancelling existed, and when empty.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub cancelled: BTreeSet<(u32, u64)>,
}

impl Progress {
    fn mark(&mut self, e: Entry) {
        match e {
            Entry::Level { level, offset } => {
                let next = self.levels.entry(level).or_insert(0);
                *next = (*next).max(offset + 1);
                let next = *next;
                self.cancelled.retain(|&(l, o)| l != level || o >= next);
            }
            Entry::Timer { offset } => {
                if offset >= self.timer_base {
                    self.timer_done.insert(offset);
                }
                while self.timer_done.remove(&self.timer_base) {
                    self.timer_base += 1;
                }
            }
        }
    }

    fn timer_delivered(&self, offset: u64) -> bool {
        offset < self.timer_base || self.timer_done.contains(&offset)
    }

    /// True when the entry is delivered or cancelled.
    fn done(&self, e: Entry) -> bool {
        match e {
            Entry::Level { level, offset } => {
                offset < self.levels.get(&level).copied().unwrap_or(0)
                    || self.cancelled.contains(&(level, offset))
            }
            Entry::Timer { offset } => self.timer_delivered(offset),
        }
    }

    /// Takes the entry out of the schedule without delivering it.
    fn cancel(&mut self, e: Entry) {
        match e {
            Entry::Level { level, offset } => {
                self.cancelled.insert((level, offset));
            }
            Entry::Timer { .. } => self.mark(e),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct DelayFile {
    version: u32,
    progress: Progress,
}

/// What the delivery loop owns: the live progress, the timer heap and its scan
/// cursor.
#[derive(Debug, Default)]
struct Scheduler {
    /// Everything re-appended so far (durable or not).
    live: Progress,
    /// Undelivered timer entries: `(deadline, queue offset, commit-log offset, size)`.
    /// Memory: ~32 bytes per waiting timer message.
    heap: BinaryHeap<Reverse<(i64, u64, u64, u32)>>,
    /// The next timer-queue offset not yet pushed into the heap.
    timer_scanned: u64,
}

/// Progress waiting for the commit log, and what the file holds.
#[derive(Debug, Default)]
struct Marks {
    /// Deliveries by the commit-log end offset of their re-append, ascending.
    pending: VecDeque<(u64, Entry)>,
    /// Progress whose re-appends are all flushed.
    durable: Progress,
    /// Bumped on every change of `durable`.
    version: u64,
}

/// Delayed delivery of a broker: its progress and what it needs to deliver.
/// See the module docs.
pub(super) struct DelayState {
    path: PathBuf,
    store: Arc<Store>,
    opts: DelaySettings,
    /// Deadlines are compared with this clock (the broker's).
    clock: Arc<dyn Clock>,
    /// Owned by one tick at a time; a tokio lock because a tick holds it across
    /// its re-appends, so two ticks never deliver the same entry.
    scheduler: tokio::sync::Mutex<Scheduler>,
    /// Short std lock: ticks push, the flusher drains. Never held across I/O.
    marks: Mutex<Marks>,
    /// The `Marks::version` the file holds; held while writing so an older
    /// snapshot never replaces a newer one.
    file: Mutex<u64>,
}

impl DelayState {
    pub(super) fn open(
        config_dir: &Path,
        store: Arc<Store>,
        opts: DelaySettings,
        clock: Arc<dyn Clock>,
    ) -> Result<DelayState> {
        let path = config_dir.join("delay.json");
        let mut progress = persist::read_json::<DelayFile>(&path)?
            .map(|f| f.progress)
            .unwrap_or_default();
        // Progress past the end of a schedule queue (the log was truncated under it)
        // goes back to the end, or what is scheduled next at those offsets is skipped.
        let mut clamped = false;
        let cut = store.log_was_cut();
        for (level, next) in progress.levels.iter_mut().filter(|_| cut) {
            let end = store
                .queue_bounds(schedule::SCHEDULE_TOPIC, level.saturating_sub(1))
                .1;
            if *next > end {
                *next = end;
                clamped = true;
            }
        }
        // Cancelled entries at or past their queue's end were cut with the log.
        progress.cancelled.retain(|(level, offset)| {
            !cut || *offset
                < store
                    .queue_bounds(schedule::SCHEDULE_TOPIC, level.saturating_sub(1))
                    .1
        });
        if cut {
            let timer_end = store.queue_bounds(schedule::TIMER_TOPIC, 0).1;
            if progress.timer_base > timer_end {
                progress.timer_base = timer_end;
                clamped = true;
            }
            progress.timer_done.retain(|o| *o < timer_end);
        }
        if clamped {
            tracing::warn!("delay progress past the end of its queues moved back to the end");
        }
        Ok(DelayState {
            path,
            store,
            opts,
            clock,
            scheduler: tokio::sync::Mutex::new(Scheduler {
                timer_scanned: progress.timer_base,
                live: progress.clone(),
                heap: BinaryHeap::new(),
            }),
            marks: Mutex::new(Marks {
                pending: VecDeque::new(),
                durable: progress,
                // A moved progress is written by the first flush.
                version: u64::from(clamped),
            }),
            file: Mutex::new(0),
        })
    }

    /// Writes the progress whose re-appends are flushed (up to `flushed`), if it
    /// changed since the last write.
    pub(super) fn flush(&self, flushed: u64) -> Result<()> {
        let mut written = lock(&self.file);
        let bytes = {
            let mut m = lock(&self.marks);
            while let Some((end, e)) = m.pending.front().copied() {
                if end > flushed {
                    break;
                }
                m.pending.pop_front();
                m.durable.mark(e);
                m.version += 1;
            }
            if m.version == *written {
                return Ok(());
            }
            let file = DelayFile {
                version: 1,
                progress: m.durable.clone(),
            };
            let bytes = serde_json::to_vec_pretty(&file).map_err(|e| {
                Error::InvalidArgument(format!("cannot encode delay progress: {e}"))
            })?;
            *written = m.version;
            bytes
        };
        persist::write_raw(&self.path, &bytes)
    }

    /// The progress of every re-append made so far, flushed or not (what a master
    /// writes to the replicated log: each re-append it counts is already in the log
    /// before the record that carries it).
    pub(in crate::broker) fn appended_progress(&self) -> Progress {
        let m = lock(&self.marks);
        let mut p = m.durable.clone();
        for (_, e) in &m.pending {
            p.mark(*e);
        }
        p
    }

    /// On a slave (whose delivery loop does not run): takes the master's progress as
    /// its own, written to `delay.json` by the next flush. `false` if it is already
    /// this one, or a delivery tick holds the scheduler (only on a master).
    pub(in crate::broker) fn adopt(&self, progress: Progress) -> bool {
        let Ok(mut s) = self.scheduler.try_lock() else {
            return false;
        };
        let mut m = lock(&self.marks);
        if s.live == progress && m.durable == progress && m.pending.is_empty() {
            return false;
        }
        s.heap.clear();
        s.timer_scanned = progress.timer_base;
        s.live = progress.clone();
        m.pending.clear();
        m.durable = progress;
        m.version += 1;
        true
    }

    /// The commit-log offset the pending progress waits for (0: none).
    pub(super) fn pending_end(&self) -> u64 {
        lock(&self.marks)
            .pending
            .iter()
            .map(|(end, _)| *end)
            .max()
            .unwrap_or(0)
    }
}

/// A due entry read for delivery.
struct Due {
    deliver_ms: i64,
    entry: Entry,
    record: Bytes,
    /// Cancelled: marked delivered when its turn comes, nothing appended.
    cancelled: bool,
}

fn read_due_levels(
    store: &Store,
    opts: &DelaySettings,
    live: &Progress,
    now: i64,
    out: &mut Vec<Due>,
) -> Result<()> {
    for (level, _) in opts.levels.iter() {
        let from = live.levels.get(&level).copied().unwrap_or(0);
        let read = store.read_queue(schedule::SCHEDULE_TOPIC, level - 1, from, opts.batch)?;
        let mut previous = i64::MIN;
        for (offset, cq) in read.entries {
            let record = store.read_entry(&cq)?.into_bytes();
            let deliver_ms = deliver_at(&RecordView::parse(&record)?);
            if deliver_ms > now {
                break; // FIFO: the rest of this level is later still
            }
            // Keep a level's entries in offset order even if the clock went back
            // between their sends: its progress is one offset.
            let deliver_ms = deliver_ms.max(previous);
            previous = deliver_ms;
            out.push(Due {
                deliver_ms,
                entry: Entry::Level { level, offset },
                record,
                cancelled: live.cancelled.contains(&(level, offset)),
            });
        }
    }
    Ok(())
}

/// Pushes timer entries appended since the last scan into the heap.
fn scan_timer(store: &Store, batch: usize, s: &mut Scheduler) -> Result<()> {
    loop {
        let read = store.read_queue(schedule::TIMER_TOPIC, 0, s.timer_scanned, batch)?;
        if read.entries.is_empty() {
            s.timer_scanned = s.timer_scanned.max(read.next_offset);
            return Ok(());
        }
        for (offset, cq) in read.entries {
            if s.live.timer_delivered(offset) {
                continue;
            }
            let record = store.read_entry(&cq)?;
            let deliver_ms = deliver_at(&record.view()?);
            s.heap
                .push(Reverse((deliver_ms, offset, cq.phys_offset, cq.size)));
        }
        s.timer_scanned = read.next_offset;
    }
}

impl DelayState {
    /// Re-appends every delayed message whose time has come (broker clock) to
    /// its real topic and queue (as `topics` has it now), in delivery-time
    /// order; returns how many.
    pub(super) async fn deliver_due(&self, topics: &dyn TopicLookup) -> Result<usize> {
        let now = self.clock.now_ms();
        let opts = &self.opts;
        let mut s = self.scheduler.lock().await;
        scan_timer(&self.store, opts.batch, &mut s)?;
        let mut due = Vec::new();
        read_due_levels(&self.store, opts, &s.live, now, &mut due)?;
        while due.len() < opts.batch.saturating_mul(2)
            && s.heap.peek().is_some_and(|Reverse(t)| t.0 <= now)
        {
            let Some(Reverse((deliver_ms, offset, phys, size))) = s.heap.pop() else {
                break;
            };
            if s.live.timer_delivered(offset) {
                continue; // cancelled while it waited in the heap
            }
            match self.store.read(phys, size) {
                Ok(r) => due.push(Due {
                    deliver_ms,
                    entry: Entry::Timer { offset },
                    record: r.into_bytes(),
                    cancelled: false,
                }),
                Err(_) if offset < self.store.queue_bounds(schedule::TIMER_TOPIC, 0).0 => {
                    tracing::warn!(offset, "delayed message removed by retention; dropped");
                    s.live.mark(Entry::Timer { offset });
                    lock(&self.marks)
                        .pending
                        .push_back((0, Entry::Timer { offset }));
                }
                Err(e) => {
                    s.heap.push(Reverse((deliver_ms, offset, phys, size)));
                    return Err(e);
                }
            }
        }
        due.sort_by_key(|d| (d.deliver_ms, d.entry));
        let mut delivered = 0;
        let mut left = due.into_iter();
        while let Some(d) = left.next() {
            let delivery = if d.cancelled {
                Ok(None)
            } else {
                self.redeliver(topics, &d).await
            };
            match delivery {
                Ok(end) => {
                    s.live.mark(d.entry);
                    lock(&self.marks)
                        .pending
                        .push_back((end.unwrap_or(0), d.entry));
                    delivered += usize::from(end.is_some());
                }
                Err(e) => {
                    // Put the undelivered timer entries back; level queues are
                    // re-read from their delivered offset next tick.
                    for d in std::iter::once(d).chain(left) {
                        if let Entry::Timer { offset } = d.entry
                            && let Ok(v) = RecordView::parse(&d.record)
                        {
                            let phys = v.phys_offset().max(0) as u64;
                            s.heap
                                .push(Reverse((d.deliver_ms, offset, phys, v.total_size())));
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(delivered)
    }

    /// Appends one due message to its real topic; returns the commit-log end
    /// offset whose flush makes the delivery durable (`None`: dropped, see
    /// [`dropped`]).
    async fn redeliver(&self, topics: &dyn TopicLookup, d: &Due) -> Result<Option<u64>> {
        let view = RecordView::parse(&d.record)?;
        let Some(mut msg) = restore(&view) else {
            tracing::warn!(entry = ?d.entry, "schedule entry without its real topic; dropped");
            dropped(Dropped::Unreadable).add(1);
            return Ok(None);
        };
        let Ok(config) = topics.topic_config(&msg.topic) else {
            // Deleting a topic deletes its messages; a delayed one still waiting
            // then goes too, rather than bringing the topic's queues back (or
            // holding up its delay level's queue) for a topic nobody has.
            let id = msg.property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
            tracing::warn!(
                topic = msg.topic,
                msg_id = ?id,
                "a delayed message came due for a topic that no longer exists; dropped (rocketgate_delayed_dropped_total)"
            );
            dropped(Dropped::TopicDeleted).add(1);
            return Ok(None);
        };
        if msg.queue_id >= config.write_queues {
            msg.queue_id %= config.write_queues.max(1);
        }
        let appended = self
            .store
            .put_batch_async(std::slice::from_ref(&msg))
            .await?;
        Ok(Some(appended.last().map_or(0, |a| a.end_offset)))
    }
}

/// Why a due delayed message was not delivered.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dropped {
    /// Its real topic was deleted while it waited.
    TopicDeleted,
    /// Its schedule record names no real topic (damaged).
    Unreadable,
}

/// `rocketgate_delayed_dropped_total{reason}`: due delayed messages not
/// delivered (registered on first use of either reason, both at once).
pub(crate) fn dropped(why: Dropped) -> &'static crate::meter::Counter {
    use crate::meter::{Counter, register_counter};
    static DELETED: Counter = Counter::new();
    static UNREADABLE: Counter = Counter::new();
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (reason, c) in [("topic_deleted", &DELETED), ("unreadable", &UNREADABLE)] {
            register_counter(
                "rocketgate_delayed_dropped_total",
                "Delayed messages that came due and were not delivered, by reason.",
                &[("reason", reason)],
                c,
            );
        }
    });
    match why {
        Dropped::TopicDeleted => &DELETED,
        Dropped::Unreadable => &UNREADABLE,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::broker::topics::TopicConfig;
    use crate::clock::ManualClock;
    use crate::store::{StoreDeps, StoreSettings};

    fn opts() -> DelaySettings {
        DelaySettings::default()
    }

    /// The topic table as a plain map: the in-memory twin of the seam.
    struct Topics(HashMap<String, TopicConfig>);

    impl TopicLookup for Topics {
        fn topic_config(&self, topic: &str) -> Result<TopicConfig> {
            self.0
                .get(topic)
                .cloned()
                .ok_or_else(|| Error::TopicNotFound {
                    topic: topic.to_owned(),
                })
        }
    }

    /// Delivery needs only the store, its clock and the topic table as it is at
    /// delivery time: a topic that shrank gets the message in a queue it still
    /// has, a deleted one loses it, and nothing is delivered early.
    #[tokio::test]
    async fn due_messages_go_where_the_topic_table_says_at_delivery() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(
            dir.path(),
            StoreSettings::default(),
            StoreDeps::fixed_usage(0.1),
        )
        .unwrap();
        let store = Arc::new(store);
        let clock = Arc::new(ManualClock::new(1_000_000));
        let config = dir.path().join("config");
        std::fs::create_dir_all(&config).unwrap();
        let delay = DelayState::open(&config, store.clone(), opts(), clock.clone()).unwrap();
        for (topic, queue) in [("kept", 3), ("gone", 0)] {
            let mut m =
                Message::new(topic, queue, "x").with_property(property::DELAY_TIME_LEVEL, "1");
            let due = plan(&m, &opts(), clock.now_ms()).unwrap();
            divert(&mut m, due);
            store.put(&m).unwrap();
        }
        assert!(store.wait_dispatched(Duration::from_secs(5)));
        let topics = Topics(HashMap::from([(
            "kept".to_owned(),
            TopicConfig::new("kept", 2),
        )]));

        clock.advance(Duration::from_millis(999));
        assert_eq!(delay.deliver_due(&topics).await.unwrap(), 0);
        clock.advance(Duration::from_millis(1));
        let gone_before = dropped(Dropped::TopicDeleted).get();
        // The one for the deleted topic is dropped, counted as such, not delivered.
        assert_eq!(delay.deliver_due(&topics).await.unwrap(), 1);
        assert_eq!(dropped(Dropped::TopicDeleted).get(), gone_before + 1);
        assert!(
            crate::meter::render()
                .contains("rocketgate_delayed_dropped_total{reason=\"topic_deleted\"}")
        );
        assert!(store.wait_dispatched(Duration::from_secs(5)));
        assert_eq!(store.queue_bounds("kept", 1), (0, 1));
        assert_eq!(store.queue_bounds("kept", 3), (0, 0));
        assert_eq!(store.queue_bounds("gone", 0), (0, 0));
        assert_eq!(delay.deliver_due(&topics).await.unwrap(), 0);
        store.close().unwrap();
    }

    #[test]
    fn levels_clamp_and_times_are_capped() {
        let now = 1_000_000;
        let m = |k: &str, v: &str| Message::new("t", 0, "x").with_property(k, v);
        assert_eq!(
            plan(&Message::new("t", 0, "x"), &opts(), now).unwrap(),
            Plan::Now
        );
        assert_eq!(plan(&m("DELAY", "0"), &opts(), now).unwrap(), Plan::Now);
        assert_eq!(
            plan(&m("DELAY", "3"), &opts(), now).unwrap(),
            Plan::Level {
                level: 3,
                deliver_ms: now + 10_000
            }
        );
        assert_eq!(
            plan(&m("DELAY", "99"), &opts(), now).unwrap(),
            Plan::Level {
                level: 18,
                deliver_ms: now + 7_200_000
            }
        );
        assert!(plan(&m("DELAY", "x"), &opts(), now).is_err());
        assert_eq!(
            plan(&m("TIMER_DELAY_SEC", "5"), &opts(), now).unwrap(),
            Plan::At {
                deliver_ms: now + 5_000
            }
        );
        assert_eq!(
            plan(&m("TIMER_DELIVER_MS", "10"), &opts(), now).unwrap(),
            Plan::Now
        );
        let four_days = (4 * 24 * 3600 * 1000).to_string();
        assert!(matches!(
            plan(&m("TIMER_DELAY_MS", &four_days), &opts(), now),
            Err(Error::DelayTooLong { .. })
        ));
    }

    #[test]
    fn timer_progress_keeps_a_low_water_mark() {
        let mut p = Progress::default();
        p.mark(Entry::Timer { offset: 2 });
        p.mark(Entry::Timer { offset: 0 });
        assert_eq!(p.timer_base, 1);
        assert!(p.timer_delivered(2) && !p.timer_delivered(1));
        p.mark(Entry::Timer { offset: 1 });
        assert_eq!((p.timer_base, p.timer_done.len()), (3, 0));
        p.mark(Entry::Level {
            level: 3,
            offset: 4,
        });
        assert_eq!(p.levels[&3], 5);
    }
}
