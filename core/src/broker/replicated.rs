//! Broker state that travels through the replicated log (docs/replication.md,
//! "What a failover needs"): one replication path for the log and its metadata.
//!
//! - The topic table and the subscription groups' settings: a master appends a
//!   snapshot of both (JSON) to the system topic [`TOPICS_TOPIC`] when a slave joins and
//!   whenever they changed (checked every second, and at once on a topic change); a
//!   slave applies the newest snapshot its log holds. A snapshot, not a change list, so
//!   a slave needs only the last record (retention may delete the older ones) and
//!   applying one twice is harmless.
//! - Consumer offsets: the table can be large and changes all the time, so a master
//!   appends **change records** to [`OFFSETS_TOPIC`] (the offsets that moved since the
//!   last record, at most once a second) and a **full** record when a slave joins and
//!   every [`FULL_OFFSETS_EVERY`] changes records; a slave applies every record past the
//!   last one it applied, in log order. A full record after any gap (a slave that was
//!   away longer than retention) puts it right again. Positions committed through the
//!   slave's own doors go the other way (an OFFSETS frame of the stream,
//!   [`Broker::local_offset_changes`] → [`Broker::merge_slave_offsets`]): the master
//!   takes the higher of each, and a master's record does not move such a position
//!   back until the master has confirmed it. At least once, never a gap.
//! - POP state (per group, topic and queue: the cursor and the in-flight leases with
//!   their invisible-until times, attempts and revisions): like the offsets, change
//!   records in [`POP_TOPIC`] (each queue whose state changed since the last record,
//!   whole; `null` for a queue the master forgot), at most once a second, and a full
//!   record when a slave joins and every [`FULL_POP_EVERY`] change records. A slave
//!   sets each named queue to the master's state, in log order, and keeps it in its
//!   own `pop.json` (never its commit log), so once promoted it serves the group from
//!   there: acked messages are not delivered again, in-flight ones reappear after
//!   their invisible time (receipt handles the master issued still ack them), and the
//!   cursor skips nothing. Bound: what changed in the master's last second plus the
//!   replication lag (an ack in that window is delivered again; a POP in that window
//!   is delivered again at once, without waiting for its invisible time).
//! - Delay progress (per level: the next schedule offset to deliver; the timers'
//!   low-water mark and the delivered ones above it; cancelled entries): small, so a
//!   **snapshot** in [`DELAY_TOPIC`] whenever it changed (checked every second and on
//!   a join); a slave takes the newest as its own `delay.json`. A record only counts
//!   re-appends that precede it in the log, so a promoted slave loses no delayed
//!   message; it delivers again those the master delivered in its last second (plus
//!   the replication lag).
//! - Transaction state needs no record of its own: the decisions are the op records
//!   of `RMQ_SYS_TRANS_OP_HALF_TOPIC`, already in the log, and a broker re-reads them
//!   at open, so a promoted slave checks back only undecided halves and never commits
//!   a rolled-back one. Check counts do not travel (a half may be checked up to
//!   `transaction_max_checks` more times after a failover).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::group_config::GroupConfig;
use super::local::Broker;
use super::pop_state::PopQueue;
use super::schedule;
use super::topics::{TopicConfig, TopicKind};
use crate::store::Message;
use crate::{Error, Result};

/// The system topic the topic-table snapshots go to (queue 0).
pub const TOPICS_TOPIC: &str = "rmq_sys_rg_topics";

/// The system topic consumer-offset records go to (queue 0).
pub const OFFSETS_TOPIC: &str = "rmq_sys_rg_offsets";

/// A full offset record is written at least once per this many change records.
pub const FULL_OFFSETS_EVERY: u32 = 600;

/// The system topic delay-progress snapshots go to (queue 0).
pub const DELAY_TOPIC: &str = "rmq_sys_rg_delay";

/// One record of [`DELAY_TOPIC`].
#[derive(Serialize, Deserialize)]
struct DelayRecord {
    version: u32,
    progress: super::delay::Progress,
}

/// The system topic POP-state records go to (queue 0).
pub const POP_TOPIC: &str = "rmq_sys_rg_pop";

/// A full POP record is written at least once per this many change records.
pub const FULL_POP_EVERY: u32 = 600;

type PopQueues = BTreeMap<String, BTreeMap<String, BTreeMap<u32, PopQueue>>>;
/// group -> topic -> queue id -> state (`None`: forgotten).
type PopChanges = BTreeMap<String, BTreeMap<String, BTreeMap<u32, Option<PopQueue>>>>;

/// One record of [`POP_TOPIC`].
#[derive(Serialize, Deserialize)]
struct PopRecord {
    version: u32,
    /// Every queue state the master has (a slave drops the ones not named).
    full: bool,
    queues: PopChanges,
}

/// What a master has written to [`POP_TOPIC`] so far (see [`Broker::publish_pop`]).
#[derive(Default)]
pub struct PopPublisher {
    seen: Option<u64>,
    written: PopQueues,
    since_full: Option<u32>,
}

impl PopPublisher {
    /// The next record is a full one (a slave joined).
    pub fn want_full(&mut self) {
        self.since_full = None;
    }
}

type OffsetMap = BTreeMap<String, BTreeMap<String, BTreeMap<u32, u64>>>;

/// One record of [`OFFSETS_TOPIC`].
#[derive(Serialize, Deserialize)]
struct OffsetRecord {
    version: u32,
    /// Every offset the master has (else only the ones that moved).
    full: bool,
    /// owner -> topic -> queue id -> next offset.
    offsets: OffsetMap,
    /// owner -> topics whose offsets the master dropped since the last record (a
    /// deleted group or topic); a slave drops them too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    removed: BTreeMap<String, Vec<String>>,
}

/// What a master has written to [`OFFSETS_TOPIC`] so far (see
/// [`Broker::publish_offsets`]).
#[derive(Default)]
pub struct OffsetPublisher {
    /// The offset table's version last looked at.
    seen: Option<u64>,
    /// The offsets as the log has them.
    written: OffsetMap,
    /// Change records since the last full one (`None`: no full record yet).
    since_full: Option<u32>,
}

impl OffsetPublisher {
    /// The next record is a full one (a slave joined).
    pub fn want_full(&mut self) {
        self.since_full = None;
    }
}

#[derive(Serialize, Deserialize)]
struct TopicSnapshot {
    version: u32,
    topics: Vec<TopicConfig>,
    /// Subscription groups' remembered settings (mode, max reconsume times).
    #[serde(default)]
    groups: std::collections::BTreeMap<String, GroupConfig>,
}

impl Broker {
    /// The topic table as one record for [`TOPICS_TOPIC`].
    pub fn topic_snapshot_message(&self) -> Result<Message> {
        let topics = self
            .topic_snapshot(TopicKind::All)
            .into_iter()
            .filter(|t| t.name != TOPICS_TOPIC)
            .collect();
        let groups = self.group_configs.all();
        let body = serde_json::to_vec(&TopicSnapshot {
            version: 1,
            topics,
            groups,
        })
        .map_err(|e| Error::InvalidArgument(format!("topic snapshot: {e}")))?;
        Ok(Message::new(TOPICS_TOPIC, 0, body))
    }

    /// On a master: appends the metadata snapshot to the log unless it equals
    /// `last` (the body written before; `None` writes anyway). Returns the body now in
    /// the log. Under sync replication the record does not wait for its copies: it
    /// reaches slaves with the log whenever they follow.
    pub async fn publish_topic_snapshot(&self, last: Option<&[u8]>) -> Result<Vec<u8>> {
        let msg = self.topic_snapshot_message()?;
        if last == Some(&msg.body[..]) {
            return Ok(msg.body.to_vec());
        }
        self.append_system_record(&msg).await?;
        Ok(msg.body.to_vec())
    }

    /// On a slave: applies the newest topic snapshot in the replicated log if it is
    /// past queue offset `applied` (`None`: none applied yet). Creates and updates
    /// topics to match, deletes user topics the master no longer has. Returns the
    /// queue offset of the snapshot now applied.
    pub fn apply_replicated_topics(&self, applied: Option<u64>) -> Result<Option<u64>> {
        let Some((last, body)) = self.newest_system_record(TOPICS_TOPIC, applied)? else {
            return Ok(applied);
        };
        let snap: TopicSnapshot = serde_json::from_slice(&body)
            .map_err(|e| Error::InvalidMessage(format!("bad topic snapshot at {last}: {e}")))?;
        let mut changed = 0;
        let mut dropped: Vec<String> = Vec::new();
        {
            let mut table = self.topics_write();
            for t in &snap.topics {
                let r = match table.get(&t.name) {
                    Some(now) if now == t => continue,
                    Some(_) => table.update(t.clone()),
                    None if t.is_system() => table.create_system(t.clone()),
                    None => table.create(t.clone()),
                };
                match r {
                    Ok(_) => changed += 1,
                    Err(e) => {
                        tracing::warn!(topic = t.name, error = %e, "cannot apply a replicated topic")
                    }
                }
            }
            let keep: std::collections::HashSet<&str> =
                snap.topics.iter().map(|t| t.name.as_str()).collect();
            // User topics, and the retry and dead-letter topics of groups (a deleted
            // group's go with it); other system topics are the broker's own.
            let droppable = |name: &str| {
                !schedule::is_system_topic(name)
                    || schedule::retry_topic_group(name).is_some()
                    || schedule::dlq_topic_group(name).is_some()
            };
            for t in table.list(TopicKind::All) {
                if !keep.contains(t.name.as_str()) && droppable(&t.name) {
                    if let Err(e) = table.delete(&t.name) {
                        tracing::warn!(topic = t.name, error = %e, "cannot drop a topic the master deleted");
                    } else {
                        changed += 1;
                        dropped.push(t.name);
                    }
                }
            }
        }
        for topic in &dropped {
            // As the master did: the topic's positions and consume queues go too.
            self.offsets.table().remove_topic(topic);
            self.pop.table().remove_topic(topic);
            if let Err(e) = self.store.remove_topic(topic) {
                tracing::warn!(topic, error = %e, "cannot remove the consume queues of a deleted topic");
            }
        }
        let mine = self.group_configs.all();
        for (group, config) in &snap.groups {
            if mine.get(group) != Some(config) {
                let c = config.clone();
                match self.group_configs.update(group, |g| *g = c) {
                    Ok(()) => changed += 1,
                    Err(e) => tracing::warn!(group, error = %e, "cannot apply a replicated group"),
                }
            }
        }
        for group in mine.keys().filter(|g| !snap.groups.contains_key(*g)) {
            match self
                .group_configs
                .update(group, |g| *g = GroupConfig::default())
            {
                Ok(()) => changed += 1,
                Err(e) => {
                    tracing::warn!(group, error = %e, "cannot drop a group the master forgot")
                }
            }
        }
        if changed > 0 {
            tracing::info!(
                changed,
                topics = snap.topics.len(),
                groups = snap.groups.len(),
                "applied the master's topic table and groups"
            );
            self.note_topics_changed();
        }
        Ok(Some(last))
    }

    /// On a master: appends to [`OFFSETS_TOPIC`] what moved in the offset table since
    /// the last call (or everything, when a full record is due). Writes nothing when
    /// nothing moved. Returns the number of offsets written. Like the topic snapshot,
    /// the record does not wait for its copies under sync replication.
    pub async fn publish_offsets(&self, p: &mut OffsetPublisher) -> Result<usize> {
        let full = p.since_full.is_none_or(|n| n >= FULL_OFFSETS_EVERY);
        let (now, version) = {
            let t = self.offsets.table();
            if !full && p.seen == Some(t.version()) {
                return Ok(0);
            }
            (t.all(), t.version())
        };
        let offsets: OffsetMap = if full {
            now.clone()
        } else {
            let mut changed = OffsetMap::new();
            for (owner, topics) in &now {
                for (topic, queues) in topics {
                    for (q, off) in queues {
                        let before = p
                            .written
                            .get(owner)
                            .and_then(|t| t.get(topic))
                            .and_then(|qs| qs.get(q));
                        if before != Some(off) {
                            changed
                                .entry(owner.clone())
                                .or_default()
                                .entry(topic.clone())
                                .or_default()
                                .insert(*q, *off);
                        }
                    }
                }
            }
            changed
        };
        let count: usize = offsets
            .values()
            .flat_map(|t| t.values())
            .map(|q| q.len())
            .sum();
        // Tombstones: what the log has and the table no longer does.
        let mut removed: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (owner, topics) in &p.written {
            for topic in topics.keys() {
                if now.get(owner).is_none_or(|t| !t.contains_key(topic)) {
                    removed
                        .entry(owner.clone())
                        .or_default()
                        .push(topic.clone());
                }
            }
        }
        if count == 0 && removed.is_empty() && !full {
            p.seen = Some(version);
            return Ok(0);
        }
        let body = serde_json::to_vec(&OffsetRecord {
            version: 1,
            full,
            offsets,
            removed,
        })
        .map_err(|e| Error::InvalidArgument(format!("offset record: {e}")))?;
        let msg = Message::new(OFFSETS_TOPIC, 0, body);
        self.append_system_record(&msg).await?;
        p.seen = Some(version);
        p.written = now;
        p.since_full = Some(if full {
            0
        } else {
            p.since_full.unwrap_or(0) + 1
        });
        Ok(count)
    }

    /// On a slave: applies every record of [`OFFSETS_TOPIC`] past queue offset
    /// `applied` (`None`: none yet) to this broker's offset table, in log order.
    /// Returns the queue offset of the last record applied.
    pub fn apply_replicated_offsets(&self, applied: Option<u64>) -> Result<Option<u64>> {
        let mut set = 0usize;
        let last = self.each_system_record(OFFSETS_TOPIC, applied, |qoff, body| {
            match serde_json::from_slice::<OffsetRecord>(body) {
                Ok(r) => {
                    let mut t = self.offsets.table();
                    for (owner, topics) in &r.removed {
                        for topic in topics {
                            if t.remove_from_master(owner, topic) {
                                set += 1;
                            }
                        }
                    }
                    for (owner, topics) in &r.offsets {
                        for (topic, queues) in topics {
                            for (q, off) in queues {
                                if t.set_from_master(owner, topic, *q, *off) {
                                    set += 1;
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(offset = qoff, error = %e, "skipping a bad offset record")
                }
            }
        })?;
        if set > 0 {
            tracing::debug!(set, "applied the master's consumer offsets");
        }
        Ok(last)
    }

    /// On a slave: the consumer positions committed through this node's doors that
    /// its master has not confirmed, as the JSON body of an OFFSETS frame; `None`
    /// when there are none.
    pub fn local_offset_changes(&self) -> Option<Vec<u8>> {
        let changes = self.offsets.table().local_changes();
        if changes.is_empty() {
            return None;
        }
        serde_json::to_vec(&changes).ok()
    }

    /// On a master: a slave's consumer positions (the body of its OFFSETS frame); each
    /// is taken where it is ahead of this master's, so a group that consumed on the
    /// slave while the master was away goes on from there. Returns how many moved.
    pub fn merge_slave_offsets(&self, body: &[u8]) -> Result<usize> {
        let changes: OffsetMap = serde_json::from_slice(body)
            .map_err(|e| Error::InvalidArgument(format!("slave offsets: {e}")))?;
        let mut taken = Vec::new();
        {
            let mut t = self.offsets.table();
            for (owner, topics) in &changes {
                for (topic, queues) in topics {
                    for (q, off) in queues {
                        if t.get(owner, topic, *q).is_none_or(|now| now < *off) {
                            t.set(owner, topic, *q, *off);
                            taken.push((owner, topic, *q, *off));
                        }
                    }
                }
            }
        }
        // A POP group's cursor here must move with its offset, or the next POP on
        // this master hands out again what the group consumed on the slave (the
        // offset alone only says where a group with no POP state starts).
        {
            let mut pop = self.pop.table();
            for (owner, topic, q, off) in &taken {
                pop.advance_to(owner, topic, *q, *off);
            }
        }
        let moved = taken.len();
        if moved > 0 {
            tracing::info!(
                moved,
                "took consumer positions a slave's consumers committed"
            );
        }
        Ok(moved)
    }

    /// On a master: appends to [`POP_TOPIC`] the POP queue states that changed since
    /// the last call (or all of them, when a full record is due). Writes nothing when
    /// nothing changed. Returns the number of queue states written. Does not wait for
    /// copies under sync replication (like [`Broker::publish_offsets`]).
    pub async fn publish_pop(&self, p: &mut PopPublisher) -> Result<usize> {
        let full = p.since_full.is_none_or(|n| n >= FULL_POP_EVERY);
        let (now, version) = {
            let t = self.pop.table();
            if !full && p.seen == Some(t.version()) {
                return Ok(0);
            }
            (t.all(), t.version())
        };
        let mut queues = PopChanges::new();
        let mut count = 0usize;
        for (group, topics) in &now {
            for (topic, qs) in topics {
                for (q, state) in qs {
                    let before = p
                        .written
                        .get(group)
                        .and_then(|t| t.get(topic))
                        .and_then(|qs| qs.get(q));
                    if full || before != Some(state) {
                        queues
                            .entry(group.clone())
                            .or_default()
                            .entry(topic.clone())
                            .or_default()
                            .insert(*q, Some(state.clone()));
                        count += 1;
                    }
                }
            }
        }
        if !full {
            for (group, topics) in &p.written {
                for (topic, qs) in topics {
                    for q in qs.keys() {
                        let still = now
                            .get(group)
                            .and_then(|t| t.get(topic))
                            .is_some_and(|qs| qs.contains_key(q));
                        if !still {
                            queues
                                .entry(group.clone())
                                .or_default()
                                .entry(topic.clone())
                                .or_default()
                                .insert(*q, None);
                            count += 1;
                        }
                    }
                }
            }
        }
        if count == 0 && !full {
            p.seen = Some(version);
            return Ok(0);
        }
        let body = serde_json::to_vec(&PopRecord {
            version: 1,
            full,
            queues,
        })
        .map_err(|e| Error::InvalidArgument(format!("POP record: {e}")))?;
        let msg = Message::new(POP_TOPIC, 0, body);
        self.append_system_record(&msg).await?;
        p.seen = Some(version);
        p.written = now;
        p.since_full = Some(if full {
            0
        } else {
            p.since_full.unwrap_or(0) + 1
        });
        Ok(count)
    }

    /// On a slave: applies every record of [`POP_TOPIC`] past queue offset `applied`
    /// (`None`: none yet) to this broker's POP state, in log order; a full record
    /// also drops the queue states it does not name. Returns the queue offset of the
    /// last record applied.
    pub fn apply_replicated_pop(&self, applied: Option<u64>) -> Result<Option<u64>> {
        let mut set = 0usize;
        let last =
            self.each_system_record(
                POP_TOPIC,
                applied,
                |qoff, body| match serde_json::from_slice::<PopRecord>(body) {
                    Ok(r) => {
                        let mut t = self.pop.table();
                        if r.full {
                            set += t.retain_from_master(&r.queues);
                        }
                        for (group, topics) in &r.queues {
                            for (topic, qs) in topics {
                                for (q, state) in qs {
                                    if t.set_from_master(group, topic, *q, state.as_ref()) {
                                        set += 1;
                                    }
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(offset = qoff, error = %e, "skipping a bad POP record")
                    }
                },
            )?;
        if set > 0 {
            tracing::debug!(set, "applied the master's POP state");
        }
        Ok(last)
    }

    /// On a master: appends the delay progress (every re-append made so far) to
    /// [`DELAY_TOPIC`] unless its body equals `last` (`None` writes anyway). Returns
    /// the body now in the log. Does not wait for copies under sync replication.
    pub async fn publish_delay_progress(&self, last: Option<&[u8]>) -> Result<Vec<u8>> {
        let body = serde_json::to_vec(&DelayRecord {
            version: 1,
            progress: self.delay.appended_progress(),
        })
        .map_err(|e| Error::InvalidArgument(format!("delay record: {e}")))?;
        if last == Some(&body[..]) {
            return Ok(body);
        }
        let msg = Message::new(DELAY_TOPIC, 0, body);
        self.append_system_record(&msg).await?;
        Ok(msg.body.to_vec())
    }

    /// On a slave: takes the newest delay-progress snapshot in the replicated log as
    /// this broker's, if it is past queue offset `applied` (`None`: none yet).
    /// Returns the queue offset of the snapshot now applied.
    pub fn apply_replicated_delay(&self, applied: Option<u64>) -> Result<Option<u64>> {
        let Some((last, body)) = self.newest_system_record(DELAY_TOPIC, applied)? else {
            return Ok(applied);
        };
        let r: DelayRecord = serde_json::from_slice(&body)
            .map_err(|e| Error::InvalidMessage(format!("bad delay record at {last}: {e}")))?;
        if self.delay.adopt(r.progress) {
            tracing::debug!("applied the master's delay progress");
        }
        Ok(Some(last))
    }

    /// Appends one record of a system topic that carries state to slaves. Under sync
    /// replication it does not wait for its copies (a timeout or a missing in-sync slave
    /// still leaves it in the log, which slaves copy whenever they follow).
    async fn append_system_record(&self, msg: &Message) -> Result<()> {
        match self.store.put_batch_async(std::slice::from_ref(msg)).await {
            Ok(_) | Err(Error::ReplicationTimeout { .. }) | Err(Error::NoInSyncReplica { .. }) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The newest record of a snapshot topic (queue 0) when it is past queue offset
    /// `applied`: its queue offset and body.
    fn newest_system_record(
        &self,
        topic: &str,
        applied: Option<u64>,
    ) -> Result<Option<(u64, Vec<u8>)>> {
        let (min, max) = self.store.queue_bounds(topic, 0);
        if max == min || applied.is_some_and(|a| a + 1 >= max) {
            return Ok(None);
        }
        let last = max - 1;
        let read = self.store.read_queue(topic, 0, last, 1)?;
        let Some((_, entry)) = read.entries.first() else {
            return Ok(None);
        };
        let rec = self.store.read_entry(entry)?;
        Ok(Some((last, rec.view()?.body().to_vec())))
    }

    /// Hands every record of a change-record topic (queue 0) past queue offset
    /// `applied` to `apply`, in log order; returns the queue offset of the last one.
    fn each_system_record(
        &self,
        topic: &str,
        applied: Option<u64>,
        mut apply: impl FnMut(u64, &[u8]),
    ) -> Result<Option<u64>> {
        let (min, max) = self.store.queue_bounds(topic, 0);
        let mut next = applied.map_or(min, |a| (a + 1).max(min));
        let mut last = applied;
        while next < max {
            let read = self.store.read_queue(topic, 0, next, 64)?;
            if read.entries.is_empty() {
                break;
            }
            for (qoff, entry) in &read.entries {
                let rec = self.store.read_entry(entry)?;
                apply(*qoff, rec.view()?.body());
                last = Some(*qoff);
                next = qoff + 1;
            }
        }
        Ok(last)
    }
}
