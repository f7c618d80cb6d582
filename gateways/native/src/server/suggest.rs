//! `suggestWhichBrokerId`: which member of its broker group a consumer should pull
//! from next, answered with every `PULL_MESSAGE` (docs/replication.md, "Native
//! consumers on a slave").
//!
//! Apache RocketMQ moves a consumer to a slave when the message it reads is no longer
//! in memory (`accessMessageInMemoryMaxRatio`: more than 40 % of the RAM behind the
//! end of the commit log), so a consumer catching up on old data does not evict the
//! page cache the producers and the live consumers use. The rule here is the same
//! measure with a setting instead of a share of the RAM: the bytes of commit log
//! after the last entry a pull examined ([`PullResult::behind_bytes`]).
//!
//! [`PullResult::behind_bytes`]: rocketgate_core::broker::PullResult::behind_bytes

use std::fmt;
use std::sync::Arc;

/// The master's broker id (RocketMQ's `MixAll.MASTER_ID`).
pub const MASTER_ID: u64 = 0;

/// Ids of the slaves fit to serve reads now (on a master: its in-sync slaves).
pub type ReadableSlaves = Arc<dyn Fn() -> Vec<u64> + Send + Sync>;

/// Where this door sends far-behind consumers (`ha.slave_read` and
/// `ha.slave_read_lag_bytes`, plus the broker's id and its slaves).
#[derive(Clone)]
pub struct SlaveRead {
    /// This broker's id in its group (0 = master).
    pub broker_id: u64,
    /// Off: every answer names the master (RocketMQ's `slaveReadEnable = false`).
    pub enabled: bool,
    /// A master moves a consumer more than this far behind to a slave; a slave sends
    /// it back once it is within half of this (the gap keeps a consumer right at the
    /// threshold from bouncing between the two with every pull).
    pub lag_bytes: u64,
    /// On a master: the slaves it may suggest (lowest id first is taken).
    pub readable_slaves: ReadableSlaves,
}

impl Default for SlaveRead {
    fn default() -> Self {
        SlaveRead {
            broker_id: MASTER_ID,
            enabled: false,
            lag_bytes: 256 << 20,
            readable_slaves: Arc::new(Vec::new),
        }
    }
}

impl fmt::Debug for SlaveRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlaveRead")
            .field("broker_id", &self.broker_id)
            .field("enabled", &self.enabled)
            .field("lag_bytes", &self.lag_bytes)
            .finish_non_exhaustive()
    }
}

impl SlaveRead {
    /// The broker id to answer a pull that left `behind` bytes of commit log after
    /// what it read.
    pub fn suggest(&self, behind: u64) -> u64 {
        if !self.enabled {
            return MASTER_ID;
        }
        if self.broker_id == MASTER_ID {
            if behind <= self.lag_bytes {
                return MASTER_ID;
            }
            (self.readable_slaves)()
                .into_iter()
                .filter(|id| *id != MASTER_ID)
                .min()
                .unwrap_or(MASTER_ID)
        } else if behind > self.lag_bytes / 2 {
            self.broker_id
        } else {
            MASTER_ID
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(broker_id: u64, slaves: Vec<u64>) -> SlaveRead {
        SlaveRead {
            broker_id,
            enabled: true,
            lag_bytes: 1000,
            readable_slaves: Arc::new(move || slaves.clone()),
        }
    }

    #[test]
    fn a_master_moves_only_a_far_behind_consumer_and_only_to_a_readable_slave() {
        let m = on(0, vec![3, 2]);
        assert_eq!(m.suggest(0), 0);
        assert_eq!(m.suggest(1000), 0, "at the threshold: stays");
        assert_eq!(m.suggest(1001), 2, "the lowest readable slave");
        assert_eq!(on(0, vec![]).suggest(1 << 40), 0, "no slave to go to");
    }

    #[test]
    fn a_slave_keeps_a_consumer_until_it_is_within_half_the_threshold() {
        let s = on(2, vec![]);
        assert_eq!(s.suggest(1001), 2);
        assert_eq!(s.suggest(501), 2, "between half and the threshold: stays");
        assert_eq!(s.suggest(500), 0, "back to the master");
        assert_eq!(s.suggest(0), 0);
    }

    #[test]
    fn off_every_answer_names_the_master() {
        let mut s = on(2, vec![1]);
        s.enabled = false;
        assert_eq!(s.suggest(1 << 40), 0);
        let mut m = on(0, vec![1]);
        m.enabled = false;
        assert_eq!(m.suggest(1 << 40), 0);
    }
}
