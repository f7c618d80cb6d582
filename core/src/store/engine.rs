//! [`Store`]: the commit log, the consume queues and the index working as one.
//!
//! - **Append** goes to the commit log (one short lock, a memcpy); under `sync` flush the
//!   caller then waits for the group commit that covers its bytes.
//! - **Dispatch**: one thread walks the commit log behind the writers and writes each
//!   record's consume-queue entry and index keys, then publishes the dispatched position
//!   (what long polling waits on). Under `sync` flush it only dispatches durable bytes,
//!   so a consumer never sees a message that a crash could take back.
//! - **Checkpoint**: a maintenance thread syncs consume queues and index, then records
//!   how far the log and the dispatch are durable (see [`super::checkpoint`]).
//! - **Recovery** (in [`Store::open`]): verify the log from the checkpoint on, truncate
//!   the torn tail, drop queue entries past the new end, re-dispatch from the
//!   checkpoint, seed the queue-offset counters.
//! - **Retention** ([`retention`]): segments older than the retention time go, oldest
//!   first; above the soft disk ratio the oldest go early if every consumer has read
//!   them (or anyway under [`DiskFullPolicy::DeleteOldest`]); above the hard ratio
//!   appends are refused with [`Error::DiskFull`] until space is back.
//! - **Integrity** ([`integrity`]): every record is checksum-verified before it is
//!   served; a damaged one is reported and skipped.
//! - **One process per data directory**: [`Store::open`] takes the directory's lock
//!   ([`super::lock`]) first and holds it until close.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::checkpoint::{AbortMarker, Checkpoint};
use super::commit_log::{AppendResult, CommitLog, CommitLogSettings, RecordRef, Recovery};
use super::consume_queue::{ConsumeQueues, CqBatch, CqEntry, tag_hash, validate_topic};
use super::disk::{DiskSpace, Statvfs};
use super::flush::{FlushMode as FlushPolicy, GroupCommit};
use super::index::IndexStore;
use super::io::Files;
use super::lock::DirLock;
use super::record::{self, Message, RecordView};
use crate::{Error, Result};

mod dispatch;
mod integrity;
mod replica;
mod retention;

pub use retention::{DiskFullPolicy, ReadProgress};

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    /// After the bytes are durable; concurrent appends share one sync.
    Sync { timeout: Duration },
    /// After the append; the log is synced every `interval`.
    Async { interval: Duration },
}

/// Everything [`Store::open`] needs to know.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub segment_size: u64,
    pub max_message_size: usize,
    pub flush: FlushMode,
    pub checkpoint_interval: Duration,
    pub retention: Duration,
    pub retention_check_interval: Duration,
    pub disk_soft_ratio: f64,
    pub disk_hard_ratio: f64,
    /// What disk pressure may delete ([`DiskFullPolicy`]).
    pub disk_full_policy: DiskFullPolicy,
    pub consume_queue_entries_per_file: u32,
    pub index_slots: u32,
    pub index_entries_per_file: u32,
    /// Written into every record and message id.
    pub store_host: std::net::SocketAddr,
    /// Keep the commit log's tail pre-faulted on the `rg-prefault` thread, so
    /// appends do not take the page faults (on by default; off only to measure
    /// what it saves: `rocketgate bench store --prefault on,off`).
    pub prefault: bool,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            segment_size: 1 << 30,
            max_message_size: 4 << 20,
            flush: FlushMode::Async {
                interval: Duration::from_millis(500),
            },
            checkpoint_interval: Duration::from_secs(1),
            retention: Duration::from_secs(72 * 3600),
            retention_check_interval: Duration::from_secs(10),
            disk_soft_ratio: 0.75,
            disk_hard_ratio: 0.90,
            disk_full_policy: DiskFullPolicy::Refuse,
            consume_queue_entries_per_file: 300_000,
            index_slots: 5_000_000,
            index_entries_per_file: 20_000_000,
            store_host: std::net::SocketAddr::from(([127, 0, 0, 1], 10911)),
            prefault: true,
        }
    }
}

/// The store's clock (retention ages, checkpoint times): the crate's one
/// [`crate::clock::Clock`], kept at this path for existing callers.
pub use crate::clock::Clock;

/// The system clock as a store dependency.
pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(crate::clock::SystemClock)
}

/// What a store depends on besides its options.
pub struct StoreDeps {
    pub disk: Arc<dyn DiskSpace>,
    /// Wall-clock ms; injectable for retention tests.
    pub clock: Arc<dyn Clock>,
    /// File operations ([`super::io`]): the syscalls, or faults injected by tests.
    pub files: Files,
}

impl StoreDeps {
    /// The system clock and files over a disk that always reports `ratio` full
    /// ([`super::FixedUsage`]): what tests and benchmarks open stores with, so their
    /// outcome does not depend on how full the machine's disk is.
    pub fn fixed_usage(ratio: f64) -> Self {
        StoreDeps {
            disk: Arc::new(super::FixedUsage(ratio)),
            ..StoreDeps::default()
        }
    }
}

impl Default for StoreDeps {
    fn default() -> Self {
        StoreDeps {
            disk: Arc::new(Statvfs),
            clock: system_clock(),
            files: Files::os(),
        }
    }
}

/// What [`Store::open`] found and did.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    pub unclean_shutdown: bool,
    pub checkpoint: Option<Checkpoint>,
    pub log_end: u64,
    pub truncated_bytes: u64,
    pub redispatched_records: u64,
}

/// Entries read from one consume queue.
#[derive(Debug, Clone, Default)]
pub struct QueueRead {
    /// `(queue offset, entry)` in order.
    pub entries: Vec<(u64, CqEntry)>,
    /// Where the next read should start. Past `entries`, or moved up to the queue's
    /// minimum when the requested offset was deleted by retention.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

/// Position counters, for admin and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Positions {
    pub min: u64,
    pub flushed: u64,
    pub written: u64,
    pub dispatched: u64,
}

/// The storage engine. Cheap to share: clone the `Arc<Store>`.
pub struct Store {
    inner: Arc<Inner>,
    /// Background threads, joined by [`Store::close`]. Locked only there.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Removed on a clean close. Locked only at close.
    abort: Mutex<Option<AbortMarker>>,
    /// The data directory's lock, released at close (or by the kernel when the
    /// process dies). Locked only at close.
    lock: Mutex<Option<DirLock>>,
}

/// Things the store counts for operators (admin stats, metrics).
#[derive(Default)]
struct Counters {
    /// Records found damaged (or not matching their queue entry) on read, and not served.
    corrupt_records: AtomicU64,
    /// Unread messages deleted for disk space under `delete_oldest`.
    unread_dropped: AtomicU64,
}

struct Inner {
    dir: PathBuf,
    opts: StoreSettings,
    deps: StoreDeps,
    log: Arc<CommitLog>,
    durability: GroupCommit,
    queues: ConsumeQueues,
    index: IndexStore,
    /// Records below this have consume-queue and index entries written (not yet
    /// necessarily durable). Only the dispatcher advances it.
    dispatched: AtomicU64,
    /// Publishes `dispatched` to long-polling readers.
    dispatched_tx: tokio::sync::watch::Sender<u64>,
    /// Wakes the dispatcher thread: after every flush round under sync flush, and
    /// when an inline dispatch failed (the thread retries).
    wake: Arc<Signal>,
    /// Wakes replication streams waiting for the shippable end to move (see
    /// [`Store::wait_shippable`]): after every append under async flush, after every
    /// flush round under sync flush.
    shippable: Arc<replica::ShipSignal>,
    /// Held by whoever runs `dispatch_until`: under async flush the appending
    /// thread dispatches its own record when nobody else is (see
    /// [`Inner::dispatch_inline`]); the dispatcher thread is the backstop.
    dispatching: Mutex<()>,
    /// Wakes the maintenance thread at close. Separate from `wake` so an append
    /// does not also wake maintenance (and a disk check) every time.
    stop: Signal,
    /// Set above the hard disk ratio; appends are refused while set.
    disk_full: AtomicBool,
    /// Last measured disk usage in basis points (for the error message and metrics).
    disk_usage_bp: AtomicU64,
    closing: AtomicBool,
    /// What consumers have read, for the disk-full policy. Replaced once, when the
    /// broker attaches its offsets ([`Store::follow_progress`]); read by retention.
    progress: RwLock<Arc<dyn ReadProgress>>,
    counters: Counters,
    /// Records verified recently (see `integrity`); lock-free.
    verdicts: integrity::Verdicts,
    /// The broker group's gate (role, confirmed offset), attached once by
    /// [`Store::attach_replication`]; none on a node without replication. A
    /// `OnceLock` so the append and dispatch paths read it without a lock.
    replication: std::sync::OnceLock<Arc<super::ha::Gate>>,
}

/// A "something happened" signal between std threads that costs producers one
/// atomic add unless the other side is asleep: only then do they take the lock and
/// notify (a futex syscall per append would be a large share of an append).
///
/// Why it cannot miss a wake-up: a waiter registers in `sleepers` *before* it
/// re-checks `seq` under the lock; a notifier bumps `seq` *before* it reads
/// `sleepers` (both SeqCst). Either the waiter sees the new `seq`, or the notifier
/// sees the sleeper and notifies under the lock, after the waiter is waiting.
struct Signal {
    seq: AtomicU64,
    sleepers: AtomicU64,
    /// Guards nothing but the sleep itself (the condvar needs a mutex).
    lock: Mutex<()>,
    cv: Condvar,
}

impl Signal {
    fn new() -> Self {
        Signal {
            seq: AtomicU64::new(0),
            sleepers: AtomicU64::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    fn notify(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = crate::sync::lock(&self.lock);
            self.cv.notify_all();
        }
    }

    /// Waits until the counter moves past `seen` or `timeout` passes; returns the counter.
    fn wait(&self, seen: u64, timeout: Duration) -> u64 {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let g = crate::sync::lock(&self.lock);
        if self.seq.load(Ordering::SeqCst) == seen {
            let _ = self
                .cv
                .wait_timeout_while(g, timeout, |_| self.seq.load(Ordering::SeqCst) == seen)
                .unwrap_or_else(|p| p.into_inner());
        } else {
            drop(g);
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.seq.load(Ordering::SeqCst)
    }
}

impl Store {
    /// Opens (or creates) the store in `dir`, recovering after an unclean stop, and
    /// starts its background threads.
    pub fn open(dir: &Path, opts: StoreSettings, deps: StoreDeps) -> Result<(Store, OpenReport)> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        // Before anything is read or written: a second process must not touch it.
        let lock = DirLock::acquire(dir)?;
        // A log truncation a crash interrupted is finished before anything is read.
        super::truncate::finish_interrupted(dir)?;
        let (abort, unclean) = AbortMarker::create(dir)?;
        let checkpoint = Checkpoint::load(dir);
        let mut report = OpenReport {
            unclean_shutdown: unclean,
            checkpoint,
            ..OpenReport::default()
        };

        let log_opts = CommitLogSettings {
            segment_size: opts.segment_size,
            max_message_size: opts.max_message_size,
            store_host: opts.store_host,
            write_through: matches!(opts.flush, FlushMode::Sync { .. }),
        };
        let (log, recovery) = CommitLog::open_with(
            dir.join("commitlog"),
            log_opts,
            Recovery::from(checkpoint.map(|c| c.log_flushed)),
            deps.files.clone(),
        )?;
        let log = Arc::new(log);
        report.log_end = log.max_offset();
        report.truncated_bytes = recovery.truncated_bytes;
        if recovery.truncated_bytes > 0 {
            // Queues lose entries with the tail: positions past them must move back.
            super::truncate::mark_cut(dir)?;
        }

        let queues = ConsumeQueues::open_with(
            dir,
            opts.consume_queue_entries_per_file as u64,
            deps.files.clone(),
        )?;
        let index = IndexStore::open_with(
            dir,
            opts.index_slots,
            opts.index_entries_per_file,
            deps.files.clone(),
        )?;
        queues.truncate_all_from_phys(log.max_offset())?;
        // Queue files may still point into segments retention already deleted.
        queues.delete_all_before_phys(log.min_offset())?;

        let start = checkpoint
            .map(|c| c.dispatched)
            .unwrap_or(0)
            .clamp(log.min_offset(), log.max_offset());

        let policy = match opts.flush {
            FlushMode::Sync { .. } => FlushPolicy::Sync,
            FlushMode::Async { interval } => FlushPolicy::Async { interval },
        };
        super::meters::register();
        let wake = Arc::new(Signal::new());
        let shippable = Arc::new(replica::ShipSignal::default());
        // Under sync flush the dispatcher and the replication streams follow durable
        // bytes: one wake per round.
        let durability = {
            let (wake, shippable) = (wake.clone(), shippable.clone());
            let sync = policy == FlushPolicy::Sync;
            GroupCommit::start_with(log.clone(), policy, move || {
                wake.notify();
                if sync {
                    shippable.moved();
                }
            })?
        };
        let (dispatched_tx, _) = tokio::sync::watch::channel(start);
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            opts,
            deps,
            log,
            durability,
            queues,
            index,
            dispatched: AtomicU64::new(start),
            dispatched_tx,
            wake,
            shippable,
            dispatching: Mutex::new(()),
            stop: Signal::new(),
            disk_full: AtomicBool::new(false),
            disk_usage_bp: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            progress: RwLock::new(Arc::new(retention::NothingRead)),
            counters: Counters::default(),
            verdicts: integrity::Verdicts::new(),
            replication: std::sync::OnceLock::new(),
        });

        // Re-dispatch everything the checkpoint does not vouch for, before anyone reads.
        report.redispatched_records = inner.dispatch_until(inner.log.max_offset())?;
        let mut next: HashMap<(String, u32), u64> = inner.queues.next_offsets();
        for ((topic, qid), n) in recovery.next_queue_offsets {
            let slot = next.entry((topic, qid)).or_insert(0);
            *slot = (*slot).max(n);
        }
        inner.log.set_next_queue_offsets(next);
        // Everything recovered is durable from here on: sync it and write a checkpoint,
        // so a second crash right away does not redo this work.
        inner.durability.flush_now()?;
        inner.checkpoint()?;
        inner.check_disk();

        if unclean {
            tracing::warn!(
                dir = %dir.display(),
                truncated_bytes = report.truncated_bytes,
                redispatched = report.redispatched_records,
                "recovered after an unclean stop"
            );
        }

        let mut threads = Vec::new();
        {
            let inner = inner.clone();
            threads.push(spawn("rg-dispatch", move || inner.dispatch_loop()));
        }
        if inner.opts.prefault {
            let inner = inner.clone();
            threads.push(spawn("rg-prefault", move || inner.prefault_loop()));
        }
        {
            let inner = inner.clone();
            threads.push(spawn("rg-maintain", move || inner.maintain_loop()));
        }
        Ok((
            Store {
                inner,
                threads: Mutex::new(threads),
                abort: Mutex::new(Some(abort)),
                lock: Mutex::new(Some(lock)),
            },
            report,
        ))
    }

    /// Appends one message; under sync flush returns once it is durable.
    pub fn put(&self, msg: &Message) -> Result<AppendResult> {
        let r = self.append(std::slice::from_ref(msg))?.pop();
        r.ok_or_else(|| Error::InvalidMessage("nothing appended".into()))
    }

    /// Appends a batch as one contiguous write; under sync flush returns once durable.
    pub fn put_batch(&self, msgs: &[Message]) -> Result<Vec<AppendResult>> {
        self.append(msgs)
    }

    fn append(&self, msgs: &[Message]) -> Result<Vec<AppendResult>> {
        let started = std::time::Instant::now();
        let results = self.append_only(msgs)?;
        if let FlushMode::Sync { timeout } = self.inner.opts.flush {
            let end = results.last().map(|r| r.end_offset).unwrap_or(0);
            self.inner.durability.wait_durable(end, timeout)?;
        }
        if let Some(gate) = self.inner.replication.get() {
            let end = results.last().map(|r| r.end_offset).unwrap_or(0);
            gate.wait_replicated_blocking(end)?;
        }
        super::meters::APPEND.record_since(started);
        Ok(results)
    }

    /// Async twin of [`Store::put_batch`] for gateways on tokio: the append is a
    /// memcpy; the durability wait does not block a runtime thread.
    pub async fn put_batch_async(&self, msgs: &[Message]) -> Result<Vec<AppendResult>> {
        let started = std::time::Instant::now();
        let results = self.append_only(msgs)?;
        let end = results.last().map(|r| r.end_offset).unwrap_or(0);
        self.wait_durable_async(end).await?;
        super::meters::APPEND.record_since(started);
        Ok(results)
    }

    /// Appends every entry of `batch` to queue `queue_id` of `topic`, contiguously,
    /// copying each entry's pre-encoded properties into its record (see
    /// [`CommitLog::append_encoded`]); under sync flush returns once durable.
    /// Returns the store timestamp and where each record landed.
    pub async fn put_encoded_async(
        &self,
        batch: record::PlainBatch<'_>,
        topic: &str,
        queue_id: u32,
    ) -> Result<(i64, Vec<record::Placed>)> {
        if batch.batch().entries.is_empty() {
            return Err(Error::InvalidMessage("an empty batch".into()));
        }
        let started = std::time::Instant::now();
        self.check_appendable(std::iter::once(topic))?;
        let (ts, placed) = self
            .inner
            .log
            .append_encoded(batch, topic, queue_id)
            .map_err(|e| self.inner.out_of_space(e))?;
        self.after_append();
        let end = placed
            .last()
            .map_or(0, |p| p.phys_offset + u64::from(p.size));
        self.wait_durable_async(end).await?;
        super::meters::APPEND.record_since(started);
        Ok((ts, placed))
    }

    /// This broker's address as its records store it (STOREHOST, message ids).
    /// Why this store takes no writes now (a slave, a fenced master or one without
    /// its lease); `None` when it does. Metadata changes that travel through the
    /// replicated log (a group deletion) ask this first, so a slave refuses them
    /// rather than diverge from its master.
    pub fn write_refusal(&self) -> Option<Error> {
        self.inner.replication.get().and_then(|g| g.refuse_write())
    }

    pub fn store_host(&self) -> std::net::SocketAddr {
        self.inner.opts.store_host
    }

    async fn wait_durable_async(&self, end: u64) -> Result<()> {
        if let FlushMode::Sync { timeout } = self.inner.opts.flush {
            match tokio::time::timeout(timeout, self.inner.durability.wait_durable_async(end)).await
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
        if let Some(gate) = self.inner.replication.get() {
            gate.wait_replicated(end).await?;
        }
        Ok(())
    }

    /// Refuses an append while closing, when the disk is full, or to a topic the
    /// dispatcher could not give a consume queue (it would stall dispatch for
    /// everything behind it).
    fn check_appendable<'a>(&self, topics: impl IntoIterator<Item = &'a str>) -> Result<()> {
        let inner = &self.inner;
        if inner.closing.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        if let Some(refusal) = inner.replication.get().and_then(|g| g.refuse_write()) {
            return Err(refusal);
        }
        if inner.disk_full.load(Ordering::Acquire) {
            return Err(inner.disk_full_error());
        }
        for t in topics {
            validate_topic(t)?;
        }
        Ok(())
    }

    fn after_append(&self) {
        if matches!(self.inner.opts.flush, FlushMode::Async { .. }) {
            // Written bytes are shippable under async flush.
            self.inner.shippable.moved();
            self.inner.dispatch_inline();
        }
    }

    fn append_only(&self, msgs: &[Message]) -> Result<Vec<AppendResult>> {
        if self.inner.closing.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        if msgs.is_empty() {
            return Err(Error::InvalidMessage("an empty batch".into()));
        }
        self.check_appendable(msgs.iter().map(|m| m.topic.as_str()))?;
        let results = if msgs.len() == 1 {
            vec![
                self.inner
                    .log
                    .append(&msgs[0])
                    .map_err(|e| self.inner.out_of_space(e))?,
            ]
        } else {
            self.inner
                .log
                .append_batch(msgs)
                .map_err(|e| self.inner.out_of_space(e))?
        };
        self.after_append();
        Ok(results)
    }

    /// Reads up to `max` entries of a consume queue from `offset`.
    pub fn read_queue(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max: usize,
    ) -> Result<QueueRead> {
        let Some(q) = self.inner.queues.get(topic, queue_id) else {
            return Ok(QueueRead::default());
        };
        let (min, max_off) = (q.min_offset(), q.max_offset());
        let from = offset.clamp(min, max_off);
        let batch = if from < max_off && max > 0 {
            let mut batch = q.read(from, max)?;
            // Only entries whose record is intact and is the message they name.
            // An I/O error is not a verdict on the record: the read fails and
            // the reader keeps its place (it would otherwise skip a message).
            let mut kept = Vec::with_capacity(batch.entries.len());
            for (offset, e) in batch.entries {
                match self.inner.verified_entry(topic, queue_id, offset, &e) {
                    Ok(_) => kept.push((offset, e)),
                    Err(
                        Error::Corrupt { .. }
                        | Error::OffsetOutOfRange { .. }
                        | Error::InvalidArgument(_),
                    ) => {}
                    Err(err) => return Err(err),
                }
            }
            batch.entries = kept;
            batch
        } else {
            CqBatch {
                entries: Vec::new(),
                next_offset: from,
            }
        };
        Ok(QueueRead {
            entries: batch.entries,
            next_offset: batch.next_offset,
            min_offset: min,
            max_offset: max_off,
        })
    }

    /// Up to `max` entries of a consume queue from `offset`, as the queue holds
    /// them: **not** checked against the commit log. For readers that read each
    /// record they serve through [`Store::read_queued`], which verifies it there,
    /// once (the pull and POP scans: a tag filter then skips an entry by its tag
    /// hash without reading or hashing its record at all). Everyone else uses
    /// [`Store::read_queue`].
    pub fn read_queue_entries(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max: usize,
    ) -> Result<QueueRead> {
        let Some(q) = self.inner.queues.get(topic, queue_id) else {
            return Ok(QueueRead::default());
        };
        let (min, max_off) = (q.min_offset(), q.max_offset());
        let from = offset.clamp(min, max_off);
        let batch = if from < max_off && max > 0 {
            q.read(from, max)?
        } else {
            CqBatch {
                entries: Vec::new(),
                next_offset: from,
            }
        };
        Ok(QueueRead {
            entries: batch.entries,
            next_offset: batch.next_offset,
            min_offset: min,
            max_offset: max_off,
        })
    }

    /// The record entry `entry` (at `queue_offset` of `topic`/`queue_id`) points
    /// at, with `inspect` run on its parsed view, after one check that it is
    /// intact (its checksums) and is the message the entry names.
    ///
    /// `Ok(None)`: the record is damaged, is another message, or is gone (below
    /// the log's minimum); a damaged one is reported (log line and
    /// [`Store::corrupt_records`]) and never returned. The caller moves past it,
    /// as [`Store::read_queue`] drops such entries. An I/O error reading it is an
    /// error: the record may be fine, so the caller keeps its place and retries.
    pub fn read_queued<T>(
        &self,
        topic: &str,
        queue_id: u32,
        queue_offset: u64,
        entry: &CqEntry,
        inspect: impl FnOnce(&RecordView<'_>) -> T,
    ) -> Result<Option<(RecordRef, T)>> {
        match self
            .inner
            .verified_entry_with(topic, queue_id, queue_offset, entry, inspect)
        {
            Ok(found) => Ok(Some(found)),
            Err(Error::Corrupt { .. } | Error::OffsetOutOfRange { .. }) => Ok(None),
            Err(Error::InvalidArgument(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The stored record at `phys` (RocketMQ layout, ready to send as is).
    pub fn read(&self, phys: u64, size: u32) -> Result<RecordRef> {
        self.inner.verified(self.inner.log.read(phys, size)?)
    }

    /// The record a consume-queue entry points at.
    pub fn read_entry(&self, e: &CqEntry) -> Result<RecordRef> {
        self.inner
            .verified(self.inner.log.read(e.phys_offset, e.size)?)
    }

    /// The record starting at commit-log offset `phys` (its size from its header),
    /// whether or not it is dispatched yet. An offset that is not a record start
    /// is an error (callers with untrusted offsets check what they got).
    pub fn read_at(&self, phys: u64) -> Result<RecordRef> {
        self.inner.verified(self.inner.log.read_at(phys)?)
    }

    /// Looks a message up by its offset message id (store host + physical offset).
    pub fn read_by_msg_id(&self, msg_id: &str) -> Result<RecordRef> {
        let (_, phys) = record::decode_msg_id(msg_id)?;
        self.read_at(phys)
    }

    /// Messages of `topic` whose `KEYS` (or unique key) include `key`, stored in
    /// `[begin_ms, end_ms]`, newest first, at most `max`.
    pub fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<RecordRef>> {
        let candidates =
            self.inner
                .index
                .query(topic, key, begin_ms, end_ms, max.saturating_mul(4).max(max))?;
        let mut out = Vec::new();
        let min = self.inner.log.min_offset();
        for phys in candidates {
            if phys < min || phys >= self.inner.dispatched.load(Ordering::Acquire) {
                continue;
            }
            let Ok(rec) = self.read_at(phys) else {
                continue;
            };
            let Ok(view) = RecordView::parse(&rec) else {
                continue;
            };
            let ts = view.store_timestamp();
            let matches = view.topic() == topic
                && ts >= begin_ms
                && ts <= end_ms
                && (view.keys().any(|k| k == key)
                    || view.property(record::property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == Some(key));
            if matches {
                out.push(rec);
                if out.len() >= max {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Lowest and one-past-highest offsets of a queue (0, 0 when it does not exist).
    pub fn queue_bounds(&self, topic: &str, queue_id: u32) -> (u64, u64) {
        self.inner
            .queues
            .get(topic, queue_id)
            .map(|q| (q.min_offset(), q.max_offset()))
            .unwrap_or((0, 0))
    }

    /// The first offset of a queue whose message was stored at or after `ts_ms`.
    pub fn queue_offset_by_time(&self, topic: &str, queue_id: u32, ts_ms: i64) -> Result<u64> {
        let Some(q) = self.inner.queues.get(topic, queue_id) else {
            return Ok(0);
        };
        let log = &self.inner.log;
        q.offset_at_or_after_time(ts_ms, |phys, size| {
            let rec = log.read(phys, size)?;
            Ok(RecordView::parse(&rec)?.store_timestamp())
        })
    }

    /// Every (topic, queue id) that has a consume queue.
    pub fn queues(&self) -> Vec<(String, u32)> {
        self.inner
            .queues
            .queues()
            .into_iter()
            .map(|(t, q, _)| (t, q))
            .collect()
    }

    /// Deletes every consume queue of `topic` (the broker calls this when a topic is
    /// deleted). Its records stay in the commit log until retention removes them.
    pub fn remove_topic(&self, topic: &str) -> Result<()> {
        self.inner.queues.remove_topic(topic)
    }

    /// The consume queue a long-polling reader of `(topic, queue_id)` waits on
    /// for new entries ([`ConsumeQueue::arrivals`](crate::store::consume_queue::ConsumeQueue::arrivals)); made (empty, no files) if
    /// the queue has had no message yet.
    pub fn queue_arrivals(
        &self,
        topic: &str,
        queue_id: u32,
    ) -> Result<Arc<crate::store::consume_queue::ConsumeQueue>> {
        self.inner.queues.get_or_create(topic, queue_id)
    }

    /// Whether the log was cut (truncated, or a torn tail cut at recovery) since the
    /// broker last moved positions past the queues' ends back
    /// ([`super::truncate::CUT_MARKER`]).
    pub fn log_was_cut(&self) -> bool {
        self.dir().join(super::truncate::CUT_MARKER).exists()
    }

    /// The broker moved (and persisted) every position past a queue's end: the mark
    /// of [`Store::log_was_cut`] goes.
    pub fn clear_log_cut(&self) -> Result<()> {
        let path = self.dir().join(super::truncate::CUT_MARKER);
        match std::fs::remove_file(&path) {
            Ok(()) => super::checkpoint::sync_dir(self.dir()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&path, e)),
        }
    }

    pub fn positions(&self) -> Positions {
        let i = &self.inner;
        Positions {
            min: i.log.min_offset(),
            flushed: i.log.flushed_offset(),
            written: i.log.max_offset(),
            dispatched: i.dispatched.load(Ordering::Acquire),
        }
    }

    /// Commit-log syncs that made bytes durable so far (group commit shares one
    /// among all the appends that were waiting).
    pub fn sync_count(&self) -> u64 {
        self.inner.durability.sync_count()
    }

    /// Why the store stopped taking writes, if it did: a commit-log sync failed
    /// (or a failed append could not be undone). Nothing is acknowledged after
    /// that until the node restarts and recovers from its last durable point.
    pub fn write_stopped(&self) -> Option<String> {
        self.inner.log.stopped().map(str::to_owned)
    }

    /// Last measured share of the disk in use.
    pub fn disk_usage(&self) -> f64 {
        self.inner.disk_usage_bp.load(Ordering::Relaxed) as f64 / 10_000.0
    }

    /// Records found damaged on read (or not matching their consume-queue entry)
    /// and not served, since the store opened.
    pub fn corrupt_records(&self) -> u64 {
        self.inner.counters.corrupt_records.load(Ordering::Relaxed)
    }

    /// Unread messages deleted for disk space under
    /// [`DiskFullPolicy::DeleteOldest`], since the store opened.
    pub fn unread_dropped(&self) -> u64 {
        self.inner.counters.unread_dropped.load(Ordering::Relaxed)
    }

    /// Tells the store how far consumers have read (the broker's committed
    /// offsets), so disk pressure can tell read messages from unread ones. Until
    /// this is called every message counts as unread. The broker is opened on
    /// top of the store, so it attaches its offsets here rather than at open.
    pub fn follow_progress(&self, progress: Arc<dyn ReadProgress>) {
        *crate::sync::write(&self.inner.progress) = progress;
    }

    /// Runs retention and the disk check now (the maintenance thread does this on its own).
    pub fn run_retention(&self) -> Result<usize> {
        let n = self.inner.retain()?;
        self.inner.check_disk();
        Ok(n)
    }

    /// Waits (without blocking a thread) until every record appended before the call
    /// — durable ones under sync flush — is dispatched, i.e. visible in the consume
    /// queues. `false` if that took longer than `timeout`.
    pub async fn visible(&self, timeout: Duration) -> bool {
        let target = match self.inner.opts.flush {
            FlushMode::Sync { .. } => self.inner.log.flushed_offset(),
            FlushMode::Async { .. } => self.inner.log.max_offset(),
        };
        let mut rx = self.inner.dispatched_tx.subscribe();
        if *rx.borrow() >= target {
            return true;
        }
        self.inner.wake.notify();
        tokio::time::timeout(timeout, rx.wait_for(|d| *d >= target))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Waits until everything appended so far is dispatched (tests and benchmarks).
    pub fn wait_dispatched(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let target = match self.inner.opts.flush {
                FlushMode::Sync { .. } => self.inner.log.flushed_offset(),
                FlushMode::Async { .. } => self.inner.log.max_offset(),
            };
            if self.inner.dispatched.load(Ordering::Acquire) >= target {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.inner.wake.notify();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Simulates a crash for tests: stops the background threads without the final
    /// flush, dispatch or checkpoint, and leaves the abort marker in place.
    #[doc(hidden)]
    pub fn halt_for_tests(&self) {
        let inner = &self.inner;
        if inner.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        inner.wake.notify();
        inner.stop.notify();
        let threads = std::mem::take(&mut *crate::sync::lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        let _ = inner.durability.close();
        if let Some(m) = crate::sync::lock(&self.abort).take() {
            std::mem::forget(m);
        }
        // A crashed process's lock is released by the kernel.
        crate::sync::lock(&self.lock).take();
    }

    /// Stops the background threads, syncs everything, writes the checkpoint and
    /// removes the abort marker. Appends after this fail with [`Error::ShutDown`].
    pub fn close(&self) -> Result<()> {
        let inner = &self.inner;
        if inner.closing.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        inner.wake.notify();
        inner.stop.notify();
        let threads = std::mem::take(&mut *crate::sync::lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        inner.durability.flush_now()?;
        {
            let _g = inner.lock_dispatch();
            inner.dispatch_until(inner.log.max_offset())?;
        }
        inner.checkpoint()?;
        inner.durability.close()?;
        if let Some(m) = crate::sync::lock(&self.abort).take() {
            m.remove()?;
        }
        crate::sync::lock(&self.lock).take();
        Ok(())
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "closing the store failed; the next start will recover");
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .expect("spawning a store thread")
}

impl Inner {
    fn maintain_loop(&self) {
        let tick = self
            .opts
            .checkpoint_interval
            .min(Duration::from_secs(1))
            .min(self.opts.retention_check_interval);
        let mut last_checkpoint = Instant::now();
        let mut last_retention = Instant::now();
        let mut seen = 0;
        while !self.closing.load(Ordering::Acquire) {
            seen = self.stop.wait(seen, tick);
            if self.closing.load(Ordering::Acquire) {
                break;
            }
            if last_checkpoint.elapsed() >= self.opts.checkpoint_interval {
                if let Err(e) = self.checkpoint() {
                    tracing::error!(error = %e, "checkpoint failed");
                }
                last_checkpoint = Instant::now();
            }
            if last_retention.elapsed() >= self.opts.retention_check_interval {
                if let Err(e) = self.retain() {
                    tracing::error!(error = %e, "retention failed");
                }
                last_retention = Instant::now();
            }
            self.check_disk();
            // Cold mapped pages out of the resident set (store::resident).
            self.log.release_cold(super::resident::LOG_KEEP);
            self.queues
                .release_cold_all(super::resident::QUEUE_KEEP_ENTRIES);
        }
    }

    /// Syncs queues and index, then records what is durable.
    fn checkpoint(&self) -> Result<()> {
        let dispatched = self.dispatched.load(Ordering::Acquire);
        self.queues.flush_all()?;
        self.index.flush()?;
        let log_flushed = self.log.flushed_offset();
        Checkpoint {
            version: 1,
            log_flushed,
            // The checkpoint never vouches for queue entries of bytes that are not
            // durable in the log itself.
            dispatched: dispatched.min(log_flushed),
            written_at_ms: self.deps.clock.now_ms(),
        }
        .store_with(&self.dir, &self.deps.files)
    }
}
