//! The master's view of its slaves: a pure state machine (no clock, no sockets) fed
//! with what the replication channel reports, answering which slaves are in sync and
//! how far the group has confirmed the log.
//!
//! Two rules decide the confirmed offset:
//! - **Count rule** (no controller, [`Group::set_members`] never called or given
//!   `None`): the highest offset `needed` in-sync slaves hold.
//! - **Membership rule** (a controller holds the in-sync set): the lowest offset any
//!   member of the controller's set holds, the master's end counting for the master. A
//!   member that is not connected holds it back: the controller may elect any member,
//!   so every member must hold every acknowledged message; a member leaves the set only
//!   through the controller ([`Group::proposal`], then [`Group::set_members`]).
//!
//! # Invariants
//! - A slave's acknowledged offset never exceeds the master's end at the moment it
//!   was reported: an ack beyond it is refused ([`AckError::BeyondEnd`]) and changes
//!   nothing (apache/rocketmq#1155: a bogus offset made SYNC_MASTER ack unreplicated
//!   writes).
//! - A slave's acknowledged offset only moves forward.
//! - The confirmed offset never exceeds what the slaves its rule counts reported, and
//!   only moves forward — a change of the set does not move it back either.
//! - Under the membership rule, every member of the controller's set, and every slave
//!   a proposal still in flight adds to it, holds the confirmed offset: a slave is
//!   proposed only once it holds the confirmed offset, and from the moment it is
//!   proposed it counts for confirmation (Kafka's "maximal ISR"), so the set the
//!   controller ends up with — old or new — holds every acknowledged message.

use std::collections::{BTreeMap, BTreeSet};

/// One connected slave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlaveState {
    /// The slave's `broker.id`.
    pub broker_id: u64,
    /// Its address, for operators.
    pub peer: String,
    /// How far it holds the log (its report: written or flushed, per its flush mode).
    pub acked: u64,
    /// When it last reported, ms.
    pub acked_at_ms: i64,
    /// Within `max_lag_bytes` of the master's end at its last report.
    pub in_sync: bool,
    /// When it last held everything the master had, ms (its lag in time is
    /// `now - caught_up_at_ms` while it is behind).
    pub caught_up_at_ms: i64,
    /// The master's end it is catching up to, and since when (ms): set to the
    /// master's end whenever it reaches the previous one. A slave that has not reached
    /// its target within the group's lag time is *stale* (see [`Group::proposal`]);
    /// unlike `caught_up_at_ms` this works under a steady load, where a healthy slave
    /// never holds the master's very latest byte.
    pub target: (u64, i64),
}

impl SlaveState {
    /// Short of its target for longer than `max_lag_time_ms`.
    fn stale(&self, now_ms: i64, max_lag_time_ms: i64) -> bool {
        let (target, since) = self.target;
        self.acked < target && now_ms.saturating_sub(since) > max_lag_time_ms
    }
}

/// Why an acknowledgement was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckError {
    /// The slave claims more log than the master has.
    BeyondEnd { offset: u64, end: u64 },
    /// No slave is connected under this id.
    Unknown,
}

impl std::fmt::Display for AckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AckError::BeyondEnd { offset, end } => {
                write!(
                    f,
                    "reported offset {offset} is beyond the master's end {end}"
                )
            }
            AckError::Unknown => f.write_str("no such replication connection"),
        }
    }
}

/// The in-sync set a controller holds for this group (master excluded).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Members {
    /// Slave broker ids in the controller's set.
    ids: BTreeSet<u64>,
    /// The controller's `sync_epoch` of that set.
    epoch: u64,
    /// Slaves a proposal added that the controller has not answered yet: they count
    /// for confirmation already (the controller may accept the proposal at any time).
    proposed: BTreeSet<u64>,
}

/// Default for [`Group::with_max_lag_time`]: 10 s.
const DEFAULT_MAX_LAG_TIME_MS: i64 = 10_000;

/// The slaves of one master.
#[derive(Debug, Clone)]
pub struct Group {
    /// Slaves a sync send needs besides the master (`min_in_sync_replicas - 1`).
    needed: usize,
    max_lag: u64,
    /// How long a slave may stay short of its target and still be proposed for (or
    /// kept in) the controller's set.
    max_lag_time_ms: i64,
    /// By connection id (a slave that reconnects is a new connection).
    slaves: BTreeMap<u64, SlaveState>,
    confirmed: u64,
    /// The controller's in-sync set; `None`: the count rule.
    members: Option<Members>,
}

impl Group {
    /// `needed`: slaves a send must reach (0 = async); `max_lag`: bytes a slave may
    /// trail and still count as in sync; `end`: the master's log end at start (what is
    /// already there is confirmed: nothing to wait for).
    pub fn new(needed: usize, max_lag: u64, end: u64) -> Group {
        Group {
            needed,
            max_lag,
            max_lag_time_ms: DEFAULT_MAX_LAG_TIME_MS,
            slaves: BTreeMap::new(),
            confirmed: end,
            members: None,
        }
    }

    /// How long (ms) a slave may stay short of the master's end it is catching up to
    /// before [`Group::proposal`] drops it from (or does not add it to) the set.
    pub fn with_max_lag_time(mut self, ms: i64) -> Group {
        self.max_lag_time_ms = ms;
        self
    }

    /// A slave connected at `offset` (where its log ends).
    pub fn joined(&mut self, conn: u64, broker_id: u64, peer: String, offset: u64, now_ms: i64) {
        self.slaves.insert(
            conn,
            SlaveState {
                broker_id,
                peer,
                acked: offset,
                acked_at_ms: now_ms,
                in_sync: false,
                caught_up_at_ms: now_ms,
                target: (offset, now_ms),
            },
        );
    }

    /// A slave reports it holds the log up to `offset`; `end` is the master's end.
    pub fn acked(&mut self, conn: u64, offset: u64, end: u64, now_ms: i64) -> Result<(), AckError> {
        if offset > end {
            return Err(AckError::BeyondEnd { offset, end });
        }
        let s = self.slaves.get_mut(&conn).ok_or(AckError::Unknown)?;
        s.acked = s.acked.max(offset);
        s.acked_at_ms = now_ms;
        if s.acked >= end {
            s.caught_up_at_ms = now_ms;
        }
        self.refresh(end, now_ms);
        Ok(())
    }

    /// A slave's connection ended.
    pub fn left(&mut self, conn: u64, end: u64, now_ms: i64) {
        self.slaves.remove(&conn);
        self.refresh(end, now_ms);
    }

    /// Re-evaluates who is in sync against the master's end (also on a timer, so a
    /// silent slave drops out as the master moves on).
    pub fn refresh(&mut self, end: u64, now_ms: i64) {
        for s in self.slaves.values_mut() {
            s.in_sync = end.saturating_sub(s.acked) <= self.max_lag;
            if s.acked >= s.target.0 {
                s.target = (end, now_ms);
            }
        }
        if self.needed == 0 {
            self.confirmed = self.confirmed.max(end);
            return;
        }
        let held = match &self.members {
            None => {
                let mut acked: Vec<u64> = self
                    .slaves
                    .values()
                    .filter(|s| s.in_sync)
                    .map(|s| s.acked)
                    .collect();
                if acked.len() < self.needed {
                    return;
                }
                acked.sort_unstable_by(|a, b| b.cmp(a));
                acked[self.needed - 1]
            }
            Some(m) => {
                if m.ids.len() < self.needed {
                    // Below min_in_sync_replicas: sends fail fast; nothing confirms.
                    return;
                }
                let best = self.best_by_id();
                let mut held = end;
                for id in m.ids.union(&m.proposed) {
                    match best.get(id) {
                        Some(s) => held = held.min(s.acked),
                        // A member away holds everything back.
                        None => return,
                    }
                }
                held
            }
        };
        self.confirmed = self.confirmed.max(held.min(end));
    }

    /// Each connected broker id's furthest connection (a slave that reconnected may
    /// briefly have two).
    fn best_by_id(&self) -> BTreeMap<u64, &SlaveState> {
        let mut best: BTreeMap<u64, &SlaveState> = BTreeMap::new();
        for s in self.slaves.values() {
            let e = best.entry(s.broker_id).or_insert(s);
            if s.acked > e.acked {
                *e = s;
            }
        }
        best
    }

    /// Switches to the membership rule with the controller's in-sync set `ids` (slave
    /// broker ids, the master excluded) at sync epoch `epoch`, or back to the count
    /// rule (`None`). A set older than the one held (a lower epoch) is ignored
    /// (returns `false`). What proposals added keeps counting until the epoch moves:
    /// a proposal carries the epoch it was made at, so only then is it certain never
    /// to apply. The confirmed offset does not move back.
    pub fn set_members(
        &mut self,
        members: Option<(BTreeSet<u64>, u64)>,
        end: u64,
        now_ms: i64,
    ) -> bool {
        match (members, self.members.take()) {
            (Some((ids, epoch)), Some(held)) if epoch <= held.epoch => {
                if epoch < held.epoch {
                    self.members = Some(held);
                    return false;
                }
                self.members = Some(Members { ids, ..held });
            }
            (Some((ids, epoch)), _) => {
                self.members = Some(Members {
                    ids,
                    epoch,
                    proposed: BTreeSet::new(),
                })
            }
            (None, _) => self.members = None,
        }
        self.refresh(end, now_ms);
        true
    }

    /// The controller's set and its epoch, when the membership rule applies.
    pub fn members(&self) -> Option<(&BTreeSet<u64>, u64)> {
        self.members.as_ref().map(|m| (&m.ids, m.epoch))
    }

    /// The in-sync set the master should ask the controller for, `None` when the
    /// current one is right (or under the count rule). Keeps a member that is
    /// connected, within `max_lag` bytes, and not stale (short of its target for
    /// longer than the lag time); adds a connected slave that is all of that and holds
    /// the confirmed offset. From this call on, the slaves it adds count for
    /// confirmation until the set's epoch moves ([`Group::set_members`]). When an
    /// earlier proposal added a slave that is no longer fit, the answer leaves it out
    /// even if that is the current set: accepted, it moves the epoch, and the earlier
    /// proposal can no longer apply.
    pub fn proposal(&mut self, end: u64, now_ms: i64) -> Option<BTreeSet<u64>> {
        self.refresh(end, now_ms);
        let lag_time = self.max_lag_time_ms;
        let confirmed = self.confirmed;
        let best = self.best_by_id();
        let members = self.members.as_ref()?;
        let fit = |s: &SlaveState| s.in_sync && !s.stale(now_ms, lag_time);
        let next: BTreeSet<u64> = best
            .iter()
            .filter(|(id, s)| fit(s) && (members.ids.contains(id) || s.acked >= confirmed))
            .map(|(id, _)| *id)
            .collect();
        if next == members.ids && members.proposed.is_subset(&next) {
            return None;
        }
        let added: Vec<u64> = next.difference(&members.ids).copied().collect();
        if let Some(m) = self.members.as_mut() {
            m.proposed.extend(added);
        }
        Some(next)
    }

    /// Slaves in sync now: connected within `max_lag` bytes (under the membership
    /// rule, only members of the set count).
    pub fn in_sync(&self) -> u32 {
        match &self.members {
            None => self.slaves.values().filter(|s| s.in_sync).count() as u32,
            Some(m) => self
                .best_by_id()
                .iter()
                .filter(|(id, s)| s.in_sync && m.ids.contains(id))
                .count() as u32,
        }
    }

    /// Slaves a send can count on: the in-sync slaves (count rule) or the members of
    /// the controller's set (membership rule). A sync send fails at once when this is
    /// below [`Group::needed`].
    pub fn available(&self) -> u32 {
        match &self.members {
            None => self.in_sync(),
            Some(m) => m.ids.len() as u32,
        }
    }

    /// The highest offset the group holds by its rule (see the module docs).
    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    /// Slaves a send needs.
    pub fn needed(&self) -> usize {
        self.needed
    }

    /// Every connected slave, by connection id.
    pub fn slaves(&self) -> impl Iterator<Item = (u64, &SlaveState)> {
        self.slaves.iter().map(|(k, v)| (*k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ack_beyond_the_end_is_refused_and_changes_nothing() {
        let mut g = Group::new(1, 1 << 20, 0);
        g.joined(1, 1, "s".into(), 0, 0);
        g.acked(1, 100, 500, 1).unwrap();
        assert_eq!(g.confirmed(), 100);
        assert_eq!(
            g.acked(1, 10_000, 500, 2),
            Err(AckError::BeyondEnd {
                offset: 10_000,
                end: 500
            })
        );
        assert_eq!(g.confirmed(), 100);
        assert_eq!(g.slaves().next().unwrap().1.acked, 100);
    }

    #[test]
    fn confirmed_needs_enough_in_sync_slaves_and_never_goes_back() {
        let mut g = Group::new(2, 1000, 0);
        g.joined(1, 1, "a".into(), 0, 0);
        g.acked(1, 400, 500, 1).unwrap();
        assert_eq!(g.confirmed(), 0, "one slave of the two needed");
        g.joined(2, 2, "b".into(), 0, 1);
        g.acked(2, 300, 500, 2).unwrap();
        assert_eq!(g.confirmed(), 300, "the lower of the two");
        g.acked(2, 200, 500, 3).unwrap();
        assert_eq!(g.confirmed(), 300, "acks only move forward");
        g.left(1, 500, 4);
        assert_eq!(g.confirmed(), 300, "a slave leaving does not take it back");
        assert_eq!(g.in_sync(), 1);
    }

    #[test]
    fn a_lagging_slave_leaves_the_in_sync_set_and_rejoins_when_caught_up() {
        let mut g = Group::new(1, 100, 0);
        g.joined(7, 1, "s".into(), 0, 0);
        g.acked(7, 1000, 1000, 1).unwrap();
        assert_eq!(g.in_sync(), 1);
        g.refresh(1200, 2);
        assert_eq!(g.in_sync(), 0, "200 bytes behind, 100 allowed");
        g.acked(7, 1150, 1200, 2).unwrap();
        assert_eq!(g.in_sync(), 1);
        assert_eq!(g.confirmed(), 1150);
    }

    #[test]
    fn async_groups_confirm_everything() {
        let mut g = Group::new(0, 100, 10);
        g.refresh(5000, 0);
        assert_eq!(g.confirmed(), 5000);
    }

    fn ids(v: &[u64]) -> BTreeSet<u64> {
        v.iter().copied().collect()
    }

    /// Two slaves (ids 1 and 2 on connections 11 and 12) at 0, a sync group of
    /// `needed`, members `members` at sync epoch 1.
    fn with_members(needed: usize, members: &[u64]) -> Group {
        let mut g = Group::new(needed, 1000, 0).with_max_lag_time(500);
        g.joined(11, 1, "a".into(), 0, 0);
        g.joined(12, 2, "b".into(), 0, 0);
        assert!(g.set_members(Some((ids(members), 1)), 0, 0));
        g
    }

    #[test]
    fn a_disconnected_member_holds_confirmed_back() {
        let mut g = with_members(1, &[1, 2]);
        g.acked(11, 400, 500, 1).unwrap();
        assert_eq!(g.confirmed(), 0, "member 2 holds nothing yet");
        g.acked(12, 300, 500, 2).unwrap();
        assert_eq!(
            g.confirmed(),
            300,
            "the lowest member, not the count of one"
        );
        g.left(12, 500, 3);
        g.acked(11, 500, 500, 4).unwrap();
        assert_eq!(g.confirmed(), 300, "member 2 is away: nothing past it");
        assert_eq!(g.in_sync(), 1);
        assert_eq!(g.available(), 2, "the set still has two members");
        // It comes back on a new connection: confirmed follows it again.
        g.joined(13, 2, "b".into(), 300, 5);
        g.acked(13, 450, 500, 6).unwrap();
        assert_eq!(g.confirmed(), 450);
    }

    #[test]
    fn the_count_rule_would_not_wait_for_a_second_member() {
        // The same acks under the count rule (no controller): one copy is enough.
        let mut g = Group::new(1, 1000, 0);
        g.joined(11, 1, "a".into(), 0, 0);
        g.joined(12, 2, "b".into(), 0, 0);
        g.acked(11, 400, 500, 1).unwrap();
        assert_eq!(g.confirmed(), 400);
    }

    #[test]
    fn shrinking_drops_an_absent_member_then_confirmed_advances_and_never_moves_back() {
        let mut g = with_members(1, &[1, 2]);
        g.acked(11, 200, 500, 1).unwrap();
        g.acked(12, 200, 500, 1).unwrap();
        assert_eq!(g.confirmed(), 200);
        g.left(12, 500, 2);
        g.acked(11, 500, 500, 3).unwrap();
        assert_eq!(g.confirmed(), 200);
        assert_eq!(
            g.proposal(500, 4),
            Some(ids(&[1])),
            "drop the absent member"
        );
        assert_eq!(g.confirmed(), 200, "a proposal alone changes nothing");
        // The controller accepted: confirmed advances past the dropped member.
        assert!(g.set_members(Some((ids(&[1]), 2)), 500, 5));
        assert_eq!(g.confirmed(), 500);
        assert_eq!(g.proposal(500, 6), None, "the set is right");
        // A stale answer (older epoch) is ignored.
        assert!(!g.set_members(Some((ids(&[1, 2]), 1)), 500, 7));
        assert_eq!(
            g.members().map(|(s, e)| (s.clone(), e)),
            Some((ids(&[1]), 2))
        );
        // Back to the count rule, with no slave in sync enough: no move back.
        g.left(11, 900, 8);
        assert!(g.set_members(None, 900, 9));
        assert_eq!(g.confirmed(), 500);
    }

    #[test]
    fn a_member_that_falls_behind_in_bytes_or_time_is_proposed_out() {
        let mut g = with_members(1, &[1, 2]);
        g.acked(11, 100, 100, 1).unwrap();
        g.acked(12, 100, 100, 1).unwrap();
        // Bytes: slave 2 trails by 2000 (1000 allowed).
        g.acked(11, 2100, 2100, 2).unwrap();
        assert_eq!(g.proposal(2100, 3), Some(ids(&[1])));
        assert!(g.set_members(Some((ids(&[1]), 2)), 2100, 3));
        assert_eq!(g.confirmed(), 2100);
        // Time: slave 1 keeps acking, but never reaches the end the master had when it
        // fell behind (a stuck or throttled slave within max_lag bytes).
        g.refresh(2200, 10);
        g.acked(11, 2150, 2200, 300).unwrap();
        assert_eq!(
            g.proposal(2200, 400),
            None,
            "behind 400 ms of the 500 allowed"
        );
        g.acked(11, 2190, 2200, 600).unwrap();
        assert_eq!(
            g.proposal(2200, 600),
            Some(ids(&[])),
            "short of 2200 for 590 ms"
        );
        // Under a steady load a slave that keeps reaching its target stays in even
        // though it never holds the master's very end.
        let mut g = Group::new(1, 1000, 0).with_max_lag_time(500);
        g.joined(11, 1, "a".into(), 0, 0);
        g.set_members(Some((ids(&[1]), 1)), 0, 0);
        for step in 1..=20i64 {
            let end = step as u64 * 100;
            g.acked(11, end - 100, end, step * 200).unwrap();
            assert_eq!(g.proposal(end, step * 200), None, "step {step}");
        }
    }

    #[test]
    fn a_slave_is_proposed_in_only_once_it_holds_the_confirmed_offset() {
        let mut g = with_members(1, &[1]);
        g.acked(11, 1000, 1000, 1).unwrap();
        assert_eq!(g.confirmed(), 1000);
        // Slave 2 is within max_lag bytes (500 behind) but lacks acknowledged messages.
        g.acked(12, 500, 1000, 2).unwrap();
        assert_eq!(g.proposal(1000, 3), None, "500 < confirmed 1000: not yet");
        g.acked(12, 1000, 1000, 4).unwrap();
        assert_eq!(g.proposal(1000, 5), Some(ids(&[1, 2])));
        // While the proposal is in flight, slave 2 already counts: the controller may
        // accept it at any moment, and then it must hold every acked message.
        g.acked(11, 1500, 1500, 6).unwrap();
        assert_eq!(g.confirmed(), 1000, "waits for the proposed member too");
        g.acked(12, 1400, 1500, 7).unwrap();
        assert_eq!(g.confirmed(), 1400);
        // Slave 2 goes away before the controller answered. An answer at the same
        // epoch (a heartbeat's, or a refusal) does not say the proposal will never
        // apply: it still counts.
        g.left(12, 1500, 8);
        assert_eq!(
            g.confirmed(),
            1400,
            "the proposed member is away: held back"
        );
        assert!(g.set_members(Some((ids(&[1]), 1)), 1500, 9));
        assert_eq!(g.confirmed(), 1400, "still held back");
        // The master proposes the current set over it; once that moves the epoch the
        // earlier proposal is dead and member 1 alone confirms.
        assert_eq!(g.proposal(1500, 10), Some(ids(&[1])));
        assert!(g.set_members(Some((ids(&[1]), 2)), 1500, 11));
        assert_eq!(g.confirmed(), 1500, "member 1 alone holds 1500");
        assert_eq!(g.proposal(1500, 12), None);
    }

    #[test]
    fn below_min_in_sync_replicas_nothing_confirms_and_sends_fail_fast() {
        // min_in_sync_replicas = 3 (two slaves needed), the controller holds {1}.
        let mut g = with_members(2, &[1]);
        g.acked(11, 500, 500, 1).unwrap();
        g.acked(12, 500, 500, 1).unwrap();
        assert_eq!(
            g.available(),
            1,
            "below the 2 needed: the gate fails sends at once"
        );
        assert_eq!(g.in_sync(), 1, "only members count as in sync");
        assert_eq!(g.confirmed(), 0);
        assert_eq!(g.proposal(500, 2), Some(ids(&[1, 2])));
        assert!(g.set_members(Some((ids(&[1, 2]), 2)), 500, 3));
        assert_eq!(g.available(), 2);
        assert_eq!(g.confirmed(), 500);
    }

    #[test]
    fn the_count_rule_makes_no_proposal() {
        let mut g = Group::new(1, 1000, 0);
        g.joined(11, 1, "a".into(), 0, 0);
        g.acked(11, 10, 10, 1).unwrap();
        assert_eq!(g.proposal(10, 2), None);
        assert_eq!(g.available(), 1);
    }
}
