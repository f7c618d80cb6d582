//! The broker's timed work: delayed delivery ticks and transaction check
//! rounds. The state and the work itself belong to [`DelayState`] and
//! [`TxnState`]; the broker lends them its topic table (as a
//! [`TopicLookup`](super::topics::TopicLookup)) and runs them on a timer until it
//! is closed or dropped.
//!
//! [`DelayState`]: super::delay::DelayState
//! [`TxnState`]: super::transaction::TxnState

use std::sync::{Arc, Weak};

use super::local::Broker;
use super::values::CheckRound;
use crate::Result;

impl Broker {
    /// Re-appends every delayed message whose time has come (broker clock) to
    /// its real topic and queue, in delivery-time order; returns how many. The
    /// loop of [`Broker::spawn_delay_delivery`] calls this every tick; tests
    /// call it directly with a manual clock.
    pub async fn deliver_due(&self) -> Result<usize> {
        self.delay.deliver_due(self).await
    }

    /// Starts the delivery loop on the current tokio runtime: every
    /// `delay.tick` it calls [`Broker::deliver_due`]. It stops when the broker
    /// is closed or dropped.
    pub fn spawn_delay_delivery(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let broker: Weak<Broker> = Arc::downgrade(self);
        let tick = self.opts.delay.tick;
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(b) = broker.upgrade() else { return };
                if b.is_closed() {
                    return;
                }
                if let Err(e) = b.deliver_due().await {
                    tracing::error!(error = %e, "delivering delayed messages failed");
                }
            }
        })
    }

    /// One check round (broker clock): every undecided half older than the
    /// transaction timeout (or its `CHECK_IMMUNITY_TIME_IN_SECONDS`) is handed
    /// to its producer group's checker, or rolled back once it has been checked
    /// `transaction_max_checks` times. The loop of
    /// [`Broker::spawn_transaction_checks`] calls this; tests call it directly.
    pub async fn check_transactions(&self) -> Result<CheckRound> {
        self.txn.check(self).await
    }

    /// Starts the check loop on the current tokio runtime: every
    /// `transaction_check_interval` it runs [`Broker::check_transactions`]. It
    /// stops when the broker is closed or dropped.
    pub fn spawn_transaction_checks(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let broker: Weak<Broker> = Arc::downgrade(self);
        let every = self.opts.transaction_check_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate; start one interval in
            loop {
                tick.tick().await;
                let Some(b) = broker.upgrade() else { return };
                if b.is_closed() {
                    return;
                }
                if let Err(e) = b.check_transactions().await {
                    tracing::error!(error = %e, "checking transactions failed");
                }
            }
        })
    }
}
