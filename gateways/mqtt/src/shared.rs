//! The state every connection of the door shares: the session registry (who
//! holds which session, offline sessions and their wills), retained messages,
//! the router and the shared-subscription groups. Below the connection and its
//! parts, which reach it through an `Arc<Shared>`; it knows no connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mqttbytes::v5::Publish;
use rocketgate_core::broker::{MessagingApi, QueueChoice};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use crate::error::Result;
use crate::message::{self, Refused};
use crate::router::Router;
use crate::session::Session;
use crate::settings::Settings;
use crate::share::Registry;
use crate::state::{Files, Retained};
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

pub(crate) struct Shared<B> {
    pub api: Arc<B>,
    pub settings: Settings,
    pub files: Files,
    pub router: Arc<Router<B>>,
    /// The shared-subscription groups served on this node (see `share/`).
    pub shares: Arc<Registry<B>>,
    pub sessions: Mutex<HashMap<String, Slot>>,
    pub retained: Mutex<HashMap<String, Retained>>,
    retained_dirty: AtomicBool,
    /// Held while the retained file is written (see [`Shared::persist_retained`]).
    retained_write: tokio::sync::Mutex<()>,
    pub shutdown: watch::Receiver<bool>,
    /// Connections per client address (`auth.max_connections_per_address`).
    pub conn_limit: rocketgate_auth::ConnectionLimit,
    next_id: AtomicU64,
    active: AtomicUsize,
    idle: Notify,
    /// The `$SYS/#` values (see `sys.rs`).
    pub sys: crate::sys::Sys,
}

impl<B: MessagingApi + 'static> Shared<B> {
    /// Opens the state directory and loads the stored sessions (offline, their
    /// expiry and wills counted from now) and retained messages.
    pub fn load(api: Arc<B>, settings: Settings, shutdown: watch::Receiver<bool>) -> Result<Self> {
        let files = Files::open(&settings.state_dir)?;
        let retained = files.load_retained()?;
        let router = Router::new(api.clone(), settings.topic_poll);
        let now = Instant::now();
        let mut sessions = HashMap::new();
        for record in files.load_sessions()? {
            let session = Session::from_record(&record);
            let expiry = session.expiry;
            let will_due = session
                .will
                .as_ref()
                .map(|w| now + Duration::from_secs(u64::from(w.delay.min(expiry))));
            let expires_at =
                (expiry != u32::MAX).then(|| now + Duration::from_secs(u64::from(expiry)));
            sessions.insert(
                record.client_id.clone(),
                Slot::Offline {
                    session: Box::new(session),
                    expires_at,
                    will_due,
                },
            );
        }
        tracing::info!(
            sessions = sessions.len(),
            retained = retained.len(),
            "MQTT state loaded"
        );
        Ok(Shared {
            conn_limit: settings.auth.connection_limit(),
            shares: Arc::new(Registry::new(api.clone(), router.clone())),
            api,
            settings,
            files,
            router,
            sessions: Mutex::new(sessions),
            retained: Mutex::new(retained),
            retained_dirty: AtomicBool::new(false),
            retained_write: tokio::sync::Mutex::new(()),
            shutdown,
            next_id: AtomicU64::new(1),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            sys: crate::sys::Sys::new(),
        })
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
        let retained = lock(&self.retained).len();
        self.sys.update(crate::sys::Sample {
            connected,
            disconnected,
            retained,
        });
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

    /// The server stops: retained messages and every offline session written
    /// in their final state (offline sessions are on disk already).
    pub async fn save_all(&self) {
        self.retained_dirty.store(true, Ordering::Release);
        self.persist_retained().await;
        let records: Vec<_> = lock(&self.sessions)
            .values()
            .filter_map(|slot| match slot {
                Slot::Offline { session, .. } => Some(session.record()),
                Slot::Online { .. } => None,
            })
            .collect();
        for r in records {
            if let Err(e) = self.files.save_session(&r) {
                tracing::error!(client = %r.client_id, error = %e, "saving a session failed");
            }
        }
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

    /// Saves a session that outlives its connection (or carries a will).
    pub fn save_if_kept(&self, session: &Session) {
        session.refresh_card();
        if (session.expiry > 0 || session.will.is_some())
            && let Err(e) = self.files.save_session(&session.record())
        {
            tracing::error!(client = %session.client_id, error = %e, "saving a session failed");
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
            self.set_retained(&p.topic, p.qos, p.payload.clone(), props);
            self.persist_retained().await;
        }
        Ok(())
    }

    /// Sets (or, with an empty payload, clears) the retained message of a topic.
    pub fn set_retained(
        &self,
        name: &str,
        qos: mqttbytes::QoS,
        payload: bytes::Bytes,
        properties: Vec<(String, String)>,
    ) {
        {
            let mut r = lock(&self.retained);
            if payload.is_empty() {
                r.remove(name);
            } else {
                r.insert(
                    name.to_owned(),
                    Retained {
                        qos,
                        payload,
                        properties,
                    },
                );
            }
        }
        self.retained_dirty.store(true, Ordering::Release);
    }

    /// Writes the retained messages if they changed; returns once every change
    /// made before the call is on disk (a publish setting a retained message is
    /// acknowledged after this). Concurrent callers share one write.
    pub async fn persist_retained(&self) {
        let _writing = self.retained_write.lock().await;
        if self.retained_dirty.swap(false, Ordering::AcqRel) {
            let snapshot = lock(&self.retained).clone();
            if let Err(e) = self.files.save_retained(&snapshot) {
                tracing::error!(error = %e, "saving retained messages failed");
                self.retained_dirty.store(true, Ordering::Release);
            }
        }
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
            self.files.remove_session(&client_id);
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
            if let Err(e) = self.files.save_session(&session.record()) {
                tracing::error!(client = %client_id, error = %e, "saving a session failed");
            }
            let expires_at =
                (expiry != u32::MAX).then(|| now + Duration::from_secs(u64::from(expiry)));
            let mut sessions = lock(&self.sessions);
            if taken_over(&sessions, &client_id) {
                drop(sessions);
                // (The will, if it was to wait, goes with the session.)
                session.will = session.will.take().or(fire_now);
                return Err(session);
            }
            sessions.insert(
                client_id.clone(),
                Slot::Offline {
                    session,
                    expires_at,
                    will_due,
                },
            );
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
        {
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
            for id in ended {
                sessions.remove(&id);
                self.files.remove_session(&id);
                tracing::debug!(client = %id, "session expired");
            }
        }
        for (id, w) in wills {
            if let Some(Slot::Offline { session, .. }) = lock(&self.sessions).get(&id)
                && let Err(e) = self.files.save_session(&session.record())
            {
                tracing::error!(client = %id, error = %e, "saving a session failed");
            }
            self.fire_will(&id, w.to_publish()).await;
        }
    }
}
