//! Replication state of a broker group (docs/replication.md): the role this store
//! plays, the gate every append and dispatch consults, and the master's view of its
//! slaves. The replication channel itself (bytes on a socket) is `rocketgate-remoting`'s
//! `ha` module; the binary connects the two.
//!
//! - [`Gate`]: role (master or read-only slave), and under sync replication the
//!   *confirmed offset* (the high watermark: what `ha.min_in_sync_replicas` copies
//!   hold). A sync send is acknowledged only once the confirmed offset passes it, and
//!   the dispatcher never dispatches past it, so no consumer at any door reads a
//!   message a master crash could take back.
//! - [`Group`]: the pure state machine of connected slaves, acks and the in-sync set.
//! - [`Replicas`]: a master's [`Group`] bound to its store and gate.

mod group;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        }
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

    /// Slaves in sync now.
    pub fn in_sync(&self) -> u32 {
        self.in_sync.load(Ordering::Acquire)
    }

    /// Copies (master included) a send needs.
    pub fn required_copies(&self) -> u32 {
        self.needed + 1
    }

    fn publish(&self, confirmed: u64, in_sync: u32) {
        self.in_sync.store(in_sync, Ordering::Release);
        let before = self.confirmed.fetch_max(confirmed, Ordering::AcqRel);
        if confirmed > before {
            self.confirmed_tx.send_replace(confirmed);
        }
    }

    /// The refusal of a write to a slave, `None` on a master.
    pub(crate) fn refuse_write(&self) -> Option<crate::Error> {
        match &self.role {
            Role::Slave { master } => Some(crate::Error::ReadOnlyReplica {
                master: master.clone(),
            }),
            Role::Master => None,
        }
    }

    /// Waits until the confirmed offset reaches `end` (sync replication only).
    /// Fails at once when fewer slaves than needed are in sync
    /// ([`crate::Error::NoInSyncReplica`]), and after the timeout with
    /// [`crate::Error::ReplicationTimeout`].
    pub(crate) async fn wait_replicated(&self, end: u64) -> crate::Result<()> {
        if !self.is_sync() || self.confirmed() >= end {
            return Ok(());
        }
        let in_sync = self.in_sync();
        if in_sync < self.needed {
            return Err(crate::Error::NoInSyncReplica {
                needed: self.required_copies(),
                in_sync,
            });
        }
        let mut rx = self.confirmed_tx.subscribe();
        let wait = rx.wait_for(|c| *c >= end);
        match tokio::time::timeout(self.timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
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
            return Ok(());
        }
        let in_sync = self.in_sync();
        if in_sync < self.needed {
            return Err(crate::Error::NoInSyncReplica {
                needed: self.required_copies(),
                in_sync,
            });
        }
        let deadline = std::time::Instant::now() + self.timeout;
        while std::time::Instant::now() < deadline {
            if self.confirmed() >= end {
                return Ok(());
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
    /// Binds the group to `store`, whose gate must be a master's.
    pub fn new(store: Arc<Store>, gate: Arc<Gate>, max_lag: u64, clock: Arc<dyn Clock>) -> Self {
        let end = store.shippable_end();
        Replicas {
            group: Mutex::new(Group::new(gate.needed as usize, max_lag, end)),
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

    fn step(&self, f: impl FnOnce(&mut Group, u64, i64)) {
        let end = self.store.shippable_end();
        let now = self.clock.now_ms();
        let (confirmed, in_sync) = {
            let mut g = crate::sync::lock(&self.group);
            f(&mut g, end, now);
            (g.confirmed(), g.in_sync())
        };
        self.gate.publish(confirmed, in_sync);
        self.store.replication_moved();
    }

    /// A slave connected with its log ending at `offset`.
    pub fn joined(&self, conn: u64, broker_id: u64, peer: String, offset: u64) {
        self.step(|g, end, now| {
            g.joined(conn, broker_id, peer, offset, now);
            g.refresh(end);
        });
        self.joins.send_modify(|n| *n += 1);
    }

    /// A slave reports its log end; refused (and nothing changes) beyond the master's.
    pub fn acked(&self, conn: u64, offset: u64) -> Result<(), AckError> {
        let mut out = Ok(());
        self.step(|g, end, now| out = g.acked(conn, offset, end, now));
        out
    }

    /// A slave's connection ended.
    pub fn left(&self, conn: u64) {
        self.step(|g, end, _| g.left(conn, end));
    }

    /// Re-evaluates the in-sync set as the master's log moves (call periodically).
    pub fn tick(&self) {
        self.step(|g, end, _| g.refresh(end));
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
