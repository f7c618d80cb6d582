//! [`NameServerRoutes`]: the [`RouteSource`] over the NameServers —
//! `GET_ROUTEINFO_BY_TOPIC` for a topic's placements (each broker group's master
//! address, queue counts and permission) and `GET_BROKER_CLUSTER_INFO` for every
//! master, asked of the NameServers in turn through the native client's session (its
//! links, TLS and request signing). Nothing is cached here: the [`super::Cluster`]
//! keeps the routes and refreshes them.

use std::sync::Arc;

use rocketgate_core::broker::Perm;
use rocketgate_core::{Error, Result};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::protocol::{ClusterInfo, MASTER_ID, TopicRouteData, field, from_json};

use super::route::{BrokerAddr, Placement, RouteSource, TopicRoute};
use super::unavailable;
use crate::client::ClientSettings;
use crate::client::session::Session;

/// Routes from the NameServers of a [`ClientSettings`] (its NameServer list, request
/// timeout, TLS and credentials are used; its refresh and heartbeat intervals are not).
pub struct NameServerRoutes {
    session: Arc<Session>,
}

impl NameServerRoutes {
    /// Needs a tokio runtime (the client session starts a task).
    pub fn new(settings: ClientSettings) -> NameServerRoutes {
        let (session, mut pushed) = Session::start(settings);
        // Nothing is subscribed through this session: drain what brokers push.
        tokio::spawn(async move { while pushed.recv().await.is_some() {} });
        NameServerRoutes { session }
    }
}

/// The placements of a route as the NameServers answer it: brokers without a
/// master are left out (nothing can be sent to or acked on them).
pub fn placements(data: &TopicRouteData) -> Vec<Placement> {
    data.queue_datas
        .iter()
        .filter_map(|q| {
            let broker = data
                .broker_datas
                .iter()
                .find(|b| b.broker_name == q.broker_name)?;
            let addr = broker.broker_addrs.get(&MASTER_ID)?;
            Some(Placement {
                broker: q.broker_name.clone(),
                addr: addr.clone(),
                read_queues: q.read_queue_nums,
                write_queues: q.write_queue_nums,
                perm: Perm(u8::try_from(q.perm & 0xff).unwrap_or(0)),
            })
        })
        .collect()
}

fn failed(what: &str, e: crate::Error) -> Error {
    unavailable(format!("NameServers: {what}: {e}"))
}

impl RouteSource for NameServerRoutes {
    async fn route(&self, topic: &str) -> Result<Option<TopicRoute>> {
        let cmd = RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 0)
            .with_field(field::TOPIC, topic)
            .with_field(field::ACCEPT_STANDARD_JSON_ONLY, true);
        let resp = match self.session.namesrv_call(cmd).await {
            Ok(r) => r,
            Err(e) if e.code() == Some(response::TOPIC_NOT_EXIST) => return Ok(None),
            Err(e) => return Err(failed(&format!("route of {topic:?}"), e)),
        };
        let data: TopicRouteData = from_json(&resp.body)
            .map_err(|e| unavailable(format!("NameServers: malformed route of {topic:?}: {e}")))?;
        let route = TopicRoute::new(placements(&data));
        Ok((!route.is_empty()).then_some(route))
    }

    async fn brokers(&self) -> Result<Vec<BrokerAddr>> {
        let resp = self
            .session
            .namesrv_call(RemotingCommand::request(
                request::GET_BROKER_CLUSTER_INFO,
                0,
            ))
            .await
            .map_err(|e| failed("cluster info", e))?;
        let info: ClusterInfo = from_json(&resp.body)
            .map_err(|e| unavailable(format!("NameServers: malformed cluster info: {e}")))?;
        let mut brokers: Vec<BrokerAddr> = info
            .broker_addr_table
            .into_values()
            .filter_map(|b| {
                Some(BrokerAddr {
                    addr: b.broker_addrs.get(&MASTER_ID)?.clone(),
                    name: b.broker_name,
                })
            })
            .collect();
        brokers.sort();
        Ok(brokers)
    }
}
