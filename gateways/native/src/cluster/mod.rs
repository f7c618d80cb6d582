//! [`Cluster`]: the broker API ([`MessagingApi`]) over many broker groups, for a proxy
//! whose MQTT, HTTP and WebSocket doors see a whole cluster (RocketMQ 5's proxy in
//! cluster mode). Each broker group is one *member* — any `M: MessagingApi`: a
//! remote broker over the native protocol in a proxy, a local `Broker` in tests —
//! made by a factory from its name and master address; the routes come from a
//! [`RouteSource`] ([`NameServerRoutes`] in a proxy, [`MemberRoutes`] in tests).
//!
//! The rules, in short (`docs/proxy.md`, "Routing over broker groups", has them
//! all with the reasons):
//! - a topic's queues over the groups are one dense range of global ids, groups in
//!   broker-name order ([`route`] explains the numbering and what a change of the
//!   broker set does);
//! - a send goes round-robin over every writable queue of every group, skips a group
//!   whose send just failed with "cannot take writes now", and is retried once on
//!   another group after such a failure; a sharding key maps to one global queue while
//!   the route is unchanged; an explicit queue goes to its owner;
//! - pull, offsets, locks and stats go to the queue's owner, ids translated both ways;
//! - a POP asks the groups in turn (the first one asked rotates), then long-polls all
//!   of them at once; what the polls bring is kept for the POPs of the same group,
//!   topic and filter, never dropped (`pop.rs`);
//! - receipt handles and transaction handles name their broker (`v2:<broker>:…`,
//!   `<broker>@…`), so an ack through any proxy reaches the group that holds it;
//! - group membership, group settings and topic administration go to every group.
//!
//! Routes are cached and re-read every [`ClusterSettings::refresh`] by a background
//! task (and at once after a failed send); a topic no group hosts is remembered as
//! absent for one refresh period, so a door polling an unknown name does not ask the
//! NameServers on every call; a broker whose master address changed (failover) gets a
//! new member from the factory.

mod api;
mod fanout;
mod namesrv;
mod pop;
pub mod route;
mod send;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rocketgate_core::broker::{DelayLimits, DelaySettings, MessagingApi, TransactionChecker};
use rocketgate_core::sync::lock;
use rocketgate_core::{Error, Result};
use tracing::{debug, warn};

pub use namesrv::{NameServerRoutes, placements};
pub use route::{BrokerAddr, MemberRoutes, Placement, RouteSource, TopicRoute};

/// A future a member factory returns.
pub type MemberFuture<M> = Pin<Box<dyn Future<Output = Result<Arc<M>>> + Send>>;

/// Makes the member for a broker group from its name and master address.
type Factory<M> = Box<dyn Fn(&BrokerAddr) -> MemberFuture<M> + Send + Sync>;

/// How a [`Cluster`] keeps its routes.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// How often the cached routes and the broker list are re-read (default 1 s).
    pub refresh: Duration,
    /// How long a group whose send failed with "cannot take writes now" is left out
    /// of round-robin sends (default 3 s).
    pub pause: Duration,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            refresh: Duration::from_secs(1),
            pause: Duration::from_secs(3),
        }
    }
}

/// The broker API over many broker groups; see the module docs. Cheap to clone.
pub struct Cluster<M, R> {
    inner: Arc<Inner<M, R>>,
}

impl<M, R> Clone for Cluster<M, R> {
    fn clone(&self) -> Self {
        Cluster {
            inner: self.inner.clone(),
        }
    }
}

/// One broker group's member and how its sends went.
struct Slot<M> {
    addr: String,
    api: Arc<M>,
    /// Round-robin sends skip the group until then.
    paused_until: Option<Instant>,
}

/// A transaction checker registered through the cluster: kept so that a member
/// made later (a new group, a new master) gets it too.
struct Checker {
    group: String,
    checker: Arc<dyn TransactionChecker>,
    /// The members (group name and address) it is registered on or being
    /// registered on: whoever inserts one here registers it, so each member gets it
    /// once however the cluster's listing and a new member's making interleave.
    on: std::collections::BTreeSet<(String, String)>,
    /// The members' registrations, dropped with this entry.
    registrations: Vec<rocketgate_core::broker::CheckerRegistration>,
}

/// A topic's route as last read.
#[derive(Clone)]
enum Cached {
    Route(Arc<TopicRoute>),
    /// No group hosted it, as of then: asked again after one refresh period (not
    /// by the refresh task, so names nobody creates cost nothing after that).
    Absent(Instant),
}

/// Transaction checkers registered through the cluster.
#[derive(Default)]
struct Checkers {
    /// By id. Std lock; registering on a member happens outside it.
    by_id: Mutex<BTreeMap<u64, Checker>>,
    next: std::sync::atomic::AtomicU64,
}

struct Inner<M, R> {
    routes: R,
    factory: Factory<M>,
    settings: ClusterSettings,
    /// Broker name → member. Std lock, map operations only; members are cloned out.
    members: Mutex<BTreeMap<String, Slot<M>>>,
    /// Topic → its route as last read. Std lock, map operations only.
    cache: Mutex<HashMap<String, Cached>>,
    /// Every master as last read (empty until the first answer). Std lock.
    brokers: Mutex<Arc<Vec<BrokerAddr>>>,
    /// Round-robin cursor of sends.
    next_queue: AtomicUsize,
    /// What POPs share (`pop.rs`).
    pops: pop::Pops,
    /// From the first member made. Std lock, cloned out.
    delay_limits: Mutex<DelayLimits>,
    checkers: Checkers,
}

/// The error a door answers as "unavailable, try again" (503): a group or the
/// NameServers cannot be reached. Core has no transport error, so this is
/// [`Error::NotLeader`] with the reason; the one place to change when it gets one.
pub fn unavailable(reason: String) -> Error {
    Error::NotLeader { reason }
}

/// Errors that mean "this group cannot take writes now": a send is retried on
/// another group and the group is left out of round-robin sends for a while. The
/// message was not stored (or, for `NotLeader` after the append, its outcome is
/// unknown — a retry may store it twice, as a RocketMQ producer's retry may).
pub fn cannot_write(e: &Error) -> bool {
    matches!(
        e,
        Error::NotLeader { .. }
            | Error::ReadOnlyReplica { .. }
            | Error::ShutDown
            | Error::DiskFull { .. }
            | Error::NoInSyncReplica { .. }
            | Error::FlushFailed(_)
            | Error::Io { .. }
    )
}

impl<M, R> Cluster<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// A cluster over the groups `routes` names, each made a member by `factory`
    /// (`(broker name, master address)`); starts the refresh task (needs a tokio
    /// runtime). Asks for the broker list once, so `delay_limits` is a member's.
    pub async fn start<F, Fut>(routes: R, settings: ClusterSettings, factory: F) -> Self
    where
        F: Fn(&BrokerAddr) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Arc<M>>> + Send + 'static,
    {
        let inner = Arc::new(Inner {
            routes,
            factory: Box::new(move |b| Box::pin(factory(b))),
            settings,
            members: Mutex::default(),
            cache: Mutex::default(),
            brokers: Mutex::default(),
            next_queue: AtomicUsize::new(0),
            pops: pop::Pops::default(),
            delay_limits: Mutex::new(DelaySettings::default().limits()),
            checkers: Checkers::default(),
        });
        let cluster = Cluster { inner };
        if let Err(e) = cluster.all_members().await {
            warn!(error = %e, "no broker list yet");
        }
        tokio::spawn(refresh_loop(Arc::downgrade(&cluster.inner)));
        cluster
    }

    /// The route of `topic`: cached, else asked for. [`Error::TopicNotFound`] when
    /// no group hosts it.
    pub async fn route(&self, topic: &str) -> Result<Arc<TopicRoute>> {
        let cached = lock(&self.inner.cache).get(topic).cloned();
        match cached {
            Some(Cached::Route(r)) => return Ok(r),
            Some(Cached::Absent(at)) if at.elapsed() < self.inner.settings.refresh => {
                return Err(Error::TopicNotFound {
                    topic: topic.to_owned(),
                });
            }
            _ => {}
        }
        self.refresh_route(topic)
            .await?
            .ok_or_else(|| Error::TopicNotFound {
                topic: topic.to_owned(),
            })
    }

    /// Reads the route of `topic` again now.
    pub async fn refresh_route(&self, topic: &str) -> Result<Option<Arc<TopicRoute>>> {
        self.inner.refresh_route(topic).await
    }

    /// Every master broker, as last read (asked for when none is known yet).
    pub async fn brokers(&self) -> Result<Arc<Vec<BrokerAddr>>> {
        let known = lock(&self.inner.brokers).clone();
        if !known.is_empty() {
            return Ok(known);
        }
        self.inner.refresh_brokers().await
    }

    /// Every master broker as last read, without asking (empty until the first answer).
    pub fn known_brokers(&self) -> Arc<Vec<BrokerAddr>> {
        lock(&self.inner.brokers).clone()
    }

    /// The member of `broker` at `addr`, made (or replaced, when the address
    /// changed) by the factory.
    async fn member_at(&self, broker: &BrokerAddr) -> Result<Arc<M>> {
        self.inner.member_at(&broker.name, &broker.addr).await
    }

    /// The member of a broker known by name only (a receipt or transaction handle
    /// names it).
    async fn member_named(&self, broker: &str) -> Result<Arc<M>> {
        if let Some(s) = lock(&self.inner.members).get(broker) {
            return Ok(s.api.clone());
        }
        let brokers = self.inner.refresh_brokers().await?;
        let b = brokers
            .iter()
            .find(|b| b.name == broker)
            .ok_or_else(|| unavailable(format!("broker {broker:?} is not in the cluster now")))?;
        self.member_at(b).await
    }

    /// Every group's member, with its name (groups whose member cannot be made are
    /// left out, logged).
    async fn all_members(&self) -> Result<Vec<(BrokerAddr, Arc<M>)>> {
        let brokers = self.brokers().await?;
        let mut out = Vec::with_capacity(brokers.len());
        for b in brokers.iter() {
            match self.member_at(b).await {
                Ok(m) => out.push((b.clone(), m)),
                Err(e) => warn!(broker = b.name, error = %e, "no member for broker"),
            }
        }
        Ok(out)
    }

    /// The members of a route's placements.
    async fn route_members(&self, route: &TopicRoute) -> Vec<(BrokerAddr, Result<Arc<M>>)> {
        let mut out = Vec::with_capacity(route.placements().len());
        for p in route.placements() {
            let b = BrokerAddr {
                name: p.broker.clone(),
                addr: p.addr.clone(),
            };
            let m = self.member_at(&b).await;
            out.push((b, m));
        }
        out
    }

    /// Leaves `broker` out of round-robin sends for a while, and reads the route of
    /// `topic` again in the background (a failover may have moved its master).
    fn pause(&self, broker: &str, topic: &str) {
        if let Some(s) = lock(&self.inner.members).get_mut(broker) {
            s.paused_until = Some(Instant::now() + self.inner.settings.pause);
        }
        let inner = self.inner.clone();
        let topic = topic.to_owned();
        tokio::spawn(async move {
            let _ = inner.refresh_route(&topic).await;
            let _ = inner.refresh_brokers().await;
        });
    }

    /// Forgets the cached route of `topic` (after its queues changed).
    fn forget(&self, topic: &str) {
        lock(&self.inner.cache).remove(topic);
    }
}

impl<M, R> Inner<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    async fn refresh_route(&self, topic: &str) -> Result<Option<Arc<TopicRoute>>> {
        match self.routes.route(topic).await? {
            Some(r) => {
                let r = Arc::new(r);
                lock(&self.cache).insert(topic.to_owned(), Cached::Route(r.clone()));
                Ok(Some(r))
            }
            None => {
                lock(&self.cache).insert(topic.to_owned(), Cached::Absent(Instant::now()));
                Ok(None)
            }
        }
    }

    async fn refresh_brokers(&self) -> Result<Arc<Vec<BrokerAddr>>> {
        let brokers = Arc::new(self.routes.brokers().await?);
        *lock(&self.brokers) = brokers.clone();
        Ok(brokers)
    }

    /// The member of group `name` at `addr` (made, or replaced when the address
    /// changed, by the factory).
    async fn member_at(&self, name: &str, addr: &str) -> Result<Arc<M>> {
        if let Some(s) = lock(&self.members).get(name)
            && s.addr == addr
        {
            return Ok(s.api.clone());
        }
        // Made outside the lock; when two calls race, the first one stored wins.
        let broker = BrokerAddr {
            name: name.to_owned(),
            addr: addr.to_owned(),
        };
        let made = (self.factory)(&broker).await?;
        let (api, fresh) = {
            let mut members = lock(&self.members);
            match members.get(name) {
                Some(s) if s.addr == addr => (s.api.clone(), false),
                _ => {
                    if members.is_empty() {
                        *lock(&self.delay_limits) = made.delay_limits();
                    }
                    members.insert(
                        broker.name,
                        Slot {
                            addr: broker.addr,
                            api: made.clone(),
                            paused_until: None,
                        },
                    );
                    (made, true)
                }
            }
        };
        if fresh {
            debug!(broker = name, addr, "new member");
            self.register_checkers(name, addr, &api).await;
        }
        Ok(api)
    }

    /// Registers every checker registered so far on a new member.
    async fn register_checkers(&self, broker: &str, addr: &str, api: &Arc<M>) {
        let ids: Vec<u64> = lock(&self.checkers.by_id).keys().copied().collect();
        for id in ids {
            self.register_checker(id, broker, addr, api).await;
        }
    }

    /// Registers checker `id` on one member, unless it is (being) registered there.
    async fn register_checker(&self, id: u64, broker: &str, addr: &str, api: &Arc<M>) {
        let claimed = lock(&self.checkers.by_id).get_mut(&id).and_then(|c| {
            c.on.insert((broker.to_owned(), addr.to_owned()))
                .then(|| (c.group.clone(), c.checker.clone()))
        });
        let Some((group, checker)) = claimed else {
            return;
        };
        let named = fanout::named_checker(broker, checker);
        match api.register_transaction_checker(&group, named).await {
            Ok(reg) => {
                if let Some(c) = lock(&self.checkers.by_id).get_mut(&id) {
                    c.registrations.push(reg);
                }
            }
            Err(e) => warn!(broker, group, error = %e, "cannot register checker"),
        }
    }

    /// Re-reads the broker list and every cached route, all at once.
    async fn refresh_all(&self) {
        let topics: Vec<String> = {
            let mut cache = lock(&self.cache);
            cache.retain(|_, c| match c {
                Cached::Route(_) => true,
                Cached::Absent(at) => at.elapsed() < self.settings.refresh,
            });
            cache
                .iter()
                .filter(|(_, c)| matches!(c, Cached::Route(_)))
                .map(|(t, _)| t.clone())
                .collect()
        };
        let brokers = async {
            if let Err(e) = self.refresh_brokers().await {
                debug!(error = %e, "broker list refresh failed");
            }
        };
        let routes = futures_util::future::join_all(topics.iter().map(|t| async move {
            if let Err(e) = self.refresh_route(t).await {
                debug!(topic = t, error = %e, "route refresh failed");
            }
        }));
        futures_util::future::join(brokers, routes).await;
    }
}

async fn refresh_loop<M, R>(inner: Weak<Inner<M, R>>)
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    let Some(every) = inner.upgrade().map(|i| i.settings.refresh) else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        inner.refresh_all().await;
    }
}

/// The next index of a round-robin over `n` things.
fn turn(counter: &AtomicUsize, n: usize) -> usize {
    counter.fetch_add(1, Ordering::Relaxed) % n.max(1)
}
