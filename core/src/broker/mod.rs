//! Broker semantics on top of the store: topics, sending, consumer groups,
//! offsets and pull with long polling, behind one narrow API.
//!
//! Start with [`MessagingApi`] (what a gateway calls; the values crossing it
//! are in `values.rs`, below the trait) and [`Broker`] (the local
//! implementation over a [`crate::store::Store`], in `local.rs`, with its
//! [`BrokerSettings`]). The stateful parts are split along their seams:
//! [`topics`] (the persisted topic table), [`offsets`] (persisted consumer
//! offsets), [`groups`] (membership, subscriptions and queue locks as a pure
//! state machine driven by a [`Clock`]), [`group_config`] (a group's persisted
//! mode and retry limit), [`pop_state`] (POP cursors and in-flight leases,
//! persisted), [`delay`] (delay levels and delivery at a time: schedule topics,
//! persisted progress) and [`transaction`] (half messages, commit / rollback,
//! check-back). Delay and transactions own their work as well as their state:
//! they take the store and the clock at open and see the topic table only
//! through `topics::TopicLookup`, so they never reach into the `Broker`; its
//! `tasks.rs` runs their timers. The `Broker`'s own operations are spread over
//! `pull.rs`, `pop.rs`, [`retry`] (send-back with back-off, dead letters) and
//! `inspect.rs` (queue stats, group progress, lookup by id / key / time). The
//! pure building blocks need no I/O: subscription filters ([`filter::Filter`]),
//! queue allocation and rebalance ([`allocate`]), delay levels, retry back-off
//! and system topic names ([`schedule`]). The model, the module map and its
//! decisions are written down in `docs/broker.md`.

pub mod allocate;
mod api;
pub mod delay;
pub mod filter;
pub mod group_config;
mod group_delete;
pub mod groups;
mod inspect;
mod local;
pub mod offsets;
mod persist;
mod pop;
pub mod pop_state;
mod pull;
pub mod receipt;
mod replicated;
pub mod retry;
pub mod schedule;
mod settings;
mod tasks;
pub mod topics;
pub mod transaction;
mod values;

/// The crate's clock, at the path gateways have used so far.
pub use crate::clock::{self, Clock, ManualClock, SystemClock};
pub use api::{MessagingApi, SEND_TIME_PROPERTIES};
pub use delay::{DelayLimits, DelayRequest, DelaySettings, Delayed};
pub use group_config::GroupConfig;
pub use groups::{ConsumeMode, Heartbeat, Subscription};
pub use local::{Broker, sharding_queue};
pub use receipt::ReceiptHandle;
pub use replicated::{
    DELAY_TOPIC, FULL_POP_EVERY, OFFSETS_TOPIC, OffsetPublisher, POP_TOPIC, PopPublisher,
    TOPICS_TOPIC,
};
pub use settings::BrokerSettings;
pub use topics::{Perm, TopicConfig, TopicKind};
pub use values::{
    CheckRound, CheckerRegistration, DeadLetters, Delivered, GroupDeleted, GroupDeletion,
    GroupInfo, HalfMessage, HalfSent, MemberInfo, OffsetReset, PopRequest, Popped, PullRequest,
    PullResult, PullStatus, QueueChoice, QueueProgress, QueueStats, Resolution, SendBackResult,
    SendResult, TransactionChecker, TransactionHandle,
};
