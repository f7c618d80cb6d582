//! The listener, the background sweeper (session expiry, delayed wills) and
//! the state log's tail and keeper (`tail.rs`): the top of the door, which starts a
//! connection task (`conn.rs`) per socket over the state they share
//! (`shared.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::broker::MessagingApi;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use rocketgate_tls::{Acceptor, Incoming, Mode};

use crate::conn::TlsIdentity;
use crate::error::{Error, Result};
pub use crate::settings::Settings;
use crate::shared::{Shared, Slot, Takeover};

/// A bound, not yet running MQTT server.
pub struct Server<B> {
    listener: TcpListener,
    /// MQTT over TLS (port 8883), when added with [`Server::with_tls`].
    tls: Option<Incoming>,
    shared: Arc<Shared<B>>,
    stop_tx: watch::Sender<bool>,
}

impl<B: MessagingApi + 'static> Server<B> {
    /// Binds the listener and loads the state log (sessions, retained messages)
    /// from the broker's state topics, importing an earlier version's files.
    pub async fn bind(
        addr: SocketAddr,
        api: Arc<B>,
        settings: Settings,
    ) -> Result<(Server<B>, SocketAddr)> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let local = listener.local_addr()?;
        let (stop_tx, shutdown) = watch::channel(false);
        let shared = Arc::new(Shared::load(api, settings, shutdown).await?);
        register_meters(&shared);
        Ok((
            Server {
                listener,
                tls: None,
                shared,
                stop_tx,
            },
            local,
        ))
    }

    /// Adds a TLS listener on `addr` (the plain one stays), returning the address
    /// bound. Handshakes run on tasks of their own; a connection that finishes one
    /// is served exactly like a plain one.
    pub async fn with_tls(
        mut self,
        addr: SocketAddr,
        acceptor: Acceptor,
    ) -> Result<(Server<B>, SocketAddr)> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let incoming = Incoming::new(listener, Mode::Tls(acceptor), "mqtt")?;
        let local = incoming.local_addr();
        self.tls = Some(incoming);
        Ok((self, local))
    }

    /// Starts accepting connections.
    pub fn spawn(self) -> Handle<B> {
        let Server {
            listener,
            tls,
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
                                spawn_connection(shared.clone(), sock, peer, ());
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
                }
            })
        };
        let tail = tokio::spawn(crate::tail::tail(shared.clone()));
        let keeper = tokio::spawn(crate::tail::keeper(shared.clone()));
        let mut tasks = vec![accept, sweeper, tail, keeper];
        if let Some(every) = crate::sys::period(shared.settings.sys_interval) {
            let shared = shared.clone();
            let mut stop = shared.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tick.tick() => shared.update_sys(),
                    }
                }
            }));
        }
        if let Some(mut incoming) = tls {
            let shared = shared.clone();
            let mut stop = shared.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.changed() => return,
                        c = incoming.accept() => {
                            spawn_connection(shared.clone(), c.stream, c.peer, c.tls_identity)
                        }
                    }
                }
            }));
        }
        Handle {
            streams: Streams { shared },
            stop_tx,
            tasks,
        }
    }
}

fn spawn_connection<B, IO, I>(shared: Arc<Shared<B>>, io: IO, peer: SocketAddr, tls_identity: I)
where
    B: MessagingApi + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    I: TlsIdentity,
{
    if *shared.shutdown.borrow() {
        return;
    }
    tokio::spawn(connection_task(shared, io, peer, tls_identity));
}

/// A connection's task. Its future (~1.1 KB: the `Conn` and the state of its
/// loop) is the largest part of an idle connection's memory. Tokio's task cell
/// adds 104 bytes and rounds to 128, and the allocator rounds that to a size
/// class (1,280, 1,536 or 2,048 bytes here): 40 bytes more in `Conn` once took
/// idle connections from 3.6 to 4.3 KiB each (docs/benchmarks.md, session 10); a
/// kept CONNECT plus the arguments held twice put every task in the 2 KiB class
/// until 2026-12-07, and the topic-list waiter and the shutdown watch's waiter
/// kept it in the 1.5 KiB one until 2026-12-08. Keep rarely used state boxed; a
/// unit test guards the size.
fn connection_task<B, IO, I>(
    shared: Arc<Shared<B>>,
    io: IO,
    peer: SocketAddr,
    tls_identity: I,
) -> impl Future<Output = ()> + Send + 'static
where
    B: MessagingApi + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    I: TlsIdentity,
{
    // The guard goes into the connection's own future: an `async` block around
    // it would keep a second copy of the arguments (or of the whole future) for
    // the task's whole life.
    let guard = Active::new(shared.clone());
    crate::conn::run(Box::new(crate::conn::Opened {
        shared,
        io,
        peer,
        tls_identity,
        guard,
    }))
}

/// Counts a running connection until dropped (also when its task panics), so
/// [`Handle::stop`] knows when every connection is gone.
struct Active<B: MessagingApi + 'static>(Arc<Shared<B>>);

impl<B: MessagingApi + 'static> Active<B> {
    fn new(shared: Arc<Shared<B>>) -> Self {
        shared.connection_opened();
        metrics::gauge!("rocketgate_connections", "protocol" => "mqtt").increment(1.0);
        Active(shared)
    }
}

impl<B: MessagingApi + 'static> Drop for Active<B> {
    fn drop(&mut self) {
        self.0.connection_closed();
        metrics::gauge!("rocketgate_connections", "protocol" => "mqtt").decrement(1.0);
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
    /// Spawns the task serving one MQTT connection over `io` (MQTT over
    /// WebSocket) and returns. The task is the connection's own future: spawning
    /// an `async` block around [`Streams::serve_stream`] instead keeps two more
    /// copies of `io` and the other arguments in every connection's task.
    pub fn spawn_stream<IO>(&self, io: IO, peer: SocketAddr, tls_identity: Option<String>)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if *self.shared.shutdown.borrow() {
            return;
        }
        let guard = Active::new(self.shared.clone());
        tokio::spawn(crate::conn::run(Box::new(crate::conn::Opened {
            shared: self.shared.clone(),
            io,
            peer,
            tls_identity,
            guard,
        })));
    }

    /// Runs one MQTT connection over `io` until it ends. `tls_identity`: the
    /// verified client certificate's name when the stream came over TLS with one
    /// (MQTT over WSS with mTLS).
    pub async fn serve_stream<IO>(&self, io: IO, peer: SocketAddr, tls_identity: Option<String>)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if *self.shared.shutdown.borrow() {
            return;
        }
        let guard = Active::new(self.shared.clone());
        crate::conn::run(Box::new(crate::conn::Opened {
            shared: self.shared.clone(),
            io,
            peer,
            tls_identity,
            guard,
        }))
        .await;
    }
}

/// A session as the admin API shows it ([`Streams::sessions`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub client_id: String,
    pub connected: bool,
    /// Seconds the session outlives its connection (`u32::MAX`: never).
    pub expiry: u32,
    /// (filter, QoS)
    pub subscriptions: Vec<(String, u8)>,
    /// Messages sent and not yet acknowledged (as of the last second).
    pub inflight: usize,
    /// A will waiting to be published.
    pub will: bool,
    /// While connected: the client's address, when it connected (unix ms),
    /// its protocol version (4 or 5), clean start and user.
    pub peer: Option<SocketAddr>,
    pub since_ms: Option<i64>,
    pub protocol_version: Option<u8>,
    pub clean_start: Option<bool>,
    pub user: Option<String>,
}

/// What [`Streams::kick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kicked {
    /// It had a connection, now closed (v5: DISCONNECT 0x98 Administrative action).
    pub disconnected: bool,
    /// The session (subscriptions, offsets, pending will) was dropped too; a
    /// pending will was published.
    pub discarded: bool,
}

impl<B: MessagingApi + 'static> Streams<B> {
    /// Every session of the door, connected or kept offline, by client id.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let sessions = rocketgate_core::sync::lock(&self.shared.sessions);
        let mut out: Vec<SessionInfo> = sessions
            .iter()
            .map(|(id, slot)| match slot {
                Slot::Offline { session, .. } => SessionInfo {
                    client_id: id.clone(),
                    connected: false,
                    expiry: session.expiry,
                    subscriptions: session
                        .subs
                        .iter()
                        .map(|s| (s.filter.raw.clone(), s.qos as u8))
                        .collect(),
                    inflight: session.inflight.len(),
                    will: session.will.is_some(),
                    peer: None,
                    since_ms: None,
                    protocol_version: None,
                    clean_start: None,
                    user: None,
                },
                Slot::Online { card, .. } => {
                    let live = rocketgate_core::sync::lock(&card.live).clone();
                    SessionInfo {
                        client_id: id.clone(),
                        connected: true,
                        expiry: live.expiry,
                        subscriptions: live.subscriptions,
                        inflight: live.inflight as usize,
                        will: false,
                        peer: Some(card.peer),
                        since_ms: Some(card.since_ms),
                        protocol_version: Some(card.protocol_version),
                        clean_start: Some(card.clean_start),
                        user: Some(card.user.clone()),
                    }
                }
            })
            .collect();
        out.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        out
    }

    /// Closes the connection holding `client_id`'s session (a v5 client gets
    /// DISCONNECT 0x98 Administrative action; its will goes out as for any
    /// server-side close). `discard`: the session ends too (subscriptions and
    /// stored state dropped; a will still pending is published now). `None`:
    /// no such session.
    pub async fn kick(&self, client_id: &str, discard: bool) -> Option<Kicked> {
        let shared = &self.shared;
        let slot = {
            let mut sessions = rocketgate_core::sync::lock(&shared.sessions);
            match sessions.get(client_id)? {
                Slot::Offline { .. } if !discard => {
                    return Some(Kicked {
                        disconnected: false,
                        discarded: false,
                    });
                }
                _ => sessions.remove(client_id)?,
            }
        };
        match slot {
            Slot::Offline { session, .. } => {
                self.end_session(session).await;
                Some(Kicked {
                    disconnected: false,
                    discarded: true,
                })
            }
            Slot::Online { takeover, .. } => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let handed = if takeover
                    .send(Takeover {
                        to: tx,
                        admin: true,
                    })
                    .is_ok()
                {
                    tokio::time::timeout(Duration::from_secs(5), rx)
                        .await
                        .ok()
                        .and_then(Result::ok)
                } else {
                    None
                };
                match handed {
                    Some(session) if discard => self.end_session(session).await,
                    Some(session) => {
                        // Offline as after any server-side close (a delayed will waits).
                        let _ = shared.session_offline(session, true, 0).await;
                    }
                    None if discard => {
                        // It ended by itself meanwhile and went offline: end that.
                        let slot = {
                            let mut sessions = rocketgate_core::sync::lock(&shared.sessions);
                            match sessions.get(client_id) {
                                Some(Slot::Offline { .. }) => sessions.remove(client_id),
                                _ => None,
                            }
                        };
                        if let Some(Slot::Offline { session, .. }) = slot {
                            self.end_session(session).await;
                        }
                    }
                    None => {}
                }
                Some(Kicked {
                    disconnected: true,
                    discarded: discard,
                })
            }
        }
    }

    /// A session removed from the registry ends: the log says so, a pending
    /// will is published.
    async fn end_session(&self, mut session: Box<crate::session::Session>) {
        self.shared.session_ended(&session.client_id).await;
        if let Some(w) = session.will.take() {
            self.shared
                .fire_will(&session.client_id, w.to_publish())
                .await;
        }
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
    pub async fn serve_stream<IO>(&self, io: IO, peer: SocketAddr, tls_identity: Option<String>)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.streams.serve_stream(io, peer, tls_identity).await
    }

    /// A cloneable entry point for other listeners (the WebSocket door's `/mqtt`).
    pub fn streams(&self) -> Streams<B> {
        self.streams.clone()
    }

    /// The next [`Handle::stop`] is because this broker stopped being its group's
    /// master: v5 clients get DISCONNECT 0x9C (Use another server) with the
    /// configured Server Reference instead of 0x8B; 3.1.1 clients are closed (and
    /// the reason logged) as on any stop.
    pub fn redirect_on_stop(&self) {
        self.streams
            .shared
            .redirect_on_stop
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Stops accepting, closes every connection (v5 clients get DISCONNECT 0x8B,
    /// or 0x9C after [`Handle::redirect_on_stop`]), saves sessions, offsets and
    /// retained messages.
    pub async fn stop(self) {
        let _ = self.stop_tx.send(true);
        let shared = &self.streams.shared;
        // After the flag: a connection checks it once its waiter exists.
        shared.wake_stopping();
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        if tokio::time::timeout(Duration::from_secs(10), shared.connections_closed())
            .await
            .is_err()
        {
            tracing::warn!("MQTT connections did not close in time");
        }
        shared.router.stop();
        shared.save_all().await;
    }
}

/// Registers the histograms and the scrape-time gauges of one server's state.
fn register_meters<B: MessagingApi + 'static>(shared: &Arc<Shared<B>>) {
    crate::meters::METERS.register("mqtt");
    for state in ["online", "offline"] {
        let weak = Arc::downgrade(shared);
        rocketgate_core::meter::register_gauge(
            "rocketgate_mqtt_sessions",
            "MQTT sessions held: online (a connection has it) or offline (kept for a reconnect).",
            &[("state", state)],
            move || {
                let shared = weak.upgrade()?;
                let sessions = rocketgate_core::sync::lock(&shared.sessions);
                let online = sessions
                    .values()
                    .filter(|s| matches!(s, Slot::Online { .. }))
                    .count();
                let n = if state == "online" {
                    online
                } else {
                    sessions.len() - online
                };
                Some(n as f64)
            },
        );
    }
    let weak = Arc::downgrade(shared);
    rocketgate_core::meter::register_gauge(
        "rocketgate_mqtt_retained_messages",
        "Retained messages held by the MQTT door.",
        &[],
        move || {
            Some(
                rocketgate_core::sync::lock(&weak.upgrade()?.log.view)
                    .retained
                    .len() as f64,
            )
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
    use rocketgate_core::store::{Store, StoreDeps, StoreSettings};

    /// The largest connection task that stays in mimalloc's 1,280-byte size class:
    /// tokio's task cell is the future plus 104 bytes (header 32, scheduler and
    /// id 16, stage tag 8, trailer 48), rounded up to 128. 1,128 bytes in a debug
    /// build on 2026-12-08 (a release build's futures are a little smaller); the
    /// next class is 1,536, 256 bytes more per idle connection.
    const LARGEST_KNOWN_TO_FIT: usize = 1_280 - 104;

    /// Guards the idle-connection memory target (≤ 4 KiB at 100,000): the
    /// connection task's future is the largest part of it, and a few bytes more
    /// move every connection to the next size class.
    #[tokio::test]
    async fn a_connection_task_stays_in_the_allocators_1280_byte_class() {
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
        let task = connection_task(server.shared.clone(), sock, peer, ());
        let size = std::mem::size_of_val(&task);
        assert!(
            size <= LARGEST_KNOWN_TO_FIT,
            "the connection task is {size} bytes (at most {LARGEST_KNOWN_TO_FIT} fit \
             the 1,280-byte class): box the new state (see `conn::run`), or measure \
             `bench/compare --runs 1 --no-ceiling --brokers rocketgate --scenarios idle-19k` \
             before and after"
        );
    }
}
