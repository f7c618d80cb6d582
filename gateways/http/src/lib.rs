//! # rocketgate-http
//!
//! The HTTP door (axum): publish with `curl --data-binary`, stateless receive and
//! ack through the core's POP (any request may go to any gateway process: the
//! receipt handle says everything), replay by queue offset, Server-Sent Events,
//! admin (topics, groups, offsets, dead letters, lookups, broker and cluster
//! info), `/health`, Prometheus `/metrics`, an OpenAPI 3.1 document generated
//! from the handlers' own types (utoipa), and the web dashboard at `/dashboard`
//! ([`dashboard`]: embedded static files over the admin API, docs/dashboard.md).
//!
//! It owns only the HTTP mapping: no broker state lives here, every request is
//! turned into [`MessagingApi`] calls, and errors become statuses only in
//! [`error`]. Start reading at [`routes`] (the table of every endpoint, which
//! builds both the router and `/v1/openapi.json`), then [`publish`],
//! [`consume`] and [`admin`]. User documentation: `docs/http.md`.

#![forbid(unsafe_code)]

pub mod access;
pub mod admin;
mod cluster;
pub mod consume;
pub mod dashboard;
pub mod error;
pub mod inspect;
mod listener;
mod meters;
pub mod ops;
mod origin;
pub mod publish;
pub mod routes;
pub mod users;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::broker::MessagingApi;
use rocketgate_core::store::Store;
use serde::Serialize;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

pub use error::{Error, Result};
pub use listener::Peer;

/// What the HTTP door can be tuned with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Largest request body (the store's maximum message size); above: 413.
    pub max_body: usize,
    /// Requests served at once; above: 429 (health and metrics are exempt).
    pub max_inflight: usize,
    /// The longest long poll a receive may ask for (`wait_ms` is capped to it).
    pub max_wait: Duration,
    /// Invisibility of received messages when the request names none.
    pub default_invisible: Duration,
    /// The most messages one receive or replay returns.
    pub max_messages: usize,
    /// NameServers asked for the cluster view (`GET /v1/cluster`).
    pub namesrv_addrs: Vec<String>,
    /// TLS to those NameServers (`namesrv.ca`); `None`: plain remoting.
    pub namesrv_tls: Option<rocketgate_tls::Dialer>,
    /// This broker's name and cluster, for `GET /v1/broker`.
    pub broker_name: String,
    pub cluster: String,
    /// Browser origins whose pages may call the API (`http.allowed_origins`); others
    /// get 403. CORS headers only for these.
    pub allowed_origins: Vec<String>,
    /// HTTPS: every connection is TLS with this acceptor's current certificate.
    pub tls: Option<rocketgate_tls::Acceptor>,
    /// Who may call which endpoint (off: everyone, everything).
    pub auth: Arc<rocketgate_auth::Auth>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_body: 4 << 20,
            max_inflight: 1024,
            max_wait: Duration::from_secs(30),
            default_invisible: Duration::from_secs(30),
            max_messages: 32,
            namesrv_addrs: Vec::new(),
            namesrv_tls: None,
            broker_name: "broker-a".into(),
            cluster: "DefaultCluster".into(),
            allowed_origins: Vec::new(),
            tls: None,
            auth: rocketgate_auth::Auth::disabled(),
        }
    }
}

/// The node's storage as health checks and metrics see it.
pub trait Probe: Send + Sync + 'static {
    /// The local store; `None` on a node without one (`rocketgate proxy`, whose doors
    /// run over the brokers of a cluster).
    fn status(&self) -> Option<NodeStatus>;

    /// This node's place in its broker group (`GET /v1/cluster`, `/v1/broker`,
    /// `/metrics`); `None` when the node does not replicate.
    fn replication(&self) -> Option<ReplicationStatus> {
        None
    }

    /// Readiness conditions the door cannot see itself (NameServer registration,
    /// every door listening) for `/readyz`; the door adds store, disk and shutdown.
    fn checks(&self) -> Vec<inspect::ReadyCheck> {
        Vec::new()
    }

    /// Connections of the other doors (MQTT sessions, WebSocket subscriptions)
    /// for `/v1/connections`; native clients and HTTP consumers the door finds itself.
    fn connections(&self) -> Vec<inspect::ConnectionJson> {
        Vec::new()
    }

    /// The MQTT door's sessions; `None`: no MQTT door on this node.
    fn mqtt_sessions(&self) -> Option<Vec<inspect::MqttSessionJson>> {
        None
    }

    /// Disconnects an MQTT client (and with `discard` drops its session).
    fn kick_mqtt(&self, _client_id: &str, _discard: bool) -> inspect::Answer<inspect::KickOutcome> {
        Box::pin(std::future::ready(inspect::KickOutcome::NoMqtt))
    }

    /// The effective configuration and each setting's source, secrets redacted;
    /// `None`: unknown (a door built without the binary's config).
    fn config(&self) -> Option<Vec<inspect::SettingJson>> {
        None
    }
}

/// A broker group as one node sees it (docs/replication.md).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ReplicationStatus {
    /// `master` or `slave`.
    pub role: &'static str,
    /// `broker.id`.
    pub broker_id: u64,
    /// On a master: `sync` or `async`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    /// On a master: copies (itself included) a send needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_in_sync_replicas: Option<u32>,
    /// On a master: the offset enough copies hold (what consumers may read up to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed_offset: Option<u64>,
    /// On a master: its slaves.
    pub slaves: Vec<SlaveLag>,
    /// On a slave: the master's replication address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
    /// On a slave: whether it follows the master right now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
    /// On a slave: bytes the master had that it has not yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<u64>,
    /// On a slave that has replicated messages: the 99th percentile of their lag
    /// (appended here minus stored on the master) since it started, in ms, as the
    /// upper bound of the `rocketgate_replication_message_lag_seconds` bucket that
    /// holds it (`/metrics` has the buckets; rate them for a recent window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_lag_p99_ms: Option<f64>,
}

/// One slave of a master.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SlaveLag {
    pub broker_id: u64,
    pub addr: String,
    /// The slave holds the log up to here.
    pub offset: u64,
    pub lag_bytes: u64,
    /// How long it has been behind (0 when caught up).
    pub lag_ms: u64,
    pub in_sync: bool,
}

/// Positions of the commit log and the disk state.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NodeStatus {
    /// Oldest byte still stored.
    pub log_min: u64,
    /// Durable up to here.
    pub log_flushed: u64,
    /// Written up to here.
    pub log_written: u64,
    /// Indexed into consume queues up to here.
    pub log_dispatched: u64,
    /// Share of the disk in use (0..1).
    pub disk_usage: f64,
    /// Above this share appends are refused.
    pub disk_hard_ratio: f64,
    /// Bytes free to the broker and the size of the file system under the data
    /// directory (`None`: `statvfs` failed).
    pub disk_free_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    /// Damaged records found on read and not served (docs/reliability.md).
    pub corrupt_records: u64,
    /// Unread messages deleted for space under `disk_full_policy = "delete_oldest"`.
    pub unread_dropped: u64,
    /// Why the store stopped taking writes (a failed commit-log sync; a restart
    /// recovers), if it did (docs/reliability.md, section 5).
    pub writes_stopped: Option<String>,
}

impl NodeStatus {
    pub fn disk_full(&self) -> bool {
        self.disk_usage > self.disk_hard_ratio
    }
}

/// [`Probe`] over the local store.
pub struct StoreProbe {
    store: Arc<Store>,
    disk_hard_ratio: f64,
}

impl StoreProbe {
    pub fn new(store: Arc<Store>, disk_hard_ratio: f64) -> Self {
        StoreProbe {
            store,
            disk_hard_ratio,
        }
    }
}

impl Probe for StoreProbe {
    fn status(&self) -> Option<NodeStatus> {
        let p = self.store.positions();
        let space = rocketgate_core::store::disk::space(self.store.dir()).ok();
        Some(NodeStatus {
            disk_free_bytes: space.map(|s| s.0),
            disk_total_bytes: space.map(|s| s.1),
            log_min: p.min,
            log_flushed: p.flushed,
            log_written: p.written,
            log_dispatched: p.dispatched,
            disk_usage: self.store.disk_usage(),
            disk_hard_ratio: self.disk_hard_ratio,
            corrupt_records: self.store.corrupt_records(),
            unread_dropped: self.store.unread_dropped(),
            writes_stopped: self.store.write_stopped(),
        })
    }
}

/// What every handler shares. Nothing here is mutable except the in-flight
/// permits; broker state lives behind `api`.
pub struct Ctx<B> {
    pub(crate) api: Arc<B>,
    pub(crate) probe: Arc<dyn Probe>,
    pub(crate) settings: Settings,
    /// Flips to `true` at shutdown: long polls and streams end early.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// One permit per request being served (the 429 limit).
    pub(crate) inflight: Arc<Semaphore>,
    /// When the server was bound (uptime in `/v1/broker`).
    pub(crate) started: std::time::Instant,
    /// `/v1/openapi.json`, built on first request.
    pub(crate) openapi: std::sync::OnceLock<serde_json::Value>,
    /// Cached metric handles of the per-request and publish metrics.
    pub(crate) meters: ops::Meters,
    /// Compiled grants per user (see [`access`]).
    pub(crate) grants: access::Grants,
    /// HTTP POP consumers seen recently (`/v1/connections`).
    pub(crate) pop_consumers: inspect::PopConsumers,
}

impl<B> Ctx<B> {
    /// Completes when the server starts shutting down.
    pub(crate) async fn stopping(&self) {
        let mut rx = self.shutdown.clone();
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// The HTTP gateway, bound and not yet serving.
pub struct Server<B> {
    listener: listener::Counted,
    ctx: Arc<Ctx<B>>,
    shutdown: watch::Sender<bool>,
}

impl<B: MessagingApi + 'static> Server<B> {
    /// Binds `addr` (port 0: any free port) and returns the address bound.
    pub async fn bind(
        addr: SocketAddr,
        api: Arc<B>,
        probe: Arc<dyn Probe>,
        settings: Settings,
    ) -> Result<(Server<B>, SocketAddr)> {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let local = tcp
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        ops::install_recorder();
        let (tx, rx) = watch::channel(false);
        let ctx = Arc::new(Ctx {
            api,
            probe,
            inflight: Arc::new(Semaphore::new(settings.max_inflight.max(1))),
            settings,
            shutdown: rx,
            started: std::time::Instant::now(),
            openapi: std::sync::OnceLock::new(),
            meters: ops::Meters::default(),
            grants: access::Grants::default(),
            pop_consumers: inspect::PopConsumers::default(),
        });
        let mode = match &ctx.settings.tls {
            Some(acceptor) => rocketgate_tls::Mode::Tls(acceptor.clone()),
            None => rocketgate_tls::Mode::Plain,
        };
        let incoming = rocketgate_tls::Incoming::new(tcp, mode, "http")
            .map_err(|source| Error::Bind { addr, source })?;
        let server = Server {
            listener: listener::Counted::new(incoming, ctx.settings.auth.connection_limit()),
            ctx,
            shutdown: tx,
        };
        Ok((server, local))
    }

    /// Serves on the current tokio runtime until [`Handle::stop`].
    pub fn spawn(self) -> Handle {
        let app = routes::router(self.ctx.clone());
        let mut stop = self.shutdown.subscribe();
        tokio::spawn(ops::upkeep_loop(self.shutdown.subscribe()));
        let task = tokio::spawn(async move {
            let service = app.into_make_service_with_connect_info::<Peer>();
            let serve = axum::serve(self.listener, service).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|s| *s).await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "HTTP server failed");
            }
        });
        Handle {
            shutdown: self.shutdown,
            task,
        }
    }
}

/// A running HTTP gateway.
pub struct Handle {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Handle {
    /// Stops accepting, ends long polls and event streams, lets requests in
    /// progress finish (for up to 5 s, then drops them) and returns.
    pub async fn stop(self) {
        self.shutdown.send_replace(true);
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            tracing::warn!("HTTP connections still open after 5 s; closing them");
            task.abort();
            let _ = task.await;
        }
    }
}
