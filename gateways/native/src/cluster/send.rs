//! Where a send goes: the plan (the first group and queue, and another group for one
//! retry) and the attempt that follows it, and the queue ids of what was stored.

use std::sync::Arc;

use rocketgate_core::broker::{MessagingApi, QueueChoice, SendResult, sharding_queue};
use rocketgate_core::{Error, Result};
use tracing::warn;

use super::route::{BrokerAddr, Placement, RouteSource, TopicRoute};
use super::{Cluster, cannot_write, turn, unavailable};

/// Where a send goes: a group and the local queue choice it is given.
#[derive(Debug, Clone)]
pub(super) struct Target {
    broker: BrokerAddr,
    choice: QueueChoice,
}

/// The targets of one send: the first, and another group for one retry.
pub(super) struct Plan {
    /// `None` when no group hosts the topic (it goes to one group, whose
    /// auto-create rule decides).
    route: Option<Arc<TopicRoute>>,
    first: Target,
    retry: Option<Target>,
}

pub(super) fn broker_of(p: &Placement) -> BrokerAddr {
    BrokerAddr {
        name: p.broker.clone(),
        addr: p.addr.clone(),
    }
}

impl<M, R> Cluster<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// Where a send of `topic` goes; see the module docs for the rules.
    pub(super) async fn plan(&self, topic: &str, choice: &QueueChoice) -> Result<Plan> {
        let route = match self.route(topic).await {
            Ok(r) => r,
            Err(Error::TopicNotFound { .. }) => return self.plan_unrouted(choice).await,
            Err(e) => return Err(e),
        };
        let writable = route.writable();
        if writable.is_empty() {
            return Err(Error::NoPermission {
                topic: topic.to_owned(),
                operation: "write",
            });
        }
        let target = |(i, q): (usize, u32)| Target {
            broker: broker_of(&route.placements()[i]),
            choice: QueueChoice::Queue(q),
        };
        let (first, retry) = match choice {
            QueueChoice::RoundRobin => {
                let live: Vec<(usize, u32)> = writable
                    .iter()
                    .copied()
                    .filter(|(i, _)| !self.is_paused(&route.placements()[*i].broker))
                    .collect();
                let pool = if live.is_empty() { &writable } else { &live };
                let first = pool[turn(&self.inner.next_queue, pool.len())];
                // The retry: the next queue (after the first) on another group.
                let at = pool.iter().position(|x| *x == first).unwrap_or(0);
                let retry = (1..pool.len())
                    .map(|k| pool[(at + k) % pool.len()])
                    .find(|(i, _)| *i != first.0)
                    .or_else(|| writable.iter().copied().find(|(i, _)| *i != first.0));
                (target(first), retry.map(target))
            }
            QueueChoice::ShardingKey(key) => {
                let n = u32::try_from(writable.len()).unwrap_or(u32::MAX);
                let at = sharding_queue(key, n) as usize;
                (target(writable[at]), None)
            }
            QueueChoice::Queue(q) => {
                let (p, local) = route.locate(*q).ok_or_else(|| Error::QueueNotFound {
                    topic: topic.to_owned(),
                    queue_id: *q,
                    queues: route.queue_count(),
                })?;
                (
                    Target {
                        broker: broker_of(p),
                        choice: QueueChoice::Queue(local),
                    },
                    None,
                )
            }
        };
        Ok(Plan {
            route: Some(route),
            first,
            retry,
        })
    }

    /// A topic no group hosts yet: the send goes to one group (round-robin over the
    /// groups), whose auto-create rule decides; the queue ids it answers are then
    /// the global ones, as that group is the topic's only one.
    pub(super) async fn plan_unrouted(&self, choice: &QueueChoice) -> Result<Plan> {
        let brokers = self.brokers().await?;
        if brokers.is_empty() {
            return Err(unavailable("no broker group is known".into()));
        }
        let live: Vec<&BrokerAddr> = brokers
            .iter()
            .filter(|b| !self.is_paused(&b.name))
            .collect();
        let pool: Vec<&BrokerAddr> = if live.is_empty() {
            brokers.iter().collect()
        } else {
            live
        };
        let at = turn(&self.inner.next_queue, pool.len());
        let retry = (pool.len() > 1 && *choice == QueueChoice::RoundRobin).then(|| Target {
            broker: pool[(at + 1) % pool.len()].clone(),
            choice: choice.clone(),
        });
        Ok(Plan {
            route: None,
            first: Target {
                broker: pool[at].clone(),
                choice: choice.clone(),
            },
            retry,
        })
    }

    /// Runs `op` on the plan's first target, and once on its retry target when the
    /// first group cannot take writes now. Returns the group that took it.
    pub(super) async fn attempt<T, F, Fut>(
        &self,
        topic: &str,
        plan: &Plan,
        op: F,
    ) -> Result<(String, T)>
    where
        F: Fn(Arc<M>, QueueChoice) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let first = async {
            // A group whose member cannot be made (unreachable) cannot take writes.
            let m = self
                .member_at(&plan.first.broker)
                .await
                .map_err(|e| unavailable(format!("broker {}: {e}", plan.first.broker.name)))?;
            op(m, plan.first.choice.clone()).await
        };
        match first.await {
            Ok(v) => Ok((plan.first.broker.name.clone(), v)),
            Err(e) if cannot_write(&e) => {
                self.pause(&plan.first.broker.name, topic);
                let Some(retry) = &plan.retry else {
                    return Err(e);
                };
                warn!(from = plan.first.broker.name, to = retry.broker.name, error = %e, "send moved to another group");
                let m = self.member_at(&retry.broker).await?;
                let v = op(m, retry.choice.clone()).await?;
                Ok((retry.broker.name.clone(), v))
            }
            Err(e) => {
                if plan.route.is_none() {
                    self.forget(topic);
                }
                Err(e)
            }
        }
    }

    /// After a send: the route of `topic` if the plan had none (the send may have
    /// created the topic), so later sends see it.
    pub(super) fn settle(&self, plan: &Plan, topic: &str) {
        if plan.route.is_none() {
            self.forget(topic);
        }
    }

    /// What a send stored, with the global queue id.
    pub(super) async fn send_result(
        &self,
        plan: &Plan,
        broker: &str,
        mut s: SendResult,
    ) -> SendResult {
        s.queue_id = match &plan.route {
            Some(r) if r.placements().iter().any(|p| p.broker == broker) => {
                r.global(broker, s.queue_id).unwrap_or(s.queue_id)
            }
            _ => self.global(&s.topic.clone(), broker, s.queue_id).await,
        };
        s
    }
}
