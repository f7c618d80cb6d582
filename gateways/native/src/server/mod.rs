//! The broker side of the native door: RocketMQ clients connect here to send, pull,
//! heartbeat and manage offsets. Mirrors the NameServer's shape: [`Server::bind`], then
//! [`Server::spawn`], then [`ServerHandle::stop`].
//!
//! The connections run on the shared remoting server loop, one task per connection
//! owning its socket; `conn.rs` is this door's handler for it. A request that has to
//! wait runs in its own task (a long-polling pull must not hold up the sends multiplexed
//! on the same connection) and hands its response back through the connection's
//! outbound queue. Who is
//! connected, and which consumer and producer groups each connection speaks for, is in
//! `clients.rs`; the request handlers are in `handle.rs` and the modules it dispatches to.
//! Every business failure becomes a RocketMQ response code with a remark; only a frame
//! that cannot be decoded closes a connection.

mod access;
mod admin;
mod api;
mod clients;
mod conn;
mod consumer;
mod handle;
mod limit;
mod meters;
mod pull;
mod reply;
mod send;
mod suggest;
mod txn;

pub use suggest::{MASTER_ID, ReadableSlaves, SlaveRead};

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketgate_core::broker::MessagingApi;
use rocketgate_remoting::codec::DEFAULT_MAX_FRAME_LEN;
use rocketgate_remoting::server::{self, Limits};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tracing::info;

use crate::Error;
use clients::Clients;
use conn::Door;

/// Responses and pushes waiting to be written per connection; a full queue holds up the
/// handlers.
const OUTBOUND_CAPACITY: usize = 1024;

/// Settings of the broker server (`[native]` in the config, plus the broker's identity).
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// The broker name clients see in routes (`broker.name`).
    pub broker_name: String,
    /// The store host written into records (the advertised native address); offset
    /// message ids name it.
    pub store_host: SocketAddr,
    /// Upper bound on a frame's length prefix.
    pub max_frame_len: usize,
    /// The longest a pull is suspended waiting for messages, whatever it asks for.
    pub max_suspend: Duration,
    /// Sends being processed at once, over all connections; beyond it a send is
    /// answered `SYSTEM_BUSY` at once.
    pub max_inflight_sends: usize,
    /// A peer that does not take its responses within this long is dropped.
    pub write_timeout: Duration,
    /// Signatures and the ACL (off: every request is served).
    pub auth: Arc<rocketgate_auth::Auth>,
    /// The `suggestWhichBrokerId` of pull answers (off by default: the master).
    pub slave_read: SlaveRead,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            broker_name: "broker-a".into(),
            store_host: SocketAddr::from(([127, 0, 0, 1], 10911)),
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            max_suspend: Duration::from_secs(30),
            max_inflight_sends: 10_000,
            write_timeout: Duration::from_secs(10),
            auth: rocketgate_auth::Auth::disabled(),
            slave_read: SlaveRead::default(),
        }
    }
}

/// Called after a request created or changed a topic, so routes can be re-registered.
pub type TopicsChanged = Arc<dyn Fn() + Send + Sync>;

/// What every request handler shares. Immutable but for [`Clients`] (one short std lock,
/// see there) and the send permits.
pub(crate) struct Ctx<B> {
    pub broker: Arc<B>,
    pub settings: ServerSettings,
    pub clients: Arc<Clients>,
    pub inflight: Semaphore,
    pub topics_changed: TopicsChanged,
    /// Topics sent to so far; a send to a new one may have auto-created it. Std lock,
    /// held for one set lookup.
    known_topics: Mutex<HashSet<String>>,
}

impl<B> Ctx<B> {
    /// A send to `topic` succeeded: re-register routes if it is new to this server.
    pub fn note_topic(&self, topic: &str) {
        let new = {
            let mut known = rocketgate_core::sync::lock(&self.known_topics);
            !known.contains(topic) && known.insert(topic.to_owned())
        };
        if new {
            (self.topics_changed)();
        }
    }
}

/// A bound, not yet running broker server.
pub struct Server<B> {
    listener: TcpListener,
    tls: TlsMode,
    ctx: Arc<Ctx<B>>,
}

/// RocketMQ's TLS modes for the remoting port.
#[derive(Debug, Clone, Default)]
pub enum TlsMode {
    /// Plain remoting only.
    #[default]
    Disabled,
    /// TLS when a connection opens with a ClientHello (first byte 0x16), plain
    /// remoting otherwise, on one port.
    Permissive(rocketgate_tls::Acceptor),
    /// TLS only.
    Enforcing(rocketgate_tls::Acceptor),
}

/// A TLS listener as the remoting loop's connection source.
struct TlsIncoming(rocketgate_tls::Incoming);

impl server::Accept for TlsIncoming {
    type Io = rocketgate_tls::Stream;

    async fn accept(&mut self) -> std::io::Result<server::Accepted<Self::Io>> {
        let c = self.0.accept().await;
        Ok(server::Accepted {
            io: c.stream,
            addr: c.peer,
            tls_identity: c.tls_identity,
        })
    }
}

/// Controls a spawned [`Server`]. Dropping it stops the server in the background;
/// [`ServerHandle::stop`] also waits for every connection to close.
pub struct ServerHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// Stops accepting, closes every connection, and returns when done.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        let _ = (&mut self.task).await;
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl<B: MessagingApi + 'static> Server<B> {
    /// Binds `addr` (port 0 = any free port) and returns the address actually bound.
    pub async fn bind(
        addr: SocketAddr,
        broker: Arc<B>,
        settings: ServerSettings,
    ) -> Result<(Server<B>, SocketAddr), Error> {
        let bind_err = |source| Error::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
        Self::from_listener(listener, broker, settings)
    }

    /// Serves on a listener bound already (to learn a port-0 address before the broker
    /// is opened, so the store host is the real address).
    pub fn from_listener(
        listener: TcpListener,
        broker: Arc<B>,
        settings: ServerSettings,
    ) -> Result<(Server<B>, SocketAddr), Error> {
        let local = listener.local_addr().map_err(|source| Error::Bind {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        meters::METERS.register("native");
        let ctx = Arc::new(Ctx {
            broker,
            inflight: Semaphore::new(settings.max_inflight_sends),
            settings,
            clients: Arc::default(),
            topics_changed: Arc::new(|| {}),
            known_topics: Mutex::new(HashSet::new()),
        });
        Ok((
            Server {
                listener,
                tls: TlsMode::Disabled,
                ctx,
            },
            local,
        ))
    }

    /// Calls `hook` whenever a request creates or changes a topic (e.g.
    /// [`rocketgate_remoting::RegistrarHandle::register_now`], so the NameServers learn the route).
    pub fn on_topics_changed(mut self, hook: TopicsChanged) -> Self {
        if let Some(ctx) = Arc::get_mut(&mut self.ctx) {
            ctx.topics_changed = hook;
        }
        self
    }

    /// Serves TLS in `mode` (RocketMQ's `disabled | permissive | enforcing`).
    pub fn with_tls(mut self, mode: TlsMode) -> Self {
        self.tls = mode;
        self
    }

    /// Runs on the current tokio runtime until [`ServerHandle::stop`].
    pub fn spawn(self) -> ServerHandle {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(self.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        ServerHandle { stop, task }
    }

    /// Serves until `shutdown` completes, then closes every connection.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Server { listener, tls, ctx } = self;
        let local = listener.local_addr().ok();
        info!(addr = ?local, tls = ?tls_name(&tls), "native broker server listening");
        let limits = Limits {
            max_frame_len: ctx.settings.max_frame_len,
            write_timeout: ctx.settings.write_timeout,
            outbound_capacity: OUTBOUND_CAPACITY,
        };
        let limit = ctx.settings.auth.connection_limit();
        let door = Arc::new(Door { ctx });
        let mode = match tls {
            TlsMode::Disabled => None,
            TlsMode::Permissive(a) => Some(rocketgate_tls::Mode::Permissive(a)),
            TlsMode::Enforcing(a) => Some(rocketgate_tls::Mode::Tls(a)),
        };
        match mode {
            None => {
                let inner = listener;
                server::serve(limit::Limited { inner, limit }, door, limits, shutdown).await
            }
            Some(mode) => match rocketgate_tls::Incoming::new(listener, mode, "native") {
                Ok(incoming) => {
                    let inner = TlsIncoming(incoming);
                    server::serve(limit::Limited { inner, limit }, door, limits, shutdown).await
                }
                Err(e) => tracing::error!(error = %e, "native TLS listener failed"),
            },
        }
        info!(addr = ?local, "native broker server stopped");
    }
}

fn tls_name(mode: &TlsMode) -> &'static str {
    match mode {
        TlsMode::Disabled => "disabled",
        TlsMode::Permissive(_) => "permissive",
        TlsMode::Enforcing(_) => "enforcing",
    }
}
