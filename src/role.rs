//! The broker's side of the controller (docs/controller.md, "The broker's side"): with
//! `controller.addresses` set, the controller — not `broker.id` — decides whether this
//! broker is its group's master or a slave, and this module acts on it.
//!
//! The supervisor ([`run`]) loops over **incarnations** of the broker part of the node
//! ([`BrokerNode`]). A heartbeat task, beside them and running through restarts, registers
//! with the controller leader and heartbeats every `controller.heartbeat_interval` (every
//! 100 ms while a slave has lost its master). The supervisor starts the node in the role
//! the latest answer gives (a master registers with the NameServers as id 0; a slave
//! follows the master's replication port the answer names), then follows the answers
//! until one of these ends the incarnation:
//!
//! - the answer names another master or a higher master epoch: a master is **fenced** at
//!   once (its gate refuses every write and every pending acknowledgement), then the node
//!   stops and starts again in the new role;
//! - the replication handshake says this node's log diverged from the new master's (an
//!   old master's unreplicated tail): the node stops, the log is cut **durably** at the
//!   last common offset (`store::truncate`, crash-safe), the epoch file is trimmed, and the
//!   node starts again as a slave;
//! - shutdown.
//!
//! Decision: a change of role restarts the broker part in-process (doors closed and
//! reopened on the same ports, store closed and reopened) instead of switching every
//! component in place. Each role then runs exactly the code paths a statically
//! configured master or slave runs — already tested — and nothing carries state of the
//! old role into the new one. Clients see their connections close once and reconnect,
//! which a change of master forces on them anyway. The cost is the restart time, part of
//! the measured failover time (docs/benchmarks.md).
//!
//! As master, each heartbeat answer renews the **write lease** (counted from when the
//! heartbeat was sent, two thirds of the controllers' `broker_timeout`): a master that
//! cannot reach a controller majority stops acknowledging before the controllers may
//! elect another. Every 200 ms it also keeps the controller's in-sync set in step with
//! its slaves (shrink a member that fell behind, add one that caught up), and its gate
//! confirms an offset only once every member of that set holds it.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rocketgate_config::{Config, ControllerConfig};
use rocketgate_controller::wire::ReplicaInfo;
use rocketgate_controller::{ControllerClient, Heartbeat};
use rocketgate_core::store::epoch::EpochFile;
use tokio::sync::{mpsc, watch};

use crate::node::{BrokerNode, NodeParts};

/// The role an answer gives this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Assigned {
    Master { epoch: u64 },
    Slave { epoch: u64, master_ha: String },
}

impl Assigned {
    fn of(info: &ReplicaInfo, id: u64) -> Option<Assigned> {
        let epoch = info.master_epoch;
        match info.master_id {
            Some(m) if m == id => Some(Assigned::Master { epoch }),
            Some(_) => info
                .master_ha_address
                .clone()
                .filter(|a| !a.is_empty())
                .map(|master_ha| Assigned::Slave { epoch, master_ha }),
            None => None,
        }
    }

    fn epoch(&self) -> u64 {
        match self {
            Assigned::Master { epoch } | Assigned::Slave { epoch, .. } => *epoch,
        }
    }
}

/// How often a slave whose master is gone asks the controller who is master now.
const FAST_POLL: Duration = Duration::from_millis(100);

/// Why an incarnation ended.
enum End {
    Shutdown,
    Reassigned,
    Truncate(u64),
}

/// A TCP port 0 in `addr` replaced by a free one, so the controller and the NameServers
/// get the address the node will bind in every incarnation.
fn resolve(addr: std::net::SocketAddr) -> anyhow::Result<std::net::SocketAddr> {
    if addr.port() != 0 {
        return Ok(addr);
    }
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    Ok(l.local_addr()?)
}

/// Runs the broker part under the controller until `shutdown`.
pub async fn run(
    mut base: Config,
    mut parts: NodeParts,
    shutdown: impl Future<Output = ()>,
    ready: String,
) -> anyhow::Result<()> {
    let every = base.controller.heartbeat_interval;
    // A heartbeat retried for longer than its period only delays the next one.
    let client = ControllerClient::parse(&base.controller.addresses)?
        .with_timeouts(every.min(Duration::from_secs(1)), every);
    let client = Arc::new(match crate::controller::dialer(&base)? {
        Some(tls) => client.with_tls(tls),
        None => client,
    });
    base.listen.native = resolve(base.listen.native)?;
    base.listen.ha = resolve(base.listen.ha)?;
    let epochs = EpochFile::open(&base.data_dir)
        .with_context(|| format!("opening the epoch file in {}", base.data_dir.display()))?;
    let last_epoch = epochs.last().map_or(0, |e| e.epoch);
    let known_epoch = Arc::new(AtomicU64::new(last_epoch));
    let epochs = Arc::new(std::sync::Mutex::new(epochs));
    let (truncate_tx, mut truncate_rx) = mpsc::unbounded_channel();
    parts.controlled = Some(crate::ha::Epochs {
        known: known_epoch.clone(),
        file: epochs.clone(),
        truncate: truncate_tx,
    });
    let me = Arc::new(Me {
        group: base.broker.name.clone(),
        id: base.broker.id,
        addr: base.advertised_native(),
        ha_addr: base.advertised_ha(),
        default_lease: ControllerConfig::lease_for(base.controller.broker_timeout),
        every,
    });
    // The heartbeats run beside the incarnations, through restarts too: a broker that is
    // restarting in a new role is alive, and the controllers must not elect another in
    // its place because it went quiet for the restart.
    let beat = Arc::new(BeatState {
        log_end: AtomicU64::new(0),
        epoch: AtomicU64::new(last_epoch),
        fast: std::sync::atomic::AtomicBool::new(false),
    });
    let (answers_tx, mut answers) = watch::channel(None);
    let beater = tokio::spawn(heartbeats(
        client.clone(),
        me.clone(),
        beat.clone(),
        known_epoch.clone(),
        answers_tx,
    ));
    let _beater = AbortOnDrop(beater);
    tokio::pin!(shutdown);
    let mut printed = false;
    loop {
        // 1. The role, from the latest answer (waiting for one that names a master).
        let (info, sent) = loop {
            if let Some((info, sent)) = answers.borrow_and_update().clone()
                && Assigned::of(&info, me.id).is_some()
            {
                break (info, sent);
            }
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                r = answers.changed() => if r.is_err() {
                    anyhow::bail!("the controller heartbeat task ended");
                },
            }
        };
        let role = Assigned::of(&info, me.id).expect("checked above");
        let mut config = base.clone();
        match &role {
            Assigned::Master { .. } => {
                config.broker.id = 0;
                config.ha.master.clear();
            }
            Assigned::Slave { master_ha, .. } => config.ha.master = master_ha.clone(),
        }
        tracing::info!(group = %me.group, id = me.id, ?role, sync_set = ?info.sync_state_set, "controller: starting as assigned");
        // 2. The node in that role (a master's gate refuses writes until its lease).
        let node = BrokerNode::start(&mut config, &parts).await?;
        base.listen = config.listen.clone();
        beat.epoch.store(role.epoch(), Ordering::Release);
        beat.log_end
            .store(node.broker().store().positions().written, Ordering::Release);
        if let Assigned::Master { epoch } = role {
            let end = node.broker().store().positions().written;
            {
                let mut file = rocketgate_core::sync::lock(&epochs);
                if file.last().map(|e| e.epoch) != Some(epoch) {
                    file.begin(epoch, end)
                        .with_context(|| format!("recording epoch {epoch} at {end}"))?;
                }
            }
            tracing::info!(group = %me.group, epoch, start = end, "controller: master; epoch recorded");
            renew(&node, sent, me.lease(&info));
            set_members(&node, &info, me.id);
        }
        if !printed {
            println!("{ready}");
            printed = true;
        }
        // 3. Follow the answers until the role changes.
        let end = tokio::select! {
            _ = &mut shutdown => End::Shutdown,
            e = watch_role(&client, &me, &node, &role, &beat, &mut answers, info.sync_state_set_epoch) => e,
            Some(to) = truncate_rx.recv() => End::Truncate(to),
        };
        if let Some(gate) = node.gate()
            && !matches!(end, End::Shutdown)
        {
            // No acknowledgement from here on: another master may already take writes.
            gate.fence("the controller named another master");
            // Its MQTT clients are sent to the group's other doors (0x9C) rather than
            // told the server shuts down: it comes back as a slave.
            node.redirect_mqtt_on_stop();
        }
        let log_end = node.broker().store().positions().written;
        beat.log_end.store(log_end, Ordering::Release);
        beat.fast.store(false, Ordering::Release);
        node.stop().await?;
        match end {
            End::Shutdown => return Ok(()),
            End::Reassigned => {}
            End::Truncate(to) => {
                tracing::warn!(group = %me.group, from = log_end, to, "truncating the log to the last offset shared with the master");
                let settings = crate::node::store_options(&base);
                let dir = base.data_dir.clone();
                let report = tokio::task::spawn_blocking(move || {
                    rocketgate_core::store::truncate::truncate(&dir, &settings, to)
                })
                .await
                .context("joining the truncation")?
                .with_context(|| format!("truncating the log to {to}"))?;
                tracing::warn!(?report, "log truncated");
                rocketgate_core::sync::lock(&epochs)
                    .truncate_after(to)
                    .context("trimming the epoch file")?;
                beat.log_end.store(to, Ordering::Release);
            }
        }
        // Drain a truncation asked twice by the same handshake.
        while truncate_rx.try_recv().is_ok() {}
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the heartbeats report, kept current by the incarnations.
struct BeatState {
    /// The commit log's end (the last known one while the node restarts).
    log_end: AtomicU64,
    /// The master epoch of the role it runs in (the epoch file's last before any).
    epoch: AtomicU64,
    /// Ask every [`FAST_POLL`] rather than every heartbeat interval: a slave that lost
    /// its master (the controller is about to elect another, and the sooner this broker
    /// hears, the sooner the group takes writes again).
    fast: std::sync::atomic::AtomicBool,
}

/// An answer and when the heartbeat it answers was sent.
type Answer = Option<(ReplicaInfo, Instant)>;

/// Registers, then heartbeats for as long as the process runs, publishing each answer.
async fn heartbeats(
    client: Arc<ControllerClient>,
    me: Arc<Me>,
    state: Arc<BeatState>,
    known_epoch: Arc<AtomicU64>,
    answers: watch::Sender<Answer>,
) {
    let mut registered = false;
    let mut tick = tokio::time::interval(FAST_POLL.min(me.every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Instant> = None;
    loop {
        tick.tick().await;
        let due = last.is_none_or(|t| t.elapsed() >= me.every);
        if !due && !state.fast.load(Ordering::Acquire) {
            continue;
        }
        last = Some(Instant::now());
        let hb = me.beat(
            state.log_end.load(Ordering::Acquire),
            state.epoch.load(Ordering::Acquire),
        );
        let sent = Instant::now();
        let answer = match registered {
            false => client.register(&hb).await,
            true => client.heartbeat(&hb).await,
        };
        match answer {
            Ok(info) => {
                registered = true;
                known_epoch.fetch_max(info.master_epoch, Ordering::AcqRel);
                answers.send_replace(Some((info, sent)));
            }
            Err(e) => {
                tracing::warn!(group = %me.group, id = me.id, error = %e, "controller heartbeat failed")
            }
        }
    }
}

/// This broker as the controller knows it.
struct Me {
    group: String,
    id: u64,
    addr: String,
    ha_addr: String,
    default_lease: Duration,
    /// `controller.heartbeat_interval`.
    every: Duration,
}

impl Me {
    fn beat(&self, max_offset: u64, epoch: u64) -> Heartbeat {
        Heartbeat {
            group: self.group.clone(),
            id: self.id,
            addr: self.addr.clone(),
            ha_addr: self.ha_addr.clone(),
            max_offset: max_offset as i64,
            epoch,
        }
    }

    /// The lease an answer grants: from the controllers' `broker_timeout` when the answer
    /// says it, else from this broker's own setting.
    fn lease(&self, info: &ReplicaInfo) -> Duration {
        info.broker_timeout_ms
            .map(|ms| ControllerConfig::lease_for(Duration::from_millis(ms)))
            .unwrap_or(self.default_lease)
    }
}

/// Extends a master's write lease to `sent + lease`.
fn renew(node: &BrokerNode, sent: Instant, lease: Duration) {
    if let Some(gate) = node.gate() {
        gate.set_lease_deadline(Some(sent + lease));
    }
}

/// The controller's in-sync set, as the master's gate counts copies.
fn set_members(node: &BrokerNode, info: &ReplicaInfo, me: u64) {
    if let Some(r) = node.replication().replicas() {
        let slaves: BTreeSet<u64> = info
            .sync_state_set
            .iter()
            .copied()
            .filter(|id| *id != me)
            .collect();
        r.set_members(Some((slaves, info.sync_state_set_epoch)));
    }
}

/// Follows the controller's answers (and, as master, keeps the in-sync set) until the
/// controller gives this broker another role.
async fn watch_role(
    client: &ControllerClient,
    me: &Me,
    node: &BrokerNode,
    role: &Assigned,
    beat: &BeatState,
    answers: &mut watch::Receiver<Answer>,
    sync_epoch: u64,
) -> End {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let master = matches!(role, Assigned::Master { .. });
    let mut sync_epoch = Some(sync_epoch);
    // After a refused change, the next proposal waits a little (a slave the controller
    // does not know yet would be proposed every tick).
    let mut quiet_until = Instant::now();
    let mut last_proposal = Instant::now();
    loop {
        tokio::select! {
            r = answers.changed() => {
                if r.is_err() {
                    return End::Shutdown;
                }
                let Some((info, sent)) = answers.borrow_and_update().clone() else { continue };
                if Assigned::of(&info, me.id).as_ref() != Some(role) {
                    tracing::warn!(group = %me.group, id = me.id, was = ?role,
                        master = ?info.master_id, epoch = info.master_epoch,
                        "controller: role changed");
                    return End::Reassigned;
                }
                if master {
                    renew(node, sent, me.lease(&info));
                    if sync_epoch.is_none_or(|e| e < info.sync_state_set_epoch) {
                        set_members(node, &info, me.id);
                        sync_epoch = Some(info.sync_state_set_epoch);
                    }
                }
            }
            _ = tick.tick() => {
                beat.log_end.store(node.broker().store().positions().written, Ordering::Release);
                beat.fast.store(node.replication().following() == Some(false), Ordering::Release);
                if !master || Instant::now() < quiet_until || last_proposal.elapsed() < Duration::from_millis(200) {
                    continue;
                }
                last_proposal = Instant::now();
                let Some(replicas) = node.replication().replicas() else { continue };
                let Some(want) = replicas.proposal() else { continue };
                let Assigned::Master { epoch } = role else { continue };
                let Some(current) = sync_epoch else { continue };
                let mut set = want.clone();
                set.insert(me.id);
                match client.alter_sync_set(&me.group, me.id, *epoch, current, set).await {
                    Ok(info) => {
                        tracing::info!(group = %me.group, set = ?info.sync_state_set,
                            sync_epoch = info.sync_state_set_epoch, "in-sync set changed");
                        set_members(node, &info, me.id);
                        sync_epoch = Some(info.sync_state_set_epoch);
                    }
                    Err(rocketgate_controller::Error::Rejected { code, remark })
                        if code == rocketgate_controller::wire::response::CONTROLLER_FENCED_MASTER_EPOCH
                            || code == rocketgate_controller::wire::response::CONTROLLER_INVALID_MASTER =>
                    {
                        tracing::warn!(group = %me.group, id = me.id, %remark, "controller: no longer master");
                        return End::Reassigned;
                    }
                    Err(e) => {
                        // A stale set epoch: the next answer brings the current one.
                        tracing::warn!(group = %me.group, error = %e, "in-sync set change refused");
                        sync_epoch = None;
                        quiet_until = Instant::now() + Duration::from_secs(1);
                    }
                }
            }
        }
    }
}
