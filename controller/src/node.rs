//! One controller: the Raft node, the remoting server that answers brokers, admins and the
//! other controllers, and the leader's watch over the masters' heartbeats.
//!
//! Heartbeats are controller-local: only the leader records them (followers redirect), and
//! a new leader waits one `broker_timeout` before it judges any master silent, so brokers
//! have had the time to find it.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};
use rocketgate_base::sync::lock;
use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::code::response::{REQUEST_CODE_NOT_SUPPORTED, SUCCESS, SYSTEM_ERROR};
use rocketgate_remoting::server::{self, Answer, Handler, Limits, Outbound, Peer};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::state::{BrokerId, Command, Group, Liveness, Outcome, Rejection, pick_master};
use crate::store::{Applied, LogStore, StateStore};
use crate::wire::{self, ReplicaInfo, field, request, response};
use crate::{Error, TypeConfig};

/// What a controller is built with.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    /// This controller's id: a key of `peers`.
    pub id: u64,
    /// Where to listen; empty: the address `peers` gives this id.
    pub listen: String,
    /// Every controller (this one included): id -> `host:port` the others reach it at.
    pub peers: BTreeMap<u64, String>,
    /// Raft log, vote and snapshot live here.
    pub data_dir: PathBuf,
    /// A master silent this long is replaced.
    pub broker_timeout: Duration,
    /// Elect a broker outside the in-sync set when no member can take over (loses data).
    pub allow_unclean_election: bool,
    /// Raft leader heartbeat to the other controllers.
    pub raft_heartbeat: Duration,
    /// Raft election timeout: a follower that hears no leader this long (randomised up
    /// to twice this) stands for election.
    pub raft_election_timeout: Duration,
    /// Serve TLS with this certificate (`tls.controller`); `None`: plain remoting.
    pub tls: Option<rocketgate_tls::Acceptor>,
    /// Reach the other controllers over TLS, trusting this CA (`controller.ca`).
    pub peer_tls: Option<rocketgate_tls::Dialer>,
}

impl ControllerSettings {
    /// Defaults for a controller `id` of `peers`, data in `data_dir`.
    pub fn new(id: u64, peers: BTreeMap<u64, String>, data_dir: PathBuf) -> Self {
        ControllerSettings {
            id,
            listen: String::new(),
            peers,
            data_dir,
            broker_timeout: Duration::from_secs(3),
            allow_unclean_election: false,
            raft_heartbeat: Duration::from_millis(100),
            raft_election_timeout: Duration::from_millis(500),
            tls: None,
            peer_tls: None,
        }
    }
}

/// The TLS listener as the remoting loop's connection source (`tls.controller`).
struct TlsIncoming(rocketgate_tls::Incoming);

impl server::Accept for TlsIncoming {
    type Io = rocketgate_tls::Stream;

    async fn accept(&mut self) -> std::io::Result<server::Accepted<Self::Io>> {
        let c = self.0.accept().await;
        Ok(server::Accepted {
            io: c.stream,
            addr: c.peer,
            tls_identity: c.tls_identity,
        })
    }
}

/// A running controller.
pub struct Controller {
    core: Arc<Core>,
    addr: std::net::SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

struct Beat {
    at: Instant,
    max_offset: i64,
    epoch: u64,
}

/// Heartbeats this controller received while leader.
#[derive(Default)]
struct Beats {
    /// When this controller last became leader; `None` while it is not.
    leader_since: Option<Instant>,
    seen: HashMap<(String, BrokerId), Beat>,
}

struct Core {
    id: u64,
    raft: Raft<TypeConfig>,
    state: Arc<Mutex<Applied>>,
    /// Std lock, held for a map operation, never across an `.await`.
    beats: Mutex<Beats>,
    broker_timeout: Duration,
    allow_unclean: bool,
}

impl Controller {
    /// Opens the storage in `settings.data_dir`, starts the Raft node and the server, and
    /// on a first start proposes the membership `settings.peers`.
    pub async fn start(settings: ControllerSettings) -> Result<Controller, Error> {
        let Some(me) = settings.peers.get(&settings.id) else {
            return Err(Error::Config(format!(
                "controller id {} is not among the peers {:?}",
                settings.id, settings.peers
            )));
        };
        let listen = if settings.listen.is_empty() {
            me.clone()
        } else {
            settings.listen.clone()
        };
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| Error::Io { what, source }
        };
        let log =
            LogStore::open(&settings.data_dir.join("raft")).map_err(io("open the raft log"))?;
        let sm = StateStore::open(&settings.data_dir).map_err(io("open the snapshot"))?;
        let state = sm.shared();
        let hb = settings.raft_heartbeat.as_millis().max(10) as u64;
        let el = settings
            .raft_election_timeout
            .as_millis()
            .max(hb as u128 * 3) as u64;
        let config = openraft::Config {
            cluster_name: "rocketgate-controller".into(),
            heartbeat_interval: hb,
            election_timeout_min: el,
            election_timeout_max: el * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(500),
            max_in_snapshot_log_to_keep: 100,
            ..Default::default()
        }
        .validate()
        .map_err(|e| Error::Config(e.to_string()))?;
        let raft = Raft::new(
            settings.id,
            Arc::new(config),
            crate::network::Network {
                tls: settings.peer_tls.clone(),
            },
            log,
            sm,
        )
        .await
        .map_err(|e| Error::Raft(e.to_string()))?;
        let listener = TcpListener::bind(&listen)
            .await
            .map_err(io(&format!("listen on {listen}")))?;
        let addr = listener
            .local_addr()
            .map_err(io("read the listen address"))?;
        let core = Arc::new(Core {
            id: settings.id,
            raft: raft.clone(),
            state,
            beats: Mutex::default(),
            broker_timeout: settings.broker_timeout,
            allow_unclean: settings.allow_unclean_election,
        });
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut s = stopped.clone();
        let service = Arc::new(Service { core: core.clone() });
        let stopped_serving = async move {
            let _ = s.wait_for(|v| *v).await;
        };
        match &settings.tls {
            None => tasks.push(tokio::spawn(server::serve(
                listener,
                service,
                Limits::default(),
                stopped_serving,
            ))),
            Some(acceptor) => {
                let mode = rocketgate_tls::Mode::Tls(acceptor.clone());
                let incoming = rocketgate_tls::Incoming::new(listener, mode, "controller")
                    .map_err(io("serve TLS"))?;
                tasks.push(tokio::spawn(server::serve(
                    TlsIncoming(incoming),
                    service,
                    Limits::default(),
                    stopped_serving,
                )));
            }
        }
        tasks.push(tokio::spawn(watch_masters(core.clone(), stopped)));
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        if !initialized {
            let members: BTreeMap<u64, BasicNode> = settings
                .peers
                .iter()
                .map(|(id, a)| (*id, BasicNode { addr: a.clone() }))
                .collect();
            // Every controller proposes the same membership on its first start: safe, and
            // whichever gets a majority first leads.
            if let Err(e) = raft.initialize(members).await {
                info!(error = %e, "raft membership already set");
            }
        }
        info!(id = settings.id, %addr, peers = ?settings.peers, "controller started");
        Ok(Controller {
            core,
            addr,
            stop,
            tasks,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The Raft node (metrics, tests).
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.core.raft
    }

    /// Stops serving and shuts the Raft node down.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.core.raft.shutdown().await;
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// The scan interval of the leader's watch over masters.
fn scan_every(broker_timeout: Duration) -> Duration {
    (broker_timeout / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// The leader's loop: replaces masters silent past `broker_timeout`.
async fn watch_masters(core: Arc<Core>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(scan_every(core.broker_timeout));
    // (group, epoch) already reported as "no one to elect": said once, not every scan.
    let mut stuck: std::collections::HashSet<(String, u64)> = Default::default();
    let every = scan_every(core.broker_timeout);
    let mut last_scan = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        // A scan far later than its period means this process was frozen or starved
        // (SIGSTOP, a VM pause, swap): the brokers' heartbeats of that time may still sit
        // unread in its sockets, so their silence is this leader's, not theirs. It waits
        // one `broker_timeout` again before it judges anyone.
        if last_scan.elapsed() > every * 4 {
            warn!(late = ?last_scan.elapsed(), "the master watch ran late: judging no master for one broker_timeout");
            if let Some(since) = lock(&core.beats).leader_since.as_mut() {
                *since = Instant::now();
            }
        }
        last_scan = Instant::now();
        let leading = {
            let m = core.raft.metrics().borrow().clone();
            m.state == ServerState::Leader && m.current_leader == Some(core.id)
        };
        let since = {
            let mut b = lock(&core.beats);
            if !leading {
                b.leader_since = None;
                b.seen.clear();
                continue;
            }
            *b.leader_since.get_or_insert_with(Instant::now)
        };
        if since.elapsed() < core.broker_timeout {
            continue;
        }
        let silent: Vec<(String, Group)> = {
            let state = lock(&core.state);
            let b = lock(&core.beats);
            state
                .groups
                .groups
                .iter()
                .filter(|(name, g)| {
                    g.master.is_some_and(|m| {
                        b.seen
                            .get(&((*name).clone(), m))
                            .is_none_or(|beat| beat.at.elapsed() > core.broker_timeout)
                    })
                })
                .map(|(n, g)| (n.clone(), g.clone()))
                .collect()
        };
        for (name, _) in silent {
            if let Err(e) = core.raft.ensure_linearizable().await {
                warn!(error = %e, "no linearizable read for an election");
                break;
            }
            let Some(g) = lock(&core.state).groups.group(&name).cloned() else {
                continue;
            };
            match pick_master(&g, |id| core.liveness(&name, id), core.allow_unclean, None) {
                Ok(id) => {
                    let cmd = Command::ElectMaster {
                        group: name.clone(),
                        master: id,
                        expect_epoch: g.master_epoch,
                    };
                    match core.raft.client_write(cmd).await {
                        Ok(r) => match r.data {
                            Outcome::Applied(ng) => info!(
                                group = %name, old = ?g.master, new = id, epoch = ng.master_epoch,
                                "master silent past broker_timeout: elected a new one"
                            ),
                            Outcome::Rejected { detail, .. } => {
                                info!(group = %name, %detail, "election did not apply")
                            }
                        },
                        Err(e) => warn!(group = %name, error = %e, "election not committed"),
                    }
                }
                Err((_, why)) => {
                    if stuck.insert((name.clone(), g.master_epoch)) {
                        warn!(group = %name, master = ?g.master, %why, "master silent, no one to elect");
                    }
                }
            }
        }
    }
}

/// Why a request is refused: turned into the answer at the end.
#[derive(Debug)]
struct Refusal {
    code: i32,
    remark: String,
    /// On `CONTROLLER_NOT_LEADER`: the leader, when known.
    leader: Option<(u64, String)>,
}

fn refuse(code: i32, remark: impl Into<String>) -> Refusal {
    Refusal {
        code,
        remark: remark.into(),
        leader: None,
    }
}

impl Refusal {
    fn answer(self, req: &RemotingCommand) -> RemotingCommand {
        let mut r = RemotingCommand::response_to(req, self.code).with_remark(self.remark);
        if let Some((id, addr)) = self.leader {
            r = r
                .with_field(field::LEADER_ID, id)
                .with_field(field::LEADER_ADDRESS, addr);
        }
        r
    }
}

/// A request's answer, or why it is refused.
type Reply = Result<RemotingCommand, Refusal>;

fn ok_json(req: &RemotingCommand, body: &impl Serialize) -> RemotingCommand {
    RemotingCommand::response_to(req, SUCCESS)
        .with_body(serde_json::to_vec(body).unwrap_or_default())
}

fn invalid(remark: String) -> Refusal {
    refuse(response::CONTROLLER_INVALID_REQUEST, remark)
}

fn text<'a>(req: &'a RemotingCommand, name: &str) -> Result<&'a str, Refusal> {
    match req.field(name) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(invalid(format!("missing field {name}"))),
    }
}

fn number<T: std::str::FromStr>(req: &RemotingCommand, name: &str) -> Result<Option<T>, Refusal> {
    match req.field(name) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| invalid(format!("field {name} is not a number: {v:?}"))),
    }
}

fn required<T: std::str::FromStr>(req: &RemotingCommand, name: &str) -> Result<T, Refusal> {
    number(req, name)?.ok_or_else(|| invalid(format!("missing field {name}")))
}

fn parse_body<T: DeserializeOwned>(req: &RemotingCommand) -> Result<T, Refusal> {
    serde_json::from_slice(&req.body).map_err(|e| invalid(format!("body does not parse: {e}")))
}

impl Core {
    /// The leader as this controller knows it: (id, address).
    fn leader(&self) -> (Option<u64>, Option<String>) {
        let m = self.raft.metrics().borrow().clone();
        let addr = m.current_leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.addr.clone())
        });
        (m.current_leader, addr)
    }

    fn redirect(&self, id: Option<u64>, addr: Option<String>) -> Refusal {
        Refusal {
            code: response::CONTROLLER_NOT_LEADER,
            remark: format!("controller {} is not the leader", self.id),
            leader: id.zip(addr),
        }
    }

    /// Ok when this controller leads (as far as it knows), else the redirect answer.
    fn must_lead(&self) -> Result<(), Refusal> {
        let (id, addr) = self.leader();
        if id == Some(self.id) {
            Ok(())
        } else {
            Err(self.redirect(id, addr))
        }
    }

    /// Waits until this leader's state machine has everything committed before now.
    async fn linearizable(&self) -> Result<(), Refusal> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(e) => match e.forward_to_leader() {
                Some(f) => {
                    Err(self.redirect(f.leader_id, f.leader_node.as_ref().map(|n| n.addr.clone())))
                }
                None => Err(refuse(SYSTEM_ERROR, e.to_string())),
            },
        }
    }

    async fn propose(&self, req: &RemotingCommand, cmd: Command) -> Reply {
        match self.raft.client_write(cmd).await {
            Ok(r) => match r.data {
                Outcome::Applied(g) => {
                    let name = req.field(field::BROKER_NAME).unwrap_or_default();
                    Ok(ok_json(req, &self.info(name, &g)))
                }
                Outcome::Rejected { why, detail } => Err(refuse(wire::code_of(why), detail)),
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(self.redirect(f.leader_id, f.leader_node.map(|n| n.addr)))
            }
            Err(e) => Err(refuse(SYSTEM_ERROR, e.to_string())),
        }
    }

    fn liveness(&self, group: &str, id: BrokerId) -> Option<Liveness> {
        let b = lock(&self.beats);
        b.seen.get(&(group.to_owned(), id)).map(|beat| Liveness {
            alive: beat.at.elapsed() <= self.broker_timeout,
            max_offset: beat.max_offset,
        })
    }

    /// A group as brokers get it, with the silence after which a master is replaced (the
    /// broker derives its write lease from it: docs/controller.md, "The lease rule").
    fn info(&self, name: &str, g: &Group) -> ReplicaInfo {
        ReplicaInfo {
            broker_timeout_ms: Some(self.broker_timeout.as_millis() as u64),
            ..ReplicaInfo::of(name, g)
        }
    }

    fn group(&self, name: &str) -> Option<Group> {
        lock(&self.state).groups.group(name).cloned()
    }

    /// Register and heartbeat: recorded, and the broker (re)registered through Raft when
    /// the controllers do not know it at this address yet.
    async fn heartbeat(&self, req: &RemotingCommand) -> Reply {
        let name = text(req, field::BROKER_NAME)?.to_owned();
        let id: BrokerId = required(req, field::BROKER_ID)?;
        let addr = text(req, field::BROKER_ADDRESS)?.to_owned();
        let ha_addr = req.field(field::HA_ADDRESS).unwrap_or_default().to_owned();
        let max_offset: i64 = number(req, field::MAX_OFFSET)?.unwrap_or(0);
        let epoch: u64 = number(req, field::EPOCH)?.unwrap_or(0);
        self.must_lead()?;
        lock(&self.beats).seen.insert(
            (name.clone(), id),
            Beat {
                at: Instant::now(),
                max_offset,
                epoch,
            },
        );
        // The answer renews the broker's write lease (docs/controller.md), so it must come
        // from a leader a quorum still follows, not one deposed behind a partition: a
        // linearizable read (one heartbeat round to the other controllers).
        self.linearizable().await?;
        let known = self.group(&name).filter(|g| {
            g.replicas.get(&id) == Some(&addr)
                && (ha_addr.is_empty() || g.ha_addrs.get(&id) == Some(&ha_addr))
                && !(g.master.is_none() && (g.sync_set.is_empty() || g.sync_set.contains(&id)))
        });
        match known {
            Some(g) => Ok(ok_json(req, &self.info(&name, &g))),
            None => {
                self.propose(
                    req,
                    Command::Register {
                        group: name,
                        id,
                        addr,
                        ha_addr,
                    },
                )
                .await
            }
        }
    }

    async fn replica_info(&self, req: &RemotingCommand) -> Reply {
        let name = text(req, field::BROKER_NAME)?;
        self.must_lead()?;
        self.linearizable().await?;
        match self.group(name) {
            Some(g) => Ok(ok_json(req, &self.info(name, &g))),
            None => Err(refuse(
                response::CONTROLLER_BROKER_METADATA_NOT_EXIST,
                format!("no group {name}"),
            )),
        }
    }

    async fn elect(&self, req: &RemotingCommand) -> Reply {
        let name = text(req, field::BROKER_NAME)?.to_owned();
        let prefer: Option<BrokerId> = number(req, field::BROKER_ID)?;
        self.must_lead()?;
        self.linearizable().await?;
        let Some(g) = self.group(&name) else {
            return Err(refuse(
                response::CONTROLLER_BROKER_METADATA_NOT_EXIST,
                format!("no group {name}"),
            ));
        };
        if prefer.is_some() && prefer == g.master {
            return Ok(ok_json(req, &self.info(&name, &g)));
        }
        let id = pick_master(
            &g,
            |id| self.liveness(&name, id),
            self.allow_unclean,
            prefer,
        )
        .map_err(|(why, detail)| refuse(wire::code_of(why), detail))?;
        info!(group = %name, old = ?g.master, new = id, "election requested");
        self.propose(
            req,
            Command::ElectMaster {
                group: name,
                master: id,
                expect_epoch: g.master_epoch,
            },
        )
        .await
    }

    async fn alter_sync_set(&self, req: &RemotingCommand) -> Reply {
        let name = text(req, field::BROKER_NAME)?.to_owned();
        let master: BrokerId = required(req, field::BROKER_ID)?;
        let master_epoch: u64 = required(req, field::MASTER_EPOCH)?;
        let sync_epoch: u64 = required(req, field::SYNC_STATE_SET_EPOCH)?;
        let body: wire::SyncStateSetBody = parse_body(req)?;
        self.must_lead()?;
        let g = self.group(&name).unwrap_or_default();
        // A broker joins the set only while alive; leaving it needs nothing.
        for id in body
            .sync_state_set
            .iter()
            .filter(|id| !g.sync_set.contains(id) && **id != master)
        {
            if !self.liveness(&name, *id).is_some_and(|l| l.alive) {
                return Err(refuse(
                    wire::code_of(Rejection::NotAlive),
                    format!("broker {id} is not alive"),
                ));
            }
        }
        self.propose(
            req,
            Command::AlterSyncSet {
                group: name,
                master,
                master_epoch,
                expect_sync_epoch: sync_epoch,
                set: body.sync_state_set,
            },
        )
        .await
    }

    async fn status(&self, req: &RemotingCommand) -> Reply {
        self.must_lead()?;
        self.linearizable().await?;
        let m = self.raft.metrics().borrow().clone();
        let controllers = m
            .membership_config
            .membership()
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect::<BTreeMap<_, _>>();
        let groups = lock(&self.state).groups.clone();
        let b = lock(&self.beats);
        let status = wire::Status {
            leader_id: self.id,
            leader_address: controllers.get(&self.id).cloned().unwrap_or_default(),
            term: m.current_term,
            controllers,
            groups: groups
                .groups
                .iter()
                .map(|(name, g)| wire::GroupStatus {
                    info: self.info(name, g),
                    replica_status: g
                        .replicas
                        .iter()
                        .map(|(id, addr)| {
                            let beat = b.seen.get(&(name.clone(), *id));
                            wire::ReplicaStatus {
                                broker_id: *id,
                                address: addr.clone(),
                                alive: beat.is_some_and(|x| x.at.elapsed() <= self.broker_timeout),
                                last_heartbeat_ms_ago: beat
                                    .map(|x| x.at.elapsed().as_millis() as u64),
                                max_offset: beat.map(|x| x.max_offset),
                                epoch: beat.map(|x| x.epoch),
                            }
                        })
                        .collect(),
                })
                .collect(),
        };
        Ok(ok_json(req, &status))
    }

    fn metadata(&self, req: &RemotingCommand) -> RemotingCommand {
        let m = self.raft.metrics().borrow().clone();
        let (leader_id, leader_address) = self.leader();
        ok_json(
            req,
            &wire::Metadata {
                id: self.id,
                leader_id,
                leader_address,
                is_leader: m.state == ServerState::Leader,
                term: m.current_term,
                last_applied: m.last_applied.map(|l| l.index),
            },
        )
    }

    async fn answer(&self, req: RemotingCommand) -> RemotingCommand {
        let reply = match req.code {
            request::RAFT_APPEND_ENTRIES => match parse_body(&req) {
                Ok(rpc) => Ok(ok_json(&req, &self.raft.append_entries(rpc).await)),
                Err(e) => Err(e),
            },
            request::RAFT_VOTE => match parse_body(&req) {
                Ok(rpc) => Ok(ok_json(&req, &self.raft.vote(rpc).await)),
                Err(e) => Err(e),
            },
            request::RAFT_INSTALL_SNAPSHOT => match parse_body(&req) {
                Ok(rpc) => Ok(ok_json(&req, &self.raft.install_snapshot(rpc).await)),
                Err(e) => Err(e),
            },
            request::CONTROLLER_REGISTER_BROKER | request::BROKER_HEARTBEAT => {
                self.heartbeat(&req).await
            }
            request::CONTROLLER_GET_REPLICA_INFO => self.replica_info(&req).await,
            request::CONTROLLER_ELECT_MASTER => self.elect(&req).await,
            request::CONTROLLER_ALTER_SYNC_STATE_SET => self.alter_sync_set(&req).await,
            request::CONTROLLER_GET_SYNC_STATE_DATA => self.status(&req).await,
            request::CONTROLLER_GET_METADATA_INFO => Ok(self.metadata(&req)),
            code => Err(refuse(
                REQUEST_CODE_NOT_SUPPORTED,
                format!("request code {code} not supported"),
            )),
        };
        reply.unwrap_or_else(|e| e.answer(&req))
    }
}

/// The remoting handler: every request runs as a task of its connection.
struct Service {
    core: Arc<Core>,
}

impl Handler for Service {
    type Session = ();

    fn open(&self, _peer: Peer, _outbound: Outbound) {}

    fn handle(&self, _session: &mut (), request: RemotingCommand) -> Answer {
        let core = self.core.clone();
        Answer::Later(Box::pin(async move { core.answer(request).await }))
    }

    async fn close(&self, _session: (), _why: &str) {}
}
