//! [`BrokerSettings`]: everything a [`Broker`](super::Broker) is told besides its
//! store and clock, with RocketMQ's defaults.

use std::time::Duration;

use super::allocate::AllocateStrategy;
use super::delay::DelaySettings;
use super::schedule;

/// What a [`Broker`](super::Broker) needs to know besides its store and clock.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    /// This broker's name in queue identities (allocation sorts by it).
    pub broker_name: String,
    /// Create a user topic on its first send (standalone mode).
    pub auto_create_topics: bool,
    /// Read and write queues of an auto-created topic.
    pub default_queues: u32,
    /// A consumer whose last heartbeat is older than this is dropped.
    pub member_timeout: Duration,
    /// How long an orderly-consumption queue lock lasts without renewal.
    pub lock_lease: Duration,
    /// How often changed consumer offsets are written to disk.
    pub offset_flush_interval: Duration,
    /// How clustering groups share out queues.
    pub allocate: AllocateStrategy,
    /// Consume-queue entries one pull round examines before it lets other tasks
    /// run (a filter may reject long runs of messages).
    pub pull_scan_batch: usize,
    /// Delay levels, the longest delay and the delivery tick.
    pub delay: DelaySettings,
    /// How often a group's message is retried before it is dead-lettered
    /// (RocketMQ `maxReconsumeTimes`): it is delivered this many times + 1.
    pub max_reconsume_times: u32,
    /// How often undecided transactions are checked back with their producer
    /// group (RocketMQ `transactionCheckInterval`).
    pub transaction_check_interval: Duration,
    /// A half message younger than this is not checked yet (RocketMQ
    /// `transactionTimeOut`); a message's `CHECK_IMMUNITY_TIME_IN_SECONDS` overrides it.
    pub transaction_timeout: Duration,
    /// Checks of one half message before it is rolled back (RocketMQ
    /// `transactionCheckMax`).
    pub transaction_max_checks: u32,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        BrokerSettings {
            broker_name: "broker-a".into(),
            auto_create_topics: true,
            default_queues: 4,
            member_timeout: Duration::from_secs(120),
            lock_lease: Duration::from_secs(60),
            offset_flush_interval: Duration::from_secs(5),
            allocate: AllocateStrategy::Average,
            pull_scan_batch: 1024,
            delay: DelaySettings::default(),
            max_reconsume_times: schedule::DEFAULT_MAX_RECONSUME_TIMES,
            transaction_check_interval: Duration::from_secs(60),
            transaction_timeout: Duration::from_secs(6),
            transaction_max_checks: 15,
        }
    }
}
