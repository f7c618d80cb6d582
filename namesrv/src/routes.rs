//! The route table: which brokers are alive, which queues each hosts, and when a silent
//! broker is dropped. A pure state machine: events come in with the time they happen
//! (`register(.., now)`, `unregister`, `connection_closed`, `tick(now)`), state changes, and
//! the only side effect it asks for comes back as [`Expired`] (close that connection).
//! No sockets, no clock of its own, so it is tested with a fake one.
//!
//! # Invariants
//! - every broker name in `clusters` has an entry in `brokers`, and the reverse;
//! - every `brokers` entry has at least one address;
//! - every topic in `topics` has queues on at least one broker, and every such broker name
//!   is in `brokers`;
//! - every address in `live` appears in its broker's `broker_addrs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rocketgate_remoting::protocol::{
    BrokerData, ClusterInfo, DataVersion, MASTER_ID, QueueData, TopicConfigWrapper, TopicRouteData,
};

/// Identifies one client connection to the NameServer.
pub type ConnId = u64;

/// A `REGISTER_BROKER` request, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub cluster: String,
    pub broker_name: String,
    pub broker_addr: String,
    pub broker_id: u64,
    pub ha_addr: String,
    pub topics: TopicConfigWrapper,
}

/// What a slave learns from registering: where its master is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registered {
    pub master_addr: Option<String>,
    pub master_ha_addr: Option<String>,
}

/// A broker dropped by [`RouteTable::tick`]; the server should close `conn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    pub broker_addr: String,
    pub conn: ConnId,
}

#[derive(Debug, Clone)]
struct Liveness {
    last_seen: Instant,
    conn: ConnId,
    cluster: String,
    broker_name: String,
    ha_addr: String,
    data_version: DataVersion,
}

/// Brokers, their addresses and their queues, with liveness. See the module doc.
#[derive(Debug)]
pub struct RouteTable {
    expiry: Duration,
    /// cluster name -> broker names
    clusters: BTreeMap<String, BTreeSet<String>>,
    /// broker name -> its addresses by broker id
    brokers: BTreeMap<String, BrokerData>,
    /// topic -> broker name -> that broker's queues of the topic
    topics: BTreeMap<String, BTreeMap<String, QueueData>>,
    /// broker address -> when it was last heard from, and on which connection
    live: HashMap<String, Liveness>,
}

impl RouteTable {
    /// `expiry`: a broker silent for longer than this is dropped at the next tick.
    pub fn new(expiry: Duration) -> Self {
        RouteTable {
            expiry,
            clusters: BTreeMap::new(),
            brokers: BTreeMap::new(),
            topics: BTreeMap::new(),
            live: HashMap::new(),
        }
    }

    /// A broker (re-)registers. Its topic table replaces the queues it had, if it is a
    /// master and the table's data version moved (or this is its first registration).
    pub fn register(&mut self, reg: Registration, conn: ConnId, now: Instant) -> Registered {
        self.clusters
            .entry(reg.cluster.clone())
            .or_default()
            .insert(reg.broker_name.clone());
        let broker = self
            .brokers
            .entry(reg.broker_name.clone())
            .or_insert_with(|| BrokerData {
                broker_name: reg.broker_name.clone(),
                cluster: reg.cluster.clone(),
                ..Default::default()
            });
        // One address has one id: a slave promoted to master moves from id N to id 0.
        broker
            .broker_addrs
            .retain(|id, addr| *id == reg.broker_id || *addr != reg.broker_addr);
        broker
            .broker_addrs
            .insert(reg.broker_id, reg.broker_addr.clone());

        let previous = self.live.insert(
            reg.broker_addr.clone(),
            Liveness {
                last_seen: now,
                conn,
                cluster: reg.cluster.clone(),
                broker_name: reg.broker_name.clone(),
                ha_addr: reg.ha_addr.clone(),
                data_version: reg.topics.data_version.clone(),
            },
        );
        let changed = previous.is_none_or(|p| p.data_version != reg.topics.data_version);
        if reg.broker_id == MASTER_ID && changed {
            self.replace_queues(&reg.broker_name, &reg.topics);
        }

        if reg.broker_id == MASTER_ID {
            return Registered::default();
        }
        let master_addr = self
            .brokers
            .get(&reg.broker_name)
            .and_then(|b| b.broker_addrs.get(&MASTER_ID))
            .cloned();
        let master_ha_addr = master_addr
            .as_ref()
            .and_then(|a| self.live.get(a))
            .map(|l| l.ha_addr.clone());
        Registered {
            master_addr,
            master_ha_addr,
        }
    }

    fn replace_queues(&mut self, broker_name: &str, wrapper: &TopicConfigWrapper) {
        for queues in self.topics.values_mut() {
            queues.remove(broker_name);
        }
        for (name, t) in &wrapper.topic_config_table {
            let topic = if t.topic_name.is_empty() {
                name
            } else {
                &t.topic_name
            };
            self.topics.entry(topic.clone()).or_default().insert(
                broker_name.to_string(),
                QueueData {
                    broker_name: broker_name.to_string(),
                    perm: t.perm,
                    read_queue_nums: t.read_queue_nums,
                    topic_sys_flag: t.topic_sys_flag,
                    write_queue_nums: t.write_queue_nums,
                },
            );
        }
        self.topics.retain(|_, q| !q.is_empty());
    }

    /// A broker says it is alive without re-sending its topics (`BROKER_HEARTBEAT`).
    /// Returns false for a broker we do not know, which must register first.
    pub fn heartbeat(&mut self, broker_addr: &str, now: Instant) -> bool {
        match self.live.get_mut(broker_addr) {
            Some(l) => {
                l.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// A broker leaves cleanly (`UNREGISTER_BROKER`); its queues leave the routes at once
    /// when it was the last address of its broker group.
    pub fn unregister(&mut self, broker_name: &str, broker_addr: &str) {
        self.live.remove(broker_addr);
        self.remove_addr(broker_name, broker_addr);
    }

    /// A connection closed: every broker that registered over it is gone (Java's
    /// `onChannelDestroy`). Returns their addresses.
    pub fn connection_closed(&mut self, conn: ConnId) -> Vec<String> {
        let gone: Vec<(String, String)> = self
            .live
            .iter()
            .filter(|(_, l)| l.conn == conn)
            .map(|(addr, l)| (addr.clone(), l.broker_name.clone()))
            .collect();
        for (addr, name) in &gone {
            self.live.remove(addr);
            self.remove_addr(name, addr);
        }
        gone.into_iter().map(|(addr, _)| addr).collect()
    }

    /// The periodic scan: drops every broker silent for longer than the expiry.
    pub fn tick(&mut self, now: Instant) -> Vec<Expired> {
        let expired: Vec<(String, Liveness)> = self
            .live
            .iter()
            .filter(|(_, l)| now.saturating_duration_since(l.last_seen) > self.expiry)
            .map(|(a, l)| (a.clone(), l.clone()))
            .collect();
        expired
            .into_iter()
            .map(|(addr, l)| {
                self.live.remove(&addr);
                self.remove_addr(&l.broker_name, &addr);
                Expired {
                    broker_addr: addr,
                    conn: l.conn,
                }
            })
            .collect()
    }

    fn remove_addr(&mut self, broker_name: &str, broker_addr: &str) {
        let Some(broker) = self.brokers.get_mut(broker_name) else {
            return;
        };
        broker.broker_addrs.retain(|_, a| a != broker_addr);
        if !broker.broker_addrs.is_empty() {
            return;
        }
        let cluster = broker.cluster.clone();
        self.brokers.remove(broker_name);
        if let Some(names) = self.clusters.get_mut(&cluster) {
            names.remove(broker_name);
            if names.is_empty() {
                self.clusters.remove(&cluster);
            }
        }
        for queues in self.topics.values_mut() {
            queues.remove(broker_name);
        }
        self.topics.retain(|_, q| !q.is_empty());
    }

    /// The route of `topic`, or `None` when no live broker hosts it.
    pub fn route(&self, topic: &str) -> Option<TopicRouteData> {
        let queues = self.topics.get(topic)?;
        let broker_datas: Vec<BrokerData> = queues
            .keys()
            .filter_map(|name| self.brokers.get(name).cloned())
            .collect();
        if broker_datas.is_empty() {
            return None;
        }
        Some(TopicRouteData {
            broker_datas,
            queue_datas: queues.values().cloned().collect(),
            ..Default::default()
        })
    }

    pub fn cluster_info(&self) -> ClusterInfo {
        ClusterInfo {
            broker_addr_table: self.brokers.clone(),
            cluster_addr_table: self.clusters.clone(),
        }
    }

    pub fn topic_names(&self) -> BTreeSet<String> {
        self.topics.keys().cloned().collect()
    }

    /// Topics with queues on at least one broker of `cluster`.
    pub fn topics_of_cluster(&self, cluster: &str) -> BTreeSet<String> {
        let Some(names) = self.clusters.get(cluster) else {
            return BTreeSet::new();
        };
        self.topics
            .iter()
            .filter(|(_, q)| q.keys().any(|b| names.contains(b)))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Removes a topic from every route, or only its queues on `cluster`'s brokers. It
    /// comes back if a broker registers it again with a new data version.
    pub fn delete_topic(&mut self, topic: &str, cluster: Option<&str>) {
        match cluster {
            None => {
                self.topics.remove(topic);
            }
            Some(cluster) => {
                let names = self.clusters.get(cluster).cloned().unwrap_or_default();
                if let Some(q) = self.topics.get_mut(topic) {
                    q.retain(|b, _| !names.contains(b));
                    if q.is_empty() {
                        self.topics.remove(topic);
                    }
                }
            }
        }
    }

    /// Live broker addresses (for logs and tests).
    pub fn live_brokers(&self) -> BTreeSet<String> {
        self.live.keys().cloned().collect()
    }

    /// The cluster a live broker address registered under.
    pub fn cluster_of(&self, broker_addr: &str) -> Option<&str> {
        self.live.get(broker_addr).map(|l| l.cluster.as_str())
    }
}

#[cfg(test)]
mod tests {
    use rocketgate_remoting::protocol::WireTopicConfig;

    use super::*;

    const EXPIRY: Duration = Duration::from_secs(120);

    fn reg(name: &str, addr: &str, id: u64, topics: &[(&str, u32)], counter: i64) -> Registration {
        Registration {
            cluster: "DefaultCluster".into(),
            broker_name: name.into(),
            broker_addr: addr.into(),
            broker_id: id,
            ha_addr: format!("{addr}-ha"),
            topics: TopicConfigWrapper {
                data_version: DataVersion {
                    counter,
                    timestamp: 1,
                    ..Default::default()
                },
                topic_config_table: topics
                    .iter()
                    .map(|(t, q)| (t.to_string(), WireTopicConfig::new(*t, *q)))
                    .collect(),
            },
        }
    }

    fn brokers_of(table: &RouteTable, topic: &str) -> Vec<String> {
        table
            .route(topic)
            .map(|r| r.broker_datas.into_iter().map(|b| b.broker_name).collect())
            .unwrap_or_default()
    }

    #[test]
    fn two_brokers_share_a_topic_route() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4)], 1), 1, t0);
        t.register(reg("broker-b", "b:1", 0, &[("T", 4), ("U", 2)], 1), 2, t0);
        let route = t.route("T").unwrap();
        assert_eq!(brokers_of(&t, "T"), ["broker-a", "broker-b"]);
        assert_eq!(route.queue_datas.len(), 2);
        assert_eq!(route.queue_datas[0].write_queue_nums, 4);
        assert_eq!(route.broker_datas[0].broker_addrs[&0], "a:1");
        assert_eq!(brokers_of(&t, "U"), ["broker-b"]);
        assert!(t.route("nope").is_none());
        assert_eq!(
            t.topics_of_cluster("DefaultCluster"),
            BTreeSet::from(["T".into(), "U".into()])
        );
    }

    #[test]
    fn silent_broker_expires_only_after_the_expiry() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4)], 1), 1, t0);
        t.register(reg("broker-b", "b:1", 0, &[("T", 4)], 1), 2, t0);
        // b keeps re-registering every 30 s; a goes silent.
        for s in [30, 60, 90, 120] {
            t.register(
                reg("broker-b", "b:1", 0, &[("T", 4)], 1),
                2,
                t0 + Duration::from_secs(s),
            );
            assert!(t.tick(t0 + Duration::from_secs(s)).is_empty(), "at {s}s");
        }
        let expired = t.tick(t0 + Duration::from_secs(121));
        assert_eq!(
            expired,
            [Expired {
                broker_addr: "a:1".into(),
                conn: 1
            }]
        );
        assert_eq!(brokers_of(&t, "T"), ["broker-b"]);
        assert!(t.tick(t0 + Duration::from_secs(200)).is_empty());
        assert_eq!(t.live_brokers(), BTreeSet::from(["b:1".to_string()]));
    }

    #[test]
    fn closed_connection_drops_its_brokers_at_once() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4)], 1), 7, t0);
        t.register(reg("broker-b", "b:1", 0, &[("T", 4)], 1), 8, t0);
        assert_eq!(t.connection_closed(7), ["a:1"]);
        assert_eq!(brokers_of(&t, "T"), ["broker-b"]);
        assert!(t.connection_closed(99).is_empty());
    }

    #[test]
    fn reconnected_broker_survives_its_old_connection_closing() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4)], 1), 1, t0);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4)], 1), 2, t0);
        assert!(t.connection_closed(1).is_empty());
        assert_eq!(brokers_of(&t, "T"), ["broker-a"]);
    }

    #[test]
    fn unregister_removes_the_broker_and_empty_topics() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4), ("A", 1)], 1), 1, t0);
        t.register(reg("broker-b", "b:1", 0, &[("T", 4)], 1), 2, t0);
        t.unregister("broker-a", "a:1");
        assert_eq!(brokers_of(&t, "T"), ["broker-b"]);
        assert!(t.route("A").is_none());
        assert_eq!(t.topic_names(), BTreeSet::from(["T".to_string()]));
        assert!(!t.cluster_info().broker_addr_table.contains_key("broker-a"));
    }

    #[test]
    fn slave_learns_its_master_and_keeps_queues_after_master_leaves() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "m:1", 0, &[("T", 4)], 1), 1, t0);
        let r = t.register(reg("broker-a", "s:1", 1, &[("T", 4)], 1), 2, t0);
        assert_eq!(r.master_addr.as_deref(), Some("m:1"));
        assert_eq!(r.master_ha_addr.as_deref(), Some("m:1-ha"));
        t.connection_closed(1);
        let route = t.route("T").unwrap();
        assert_eq!(route.broker_datas[0].broker_addrs.len(), 1);
        assert_eq!(route.broker_datas[0].broker_addrs[&1], "s:1");
    }

    #[test]
    fn topic_table_is_replaced_only_when_its_version_moves() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4), ("U", 1)], 1), 1, t0);
        t.delete_topic("U", None);
        // Same version: the deletion sticks (as in Java).
        t.register(reg("broker-a", "a:1", 0, &[("T", 4), ("U", 1)], 1), 1, t0);
        assert!(t.route("U").is_none());
        // New version without T and with 8 queues of U.
        t.register(reg("broker-a", "a:1", 0, &[("U", 8)], 2), 1, t0);
        assert!(t.route("T").is_none());
        assert_eq!(t.route("U").unwrap().queue_datas[0].read_queue_nums, 8);
    }

    #[test]
    fn delete_topic_on_one_cluster_keeps_the_others() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        t.register(reg("broker-a", "a:1", 0, &[("T", 4)], 1), 1, t0);
        let mut other = reg("broker-x", "x:1", 0, &[("T", 4)], 1);
        other.cluster = "Other".into();
        t.register(other, 2, t0);
        t.delete_topic("T", Some("DefaultCluster"));
        assert_eq!(brokers_of(&t, "T"), ["broker-x"]);
        assert_eq!(t.cluster_of("x:1"), Some("Other"));
    }

    #[test]
    fn heartbeat_keeps_a_known_broker_alive() {
        let t0 = Instant::now();
        let mut t = RouteTable::new(EXPIRY);
        assert!(!t.heartbeat("a:1", t0));
        t.register(reg("broker-a", "a:1", 0, &[("T", 4)], 1), 1, t0);
        assert!(t.heartbeat("a:1", t0 + Duration::from_secs(100)));
        assert!(t.tick(t0 + Duration::from_secs(150)).is_empty());
        assert_eq!(t.tick(t0 + Duration::from_secs(221)).len(), 1);
    }
}
