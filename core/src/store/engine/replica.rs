//! The store's side of replication (docs/replication.md): attaching the group's
//! [`Gate`], shipping log runs on a master and appending them on a slave. The
//! checks on the bytes themselves are the commit log's (`commit_log/replica.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering, fence};

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

    /// Resolves once the shippable end ([`Store::shippable_end`]) is past `from`: a
    /// master's replication stream waits here instead of polling, so a sync send is
    /// shipped as soon as it is appended (async flush) or durable (sync flush).
    /// Cancel-safe. It does not resolve for a closing store that takes no more
    /// appends: the stream stops on its own signal (returning at once there would
    /// only make it spin).
    pub async fn wait_shippable(&self, from: u64) {
        let signal = &self.inner.shippable;
        signal.waiting.fetch_add(1, Ordering::SeqCst);
        let _leave = Leave(&signal.waiting);
        loop {
            // Created before the end is read: a `notify_waiters` after this point
            // completes it even before it is first polled.
            let notified = signal.notify.notified();
            fence(Ordering::SeqCst);
            if self.shippable_end() > from {
                return;
            }
            notified.await;
        }
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
    /// Once written, each record's lag behind the master is sampled
    /// ([`crate::store::meters::REPLICATION_LAG`]) from the store timestamps the
    /// checks already read.
    pub async fn append_replicated(&self, offset: u64, bytes: &[u8]) -> Result<u64> {
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        let appended = self
            .inner
            .log
            .append_replicated(offset, bytes)
            .map_err(|e| self.inner.out_of_space(e))?;
        crate::store::meters::replicated(&appended.stamps);
        let end = appended.end;
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

    /// The confirmed offset moved under sync replication (the dispatcher's limit,
    /// `dispatch_limit`): let the dispatcher go on.
    pub(crate) fn replication_moved(&self) {
        self.inner.wake.notify();
    }
}

/// Wakes the replication streams inside [`Store::wait_shippable`] when the shippable
/// end moves. Costs an appender a fence and a load while no stream waits.
///
/// Why no wake-up is lost: a stream counts itself in `waiting` and creates its
/// `Notified` *before* it reads the end; an appender publishes the end *before* it
/// reads `waiting` (a SeqCst fence on both sides). Either the stream sees the new end,
/// or the appender sees the stream and notifies after its `Notified` exists.
#[derive(Debug, Default)]
pub(super) struct ShipSignal {
    notify: tokio::sync::Notify,
    /// Streams inside [`Store::wait_shippable`].
    waiting: AtomicUsize,
}

impl ShipSignal {
    /// The shippable end moved (call after publishing it).
    pub(super) fn moved(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// Leaves [`ShipSignal::waiting`] when a wait ends or is dropped.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{Message, StoreDeps, StoreSettings};

    #[tokio::test]
    async fn a_stream_waiting_for_the_log_is_woken_by_an_append() {
        let sync_flush = FlushMode::Sync {
            timeout: Duration::from_secs(5),
        };
        let async_flush = FlushMode::Async {
            interval: Duration::from_secs(60),
        };
        for flush in [async_flush, sync_flush] {
            let dir = tempfile::tempdir().unwrap();
            let opts = StoreSettings {
                flush,
                ..StoreSettings::default()
            };
            let store = Arc::new(
                Store::open(dir.path(), opts, StoreDeps::fixed_usage(0.1))
                    .unwrap()
                    .0,
            );
            let wait = |s: &Arc<Store>, from: u64| {
                let s = s.clone();
                tokio::spawn(async move { s.wait_shippable(from).await })
            };
            // Nothing past the end: the stream waits (nothing polls the log for it).
            let end = store.shippable_end();
            let waiting = wait(&store, end);
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                !waiting.is_finished(),
                "{flush:?}: woken with nothing to ship"
            );
            // The append (under sync flush: the flush round that makes it durable)
            // moves the shippable end and wakes it.
            let m = Message::new("t", 0, b"wake".to_vec());
            store
                .put_batch_async(std::slice::from_ref(&m))
                .await
                .unwrap();
            tokio::time::timeout(Duration::from_secs(10), waiting)
                .await
                .unwrap_or_else(|_| panic!("{flush:?}: the append did not wake the stream"))
                .unwrap();
            assert!(store.shippable_end() > end);
            store.close().unwrap();
        }
    }
}
