//! The replicated state: every broker group's master, master epoch, in-sync set and known
//! replicas, and the commands that change it. Pure: no I/O, no clock, no Raft types, so
//! every rule is tested here without sockets.
//!
//! # Invariants
//! - `master_epoch` only grows; every change of master (election, switchover, first
//!   registration) raises it by one. A broker holding a lower epoch is fenced.
//! - `sync_epoch` only grows; every change of the in-sync set raises it by one.
//! - A master is always a member of its own in-sync set, and every member of the set is
//!   a known replica.
//! - Commands that act on a decision carry the epoch the decision was made at
//!   (compare-and-set): a command decided on a state that changed since is rejected, so
//!   two leaders' worth of decisions can never both apply.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// A broker's id in its group (RocketMQ's `brokerId`).
pub type BrokerId = u64;

/// One broker group as the controllers agree on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    /// The master's broker id; `None` before any broker registered.
    pub master: Option<BrokerId>,
    pub master_epoch: u64,
    /// The in-sync set (RocketMQ's SyncStateSet): the brokers that hold every
    /// acknowledged message, the only ones electable without data loss.
    pub sync_set: BTreeSet<BrokerId>,
    pub sync_epoch: u64,
    /// Every broker that ever registered: id -> address (`host:port` of its native door).
    pub replicas: BTreeMap<BrokerId, String>,
    /// Their replication (HA) ports, where a slave follows a master (`listen.ha`); absent
    /// for a broker that registered without one.
    #[serde(default)]
    pub ha_addrs: BTreeMap<BrokerId, String>,
}

impl Group {
    /// The master's address, when there is a master.
    pub fn master_addr(&self) -> Option<&str> {
        self.master
            .and_then(|m| self.replicas.get(&m))
            .map(String::as_str)
    }

    /// The master's replication address, when there is a master that gave one.
    pub fn master_ha_addr(&self) -> Option<&str> {
        self.master
            .and_then(|m| self.ha_addrs.get(&m))
            .map(String::as_str)
    }
}

/// All groups, by broker group name (RocketMQ's `brokerName`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Groups {
    pub groups: BTreeMap<String, Group>,
}

/// A change to [`Groups`], the payload of one Raft log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// A broker registered (or changed its address). A group without a master takes the
    /// broker as master when the group is new (no in-sync set yet) or when the broker is a
    /// member of the in-sync set (the last master coming back after no one else could be
    /// elected).
    Register {
        group: String,
        id: BrokerId,
        addr: String,
        /// Its replication port (empty: none given).
        #[serde(default)]
        ha_addr: String,
    },
    /// Makes `master` the master at `expect_epoch + 1`. The in-sync set keeps its other
    /// members but the old master (they hold every acknowledged message), or is `{master}`
    /// when `master` was not in it (unclean election). Rejected unless the group is still
    /// at `expect_epoch`.
    ElectMaster {
        group: String,
        master: BrokerId,
        expect_epoch: u64,
    },
    /// The master's new in-sync set. Rejected unless `master` is the master at
    /// `master_epoch` and the set is still at `expect_sync_epoch`.
    AlterSyncSet {
        group: String,
        master: BrokerId,
        master_epoch: u64,
        expect_sync_epoch: u64,
        set: BTreeSet<BrokerId>,
    },
}

/// Why a command did not apply; each maps to a RocketMQ `CONTROLLER_*` response code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    /// The master epoch moved on (`CONTROLLER_FENCED_MASTER_EPOCH`).
    FencedMasterEpoch,
    /// The in-sync set epoch moved on (`CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH`).
    FencedSyncEpoch,
    /// The sender is not the master (`CONTROLLER_INVALID_MASTER`).
    InvalidMaster,
    /// A set member or candidate is not a registered replica (`CONTROLLER_INVALID_REPLICAS`).
    InvalidReplicas,
    /// No such group or broker (`CONTROLLER_BROKER_METADATA_NOT_EXIST`).
    UnknownBroker,
    /// No broker may be elected (`CONTROLLER_ELECT_MASTER_FAILED`).
    NoCandidate,
    /// The broker is not alive (`CONTROLLER_BROKER_NOT_ALIVE`).
    NotAlive,
}

/// What applying a command gave: the group as it is after it, or why nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Applied(Group),
    Rejected { why: Rejection, detail: String },
}

fn rejected(why: Rejection, detail: impl Into<String>) -> Outcome {
    Outcome::Rejected {
        why,
        detail: detail.into(),
    }
}

impl Groups {
    pub fn group(&self, name: &str) -> Option<&Group> {
        self.groups.get(name)
    }

    /// Applies one command. Deterministic: every controller applies the same log to the
    /// same state and gets the same result.
    pub fn apply(&mut self, cmd: &Command) -> Outcome {
        match cmd {
            Command::Register {
                group,
                id,
                addr,
                ha_addr,
            } => {
                let g = self.groups.entry(group.clone()).or_default();
                g.replicas.insert(*id, addr.clone());
                if !ha_addr.is_empty() {
                    g.ha_addrs.insert(*id, ha_addr.clone());
                }
                if g.master.is_none() && (g.sync_set.is_empty() || g.sync_set.contains(id)) {
                    make_master(g, *id);
                }
                Outcome::Applied(g.clone())
            }
            Command::ElectMaster {
                group,
                master,
                expect_epoch,
            } => {
                let Some(g) = self.groups.get_mut(group) else {
                    return rejected(Rejection::UnknownBroker, format!("no group {group}"));
                };
                if g.master_epoch != *expect_epoch {
                    return rejected(
                        Rejection::FencedMasterEpoch,
                        format!("epoch is {}, not {expect_epoch}", g.master_epoch),
                    );
                }
                if !g.replicas.contains_key(master) {
                    return rejected(
                        Rejection::InvalidReplicas,
                        format!("broker {master} of {group} never registered"),
                    );
                }
                // The other members held every acknowledged message under the old master
                // and still do: they stay in the set (Kafka keeps its ISR at a leader
                // change), so the new master can acknowledge as soon as they follow it,
                // without a round to the controller. A master from outside the set
                // (unclean election) starts a set of its own.
                let survivors: BTreeSet<BrokerId> = match g.sync_set.contains(master) {
                    true => g
                        .sync_set
                        .iter()
                        .copied()
                        .filter(|id| Some(*id) != g.master && g.replicas.contains_key(id))
                        .collect(),
                    false => BTreeSet::new(),
                };
                make_master(g, *master);
                if survivors.len() > 1 {
                    g.sync_set = survivors;
                }
                Outcome::Applied(g.clone())
            }
            Command::AlterSyncSet {
                group,
                master,
                master_epoch,
                expect_sync_epoch,
                set,
            } => {
                let Some(g) = self.groups.get_mut(group) else {
                    return rejected(Rejection::UnknownBroker, format!("no group {group}"));
                };
                if g.master != Some(*master) {
                    return rejected(
                        Rejection::InvalidMaster,
                        format!("broker {master} is not the master of {group}"),
                    );
                }
                if g.master_epoch != *master_epoch {
                    return rejected(
                        Rejection::FencedMasterEpoch,
                        format!("epoch is {}, not {master_epoch}", g.master_epoch),
                    );
                }
                if g.sync_epoch != *expect_sync_epoch {
                    return rejected(
                        Rejection::FencedSyncEpoch,
                        format!(
                            "sync set epoch is {}, not {expect_sync_epoch}",
                            g.sync_epoch
                        ),
                    );
                }
                if !set.contains(master) || set.iter().any(|id| !g.replicas.contains_key(id)) {
                    return rejected(
                        Rejection::InvalidReplicas,
                        "the set must hold the master and registered brokers only",
                    );
                }
                g.sync_set = set.clone();
                g.sync_epoch += 1;
                Outcome::Applied(g.clone())
            }
        }
    }
}

fn make_master(g: &mut Group, id: BrokerId) {
    g.master = Some(id);
    g.master_epoch += 1;
    g.sync_set = BTreeSet::from([id]);
    g.sync_epoch += 1;
}

/// What the leader knows of a replica's liveness (controller-local, never replicated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Whether its last heartbeat is within `broker_timeout`.
    pub alive: bool,
    /// The commit-log end it last reported.
    pub max_offset: i64,
}

/// Picks the broker to make master of `g` in place of its current one.
///
/// Candidates are the live members of the in-sync set other than the current master;
/// with `allow_unclean`, when there is none, any live replica (which may lose acknowledged
/// messages). Among candidates the largest reported offset wins, then the lowest id.
/// `prefer` names the one wanted (manual election); it must itself be a candidate.
pub fn pick_master(
    g: &Group,
    live: impl Fn(BrokerId) -> Option<Liveness>,
    allow_unclean: bool,
    prefer: Option<BrokerId>,
) -> Result<BrokerId, (Rejection, String)> {
    let alive = |id: BrokerId| live(id).filter(|l| l.alive);
    let best = |ids: &mut dyn Iterator<Item = BrokerId>| {
        ids.filter(|id| Some(*id) != g.master)
            .filter_map(|id| alive(id).map(|l| (l.max_offset, std::cmp::Reverse(id))))
            .max()
            .map(|(_, std::cmp::Reverse(id))| id)
    };
    if let Some(want) = prefer {
        if !g.replicas.contains_key(&want) {
            return Err((
                Rejection::InvalidReplicas,
                format!("broker {want} never registered"),
            ));
        }
        if alive(want).is_none() {
            return Err((Rejection::NotAlive, format!("broker {want} is not alive")));
        }
        if !g.sync_set.contains(&want) && !allow_unclean {
            return Err((
                Rejection::NoCandidate,
                format!("broker {want} is not in the in-sync set (allow_unclean_election is off)"),
            ));
        }
        return Ok(want);
    }
    if let Some(id) = best(&mut g.sync_set.iter().copied()) {
        return Ok(id);
    }
    if allow_unclean && let Some(id) = best(&mut g.replicas.keys().copied()) {
        return Ok(id);
    }
    Err((
        Rejection::NoCandidate,
        "no live broker of the in-sync set can take over".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(groups: &mut Groups, id: BrokerId) -> Outcome {
        groups.apply(&Command::Register {
            group: "g".into(),
            id,
            addr: format!("127.0.0.1:{}", 10911 + id),
            ha_addr: format!("127.0.0.1:{}", 20911 + id),
        })
    }

    fn three() -> Groups {
        let mut s = Groups::default();
        for id in 0..3 {
            reg(&mut s, id);
        }
        s
    }

    #[test]
    fn first_broker_of_a_new_group_becomes_master_at_epoch_1() {
        let s = three();
        let g = s.group("g").unwrap();
        assert_eq!(g.master, Some(0));
        assert_eq!(g.master_epoch, 1);
        assert_eq!(g.sync_set, BTreeSet::from([0]));
        assert_eq!(g.replicas.len(), 3);
        assert_eq!(g.master_addr(), Some("127.0.0.1:10911"));
        assert_eq!(g.master_ha_addr(), Some("127.0.0.1:20911"));
    }

    #[test]
    fn alter_sync_set_is_checked_against_both_epochs() {
        let mut s = three();
        let alter = |master, me, se, set: &[u64]| Command::AlterSyncSet {
            group: "g".into(),
            master,
            master_epoch: me,
            expect_sync_epoch: se,
            set: set.iter().copied().collect(),
        };
        assert!(matches!(
            s.apply(&alter(1, 1, 1, &[0, 1])),
            Outcome::Rejected {
                why: Rejection::InvalidMaster,
                ..
            }
        ));
        assert!(matches!(
            s.apply(&alter(0, 0, 1, &[0, 1])),
            Outcome::Rejected {
                why: Rejection::FencedMasterEpoch,
                ..
            }
        ));
        assert!(matches!(
            s.apply(&alter(0, 1, 0, &[0, 1])),
            Outcome::Rejected {
                why: Rejection::FencedSyncEpoch,
                ..
            }
        ));
        assert!(matches!(
            s.apply(&alter(0, 1, 1, &[1])),
            Outcome::Rejected {
                why: Rejection::InvalidReplicas,
                ..
            }
        ));
        assert!(matches!(
            s.apply(&alter(0, 1, 1, &[0, 7])),
            Outcome::Rejected {
                why: Rejection::InvalidReplicas,
                ..
            }
        ));
        let Outcome::Applied(g) = s.apply(&alter(0, 1, 1, &[0, 1])) else {
            panic!()
        };
        assert_eq!((g.sync_set, g.sync_epoch), (BTreeSet::from([0, 1]), 2));
    }

    #[test]
    fn election_is_compare_and_set_on_the_epoch() {
        let mut s = three();
        let elect = |master, expect_epoch| Command::ElectMaster {
            group: "g".into(),
            master,
            expect_epoch,
        };
        let Outcome::Applied(g) = s.apply(&elect(1, 1)) else {
            panic!()
        };
        assert_eq!(
            (g.master, g.master_epoch, g.sync_set),
            (Some(1), 2, BTreeSet::from([1])),
            "1 was not in the set {{0}}: a set of its own"
        );
        // A second decision made on the old epoch does not apply.
        assert!(matches!(
            s.apply(&elect(2, 1)),
            Outcome::Rejected {
                why: Rejection::FencedMasterEpoch,
                ..
            }
        ));
        assert!(matches!(
            s.apply(&elect(9, 2)),
            Outcome::Rejected {
                why: Rejection::InvalidReplicas,
                ..
            }
        ));
    }

    fn live(map: &[(BrokerId, bool, i64)]) -> impl Fn(BrokerId) -> Option<Liveness> + '_ {
        move |id| {
            map.iter()
                .find(|(i, ..)| *i == id)
                .map(|(_, alive, off)| Liveness {
                    alive: *alive,
                    max_offset: *off,
                })
        }
    }

    #[test]
    fn picks_the_in_sync_slave_with_the_largest_offset_never_an_out_of_sync_one() {
        let mut g = three().group("g").unwrap().clone();
        g.sync_set = BTreeSet::from([0, 1, 2]);
        let l = [(0, false, 300), (1, true, 100), (2, true, 200)];
        assert_eq!(pick_master(&g, live(&l), false, None), Ok(2));
        // 2 out of the set: 1 is chosen although 2 has more.
        g.sync_set = BTreeSet::from([0, 1]);
        assert_eq!(pick_master(&g, live(&l), false, None), Ok(1));
        // Only the dead master in the set: nobody, unless unclean.
        g.sync_set = BTreeSet::from([0]);
        assert!(matches!(
            pick_master(&g, live(&l), false, None),
            Err((Rejection::NoCandidate, _))
        ));
        assert_eq!(pick_master(&g, live(&l), true, None), Ok(2));
        // A dead in-sync slave is not electable either.
        g.sync_set = BTreeSet::from([0, 1]);
        let l2 = [(0, false, 300), (1, false, 100), (2, true, 200)];
        assert!(pick_master(&g, live(&l2), false, None).is_err());
        // Equal offsets: the lower id.
        g.sync_set = BTreeSet::from([0, 1, 2]);
        let l3 = [(1, true, 5), (2, true, 5)];
        assert_eq!(pick_master(&g, live(&l3), false, None), Ok(1));
    }

    #[test]
    fn an_election_keeps_the_other_in_sync_members_but_drops_the_old_master() {
        let mut s = three();
        let g = s.groups.get_mut("g").unwrap();
        g.sync_set = BTreeSet::from([0, 1, 2]);
        let Outcome::Applied(g) = s.apply(&Command::ElectMaster {
            group: "g".into(),
            master: 2,
            expect_epoch: 1,
        }) else {
            panic!()
        };
        assert_eq!(
            (g.master, g.master_epoch, g.sync_set),
            (Some(2), 2, BTreeSet::from([1, 2]))
        );
    }

    #[test]
    fn manual_election_names_a_live_in_sync_broker() {
        let mut g = three().group("g").unwrap().clone();
        g.sync_set = BTreeSet::from([0, 1]);
        let l = [(0, true, 1), (1, true, 1), (2, true, 1)];
        assert_eq!(pick_master(&g, live(&l), false, Some(1)), Ok(1));
        assert!(matches!(
            pick_master(&g, live(&l), false, Some(2)),
            Err((Rejection::NoCandidate, _))
        ));
        assert_eq!(pick_master(&g, live(&l), true, Some(2)), Ok(2));
        assert!(matches!(
            pick_master(&g, live(&l), false, Some(5)),
            Err((Rejection::InvalidReplicas, _))
        ));
        let dead = [(1, false, 1)];
        assert!(matches!(
            pick_master(&g, live(&dead), false, Some(1)),
            Err((Rejection::NotAlive, _))
        ));
    }

    #[test]
    fn the_old_master_comes_back_as_master_when_no_one_could_replace_it() {
        let mut s = three();
        // Master 0 alone in the set; it disappears and no one is electable: the state keeps
        // it. A group with no master (only after a restart of a fresh state) takes the
        // registering in-sync broker.
        let g = s.groups.get_mut("g").unwrap();
        g.master = None;
        reg(&mut s, 2);
        assert_eq!(
            s.group("g").unwrap().master,
            None,
            "2 is not in the in-sync set"
        );
        let Outcome::Applied(g) = reg(&mut s, 0) else {
            panic!()
        };
        assert_eq!((g.master, g.master_epoch), (Some(0), 2));
    }
}
