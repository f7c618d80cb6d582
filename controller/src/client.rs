//! [`ControllerClient`]: what brokers and admin tools use to reach the controllers. It
//! keeps the leader it last found, follows `CONTROLLER_NOT_LEADER` redirects, and tries
//! the configured addresses in turn on a refused or silent connection, until its retry
//! window runs out (an election among the controllers takes a second or two).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketgate_base::sync::lock;
use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::client::Link;
use rocketgate_remoting::code::response::SUCCESS;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::state::BrokerId;
use crate::wire::{self, ReplicaInfo, field, request, response};

/// What a broker says in a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub group: String,
    pub id: BrokerId,
    /// The broker's address (its native door), as clients reach it.
    pub addr: String,
    /// Its replication port (`listen.ha`), where slaves follow it; empty: none.
    pub ha_addr: String,
    /// Where its commit log ends.
    pub max_offset: i64,
    /// The master epoch it holds.
    pub epoch: u64,
}

/// A client of a controller cluster.
pub struct ControllerClient {
    addrs: Vec<String>,
    call_timeout: Duration,
    retry_for: Duration,
    /// Std lock, held to read or update the leader hint and the links.
    links: Mutex<Links>,
    /// TLS to the controllers (`controller.ca`); `None`: plain.
    tls: Option<rocketgate_tls::Dialer>,
}

#[derive(Default)]
struct Links {
    leader: Option<String>,
    open: HashMap<String, Arc<Link>>,
}

impl ControllerClient {
    /// A client of the controllers at `addrs` (`host:port` each): calls time out after
    /// 2 s, and a request is retried for up to 10 s.
    pub fn new(addrs: Vec<String>) -> Self {
        ControllerClient {
            addrs,
            call_timeout: Duration::from_secs(2),
            retry_for: Duration::from_secs(10),
            links: Mutex::default(),
            tls: None,
        }
    }

    /// Talks TLS to the controllers (`tls.controller` on their side).
    pub fn with_tls(mut self, dialer: rocketgate_tls::Dialer) -> Self {
        self.tls = Some(dialer);
        self
    }

    /// Parses `A;B;C` (or commas) into a client.
    pub fn parse(list: &str) -> Result<Self, Error> {
        let addrs: Vec<String> = list
            .split([';', ','])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if addrs.is_empty() {
            return Err(Error::Config(format!("no controller address in {list:?}")));
        }
        Ok(Self::new(addrs))
    }

    /// Sets the per-call timeout and how long a request is retried.
    pub fn with_timeouts(mut self, call: Duration, retry_for: Duration) -> Self {
        self.call_timeout = call;
        self.retry_for = retry_for;
        self
    }

    /// The leader this client last talked to.
    pub fn leader(&self) -> Option<String> {
        lock(&self.links).leader.clone()
    }

    async fn link(&self, addr: &str) -> Result<Arc<Link>, Error> {
        if let Some(l) = lock(&self.links).open.get(addr).filter(|l| !l.is_closed()) {
            return Ok(l.clone());
        }
        let l = Arc::new(match &self.tls {
            None => Link::connect(addr, self.call_timeout, None).await?,
            Some(d) => {
                let tls = d
                    .connect(addr, self.call_timeout)
                    .await
                    .map_err(|source| Error::Io {
                        what: format!("TLS connection to controller {addr}"),
                        source,
                    })?;
                Link::over(addr, tls, None)
            }
        });
        lock(&self.links).open.insert(addr.to_owned(), l.clone());
        Ok(l)
    }

    /// Sends `cmd` to the leader (finding it first), returning its answer whatever the
    /// code, except `CONTROLLER_NOT_LEADER`, which is followed.
    pub async fn call(&self, cmd: RemotingCommand) -> Result<RemotingCommand, Error> {
        let deadline = Instant::now() + self.retry_for;
        let mut last = String::from("no controller tried");
        loop {
            let hint = self.leader();
            let mut order: Vec<String> = hint.iter().cloned().collect();
            order.extend(
                self.addrs
                    .iter()
                    .filter(|a| Some(*a) != hint.as_ref())
                    .cloned(),
            );
            let mut i = 0;
            while i < order.len() {
                let addr = order[i].clone();
                i += 1;
                let resp = match self.link(&addr).await {
                    Ok(link) => link
                        .call(cmd.clone(), self.call_timeout)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match resp {
                    Ok(r) if r.code == response::CONTROLLER_NOT_LEADER => {
                        last = format!("{addr}: {}", r.remark.clone().unwrap_or_default());
                        let hint = r.field(field::LEADER_ADDRESS).map(str::to_owned);
                        let mut links = lock(&self.links);
                        links.leader = None;
                        if let Some(h) = hint.filter(|h| *h != addr) {
                            links.leader = Some(h.clone());
                            // Try the named leader next.
                            order.insert(i, h);
                        }
                    }
                    Ok(r) => {
                        lock(&self.links).leader = Some(addr);
                        return Ok(r);
                    }
                    Err(e) => {
                        last = format!("{addr}: {e}");
                        let mut links = lock(&self.links);
                        links.open.remove(&addr);
                        if links.leader.as_deref() == Some(addr.as_str()) {
                            links.leader = None;
                        }
                    }
                }
                if i > 16 {
                    break;
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::NoLeader { last });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn call_json<T: DeserializeOwned>(&self, cmd: RemotingCommand) -> Result<T, Error> {
        let r = self.call(cmd).await?;
        if r.code != SUCCESS {
            return Err(Error::Rejected {
                code: r.code,
                remark: r.remark.unwrap_or_default(),
            });
        }
        serde_json::from_slice(&r.body).map_err(|e| Error::BadAnswer(e.to_string()))
    }

    fn beat_cmd(code: i32, hb: &Heartbeat) -> RemotingCommand {
        let cmd = RemotingCommand::request(code, 0)
            .with_field(field::BROKER_NAME, &hb.group)
            .with_field(field::BROKER_ID, hb.id)
            .with_field(field::BROKER_ADDRESS, &hb.addr)
            .with_field(field::MAX_OFFSET, hb.max_offset)
            .with_field(field::EPOCH, hb.epoch);
        match hb.ha_addr.is_empty() {
            true => cmd,
            false => cmd.with_field(field::HA_ADDRESS, &hb.ha_addr),
        }
    }

    /// Registers a broker; the answer says who is master (maybe the broker itself).
    pub async fn register(&self, hb: &Heartbeat) -> Result<ReplicaInfo, Error> {
        self.call_json(Self::beat_cmd(request::CONTROLLER_REGISTER_BROKER, hb))
            .await
    }

    /// A heartbeat; the answer is the group as the controllers hold it.
    pub async fn heartbeat(&self, hb: &Heartbeat) -> Result<ReplicaInfo, Error> {
        self.call_json(Self::beat_cmd(request::BROKER_HEARTBEAT, hb))
            .await
    }

    /// The group's master, epoch and in-sync set (a linearizable read).
    pub async fn replica_info(&self, group: &str) -> Result<ReplicaInfo, Error> {
        self.call_json(
            RemotingCommand::request(request::CONTROLLER_GET_REPLICA_INFO, 0)
                .with_field(field::BROKER_NAME, group),
        )
        .await
    }

    /// The master's request for a new in-sync set, checked against its epoch and the set's.
    pub async fn alter_sync_set(
        &self,
        group: &str,
        master: BrokerId,
        master_epoch: u64,
        sync_epoch: u64,
        set: BTreeSet<BrokerId>,
    ) -> Result<ReplicaInfo, Error> {
        let body = wire::SyncStateSetBody {
            sync_state_set: set,
        };
        self.call_json(
            RemotingCommand::request(request::CONTROLLER_ALTER_SYNC_STATE_SET, 0)
                .with_field(field::BROKER_NAME, group)
                .with_field(field::BROKER_ID, master)
                .with_field(field::MASTER_EPOCH, master_epoch)
                .with_field(field::SYNC_STATE_SET_EPOCH, sync_epoch)
                .with_body(serde_json::to_vec(&body).unwrap_or_default()),
        )
        .await
    }

    /// Elects a new master of `group`: `broker` if given (it must be alive and in the
    /// in-sync set), else the best in-sync candidate other than the current master.
    pub async fn elect(&self, group: &str, broker: Option<BrokerId>) -> Result<ReplicaInfo, Error> {
        let mut cmd = RemotingCommand::request(request::CONTROLLER_ELECT_MASTER, 0)
            .with_field(field::BROKER_NAME, group);
        if let Some(id) = broker {
            cmd = cmd.with_field(field::BROKER_ID, id);
        }
        self.call_json(cmd).await
    }

    /// The leader's whole view: controllers, groups, masters, epochs, in-sync sets, liveness.
    pub async fn status(&self) -> Result<wire::Status, Error> {
        self.call_json(RemotingCommand::request(
            request::CONTROLLER_GET_SYNC_STATE_DATA,
            0,
        ))
        .await
    }

    /// What the controller at `addr` itself knows (any controller answers, no redirect).
    pub async fn metadata(&self, addr: &str) -> Result<wire::Metadata, Error> {
        let link = self.link(addr).await?;
        let r = link
            .call(
                RemotingCommand::request(request::CONTROLLER_GET_METADATA_INFO, 0),
                self.call_timeout,
            )
            .await?;
        serde_json::from_slice(&r.body).map_err(|e| Error::BadAnswer(e.to_string()))
    }
}
