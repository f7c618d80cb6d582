//! The store's side of replication (docs/replication.md): attaching the group's
//! [`Gate`], shipping log runs on a master and appending them on a slave. The
//! checks on the bytes themselves are the commit log's (`commit_log/replica.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{FlushMode, Store};
use crate::store::commit_log::Shipment;
use crate::store::ha::Gate;
use crate::{Error, Result};

impl Store {
    /// Attaches the broker group's gate (once, right after open, before any door
    /// starts): a slave's gate refuses every write, a sync master's holds sends and
    /// dispatch at the confirmed offset.
    pub fn attach_replication(&self, gate: Arc<Gate>) -> Result<()> {
        self.inner
            .replication
            .set(gate)
            .map_err(|_| Error::InvalidArgument("replication is already attached".into()))
    }

    /// The attached gate, if any.
    pub fn replication(&self) -> Option<&Arc<Gate>> {
        self.inner.replication.get()
    }

    /// What this node vouches for and may ship: durable bytes under sync flush,
    /// written ones under async flush.
    pub fn shippable_end(&self) -> u64 {
        self.inner.shippable_end()
    }

    /// Up to `max` bytes of whole records from `from` for a slave (see
    /// [`crate::store::commit_log::CommitLog::ship`]); `None` when nothing is there yet.
    pub fn ship(&self, from: u64, max: usize) -> Result<Option<Shipment>> {
        self.inner.log.ship(from, self.shippable_end(), max)
    }

    /// The segment size, which both ends of a replication channel must share.
    pub fn segment_size(&self) -> u64 {
        self.inner.opts.segment_size
    }

    /// Appends a run shipped by the master at `offset` (this log's end), checking
    /// every record first; under sync flush returns once it is durable. Returns the
    /// offset this slave may acknowledge (its written end, durable under sync flush).
    pub async fn append_replicated(&self, offset: u64, bytes: &[u8]) -> Result<u64> {
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        let end = self
            .inner
            .log
            .append_replicated(offset, bytes)
            .map_err(|e| self.inner.out_of_space(e))?;
        match self.inner.opts.flush {
            FlushMode::Async { .. } => self.inner.dispatch_inline(),
            FlushMode::Sync { timeout } => {
                match tokio::time::timeout(timeout, self.inner.durability.wait_durable_async(end))
                    .await
                {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(Error::FlushTimeout {
                            offset: end,
                            durable: self.inner.log.flushed_offset(),
                            waited: timeout,
                        });
                    }
                }
            }
        }
        Ok(end)
    }

    /// A brand-new slave's empty log moved to start at `start`, where the master's
    /// oldest retained segment begins. Refused unless the store holds nothing.
    pub fn restart_empty_at(&self, start: u64) -> Result<()> {
        let inner = &self.inner;
        let _g = inner.lock_dispatch();
        if !inner.queues.queues().is_empty() {
            return Err(Error::InvalidArgument(
                "only an empty store can move its log start".into(),
            ));
        }
        inner.log.restart_empty_at(start)?;
        inner.dispatched.store(start, Ordering::Release);
        inner.dispatched_tx.send_replace(start);
        Ok(())
    }

    /// The confirmed offset or the in-sync set moved: let the dispatcher go on.
    pub(crate) fn replication_moved(&self) {
        self.inner.wake.notify();
    }
}
