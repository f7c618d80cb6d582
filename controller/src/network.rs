//! Raft between controllers over our remoting transport: one [`Link`] per peer, opened on
//! first use and again after it closes. A request is the openraft message as JSON in the
//! body of a `RAFT_*` request; the answer's body is `Result<response, RaftError>` as JSON.

use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::client::Link;
use rocketgate_remoting::code::response::SUCCESS;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::TypeConfig;
use crate::wire::request;

type NodeId = u64;

/// Opens a [`Peer`] per target; openraft asks once per replication stream.
#[derive(Clone, Default)]
pub struct Network {
    /// TLS to the other controllers (`controller.ca`); `None`: plain.
    pub tls: Option<rocketgate_tls::Dialer>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            target,
            addr: node.addr.clone(),
            link: None,
            tls: self.tls.clone(),
        }
    }
}

/// The connection to one other controller.
pub struct Peer {
    target: NodeId,
    addr: String,
    link: Option<Arc<Link>>,
    tls: Option<rocketgate_tls::Dialer>,
}

impl Peer {
    async fn call<Req, Resp, E>(
        &mut self,
        code: i32,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let link = match &self.link {
            Some(l) if !l.is_closed() => l.clone(),
            _ => {
                let l = match &self.tls {
                    None => Link::connect(&self.addr, timeout, None)
                        .await
                        .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?,
                    Some(d) => {
                        let tls = d
                            .connect(&self.addr, timeout)
                            .await
                            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
                        Link::over(&self.addr, tls, None)
                    }
                };
                let l = Arc::new(l);
                self.link = Some(l.clone());
                l
            }
        };
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let cmd = RemotingCommand::request(code, 0).with_body(body);
        let resp = link.call(cmd, timeout).await.map_err(|e| {
            self.link = None;
            RPCError::Network(NetworkError::new(&e))
        })?;
        if resp.code != SUCCESS {
            let e = std::io::Error::other(format!(
                "controller {} answered {}: {}",
                self.addr,
                resp.code,
                resp.remark.unwrap_or_default()
            ));
            return Err(RPCError::Network(NetworkError::new(&e)));
        }
        let result: Result<Resp, RaftError<NodeId, E>> = serde_json::from_slice(&resp.body)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(request::RAFT_APPEND_ENTRIES, &rpc, option.hard_ttl())
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(request::RAFT_INSTALL_SNAPSHOT, &rpc, option.hard_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(request::RAFT_VOTE, &rpc, option.hard_ttl()).await
    }
}
