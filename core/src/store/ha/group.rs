//! The master's view of its slaves: a pure state machine (no clock, no sockets) fed
//! with what the replication channel reports, answering which slaves are in sync and
//! how far the group has confirmed the log.
//!
//! # Invariants
//! - A slave's acknowledged offset never exceeds the master's end at the moment it
//!   was reported: an ack beyond it is refused ([`AckError::BeyondEnd`]) and changes
//!   nothing (apache/rocketmq#1155: a bogus offset made SYNC_MASTER ack unreplicated
//!   writes).
//! - A slave's acknowledged offset only moves forward.
//! - The confirmed offset is the highest offset held by `needed` in-sync slaves (and
//!   the master), never more than any of them reported; it only moves forward.

use std::collections::BTreeMap;

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

/// The slaves of one master.
#[derive(Debug, Clone)]
pub struct Group {
    /// Slaves a sync send needs besides the master (`min_in_sync_replicas - 1`).
    needed: usize,
    max_lag: u64,
    /// By connection id (a slave that reconnects is a new connection).
    slaves: BTreeMap<u64, SlaveState>,
    confirmed: u64,
}

impl Group {
    /// `needed`: slaves a send must reach (0 = async); `max_lag`: bytes a slave may
    /// trail and still count as in sync; `end`: the master's log end at start (what is
    /// already there is confirmed: nothing to wait for).
    pub fn new(needed: usize, max_lag: u64, end: u64) -> Group {
        Group {
            needed,
            max_lag,
            slaves: BTreeMap::new(),
            confirmed: end,
        }
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
        self.refresh(end);
        Ok(())
    }

    /// A slave's connection ended.
    pub fn left(&mut self, conn: u64, end: u64) {
        self.slaves.remove(&conn);
        self.refresh(end);
    }

    /// Re-evaluates who is in sync against the master's end (also on a timer, so a
    /// silent slave drops out as the master moves on).
    pub fn refresh(&mut self, end: u64) {
        for s in self.slaves.values_mut() {
            s.in_sync = end.saturating_sub(s.acked) <= self.max_lag;
        }
        if self.needed == 0 {
            self.confirmed = self.confirmed.max(end);
            return;
        }
        let mut acked: Vec<u64> = self
            .slaves
            .values()
            .filter(|s| s.in_sync)
            .map(|s| s.acked)
            .collect();
        if acked.len() >= self.needed {
            acked.sort_unstable_by(|a, b| b.cmp(a));
            let held = acked[self.needed - 1].min(end);
            self.confirmed = self.confirmed.max(held);
        }
    }

    /// Slaves in sync now.
    pub fn in_sync(&self) -> u32 {
        self.slaves.values().filter(|s| s.in_sync).count() as u32
    }

    /// The offset `needed` in-sync slaves (and the master) hold.
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
        g.left(1, 500);
        assert_eq!(g.confirmed(), 300, "a slave leaving does not take it back");
        assert_eq!(g.in_sync(), 1);
    }

    #[test]
    fn a_lagging_slave_leaves_the_in_sync_set_and_rejoins_when_caught_up() {
        let mut g = Group::new(1, 100, 0);
        g.joined(7, 1, "s".into(), 0, 0);
        g.acked(7, 1000, 1000, 1).unwrap();
        assert_eq!(g.in_sync(), 1);
        g.refresh(1200);
        assert_eq!(g.in_sync(), 0, "200 bytes behind, 100 allowed");
        g.acked(7, 1150, 1200, 2).unwrap();
        assert_eq!(g.in_sync(), 1);
        assert_eq!(g.confirmed(), 1150);
    }

    #[test]
    fn async_groups_confirm_everything() {
        let mut g = Group::new(0, 100, 10);
        g.refresh(5000);
        assert_eq!(g.confirmed(), 5000);
    }
}
