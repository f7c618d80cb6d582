//! Replication wiring: the store (core's `store::ha`) on one side, the HA stream
//! (remoting's `ha`) on the other. A master serves its slaves on `listen.ha`; a slave
//! follows `ha.master` and refuses writes at every door (docs/replication.md).
//!
//! In controller mode ([`Epochs`]) the stream also carries master epochs: the master
//! names its epoch file, a slave mirrors it and is told where its log parts from the
//! master's (docs/replication.md, "Epochs and truncation").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use rocketgate_config::Config;
use rocketgate_core::broker::{Broker, OffsetPublisher, PopPublisher};
use rocketgate_core::clock::SystemClock;
use rocketgate_core::meter;
use rocketgate_core::store::epoch::{self, EpochEntry, EpochFile};
use rocketgate_core::store::ha::{Gate, Replicas};
use rocketgate_core::store::{Store, meters};
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

/// Controller mode's part of the replication of a node (`None` to [`start`]: no
/// controller, the stream without epochs, as before). The supervisor that talks to the
/// controller owns the other ends: it begins epochs in `file` when elected, raises
/// `known` as it learns of elections, and acts on `truncate`.
#[derive(Clone)]
pub struct Epochs {
    /// The data directory's epoch file. One short std lock: a compare and at most one
    /// small file write under it, never held across an `.await`.
    pub file: Arc<Mutex<EpochFile>>,
    /// The newest master epoch the controller announced to this node.
    pub known: Arc<AtomicU64>,
    /// A slave whose log parts from its master's sends the common offset here and
    /// stops following: the receiver stops the node, runs
    /// `store::truncate::truncate(dir, settings, to)`, then
    /// `EpochFile::truncate_after(to)` (in that order: the log's cut is durable
    /// first), and restarts it as a slave. Until the node is stopped the follow loop
    /// keeps retrying after its back-off, so the same point may arrive more than once:
    /// act on the first.
    pub truncate: tokio::sync::mpsc::UnboundedSender<u64>,
}

impl Epochs {
    fn file(&self) -> MutexGuard<'_, EpochFile> {
        // A panic under the lock leaves the file as it was on disk: the list is valid.
        self.file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn entries(pairs: &[(u64, u64)]) -> Vec<EpochEntry> {
    pairs.iter().copied().map(EpochEntry::from).collect()
}

/// A master's log and group, as the stream's source (and its broker, which takes
/// the consumer positions a slave's doors committed).
struct Source(Arc<Replicas>, Arc<Broker>, Option<Epochs>);

impl master::Source for Source {
    fn bounds(&self) -> (u64, u64) {
        let store = self.0.store();
        (store.positions().min, store.shippable_end())
    }

    fn segment_size(&self) -> u64 {
        self.0.store().segment_size()
    }

    fn ship(&self, from: u64, max: usize) -> Result<Option<(bytes::Bytes, u64)>, String> {
        match self.0.store().ship(from, max) {
            Ok(s) => Ok(s.map(|s| (s.bytes, s.next))),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn wait_shippable(&self, from: u64) {
        self.0.store().wait_shippable(from).await;
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

    fn epoch(&self) -> u64 {
        self.2
            .as_ref()
            .and_then(|e| e.file().last())
            .map_or(0, |e| e.epoch)
    }

    fn epochs(&self) -> Vec<(u64, u64)> {
        self.2.as_ref().map_or_else(Vec::new, |e| e.file().pairs())
    }

    fn divergence(
        &self,
        slave: &[(u64, u64)],
        slave_end: u64,
        master: &[(u64, u64)],
        master_end: u64,
    ) -> u64 {
        epoch::divergence(&entries(slave), slave_end, &entries(master), master_end)
    }
}

/// A slave's store, as the stream's target (and its broker, whose consumers'
/// positions go back to the master).
struct Target {
    store: Arc<Store>,
    broker: Arc<Broker>,
    epochs: Option<Epochs>,
    /// The entries of the master followed now (its last WELCOME), recorded in the
    /// epoch file as the bytes they describe arrive. `None` until a version-2 WELCOME.
    /// A short std lock, never held across an `.await`.
    master_epochs: Mutex<Option<Vec<EpochEntry>>>,
}

impl Target {
    /// Records the master's entries that start at or before `upto` (durably, before
    /// the bytes up to there are appended).
    fn record_epochs(&self, upto: u64) -> Result<(), String> {
        let Some(epochs) = &self.epochs else {
            return Ok(());
        };
        let master = self
            .master_epochs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*master {
            Some(list) => epochs.file().adopt(list, upto).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

impl slave::Target for Target {
    fn log_end(&self) -> u64 {
        self.store.positions().written
    }

    fn segment_size(&self) -> u64 {
        self.store.segment_size()
    }

    fn restart_at(&self, start: u64) -> Result<(), String> {
        self.store
            .restart_empty_at(start)
            .map_err(|e| e.to_string())
    }

    async fn append(&self, offset: u64, bytes: bytes::Bytes) -> Result<u64, String> {
        self.record_epochs(offset + bytes.len() as u64)?;
        self.store
            .append_replicated(offset, &bytes)
            .await
            .map_err(|e| e.to_string())
    }

    fn local_offsets(&self) -> Option<Vec<u8>> {
        self.broker.local_offset_changes()
    }

    fn known_epoch(&self) -> u64 {
        self.epochs
            .as_ref()
            .map_or(0, |e| e.known.load(Ordering::Acquire))
    }

    fn epochs(&self) -> Vec<(u64, u64)> {
        self.epochs
            .as_ref()
            .map_or_else(Vec::new, |e| e.file().pairs())
    }

    fn truncate(&self, to: u64) -> Result<(), String> {
        match &self.epochs {
            Some(e) => e.truncate.send(to).map_err(|_| {
                format!("nobody takes the truncation to {to} (the supervisor is gone)")
            }),
            None => Err(format!(
                "cannot truncate the log to {to} outside controller mode"
            )),
        }
    }

    fn adopt_epochs(&self, master: &[(u64, u64)]) -> Result<(), String> {
        if self.epochs.is_none() {
            return Ok(());
        }
        let list = entries(master);
        epoch::check(&list).map_err(|e| format!("the master's epoch list is malformed: {e}"))?;
        *self
            .master_epochs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(list);
        self.record_epochs(self.store.positions().written)
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
/// Under async replication a stream woken by an append waits this long before
/// shipping, so it ships runs of many messages (see `master::Settings::gather`).
const ASYNC_GATHER: Duration = Duration::from_millis(1);

/// Attaches the group's gate to `store` before any door starts: a slave is read-only
/// from here on, a sync master holds sends for their copies.
/// Under a controller a master's gate holds a write lease, expired until the supervisor
/// renews it (the role supervisor).
pub fn attach(
    config: &Config,
    store: &Arc<Store>,
    controlled: Option<&Epochs>,
) -> anyhow::Result<Arc<Gate>> {
    let gate = if config.is_slave() {
        Gate::slave(config.ha.master.clone())
    } else {
        let gate = Gate::master(
            config.ha.required_copies(),
            config.ha.sync_timeout,
            store.shippable_end(),
        );
        match controlled {
            Some(_) => gate.with_lease(),
            None => gate,
        }
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
/// `epochs`: controller mode (`None`: without a controller, no epochs on the stream).
pub fn start(
    config: &Config,
    broker: &Arc<Broker>,
    gate: Arc<Gate>,
    listener: Option<TcpListener>,
    epochs: Option<Epochs>,
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
                gather: if ha.required_copies() > 1 {
                    Duration::ZERO
                } else {
                    ASYNC_GATHER
                },
            };
            let source = Arc::new(Source(replicas.clone(), broker.clone(), epochs));
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
                    let mut pop = PopPublisher::default();
                    let mut delay_last: Option<Vec<u8>> = None;
                    let mut every = tokio::time::interval(Duration::from_secs(1));
                    loop {
                        changes.borrow_and_update();
                        let joined = joins.has_changed().unwrap_or(false);
                        joins.borrow_and_update();
                        // A joining slave gets a fresh snapshot even when nothing changed.
                        let prev = if joined { None } else { last.as_deref() };
                        if joined {
                            offsets.want_full();
                            pop.want_full();
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
                        // POP state: the queues whose cursor or leases changed (full on a join).
                        if let Err(e) = broker.publish_pop(&mut pop).await {
                            tracing::warn!(error = %e, "writing POP state to the log failed")
                        }
                        // Delay progress: a snapshot when it changed (anyway on a join).
                        let prev = if joined { None } else { delay_last.as_deref() };
                        match broker.publish_delay_progress(prev).await {
                            Ok(body) => delay_last = Some(body),
                            Err(e) => {
                                tracing::warn!(error = %e, "writing delay progress to the log failed")
                            }
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
                Arc::new(Target {
                    store: store.clone(),
                    broker: broker.clone(),
                    epochs,
                    master_epochs: Mutex::new(None),
                }),
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
                    let mut pop_applied = None;
                    let mut delay_applied = None;
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
                        match broker.apply_replicated_pop(pop_applied) {
                            Ok(a) => pop_applied = a,
                            Err(e) => {
                                tracing::warn!(error = %e, "applying the replicated POP state failed")
                            }
                        }
                        match broker.apply_replicated_delay(delay_applied) {
                            Ok(a) => delay_applied = a,
                            Err(e) => {
                                tracing::warn!(error = %e, "applying the replicated delay progress failed")
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
    /// On a slave: whether it follows its master now (`None` on a master).
    pub fn following(&self) -> Option<bool> {
        match self {
            Replication::Slave { follower, .. } => Some(
                follower
                    .status
                    .connected
                    .load(std::sync::atomic::Ordering::Acquire),
            ),
            Replication::Master { .. } => None,
        }
    }

    /// A master's slaves (`None` on a slave).
    pub fn replicas(&self) -> Option<&Arc<Replicas>> {
        match self {
            Replication::Master { replicas, .. } => Some(replicas),
            Replication::Slave { .. } => None,
        }
    }

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
                message_lag_p99_ms: None,
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
                message_lag_p99_ms: meters::REPLICATION_LAG
                    .quantile_ns(0.99)
                    // (past the last bound, +Inf: reported as that bound, 30 s, "at least")
                    .map(|ns| ns.min(meter::FINE_NS[meter::FINE_NS.len() - 1]) as f64 / 1e6),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    //! Controller mode over real stores and the real stream: an old master that comes
    //! back as a slave of the master elected after it is told to cut its tail, and
    //! after the cut (what the supervisor does) holds the new master's bytes exactly.

    use std::path::Path;

    use rocketgate_config::ByteSize;
    use rocketgate_core::store::{Message, StoreDeps, truncate};
    use tokio::sync::mpsc;

    use super::*;

    struct Node {
        config: Config,
        broker: Arc<Broker>,
        replication: Replication,
        truncations: mpsc::UnboundedReceiver<u64>,
    }

    fn config(dir: &Path, id: u64, master: &str) -> Config {
        let mut c = Config {
            data_dir: dir.to_owned(),
            ..Config::default()
        };
        c.broker.name = "g".into();
        c.broker.id = id;
        c.ha.secret = "s3cret".into();
        c.ha.master = master.into();
        c.ha.heartbeat_interval = Duration::from_millis(100);
        c.listen.ha = "127.0.0.1:0".parse().unwrap();
        c.store.segment_size = ByteSize(64 * 1024);
        c.store.max_message_size = ByteSize(8 * 1024);
        c.store.consume_queue_entries_per_file = 64;
        c.store.index_slots = 16;
        c.store.index_entries_per_file = 64;
        c
    }

    /// Opens `dir` as a master (`master` empty) or a slave of `master`, in controller
    /// mode with `file` and the known epoch `known`.
    async fn start_node(
        dir: &Path,
        master: &str,
        file: &Arc<Mutex<EpochFile>>,
        known: u64,
    ) -> Node {
        let mut config = config(dir, u64::from(!master.is_empty()), master);
        let listener = bind(&mut config).await.unwrap();
        let store = Arc::new(
            Store::open(
                dir,
                crate::node::store_options(&config),
                StoreDeps::fixed_usage(0.1),
            )
            .unwrap()
            .0,
        );
        let gate = attach(&config, &store, None).unwrap();
        let broker = Arc::new(
            Broker::open(
                store,
                crate::node::broker_options(&config),
                Arc::new(SystemClock),
            )
            .unwrap(),
        );
        let (truncate, truncations) = mpsc::unbounded_channel();
        let epochs = Epochs {
            file: file.clone(),
            known: Arc::new(AtomicU64::new(known)),
            truncate,
        };
        let replication = start(&config, &broker, gate, listener, Some(epochs)).unwrap();
        Node {
            config,
            broker,
            replication,
            truncations,
        }
    }

    impl Node {
        fn end(&self) -> u64 {
            self.broker.store().positions().written
        }
        async fn put(&self, n: usize, what: &str) {
            let msgs: Vec<Message> = (0..n)
                .map(|i| Message::new("t", 0, format!("{what} {i}").into_bytes()))
                .collect();
            self.broker.store().put_batch_async(&msgs).await.unwrap();
        }
        async fn stop(self) {
            self.replication.stop().await;
            self.broker.close().unwrap();
            self.broker.store().close().unwrap();
        }
    }

    fn log_bytes(store: &Store) -> Vec<u8> {
        let (mut at, mut all) = (0, Vec::new());
        while let Some(s) = store.ship(at, 1 << 20).unwrap() {
            all.extend_from_slice(&s.bytes);
            at = s.next;
        }
        all
    }

    async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        for _ in 0..400 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_old_master_returns_truncates_its_unreplicated_tail_and_converges() {
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let file_a = Arc::new(Mutex::new(EpochFile::open(dir_a.path()).unwrap()));
        let file_b = Arc::new(Mutex::new(EpochFile::open(dir_b.path()).unwrap()));

        // Epoch 1: A is master, B copies it.
        rocketgate_core::sync::lock(&file_a).begin(1, 0).unwrap();
        let a = start_node(dir_a.path(), "", &file_a, 1).await;
        a.put(20, "epoch 1").await;
        let b = start_node(dir_b.path(), &a.config.listen.ha.to_string(), &file_b, 1).await;
        wait_until("B's copy", || {
            let end = b.broker.store().positions().written;
            end > 0 && end == a.end()
        })
        .await;
        assert_eq!(
            rocketgate_core::sync::lock(&file_b).pairs(),
            vec![(1, 0)],
            "B mirrors A's epochs"
        );
        b.stop().await;
        let common = EpochFile::open(dir_b.path()).unwrap();
        assert_eq!(common.pairs(), vec![(1, 0)], "durable");

        // B is cut off; A writes a tail nobody copies, then dies.
        a.put(7, "unreplicated tail").await;
        let a_end = a.end();
        a.stop().await;

        // B is elected at epoch 2 from its end and takes writes.
        let b_end = Store::open(
            dir_b.path(),
            crate::node::store_options(&config(dir_b.path(), 0, "")),
            StoreDeps::fixed_usage(0.1),
        )
        .unwrap()
        .0
        .positions()
        .written;
        assert!(b_end < a_end);
        rocketgate_core::sync::lock(&file_b)
            .begin(2, b_end)
            .unwrap();
        let b = start_node(dir_b.path(), "", &file_b, 2).await;
        b.put(5, "epoch 2").await;

        // A comes back as a slave of B: told to cut at B's epoch-2 start.
        let mut a = start_node(dir_a.path(), &b.config.listen.ha.to_string(), &file_a, 2).await;
        let to = tokio::time::timeout(Duration::from_secs(10), a.truncations.recv())
            .await
            .expect("a truncation request")
            .unwrap();
        assert_eq!(to, b_end);
        assert_eq!(a.end(), a_end, "nothing appended before the cut");
        let a_config = a.config.clone();
        a.stop().await;

        // The supervisor's part: the durable cut, then the epoch file.
        let report =
            truncate::truncate(dir_a.path(), &crate::node::store_options(&a_config), to).unwrap();
        assert_eq!(report.new_end, b_end);
        rocketgate_core::sync::lock(&file_a)
            .truncate_after(to)
            .unwrap();

        let a = start_node(dir_a.path(), &b.config.listen.ha.to_string(), &file_a, 2).await;
        b.put(3, "epoch 2 later").await;
        wait_until("A's copy of B", || a.end() == b.end()).await;
        assert_eq!(
            log_bytes(a.broker.store()),
            log_bytes(b.broker.store()),
            "byte-identical logs"
        );
        assert_eq!(
            rocketgate_core::sync::lock(&file_a).pairs(),
            vec![(1, 0), (2, b_end)]
        );
        assert_eq!(
            EpochFile::open(dir_a.path()).unwrap().pairs(),
            vec![(1, 0), (2, b_end)],
            "durable"
        );
        a.stop().await;
        b.stop().await;
    }
}
