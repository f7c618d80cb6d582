//! The listener, the state every connection shares (session registry, retained
//! messages, router) and the background sweeper (session expiry, delayed wills,
//! retained-message persistence).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mqttbytes::v5::Publish;
use rocketgate_core::broker::{MessagingApi, QueueChoice};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::message::{self, Refused};
use crate::router::Router;
use crate::session::Session;
use crate::state::{Files, Retained};
use crate::topic;

/// Gateway settings (the `[mqtt]` config section).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where sessions and retained messages are kept (`<data dir>/mqtt`).
    pub state_dir: PathBuf,
    /// Largest packet accepted (and announced as Maximum Packet Size in v5).
    pub max_packet_size: u32,
    /// QoS 2 publishes a client may have unfinished (Receive Maximum announced in v5).
    pub receive_maximum: u16,
    /// Outgoing QoS 1/2 messages in flight per client (further capped by the
    /// client's own Receive Maximum).
    pub max_inflight: u16,
    /// Longest session expiry granted, in seconds (also for 3.1.1 persistent sessions).
    pub max_session_expiry: u32,
    /// Longest keep-alive granted, in seconds (0: any; v5 clients are told).
    pub max_keep_alive: u16,
    /// Topic aliases a client may use towards the server (v5).
    pub topic_alias_maximum: u16,
    /// How often the topic list is re-read for wildcard subscriptions.
    pub topic_poll: Duration,
    /// How long a CONNECT may take to arrive after the socket opens.
    pub connect_timeout: Duration,
}

impl Settings {
    pub fn new(state_dir: PathBuf) -> Settings {
        Settings {
            state_dir,
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            max_inflight: 1024,
            max_session_expiry: 7 * 24 * 3600,
            max_keep_alive: 0,
            topic_alias_maximum: 64,
            topic_poll: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// How a taken-over connection hands its session to the new one.
pub(crate) type Takeover = oneshot::Sender<Box<Session>>;

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
    },
}

pub(crate) struct Shared<B> {
    pub api: Arc<B>,
    pub settings: Settings,
    pub files: Files,
    pub router: Arc<Router<B>>,
    /// The shared-subscription groups served on this node (see `share/`).
    pub shares: crate::share::Registry,
    pub sessions: Mutex<HashMap<String, Slot>>,
    pub retained: Mutex<HashMap<String, Retained>>,
    retained_dirty: AtomicBool,
    /// Held while the retained file is written (see [`Shared::persist_retained`]).
    retained_write: tokio::sync::Mutex<()>,
    pub shutdown: watch::Receiver<bool>,
    next_id: AtomicU64,
    active: AtomicUsize,
    idle: Notify,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<B: MessagingApi + 'static> Shared<B> {
    /// Saves a session that outlives its connection (or carries a will).
    pub fn save_if_kept(&self, session: &Session) {
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
            return Err(session);
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
            if matches!(sessions.get(&client_id), Some(Slot::Offline { .. })) {
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
    async fn sweep(&self) {
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

/// A bound, not yet running MQTT server.
pub struct Server<B> {
    listener: TcpListener,
    shared: Arc<Shared<B>>,
    stop_tx: watch::Sender<bool>,
}

impl<B: MessagingApi + 'static> Server<B> {
    /// Binds the listener and loads stored sessions and retained messages.
    pub async fn bind(
        addr: SocketAddr,
        api: Arc<B>,
        settings: Settings,
    ) -> Result<(Server<B>, SocketAddr)> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let local = listener.local_addr()?;
        let files = Files::open(&settings.state_dir)?;
        let retained = files.load_retained()?;
        let (stop_tx, shutdown) = watch::channel(false);
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
        let shared = Arc::new(Shared {
            api,
            settings,
            files,
            router,
            shares: Default::default(),
            sessions: Mutex::new(sessions),
            retained: Mutex::new(retained),
            retained_dirty: AtomicBool::new(false),
            retained_write: tokio::sync::Mutex::new(()),
            shutdown,
            next_id: AtomicU64::new(1),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
        });
        Ok((
            Server {
                listener,
                shared,
                stop_tx,
            },
            local,
        ))
    }

    /// Starts accepting connections.
    pub fn spawn(self) -> Handle<B> {
        let Server {
            listener,
            shared,
            stop_tx,
        } = self;
        let accept = {
            let shared = shared.clone();
            let mut stop = shared.shutdown.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.changed() => return,
                        r = listener.accept() => match r {
                            Ok((sock, peer)) => {
                                let _ = sock.set_nodelay(true);
                                spawn_connection(shared.clone(), sock, peer);
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "accept failed");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                }
            })
        };
        let sweeper = {
            let shared = shared.clone();
            let mut stop = shared.shutdown.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                loop {
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tick.tick() => shared.sweep().await,
                    }
                    shared.persist_retained().await;
                }
            })
        };
        Handle {
            streams: Streams { shared },
            stop_tx,
            tasks: vec![accept, sweeper],
        }
    }
}

fn spawn_connection<B, IO>(shared: Arc<Shared<B>>, io: IO, peer: SocketAddr)
where
    B: MessagingApi + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if *shared.shutdown.borrow() {
        return;
    }
    tokio::spawn(connection_task(shared, io, peer));
}

/// A connection's task. Its future (~1.9 KB: the `Conn` and the state of its
/// loop) is most of an idle connection's memory, and with tokio's header it sits
/// just under the allocator's 2 KiB size class: 40 bytes more in `Conn` once took
/// idle connections from 3.6 to 4.3 KiB each (docs/benchmarks.md, session 10).
/// Keep rarely used state boxed; a unit test guards the size.
fn connection_task<B, IO>(
    shared: Arc<Shared<B>>,
    io: IO,
    peer: SocketAddr,
) -> impl Future<Output = ()> + Send + 'static
where
    B: MessagingApi + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let guard = Active::new(shared.clone());
    async move {
        crate::conn::run(shared, io, peer).await;
        drop(guard);
    }
}

/// Counts a running connection until dropped (also when its task panics), so
/// [`Handle::stop`] knows when every connection is gone.
struct Active<B: MessagingApi + 'static>(Arc<Shared<B>>);

impl<B: MessagingApi + 'static> Active<B> {
    fn new(shared: Arc<Shared<B>>) -> Self {
        shared.active.fetch_add(1, Ordering::AcqRel);
        Active(shared)
    }
}

impl<B: MessagingApi + 'static> Drop for Active<B> {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Runs MQTT connections over any byte stream (MQTT over WebSocket), sharing the
/// sessions, retained messages and router of the TCP listener. Cheap to clone.
pub struct Streams<B> {
    shared: Arc<Shared<B>>,
}

impl<B> Clone for Streams<B> {
    fn clone(&self) -> Self {
        Streams {
            shared: self.shared.clone(),
        }
    }
}

impl<B: MessagingApi + 'static> Streams<B> {
    /// Runs one MQTT connection over `io` until it ends.
    pub async fn serve_stream<IO>(&self, io: IO, peer: SocketAddr)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if *self.shared.shutdown.borrow() {
            return;
        }
        let _guard = Active::new(self.shared.clone());
        crate::conn::run(self.shared.clone(), io, peer).await;
    }
}

/// A running server.
pub struct Handle<B> {
    streams: Streams<B>,
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl<B: MessagingApi + 'static> Handle<B> {
    /// Runs one MQTT connection over any byte stream (see [`Streams`]).
    pub async fn serve_stream<IO>(&self, io: IO, peer: SocketAddr)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.streams.serve_stream(io, peer).await
    }

    /// A cloneable entry point for other listeners (the WebSocket door's `/mqtt`).
    pub fn streams(&self) -> Streams<B> {
        self.streams.clone()
    }

    /// Stops accepting, closes every connection (v5 clients get DISCONNECT 0x8B),
    /// saves sessions, offsets and retained messages.
    pub async fn stop(self) {
        let _ = self.stop_tx.send(true);
        let shared = &self.streams.shared;
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        let wait = async {
            loop {
                let idle = shared.idle.notified();
                if shared.active.load(Ordering::Acquire) == 0 {
                    return;
                }
                idle.await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .is_err()
        {
            tracing::warn!("MQTT connections did not close in time");
        }
        shared.router.stop();
        shared.retained_dirty.store(true, Ordering::Release);
        shared.persist_retained().await;
        // Offline sessions are on disk already; save again for their final state.
        let records: Vec<_> = lock(&shared.sessions)
            .values()
            .filter_map(|slot| match slot {
                Slot::Offline { session, .. } => Some(session.record()),
                Slot::Online { .. } => None,
            })
            .collect();
        for r in records {
            if let Err(e) = shared.files.save_session(&r) {
                tracing::error!(client = %r.client_id, error = %e, "saving a session failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
    use rocketgate_core::store::{Store, StoreDeps, StoreSettings};

    /// The largest connection task known to stay in mimalloc's 2 KiB size class
    /// together with tokio's task header: 1,912 bytes in a release build (1,952
    /// did not: 4.3 KiB per idle connection instead of 3.6, docs/benchmarks.md,
    /// session 10). The same code makes 1,928 bytes in a debug build.
    const LARGEST_KNOWN_TO_FIT: usize = if cfg!(debug_assertions) { 1_928 } else { 1_912 };

    /// Guards the idle-connection memory target (≤ 4 KiB at 20,000): the
    /// connection task's future is most of it, and a few bytes more in `Conn`
    /// move every connection to the next size class.
    #[tokio::test]
    async fn a_connection_task_stays_in_the_allocators_2_kib_class() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            Store::open(dir.path(), StoreSettings::default(), StoreDeps::default())
                .unwrap()
                .0,
        );
        let broker = Arc::new(
            Broker::open(store, BrokerSettings::default(), Arc::new(SystemClock)).unwrap(),
        );
        let (server, _) = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            broker,
            Settings::new(dir.path().join("mqtt")),
        )
        .await
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (sock, peer) = listener.accept().await.unwrap();
        let task = connection_task(server.shared.clone(), sock, peer);
        let size = std::mem::size_of_val(&task);
        assert!(
            size <= LARGEST_KNOWN_TO_FIT,
            "the connection task is {size} bytes (at most {LARGEST_KNOWN_TO_FIT} known to fit \
             the 2 KiB class): box the new state, or raise the limit only after \
             `bench/compare --runs 1 --no-ceiling --brokers rocketgate --scenarios idle-19k` \
             still reports 3.6 KiB per connection"
        );
    }
}
