//! Who is connected: each connection's outbound channel and client id, and which
//! consumer and producer groups each client speaks for, with the consumers'
//! subscriptions (a Java push consumer does not repeat its subscription in every pull,
//! so the broker must remember the one it heart-beat).
//!
//! One std mutex around the table; every holder does a lookup or an update and never
//! awaits while holding it. Pushing to a connection is `try_send`: a peer too slow to
//! take a notification misses that one, as in RocketMQ.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use rocketgate_core::broker::CheckerRegistration;
use rocketgate_core::broker::filter::FilterType;
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::server::Outbound;

pub(crate) use rocketgate_remoting::server::ConnId;

/// A consumer's subscription of one topic, as it last heart-beat it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sub {
    pub filter_type: FilterType,
    pub expression: String,
}

#[derive(Debug)]
struct Consumer {
    conn: ConnId,
    subscriptions: BTreeMap<String, Sub>,
}

#[derive(Default)]
struct Table {
    /// Outbound channel of every open connection.
    conns: HashMap<ConnId, Outbound>,
    /// The client id a connection heart-beat with.
    client_ids: HashMap<ConnId, String>,
    /// consumer group -> client id -> member.
    consumers: BTreeMap<String, BTreeMap<String, Consumer>>,
    /// producer group -> client id -> connection.
    producers: BTreeMap<String, BTreeMap<String, ConnId>>,
    /// Transaction checkers registered with the core, per producer group with a
    /// connected producer (dropping one unregisters it).
    checkers: HashMap<String, CheckerRegistration>,
    /// Checkers proxies registered through the broker API, per connection and
    /// registration id (dropped with their connection).
    api_checkers: HashMap<ConnId, HashMap<u64, CheckerRegistration>>,
}

#[derive(Default)]
pub(crate) struct Clients {
    table: Mutex<Table>,
}

/// What a connection left behind when it closed: the groups it was a member of, so
/// the core can be told and the remaining members notified.
pub(crate) struct Departed {
    pub client_id: Option<String>,
    pub consumer_groups: Vec<String>,
}

impl Clients {
    fn lock(&self) -> MutexGuard<'_, Table> {
        rocketgate_core::sync::lock(&self.table)
    }

    pub fn connected(&self, conn: ConnId, outbound: Outbound) {
        self.lock().conns.insert(conn, outbound);
    }

    /// Forgets a connection and every group membership it carried.
    pub fn disconnected(&self, conn: ConnId) -> Departed {
        let mut unregistered = Vec::new();
        let mut t = self.lock();
        t.conns.remove(&conn);
        let api_checkers = t.api_checkers.remove(&conn);
        let client_id = t.client_ids.remove(&conn);
        let mut consumer_groups = Vec::new();
        t.consumers.retain(|group, members| {
            let before = members.len();
            members.retain(|_, m| m.conn != conn);
            if members.len() != before {
                consumer_groups.push(group.clone());
            }
            !members.is_empty()
        });
        t.producers.retain(|_, members| {
            members.retain(|_, c| *c != conn);
            !members.is_empty()
        });
        let Table {
            producers,
            checkers,
            ..
        } = &mut *t;
        checkers.retain(|group, reg| {
            let keep = producers.contains_key(group);
            if !keep {
                unregistered.push(std::mem::replace(reg, CheckerRegistration::new(|| {})));
            }
            keep
        });
        drop(t);
        // Unregister from the core outside our lock.
        drop(unregistered);
        drop(api_checkers);
        Departed {
            client_id,
            consumer_groups,
        }
    }

    /// The client id this connection heart-beat with, if it did.
    pub fn client_id(&self, conn: ConnId) -> Option<String> {
        self.lock().client_ids.get(&conn).cloned()
    }

    /// Records a consumer heartbeat; true when the group gained a member.
    pub fn consumer_heartbeat(
        &self,
        conn: ConnId,
        client_id: &str,
        group: &str,
        subscriptions: BTreeMap<String, Sub>,
    ) -> bool {
        let mut t = self.lock();
        t.client_ids.insert(conn, client_id.to_owned());
        let members = t.consumers.entry(group.to_owned()).or_default();
        let joined = !members.contains_key(client_id);
        members.insert(
            client_id.to_owned(),
            Consumer {
                conn,
                subscriptions,
            },
        );
        joined
    }

    pub fn producer_heartbeat(&self, conn: ConnId, client_id: &str, group: &str) {
        let mut t = self.lock();
        t.client_ids.insert(conn, client_id.to_owned());
        t.producers
            .entry(group.to_owned())
            .or_default()
            .insert(client_id.to_owned(), conn);
    }

    /// Removes a client from a consumer group; true if it was a member.
    pub fn leave_consumer_group(&self, group: &str, client_id: &str) -> bool {
        let mut t = self.lock();
        let Some(members) = t.consumers.get_mut(group) else {
            return false;
        };
        let removed = members.remove(client_id).is_some();
        if members.is_empty() {
            t.consumers.remove(group);
        }
        removed
    }

    pub fn leave_producer_group(&self, group: &str, client_id: &str) {
        let mut t = self.lock();
        let mut unregistered = None;
        if let Some(members) = t.producers.get_mut(group) {
            members.remove(client_id);
            if members.is_empty() {
                t.producers.remove(group);
                unregistered = t.checkers.remove(group);
            }
        }
        drop(t);
        drop(unregistered);
    }

    pub fn has_checker(&self, group: &str) -> bool {
        self.lock().checkers.contains_key(group)
    }

    /// Keeps a checker registration for `group` (a concurrent duplicate is dropped).
    pub fn set_checker(&self, group: &str, registration: CheckerRegistration) {
        let mut t = self.lock();
        let duplicate = if t.checkers.contains_key(group) || !t.producers.contains_key(group) {
            Some(registration)
        } else {
            t.checkers.insert(group.to_owned(), registration);
            None
        };
        drop(t);
        drop(duplicate);
    }

    /// Keeps a proxy's checker registration until it unregisters or its
    /// connection closes (a registration for a closed connection is dropped).
    pub fn set_api_checker(&self, conn: ConnId, id: u64, registration: CheckerRegistration) {
        let mut t = self.lock();
        let dropped = if t.conns.contains_key(&conn) {
            t.api_checkers
                .entry(conn)
                .or_default()
                .insert(id, registration)
        } else {
            Some(registration)
        };
        drop(t);
        drop(dropped);
    }

    pub fn remove_api_checker(&self, conn: ConnId, id: u64) {
        let mut t = self.lock();
        let removed = t.api_checkers.get_mut(&conn).and_then(|m| m.remove(&id));
        drop(t);
        drop(removed);
    }

    /// Queues `cmd` to one connection; false if it is gone or its queue is full.
    pub fn push_to_conn(&self, conn: ConnId, cmd: RemotingCommand) -> bool {
        let t = self.lock();
        t.conns.get(&conn).is_some_and(|out| out.try_send(cmd))
    }

    /// Client ids of a consumer group, sorted.
    pub fn consumer_ids(&self, group: &str) -> Vec<String> {
        self.lock()
            .consumers
            .get(group)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The subscription of `topic` the group's members heart-beat (any member's; they
    /// agree in a well-behaved group).
    pub fn subscription(&self, group: &str, topic: &str) -> Option<Sub> {
        let t = self.lock();
        t.consumers
            .get(group)?
            .values()
            .find_map(|m| m.subscriptions.get(topic).cloned())
    }

    /// Sends `cmd` to every member of a consumer group; returns how many took it.
    pub fn push_to_consumers(&self, group: &str, cmd: &RemotingCommand) -> usize {
        let t = self.lock();
        let conns: BTreeSet<ConnId> = t
            .consumers
            .get(group)
            .map(|m| m.values().map(|c| c.conn).collect())
            .unwrap_or_default();
        conns
            .into_iter()
            .filter_map(|c| t.conns.get(&c))
            .filter(|out| out.try_send(cmd.clone()))
            .count()
    }

    /// Sends `cmd` to one connection of a producer group (the first that takes it).
    pub fn push_to_producer(&self, group: &str, cmd: RemotingCommand) -> bool {
        let t = self.lock();
        let Some(members) = t.producers.get(group) else {
            return false;
        };
        members
            .values()
            .filter_map(|c| t.conns.get(c))
            .any(|out| out.try_send(cmd.clone()))
    }
}
