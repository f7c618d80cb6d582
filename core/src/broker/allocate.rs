//! Queue allocation for clustering consumer groups, and the rebalance decision
//! built on it.
//!
//! Every member of a group runs the same pure function over the same inputs (the
//! live member ids and the topic's queues, both sorted here) and takes its own
//! share, so the group agrees on an assignment without talking to each other —
//! RocketMQ's client-side rebalance. Nothing here knows about clocks, sockets or
//! offsets: [`Rebalance`] says which queues to stop and start pulling; the caller
//! persists the offsets of dropped queues before another member takes them.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// One queue of a topic on one broker. Ordered by topic, then broker, then id, as
/// RocketMQ's `MessageQueue.compareTo` orders them, so sorted lists agree across
/// implementations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageQueue {
    pub topic: String,
    pub broker_name: String,
    pub queue_id: u32,
}

impl MessageQueue {
    pub fn new(topic: impl Into<String>, broker_name: impl Into<String>, queue_id: u32) -> Self {
        MessageQueue {
            topic: topic.into(),
            broker_name: broker_name.into(),
            queue_id,
        }
    }
}

impl fmt::Display for MessageQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}#{}", self.topic, self.broker_name, self.queue_id)
    }
}

/// How a group shares out a topic's queues. Names follow RocketMQ's
/// `AllocateMessageQueueStrategy.getName()`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AllocateStrategy {
    /// `AVG` (`AllocateMessageQueueAveragely`): contiguous blocks of the sorted
    /// queues; the first `queues % members` members get one extra. The default.
    #[default]
    Average,
    /// `AVG_BY_CIRCLE`: queue `i` goes to member `i % members`, round-robin.
    AverageByCircle,
    /// `CONSISTENT_HASH`: queues and `virtual_nodes` points per member on a hash
    /// ring; a queue belongs to the next point clockwise. When one member joins
    /// or leaves only the queues of that member move.
    ///
    /// `Average` and `AverageByCircle` compute exactly what RocketMQ's Java
    /// client computes, so mixed groups agree. This ring uses a different hash
    /// than Java's (MD5 over `MessageQueue.toString()`), so a group that mixes
    /// Java clients with rocketgate-side allocation must not use it.
    ConsistentHash { virtual_nodes: u32 },
    /// `CONFIG`: this consumer takes exactly these queues (those that exist),
    /// whatever the others do. Coverage is the operator's responsibility.
    Fixed(Vec<MessageQueue>),
}

impl AllocateStrategy {
    /// RocketMQ's default number of virtual nodes per member.
    pub const DEFAULT_VIRTUAL_NODES: u32 = 10;

    /// Consistent hashing with [`Self::DEFAULT_VIRTUAL_NODES`].
    pub fn consistent_hash() -> Self {
        AllocateStrategy::ConsistentHash {
            virtual_nodes: Self::DEFAULT_VIRTUAL_NODES,
        }
    }

    /// RocketMQ's name for the strategy (`AVG`, `AVG_BY_CIRCLE`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            AllocateStrategy::Average => "AVG",
            AllocateStrategy::AverageByCircle => "AVG_BY_CIRCLE",
            AllocateStrategy::ConsistentHash { .. } => "CONSISTENT_HASH",
            AllocateStrategy::Fixed(_) => "CONFIG",
        }
    }
}

/// An allocation strategy name that is not known, or that needs more than a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown queue allocation strategy {0:?}; expected AVG, AVG_BY_CIRCLE or CONSISTENT_HASH")]
pub struct UnknownStrategy(pub String);

impl FromStr for AllocateStrategy {
    type Err = UnknownStrategy;

    /// Parses the names a config file or a RocketMQ client uses. `CONFIG` is not
    /// accepted here because it needs its list of queues.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("AVG") || s.eq_ignore_ascii_case("average") {
            Ok(AllocateStrategy::Average)
        } else if s.eq_ignore_ascii_case("AVG_BY_CIRCLE") || s.eq_ignore_ascii_case("circle") {
            Ok(AllocateStrategy::AverageByCircle)
        } else if s.eq_ignore_ascii_case("CONSISTENT_HASH") {
            Ok(AllocateStrategy::consistent_hash())
        } else {
            Err(UnknownStrategy(s.to_owned()))
        }
    }
}

/// The queues that member `me` should consume, sorted.
///
/// `members` and `queues` may come in any order and with duplicates: both are
/// sorted and deduplicated first, so every member computes the same split. A
/// member that is not in `members` (it has not been seen by the broker yet) gets
/// nothing, as in RocketMQ. For every strategy but `Fixed`, the shares of all
/// members are disjoint and together cover every queue.
pub fn allocate(
    strategy: &AllocateStrategy,
    me: &str,
    members: &[String],
    queues: &[MessageQueue],
) -> Vec<MessageQueue> {
    let members: Vec<&str> = members
        .iter()
        .map(String::as_str)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let queues: Vec<&MessageQueue> = queues.iter().collect::<BTreeSet<_>>().into_iter().collect();
    let Ok(index) = members.binary_search(&me) else {
        return Vec::new();
    };
    if queues.is_empty() {
        return Vec::new();
    }
    let picked: Vec<&MessageQueue> = match strategy {
        AllocateStrategy::Average => {
            let (q, m) = (queues.len(), members.len());
            let (base, extra) = (q / m, q % m);
            let start = index * base + index.min(extra);
            let len = base + usize::from(index < extra);
            queues[start..start + len].to_vec()
        }
        AllocateStrategy::AverageByCircle => queues
            .iter()
            .skip(index)
            .step_by(members.len())
            .copied()
            .collect(),
        AllocateStrategy::ConsistentHash { virtual_nodes } => {
            let ring = Ring::new(&members, (*virtual_nodes).max(1));
            queues
                .iter()
                .filter(|q| ring.owner(q) == me)
                .copied()
                .collect()
        }
        AllocateStrategy::Fixed(wanted) => {
            let wanted: BTreeSet<&MessageQueue> = wanted.iter().collect();
            queues
                .iter()
                .filter(|q| wanted.contains(*q))
                .copied()
                .collect()
        }
    };
    picked.into_iter().cloned().collect()
}

/// A consistent-hash ring of members' virtual nodes.
struct Ring<'m> {
    /// Sorted by point, then member, so equal points (astronomically unlikely)
    /// still resolve the same way everywhere.
    points: Vec<(u64, &'m str)>,
}

impl<'m> Ring<'m> {
    fn new(members: &[&'m str], virtual_nodes: u32) -> Self {
        let mut points = Vec::with_capacity(members.len() * virtual_nodes as usize);
        for member in members {
            for i in 0..virtual_nodes {
                points.push((stable_hash(format!("{member}-{i}").as_bytes()), *member));
            }
        }
        points.sort_unstable();
        Ring { points }
    }

    fn owner(&self, queue: &MessageQueue) -> &'m str {
        let key = format!("{}@{}@{}", queue.topic, queue.broker_name, queue.queue_id);
        let h = stable_hash(key.as_bytes());
        let i = self.points.partition_point(|(p, _)| *p < h);
        self.points[i % self.points.len()].1
    }
}

/// 64-bit FNV-1a followed by the MurmurHash3 `fmix64` finalizer.
///
/// Stable across processes, platforms and releases (unlike std's randomly seeded
/// `DefaultHasher`), which is what lets every member compute the same ring. The
/// finalizer spreads FNV's weak high bits, which matters because virtual-node keys
/// differ only in their last characters.
fn stable_hash(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// What one member must change after membership or the queue set changed.
///
/// Apply `to_drop` first (stop pulling, persist offsets, release order locks),
/// then `to_add`; the member's new assignment is `assigned`. All three are sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rebalance {
    pub assigned: Vec<MessageQueue>,
    pub to_drop: Vec<MessageQueue>,
    pub to_add: Vec<MessageQueue>,
}

impl Rebalance {
    /// The difference between the queues a member holds and those it should hold.
    pub fn between(previous: &[MessageQueue], next: &[MessageQueue]) -> Rebalance {
        let prev: BTreeSet<&MessageQueue> = previous.iter().collect();
        let next: BTreeSet<&MessageQueue> = next.iter().collect();
        Rebalance {
            assigned: next.iter().map(|q| (*q).clone()).collect(),
            to_drop: prev.difference(&next).map(|q| (*q).clone()).collect(),
            to_add: next.difference(&prev).map(|q| (*q).clone()).collect(),
        }
    }

    /// Allocates with `strategy` and diffs against what `me` held before.
    pub fn plan(
        strategy: &AllocateStrategy,
        me: &str,
        members: &[String],
        queues: &[MessageQueue],
        previous: &[MessageQueue],
    ) -> Rebalance {
        Rebalance::between(previous, &allocate(strategy, me, members, queues))
    }

    /// True when nothing changes.
    pub fn is_noop(&self) -> bool {
        self.to_drop.is_empty() && self.to_add.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn queues(n: u32) -> Vec<MessageQueue> {
        // Two brokers, so sorting by broker name matters.
        (0..n)
            .map(|i| MessageQueue::new("T", if i % 2 == 0 { "b-a" } else { "b-b" }, i / 2))
            .collect()
    }

    fn members(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("10.0.0.{i}@pid{}", 100 - i))
            .collect()
    }

    fn strategies() -> Vec<AllocateStrategy> {
        vec![
            AllocateStrategy::Average,
            AllocateStrategy::AverageByCircle,
            AllocateStrategy::consistent_hash(),
            AllocateStrategy::ConsistentHash { virtual_nodes: 1 },
        ]
    }

    /// Every member's share, keyed by member.
    fn shares(
        s: &AllocateStrategy,
        ms: &[String],
        qs: &[MessageQueue],
    ) -> BTreeMap<String, Vec<MessageQueue>> {
        ms.iter()
            .map(|m| (m.clone(), allocate(s, m, ms, qs)))
            .collect()
    }

    #[test]
    fn every_queue_goes_to_exactly_one_member() {
        for s in strategies() {
            for m in 1..=7 {
                for q in 0..=17 {
                    let (ms, qs) = (members(m), queues(q));
                    let mut all: Vec<MessageQueue> =
                        shares(&s, &ms, &qs).into_values().flatten().collect();
                    all.sort();
                    let mut want = qs.clone();
                    want.sort();
                    assert_eq!(all, want, "{s:?} members={m} queues={q}");
                }
            }
        }
    }

    #[test]
    fn allocation_ignores_input_order_and_duplicates() {
        for s in strategies() {
            for m in 1..=6 {
                for q in 0..=13 {
                    let (ms, qs) = (members(m), queues(q));
                    let mut ms2: Vec<String> = ms.iter().rev().cloned().collect();
                    ms2.push(ms[0].clone());
                    let mut qs2 = qs.clone();
                    qs2.rotate_left(q as usize / 2);
                    qs2.reverse();
                    for me in &ms {
                        assert_eq!(allocate(&s, me, &ms, &qs), allocate(&s, me, &ms2, &qs2));
                    }
                }
            }
        }
    }

    #[test]
    fn average_strategies_are_balanced() {
        for s in [AllocateStrategy::Average, AllocateStrategy::AverageByCircle] {
            for m in 1..=7 {
                for q in 0..=17u32 {
                    let sizes: Vec<usize> = shares(&s, &members(m), &queues(q))
                        .values()
                        .map(Vec::len)
                        .collect();
                    let (min, max) = (sizes.iter().min(), sizes.iter().max());
                    assert!(max.unwrap() - min.unwrap() <= 1, "{s:?} {m} {q}: {sizes:?}");
                }
            }
        }
    }

    #[test]
    fn average_matches_rocketmq_layout() {
        // 8 queues, 3 members: sizes 3, 3, 2 in contiguous blocks.
        let ms = vec!["c0".to_owned(), "c1".to_owned(), "c2".to_owned()];
        let qs: Vec<MessageQueue> = (0..8).map(|i| MessageQueue::new("T", "b", i)).collect();
        let ids = |me: &str| -> Vec<u32> {
            allocate(&AllocateStrategy::Average, me, &ms, &qs)
                .iter()
                .map(|q| q.queue_id)
                .collect()
        };
        assert_eq!(ids("c0"), [0, 1, 2]);
        assert_eq!(ids("c1"), [3, 4, 5]);
        assert_eq!(ids("c2"), [6, 7]);
        let circle = |me: &str| -> Vec<u32> {
            allocate(&AllocateStrategy::AverageByCircle, me, &ms, &qs)
                .iter()
                .map(|q| q.queue_id)
                .collect()
        };
        assert_eq!(circle("c0"), [0, 3, 6]);
        assert_eq!(circle("c2"), [2, 5]);
        // More members than queues: the last members get nothing.
        let five: Vec<String> = (0..5).map(|i| format!("c{i}")).collect();
        let two = &qs[..2];
        assert_eq!(
            allocate(&AllocateStrategy::Average, "c1", &five, two).len(),
            1
        );
        assert!(allocate(&AllocateStrategy::Average, "c4", &five, two).is_empty());
    }

    #[test]
    fn unknown_member_gets_nothing() {
        for s in strategies() {
            assert!(allocate(&s, "stranger", &members(3), &queues(8)).is_empty());
        }
        assert!(allocate(&AllocateStrategy::Average, "x", &[], &queues(8)).is_empty());
    }

    #[test]
    fn consistent_hash_moves_only_the_joiners_and_leavers_queues() {
        let s = AllocateStrategy::consistent_hash();
        let qs = queues(64);
        for m in 1..=8 {
            let before = members(m);
            let joiner = format!("joiner-{m}");
            let mut after = before.clone();
            after.push(joiner.clone());
            let owner = |ms: &[String]| -> BTreeMap<MessageQueue, String> {
                shares(&s, ms, &qs)
                    .into_iter()
                    .flat_map(|(m, q)| q.into_iter().map(move |q| (q, m.clone())))
                    .collect()
            };
            let (old, new) = (owner(&before), owner(&after));
            let mut moved = 0;
            for q in &qs {
                if old[q] != new[q] {
                    // Join: a queue only ever moves to the joiner.
                    assert_eq!(new[q], joiner);
                    moved += 1;
                }
            }
            // And leave is the reverse: only the leaver's queues move.
            for q in &qs {
                if new[q] != joiner {
                    assert_eq!(old[q], new[q]);
                }
            }
            // The joiner takes a share, not the whole topic (loose bound: 10
            // virtual nodes give an uneven but bounded split).
            assert!(moved < qs.len() * 3 / (m + 1) + 4, "m={m} moved={moved}");
        }
    }

    #[test]
    fn consistent_hash_spreads_load() {
        let s = AllocateStrategy::consistent_hash();
        let sizes: Vec<usize> = shares(&s, &members(4), &queues(256))
            .values()
            .map(Vec::len)
            .collect();
        assert!(sizes.iter().all(|n| *n > 16), "{sizes:?}");
    }

    #[test]
    fn stable_hash_is_pinned() {
        // A changed hash silently reshuffles every consistent-hash group on upgrade.
        assert_eq!(stable_hash(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(stable_hash(b"T@b@0"), 0x3a6a_33bd_752f_ce5f);
        assert_ne!(stable_hash(b"a-0"), stable_hash(b"a-1"));
    }

    #[test]
    fn fixed_takes_configured_queues_that_exist() {
        let qs = queues(4);
        let s = AllocateStrategy::Fixed(vec![qs[1].clone(), MessageQueue::new("T", "gone", 9)]);
        assert_eq!(
            allocate(&s, &members(1)[0], &members(1), &qs),
            vec![qs[1].clone()]
        );
    }

    #[test]
    fn rebalance_diff() {
        let qs = queues(6);
        let r = Rebalance::between(&qs[..3], &qs[2..5]);
        assert_eq!(r.to_drop, sorted(&qs[..2]));
        assert_eq!(r.to_add, sorted(&qs[3..5]));
        assert_eq!(r.assigned, sorted(&qs[2..5]));
        assert!(Rebalance::between(&qs, &qs).is_noop());

        // A member leaving: the survivor picks up queues, drops none it keeps.
        let ms = members(2);
        let s = AllocateStrategy::Average;
        let held = allocate(&s, &ms[0], &ms, &qs);
        let r = Rebalance::plan(&s, &ms[0], &ms[..1], &qs, &held);
        assert!(r.to_drop.is_empty());
        assert_eq!(r.assigned.len(), 6);
    }

    fn sorted(qs: &[MessageQueue]) -> Vec<MessageQueue> {
        let mut v = qs.to_vec();
        v.sort();
        v
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in strategies().into_iter().take(3) {
            assert_eq!(
                s.name().parse::<AllocateStrategy>().unwrap().name(),
                s.name()
            );
        }
        assert!("CONFIG".parse::<AllocateStrategy>().is_err());
    }
}
