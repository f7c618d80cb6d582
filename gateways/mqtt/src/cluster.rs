//! The door's state in the broker, not in a node (docs/mqtt.md, "Where the
//! state lives"): session records, retained messages, who holds which client id
//! and which doors are alive are entries of the system topic [`STATE_TOPIC`]
//! (one queue, so one order every door agrees on), written and read through
//! [`MessagingApi`] only, so a door over a remote broker (a proxy) works the same
//! and every door over one broker shares them. Each door tails the topic and
//! keeps a [`View`]; nothing here knows a connection.
//!
//! Retention deletes old segments, so the view is also written whole, now and
//! then, to [`SNAPSHOT_TOPIC`] (in parts, as the view may be larger than a
//! message), with the state-topic offset it is current to (`as_of`); loading is
//! the newest complete snapshot plus the entries from `as_of` on, as the core's
//! own state topics do (core/src/broker/replicated.rs).
//!
//! An entry is one message: its header (an [`Entry`], JSON) in property
//! [`HEADER`], its payload (a retained message's bytes, a session record's JSON)
//! as the body, so a retained message costs what its publish cost.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use rocketgate_core::broker::{
    MessagingApi, PullRequest, PullStatus, QueueChoice, TopicConfig, filter::Filter,
};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::RecordView;
use rocketgate_core::sync::lock;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::state::{Retained, SessionRecord, qos_of};

/// The state topic: every change, in one order (queue 0).
pub const STATE_TOPIC: &str = "rmq_sys_rg_door_mqtt_state";
/// Snapshots of the whole view, in parts (queue 0).
pub const SNAPSHOT_TOPIC: &str = "rmq_sys_rg_door_mqtt_snapshot";
/// The property holding an entry's header.
const HEADER: &str = "mqtt.state";
/// The (never committed) group the door reads its state topics as.
const READER: &str = "mqtt%state";

/// A connection of a door: (door id, connection id). Connection 0 is the door
/// itself (the sweeper ending an offline session, an adoption).
pub type Holder = (u64, u64);

/// One entry of [`STATE_TOPIC`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Entry {
    /// Connection `conn` of `door` takes client id `client` (a CONNECT): the
    /// holder before it closes its connection (MQTT 5: DISCONNECT 0x8E) and
    /// releases the session.
    Claim {
        client: String,
        door: u64,
        conn: u64,
        clean: bool,
    },
    /// The session record written by its holder (or, offline, its owner);
    /// `release`: the writer holds it no more; no record (body empty): the
    /// session ended.
    Session {
        client: String,
        door: u64,
        conn: u64,
        release: bool,
        #[serde(default)]
        ended: bool,
    },
    /// A retained message set (the body; properties and QoS here) or cleared
    /// (`clear`).
    Retained {
        topic: String,
        qos: u8,
        #[serde(default)]
        properties: Vec<(String, String)>,
        #[serde(default)]
        clear: bool,
    },
    /// A door is alive (its wall clock, ms).
    Alive { door: u64, at_ms: i64 },
    /// A door stopped: its sessions are orphaned at once.
    Gone { door: u64 },
    /// `by` takes over the sessions of the dead door `dead` (the first such
    /// entry in the log decides: its wills are published once).
    Adopt { dead: u64, by: u64 },
    /// A snapshot current to `as_of` was written (`at_ms`: when).
    Snapshot { as_of: u64, at_ms: i64 },
}

/// One entry with its body, as read or to be written.
#[derive(Debug, Clone)]
pub struct Written {
    pub entry: Entry,
    pub body: Bytes,
}

impl Written {
    pub fn plain(entry: Entry) -> Written {
        Written {
            entry,
            body: Bytes::new(),
        }
    }

    fn to_message(&self) -> Message {
        let mut m = Message::new(STATE_TOPIC, 0, self.body.clone());
        let header = serde_json::to_string(&self.entry).unwrap_or_default();
        m.properties.push((HEADER.to_owned(), header));
        m.born_timestamp = crate::message::now_ms();
        m
    }

    fn parse(record: &[u8]) -> Option<Written> {
        let view = RecordView::parse(record).ok()?;
        let header = view.properties().find(|(k, _)| *k == HEADER)?.1;
        let entry = serde_json::from_str(header).ok()?;
        Some(Written {
            entry,
            body: Bytes::copy_from_slice(view.body()),
        })
    }
}

/// What the log says of one client id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Client {
    /// The newest session record (`None`: no session kept).
    pub record: Option<SessionRecord>,
    /// The connection that claimed it last and has not released it.
    pub holder: Option<Holder>,
    /// The door responsible for it while no connection holds it (session
    /// expiry, a delayed will): the last one that released it.
    pub owner: u64,
    /// Offset of the newest claim.
    pub claim_at: u64,
    /// The holder the newest claim displaced, and whether it has released since
    /// (the claimer waits for that before it reads `record`).
    pub prev: Option<Holder>,
    pub prev_released: bool,
    /// The displaced holder's door was adopted before it released: its
    /// connection ended without DISCONNECT (the claimer publishes its will).
    #[serde(default)]
    pub prev_died: bool,
    /// The holder has written a record since its claim (the displaced holder's
    /// late writes are then stale).
    pub holder_wrote: bool,
}

/// What the log says of one door.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Door {
    /// Its newest liveness entry (its clock).
    pub at_ms: i64,
    pub gone: bool,
    pub adopted_by: Option<u64>,
    /// When this door applied its newest liveness entry.
    #[serde(skip)]
    pub seen: Option<Instant>,
}

/// A change a door acts on after applying an entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Another door's connection claimed `client`: a local connection of it is
    /// closed (0x8E) and its session released; a local offline session is dropped
    /// (its pending will published when `clean`).
    Claimed {
        client: String,
        clean: bool,
        /// The connection the claim displaced (a connection of this door that
        /// claimed later than this one is not closed: its own claim displaces
        /// the other door's in turn).
        displaced: Option<Holder>,
    },
    /// A door was found dead (the first adoption of it in the log): its
    /// sessions this door adopted become its offline sessions (`true`: the dead
    /// door's connection held it, so it ended without DISCONNECT and its will
    /// is due); `disowned`: offline sessions this door had that another door
    /// adopted (this door was taken for dead), dropped here.
    DoorDead {
        dead: u64,
        adopted: Vec<(SessionRecord, bool)>,
        disowned: Vec<String>,
    },
    /// A retained message changed (already applied to the view's map).
    Retained,
}

/// The state as the log says it, current to `applied`.
#[derive(Debug, Default)]
pub struct View {
    pub clients: HashMap<String, Client>,
    pub retained: HashMap<String, Retained>,
    pub doors: HashMap<u64, Door>,
    /// The next offset of [`STATE_TOPIC`] to apply.
    pub applied: u64,
    /// The newest snapshot entry seen: (as_of, at_ms).
    pub last_snapshot: Option<(u64, i64)>,
    /// Entries applied since the newest snapshot.
    pub since_snapshot: u64,
}

impl View {
    /// Applies the entry at `offset`; returns what `me` must do about it.
    pub fn apply(&mut self, me: u64, offset: u64, w: Written, now_ms: i64) -> Option<Effect> {
        self.applied = offset + 1;
        self.since_snapshot += 1;
        match w.entry {
            Entry::Claim {
                client,
                door,
                conn,
                clean,
            } => {
                let c = self.clients.entry(client.clone()).or_default();
                c.prev = c.holder;
                c.prev_released = c.holder.is_none();
                c.prev_died = false;
                c.holder = Some((door, conn));
                c.holder_wrote = false;
                c.claim_at = offset;
                let displaced = c.prev;
                (door != me).then_some(Effect::Claimed {
                    client,
                    clean,
                    displaced,
                })
            }
            Entry::Session {
                client,
                door,
                conn,
                release,
                ended,
            } => {
                let record = if ended {
                    None
                } else {
                    serde_json::from_slice::<SessionRecord>(&w.body).ok()
                };
                let who = (door, conn);
                let c = self.clients.entry(client.clone()).or_default();
                // Connection 0 is the door speaking for one of its connections
                // (an administrator's kick).
                let is = |h: Option<Holder>| {
                    h == Some(who) || (conn == 0 && h.is_some_and(|(d, _)| d == door))
                };
                if is(c.holder) {
                    c.record = record;
                    c.holder_wrote = true;
                    if release {
                        c.holder = None;
                        c.owner = door;
                    }
                } else if is(c.prev) && !c.holder_wrote {
                    c.record = record;
                    if release {
                        c.prev_released = true;
                        if c.holder.is_none() {
                            c.owner = door;
                        }
                    }
                } else if c.holder.is_none() && (c.owner == door || c.owner == 0) {
                    c.record = record;
                    c.owner = door;
                } else {
                    return None;
                }
                if c.holder.is_none() && c.record.is_none() {
                    self.clients.remove(&client);
                }
                None
            }
            Entry::Retained {
                topic,
                qos,
                properties,
                clear,
            } => {
                if clear || w.body.is_empty() {
                    self.retained.remove(&topic);
                } else {
                    self.retained.insert(
                        topic,
                        Retained {
                            qos: qos_of(qos),
                            payload: w.body,
                            properties,
                        },
                    );
                }
                Some(Effect::Retained)
            }
            Entry::Alive { door, at_ms } => {
                let d = self.doors.entry(door).or_default();
                d.at_ms = d.at_ms.max(at_ms);
                let age = Duration::from_millis(now_ms.saturating_sub(at_ms).max(0) as u64);
                let now = Instant::now();
                d.seen = Some(now.checked_sub(age).unwrap_or(now));
                None
            }
            Entry::Gone { door } => {
                self.doors.entry(door).or_default().gone = true;
                None
            }
            Entry::Adopt { dead, by } => {
                let d = self.doors.entry(dead).or_default();
                if d.adopted_by.is_some() || dead == by {
                    return None;
                }
                d.adopted_by = Some(by);
                let mut adopted = Vec::new();
                let mut disowned = Vec::new();
                for (id, c) in self.clients.iter_mut() {
                    let online = c.holder.is_some_and(|(d, _)| d == dead);
                    let offline = c.holder.is_none() && c.owner == dead;
                    if c.prev.is_some_and(|(d, _)| d == dead) && !c.prev_released {
                        // A claimer waiting for the dead door's release waits no more.
                        c.prev_released = true;
                        c.prev_died = true;
                    }
                    if !(online || offline) {
                        if c.holder.is_none() && c.owner == me && by != me && dead == me {
                            disowned.push(id.clone());
                        }
                        continue;
                    }
                    c.holder = None;
                    c.owner = by;
                    if dead == me && by != me {
                        disowned.push(id.clone());
                    }
                    if by == me
                        && let Some(r) = &c.record
                    {
                        adopted.push((r.clone(), online));
                    }
                }
                Some(Effect::DoorDead {
                    dead,
                    adopted,
                    disowned,
                })
            }
            Entry::Snapshot { as_of, at_ms } => {
                if self.last_snapshot.is_none_or(|(a, _)| a <= as_of) {
                    self.last_snapshot = Some((as_of, at_ms));
                    self.since_snapshot = offset.saturating_sub(as_of);
                }
                None
            }
        }
    }

    /// Whether `door` is to be taken as dead (gone, adopted, or silent past `timeout`).
    pub fn is_dead(&self, door: u64, timeout: Duration) -> bool {
        match self.doors.get(&door) {
            Some(d) => {
                d.gone || d.adopted_by.is_some() || d.seen.is_none_or(|s| s.elapsed() > timeout)
            }
            None => true,
        }
    }

    /// Doors to adopt: dead, not adopted yet, and holding or owning sessions
    /// (or just gone or silent: adopting them keeps the list short).
    pub fn orphaned(&self, me: u64, timeout: Duration) -> Vec<u64> {
        self.doors
            .keys()
            .copied()
            .filter(|d| *d != me && self.doors[d].adopted_by.is_none() && self.is_dead(*d, timeout))
            .collect()
    }
}

/// A retained message in a snapshot: topic, QoS, payload (base64), properties.
type SnapshotRetained = (String, u8, String, Vec<(String, String)>);

/// A snapshot as written to [`SNAPSHOT_TOPIC`].
#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    version: u32,
    as_of: u64,
    clients: Vec<(String, Client)>,
    retained: Vec<SnapshotRetained>,
    doors: Vec<(u64, Door)>,
}

/// The snapshot header of one part (property [`HEADER`] of a snapshot message).
#[derive(Serialize, Deserialize)]
struct Part {
    id: u64,
    part: u32,
    parts: u32,
}

/// The door's state log: its view and how to read and write the topics.
pub struct StateLog {
    pub me: u64,
    pub view: Mutex<View>,
    applied_tx: watch::Sender<u64>,
    /// Largest snapshot part, in bytes.
    pub chunk: usize,
}

fn pull_req(topic: &str, offset: u64, max: usize, wait: Duration) -> PullRequest {
    PullRequest {
        group: READER.into(),
        member: String::new(),
        topic: topic.to_owned(),
        queue_id: 0,
        offset,
        max_messages: max,
        filter: Filter::all(),
        wait,
    }
}

impl StateLog {
    pub fn new(me: u64, chunk: usize) -> StateLog {
        StateLog {
            me,
            view: Mutex::new(View::default()),
            applied_tx: watch::channel(0).0,
            chunk: chunk.max(1024),
        }
    }

    /// Creates the state topics when they do not exist yet (one queue each).
    pub async fn ensure_topics<B: MessagingApi>(api: &B) -> rocketgate_core::Result<()> {
        for t in [STATE_TOPIC, SNAPSHOT_TOPIC] {
            if api.topic(t).await.is_ok() {
                continue;
            }
            match api.create_topic(TopicConfig::new(t, 1)).await {
                Ok(_) | Err(rocketgate_core::Error::TopicExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Appends an entry; returns its offset in [`STATE_TOPIC`].
    pub async fn append<B: MessagingApi>(
        &self,
        api: &B,
        w: &Written,
    ) -> rocketgate_core::Result<u64> {
        let sent = api.send(w.to_message(), QueueChoice::Queue(0)).await?;
        Ok(sent.append.queue_offset)
    }

    /// The end of [`STATE_TOPIC`] (the offset the next entry gets).
    pub async fn end<B: MessagingApi>(api: &B) -> rocketgate_core::Result<u64> {
        let stats = api.queue_stats(STATE_TOPIC).await?;
        Ok(stats.first().map_or(0, |s| s.max_offset))
    }

    pub fn applied(&self) -> u64 {
        self.applied_tx.borrow().to_owned()
    }

    /// Waits (at most `bound`) until every entry below `offset` is applied;
    /// false when the bound ran out.
    pub async fn wait_applied(&self, offset: u64, bound: Duration) -> bool {
        let mut rx = self.applied_tx.subscribe();
        tokio::time::timeout(bound, rx.wait_for(|a| *a >= offset))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Read-your-writes: waits until this door has applied everything stored
    /// in the state topic before the call (bounded).
    pub async fn catch_up<B: MessagingApi>(&self, api: &B, bound: Duration) -> bool {
        match Self::end(api).await {
            Ok(end) => self.wait_applied(end, bound).await,
            Err(_) => false,
        }
    }

    /// Reads entries from `from` (waiting up to `wait` when there is none):
    /// `(offset, entry)` in order, and where to read next.
    pub async fn read<B: MessagingApi>(
        api: &B,
        from: u64,
        wait: Duration,
    ) -> rocketgate_core::Result<(Vec<(u64, Written)>, u64)> {
        let r = api.pull(pull_req(STATE_TOPIC, from, 256, wait)).await?;
        let mut out = Vec::with_capacity(r.messages.len());
        for m in &r.messages {
            match Written::parse(&m.record) {
                Some(w) => out.push((m.queue_offset, w)),
                None => tracing::warn!(
                    offset = m.queue_offset,
                    "unreadable MQTT state entry skipped"
                ),
            }
        }
        let next = match r.status {
            PullStatus::OffsetMoved => {
                if from < r.min_offset {
                    tracing::error!(
                        from,
                        min = r.min_offset,
                        "MQTT state entries were deleted before a snapshot covered them"
                    );
                }
                r.next_offset
            }
            _ => r.next_offset,
        };
        Ok((out, next))
    }

    /// Applies entries read; returns the effects for this door.
    pub fn apply_all(&self, entries: Vec<(u64, Written)>, next: u64) -> Vec<Effect> {
        let now_ms = crate::message::now_ms();
        let mut effects = Vec::new();
        {
            let mut view = lock(&self.view);
            for (offset, w) in entries {
                if offset < view.applied {
                    continue;
                }
                if let Some(e) = view.apply(self.me, offset, w, now_ms) {
                    effects.push(e);
                }
            }
            view.applied = view.applied.max(next);
        }
        let applied = lock(&self.view).applied;
        self.applied_tx.send_if_modified(|a| {
            let moved = *a < applied;
            *a = (*a).max(applied);
            moved
        });
        effects
    }

    /// Applies an entry this door just wrote at `offset` when it is the next
    /// one to apply (nothing of another door came between): the writer needs
    /// not wait for the tail to read it back. False when something came
    /// between (the tail applies them in order).
    pub fn apply_own(&self, offset: u64, w: &Written) -> (bool, Option<Effect>) {
        let effect = {
            let mut view = lock(&self.view);
            if view.applied != offset {
                return (false, None);
            }
            view.apply(self.me, offset, w.clone(), crate::message::now_ms())
        };
        let applied = offset + 1;
        self.applied_tx.send_if_modified(|a| {
            let moved = *a < applied;
            *a = (*a).max(applied);
            moved
        });
        (true, effect)
    }

    /// Loads the newest complete snapshot (if any) into the view, then every
    /// entry after it up to the end of the topic. Effects of the replay are
    /// returned (adoptions recorded by this door id cannot be among them: the id
    /// is new).
    pub async fn load<B: MessagingApi>(&self, api: &B) -> rocketgate_core::Result<()> {
        let start = match self.read_snapshot(api).await? {
            Some(body) => {
                let mut view = lock(&self.view);
                view.clients = body.clients.into_iter().collect();
                view.retained = body
                    .retained
                    .into_iter()
                    .map(|(t, q, p, props)| {
                        (
                            t,
                            Retained {
                                qos: qos_of(q),
                                payload: Bytes::from(B64.decode(p).unwrap_or_default()),
                                properties: props,
                            },
                        )
                    })
                    .collect();
                let now_ms = crate::message::now_ms();
                view.doors = body
                    .doors
                    .into_iter()
                    .map(|(id, mut d)| {
                        let age =
                            Duration::from_millis(now_ms.saturating_sub(d.at_ms).max(0) as u64);
                        let now = Instant::now();
                        d.seen = Some(now.checked_sub(age).unwrap_or(now));
                        (id, d)
                    })
                    .collect();
                view.applied = body.as_of;
                body.as_of
            }
            None => {
                let stats = api.queue_stats(STATE_TOPIC).await?;
                stats.first().map_or(0, |s| s.min_offset)
            }
        };
        let end = Self::end(api).await?;
        let mut at = start;
        while at < end {
            let (entries, next) = Self::read(api, at, Duration::ZERO).await?;
            if next <= at && entries.is_empty() {
                break;
            }
            self.apply_all(entries, next);
            at = next;
        }
        let applied = lock(&self.view).applied.max(at);
        lock(&self.view).applied = applied;
        self.applied_tx.send_replace(applied);
        Ok(())
    }

    /// Writes the view as a snapshot (in parts of at most `chunk` bytes), then a
    /// [`Entry::Snapshot`] naming it.
    pub async fn write_snapshot<B: MessagingApi>(&self, api: &B) -> rocketgate_core::Result<()> {
        let (bytes, as_of) = {
            let view = lock(&self.view);
            let body = SnapshotBody {
                version: 1,
                as_of: view.applied,
                clients: view
                    .clients
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                retained: view
                    .retained
                    .iter()
                    .map(|(t, r)| {
                        (
                            t.clone(),
                            r.qos as u8,
                            B64.encode(&r.payload),
                            r.properties.clone(),
                        )
                    })
                    .collect(),
                doors: view
                    .doors
                    .iter()
                    .filter(|(_, d)| d.adopted_by.is_none())
                    .map(|(k, v)| (*k, v.clone()))
                    .collect(),
            };
            (
                serde_json::to_vec(&body).map_err(|e| {
                    rocketgate_core::Error::InvalidArgument(format!("MQTT snapshot: {e}"))
                })?,
                view.applied,
            )
        };
        let id = rand::random::<u64>() >> 1;
        let parts: Vec<&[u8]> = if bytes.is_empty() {
            vec![&[][..]]
        } else {
            bytes.chunks(self.chunk).collect()
        };
        let n = parts.len() as u32;
        for (i, p) in parts.into_iter().enumerate() {
            let mut m = Message::new(SNAPSHOT_TOPIC, 0, Bytes::copy_from_slice(p));
            let header = serde_json::to_string(&Part {
                id,
                part: i as u32,
                parts: n,
            })
            .unwrap_or_default();
            m.properties.push((HEADER.to_owned(), header));
            api.send(m, QueueChoice::Queue(0)).await?;
        }
        let at_ms = crate::message::now_ms();
        self.append(api, &Written::plain(Entry::Snapshot { as_of, at_ms }))
            .await?;
        tracing::debug!(
            as_of,
            bytes = bytes.len(),
            parts = n,
            "MQTT state snapshot written"
        );
        Ok(())
    }

    /// The newest snapshot whose parts are all there (parts of snapshots
    /// written concurrently by two doors may interleave).
    async fn read_snapshot<B: MessagingApi>(
        &self,
        api: &B,
    ) -> rocketgate_core::Result<Option<SnapshotBody>> {
        let stats = api.queue_stats(SNAPSHOT_TOPIC).await?;
        let Some(q) = stats.first() else {
            return Ok(None);
        };
        let (min, max) = (q.min_offset, q.max_offset);
        if max <= min {
            return Ok(None);
        }
        let mut window = 64u64;
        loop {
            let from = max.saturating_sub(window).max(min);
            // id -> (parts, newest offset, part -> bytes)
            let mut found: HashMap<u64, (u32, u64, HashMap<u32, Bytes>)> = HashMap::new();
            let mut at = from;
            while at < max {
                let r = api
                    .pull(pull_req(SNAPSHOT_TOPIC, at, 64, Duration::ZERO))
                    .await?;
                if r.messages.is_empty() {
                    break;
                }
                for m in &r.messages {
                    let Ok(view) = RecordView::parse(&m.record) else {
                        continue;
                    };
                    let Some(part) = view
                        .properties()
                        .find(|(k, _)| *k == HEADER)
                        .and_then(|(_, h)| serde_json::from_str::<Part>(h).ok())
                    else {
                        continue;
                    };
                    let e = found
                        .entry(part.id)
                        .or_insert_with(|| (part.parts, 0, HashMap::new()));
                    e.1 = e.1.max(m.queue_offset);
                    e.2.insert(part.part, Bytes::copy_from_slice(view.body()));
                }
                at = r.next_offset;
            }
            let mut complete: Vec<_> = found
                .into_values()
                .filter(|(n, _, parts)| (0..*n).all(|i| parts.contains_key(&i)))
                .collect();
            complete.sort_by_key(|(_, newest, _)| std::cmp::Reverse(*newest));
            for (n, _, parts) in complete {
                let mut bytes = Vec::new();
                for i in 0..n {
                    bytes.extend_from_slice(&parts[&i]);
                }
                match serde_json::from_slice::<SnapshotBody>(&bytes) {
                    Ok(b) => return Ok(Some(b)),
                    Err(e) => tracing::error!(error = %e, "unreadable MQTT state snapshot skipped"),
                }
            }
            if from == min {
                return Ok(None);
            }
            window *= 4;
        }
    }
}

/// The record of a session entry's body.
pub fn session_body(record: Option<&SessionRecord>) -> Bytes {
    record
        .and_then(|r| serde_json::to_vec(r).ok())
        .map(Bytes::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> SessionRecord {
        SessionRecord {
            client_id: id.into(),
            expiry: 60,
            subscriptions: vec![],
            will: None,
            qos2_incoming: vec![],
        }
    }

    fn session(
        client: &str,
        door: u64,
        conn: u64,
        release: bool,
        r: Option<&SessionRecord>,
    ) -> Written {
        Written {
            entry: Entry::Session {
                client: client.into(),
                door,
                conn,
                release,
                ended: r.is_none(),
            },
            body: session_body(r),
        }
    }

    fn claim(client: &str, door: u64, conn: u64) -> Written {
        Written::plain(Entry::Claim {
            client: client.into(),
            door,
            conn,
            clean: false,
        })
    }

    #[test]
    fn a_claim_displaces_the_holder_until_it_releases() {
        let mut v = View::default();
        assert_eq!(v.apply(1, 0, claim("c", 1, 7), 0), None);
        v.apply(1, 1, session("c", 1, 7, false, Some(&rec("c"))), 0);
        // Door 2 claims: door 1 is told.
        assert_eq!(
            v.apply(1, 2, claim("c", 2, 3), 0),
            Some(Effect::Claimed {
                client: "c".into(),
                clean: false,
                displaced: Some((1, 7)),
            })
        );
        let c = &v.clients["c"];
        assert_eq!((c.prev, c.prev_released), (Some((1, 7)), false));
        let mut r = rec("c");
        r.expiry = 99;
        v.apply(1, 3, session("c", 1, 7, true, Some(&r)), 0);
        let c = &v.clients["c"];
        assert!(c.prev_released);
        assert_eq!(c.record.as_ref().unwrap().expiry, 99);
        assert_eq!(c.holder, Some((2, 3)));
        // Door 2 writes; a late write of door 1 is stale then.
        v.apply(1, 4, session("c", 2, 3, false, Some(&rec("c"))), 0);
        v.apply(1, 5, session("c", 1, 7, true, Some(&r)), 0);
        assert_eq!(v.clients["c"].record.as_ref().unwrap().expiry, 60);
        // Released and ended: gone.
        v.apply(1, 6, session("c", 2, 3, true, None), 0);
        assert!(!v.clients.contains_key("c"));
    }

    #[test]
    fn a_door_releases_for_its_connection_after_an_administrators_kick() {
        let mut v = View::default();
        v.apply(1, 0, claim("k", 1, 7), 0);
        v.apply(1, 1, session("k", 1, 0, true, Some(&rec("k"))), 0);
        let c = &v.clients["k"];
        assert_eq!((c.holder, c.owner), (None, 1));
        // Another door's connection 0 does not speak for door 1's.
        v.apply(1, 2, claim("k", 1, 8), 0);
        v.apply(1, 3, session("k", 2, 0, true, None), 0);
        assert_eq!(v.clients["k"].holder, Some((1, 8)));
    }

    #[test]
    fn the_first_adoption_in_the_log_wins() {
        let mut v = View::default();
        v.apply(3, 0, claim("a", 1, 1), 0);
        v.apply(3, 1, session("a", 1, 1, false, Some(&rec("a"))), 0);
        v.apply(3, 2, claim("b", 1, 2), 0);
        v.apply(3, 3, session("b", 1, 2, true, Some(&rec("b"))), 0);
        let e = v.apply(3, 4, Written::plain(Entry::Adopt { dead: 1, by: 3 }), 0);
        let Some(Effect::DoorDead {
            adopted: mut sessions,
            ..
        }) = e
        else {
            panic!("{e:?}")
        };
        sessions.sort_by(|x, y| x.0.client_id.cmp(&y.0.client_id));
        assert_eq!(
            sessions
                .iter()
                .map(|(r, o)| (r.client_id.as_str(), *o))
                .collect::<Vec<_>>(),
            [("a", true), ("b", false)]
        );
        assert_eq!(
            v.apply(3, 5, Written::plain(Entry::Adopt { dead: 1, by: 2 }), 0),
            None
        );
        assert_eq!(v.clients["a"].owner, 3);
        assert!(v.is_dead(1, Duration::from_secs(60)));
    }

    #[test]
    fn retained_entries_set_and_clear() {
        let mut v = View::default();
        let set = Written {
            entry: Entry::Retained {
                topic: "a/b".into(),
                qos: 1,
                properties: vec![],
                clear: false,
            },
            body: Bytes::from_static(b"x"),
        };
        v.apply(1, 0, set, 0);
        assert_eq!(v.retained["a/b"].payload, Bytes::from_static(b"x"));
        let clear = Written::plain(Entry::Retained {
            topic: "a/b".into(),
            qos: 0,
            properties: vec![],
            clear: true,
        });
        v.apply(1, 1, clear, 0);
        assert!(v.retained.is_empty());
    }

    /// Snapshots in parts, written while entries keep coming, and a second
    /// writer's parts interleaved: a new door loads the newest complete one plus
    /// the entries after it and has the same view as one that read everything.
    #[tokio::test]
    async fn a_view_loads_from_the_newest_snapshot_and_the_entries_after_it() {
        use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
        use rocketgate_core::store::{Store, StoreDeps, StoreSettings};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            Store::open(
                dir.path(),
                StoreSettings::default(),
                StoreDeps::fixed_usage(0.1),
            )
            .unwrap()
            .0,
        );
        let broker = Arc::new(
            Broker::open(store, BrokerSettings::default(), Arc::new(SystemClock)).unwrap(),
        );
        StateLog::ensure_topics(&*broker).await.unwrap();
        let writer = StateLog::new(1, 1024);
        let other = StateLog::new(2, 1024);
        let append = async |log: &StateLog, w: Written| {
            let at = log.append(&*broker, &w).await.unwrap();
            let (entries, next) = StateLog::read(&*broker, at, Duration::ZERO).await.unwrap();
            log.apply_all(entries, next);
            // (`other` follows too, so its snapshot is current.)
            let (entries, next) = StateLog::read(&*broker, other.applied(), Duration::ZERO)
                .await
                .unwrap();
            other.apply_all(entries, next);
        };
        let retained = |i: usize, body: &[u8]| Written {
            entry: Entry::Retained {
                topic: format!("r/{i}"),
                qos: 1,
                properties: vec![],
                clear: body.is_empty(),
            },
            body: Bytes::copy_from_slice(body),
        };
        for i in 0..40 {
            append(&writer, retained(i, &[b'x'; 300])).await;
            let mut r = rec(&format!("c{i}"));
            r.expiry = i as u32;
            append(&writer, claim(&format!("c{i}"), 1, i as u64)).await;
            append(
                &writer,
                session(&format!("c{i}"), 1, i as u64, true, Some(&r)),
            )
            .await;
        }
        // Two snapshots of many parts; the second writer's parts come between.
        let (a, b) = tokio::join!(
            writer.write_snapshot(&*broker),
            other.write_snapshot(&*broker)
        );
        a.unwrap();
        b.unwrap();
        // The newest snapshot carries a mark no entry made: a load that used it
        // has the mark.
        lock(&writer.view).retained.insert(
            "snap/only".into(),
            Retained {
                qos: qos_of(0),
                payload: Bytes::from_static(b"mark"),
                properties: vec![],
            },
        );
        writer.write_snapshot(&*broker).await.unwrap();
        lock(&writer.view).retained.remove("snap/only");
        for i in 0..10 {
            append(&writer, retained(i, b"")).await;
            append(&writer, session(&format!("c{i}"), 1, i as u64, true, None)).await;
        }
        append(&writer, claim("c20", 2, 99)).await;

        let fresh = StateLog::new(3, 1024);
        fresh.load(&*broker).await.unwrap();
        let (v, w) = (lock(&fresh.view), lock(&writer.view));
        assert!(v.last_snapshot.is_some(), "the snapshot entry was seen");
        assert!(
            v.retained.contains_key("snap/only"),
            "loaded from the snapshot"
        );
        let mut r = v.retained.clone();
        r.remove("snap/only");
        assert_eq!(r.len(), 30);
        assert_eq!(r, w.retained);
        assert_eq!(v.clients, w.clients);
        assert_eq!(v.clients["c20"].holder, Some((2, 99)));
        assert_eq!(v.clients["c25"].record.as_ref().unwrap().expiry, 25);
        assert_eq!(v.applied, w.applied);
    }
}
