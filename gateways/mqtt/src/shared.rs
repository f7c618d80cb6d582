//! The state every connection of the door shares: the session registry (who
//! holds which session on this door, offline sessions it owns and their
//! wills), the state log (`cluster.rs`: what every door over the broker
//! agrees on, retained messages among it), the router and the
//! shared-subscription groups. Below the connection and its parts, which reach
//! it through an `Arc<Shared>`; it knows no connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mqttbytes::v5::Publish;
use rocketgate_core::broker::{MessagingApi, QueueChoice};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use crate::cluster::{Effect, Entry, StateLog, Written, session_body};
use crate::error::Result;
use crate::message::{self, Refused};
use crate::router::Router;
use crate::session::Session;
use crate::settings::Settings;
use crate::share::Registry;
use crate::state::{Legacy, SessionRecord};
use crate::topic;
use rocketgate_core::sync::lock;

/// How a taken-over connection hands its session to the new one (or, `admin`,
/// to an administrator's kick: the client is told 0x98 Administrative action
/// instead of 0x8E Session taken over).
pub(crate) struct Takeover {
    pub to: oneshot::Sender<Box<Session>>,
    pub admin: bool,
}

impl Takeover {
    pub fn new(to: oneshot::Sender<Box<Session>>) -> Takeover {
        Takeover { to, admin: false }
    }

    pub fn send(self, session: Box<Session>) -> Result<(), Box<Session>> {
        self.to.send(session)
    }
}

pub(crate) enum Slot {
    Offline {
        session: Box<Session>,
        /// When the session ends (None: never).
        expires_at: Option<Instant>,
        /// When its will is due (None: no will pending).
        will_due: Option<Instant>,
    },
    Online {
        conn_id: u64,
        /// Taken by the connection that takes the session over.
        takeover: oneshot::Sender<Takeover>,
        /// What the admin API shows of the connection (`Streams::sessions`).
        card: Arc<crate::session::Card>,
    },
}

/// What the log said of a client id when a connection claimed it.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    /// The newest session record (resumed when this door has none of its own).
    pub record: Option<SessionRecord>,
    /// The connection holding it was on a door that died (so it ended without
    /// DISCONNECT: its will is due).
    pub holder_died: bool,
    /// The claim could not be written to the state log (a read-only slave's door, or
    /// the broker unreachable): nothing this connection does to its session is
    /// recorded, so a persistent session must not be served here.
    pub unrecorded: bool,
}

pub(crate) struct Shared<B> {
    pub api: Arc<B>,
    pub settings: Settings,
    /// The state every door over the broker shares (sessions, retained).
    pub log: Arc<StateLog>,
    pub router: Arc<Router<B>>,
    /// The shared-subscription groups served on this node (see `share/`).
    pub shares: Arc<Registry<B>>,
    pub sessions: Mutex<HashMap<String, Slot>>,
    /// The state log could not be read or written at the last try (logged once).
    log_failing: AtomicBool,
    /// The state log was loaded (else the tail loads it first).
    pub loaded: AtomicBool,
    pub shutdown: watch::Receiver<bool>,
    /// Wake every connection when `shutdown` turns true (`Handle::stop`): a
    /// connection waits on one of these, 56 bytes smaller than the watch's
    /// `changed()`. Sharded as the watch's own waiters are: a pending waiter's
    /// every poll (each turn of a connection's loop) takes its `Notify`'s lock,
    /// and one lock for every connection on every core would be contended.
    stopping: [Notify; STOP_SHARDS],
    /// Connections per client address (`auth.max_connections_per_address`).
    pub conn_limit: rocketgate_auth::ConnectionLimit,
    next_id: AtomicU64,
    active: AtomicUsize,
    idle: Notify,
    /// The `$SYS/#` values (see `sys.rs`).
    pub sys: crate::sys::Sys,
    /// The door stops because its broker is no longer master (demoted by the
    /// controller): v5 clients are told 0x9C (Use another server) instead of 0x8B.
    pub redirect_on_stop: AtomicBool,
}

/// Shards of [`Shared::stopping`] (tokio's watch uses 8 for its waiters).
const STOP_SHARDS: usize = 8;

impl<B: MessagingApi + 'static> Shared<B> {
    /// Creates the state topics when needed, loads the state log (newest
    /// snapshot and the entries after it) and imports an earlier version's files.
    pub async fn load(
        api: Arc<B>,
        settings: Settings,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self> {
        let me = loop {
            let id = rand::random::<u64>() >> 1;
            if id != 0 {
                break id;
            }
        };
        let log = Arc::new(StateLog::new(me, settings.snapshot_chunk));
        // A read-only replica (a slave) cannot create the topics, and a remote
        // broker may be away: the door starts anyway, and the tail loads the
        // state once it can (`tail.rs`).
        let loaded = match StateLog::ensure_topics(&*api).await {
            Ok(()) => log.load(&*api).await,
            Err(e) => Err(e),
        };
        if let Err(e) = &loaded {
            tracing::warn!(error = %e, "the MQTT state topics cannot be read yet; the door starts without them");
        }
        let router = Router::new(api.clone(), settings.topic_poll);
        let shared = Shared {
            conn_limit: settings.auth.connection_limit(),
            shares: Arc::new(Registry::new(api.clone(), router.clone(), me)),
            api,
            settings,
            log,
            router,
            sessions: Mutex::new(HashMap::new()),
            log_failing: AtomicBool::new(false),
            redirect_on_stop: AtomicBool::new(false),
            loaded: AtomicBool::new(loaded.is_ok()),
            shutdown,
            stopping: std::array::from_fn(|_| Notify::new()),
            next_id: AtomicU64::new(1),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            sys: crate::sys::Sys::new(),
        };
        shared
            .append(Entry::Alive {
                door: me,
                at_ms: message::now_ms(),
            })
            .await;
        if loaded.is_ok() {
            shared.import_legacy().await?;
        }
        {
            let view = lock(&shared.log.view);
            tracing::info!(
                door = me,
                sessions = view.clients.len(),
                retained = view.retained.len(),
                applied = view.applied,
                "MQTT state loaded"
            );
        }
        Ok(shared)
    }

    /// Imports the files an earlier version kept (sessions owned by this door,
    /// offline; retained messages), then moves them aside.
    async fn import_legacy(&self) -> Result<()> {
        if self.settings.state_dir.as_os_str().is_empty() {
            return Ok(());
        }
        let legacy = Legacy::new(&self.settings.state_dir);
        if !legacy.present() {
            return Ok(());
        }
        let old = legacy.read()?;
        let (n, r) = (old.sessions.len(), old.retained.len());
        for record in old.sessions {
            let w = Written {
                entry: Entry::Session {
                    client: record.client_id.clone(),
                    door: self.log.me,
                    conn: 0,
                    release: true,
                    ended: false,
                },
                body: session_body(Some(&record)),
            };
            self.log.append(&*self.api, &w).await?;
            self.adopt(record, false);
        }
        for (topic, m) in old.retained {
            self.store_retained(&topic, m.qos, m.payload, m.properties)
                .await
                .map_err(|e| {
                    crate::error::Error::Core(rocketgate_core::Error::InvalidArgument(e.reason))
                })?;
        }
        let to = legacy.move_aside()?;
        tracing::info!(sessions = n, retained = r, moved_to = %to.display(), "imported the MQTT state files into the state topics");
        Ok(())
    }

    /// Appends an entry to the state log; failures are logged (once while they last).
    pub async fn append(&self, entry: Entry) -> Option<u64> {
        self.append_written(&Written::plain(entry)).await
    }

    pub async fn append_written(&self, w: &Written) -> Option<u64> {
        match self.log.append(&*self.api, w).await {
            Ok(at) => {
                if self.log_failing.swap(false, Ordering::AcqRel) {
                    tracing::info!("the MQTT state topic takes writes again");
                }
                Some(at)
            }
            Err(e) => {
                if !self.log_failing.swap(true, Ordering::AcqRel) {
                    tracing::error!(error = %e, "writing the MQTT state topic failed");
                }
                None
            }
        }
    }

    /// An offline session this door now owns (adopted from a dead door, or
    /// imported): its expiry and a pending will counted from now; `ended`: its
    /// connection ended without DISCONNECT, so the will is due.
    pub fn adopt(&self, record: SessionRecord, _ended: bool) {
        let now = Instant::now();
        let session = Session::from_record(&record);
        let expiry = session.expiry;
        let will_due = session
            .will
            .as_ref()
            .map(|w| now + Duration::from_secs(u64::from(w.delay.min(expiry))));
        let expires_at = (expiry != u32::MAX).then(|| now + Duration::from_secs(u64::from(expiry)));
        let mut sessions = lock(&self.sessions);
        if sessions.contains_key(&record.client_id) {
            return;
        }
        sessions.insert(
            record.client_id.clone(),
            Slot::Offline {
                session: Box::new(session),
                expires_at,
                will_due,
            },
        );
    }

    /// Samples the `$SYS/#` values.
    pub fn update_sys(&self) {
        let (connected, disconnected) = {
            let sessions = lock(&self.sessions);
            let online = sessions
                .values()
                .filter(|s| matches!(s, Slot::Online { .. }))
                .count();
            (online, sessions.len() - online)
        };
        let retained = lock(&self.log.view).retained.len();
        self.sys.update(crate::sys::Sample {
            connected,
            disconnected,
            retained,
        });
    }

    /// What a connection waits on for the server's stop (check `shutdown` once
    /// it exists: a stop before it was made does not wake it). `key` spreads the
    /// connections over the shards.
    pub fn stopping(&self, key: u64) -> tokio::sync::futures::Notified<'_> {
        self.stopping[(key % STOP_SHARDS as u64) as usize].notified()
    }

    /// Wakes every connection's [`Shared::stopping`] (after `shutdown` is set).
    pub fn wake_stopping(&self) {
        for n in &self.stopping {
            n.notify_waiters();
        }
    }

    /// A connection (TCP or another stream) started.
    pub fn connection_opened(&self) {
        self.active.fetch_add(1, Ordering::AcqRel);
    }

    /// A connection ended (also when its task panicked).
    pub fn connection_closed(&self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Returns once no connection is running.
    pub async fn connections_closed(&self) {
        loop {
            let idle = self.idle.notified();
            if self.active.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The server stops: every connection has released its session (offline
    /// sessions were written when they went offline); the door says it is gone,
    /// so another door adopts its sessions (and their wills) at once.
    pub async fn save_all(&self) {
        self.append(Entry::Gone { door: self.log.me }).await;
    }

    /// The user topics of the core (the router's list when the core cannot say).
    pub async fn topics(&self) -> Vec<String> {
        match self
            .api
            .topics(rocketgate_core::broker::TopicKind::User)
            .await
        {
            Ok(t) => t.into_iter().map(|t| t.name).collect(),
            Err(_) => self.router.topic_list().borrow().to_vec(),
        }
    }

    /// Writes the session record of connection `conn` when the session
    /// outlives it (or carries a will), or says it ended when the log still has
    /// an older record of the client; `release`: the connection holds it no more.
    pub async fn save_session(&self, session: &Session, conn: u64, release: bool) {
        session.refresh_card();
        let kept = session.expiry > 0 || session.will.is_some();
        if !kept
            && !release
            && lock(&self.log.view)
                .clients
                .get(&session.client_id)
                .is_none_or(|c| c.record.is_none())
        {
            return;
        }
        let record = kept.then(|| session.record());
        let w = Written {
            entry: Entry::Session {
                client: session.client_id.clone(),
                door: self.log.me,
                conn,
                release,
                ended: record.is_none(),
            },
            body: session_body(record.as_ref()),
        };
        self.append_written(&w).await;
    }

    /// [`Shared::save_session`] of a connection that goes on holding it.
    pub async fn save_if_kept(&self, session: &Session, conn: u64) {
        self.save_session(session, conn, false).await;
    }

    /// Says that the offline session `client_id` this door owns ended.
    pub async fn session_ended(&self, client_id: &str) {
        let w = Written {
            entry: Entry::Session {
                client: client_id.to_owned(),
                door: self.log.me,
                conn: 0,
                release: true,
                ended: true,
            },
            body: bytes::Bytes::new(),
        };
        self.append_written(&w).await;
    }

    /// Whether another door's connection holds `client_id` now (as far as this
    /// door has read the log).
    fn held_elsewhere(&self, client_id: &str) -> bool {
        lock(&self.log.view)
            .clients
            .get(client_id)
            .and_then(|c| c.holder)
            .is_some_and(|(door, _)| door != self.log.me)
    }

    /// Acts on what an entry of the state log means for this door: another
    /// door's connection claimed a client id this door holds (the connection
    /// is closed with 0x8E and its session released to the log) or keeps
    /// offline (dropped; its will published when the claim is a clean start);
    /// a door died (this door adopts its sessions when it won the adoption:
    /// they become its offline sessions, their wills scheduled).
    pub async fn act(self: &Arc<Self>, effect: Effect) {
        let shared = self;
        match effect {
            Effect::Claimed {
                client,
                clean,
                displaced,
            } => {
                let me = shared.log.me;
                let slot = {
                    let mut sessions = lock(&shared.sessions);
                    match sessions.get(&client) {
                        // Only the connection the claim displaced: one that
                        // claimed after it wins (the other door closes its own).
                        Some(Slot::Online { conn_id, .. }) if displaced != Some((me, *conn_id)) => {
                            None
                        }
                        Some(_) => sessions.remove(&client),
                        None => None,
                    }
                };
                match slot {
                    Some(Slot::Online {
                        conn_id, takeover, ..
                    }) => {
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            let (tx, rx) = tokio::sync::oneshot::channel();
                            let handed = if takeover.send(Takeover::new(tx)).is_ok() {
                                tokio::time::timeout(Duration::from_secs(5), rx)
                                    .await
                                    .ok()
                                    .and_then(Result::ok)
                            } else {
                                None
                            };
                            // (None: the connection ended by itself meanwhile and
                            // released the session on its way out.)
                            if let Some(mut session) = handed {
                                if clean && let Some(w) = session.will.take() {
                                    shared.fire_will(&client, w.to_publish()).await;
                                }
                                shared.save_session(&session, conn_id, true).await;
                                tracing::debug!(client = %client, "session taken over by another door");
                            }
                        });
                    }
                    Some(Slot::Offline { mut session, .. }) => {
                        if clean && let Some(w) = session.will.take() {
                            shared.fire_will(&client, w.to_publish()).await;
                        }
                    }
                    None => {}
                }
            }
            Effect::DoorDead {
                dead,
                adopted,
                disowned,
            } => {
                shared.shares.forget_door(dead);
                let n = adopted.len();
                for (record, _online) in adopted {
                    shared.adopt(record, true);
                }
                if n > 0 {
                    tracing::info!(
                        door = dead,
                        sessions = n,
                        "adopted the sessions of a dead MQTT door"
                    );
                }
                let mut sessions = lock(&shared.sessions);
                for c in disowned {
                    if matches!(sessions.get(&c), Some(Slot::Offline { .. })) {
                        sessions.remove(&c);
                    }
                }
            }
            Effect::Retained => {}
        }
    }

    /// Claims `client_id` for connection `conn` in the log (a CONNECT); unless
    /// `clean`, reads the log up to the claim and, when another door's
    /// connection held the client id, waits (bounded) for it to release the
    /// session or for its door to be found dead: read-your-writes across doors,
    /// so a device that moved gets the newest session.
    pub async fn claim(self: &Arc<Self>, client_id: &str, conn: u64, clean: bool) -> Claimed {
        let me = self.log.me;
        let timeout = self.settings.door_timeout;
        let bound = timeout + Duration::from_secs(1);
        // The door holding the client id releases it within a tail round trip when it
        // lives; one whose liveness entries stopped for two periods is taken as gone
        // *for this session* (its other sessions wait for `door_timeout` and the
        // take-over, as before). Wrong only for a door that stalled that long: then the
        // session resumes from its last saved record and the log offsets, so messages
        // may come twice but none is lost, and the stalled door's connection is closed
        // by this claim when it catches up. Devices of a killed proxy resume ~2 s
        // sooner (docs/benchmarks.md, "Proxy mode").
        let quick = (self.settings.door_liveness * 2).min(timeout);
        let w = Written::plain(Entry::Claim {
            client: client_id.to_owned(),
            door: me,
            conn,
            clean,
        });
        let Some(at) = self.append_written(&w).await else {
            return Claimed {
                unrecorded: true,
                ..Claimed::default()
            };
        };
        let deadline = Instant::now() + bound;
        // Usually nothing came between: applied here, no wait for the tail.
        // (A claim of this door's own has no effect to act on.)
        let applied = self.log.apply_own(at, &w).0;
        if clean {
            // A clean start resumes nothing, so it needs not know who held the
            // client id before (whichever claim came first, the other door sees
            // the later one and closes its connection, or this one) — unless a
            // connection on another door holds it as far as this door knows: a
            // dead door's connection ended without DISCONNECT, and its will is
            // this connection's to publish.
            let foreign = lock(&self.log.view)
                .clients
                .get(client_id)
                .is_some_and(|c| {
                    let held = if applied { c.prev } else { c.holder };
                    held.is_some_and(|(d, _)| d != me) && !(applied && c.prev_released)
                });
            if !foreign {
                return Claimed::default();
            }
        }
        if !applied {
            let waited = Instant::now();
            self.log.wait_applied(at + 1, bound).await;
            if waited.elapsed() > Duration::from_secs(1) {
                tracing::warn!(
                    client_id,
                    waited_ms = waited.elapsed().as_millis() as u64,
                    "a CONNECT waited for the MQTT state log to apply its claim"
                );
            }
        }
        loop {
            let (done, claimed) = {
                let view = lock(&self.log.view);
                match view.clients.get(client_id) {
                    None => (true, Claimed::default()),
                    Some(c) => {
                        let mut out = Claimed {
                            record: c.record.clone(),
                            holder_died: false,
                            unrecorded: false,
                        };
                        let done = match c.prev {
                            _ if c.claim_at != at => true,
                            None => true,
                            Some((d, _)) if d == me => true,
                            Some(_) if c.prev_released => {
                                out.holder_died = c.prev_died;
                                true
                            }
                            Some((d, _)) if view.is_dead(d, quick) => {
                                out.holder_died = true;
                                true
                            }
                            Some(_) => false,
                        };
                        if !done && Instant::now() >= deadline {
                            out.holder_died = true;
                            tracing::warn!(client = %client_id, holder = ?c.prev, "the door holding the client id did not release it in time");
                            (true, out)
                        } else {
                            (done, out)
                        }
                    }
                }
            };
            if done {
                return claimed;
            }
            let next = self.log.applied() + 1;
            self.log.wait_applied(next, Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) until this door has read everything in the state log
    /// before the call.
    pub async fn catch_up(&self) {
        let bound = self.settings.door_timeout.min(Duration::from_secs(2));
        if !self.log.catch_up(&*self.api, bound).await {
            tracing::debug!("the MQTT state log was not read to its end in time");
        }
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Publishes on behalf of the gateway (wills): stored in the core, retained
    /// when flagged.
    pub async fn publish(&self, p: &Publish, client_id: &str) -> Result<(), Refused> {
        topic::check_name(&p.topic).map_err(|e| Refused {
            code: 0x90,
            reason: e.to_string(),
        })?;
        let peer: SocketAddr = ([0, 0, 0, 0], 0).into();
        let m = message::to_core(&p.topic, p, client_id, peer, message::now_ms())?;
        let props = m.properties.clone();
        self.api
            .send(m, QueueChoice::ShardingKey(client_id.to_owned()))
            .await
            .map_err(|e| Refused {
                code: 0x80,
                reason: e.to_string(),
            })?;
        if p.retain {
            self.store_retained(&p.topic, p.qos, p.payload.clone(), props)
                .await?;
        }
        Ok(())
    }

    /// Sets (or, with an empty payload, clears) the retained message of a
    /// topic: written to the state log (every door over the broker gets it from
    /// there), and into this door's view at once. Returns once it is stored.
    pub async fn store_retained(
        &self,
        name: &str,
        qos: mqttbytes::QoS,
        payload: bytes::Bytes,
        properties: Vec<(String, String)>,
    ) -> Result<(), Refused> {
        let clear = payload.is_empty();
        let w = Written {
            entry: Entry::Retained {
                topic: name.to_owned(),
                qos: qos as u8,
                properties: if clear {
                    Vec::new()
                } else {
                    properties.clone()
                },
                clear,
            },
            body: payload.clone(),
        };
        if let Err(e) = self.log.append(&*self.api, &w).await {
            return Err(Refused {
                code: 0x80,
                reason: format!("the retained message was not stored: {e}"),
            });
        }
        let mut view = lock(&self.log.view);
        if clear {
            view.retained.remove(name);
        } else {
            view.retained.insert(
                name.to_owned(),
                crate::state::Retained {
                    qos,
                    payload,
                    properties,
                },
            );
        }
        Ok(())
    }

    /// Connection `conn_id` ended: its session goes offline (or away), its will is
    /// published now or scheduled. `Err(session)` when another connection took
    /// the client id over meanwhile (it waits for the session: hand it over).
    /// The registry is checked and changed under one lock: checked first and
    /// written after saving the session's file, a client reconnecting in between
    /// had its new connection's entry overwritten by `Offline` and got a fresh
    /// session (`session_present` 0) while the old one sat in the registry.
    pub async fn session_offline(
        &self,
        mut session: Box<Session>,
        publish_will: bool,
        conn_id: u64,
    ) -> Result<(), Box<Session>> {
        let taken_over = |sessions: &HashMap<String, Slot>, id: &str| matches!(sessions.get(id), Some(Slot::Online { conn_id: c, .. }) if *c != conn_id);
        if taken_over(&lock(&self.sessions), &session.client_id) {
            if !publish_will {
                session.will = None;
            }
            if session.expiry != 0 {
                return Err(session);
            }
            // A session with expiry 0 ended with its connection (MQTT-3.1.2-23):
            // the connection that came meanwhile starts a new one.
            if let Some(w) = session.will.take().filter(|_| publish_will) {
                self.fire_will(&session.client_id, w.to_publish()).await;
            }
            return Ok(());
        }
        let now = Instant::now();
        let will = if publish_will {
            session.will.take()
        } else {
            None
        };
        if !publish_will {
            session.will = None;
        }
        let expiry = session.expiry;
        let mut fire_now = None;
        let mut will_due = None;
        if let Some(w) = will {
            if w.delay == 0 || expiry == 0 {
                fire_now = Some(w);
            } else {
                will_due = Some(now + Duration::from_secs(u64::from(w.delay.min(expiry))));
                session.will = Some(w);
            }
        }
        let client_id = session.client_id.clone();
        if expiry == 0 && will_due.is_none() {
            self.save_session(&session, conn_id, true).await;
            let mut sessions = lock(&self.sessions);
            // This connection's own `Online` entry goes too (a connection that took
            // the client id over meanwhile has another `conn_id` and keeps its
            // entry): left, every clean client stayed listed as connected, one
            // entry per client id ever seen.
            let ours = match sessions.get(&client_id) {
                Some(Slot::Offline { .. }) => true,
                Some(Slot::Online { conn_id: c, .. }) => *c == conn_id,
                None => false,
            };
            if ours {
                sessions.remove(&client_id);
            }
        } else {
            self.save_session(&session, conn_id, true).await;
            let expires_at =
                (expiry != u32::MAX).then(|| now + Duration::from_secs(u64::from(expiry)));
            let elsewhere = self.held_elsewhere(&client_id);
            let mut sessions = lock(&self.sessions);
            if taken_over(&sessions, &client_id) {
                drop(sessions);
                // (The will, if it was to wait, goes with the session.)
                session.will = session.will.take().or(fire_now);
                return Err(session);
            }
            if elsewhere {
                // Another door's connection claimed the client id meanwhile: it
                // reads the record just written; nothing stays here.
                let ours = matches!(sessions.get(&client_id), Some(Slot::Online { conn_id: c, .. }) if *c == conn_id);
                if ours {
                    sessions.remove(&client_id);
                }
            } else {
                sessions.insert(
                    client_id.clone(),
                    Slot::Offline {
                        session,
                        expires_at,
                        will_due,
                    },
                );
            }
        }
        if let Some(w) = fire_now {
            self.fire_will(&client_id, w.to_publish()).await;
        }
        Ok(())
    }

    pub async fn fire_will(&self, client_id: &str, p: Publish) {
        match self.publish(&p, client_id).await {
            Ok(()) => tracing::debug!(client = %client_id, topic = %p.topic, "will published"),
            Err(e) => tracing::warn!(client = %client_id, reason = %e.reason, "will not published"),
        }
    }

    /// Ends expired sessions and publishes due wills.
    pub async fn sweep(&self) {
        let now = Instant::now();
        let mut wills = Vec::new();
        let ended = {
            let mut sessions = lock(&self.sessions);
            let mut ended = Vec::new();
            for (id, slot) in sessions.iter_mut() {
                if let Slot::Offline {
                    session,
                    expires_at,
                    will_due,
                } = slot
                {
                    let expired = expires_at.is_some_and(|t| t <= now);
                    if (expired || will_due.is_some_and(|t| t <= now))
                        && let Some(w) = session.will.take()
                    {
                        *will_due = None;
                        wills.push((id.clone(), w));
                    }
                    if expired {
                        ended.push(id.clone());
                    }
                }
            }
            for id in &ended {
                sessions.remove(id);
                tracing::debug!(client = %id, "session expired");
            }
            ended
        };
        for id in ended {
            self.session_ended(&id).await;
        }
        for (id, w) in wills {
            let record = match lock(&self.sessions).get(&id) {
                Some(Slot::Offline { session, .. }) => Some(session.record()),
                _ => None,
            };
            if let Some(record) = record {
                let w = Written {
                    entry: Entry::Session {
                        client: id.clone(),
                        door: self.log.me,
                        conn: 0,
                        release: true,
                        ended: false,
                    },
                    body: session_body(Some(&record)),
                };
                self.append_written(&w).await;
            }
            self.fire_will(&id, w.to_publish()).await;
        }
    }
}
