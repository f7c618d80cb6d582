//! Where a topic's queues are: [`TopicRoute`] (each broker group's share, sorted by
//! broker name, and the dense global numbering the doors see) and the
//! [`RouteSource`] seam the [`super::Cluster`] asks, with its in-memory twin
//! [`MemberRoutes`] (routes read from the members' own topic tables).
//!
//! # Global queue ids
//! The placements are sorted by broker name; each contributes
//! `span = max(read_queues, write_queues)` ids, so broker `i`'s local queue `q` is
//! global queue `base(i) + q` with `base(i)` the sum of the spans before it. When the
//! broker set of a topic changes, the ids of the brokers after the change shift. That
//! is safe for everything stored: offsets, POP state and locks are kept per *local*
//! queue on the owning broker, so only positions a caller holds in memory under the
//! old ids (a door's cursor of "queue 5") must be re-read; the doors re-read the queue
//! count and their offsets when a queue's answer changes shape, as they do after a
//! rebalance.

use std::future::Future;
use std::sync::{Arc, Mutex};

use rocketgate_core::broker::{MessagingApi, Perm, TopicConfig, TopicKind};
use rocketgate_core::sync::lock;
use rocketgate_core::{Error, Result};

/// One broker group's share of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The broker (group) name.
    pub broker: String,
    /// Its master's address.
    pub addr: String,
    pub read_queues: u32,
    pub write_queues: u32,
    pub perm: Perm,
}

impl Placement {
    /// How many global ids the broker takes: the larger of its queue counts.
    pub fn span(&self) -> u32 {
        self.read_queues.max(self.write_queues)
    }

    /// Local queues a send may go to.
    pub fn writable(&self) -> u32 {
        if self.perm.is_writable() {
            self.write_queues
        } else {
            0
        }
    }
}

/// A topic's queues over the broker groups that host it, sorted by broker name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicRoute {
    placements: Vec<Placement>,
}

impl TopicRoute {
    /// The route over these placements (sorted by broker; a broker named twice
    /// keeps its first placement).
    pub fn new(mut placements: Vec<Placement>) -> TopicRoute {
        placements.sort_by(|a, b| a.broker.cmp(&b.broker));
        placements.dedup_by(|b, a| a.broker == b.broker);
        TopicRoute { placements }
    }

    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    pub fn is_empty(&self) -> bool {
        self.placements.is_empty()
    }

    /// The number of global queue ids.
    pub fn queue_count(&self) -> u32 {
        self.placements.iter().map(Placement::span).sum()
    }

    /// The first global id of `broker`'s queues.
    pub fn base(&self, broker: &str) -> Option<u32> {
        let mut base = 0;
        for p in &self.placements {
            if p.broker == broker {
                return Some(base);
            }
            base += p.span();
        }
        None
    }

    /// The placement owning global queue `queue` and its local id there.
    pub fn locate(&self, queue: u32) -> Option<(&Placement, u32)> {
        self.locate_index(queue)
            .map(|(i, q)| (&self.placements[i], q))
    }

    /// The first global id of the placement at `index`.
    pub fn base_at(&self, index: usize) -> u32 {
        self.placements[..index.min(self.placements.len())]
            .iter()
            .map(Placement::span)
            .sum()
    }

    /// [`TopicRoute::locate`] as the placement's index.
    pub fn locate_index(&self, queue: u32) -> Option<(usize, u32)> {
        let mut base = 0;
        for (i, p) in self.placements.iter().enumerate() {
            if queue < base + p.span() {
                return Some((i, queue - base));
            }
            base += p.span();
        }
        None
    }

    /// Writable queues of the placements `skip` leaves in.
    pub fn writable_count(&self, skip: impl Fn(&Placement) -> bool) -> u32 {
        self.placements
            .iter()
            .filter(|p| !skip(p))
            .map(Placement::writable)
            .sum()
    }

    /// The global id of `broker`'s local queue `local`.
    pub fn global(&self, broker: &str, local: u32) -> Option<u32> {
        self.base(broker).map(|b| b + local)
    }

    /// Every queue a send may go to, in global order: `(placement index, local id)`.
    pub fn writable(&self) -> Vec<(usize, u32)> {
        self.placements
            .iter()
            .enumerate()
            .flat_map(|(i, p)| (0..p.writable()).map(move |q| (i, q)))
            .collect()
    }

    /// The topic as one: every global id readable, the write queues summed, the
    /// permissions of all placements together.
    pub fn config(&self, topic: &str) -> TopicConfig {
        TopicConfig {
            name: topic.to_owned(),
            read_queues: self.queue_count(),
            write_queues: self.placements.iter().map(Placement::writable).sum(),
            perm: Perm(self.placements.iter().fold(0, |p, q| p | q.perm.0)),
        }
    }
}

/// A master broker the NameServers know: `(broker name, address)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BrokerAddr {
    pub name: String,
    pub addr: String,
}

/// Where the [`super::Cluster`] learns routes. Implemented over the NameServers
/// ([`super::NameServerRoutes`]) and by the in-memory [`MemberRoutes`].
pub trait RouteSource: Send + Sync + 'static {
    /// The route of `topic` now; `None` when no broker hosts it.
    fn route(&self, topic: &str) -> impl Future<Output = Result<Option<TopicRoute>>> + Send;
    /// Every master broker now, sorted by name.
    fn brokers(&self) -> impl Future<Output = Result<Vec<BrokerAddr>>> + Send;
}

/// A shared source is a source (a test keeps a handle to change it).
impl<T: RouteSource> RouteSource for Arc<T> {
    fn route(&self, topic: &str) -> impl Future<Output = Result<Option<TopicRoute>>> + Send {
        (**self).route(topic)
    }

    fn brokers(&self) -> impl Future<Output = Result<Vec<BrokerAddr>>> + Send {
        (**self).brokers()
    }
}

/// Routes read from the members' own topic tables (each broker asked `topic()`), the
/// way the NameServers learn them from the brokers' registrations, but without the
/// registration delay. The broker list is what was [`MemberRoutes::add`]ed; the
/// member factory of a cluster using it hands out the same members by address.
pub struct MemberRoutes<M> {
    /// Name, address and API of every broker. Std lock, cloned out before any call.
    brokers: Mutex<Vec<(BrokerAddr, Arc<M>)>>,
}

impl<M: MessagingApi + 'static> MemberRoutes<M> {
    pub fn new() -> Self {
        MemberRoutes {
            brokers: Mutex::default(),
        }
    }

    /// A broker joins (or, under a known name, moves to a new address).
    pub fn add(&self, name: &str, addr: &str, api: Arc<M>) {
        let mut brokers = lock(&self.brokers);
        brokers.retain(|(b, _)| b.name != name);
        brokers.push((
            BrokerAddr {
                name: name.to_owned(),
                addr: addr.to_owned(),
            },
            api,
        ));
        brokers.sort_by(|a, b| a.0.cmp(&b.0));
    }

    /// A broker leaves.
    pub fn remove(&self, name: &str) {
        lock(&self.brokers).retain(|(b, _)| b.name != name);
    }

    /// The member at `addr`, for a cluster's member factory.
    pub fn member(&self, addr: &str) -> Option<Arc<M>> {
        lock(&self.brokers)
            .iter()
            .find(|(b, _)| b.addr == addr)
            .map(|(_, m)| m.clone())
    }

    fn all(&self) -> Vec<(BrokerAddr, Arc<M>)> {
        lock(&self.brokers).clone()
    }
}

impl<M: MessagingApi + 'static> Default for MemberRoutes<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: MessagingApi + 'static> RouteSource for MemberRoutes<M> {
    async fn route(&self, topic: &str) -> Result<Option<TopicRoute>> {
        let mut placements = Vec::new();
        for (b, api) in self.all() {
            match api.topic(topic).await {
                Ok(c) => placements.push(Placement {
                    broker: b.name,
                    addr: b.addr,
                    read_queues: c.read_queues,
                    write_queues: c.write_queues,
                    perm: c.perm,
                }),
                Err(Error::TopicNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((!placements.is_empty()).then(|| TopicRoute::new(placements)))
    }

    async fn brokers(&self) -> Result<Vec<BrokerAddr>> {
        Ok(self.all().into_iter().map(|(b, _)| b).collect())
    }
}

/// Whether a topic belongs in a listing of `kind`.
pub(super) fn is_kind(config: &TopicConfig, kind: TopicKind) -> bool {
    match kind {
        TopicKind::User => !config.is_system(),
        TopicKind::System => config.is_system(),
        TopicKind::All => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(broker: &str, read: u32, write: u32) -> Placement {
        Placement {
            broker: broker.into(),
            addr: format!("{broker}:1"),
            read_queues: read,
            write_queues: write,
            perm: Perm::READ_WRITE,
        }
    }

    #[test]
    fn global_ids_are_dense_in_broker_name_order() {
        let r = TopicRoute::new(vec![place("b", 2, 2), place("a", 3, 1)]);
        assert_eq!(r.queue_count(), 5);
        assert_eq!(r.base("a"), Some(0));
        assert_eq!(r.base("b"), Some(3));
        assert_eq!(
            r.locate(2).map(|(p, q)| (p.broker.as_str(), q)),
            Some(("a", 2))
        );
        assert_eq!(
            r.locate(3).map(|(p, q)| (p.broker.as_str(), q)),
            Some(("b", 0))
        );
        assert_eq!(r.locate(5), None);
        assert_eq!(r.global("b", 1), Some(4));
        assert_eq!(r.writable(), vec![(0, 0), (1, 0), (1, 1)]);
        assert_eq!(r.writable_count(|p| p.broker == "a"), 2);
        assert_eq!((r.base_at(0), r.base_at(1), r.base_at(2)), (0, 3, 5));
        assert_eq!(r.locate_index(4), Some((1, 1)));
        let c = r.config("t");
        assert_eq!((c.read_queues, c.write_queues), (5, 3));
    }

    #[test]
    fn a_read_only_broker_takes_ids_but_no_sends() {
        let mut ro = place("a", 2, 2);
        ro.perm = Perm::READ;
        let r = TopicRoute::new(vec![ro, place("b", 2, 2)]);
        assert_eq!(r.writable(), vec![(1, 0), (1, 1)]);
        assert_eq!(r.queue_count(), 4);
    }
}
