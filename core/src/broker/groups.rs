//! Consumer groups as the broker sees them: who is a live member, what each
//! member subscribed to, and which member holds an orderly-consumption lock on
//! which queue.
//!
//! A pure state machine: every method that depends on time takes `now_ms`, so the
//! broker drives it with its injectable clock and tests drive it by hand. A member
//! is live while its last heartbeat is younger than the member timeout; stale
//! members are dropped (with their locks) by [`ConsumerGroups::expire`], which the
//! broker calls before every decision that depends on membership. Queue
//! allocation itself is [`super::allocate`]'s pure function; this table only
//! supplies the live member list it runs on.

use std::collections::BTreeMap;

use super::filter::{Filter, FilterType};
use super::schedule;
use crate::{Error, Result};

/// How a group shares messages among its members.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConsumeMode {
    /// Each message goes to one member; queues are shared out by allocation.
    #[default]
    Clustering,
    /// Every member gets every message and has its own offsets.
    Broadcasting,
}

impl ConsumeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ConsumeMode::Clustering => "CLUSTERING",
            ConsumeMode::Broadcasting => "BROADCASTING",
        }
    }
}

/// One topic a member consumes, with its filter expression (parsed, and
/// rejected when malformed, at heartbeat time).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Subscription {
    pub topic: String,
    pub filter_type: FilterType,
    pub expression: String,
}

impl Subscription {
    /// A tag subscription (`*`, `TagA || TagB`).
    pub fn tag(topic: impl Into<String>, expression: impl Into<String>) -> Self {
        Subscription {
            topic: topic.into(),
            filter_type: FilterType::Tag,
            expression: expression.into(),
        }
    }

    /// An SQL92 subscription over message properties.
    pub fn sql92(topic: impl Into<String>, expression: impl Into<String>) -> Self {
        Subscription {
            topic: topic.into(),
            filter_type: FilterType::Sql92,
            expression: expression.into(),
        }
    }
}

/// A member announcing itself (RocketMQ sends its whole subscription set with
/// every heartbeat; the latest one wins).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Heartbeat {
    pub group: String,
    pub member: String,
    pub mode: ConsumeMode,
    pub subscriptions: Vec<Subscription>,
}

#[derive(Debug)]
struct Member {
    subscriptions: Subscriptions,
    last_seen_ms: i64,
}

/// A member's topics and their filters, sorted by topic, one per topic (the last
/// one a heartbeat names wins). An exact-size slice, not a map: most members
/// subscribe to one topic, and every broadcasting WebSocket subscription is a
/// member, so a map's first node (1.2 KiB for eleven entries) was most of what
/// the broker kept per idle subscriber (issue #33).
#[derive(Debug, PartialEq)]
struct Subscriptions(Box<[(String, Filter)]>);

impl Subscriptions {
    fn new(mut list: Vec<(String, Filter)>) -> Self {
        // Stable: of the entries for one topic the last is kept.
        list.sort_by(|a, b| a.0.cmp(&b.0));
        list.reverse();
        list.dedup_by(|later, earlier| later.0 == earlier.0);
        list.reverse();
        Subscriptions(list.into_boxed_slice())
    }

    fn get(&self, topic: &str) -> Option<&Filter> {
        self.0
            .binary_search_by(|(t, _)| t.as_str().cmp(topic))
            .ok()
            .map(|i| &self.0[i].1)
    }

    fn iter(&self) -> impl Iterator<Item = &(String, Filter)> {
        self.0.iter()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Lock {
    owner: String,
    expires_ms: i64,
}

#[derive(Debug)]
struct Group {
    mode: ConsumeMode,
    members: BTreeMap<String, Member>,
    /// (topic, queue id) -> holder; an expired lease counts as free.
    locks: BTreeMap<(String, u32), Lock>,
}

/// Every consumer group with a live member. Not synchronized: the broker keeps
/// it under one short lock.
#[derive(Debug)]
pub struct ConsumerGroups {
    groups: BTreeMap<String, Group>,
    member_timeout_ms: i64,
}

impl ConsumerGroups {
    pub fn new(member_timeout_ms: i64) -> Self {
        ConsumerGroups {
            groups: BTreeMap::new(),
            member_timeout_ms,
        }
    }

    /// Registers or refreshes a member. Returns true when the group's membership
    /// or subscriptions changed (a rebalance is due).
    pub fn heartbeat(&mut self, hb: &Heartbeat, now_ms: i64) -> Result<bool> {
        schedule::validate_group(&hb.group)?;
        if hb.member.is_empty() {
            return Err(Error::InvalidArgument("member id is empty".into()));
        }
        let mut subscriptions = Vec::with_capacity(hb.subscriptions.len());
        for s in &hb.subscriptions {
            schedule::validate_topic(&s.topic)?;
            subscriptions.push((
                s.topic.clone(),
                Filter::parse(s.filter_type, &s.expression)?,
            ));
        }
        let subscriptions = Subscriptions::new(subscriptions);
        self.expire(now_ms);
        let group = self
            .groups
            .entry(hb.group.clone())
            .or_insert_with(|| Group {
                mode: hb.mode,
                members: BTreeMap::new(),
                locks: BTreeMap::new(),
            });
        if group.mode != hb.mode {
            let existing = group.mode.as_str();
            if group.members.is_empty() {
                self.groups.remove(&hb.group);
            }
            return Err(Error::GroupModeConflict {
                group: hb.group.clone(),
                existing,
                requested: hb.mode.as_str(),
            });
        }
        let changed = match group.members.get_mut(&hb.member) {
            Some(m) => {
                m.last_seen_ms = now_ms;
                let changed = m.subscriptions != subscriptions;
                m.subscriptions = subscriptions;
                changed
            }
            None => {
                group.members.insert(
                    hb.member.clone(),
                    Member {
                        subscriptions,
                        last_seen_ms: now_ms,
                    },
                );
                true
            }
        };
        Ok(changed)
    }

    /// Removes a member (a clean shutdown); its locks go with it.
    pub fn unregister(&mut self, group: &str, member: &str) -> bool {
        let Some(g) = self.groups.get_mut(group) else {
            return false;
        };
        let removed = g.members.remove(member).is_some();
        g.locks.retain(|_, l| l.owner != member);
        if g.members.is_empty() {
            self.groups.remove(group);
        }
        removed
    }

    /// Drops members whose last heartbeat is older than the timeout, and their
    /// locks; returns `(group, member)` of each.
    pub fn expire(&mut self, now_ms: i64) -> Vec<(String, String)> {
        let timeout = self.member_timeout_ms;
        let mut gone = Vec::new();
        for (name, g) in &mut self.groups {
            g.members.retain(|id, m| {
                let live = now_ms - m.last_seen_ms <= timeout;
                if !live {
                    gone.push((name.clone(), id.clone()));
                }
                live
            });
            g.locks
                .retain(|_, l| l.expires_ms > now_ms && g.members.contains_key(&l.owner));
        }
        self.groups.retain(|_, g| !g.members.is_empty());
        gone
    }

    pub fn mode(&self, group: &str) -> Option<ConsumeMode> {
        self.groups.get(group).map(|g| g.mode)
    }

    /// Every group with a live member, sorted.
    pub fn names(&self) -> Vec<String> {
        self.groups.keys().cloned().collect()
    }

    /// Each live member of `group` with its subscriptions and the time of its
    /// last heartbeat, sorted by member id.
    pub fn members(&self, group: &str) -> Vec<(String, Vec<Subscription>, i64)> {
        let Some(g) = self.groups.get(group) else {
            return Vec::new();
        };
        g.members
            .iter()
            .map(|(id, m)| {
                let subs = m
                    .subscriptions
                    .iter()
                    .map(|(topic, f)| Subscription {
                        topic: topic.clone(),
                        filter_type: f.filter_type(),
                        expression: f.expression().to_owned(),
                    })
                    .collect();
                (id.clone(), subs, m.last_seen_ms)
            })
            .collect()
    }

    /// Live members of `group` subscribed to `topic`, sorted.
    pub fn members_of(&self, group: &str, topic: &str) -> Vec<String> {
        self.groups
            .get(group)
            .map(|g| {
                g.members
                    .iter()
                    .filter(|(_, m)| m.subscriptions.get(topic).is_some())
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The filter `member` subscribed to `topic` with, if it did.
    pub fn subscription(&self, group: &str, member: &str, topic: &str) -> Option<&Filter> {
        self.groups
            .get(group)?
            .members
            .get(member)?
            .subscriptions
            .get(topic)
    }

    pub fn is_member(&self, group: &str, member: &str) -> bool {
        self.groups
            .get(group)
            .is_some_and(|g| g.members.contains_key(member))
    }

    /// Takes or renews `member`'s lease on a queue for orderly consumption.
    /// Refused with [`Error::QueueLocked`] while another member's lease runs.
    pub fn lock(
        &mut self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<()> {
        self.expire(now_ms);
        let not_member = || Error::MemberNotFound {
            group: group.to_owned(),
            member: member.to_owned(),
        };
        let g = self.groups.get_mut(group).ok_or_else(not_member)?;
        if !g.members.contains_key(member) {
            return Err(not_member());
        }
        let key = (topic.to_owned(), queue_id);
        if let Some(l) = g.locks.get(&key)
            && l.owner != member
        {
            return Err(Error::QueueLocked {
                group: group.to_owned(),
                topic: topic.to_owned(),
                queue_id,
                owner: l.owner.clone(),
            });
        }
        g.locks.insert(
            key,
            Lock {
                owner: member.to_owned(),
                expires_ms: now_ms + lease_ms,
            },
        );
        Ok(())
    }

    /// Releases `member`'s lease on a queue; false if it held none.
    pub fn unlock(&mut self, group: &str, member: &str, topic: &str, queue_id: u32) -> bool {
        let Some(g) = self.groups.get_mut(group) else {
            return false;
        };
        let key = (topic.to_owned(), queue_id);
        if g.locks.get(&key).is_some_and(|l| l.owner == member) {
            g.locks.remove(&key);
            true
        } else {
            false
        }
    }

    /// The member whose lease on the queue is running at `now_ms`, if any.
    pub fn lock_owner(&self, group: &str, topic: &str, queue_id: u32, now_ms: i64) -> Option<&str> {
        let g = self.groups.get(group)?;
        g.locks
            .get(&(topic.to_owned(), queue_id))
            .filter(|l| l.expires_ms > now_ms && g.members.contains_key(&l.owner))
            .map(|l| l.owner.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(group: &str, member: &str, topic: &str) -> Heartbeat {
        Heartbeat {
            group: group.into(),
            member: member.into(),
            mode: ConsumeMode::Clustering,
            subscriptions: vec![Subscription::tag(topic, "*")],
        }
    }

    #[test]
    fn members_expire_without_heartbeats() {
        let mut g = ConsumerGroups::new(1000);
        assert!(g.heartbeat(&hb("g", "a", "t"), 0).unwrap());
        assert!(g.heartbeat(&hb("g", "b", "t"), 500).unwrap());
        assert!(!g.heartbeat(&hb("g", "a", "t"), 900).unwrap());
        assert_eq!(g.members_of("g", "t"), ["a", "b"]);
        assert_eq!(g.expire(1600), vec![("g".to_owned(), "b".to_owned())]);
        assert_eq!(g.members_of("g", "t"), ["a"]);
        g.expire(5000);
        assert_eq!(g.mode("g"), None);
    }

    #[test]
    fn a_topic_named_twice_keeps_its_last_filter() {
        let mut g = ConsumerGroups::new(1000);
        let mut twice = hb("g", "a", "t");
        twice.subscriptions = vec![
            Subscription::tag("t", "A"),
            Subscription::tag("b", "*"),
            Subscription::tag("t", "B || C"),
            Subscription::tag("a", "*"),
        ];
        g.heartbeat(&twice, 0).unwrap();
        let t = g.subscription("g", "a", "t").unwrap();
        assert_eq!(t.expression(), "B || C");
        assert!(g.subscription("g", "a", "c").is_none());
        let topics: Vec<_> = g.members("g")[0]
            .1
            .iter()
            .map(|s| s.topic.clone())
            .collect();
        assert_eq!(topics, ["a", "b", "t"]);
        // The same set in another order is no change (no rebalance).
        twice.subscriptions = vec![
            Subscription::tag("a", "*"),
            Subscription::tag("t", "A"),
            Subscription::tag("t", "B || C"),
            Subscription::tag("b", "*"),
        ];
        assert!(!g.heartbeat(&twice, 10).unwrap());
    }

    #[test]
    fn bad_filters_and_mode_conflicts_are_refused() {
        let mut g = ConsumerGroups::new(1000);
        let mut bad = hb("g", "a", "t");
        bad.subscriptions = vec![Subscription::sql92("t", "a = ")];
        assert!(matches!(g.heartbeat(&bad, 0), Err(Error::InvalidFilter(_))));
        g.heartbeat(&hb("g", "a", "t"), 0).unwrap();
        let mut other = hb("g", "b", "t");
        other.mode = ConsumeMode::Broadcasting;
        assert!(matches!(
            g.heartbeat(&other, 0),
            Err(Error::GroupModeConflict { .. })
        ));
    }

    #[test]
    fn locks_are_exclusive_until_the_lease_ends() {
        let mut g = ConsumerGroups::new(10_000);
        g.heartbeat(&hb("g", "a", "t"), 0).unwrap();
        g.heartbeat(&hb("g", "b", "t"), 0).unwrap();
        g.lock("g", "a", "t", 0, 0, 100).unwrap();
        g.lock("g", "a", "t", 0, 50, 100).unwrap();
        assert!(matches!(
            g.lock("g", "b", "t", 0, 60, 100),
            Err(Error::QueueLocked { .. })
        ));
        g.lock("g", "b", "t", 1, 60, 100).unwrap();
        assert_eq!(g.lock_owner("g", "t", 0, 149), Some("a"));
        g.lock("g", "b", "t", 0, 151, 100).unwrap();
        assert!(!g.unlock("g", "a", "t", 0));
        assert!(g.unlock("g", "b", "t", 0));
        assert!(g.unregister("g", "b"));
        assert_eq!(g.lock_owner("g", "t", 1, 0), None);
    }
}
