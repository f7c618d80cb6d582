//! Where a send goes: the plan (the first group and queue, and another group for one
//! retry) and the attempt that follows it, and the queue ids of what was stored.
//!
//! The plan is made without allocating: groups are named by their index in the
//! route (or in the broker list, for a topic no group hosts yet), and the paused
//! groups are read under one lock.

use std::sync::Arc;

use rocketgate_core::broker::{MessagingApi, QueueChoice, SendResult, sharding_queue};
use rocketgate_core::sync::lock;
use rocketgate_core::{Error, Result};
use tracing::warn;

use super::route::{BrokerAddr, Placement, RouteSource, TopicRoute};
use super::{Cluster, cannot_write, turn, unavailable};

/// The groups a plan's targets are indices into.
enum Groups {
    /// The topic's route: targets are placements.
    Route(Arc<TopicRoute>),
    /// No group hosts the topic: targets are brokers of the cluster.
    Unrouted(Arc<Vec<BrokerAddr>>),
}

/// Where a send goes: a group (an index into the plan's groups) and the queue
/// choice it is given.
#[derive(Debug, Clone)]
pub(super) struct Target {
    at: usize,
    choice: QueueChoice,
}

/// The targets of one send: the first, and another group for one retry.
pub(super) struct Plan {
    groups: Groups,
    first: Target,
    retry: Option<Target>,
}

impl Plan {
    /// Name and address of a target's group.
    fn group(&self, t: &Target) -> (&str, &str) {
        match &self.groups {
            Groups::Route(r) => {
                let p = &r.placements()[t.at];
                (&p.broker, &p.addr)
            }
            Groups::Unrouted(b) => (&b[t.at].name, &b[t.at].addr),
        }
    }

    /// Name of the group that took the send (`at` from [`Cluster::attempt`]).
    pub(super) fn name(&self, at: usize) -> &str {
        self.group(&Target {
            at,
            choice: QueueChoice::RoundRobin,
        })
        .0
    }

    /// The global id of local queue `local` of the group at `at`, when the plan
    /// went by the topic's route.
    pub(super) fn global(&self, at: usize, local: u32) -> Option<u32> {
        match &self.groups {
            Groups::Route(r) => Some(r.base_at(at) + local),
            Groups::Unrouted(_) => None,
        }
    }

    fn is_routed(&self) -> bool {
        matches!(self.groups, Groups::Route(_))
    }
}

pub(super) fn broker_of(p: &Placement) -> BrokerAddr {
    BrokerAddr {
        name: p.broker.clone(),
        addr: p.addr.clone(),
    }
}

/// The `k`-th writable queue (global order) of the placements `skip` leaves in:
/// `(placement index, local queue)`.
fn nth_writable(
    route: &TopicRoute,
    mut k: u32,
    skip: impl Fn(&Placement) -> bool,
) -> Option<(usize, u32)> {
    for (i, p) in route.placements().iter().enumerate() {
        if skip(p) {
            continue;
        }
        let n = p.writable();
        if k < n {
            return Some((i, k));
        }
        k -= n;
    }
    None
}

impl<M, R> Cluster<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// The groups whose sends failed recently (usually none: no allocation).
    fn paused(&self) -> Vec<String> {
        let now = std::time::Instant::now();
        lock(&self.inner.members)
            .iter()
            .filter(|(_, s)| s.paused_until.is_some_and(|t| t > now))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Where a send of `topic` goes; see the module docs for the rules.
    pub(super) async fn plan(&self, topic: &str, choice: &QueueChoice) -> Result<Plan> {
        let route = match self.route(topic).await {
            Ok(r) => r,
            Err(Error::TopicNotFound { .. }) => return self.plan_unrouted(choice).await,
            Err(e) => return Err(e),
        };
        let all = route.writable_count(|_| false);
        if all == 0 {
            return Err(Error::NoPermission {
                topic: topic.to_owned(),
                operation: "write",
            });
        }
        let target = |(at, q): (usize, u32)| Target {
            at,
            choice: QueueChoice::Queue(q),
        };
        let (first, retry) = match choice {
            QueueChoice::RoundRobin => {
                let paused = self.paused();
                let is_paused = |p: &Placement| paused.contains(&p.broker);
                let live = route.writable_count(is_paused);
                let k = turn(
                    &self.inner.next_queue,
                    (if live > 0 { live } else { all }) as usize,
                );
                let k = u32::try_from(k).unwrap_or(0);
                let first = if live > 0 {
                    nth_writable(&route, k, is_paused)
                } else {
                    nth_writable(&route, k, |_| false)
                };
                let first = first.ok_or_else(|| unavailable("no writable queue".into()))?;
                // The retry: a queue of the next group after the first's that takes
                // writes (a live one if there is one).
                let others = |live_only: bool| {
                    let n = route.placements().len();
                    (1..n).map(move |d| (first.0 + d) % n).find(|&i| {
                        let p = &route.placements()[i];
                        p.writable() > 0 && !(live_only && is_paused(p))
                    })
                };
                let retry = others(true).or_else(|| others(false)).map(|i| {
                    let q = k % route.placements()[i].writable();
                    (i, q)
                });
                (target(first), retry.map(target))
            }
            QueueChoice::ShardingKey(key) => {
                let at = sharding_queue(key, all);
                let first = nth_writable(&route, at, |_| false)
                    .ok_or_else(|| unavailable("no writable queue".into()))?;
                (target(first), None)
            }
            QueueChoice::Queue(q) => {
                let (at, local) = route.locate_index(*q).ok_or_else(|| Error::QueueNotFound {
                    topic: topic.to_owned(),
                    queue_id: *q,
                    queues: route.queue_count(),
                })?;
                (target((at, local)), None)
            }
        };
        Ok(Plan {
            groups: Groups::Route(route),
            first,
            retry,
        })
    }

    /// A topic no group hosts yet: the send goes to one group (round-robin over the
    /// groups), whose auto-create rule decides; the queue ids it answers are then
    /// the global ones, as that group is the topic's only one.
    async fn plan_unrouted(&self, choice: &QueueChoice) -> Result<Plan> {
        let brokers = self.brokers().await?;
        if brokers.is_empty() {
            return Err(unavailable("no broker group is known".into()));
        }
        let paused = self.paused();
        let live: Vec<usize> = (0..brokers.len())
            .filter(|&i| !paused.contains(&brokers[i].name))
            .collect();
        let pool: Vec<usize> = if live.is_empty() {
            (0..brokers.len()).collect()
        } else {
            live
        };
        let at = turn(&self.inner.next_queue, pool.len());
        let retry = (pool.len() > 1 && *choice == QueueChoice::RoundRobin).then(|| Target {
            at: pool[(at + 1) % pool.len()],
            choice: choice.clone(),
        });
        Ok(Plan {
            groups: Groups::Unrouted(brokers),
            first: Target {
                at: pool[at],
                choice: choice.clone(),
            },
            retry,
        })
    }

    /// Runs `op` on the plan's first target, and once on its retry target when the
    /// first group cannot take writes now. Returns which group took it (for
    /// [`Plan::name`]) and what it answered.
    pub(super) async fn attempt<T, F, Fut>(
        &self,
        topic: &str,
        plan: &Plan,
        op: F,
    ) -> Result<(usize, T)>
    where
        F: Fn(Arc<M>, QueueChoice) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let (name, addr) = plan.group(&plan.first);
        let first = async {
            // A group whose member cannot be made (unreachable) cannot take writes.
            let m = self
                .inner
                .member_at(name, addr)
                .await
                .map_err(|e| unavailable(format!("broker {name}: {e}")))?;
            op(m, plan.first.choice.clone()).await
        };
        match first.await {
            Ok(v) => Ok((plan.first.at, v)),
            Err(e) if cannot_write(&e) => {
                self.pause(name, topic);
                let Some(retry) = &plan.retry else {
                    return Err(e);
                };
                let (to, to_addr) = plan.group(retry);
                warn!(from = name, to, error = %e, "send moved to another group");
                let m = self.inner.member_at(to, to_addr).await?;
                let v = op(m, retry.choice.clone()).await?;
                Ok((retry.at, v))
            }
            Err(e) => {
                self.settle(plan, topic);
                Err(e)
            }
        }
    }

    /// After a send: the route of `topic` if the plan had none (the send may have
    /// created the topic), so later sends see it.
    pub(super) fn settle(&self, plan: &Plan, topic: &str) {
        if !plan.is_routed() {
            self.forget(topic);
        }
    }

    /// What a send stored, with the global queue id.
    pub(super) async fn send_result(
        &self,
        plan: &Plan,
        topic: &str,
        at: usize,
        mut s: SendResult,
    ) -> SendResult {
        s.queue_id = match &plan.groups {
            Groups::Route(r) if s.topic == topic => r.base_at(at) + s.queue_id,
            _ => self.global(&s.topic, plan.name(at), s.queue_id).await,
        };
        s
    }
}
