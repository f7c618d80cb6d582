//! Calls made on several groups at once, and how their outcomes add up: "unavailable"
//! groups left out while one answered, topic changes all-or-reported, checkers that
//! name their group.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::join_all;
use rocketgate_core::broker::{HalfMessage, MessagingApi, TopicConfig, TransactionChecker};
use rocketgate_core::{Error, Result};
use tracing::warn;

use super::route::{BrokerAddr, Placement, RouteSource, TopicRoute};
use super::{Cluster, cannot_write, unavailable};

/// A transaction checker that names the broker in the handles it is given.
struct Named {
    broker: String,
    inner: Arc<dyn TransactionChecker>,
}

impl TransactionChecker for Named {
    fn check(&self, mut half: HalfMessage) {
        half.handle.broker = Some(self.broker.clone());
        self.inner.check(half);
    }
}

pub(super) fn named_checker(
    broker: &str,
    inner: Arc<dyn TransactionChecker>,
) -> Arc<dyn TransactionChecker> {
    Arc::new(Named {
        broker: broker.to_owned(),
        inner,
    })
}

/// The outcome of a call made on several groups: the first refusal that is not
/// "unavailable" wins; unavailable groups are left out (logged) as long as one
/// answered.
pub(super) fn gather<T>(what: &str, results: Vec<(String, Result<T>)>) -> Result<Vec<(String, T)>> {
    let mut ok = Vec::with_capacity(results.len());
    let mut down = None;
    for (broker, r) in results {
        match r {
            Ok(v) => ok.push((broker, v)),
            Err(e) if cannot_write(&e) => {
                warn!(broker, what, error = %e, "group unavailable; left out");
                down.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match down {
        Some(e) if ok.is_empty() => Err(e),
        _ => Ok(ok),
    }
}

impl<M, R> Cluster<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// Creates a topic on the named groups (RocketMQ `updateTopic -b`), each with the
    /// config's queue counts; every group's outcome, in name order. An unknown name
    /// is an error of its own entry.
    pub async fn create_topic_on(
        &self,
        brokers: &[&str],
        config: TopicConfig,
    ) -> Vec<(String, Result<TopicConfig>)> {
        let name = config.name.clone();
        let out = self
            .on_brokers(brokers, |m| {
                let config = config.clone();
                async move { m.create_topic(config).await }
            })
            .await;
        self.forget(&name);
        out
    }

    /// Changes a topic's queue counts or permission on the named groups (RocketMQ
    /// `updateTopic -b` on a topic that exists), each with the config's counts.
    pub async fn update_topic_on(
        &self,
        brokers: &[&str],
        config: TopicConfig,
    ) -> Vec<(String, Result<TopicConfig>)> {
        let name = config.name.clone();
        let out = self
            .on_brokers(brokers, |m| {
                let config = config.clone();
                async move { m.update_topic(config).await }
            })
            .await;
        self.forget(&name);
        out
    }

    /// Deletes a topic on the named groups (RocketMQ `deleteTopic` on a cluster's
    /// brokers).
    pub async fn delete_topic_on(
        &self,
        brokers: &[&str],
        topic: &str,
    ) -> Vec<(String, Result<()>)> {
        let out = self
            .on_brokers(brokers, |m| {
                let topic = topic.to_owned();
                async move { m.delete_topic(&topic).await }
            })
            .await;
        self.forget(topic);
        out
    }

    /// `op` on the master of each named group (the NameServers' current view), all
    /// at once; every group's outcome, in name order. An unknown name is an error of
    /// its own entry.
    pub async fn on_brokers<T, F, Fut>(&self, brokers: &[&str], op: F) -> Vec<(String, Result<T>)>
    where
        F: Fn(Arc<M>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let known = match self.inner.refresh_brokers().await {
            Ok(k) => k,
            Err(e) => {
                return brokers
                    .iter()
                    .map(|b| ((*b).to_owned(), Err(unavailable(e.to_string()))))
                    .collect();
            }
        };
        let mut names: Vec<&str> = brokers.to_vec();
        names.sort_unstable();
        names.dedup();
        let calls = names.into_iter().map(|name| {
            let known = known.clone();
            let op = &op;
            async move {
                let r = match known.iter().find(|b| b.name == name) {
                    None => Err(Error::InvalidArgument(format!(
                        "no broker group {name:?} in the cluster"
                    ))),
                    Some(b) => match self.member_at(b).await {
                        Ok(m) => op(m).await,
                        Err(e) => Err(e),
                    },
                };
                (name.to_owned(), r)
            }
        });
        join_all(calls).await
    }

    /// The topic as one after a change made on `groups` groups with `config`'s
    /// counts: from the route when it shows every group already, else as the change
    /// made it (the NameServers learn of it with the brokers' next registration).
    pub(super) async fn settled_config(&self, config: TopicConfig, groups: usize) -> TopicConfig {
        if let Ok(Some(r)) = self.refresh_route(&config.name).await
            && r.placements().len() >= groups
        {
            return r.config(&config.name);
        }
        let n = u32::try_from(groups).unwrap_or(u32::MAX);
        TopicConfig {
            read_queues: config
                .read_queues
                .max(config.write_queues)
                .saturating_mul(n),
            write_queues: config.write_queues.saturating_mul(n),
            ..config
        }
    }

    /// Every group's member with the result of `op` on it, all at once.
    pub(super) async fn on_all<T, F, Fut>(&self, op: F) -> Result<Vec<(String, Result<T>)>>
    where
        F: Fn(Arc<M>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let members = self.all_members().await?;
        if members.is_empty() {
            return Err(unavailable("no broker group is known".into()));
        }
        let calls = members.into_iter().map(|(b, m)| {
            let f = op(m);
            async move { (b.name, f.await) }
        });
        Ok(join_all(calls).await)
    }

    /// `op` on every group of `route`, all at once.
    pub(super) async fn on_route<T, F, Fut>(
        &self,
        route: &TopicRoute,
        op: F,
    ) -> Vec<(String, Result<T>)>
    where
        F: Fn(Arc<M>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let members = self.route_members(route).await;
        let calls = members.into_iter().map(|(b, m)| {
            let f = m.map(&op);
            async move {
                let r = match f {
                    Ok(f) => f.await,
                    Err(e) => Err(e),
                };
                (b.name, r)
            }
        });
        join_all(calls).await
    }

    /// Like [`Self::on_route`], `op` also told which group it runs on.
    pub(super) async fn on_route_named<T, F, Fut>(
        &self,
        route: &TopicRoute,
        op: F,
    ) -> Vec<(String, Result<T>)>
    where
        F: Fn(&str, Arc<M>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let members = self.route_members(route).await;
        let calls = members.into_iter().map(|(b, m)| {
            let f = m.map(|m| op(&b.name, m));
            async move {
                let r = match f {
                    Ok(f) => f.await,
                    Err(e) => Err(e),
                };
                (b.name, r)
            }
        });
        join_all(calls).await
    }

    /// Everything a listing of groups found, merged by topic name.
    pub(super) fn merge_topics(found: Vec<(BrokerAddr, Vec<TopicConfig>)>) -> Vec<TopicConfig> {
        let mut by_name: BTreeMap<String, Vec<Placement>> = BTreeMap::new();
        for (b, configs) in found {
            for c in configs {
                by_name.entry(c.name.clone()).or_default().push(Placement {
                    broker: b.name.clone(),
                    addr: b.addr.clone(),
                    read_queues: c.read_queues,
                    write_queues: c.write_queues,
                    perm: c.perm,
                });
            }
        }
        by_name
            .into_iter()
            .map(|(name, p)| TopicRoute::new(p).config(&name))
            .collect()
    }
}

/// The outcome of a change made on several groups: done everywhere (a refusal
/// `fine` counts as done), refused everywhere (the first refusal), or a clear
/// account of where it was done and where not.
pub(super) fn all_or_report(
    topic: &str,
    what: &str,
    results: Vec<(String, Result<TopicConfig>)>,
    fine: impl Fn(&Error) -> bool,
) -> Result<()> {
    let total = results.len();
    let mut done = Vec::new();
    let mut failed = Vec::new();
    let mut first_refusal = None;
    let mut changed = 0;
    for (broker, r) in results {
        match r {
            Ok(_) => {
                changed += 1;
                done.push(broker);
            }
            Err(e) if fine(&e) => {
                first_refusal.get_or_insert(e);
                done.push(broker);
            }
            Err(e) => failed.push((broker, e)),
        }
    }
    if failed.is_empty() {
        // Nothing changed anywhere: the refusal is the answer.
        return match first_refusal {
            Some(e) if changed == 0 => Err(e),
            _ => Ok(()),
        };
    }
    if failed.len() == total {
        return Err(failed.remove(0).1);
    }
    let why: Vec<String> = failed.iter().map(|(b, e)| format!("{b}: {e}")).collect();
    Err(unavailable(format!(
        "topic {topic:?} {what} on {} of {total} broker groups ({}); failed on {}",
        done.len(),
        done.join(", "),
        why.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists() -> Error {
        Error::TopicExists { topic: "t".into() }
    }

    fn down() -> Error {
        unavailable("gone".into())
    }

    fn ok() -> Result<TopicConfig> {
        Ok(TopicConfig::new("t", 1))
    }

    #[test]
    fn a_change_is_done_everywhere_refused_everywhere_or_reported() {
        let is_exists = |e: &Error| matches!(e, Error::TopicExists { .. });
        let r = |v: Vec<Result<TopicConfig>>| -> Vec<(String, Result<TopicConfig>)> {
            v.into_iter()
                .enumerate()
                .map(|(i, r)| (format!("b{i}"), r))
                .collect()
        };
        assert!(all_or_report("t", "created", r(vec![ok(), ok()]), is_exists).is_ok());
        // Had it already somewhere: done.
        assert!(all_or_report("t", "created", r(vec![ok(), Err(exists())]), is_exists).is_ok());
        // Had it everywhere: the refusal.
        let e = all_or_report(
            "t",
            "created",
            r(vec![Err(exists()), Err(exists())]),
            is_exists,
        );
        assert!(matches!(e, Err(Error::TopicExists { .. })), "{e:?}");
        // Failed everywhere: the first failure as it was.
        let e = all_or_report("t", "created", r(vec![Err(down()), Err(down())]), is_exists);
        assert!(matches!(e, Err(Error::NotLeader { .. })), "{e:?}");
        // Partly: says where it was done and why not elsewhere.
        let e = all_or_report("t", "created", r(vec![ok(), Err(down())]), is_exists)
            .unwrap_err()
            .to_string();
        assert!(e.contains("created on 1 of 2 broker groups (b0)"), "{e}");
        assert!(e.contains("failed on b1: gone"), "{e}");
    }

    #[test]
    fn unavailable_groups_are_left_out_while_one_answers() {
        let both = vec![("a".to_owned(), Ok(1)), ("b".to_owned(), Err(down()))];
        assert_eq!(gather("x", both).unwrap(), vec![("a".to_owned(), 1)]);
        let none: Vec<(String, Result<u32>)> = vec![("a".to_owned(), Err(down()))];
        assert!(gather("x", none).is_err());
        let refused = vec![
            ("a".to_owned(), Ok(1)),
            (
                "b".to_owned(),
                Err(Error::GroupNotFound { group: "g".into() }),
            ),
        ];
        assert!(matches!(
            gather("x", refused),
            Err(Error::GroupNotFound { .. })
        ));
    }
}
