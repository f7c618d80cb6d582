//! Durability of the commit log: a flusher thread that msyncs what was written
//! and advances the durable position, in `Sync` mode on demand with group
//! commit (every appender waiting shares the next msync), in `Async` mode on a
//! timer. This module owns *when* to flush and who is told; *how* (msync of the
//! dirty ranges, the directory fsync) is [`CommitLog::flush`].
//!
//! An appender under sync flush calls [`GroupCommit::wait_durable`] (blocking)
//! or [`GroupCommit::wait_durable_async`] (tokio) with its
//! [`AppendResult::end_offset`](crate::store::commit_log::AppendResult). A failed
//! msync is an error to every waiter whose offset it covered, never an
//! acknowledgement. A target may then refuse to sync again
//! ([`FlushTarget::stopped`]): the commit log does, because a retried `fsync`
//! that succeeds proves nothing about pages the kernel dropped after the failed
//! one; the flusher then stops trying until close. Other targets are retried.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::store::commit_log::CommitLog;

/// When the flusher runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    /// On demand: whenever someone waits for durability (group commit).
    Sync,
    /// Every `interval`; appends are acknowledged without waiting.
    Async { interval: Duration },
}

/// Most yields a sync round waits for appends under way to join it.
const GATHER_YIELDS: usize = 8;

/// Pause before retrying after a failed msync, so a broken disk is not spun on.
const RETRY_BACKOFF: Duration = Duration::from_millis(10);

/// What the flusher makes durable: the commit log, or a twin in tests.
pub trait FlushTarget: Send + Sync + 'static {
    /// End of what has been written.
    fn written_offset(&self) -> u64;
    /// End of what is durable.
    fn durable_offset(&self) -> u64;
    /// Makes everything written so far durable; returns the new durable offset.
    fn sync(&self) -> Result<u64>;
    /// Whether a failed sync stopped it for good (no round can succeed).
    fn stopped(&self) -> bool {
        false
    }
}

impl FlushTarget for CommitLog {
    fn written_offset(&self) -> u64 {
        self.max_offset()
    }
    fn durable_offset(&self) -> u64 {
        self.flushed_offset()
    }
    fn sync(&self) -> Result<u64> {
        self.flush()
    }
    fn stopped(&self) -> bool {
        CommitLog::stopped(self).is_some()
    }
}

/// A flush round that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushFailure {
    /// The round number (see [`Durable::round`]).
    pub round: u64,
    /// Written position when the round started: waiters at or below it fail.
    pub covered: u64,
    pub message: String,
}

/// The durability state published to async waiters and observers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Durable {
    pub offset: u64,
    /// Flush rounds completed (successful or not).
    pub round: u64,
    /// The most recent failed round, if any.
    pub failure: Option<FlushFailure>,
    pub closed: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Highest offset a waiter asked for.
    requested: u64,
    /// Rounds completed.
    round: u64,
    failure: Option<FlushFailure>,
    /// Rounds that moved the durable position (msync calls that did work).
    syncs: u64,
    /// The flusher thread is told to stop.
    shutdown: bool,
    /// `close` finished its final flush: waiters still short of durable give up.
    closed: bool,
}

struct Shared<L> {
    log: Arc<L>,
    mode: FlushMode,
    /// The flusher's bookkeeping. Held only to read or update it, never across
    /// the msync itself nor an `.await`; waiters sleep on the condvars.
    state: Mutex<State>,
    /// Wakes the flusher (a waiter asked, or shutdown).
    wake_flusher: Condvar,
    /// Wakes blocking waiters after every round.
    round_done: Condvar,
    /// The same news for async waiters.
    durable_tx: watch::Sender<Durable>,
    /// Called after every round, outside the state lock.
    on_round: Box<dyn Fn() + Send + Sync>,
}

impl<L: FlushTarget> Shared<L> {
    fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// One flush round: sync, record the outcome, tell every waiter.
    fn round(&self) -> Result<u64> {
        let covered = self.log.written_offset();
        let before = self.log.durable_offset();
        let started = std::time::Instant::now();
        let result = self.log.sync();
        if !matches!(result, Ok(d) if d <= before) {
            // Rounds with nothing to sync are not flushes.
            crate::store::meters::FLUSH.record_since(started);
        }
        let mut st = self.lock();
        st.round += 1;
        match &result {
            Ok(durable) if *durable > before => st.syncs += 1,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, covered, "commit log flush failed; will retry");
                st.failure = Some(FlushFailure {
                    round: st.round,
                    covered,
                    message: e.to_string(),
                });
            }
        }
        let durable = Durable {
            offset: self.log.durable_offset(),
            round: st.round,
            failure: st.failure.clone(),
            closed: st.closed,
        };
        drop(st);
        self.durable_tx.send_replace(durable);
        self.round_done.notify_all();
        (self.on_round)();
        result
    }

    fn run(&self) {
        loop {
            let mut st = self.lock();
            match self.mode {
                FlushMode::Sync => {
                    while !st.shutdown && st.requested <= self.log.durable_offset() {
                        st = self
                            .wake_flusher
                            .wait(st)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                }
                FlushMode::Async { interval } => {
                    if !st.shutdown {
                        st = self
                            .wake_flusher
                            .wait_timeout(st, interval)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                }
            }
            if st.shutdown {
                return; // close() does the final flush
            }
            drop(st);
            if self.mode == FlushMode::Sync {
                self.gather();
            }
            if self.round().is_err() {
                let mut st = self.lock();
                if self.log.stopped() {
                    // Nothing can be made durable any more: wait for close
                    // rather than fail (and log) a round every few ms.
                    while !st.shutdown {
                        st = self
                            .wake_flusher
                            .wait(st)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                    return;
                }
                if !st.shutdown {
                    let _ = self.wake_flusher.wait_timeout(st, RETRY_BACKOFF);
                }
            }
        }
    }

    /// Lets appends that are already under way join the round about to start:
    /// yields while the written position still moves (a few times at most). The
    /// first waiter wakes the flusher at once, but the producers woken by the
    /// previous round are still appending; without this a round often covers
    /// half of them and the other half waits a whole extra sync.
    fn gather(&self) {
        let mut seen = self.log.written_offset();
        for _ in 0..GATHER_YIELDS {
            std::thread::yield_now();
            let now = self.log.written_offset();
            if now == seen {
                break;
            }
            seen = now;
        }
    }

    /// Ok(true) if durable, Ok(false) to keep waiting, Err for a failure that
    /// covers `offset` in a round after `since_round`.
    fn check(&self, st: &State, offset: u64, since_round: u64) -> Result<bool> {
        if self.log.durable_offset() >= offset {
            return Ok(true);
        }
        if let Some(f) = &st.failure
            && f.round > since_round
            && f.covered >= offset
        {
            return Err(Error::FlushFailed(f.message.clone()));
        }
        if self.log.stopped() {
            // Not durable now and never will be in this process.
            return Err(Error::FlushFailed(
                "writes are stopped after a failed sync; restart the node to recover from its last durable point".into(),
            ));
        }
        if st.closed {
            return Err(Error::ShutDown);
        }
        Ok(false)
    }

    /// Registers interest in `offset` and wakes the flusher; returns the round
    /// count at that moment.
    fn request(&self, st: &mut State, offset: u64) -> Result<u64> {
        let written = self.log.written_offset();
        if offset > written {
            return Err(Error::InvalidArgument(format!(
                "cannot wait for offset {offset}: only {written} is written"
            )));
        }
        if st.requested < offset {
            st.requested = offset;
            self.wake_flusher.notify_one();
        }
        Ok(st.round)
    }
}

/// The commit log's flusher (group commit). Dropping it (or [`close`](Self::close))
/// flushes what is written and stops the thread.
pub struct GroupCommit<L: FlushTarget = CommitLog> {
    shared: Arc<Shared<L>>,
    /// Taken by `close`; a Mutex so `close` works through `&self`.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<L: FlushTarget> GroupCommit<L> {
    /// Starts the flusher thread for `log`.
    pub fn start(log: Arc<L>, mode: FlushMode) -> Result<Self> {
        Self::start_with(log, mode, || {})
    }

    /// Like [`start`](Self::start), and calls `on_round` after every flush round
    /// (on the flusher thread; keep it short), e.g. to wake a reader of durable bytes.
    pub fn start_with(
        log: Arc<L>,
        mode: FlushMode,
        on_round: impl Fn() + Send + Sync + 'static,
    ) -> Result<Self> {
        let durable = Durable {
            offset: log.durable_offset(),
            ..Durable::default()
        };
        let shared = Arc::new(Shared {
            log,
            mode,
            state: Mutex::new(State::default()),
            wake_flusher: Condvar::new(),
            round_done: Condvar::new(),
            durable_tx: watch::Sender::new(durable),
            on_round: Box::new(on_round),
        });
        let runner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("commitlog-flush".into())
            .spawn(move || runner.run())
            .map_err(|e| Error::FlushFailed(format!("cannot start the flusher thread: {e}")))?;
        Ok(GroupCommit {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn mode(&self) -> FlushMode {
        self.shared.mode
    }

    pub fn log(&self) -> &Arc<L> {
        &self.shared.log
    }

    /// Blocks until everything below `offset` is durable (sharing the msync
    /// with every other waiter), a flush covering it fails, or `timeout` passes
    /// ([`Error::FlushTimeout`]).
    pub fn wait_durable(&self, offset: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let shared = &self.shared;
        let mut st = shared.lock();
        let since = shared.request(&mut st, offset)?;
        loop {
            if shared.check(&st, offset, since)? {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::FlushTimeout {
                    offset,
                    durable: shared.log.durable_offset(),
                    waited: timeout,
                });
            }
            st = shared
                .round_done
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Async twin of [`wait_durable`](Self::wait_durable) for tokio tasks; wrap
    /// it in `tokio::time::timeout` to bound the wait. Takes the state lock only
    /// briefly, never across the await.
    pub async fn wait_durable_async(&self, offset: u64) -> Result<()> {
        let shared = &self.shared;
        let mut rx = shared.durable_tx.subscribe();
        let since = {
            let mut st = shared.lock();
            shared.request(&mut st, offset)?
        };
        loop {
            {
                let st = shared.lock();
                if shared.check(&st, offset, since)? {
                    return Ok(());
                }
            }
            if rx.changed().await.is_err() {
                return Err(Error::ShutDown);
            }
        }
    }

    /// Durability updates, one per flush round.
    pub fn subscribe(&self) -> watch::Receiver<Durable> {
        self.shared.durable_tx.subscribe()
    }

    /// Flushes now, on the caller's thread (e.g. at shutdown).
    pub fn flush_now(&self) -> Result<u64> {
        self.shared.round()
    }

    /// Flush rounds that made something durable (each is one msync pass).
    pub fn sync_count(&self) -> u64 {
        self.shared.lock().syncs
    }

    /// Stops the flusher thread and flushes what is written. Idempotent.
    pub fn close(&self) -> Result<u64> {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            self.shared.wake_flusher.notify_all();
        }
        let handle = crate::sync::lock(&self.thread).take();
        if let Some(handle) = handle
            && handle.join().is_err()
        {
            tracing::error!("the commit log flusher thread panicked");
        }
        let result = self.shared.round();
        self.shared.lock().closed = true;
        self.shared.durable_tx.send_modify(|d| d.closed = true);
        self.shared.round_done.notify_all();
        result
    }
}

impl<L: FlushTarget> Drop for GroupCommit<L> {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "final commit log flush failed");
        }
    }
}

#[cfg(test)]
mod tests;
