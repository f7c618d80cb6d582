//! [`Session`]: what a producer or consumer shares with the cluster — its links, the
//! topic routes it learned from the NameServers, and the heartbeat it sends to every
//! broker. A background task refreshes the routes every `route_refresh` and heartbeats
//! every `heartbeat_interval`; it holds only a weak reference, so dropping the owner
//! ends it.

use rocketgate_core::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::debug;

use super::ClientSettings;
use super::link::{Links, Pushed, refused};
use crate::Error;

use rocketgate_remoting::body::{HeartbeatData, MessageQueue};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::protocol::{
    ClusterInfo, MASTER_ID, TopicRouteData, field, from_json, perm,
};

/// How often a wait for the NameServers to know a broker asks again.
const POLL: Duration = Duration::from_millis(50);

/// A topic's queues and the brokers that host them, as the NameServers told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// Broker name → master address.
    pub brokers: BTreeMap<String, String>,
    /// Broker name → broker id → address: every member of each group, slaves too
    /// (a consumer reads from a slave when told to, or when the master is away).
    pub groups: BTreeMap<String, BTreeMap<u64, String>>,
    /// Queues a producer may send to (masters with write permission), sorted.
    pub write_queues: Vec<MessageQueue>,
    /// Queues a consumer reads (read permission), sorted.
    pub read_queues: Vec<MessageQueue>,
}

impl Route {
    fn from_data(topic: &str, data: &TopicRouteData) -> Route {
        let mut brokers = BTreeMap::new();
        let mut groups: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
        for b in &data.broker_datas {
            if let Some(addr) = b.broker_addrs.get(&MASTER_ID) {
                brokers.insert(b.broker_name.clone(), addr.clone());
            }
            if !b.broker_addrs.is_empty() {
                groups.insert(b.broker_name.clone(), b.broker_addrs.clone());
            }
        }
        let mut write_queues = Vec::new();
        let mut read_queues = Vec::new();
        for q in &data.queue_datas {
            if !groups.contains_key(&q.broker_name) {
                continue;
            }
            // Writes go to a master only; a group whose master is away is still read
            // (from its slaves).
            if q.perm & perm::WRITE != 0 && brokers.contains_key(&q.broker_name) {
                write_queues.extend(
                    (0..q.write_queue_nums).map(|i| MessageQueue::new(topic, &q.broker_name, i)),
                );
            }
            if q.perm & perm::READ != 0 {
                read_queues.extend(
                    (0..q.read_queue_nums).map(|i| MessageQueue::new(topic, &q.broker_name, i)),
                );
            }
        }
        write_queues.sort();
        read_queues.sort();
        Route {
            brokers,
            groups,
            write_queues,
            read_queues,
        }
    }
}

pub(crate) struct Session {
    pub config: ClientSettings,
    pub links: Links,
    /// Topic → route. Std lock, map operations only.
    routes: Mutex<HashMap<String, Arc<Route>>>,
    /// The groups this client heartbeats for. Std lock, cloned out before sending.
    heartbeat: Mutex<HeartbeatData>,
    /// Which NameServer to ask first; moves on after a failure.
    namesrv_cursor: AtomicUsize,
}

impl Session {
    /// Starts a session and its background task; requests the brokers push arrive on
    /// the returned receiver.
    pub fn start(config: ClientSettings) -> (Arc<Session>, mpsc::UnboundedReceiver<Pushed>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let heartbeat = HeartbeatData {
            client_id: config.client_id.clone(),
            ..Default::default()
        };
        let session = Arc::new(Session {
            links: Links::new(tx, config.credentials.clone())
                .with_tls(config.tls.clone(), config.namesrv_addrs.clone())
                .with_namesrv_tls(config.namesrv_tls.clone()),
            routes: Mutex::default(),
            heartbeat: Mutex::new(heartbeat),
            namesrv_cursor: AtomicUsize::new(0),
            config,
        });
        tokio::spawn(background(Arc::downgrade(&session)));
        (session, rx)
    }

    pub fn client_id(&self) -> &str {
        &self.config.client_id
    }

    pub fn timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// Asks the NameServers in turn until one answers `SUCCESS`.
    pub(crate) async fn namesrv_call(
        &self,
        cmd: RemotingCommand,
    ) -> Result<RemotingCommand, Error> {
        let addrs = &self.config.namesrv_addrs;
        if addrs.is_empty() {
            return Err(Error::NoNameServer);
        }
        let start = self.namesrv_cursor.load(Ordering::Relaxed);
        let mut last = Error::NoNameServer;
        for i in 0..addrs.len() {
            let addr = &addrs[(start + i) % addrs.len()];
            match self.links.request(addr, cmd.clone(), self.timeout()).await {
                Ok(resp) if resp.code == response::SUCCESS => {
                    self.namesrv_cursor
                        .store((start + i) % addrs.len(), Ordering::Relaxed);
                    return Ok(resp);
                }
                // A definite "no" from a live NameServer: another may know better,
                // but keep this answer if none does.
                Ok(resp) => last = refused(addr, &resp),
                Err(e) => {
                    debug!(%addr, error = %e, "NameServer unavailable");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// The route of `topic`, from the cache or the NameServers.
    pub async fn route(&self, topic: &str) -> Result<Arc<Route>, Error> {
        if let Some(r) = lock(&self.routes).get(topic) {
            return Ok(r.clone());
        }
        self.refresh_route(topic).await
    }

    /// Asks the NameServers for the route of `topic` now.
    pub async fn refresh_route(&self, topic: &str) -> Result<Arc<Route>, Error> {
        let cmd = RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 0)
            .with_field(field::TOPIC, topic)
            .with_field(field::ACCEPT_STANDARD_JSON_ONLY, true);
        let resp = match self.namesrv_call(cmd).await {
            Err(e) if e.code() == Some(response::TOPIC_NOT_EXIST) => {
                return Err(Error::NoRoute {
                    topic: topic.to_owned(),
                });
            }
            other => other?,
        };
        let data: TopicRouteData = from_json(&resp.body).map_err(|e| Error::Protocol {
            addr: "NameServer".into(),
            what: format!("route of {topic:?}: {e}"),
        })?;
        let route = Arc::new(Route::from_data(topic, &data));
        if route.groups.is_empty() {
            return Err(Error::NoRoute {
                topic: topic.to_owned(),
            });
        }
        lock(&self.routes).insert(topic.to_owned(), route.clone());
        Ok(route)
    }

    /// Forgets a cached route (e.g. after a send to it failed).
    pub fn forget_route(&self, topic: &str) {
        lock(&self.routes).remove(topic);
    }

    /// The master address of a broker, from any known route.
    pub fn broker_addr(&self, broker_name: &str) -> Option<String> {
        lock(&self.routes)
            .values()
            .find_map(|r| r.brokers.get(broker_name).cloned())
    }

    /// Every member of a broker group (id → address), from any known route.
    pub fn group_addrs(&self, broker_name: &str) -> Option<BTreeMap<u64, String>> {
        lock(&self.routes)
            .values()
            .find_map(|r| r.groups.get(broker_name).cloned())
    }

    /// Every master broker of the cluster(s) the NameServers know: `(name, addr)`.
    pub async fn brokers(&self) -> Result<Vec<(String, String)>, Error> {
        let resp = self
            .namesrv_call(RemotingCommand::request(
                request::GET_BROKER_CLUSTER_INFO,
                0,
            ))
            .await?;
        let info: ClusterInfo = from_json(&resp.body).map_err(|e| Error::Protocol {
            addr: "NameServer".into(),
            what: format!("cluster info: {e}"),
        })?;
        Ok(info
            .broker_addr_table
            .into_values()
            .filter_map(|b| {
                let addr = b.broker_addrs.get(&MASTER_ID)?.clone();
                Some((b.broker_name, addr))
            })
            .collect())
    }

    /// [`Session::brokers`], asked again every 50 ms for up to `wait` while the
    /// NameServers know none (a broker that is still starting has not registered
    /// yet); empty only when none appeared in time.
    pub async fn brokers_within(&self, wait: Duration) -> Result<Vec<(String, String)>, Error> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let brokers = self.brokers().await?;
            if !brokers.is_empty() || tokio::time::Instant::now() + POLL > deadline {
                return Ok(brokers);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Changes what this client heartbeats (its producer and consumer groups).
    pub fn update_heartbeat(&self, f: impl FnOnce(&mut HeartbeatData)) {
        f(&mut lock(&self.heartbeat));
    }

    /// Heartbeats every master broker of every known route now, and — for a
    /// consumer, which may read from them — every slave (as RocketMQ's client does).
    /// Returns the first refusal of a master (e.g. a malformed subscription), after
    /// trying them all; a slave that is away is not an error.
    pub async fn heartbeat_now(&self) -> Result<(), Error> {
        let (body, consumer) = {
            let hb = lock(&self.heartbeat);
            (
                rocketgate_remoting::protocol::to_json(&*hb),
                !hb.consumer_data_set.is_empty(),
            )
        };
        let (masters, slaves): (Vec<String>, Vec<String>) = {
            let routes = lock(&self.routes);
            let mut m: Vec<String> = routes
                .values()
                .flat_map(|r| r.brokers.values().cloned())
                .collect();
            m.sort();
            m.dedup();
            let mut s: Vec<String> = routes
                .values()
                .flat_map(|r| r.groups.values())
                .flat_map(|g| g.iter().filter(|(id, _)| **id != MASTER_ID))
                .map(|(_, a)| a.clone())
                .filter(|a| consumer && !m.contains(a))
                .collect();
            s.sort();
            s.dedup();
            (m, s)
        };
        let mut first_err = None;
        for (addr, master) in masters
            .into_iter()
            .map(|a| (a, true))
            .chain(slaves.into_iter().map(|a| (a, false)))
        {
            let cmd = RemotingCommand::request(request::HEART_BEAT, 0).with_body(body.clone());
            if let Err(e) = self.links.call(&addr, cmd, self.timeout()).await {
                debug!(%addr, error = %e, "heartbeat failed");
                if master {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Re-fetches every cached route.
    async fn refresh_all(&self) {
        let topics: Vec<String> = lock(&self.routes).keys().cloned().collect();
        for t in topics {
            if let Err(e) = self.refresh_route(&t).await {
                debug!(topic = t, error = %e, "route refresh failed");
            }
        }
    }
}

async fn background(session: Weak<Session>) {
    let Some((refresh, heartbeat)) = session
        .upgrade()
        .map(|s| (s.config.route_refresh, s.config.heartbeat_interval))
    else {
        return;
    };
    let mut refresh_tick = tokio::time::interval(refresh);
    let mut heartbeat_tick = tokio::time::interval(heartbeat);
    refresh_tick.tick().await;
    heartbeat_tick.tick().await;
    loop {
        tokio::select! {
            _ = refresh_tick.tick() => {
                let Some(s) = session.upgrade() else { return };
                s.refresh_all().await;
            }
            _ = heartbeat_tick.tick() => {
                let Some(s) = session.upgrade() else { return };
                let _ = s.heartbeat_now().await;
            }
        }
    }
}

/// Polls `f` until it is `Some`, for code that must wait for a route to appear.
#[allow(dead_code)]
pub(crate) async fn eventually<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
