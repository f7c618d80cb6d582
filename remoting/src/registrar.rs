//! Keeps a broker registered with every NameServer in its list.
//!
//! One task per NameServer, each with its own connection, back-off and failures: the
//! NameServers never talk to each other, so neither do their links. Each task registers at
//! once, then every `interval` (or sooner on [`RegistrarHandle::register_now`]), and
//! reconnects with exponential back-off when the link breaks. A clean stop unregisters
//! from each NameServer; an abort just drops the sockets, which is what a crash looks like.

use rocketgate_base::clock::now_ms;
use rocketgate_base::sync::lock;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use crate::client::Link;
use crate::code::{request, response, version};
use crate::codec::{LanguageCode, RemotingCommand};
use crate::protocol::{
    DataVersion, RegisterBrokerBody, TopicConfigWrapper, WireTopicConfig, field,
};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Who a broker is, as it tells the NameServers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerIdentity {
    pub cluster: String,
    /// The broker group name; master and slaves share it.
    pub name: String,
    /// 0 = master, > 0 = slave.
    pub id: u64,
    /// `host:port` clients connect to (the native listener).
    pub addr: String,
    /// `host:port` slaves replicate from.
    pub ha_addr: String,
}

/// The broker's current topics, read at every registration.
pub trait TopicSource: Send + Sync + 'static {
    fn topics(&self) -> Vec<WireTopicConfig>;
}

impl<F> TopicSource for F
where
    F: Fn() -> Vec<WireTopicConfig> + Send + Sync + 'static,
{
    fn topics(&self) -> Vec<WireTopicConfig> {
        self()
    }
}

/// The broker side of NameServer registration. Build with [`Registrar::new`], then
/// [`Registrar::run`] it until shutdown or [`Registrar::spawn`] it.
pub struct Registrar {
    shared: Arc<Shared>,
    namesrv_addrs: Vec<String>,
}

struct Shared {
    identity: BrokerIdentity,
    interval: Duration,
    topics: Arc<dyn TopicSource>,
    /// Last topic table sent and its version; bumped when the table changes. One short
    /// std lock shared by the per-NameServer tasks, never held across an await.
    version: Mutex<(Vec<WireTopicConfig>, DataVersion)>,
    /// Signs each request (the internal credential, when the NameServers check it).
    signer: Option<Signer>,
    /// Opens the link to a NameServer (TLS, `namesrv.ca`); `None`: plain TCP.
    connector: Option<Connector>,
    /// Per NameServer: whether its last registration succeeded (`/readyz`).
    registered: Arc<Mutex<Vec<(String, bool)>>>,
}

impl Shared {
    fn set_registered(&self, addr: &str, ok: bool) {
        let mut r = lock(&self.registered);
        match r.iter_mut().find(|(a, _)| a == addr) {
            Some(entry) => entry.1 = ok,
            None => r.push((addr.to_owned(), ok)),
        }
    }
}

/// Adds a signature to an outgoing request (see [`Registrar::with_signer`]).
pub type Signer = Arc<dyn Fn(&mut RemotingCommand) + Send + Sync>;

/// Opens a link to a NameServer address within a timeout (see
/// [`Registrar::with_connector`]): the binary's TLS client, since remoting knows no TLS.
pub type Connector = Arc<
    dyn Fn(
            String,
            Duration,
        ) -> std::pin::Pin<Box<dyn Future<Output = Result<Link, crate::Error>> + Send>>
        + Send
        + Sync,
>;

/// Where a registrar is in its life; watched by every per-NameServer task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Unregister, then end.
    Stopping,
    /// End without a word, like a crash.
    Aborting,
}

/// Controls a spawned [`Registrar`]. Dropping it stops the registrar cleanly in the
/// background (it still unregisters); [`RegistrarHandle::stop`] also waits for that.
pub struct RegistrarHandle {
    stop: watch::Sender<Phase>,
    kick: watch::Sender<()>,
    task: JoinHandle<()>,
    registered: Registrations,
}

/// Whether each NameServer took the last registration (cheap to clone; read by
/// the HTTP door's `/readyz`).
#[derive(Debug, Clone, Default)]
pub struct Registrations(Arc<Mutex<Vec<(String, bool)>>>);

impl Registrations {
    /// `(NameServer address, last registration succeeded)`, in the configured
    /// order; `false` until the first attempt answered.
    pub fn snapshot(&self) -> Vec<(String, bool)> {
        lock(&self.0).clone()
    }
}

impl RegistrarHandle {
    /// Whether each NameServer took the last registration.
    pub fn registrations(&self) -> Registrations {
        self.registered.clone()
    }

    /// Re-registers with every NameServer now (e.g. after a topic was created).
    pub fn register_now(&self) {
        self.kick.send_replace(());
    }

    /// [`RegistrarHandle::register_now`] as a callable that does not borrow the handle
    /// (e.g. for the native door's `Server::on_topics_changed`).
    pub fn trigger(&self) -> impl Fn() + Send + Sync + 'static {
        let kick = self.kick.clone();
        move || {
            kick.send_replace(());
        }
    }

    /// Clean stop: unregisters from every reachable NameServer, then returns.
    pub async fn stop(mut self) {
        self.stop.send_replace(Phase::Stopping);
        let _ = (&mut self.task).await;
    }

    /// Abrupt stop: drops every NameServer connection without unregistering, as a crash
    /// would. The connections close as soon as the runtime drops the aborted tasks.
    pub async fn abort(mut self) {
        self.stop.send_replace(Phase::Aborting);
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for RegistrarHandle {
    fn drop(&mut self) {
        self.stop.send_if_modified(|p| {
            let running = *p == Phase::Running;
            if running {
                *p = Phase::Stopping;
            }
            running
        });
    }
}

impl Registrar {
    /// `namesrv_addrs` are `host:port`; `interval` is `broker.register_interval`.
    pub fn new(
        identity: BrokerIdentity,
        namesrv_addrs: Vec<String>,
        interval: Duration,
        topics: Arc<dyn TopicSource>,
    ) -> Self {
        Registrar {
            shared: Arc::new(Shared {
                identity,
                interval,
                topics,
                version: Mutex::new((Vec::new(), DataVersion::default())),
                signer: None,
                connector: None,
                registered: Arc::new(Mutex::new(
                    namesrv_addrs.iter().map(|a| (a.clone(), false)).collect(),
                )),
            }),
            namesrv_addrs,
        }
    }

    /// Signs every registration and unregistration with `signer` (the binary passes
    /// one that adds the internal credential's RocketMQ signature).
    pub fn with_signer(mut self, signer: Signer) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.signer = Some(signer);
        }
        self
    }

    /// Opens the links to the NameServers with `connector` (TLS) instead of plain TCP.
    pub fn with_connector(mut self, connector: Connector) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.connector = Some(connector);
        }
        self
    }

    /// Registers until `shutdown` completes, then unregisters and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let (stop, _) = watch::channel(Phase::Running);
        let (kick, _) = watch::channel(());
        self.run_until(stop.clone(), kick, async move {
            shutdown.await;
            stop.send_replace(Phase::Stopping);
        })
        .await;
    }

    /// Runs on the current tokio runtime; see [`RegistrarHandle`].
    pub fn spawn(self) -> RegistrarHandle {
        let (stop, _) = watch::channel(Phase::Running);
        let (kick, _) = watch::channel(());
        let registered = Registrations(self.shared.registered.clone());
        let task = tokio::spawn(self.run_until(stop.clone(), kick.clone(), async {}));
        RegistrarHandle {
            stop,
            kick,
            task,
            registered,
        }
    }

    /// Dropping this future aborts every link (the JoinSet aborts its tasks on drop).
    async fn run_until(
        self,
        stop: watch::Sender<Phase>,
        kick: watch::Sender<()>,
        trigger: impl Future<Output = ()>,
    ) {
        let mut links = JoinSet::new();
        for addr in self.namesrv_addrs {
            links.spawn(keep_registered(
                addr,
                self.shared.clone(),
                stop.subscribe(),
                kick.subscribe(),
            ));
        }
        trigger.await;
        while links.join_next().await.is_some() {}
    }
}

impl Shared {
    fn signed(&self, mut cmd: RemotingCommand) -> RemotingCommand {
        if let Some(sign) = &self.signer {
            sign(&mut cmd);
        }
        cmd
    }

    fn register_request(&self) -> RemotingCommand {
        let topics = {
            let mut t = self.topics.topics();
            t.sort_by(|a, b| a.topic_name.cmp(&b.topic_name));
            t
        };
        let data_version = {
            let mut v = lock(&self.version);
            if v.1.timestamp == 0 || v.0 != topics {
                v.1.counter += 1;
                v.1.timestamp = now_ms();
                v.0 = topics.clone();
            }
            v.1.clone()
        };
        let body = RegisterBrokerBody {
            filter_server_list: Vec::new(),
            topic_config_serialize_wrapper: TopicConfigWrapper {
                data_version,
                topic_config_table: topics
                    .into_iter()
                    .map(|t| (t.topic_name.clone(), t))
                    .collect(),
            },
        };
        let body = crate::protocol::to_json(&body);
        let id = &self.identity;
        command(request::REGISTER_BROKER)
            .with_field(field::BROKER_NAME, &id.name)
            .with_field(field::BROKER_ADDR, &id.addr)
            .with_field(field::CLUSTER_NAME, &id.cluster)
            .with_field(field::HA_SERVER_ADDR, &id.ha_addr)
            .with_field(field::BROKER_ID, id.id)
            .with_field(field::COMPRESSED, false)
            .with_field(field::BODY_CRC32, crate::protocol::body_crc32(&body))
            .with_body(body)
    }

    fn unregister_request(&self) -> RemotingCommand {
        let id = &self.identity;
        command(request::UNREGISTER_BROKER)
            .with_field(field::BROKER_NAME, &id.name)
            .with_field(field::BROKER_ADDR, &id.addr)
            .with_field(field::CLUSTER_NAME, &id.cluster)
            .with_field(field::BROKER_ID, id.id)
    }
}

fn command(code: i32) -> RemotingCommand {
    RemotingCommand {
        code,
        language: LanguageCode::Rust,
        version: version::CURRENT,
        ..Default::default()
    }
}

enum Wake {
    Tick,
    Stop,
    Closed,
}

/// One NameServer's registration loop.
async fn keep_registered(
    addr: String,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<Phase>,
    mut kick: watch::Receiver<()>,
) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        // Nothing the NameServer sends unasked matters here: no push channel.
        let connected = tokio::select! {
            c = async {
                match &shared.connector {
                    Some(connect) => connect(addr.clone(), REQUEST_TIMEOUT).await,
                    None => Link::connect(&addr, REQUEST_TIMEOUT, None).await,
                }
            } => c,
            _ = stop.wait_for(|p| *p != Phase::Running) => return,
        };
        match connected {
            Ok(link) => loop {
                match link
                    .call(shared.signed(shared.register_request()), REQUEST_TIMEOUT)
                    .await
                {
                    Ok(r) if r.code == response::SUCCESS => {
                        shared.set_registered(&addr, true);
                        debug!(namesrv = %addr, "registered");
                        backoff = FIRST_BACKOFF;
                    }
                    Ok(r) => {
                        shared.set_registered(&addr, false);
                        warn!(namesrv = %addr, code = r.code, remark = ?r.remark, "registration refused")
                    }
                    Err(e) => {
                        shared.set_registered(&addr, false);
                        warn!(namesrv = %addr, error = %e, "registration failed; reconnecting");
                        break;
                    }
                }
                let wake = tokio::select! {
                    _ = tokio::time::sleep(shared.interval) => Wake::Tick,
                    _ = kick.changed() => Wake::Tick,
                    p = stop.wait_for(|p| *p != Phase::Running) => match p.map(|p| *p) {
                        Ok(Phase::Stopping) => Wake::Stop,
                        _ => return,
                    },
                    _ = link.closed() => Wake::Closed,
                };
                match wake {
                    Wake::Tick => {}
                    Wake::Closed => {
                        info!(namesrv = %addr, "connection closed by NameServer; reconnecting");
                        break;
                    }
                    Wake::Stop => {
                        match link
                            .call(shared.signed(shared.unregister_request()), REQUEST_TIMEOUT)
                            .await
                        {
                            Ok(_) => info!(namesrv = %addr, "unregistered"),
                            Err(e) => warn!(namesrv = %addr, error = %e, "unregister failed"),
                        }
                        return;
                    }
                }
            },
            Err(e) => {
                shared.set_registered(&addr, false);
                debug!(namesrv = %addr, error = %e, "connect failed")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|p| *p != Phase::Running) => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(topics: Arc<Mutex<Vec<WireTopicConfig>>>) -> Shared {
        let source = move || topics.lock().unwrap().clone();
        Shared {
            identity: BrokerIdentity {
                cluster: "DefaultCluster".into(),
                name: "broker-a".into(),
                id: 0,
                addr: "127.0.0.1:10911".into(),
                ha_addr: "127.0.0.1:10912".into(),
            },
            interval: Duration::from_secs(30),
            signer: None,
            connector: None,
            topics: Arc::new(source),
            version: Mutex::new((Vec::new(), DataVersion::default())),
            registered: Arc::default(),
        }
    }

    #[test]
    fn register_request_carries_identity_topics_and_a_checksum() {
        let topics = Arc::new(Mutex::new(vec![WireTopicConfig::new("T", 4)]));
        let s = shared(topics.clone());
        let r = s.register_request();
        assert_eq!(r.code, request::REGISTER_BROKER);
        assert_eq!(r.field(field::BROKER_NAME), Some("broker-a"));
        assert_eq!(r.field(field::BROKER_ID), Some("0"));
        assert_eq!(r.field(field::COMPRESSED), Some("false"));
        let crc = crate::protocol::body_crc32(&r.body);
        assert_eq!(r.field(field::BODY_CRC32), Some(crc.to_string().as_str()));
        let body: RegisterBrokerBody = crate::protocol::from_json(&r.body).unwrap();
        let w = body.topic_config_serialize_wrapper;
        assert_eq!(w.topic_config_table["T"].write_queue_nums, 4);
        assert_eq!(w.data_version.counter, 1);

        // Same topics: same version. Changed topics: version moves on.
        let again: RegisterBrokerBody =
            crate::protocol::from_json(&s.register_request().body).unwrap();
        assert_eq!(again.topic_config_serialize_wrapper.data_version.counter, 1);
        topics.lock().unwrap().push(WireTopicConfig::new("U", 2));
        let changed: RegisterBrokerBody =
            crate::protocol::from_json(&s.register_request().body).unwrap();
        assert_eq!(
            changed.topic_config_serialize_wrapper.data_version.counter,
            2
        );
    }
}
