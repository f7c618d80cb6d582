//! Replication state of a broker group (docs/replication.md): the role this store
//! plays, the gate every append and dispatch consults, and the master's view of its
//! slaves. The replication channel itself (bytes on a socket) is `rocketgate-remoting`'s
//! `ha` module; the binary connects the two.
//!
//! - [`Gate`]: role (master or read-only slave), and under sync replication the
//!   *confirmed offset* (the high watermark: what `ha.min_in_sync_replicas` copies
//!   hold). A sync send is acknowledged only once the confirmed offset passes it, and
//!   the dispatcher never dispatches past it, so no consumer at any door reads a
//!   message a master crash could take back. Under a controller (docs/controller.md)
//!   the gate also holds the master's **write lease** and can be **fenced**: without a
//!   valid lease nothing is appended or acknowledged ([`crate::Error::NotLeader`]).
//! - [`Group`]: the pure state machine of connected slaves, acks and the in-sync set
//!   (by count, or the controller's set).
//! - [`Replicas`]: a master's [`Group`] bound to its store and gate.

mod group;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use group::{AckError, Group, SlaveState};

use crate::clock::Clock;
use crate::store::Store;

/// What this store is in its broker group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Takes writes; ships its log to slaves.
    Master,
    /// Read-only; its log is appended only from the master at `master` (named in refusals).
    Slave { master: String },
}

/// The replication gate a store consults on every append and dispatch.
#[derive(Debug)]
pub struct Gate {
    role: Role,
    /// Slaves a send needs besides the master (0 = async replication).
    needed: u32,
    timeout: Duration,
    /// The high watermark, published for waiting senders.
    confirmed_tx: tokio::sync::watch::Sender<u64>,
    /// The same, for the dispatcher's hot path.
    confirmed: AtomicU64,
    in_sync: AtomicU32,
    /// Slaves a send can count on (see [`Group::available`]): below `needed`, sends
    /// fail at once.
    available: AtomicU32,
    /// The write lease (controller mode); see [`Lease`].
    lease: Lease,
    /// Set once, for good, when another broker is master at a higher epoch: why.
    fenced: OnceLock<String>,
}

/// A master's write lease under a controller (docs/controller.md, "The lease rule"):
/// renewed by each controller answer, it must be valid when a write is appended and
/// again when it is acknowledged. Lock-free: read on every append.
#[derive(Debug)]
struct Lease {
    /// Off: no controller, writes need no lease (the default).
    on: AtomicBool,
    /// Where deadlines are counted from.
    base: Instant,
    /// The lease's end, ns after `base`; 0 (the start) = never granted.
    until_ns: AtomicU64,
    /// Renewed at least once.
    granted: AtomicBool,
}

impl Lease {
    fn new() -> Lease {
        Lease {
            on: AtomicBool::new(false),
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
            granted: AtomicBool::new(false),
        }
    }

    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Why a write may not be taken now, `None` while the lease holds (or is off).
    fn refusal(&self) -> Option<String> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        let now = self.ns(Instant::now());
        let until = self.until_ns.load(Ordering::Acquire);
        if now < until {
            return None;
        }
        Some(if self.granted.load(Ordering::Acquire) {
            let ago = Duration::from_nanos(now - until);
            format!(
                "this broker's master lease expired {ago:.1?} ago (no answer from a controller majority since)"
            )
        } else {
            "this broker holds no master lease yet (no controller majority has answered it)"
                .to_owned()
        })
    }
}

impl Gate {
    /// A master acking after `min_in_sync_replicas` copies (1 = async), waiting at most
    /// `timeout` for them; `end` is its log end (already confirmed).
    pub fn master(min_in_sync_replicas: u32, timeout: Duration, end: u64) -> Gate {
        let (confirmed_tx, _) = tokio::sync::watch::channel(end);
        Gate {
            role: Role::Master,
            needed: min_in_sync_replicas.saturating_sub(1),
            timeout,
            confirmed_tx,
            confirmed: AtomicU64::new(end),
            in_sync: AtomicU32::new(0),
            available: AtomicU32::new(0),
            lease: Lease::new(),
            fenced: OnceLock::new(),
        }
    }

    /// A read-only slave of `master`.
    pub fn slave(master: impl Into<String>) -> Gate {
        let (confirmed_tx, _) = tokio::sync::watch::channel(0);
        Gate {
            role: Role::Slave {
                master: master.into(),
            },
            needed: 0,
            timeout: Duration::ZERO,
            confirmed_tx,
            confirmed: AtomicU64::new(0),
            in_sync: AtomicU32::new(0),
            available: AtomicU32::new(0),
            lease: Lease::new(),
            fenced: OnceLock::new(),
        }
    }

    /// Controller mode: writes need the lease, which starts expired — nothing is taken
    /// until the first [`Gate::set_lease_deadline`].
    pub fn with_lease(self) -> Gate {
        self.lease.on.store(true, Ordering::Release);
        self
    }

    /// Renews the write lease until `deadline` (count it from when the heartbeat the
    /// controller answered was *sent*: docs/controller.md, "The lease rule"), or turns
    /// the lease off (`None`: writes need no lease, as without a controller). The last
    /// call wins: an earlier deadline shortens the lease.
    pub fn set_lease_deadline(&self, deadline: Option<Instant>) {
        match deadline {
            Some(d) => {
                // A deadline at or before `base` is 1 ns, expired like "never granted"
                // but reported as an expiry.
                let ns = self.lease.ns(d).max(1);
                self.lease.until_ns.store(ns, Ordering::Release);
                self.lease.granted.store(true, Ordering::Release);
                self.lease.on.store(true, Ordering::Release);
            }
            None => self.lease.on.store(false, Ordering::Release),
        }
    }

    /// Whether writes need the lease now.
    pub fn is_leased(&self) -> bool {
        self.lease.on.load(Ordering::Acquire)
    }

    /// The lease's end when on and granted (for status pages).
    pub fn lease_deadline(&self) -> Option<Instant> {
        if !self.is_leased() || !self.lease.granted.load(Ordering::Acquire) {
            return None;
        }
        let ns = self.lease.until_ns.load(Ordering::Acquire);
        Some(self.lease.base + Duration::from_nanos(ns))
    }

    /// Stops taking writes for good (until the process restarts): another broker is
    /// master at a higher epoch. `reason` goes into every refusal. Only the first
    /// call's reason is kept.
    pub fn fence(&self, reason: impl Into<String>) {
        let _ = self.fenced.set(reason.into());
    }

    /// Why the gate was fenced, if it was.
    pub fn fenced(&self) -> Option<&str> {
        self.fenced.get().map(String::as_str)
    }

    pub fn role(&self) -> &Role {
        &self.role
    }

    /// Whether sends wait for slaves (and reads stop at the confirmed offset).
    pub fn is_sync(&self) -> bool {
        self.needed > 0 && self.role == Role::Master
    }

    /// The high watermark.
    pub fn confirmed(&self) -> u64 {
        self.confirmed.load(Ordering::Acquire)
    }

    /// Slaves in sync now (under a controller: members of its set in sync).
    pub fn in_sync(&self) -> u32 {
        self.in_sync.load(Ordering::Acquire)
    }

    /// Copies (master included) a send needs.
    pub fn required_copies(&self) -> u32 {
        self.needed + 1
    }

    /// Publishes the group's state; whether the confirmed offset moved.
    fn publish(&self, confirmed: u64, in_sync: u32, available: u32) -> bool {
        self.in_sync.store(in_sync, Ordering::Release);
        self.available.store(available, Ordering::Release);
        let before = self.confirmed.fetch_max(confirmed, Ordering::AcqRel);
        if confirmed > before {
            self.confirmed_tx.send_replace(confirmed);
        }
        confirmed > before
    }

    /// Why this master may not take or acknowledge writes now: fenced, or its lease
    /// (controller mode) expired.
    fn not_leader(&self) -> Option<String> {
        if let Some(why) = self.fenced.get() {
            return Some(format!("this broker was fenced as master ({why})"));
        }
        self.lease.refusal()
    }

    /// The refusal of a write at append time: to a slave, or to a master that is
    /// fenced or without a valid lease; `None` when it may be appended.
    pub(crate) fn refuse_write(&self) -> Option<crate::Error> {
        match &self.role {
            Role::Slave { master } => Some(crate::Error::ReadOnlyReplica {
                master: master.clone(),
            }),
            Role::Master => self.not_leader().map(|why| crate::Error::NotLeader {
                reason: format!("{why}; not taking writes"),
            }),
        }
    }

    /// The last check before an appended write is acknowledged: the lease must still
    /// hold (its copies may have arrived after it expired — another master may be
    /// taking writes by now). The write is in the log: its outcome is unknown.
    fn check_ack(&self) -> crate::Result<()> {
        match self.not_leader() {
            None => Ok(()),
            Some(why) => Err(crate::Error::NotLeader {
                reason: format!(
                    "{why}; this write is in the log but not acknowledged: its outcome is unknown"
                ),
            }),
        }
    }

    /// Fails at once when fewer slaves than needed can hold a send.
    fn check_available(&self) -> crate::Result<()> {
        let available = self.available.load(Ordering::Acquire);
        if available < self.needed {
            return Err(crate::Error::NoInSyncReplica {
                needed: self.required_copies(),
                in_sync: available,
            });
        }
        Ok(())
    }

    /// Waits until the confirmed offset reaches `end` (sync replication only), then
    /// checks the lease again ([`crate::Error::NotLeader`]; also in async mode).
    /// Fails at once when fewer slaves than needed are in sync (or, under a
    /// controller, in its set) ([`crate::Error::NoInSyncReplica`]), and after the
    /// timeout with [`crate::Error::ReplicationTimeout`].
    pub(crate) async fn wait_replicated(&self, end: u64) -> crate::Result<()> {
        if !self.is_sync() || self.confirmed() >= end {
            return self.check_ack();
        }
        self.check_available()?;
        let mut rx = self.confirmed_tx.subscribe();
        let wait = rx.wait_for(|c| *c >= end);
        match tokio::time::timeout(self.timeout, wait).await {
            Ok(Ok(_)) => self.check_ack(),
            Ok(Err(_)) => Err(crate::Error::ShutDown),
            Err(_) => Err(crate::Error::ReplicationTimeout {
                offset: end,
                confirmed: self.confirmed(),
                waited: self.timeout,
            }),
        }
    }

    /// Blocking twin of [`Gate::wait_replicated`] for the store's synchronous API.
    pub(crate) fn wait_replicated_blocking(&self, end: u64) -> crate::Result<()> {
        if !self.is_sync() || self.confirmed() >= end {
            return self.check_ack();
        }
        self.check_available()?;
        let deadline = std::time::Instant::now() + self.timeout;
        while std::time::Instant::now() < deadline {
            if self.confirmed() >= end {
                return self.check_ack();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Err(crate::Error::ReplicationTimeout {
            offset: end,
            confirmed: self.confirmed(),
            waited: self.timeout,
        })
    }
}

/// The least time a slave may stay short of its catch-up target (see [`Replicas::new`]).
const MIN_LAG_TIME: Duration = Duration::from_secs(1);

/// One slave as operators see it (`GET /v1/cluster`, `/metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlaveStatus {
    pub broker_id: u64,
    pub peer: String,
    pub acked: u64,
    pub lag_bytes: u64,
    pub lag_ms: u64,
    pub in_sync: bool,
}

/// A master's slaves bound to its store: what the replication server reports goes
/// through here into the [`Group`] and out to the store's [`Gate`].
pub struct Replicas {
    store: Arc<Store>,
    gate: Arc<Gate>,
    /// The group's state; a std lock held only for a state-machine step, never
    /// across an await.
    group: Mutex<Group>,
    clock: Arc<dyn Clock>,
    /// Counts slaves that joined (what is written to the log for slaves waits for one).
    joins: tokio::sync::watch::Sender<u64>,
}

impl Replicas {
    /// Binds the group to `store`, whose gate must be a master's. A slave may trail
    /// `max_lag` bytes, and stay short of the master's end it is catching up to for
    /// the gate's sync timeout (at least 1 s), and still be kept in or proposed for a
    /// controller's in-sync set ([`Replicas::proposal`]).
    pub fn new(store: Arc<Store>, gate: Arc<Gate>, max_lag: u64, clock: Arc<dyn Clock>) -> Self {
        let end = store.shippable_end();
        let lag_time = gate.timeout.max(MIN_LAG_TIME);
        let group = Group::new(gate.needed as usize, max_lag, end)
            .with_max_lag_time(i64::try_from(lag_time.as_millis()).unwrap_or(i64::MAX));
        Replicas {
            group: Mutex::new(group),
            store,
            gate,
            clock,
            joins: tokio::sync::watch::channel(0).0,
        }
    }

    /// Changes every time a slave joins.
    pub fn watch_joins(&self) -> tokio::sync::watch::Receiver<u64> {
        self.joins.subscribe()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    fn step<T>(&self, f: impl FnOnce(&mut Group, u64, i64) -> T) -> T {
        let end = self.store.shippable_end();
        let now = self.clock.now_ms();
        let (out, confirmed, in_sync, available) = {
            let mut g = crate::sync::lock(&self.group);
            let out = f(&mut g, end, now);
            (out, g.confirmed(), g.in_sync(), g.available())
        };
        // The dispatcher follows the confirmed offset only under sync replication
        // (`dispatch_limit`); under async a wake per slave ack (one a millisecond
        // under load) only took the dispatch lock from the appenders.
        if self.gate.publish(confirmed, in_sync, available) && self.gate.is_sync() {
            self.store.replication_moved();
        }
        out
    }

    /// A slave connected with its log ending at `offset`.
    pub fn joined(&self, conn: u64, broker_id: u64, peer: String, offset: u64) {
        self.step(|g, end, now| {
            g.joined(conn, broker_id, peer, offset, now);
            g.refresh(end, now);
        });
        self.joins.send_modify(|n| *n += 1);
    }

    /// A slave reports its log end; refused (and nothing changes) beyond the master's.
    pub fn acked(&self, conn: u64, offset: u64) -> Result<(), AckError> {
        self.step(|g, end, now| g.acked(conn, offset, end, now))
    }

    /// A slave's connection ended.
    pub fn left(&self, conn: u64) {
        self.step(|g, end, now| g.left(conn, end, now));
    }

    /// Re-evaluates the in-sync set as the master's log moves (call periodically).
    pub fn tick(&self) {
        self.step(|g, end, now| g.refresh(end, now));
    }

    /// Under a controller: confirms by the controller's in-sync set `members` (slave
    /// broker ids, **the master excluded**) at sync epoch `epoch` — every member must
    /// hold a message before it is acknowledged, a member not connected holds
    /// everything back, and a send fails at once when the set plus the master is below
    /// `min_in_sync_replicas`. `None`: back to the count rule (no controller). Call it
    /// with the set of every controller answer (heartbeats, and the answer to a
    /// [`Replicas::proposal`]). A set older than the one held (lower epoch) is ignored
    /// and `false` returned. The confirmed offset never moves back.
    pub fn set_members(&self, members: Option<(BTreeSet<u64>, u64)>) -> bool {
        self.step(|g, end, now| g.set_members(members, end, now))
    }

    /// The controller's set and its epoch this master confirms by, if any.
    pub fn members(&self) -> Option<(BTreeSet<u64>, u64)> {
        let g = crate::sync::lock(&self.group);
        g.members().map(|(ids, epoch)| (ids.clone(), epoch))
    }

    /// The in-sync set to ask the controller for (`CONTROLLER_ALTER_SYNC_STATE_SET`,
    /// with the master's own id added), `None` when the current one is right or no
    /// controller set is held. Drops a member that is not connected, trails by more
    /// than `max_lag` bytes, or has stayed short of the master's end it is catching
    /// up to for longer than the lag time; adds a connected slave that is none of
    /// that and holds the confirmed offset. The slaves it adds count for confirmation
    /// at once, until the set's epoch moves: the controller may accept at any moment
    /// (also after a timeout), and then they must already hold every acknowledged
    /// message. A proposed slave that is no longer fit is left out of the next answer
    /// even when that equals the current set: accepted, it moves the epoch and
    /// retires the earlier proposal. Call it every 100–200 ms, one proposal in flight
    /// at a time, each sent with the sync epoch it was made at
    /// ([`Replicas::members`]).
    pub fn proposal(&self) -> Option<BTreeSet<u64>> {
        self.step(|g, end, now| g.proposal(end, now))
    }

    /// Every connected slave with its lag.
    pub fn status(&self) -> Vec<SlaveStatus> {
        let end = self.store.shippable_end();
        let now = self.clock.now_ms();
        let g = crate::sync::lock(&self.group);
        g.slaves()
            .map(|(_, s)| SlaveStatus {
                broker_id: s.broker_id,
                peer: s.peer.clone(),
                acked: s.acked,
                lag_bytes: end.saturating_sub(s.acked),
                lag_ms: if s.acked >= end {
                    0
                } else {
                    now.saturating_sub(s.caught_up_at_ms).max(0) as u64
                },
                in_sync: s.in_sync,
            })
            .collect()
    }
}
