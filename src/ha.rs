//! Replication wiring: the store (core's `store::ha`) on one side, the HA stream
//! (remoting's `ha`) on the other. A master serves its slaves on `listen.ha`; a slave
//! follows `ha.master` and refuses writes at every door (docs/replication.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rocketgate_config::Config;
use rocketgate_core::broker::{Broker, OffsetPublisher};
use rocketgate_core::clock::SystemClock;
use rocketgate_core::store::Store;
use rocketgate_core::store::ha::{Gate, Replicas};
use rocketgate_http as http;
use rocketgate_remoting::ha::BoxIo;
use rocketgate_remoting::ha::{master, slave};
use rocketgate_tls::{Acceptor, Incoming, Mode, ReloadHandle, TlsSettings};
use tokio::net::{TcpListener, TcpStream};

/// The replication port with TLS (`tls.ha`): handshakes done by `rocketgate-tls`.
struct TlsIncoming(Incoming);

impl master::Accept for TlsIncoming {
    async fn accept(&mut self) -> std::io::Result<(BoxIo, SocketAddr)> {
        let conn = self.0.accept().await;
        Ok((Box::new(conn.stream), conn.peer))
    }
}

/// A slave's TLS client for the master (`ha.master_ca`).
fn tls_connector(config: &Config) -> anyhow::Result<Option<slave::Connector>> {
    let ha = &config.ha;
    if ha.master_ca.as_os_str().is_empty() {
        return Ok(None);
    }
    let client = rocketgate_tls::client_config(&ha.master_ca)
        .with_context(|| format!("loading ha.master_ca {}", ha.master_ca.display()))?;
    let name = if ha.master_server_name.is_empty() {
        ha.master
            .rsplit_once(':')
            .map_or(ha.master.as_str(), |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
    } else {
        ha.master_server_name.clone()
    };
    let name = rocketgate_tls::rustls::pki_types::ServerName::try_from(name.clone())
        .with_context(|| format!("`{name}` is not a server name (ha.master_server_name)"))?;
    let connector = rocketgate_tls::tokio_rustls::TlsConnector::from(Arc::new(client));
    Ok(Some(slave::Connector(Arc::new(move |tcp: TcpStream| {
        let (connector, name) = (connector.clone(), name.clone());
        Box::pin(async move {
            let tls = connector.connect(name, tcp).await?;
            Ok(Box::new(tls) as BoxIo)
        })
    }))))
}

/// A master's log and group, as the stream's source (and its broker, which takes
/// the consumer positions a slave's doors committed).
struct Source(Arc<Replicas>, Arc<Broker>);

impl master::Source for Source {
    fn bounds(&self) -> (u64, u64) {
        let store = self.0.store();
        (store.positions().min, store.shippable_end())
    }

    fn segment_size(&self) -> u64 {
        self.0.store().segment_size()
    }

    fn ship(&self, from: u64, max: usize) -> Result<Option<(Vec<u8>, u64)>, String> {
        match self.0.store().ship(from, max) {
            Ok(s) => Ok(s.map(|s| (s.bytes, s.next))),
            Err(e) => Err(e.to_string()),
        }
    }

    fn confirmed(&self) -> u64 {
        self.0.gate().confirmed()
    }

    fn joined(&self, conn: u64, broker_id: u64, peer: SocketAddr, offset: u64) {
        self.0.joined(conn, broker_id, peer.to_string(), offset);
    }

    fn acked(&self, conn: u64, offset: u64) -> Result<(), String> {
        self.0.acked(conn, offset).map_err(|e| e.to_string())
    }

    fn left(&self, conn: u64) {
        self.0.left(conn);
    }

    fn slave_offsets(&self, _conn: u64, body: &[u8]) -> Result<(), String> {
        self.1
            .merge_slave_offsets(body)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// A slave's store, as the stream's target (and its broker, whose consumers'
/// positions go back to the master).
struct Target(Arc<Store>, Arc<Broker>);

impl slave::Target for Target {
    fn log_end(&self) -> u64 {
        self.0.positions().written
    }

    fn segment_size(&self) -> u64 {
        self.0.segment_size()
    }

    fn restart_at(&self, start: u64) -> Result<(), String> {
        self.0.restart_empty_at(start).map_err(|e| e.to_string())
    }

    async fn append(&self, offset: u64, bytes: bytes::Bytes) -> Result<u64, String> {
        self.0
            .append_replicated(offset, &bytes)
            .await
            .map_err(|e| e.to_string())
    }

    fn local_offsets(&self) -> Option<Vec<u8>> {
        self.1.local_offset_changes()
    }
}

/// The running replication of this node, stopped at shutdown.
pub enum Replication {
    Master {
        replicas: Arc<Replicas>,
        /// `None`: replication is off (no `ha.secret`), the port is not open.
        server: Option<master::Handle>,
        /// Reloads the replication port's certificate (`tls.ha`).
        _tls_reload: Option<ReloadHandle>,
        ticker: tokio::task::JoinHandle<()>,
        snapshots: tokio::task::JoinHandle<()>,
    },
    Slave {
        follower: slave::Handle,
        adopter: tokio::task::JoinHandle<()>,
        store: Arc<Store>,
    },
}

/// Bytes per shipped run.
const BATCH: usize = 1 << 20;

/// Attaches the group's gate to `store` before any door starts: a slave is read-only
/// from here on, a sync master holds sends for their copies.
pub fn attach(config: &Config, store: &Arc<Store>) -> anyhow::Result<Arc<Gate>> {
    let gate = if config.is_slave() {
        Gate::slave(config.ha.master.clone())
    } else {
        Gate::master(
            config.ha.required_copies(),
            config.ha.sync_timeout,
            store.shippable_end(),
        )
    };
    let gate = Arc::new(gate);
    store
        .attach_replication(gate.clone())
        .context("attaching replication")?;
    Ok(gate)
}

/// Binds the master's replication port (so a port-0 address is known before the
/// registrar advertises it); `None` on a slave, and on a master without `ha.secret`
/// (an open replication port without a secret would hand the whole log to anyone).
pub async fn bind(config: &mut Config) -> anyhow::Result<Option<TcpListener>> {
    if !config.serves_ha() {
        if !config.is_slave() {
            tracing::info!("replication port closed: set ha.secret to serve slaves");
        }
        return Ok(None);
    }
    let listener = TcpListener::bind(config.listen.ha)
        .await
        .with_context(|| format!("starting the replication port on {}", config.listen.ha))?;
    config.listen.ha = listener
        .local_addr()
        .context("replication listener address")?;
    Ok(Some(listener))
}

/// Starts serving slaves (master) or following the master (slave). Fails when the
/// replication channel's TLS files (`tls.ha`, `ha.master_ca`) cannot be used.
pub fn start(
    config: &Config,
    broker: &Arc<Broker>,
    gate: Arc<Gate>,
    listener: Option<TcpListener>,
) -> anyhow::Result<Replication> {
    let store = broker.store();
    let ha = &config.ha;
    match (config.is_slave(), listener) {
        (false, listener) => {
            let replicas = Arc::new(Replicas::new(
                store.clone(),
                gate,
                ha.max_lag_bytes.0,
                Arc::new(SystemClock),
            ));
            let settings = master::Settings {
                group: config.broker.name.clone(),
                secret: ha.secret.as_bytes().to_vec(),
                heartbeat: ha.heartbeat_interval,
                batch: BATCH,
            };
            let source = Arc::new(Source(replicas.clone(), broker.clone()));
            let mut tls_reload = None;
            let server = match listener {
                None => None,
                Some(listener) if config.tls.ha => {
                    let tls = TlsSettings::from_config(&config.tls)
                        .context("tls.ha needs tls.cert and tls.key")?;
                    let acceptor = Acceptor::new(tls)
                        .context("loading the TLS certificate for the replication port (tls.ha)")?;
                    tls_reload = Some(acceptor.spawn_reload());
                    let incoming = Incoming::new(listener, Mode::Tls(acceptor), "ha")
                        .context("the replication port")?;
                    tracing::info!("replication port: TLS");
                    Some(master::serve(TlsIncoming(incoming), source, settings))
                }
                Some(listener) => Some(master::serve(listener, source, settings)),
            };
            // The in-sync set follows the master's end even while slaves are silent.
            let ticker = {
                let replicas = replicas.clone();
                tokio::spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_millis(100));
                    loop {
                        every.tick().await;
                        replicas.tick();
                    }
                })
            };
            // The topic table and group settings go to slaves through the log: when a
            // slave joins and whenever they change (checked every second, at once on a
            // topic change) once this master has had a slave (a node that never had
            // one writes nothing of the kind).
            let snapshots = {
                let broker = broker.clone();
                let mut changes = broker.watch_topics();
                let mut joins = replicas.watch_joins();
                tokio::spawn(async move {
                    if joins.wait_for(|n| *n > 0).await.is_err() {
                        return;
                    }
                    let mut last: Option<Vec<u8>> = None;
                    let mut offsets = OffsetPublisher::default();
                    let mut every = tokio::time::interval(Duration::from_secs(1));
                    loop {
                        changes.borrow_and_update();
                        let joined = joins.has_changed().unwrap_or(false);
                        joins.borrow_and_update();
                        // A joining slave gets a fresh snapshot even when nothing changed.
                        let prev = if joined { None } else { last.as_deref() };
                        if joined {
                            offsets.want_full();
                        }
                        match broker.publish_topic_snapshot(prev).await {
                            Ok(body) => last = Some(body),
                            Err(e) => {
                                tracing::warn!(error = %e, "writing the topic table to the log failed")
                            }
                        }
                        // Consumer offsets: what moved since the last record (full on a join).
                        if let Err(e) = broker.publish_offsets(&mut offsets).await {
                            tracing::warn!(error = %e, "writing consumer offsets to the log failed")
                        }
                        tokio::select! {
                            r = changes.changed() => if r.is_err() { return },
                            r = joins.changed() => {
                                if r.is_err() { return }
                                last = None;
                            }
                            _ = every.tick() => {}
                        }
                        // Changes in a burst (auto-created topics) share one snapshot.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            };
            Ok(Replication::Master {
                replicas,
                server,
                _tls_reload: tls_reload,
                ticker,
                snapshots,
            })
        }
        (true, _) => {
            tracing::info!(master = %ha.master, broker_id = config.broker.id, "replication: this broker is a read-only slave");
            let follower = slave::spawn(
                Arc::new(Target(store.clone(), broker.clone())),
                slave::Settings {
                    master: ha.master.clone(),
                    group: config.broker.name.clone(),
                    broker_id: config.broker.id,
                    secret: ha.secret.as_bytes().to_vec(),
                    heartbeat: ha.heartbeat_interval,
                    tls: tls_connector(config)?,
                },
            );
            // The topic table arrives with the log (docs/replication.md).
            let adopter = {
                let broker = broker.clone();
                tokio::spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_millis(200));
                    let mut applied = None;
                    let mut offsets_applied = None;
                    loop {
                        every.tick().await;
                        match broker.apply_replicated_topics(applied) {
                            Ok(a) => applied = a,
                            Err(e) => {
                                tracing::warn!(error = %e, "applying the replicated topic table failed")
                            }
                        }
                        match broker.apply_replicated_offsets(offsets_applied) {
                            Ok(a) => offsets_applied = a,
                            Err(e) => {
                                tracing::warn!(error = %e, "applying the replicated consumer offsets failed")
                            }
                        }
                    }
                })
            };
            Ok(Replication::Slave {
                follower,
                adopter,
                store: store.clone(),
            })
        }
    }
}

impl Replication {
    pub async fn stop(self) {
        match self {
            Replication::Master {
                server,
                ticker,
                snapshots,
                ..
            } => {
                ticker.abort();
                snapshots.abort();
                if let Some(server) = server {
                    server.stop().await;
                }
            }
            Replication::Slave {
                follower, adopter, ..
            } => {
                adopter.abort();
                follower.stop().await;
            }
        }
    }
}

/// What operators see of this node's group (`GET /v1/cluster`, `/metrics`): cheap
/// to clone, read at request time.
#[derive(Clone)]
pub struct View {
    broker_id: u64,
    sync: bool,
    side: Side,
}

#[derive(Clone)]
enum Side {
    Master(Arc<Replicas>),
    Slave {
        master: String,
        status: Arc<slave::Status>,
        store: Arc<Store>,
    },
}

impl Replication {
    /// The operator's view of this replication.
    pub fn view(&self, config: &Config) -> View {
        let side = match self {
            Replication::Master { replicas, .. } => Side::Master(replicas.clone()),
            Replication::Slave {
                follower, store, ..
            } => Side::Slave {
                master: config.ha.master.clone(),
                status: follower.status.clone(),
                store: store.clone(),
            },
        };
        View {
            broker_id: config.broker.id,
            sync: config.ha.mode == rocketgate_config::HaMode::Sync,
            side,
        }
    }
}

impl View {
    pub fn status(&self) -> http::ReplicationStatus {
        use std::sync::atomic::Ordering;
        match &self.side {
            Side::Master(r) => http::ReplicationStatus {
                role: "master",
                broker_id: self.broker_id,
                mode: Some(if self.sync { "sync" } else { "async" }),
                min_in_sync_replicas: Some(r.gate().required_copies()),
                confirmed_offset: Some(if r.gate().is_sync() {
                    r.gate().confirmed()
                } else {
                    r.store().shippable_end()
                }),
                slaves: r
                    .status()
                    .into_iter()
                    .map(|s| http::SlaveLag {
                        broker_id: s.broker_id,
                        addr: s.peer,
                        offset: s.acked,
                        lag_bytes: s.lag_bytes,
                        lag_ms: s.lag_ms,
                        in_sync: s.in_sync,
                    })
                    .collect(),
                master: None,
                connected: None,
                lag_bytes: None,
            },
            Side::Slave {
                master,
                status,
                store,
            } => http::ReplicationStatus {
                role: "slave",
                broker_id: self.broker_id,
                mode: None,
                min_in_sync_replicas: None,
                confirmed_offset: None,
                slaves: Vec::new(),
                master: Some(master.clone()),
                connected: Some(status.connected.load(Ordering::Acquire)),
                lag_bytes: Some(
                    status
                        .master_end
                        .load(Ordering::Acquire)
                        .saturating_sub(store.positions().written),
                ),
            },
        }
    }
}
