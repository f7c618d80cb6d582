//! # rocketgate-controller
//!
//! The controller of automatic failover (RocketMQ 5's controller mode): a small state
//! machine replicated with Raft ([openraft]) that holds, per broker group, the master's id
//! and address, the **master epoch**, the **in-sync set** (SyncStateSet) with its own
//! epoch, and the registered replicas. Brokers register and heartbeat to the leader; when a
//! master is silent past `broker_timeout` the leader elects a live member of its in-sync
//! set (the one with the largest offset) at epoch + 1 — never a broker outside the set
//! unless `allow_unclean_election`.
//!
//! It owns no commit log and is not on the data path: the broker's own HA stream
//! (`rocketgate_remoting::ha`) replicates messages; this crate only decides who is master.
//! It must not import the core or any door (layer 3 beside the NameServer); the binary runs
//! it alone (`rocketgate controller`) or inside the NameServer process.
//!
//! Start reading at [`state`] (the pure rules: commands, compare-and-set on epochs,
//! [`state::pick_master`]), then [`node::Controller::start`] (the Raft node, the server and
//! the leader's watch over masters), [`store`] (durable log, vote and snapshot) and
//! [`network`] (Raft over our remoting `Link`). Clients use [`ControllerClient`].
//! `docs/controller.md` has the requests, the timing and the broker's side.

pub mod client;
pub mod network;
pub mod node;
pub mod state;
pub mod store;
pub mod wire;

use std::io::Cursor;

pub use client::{ControllerClient, Heartbeat};
pub use node::{Controller, ControllerSettings};

openraft::declare_raft_types!(
    /// The controller's Raft types: log entries carry [`state::Command`]s, applying one
    /// gives a [`state::Outcome`]; nodes are `u64` ids with a `host:port`.
    pub TypeConfig:
        D = state::Command,
        R = state::Outcome,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The controller crate's errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("controller configuration: {0}")]
    Config(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error(transparent)]
    Remoting(#[from] rocketgate_remoting::Error),
    /// The controllers answered with an error code.
    #[error("controller refused ({code}): {remark}")]
    Rejected { code: i32, remark: String },
    /// No controller led within the client's retry window.
    #[error("no controller leader reachable (last: {last})")]
    NoLeader { last: String },
    #[error("controller answer does not parse: {0}")]
    BadAnswer(String),
}

/// Parses `1=host:port,2=host:port,...` (`;` works too) into controller id -> address.
pub fn parse_peers(list: &str) -> Result<std::collections::BTreeMap<u64, String>, Error> {
    let mut out = std::collections::BTreeMap::new();
    for part in list
        .split([',', ';'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| Error::Config(format!("peer {part:?} is not ID=HOST:PORT")))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| Error::Config(format!("peer id {id:?} is not a number")))?;
        if out.insert(id, addr.trim().to_owned()).is_some() {
            return Err(Error::Config(format!("peer id {id} given twice")));
        }
    }
    if out.is_empty() {
        return Err(Error::Config("no controller peers given".into()));
    }
    Ok(out)
}

pub(crate) fn now_ms() -> u64 {
    rocketgate_base::clock::now_ms().max(0) as u64
}
