//! The dispatcher: consume-queue and index entries for what the commit log has
//! stored, run inline by an appender under async flush or by the `rg-dispatch`
//! thread (the backstop, and the only one under sync flush); and the
//! `rg-prefault` thread, which keeps the log's tail pre-faulted.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;

/// How far past the written position the `rg-prefault` thread keeps the commit
/// log pre-faulted: 20 ms of appends at several hundred MB/s.
const WARM_AHEAD: u64 = 16 << 20;

/// Pre-fault this much per system call. A first touch costs 1.5-9 us per 4 KiB
/// page on our VMs, and the kernel (`PREEMPT_NONE`) runs a whole
/// `MADV_POPULATE_WRITE` before it lets a woken connection task back on the core:
/// 8 MiB at once stalled the broker's core for 12-26 ms (the max-rate p99). 64 KiB
/// is 16 pages, ~25-150 us.
const WARM_STEP: u64 = 64 << 10;

/// How often the pre-faulting thread looks at the written position.
const WARM_POLL: Duration = Duration::from_millis(10);

/// During a long catch-up, publish the dispatched position this often (records).
const DISPATCH_PUBLISH_EVERY: u64 = 1024;

impl Inner {
    pub(super) fn dispatch_limit(&self) -> u64 {
        let limit = self.shippable_end();
        match self.replication.get() {
            // Sync replication: consumers read only what enough copies hold.
            Some(gate) if gate.is_sync() => limit.min(gate.confirmed()),
            _ => limit,
        }
    }

    /// What this node vouches for: durable bytes under sync flush, written ones
    /// under async flush (what it may ship to a slave).
    pub(super) fn shippable_end(&self) -> u64 {
        match self.opts.flush {
            FlushMode::Sync { .. } => self.log.flushed_offset(),
            FlushMode::Async { .. } => self.log.max_offset(),
        }
    }

    pub(super) fn lock_dispatch(&self) -> std::sync::MutexGuard<'_, ()> {
        crate::sync::lock(&self.dispatching)
    }

    /// Under async flush the appender dispatches what was appended, unless another
    /// thread is dispatching right now (that one loops until nothing is left). A
    /// cross-thread wake-up per append cost more than the dispatch itself (a futex
    /// wake, a context switch and a contended lock for every message); at high rates
    /// one appender now dispatches many records in one pass.
    ///
    /// Why nothing is left behind: an appender that finds the lock taken has already
    /// published its record (`written`) and fenced; the holder fences after unlocking
    /// and re-reads the limit, so it sees that record and goes round again (or a new
    /// appender takes over). The dispatcher thread still wakes every 20 ms as a backstop.
    pub(super) fn dispatch_inline(&self) {
        loop {
            std::sync::atomic::fence(Ordering::SeqCst);
            let guard = match self.dispatching.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            if let Err(e) = self.dispatch_until(self.dispatch_limit()) {
                drop(guard);
                // Queue and index files are allocated before use: no space for
                // them stops appends too, or the log would run ahead of them.
                let e = self.out_of_space(e);
                tracing::warn!(error = %e, "inline dispatch failed; the dispatcher retries");
                self.wake.notify();
                return;
            }
            drop(guard);
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.dispatched.load(Ordering::Acquire) >= self.dispatch_limit() {
                return;
            }
        }
    }

    pub(super) fn dispatch_loop(&self) {
        let mut seen = 0;
        while !self.closing.load(Ordering::Acquire) {
            let r = {
                let _g = self.lock_dispatch();
                self.dispatch_until(self.dispatch_limit())
            };
            if let Err(e) = r {
                let e = self.out_of_space(e);
                tracing::error!(error = %e, "dispatch failed; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            seen = self.wake.wait(seen, Duration::from_millis(20));
        }
    }

    /// Keeps the next [`WARM_AHEAD`] bytes of the log pre-faulted, so the page
    /// faults and the kernel's zeroing of fresh pages happen here and not inside
    /// appends (RocketMQ's `warmMappedFile`, done continuously). The thread runs at
    /// `SCHED_IDLE`: it only takes a core nothing else wants, any woken connection
    /// task preempts it, and when the broker saturates its cores the appenders
    /// simply fault their own pages. It refills once half the window is used, in
    /// [`WARM_STEP`] pieces so no single call holds the core or the address
    /// space's lock for long.
    pub(super) fn prefault_loop(&self) {
        set_idle_priority();
        let mut seen = 0;
        while !self.closing.load(Ordering::Acquire) {
            // A slave appends by `pwrite` (`append_replicated`): pages faulted in
            // here would only be zeroed for the write to overwrite, and left mapped
            // writable for every `msync` to write-protect again.
            let slave = self
                .replication
                .get()
                .is_some_and(|g| matches!(g.role(), crate::store::ha::Role::Slave { .. }));
            if !slave && self.log.warm_margin() < WARM_AHEAD / 2 {
                loop {
                    if self.closing.load(Ordering::Acquire) {
                        return;
                    }
                    match self.log.warm_ahead(WARM_AHEAD, WARM_STEP) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "pre-faulting the commit log failed; not trying again");
                            break;
                        }
                    }
                }
            }
            seen = self.stop.wait(seen, WARM_POLL);
        }
    }

    /// Writes consume-queue and index entries for every record in
    /// `[dispatched, limit)`. Idempotent: entries land at their queue offset.
    pub(super) fn dispatch_until(&self, limit: u64) -> Result<u64> {
        let from = self.dispatched.load(Ordering::Acquire);
        if from >= limit {
            return Ok(0);
        }
        let mut count = 0u64;
        let mut pos = from;
        // The queue knows its own name: no copy of the topic per call (at light
        // load every call dispatches one record).
        let mut last_queue: Option<Arc<crate::store::consume_queue::ConsumeQueue>> = None;
        // The queues given entries since their readers were last woken.
        let mut touched: Vec<Arc<crate::store::consume_queue::ConsumeQueue>> = Vec::new();
        // Whether every record below `limit` was seen (no early stop at the limit).
        let mut exhausted = true;
        for item in self.log.records_from(from) {
            let rec = item?;
            let phys = rec.phys_offset();
            if phys >= limit {
                exhausted = false;
                break;
            }
            if count > 0 && count.is_multiple_of(DISPATCH_PUBLISH_EVERY) {
                // Let long-polling readers see progress during a long catch-up.
                self.dispatched.store(phys, Ordering::Release);
                self.dispatched_tx.send_replace(phys);
                wake_readers(&mut touched);
            }
            let view = RecordView::parse(&rec)?;
            let tx = view.sys_flag() & record::sys_flag::TRANSACTION_TYPE_MASK;
            if tx != record::sys_flag::TRANSACTION_PREPARED_TYPE
                && tx != record::sys_flag::TRANSACTION_ROLLBACK_TYPE
            {
                let [tags, keys, uniq] = view.properties_named([
                    record::property::TAGS,
                    record::property::KEYS,
                    record::property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                ]);
                // Consecutive records mostly share a queue (a batch is one queue):
                // reuse the last one instead of a hashed lookup per record.
                let qid = view.queue_id() as u32;
                let q = match &last_queue {
                    Some(q) if q.queue_id() == qid && q.topic() == view.topic() => q.clone(),
                    _ => {
                        let q = self.queues.get_or_create(view.topic(), qid)?;
                        last_queue = Some(q.clone());
                        q
                    }
                };
                if !touched.last().is_some_and(|t| Arc::ptr_eq(t, &q)) {
                    touched.push(q.clone());
                }
                q.put(
                    view.queue_offset() as u64,
                    CqEntry {
                        phys_offset: phys,
                        size: rec.len() as u32,
                        tag_hash: tags.map(tag_hash).unwrap_or(0),
                    },
                )?;
                let ts = view.store_timestamp();
                let keys = keys.unwrap_or("").split(record::property::KEY_SEPARATOR);
                for key in keys.filter(|k| !k.is_empty()) {
                    self.index.put(view.topic(), key, phys, ts)?;
                }
                if let Some(uniq) = uniq {
                    self.index.put(view.topic(), uniq, phys, ts)?;
                }
            }
            pos = phys + rec.len() as u64;
            count += 1;
        }
        if exhausted {
            // Past the last record up to the written end there is only an end-of-segment
            // filler (the log's end moves only over whole records and fillers): it is
            // dispatched too. Otherwise a log that ends with a filler — a crash after a
            // segment was closed and before the next one got a record — stays "not yet
            // dispatched" for ever, and whoever waits for dispatch waits for ever.
            pos = pos.max(limit.min(self.log.max_offset()));
        }
        self.dispatched.store(pos, Ordering::Release);
        self.dispatched_tx.send_replace(pos);
        wake_readers(&mut touched);
        Ok(count)
    }
}

/// Wakes the long-polling readers of each queue that got entries (after they
/// were published: a woken reader sees them), once per queue.
fn wake_readers(touched: &mut Vec<Arc<crate::store::consume_queue::ConsumeQueue>>) {
    touched.sort_unstable_by_key(|q| Arc::as_ptr(q) as usize);
    touched.dedup_by(|a, b| Arc::ptr_eq(a, b));
    for q in touched.drain(..) {
        q.arrivals().notify_waiters();
    }
}

/// Lowers the calling thread to `SCHED_IDLE` (Linux; unprivileged). Best effort: on
/// failure or elsewhere the thread keeps its normal priority.
fn set_idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: plain system call on the calling thread (pid 0) with a valid param.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "SCHED_IDLE refused");
        }
    }
}
