//! The controller's requests and answers on the remoting protocol: codes, ext-field names
//! and JSON bodies. Client requests use RocketMQ's `CONTROLLER_*` request and response
//! codes (RocketMQ 5's `RequestCode`/`ResponseCode`); the Raft messages between
//! controllers are ours (RocketMQ's controllers speak DLedger's or JRaft's own protocol).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::state::{BrokerId, Group, Rejection};

/// Request codes.
pub mod request {
    pub const CONTROLLER_ALTER_SYNC_STATE_SET: i32 = 1001;
    pub const CONTROLLER_ELECT_MASTER: i32 = 1002;
    pub const CONTROLLER_REGISTER_BROKER: i32 = 1003;
    pub const CONTROLLER_GET_REPLICA_INFO: i32 = 1004;
    pub const CONTROLLER_GET_METADATA_INFO: i32 = 1005;
    pub const CONTROLLER_GET_SYNC_STATE_DATA: i32 = 1006;
    /// A broker's heartbeat (RocketMQ's `BROKER_HEARTBEAT`, which its controller takes too).
    pub const BROKER_HEARTBEAT: i32 = 904;
    /// Raft between controllers (ours): body = the openraft request as JSON, answer body =
    /// `Result<response, RaftError>` as JSON.
    pub const RAFT_APPEND_ENTRIES: i32 = 1101;
    pub const RAFT_VOTE: i32 = 1102;
    pub const RAFT_INSTALL_SNAPSHOT: i32 = 1103;
}

/// Response codes beyond `SUCCESS` / `SYSTEM_ERROR`.
pub mod response {
    pub const CONTROLLER_FENCED_MASTER_EPOCH: i32 = 2000;
    pub const CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH: i32 = 2001;
    pub const CONTROLLER_INVALID_MASTER: i32 = 2002;
    pub const CONTROLLER_INVALID_REPLICAS: i32 = 2003;
    pub const CONTROLLER_MASTER_NOT_AVAILABLE: i32 = 2004;
    pub const CONTROLLER_INVALID_REQUEST: i32 = 2005;
    pub const CONTROLLER_BROKER_NOT_ALIVE: i32 = 2006;
    pub const CONTROLLER_NOT_LEADER: i32 = 2007;
    pub const CONTROLLER_BROKER_METADATA_NOT_EXIST: i32 = 2008;
    pub const CONTROLLER_ELECT_MASTER_FAILED: i32 = 2012;
}

/// Ext-field names.
pub mod field {
    pub const BROKER_NAME: &str = "brokerName";
    pub const BROKER_ID: &str = "brokerId";
    pub const BROKER_ADDRESS: &str = "brokerAddress";
    /// The broker's replication port (ours: RocketMQ 5 learns it from the master's
    /// register answer to the NameServer).
    pub const HA_ADDRESS: &str = "haAddress";
    pub const MAX_OFFSET: &str = "maxOffset";
    pub const EPOCH: &str = "epoch";
    pub const MASTER_EPOCH: &str = "masterEpoch";
    pub const SYNC_STATE_SET_EPOCH: &str = "syncStateSetEpoch";
    /// On a `CONTROLLER_NOT_LEADER` answer: the leader, when known.
    pub const LEADER_ID: &str = "leaderId";
    pub const LEADER_ADDRESS: &str = "leaderAddress";
}

/// Maps a state-machine rejection to its response code.
pub fn code_of(why: Rejection) -> i32 {
    match why {
        Rejection::FencedMasterEpoch => response::CONTROLLER_FENCED_MASTER_EPOCH,
        Rejection::FencedSyncEpoch => response::CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
        Rejection::InvalidMaster => response::CONTROLLER_INVALID_MASTER,
        Rejection::InvalidReplicas => response::CONTROLLER_INVALID_REPLICAS,
        Rejection::UnknownBroker => response::CONTROLLER_BROKER_METADATA_NOT_EXIST,
        Rejection::NoCandidate => response::CONTROLLER_ELECT_MASTER_FAILED,
        Rejection::NotAlive => response::CONTROLLER_BROKER_NOT_ALIVE,
    }
}

/// One group as brokers and admins get it (body of register, heartbeat, replica info,
/// elect, alter answers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReplicaInfo {
    pub broker_name: String,
    /// Absent when the group has no master.
    pub master_id: Option<BrokerId>,
    pub master_address: Option<String>,
    /// The master's replication port, where slaves follow it.
    pub master_ha_address: Option<String>,
    pub master_epoch: u64,
    pub sync_state_set: BTreeSet<BrokerId>,
    pub sync_state_set_epoch: u64,
    /// Every registered broker: id -> address.
    pub replicas: BTreeMap<BrokerId, String>,
    /// The controllers' `broker_timeout` in ms: a master silent this long is replaced. A
    /// master's write lease is derived from it (docs/controller.md, "The lease rule").
    pub broker_timeout_ms: Option<u64>,
}

impl ReplicaInfo {
    pub fn of(name: &str, g: &Group) -> ReplicaInfo {
        ReplicaInfo {
            broker_name: name.to_owned(),
            master_id: g.master,
            master_address: g.master_addr().map(str::to_owned),
            master_ha_address: g.master_ha_addr().map(str::to_owned),
            master_epoch: g.master_epoch,
            sync_state_set: g.sync_set.clone(),
            sync_state_set_epoch: g.sync_epoch,
            replicas: g.replicas.clone(),
            broker_timeout_ms: None,
        }
    }
}

/// One replica in the status view, with what the leader knows of its liveness.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub broker_id: BrokerId,
    pub address: String,
    pub alive: bool,
    /// Milliseconds since its last heartbeat reached this leader; absent if none did.
    pub last_heartbeat_ms_ago: Option<u64>,
    pub max_offset: Option<i64>,
    pub epoch: Option<u64>,
}

/// A group in the status view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GroupStatus {
    /// (Nested, not flattened: serde cannot read integer map keys back through `flatten`.)
    pub info: ReplicaInfo,
    pub replica_status: Vec<ReplicaStatus>,
}

/// The body of a `CONTROLLER_GET_SYNC_STATE_DATA` answer: the leader's whole view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Status {
    pub leader_id: u64,
    pub leader_address: String,
    pub term: u64,
    /// Controller id -> address, from the Raft membership.
    pub controllers: BTreeMap<u64, String>,
    pub groups: Vec<GroupStatus>,
}

/// The body of a `CONTROLLER_GET_METADATA_INFO` answer (any controller answers it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Metadata {
    pub id: u64,
    pub leader_id: Option<u64>,
    pub leader_address: Option<String>,
    pub is_leader: bool,
    pub term: u64,
    pub last_applied: Option<u64>,
}

/// The body of `CONTROLLER_ALTER_SYNC_STATE_SET`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SyncStateSetBody {
    pub sync_state_set: BTreeSet<BrokerId>,
}
