//! `impl MessagingApi for Cluster`: which group each call goes to, and the
//! translation of queue ids and handles on the way back. The rules and their
//! reasons are in the module docs of [`super`] and in `docs/proxy.md`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use rocketgate_core::broker::{
    CheckerRegistration, DeadLetters, DelayLimits, Delayed, Delivered, GroupInfo, HalfSent,
    Heartbeat, MessagingApi, OffsetReset, PopRequest, Popped, PullRequest, PullResult, QueueChoice,
    QueueStats, ReceiptHandle, Resolution, SendBackResult, SendResult, TopicConfig, TopicKind,
    TransactionChecker, TransactionHandle,
};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::{self, BatchSent, EncodedBatch};
use rocketgate_core::sync::lock;
use rocketgate_core::{Error, Result};
use tracing::warn;

use super::fanout::{all_or_report, gather};
use super::route::{BrokerAddr, RouteSource, is_kind};
use super::send::broker_of;
use super::{Checker, Cluster, unavailable};

impl<M, R> Cluster<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// The global id of `broker`'s local `queue` of `topic` (the local id when the
    /// route is unknown or does not name the broker).
    pub(super) async fn global(&self, topic: &str, broker: &str, queue: u32) -> u32 {
        match self.route(topic).await {
            Ok(r) => r.global(broker, queue).unwrap_or(queue),
            Err(_) => queue,
        }
    }

    /// A delivered message with its global queue id.
    async fn delivered(&self, broker: &str, mut d: Delivered) -> Delivered {
        if let Ok(view) = d.view() {
            let topic = view.topic().to_owned();
            d.queue_id = self.global(&topic, broker, d.queue_id).await;
        }
        d
    }

    /// The group owning global queue `queue` of `topic`, and the local id there.
    async fn owner(&self, topic: &str, queue: u32) -> Result<(BrokerAddr, Arc<M>, u32)> {
        let route = self.route(topic).await?;
        let (p, local) = route.locate(queue).ok_or_else(|| Error::QueueNotFound {
            topic: topic.to_owned(),
            queue_id: queue,
            queues: route.queue_count(),
        })?;
        let b = broker_of(p);
        let m = self.member_at(&b).await?;
        Ok((b, m, local))
    }

    /// The group whose master stored the message of an offset message id, if its
    /// address is a known master's.
    async fn store_owner(&self, msg_id: &str) -> Option<(String, Arc<M>)> {
        let (host, _) = record::decode_msg_id(msg_id).ok()?;
        let brokers = self.brokers().await.ok()?;
        let b = brokers.iter().find(|b| {
            b.addr
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a == host)
                || b.addr == host.to_string()
        })?;
        let m = self.member_at(b).await.ok()?;
        Some((b.name.clone(), m))
    }

    /// `op` on the store owner of an id, else on every group until one finds it.
    async fn find_by_id<T, F, Fut>(&self, id: &str, op: F) -> Result<(String, T)>
    where
        F: Fn(Arc<M>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        if let Some((name, m)) = self.store_owner(id).await {
            return op(m).await.map(|v| (name, v));
        }
        let mut last = Error::MessageNotFound {
            what: format!("with id {id:?}"),
        };
        for (b, m) in self.all_members().await? {
            match op(m).await {
                Ok(v) => return Ok((b.name, v)),
                Err(Error::MessageNotFound { .. }) => {}
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A handle's broker and the handle without it, as that broker gave it: cut as
    /// text (the broker checks the rest when it acts on it, as it would without a
    /// proxy), parsed only to explain a handle that is not one of ours.
    fn split_receipt(receipt: &str) -> Result<(String, String)> {
        if let Some((broker, rest)) = receipt.strip_prefix("v2:").and_then(|r| r.split_once(':'))
            && rocketgate_core::broker::schedule::validate_topic(broker).is_ok()
        {
            return Ok((broker.to_owned(), format!("v1:{rest}")));
        }
        let h: ReceiptHandle = receipt.parse()?;
        Err(match h.broker {
            Some(_) => Error::InvalidReceiptHandle {
                handle: receipt.to_owned(),
                reason: "malformed broker name",
            },
            None => Error::InvalidReceiptHandle {
                handle: receipt.to_owned(),
                reason: "names no broker (a proxy over several broker groups hands out v2 handles)",
            },
        })
    }
}

impl<M, R> MessagingApi for Cluster<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// On every group (RocketMQ `updateTopic -c <cluster>`), each with the config's
    /// queue counts. A group that had it already is fine unless all had it.
    async fn create_topic(&self, config: TopicConfig) -> Result<TopicConfig> {
        let brokers = self.inner.refresh_brokers().await?;
        let names: Vec<&str> = brokers.iter().map(|b| b.name.as_str()).collect();
        if names.is_empty() {
            return Err(unavailable("no broker group is known".into()));
        }
        let name = config.name.clone();
        let results = self.create_topic_on(&names, config.clone()).await;
        let groups = results.len();
        all_or_report(&name, "created", results, |e| {
            matches!(e, Error::TopicExists { .. })
        })?;
        Ok(self.settled_config(config, groups).await)
    }

    /// On every group that has the topic, each with the config's queue counts — except
    /// a count equal to the topic's total as [`MessagingApi::topic`] shows it: that is a
    /// read-modify-write that did not touch it (the HTTP door's PATCH of the permission
    /// alone), and each group keeps its own count. Without that rule a permission change
    /// through a proxy would multiply every group's queues by the number of groups.
    async fn update_topic(&self, config: TopicConfig) -> Result<TopicConfig> {
        let name = config.name.clone();
        let route = self
            .refresh_route(&name)
            .await?
            .ok_or_else(|| Error::TopicNotFound {
                topic: name.clone(),
            })?;
        let total = route.config(&name);
        let keep_read = config.read_queues == total.read_queues;
        let keep_write = config.write_queues == total.write_queues;
        let own: BTreeMap<String, (u32, u32)> = route
            .placements()
            .iter()
            .map(|p| (p.broker.clone(), (p.read_queues, p.write_queues)))
            .collect();
        let results = self
            .on_route_named(&route, |broker, m| {
                let mut c = config.clone();
                if let Some((r, w)) = own.get(broker) {
                    if keep_read {
                        c.read_queues = *r;
                    }
                    if keep_write {
                        c.write_queues = *w;
                    }
                }
                async move { m.update_topic(c).await }
            })
            .await;
        self.forget(&name);
        let groups = results.len();
        all_or_report(&name, "updated", results, |_| false)?;
        Ok(self.settled_config(config, groups).await)
    }

    /// On every group; [`Error::TopicNotFound`] only when none had it.
    async fn delete_topic(&self, topic: &str) -> Result<()> {
        let results = self
            .on_all(|m| async move {
                m.delete_topic(topic)
                    .await
                    .map(|()| TopicConfig::new(topic, 1))
            })
            .await?;
        self.forget(topic);
        all_or_report(topic, "deleted", results, |e| {
            matches!(e, Error::TopicNotFound { .. })
        })
    }

    async fn topic(&self, topic: &str) -> Result<TopicConfig> {
        Ok(self.route(topic).await?.config(topic))
    }

    async fn topics(&self, kind: TopicKind) -> Result<Vec<TopicConfig>> {
        let members = self.all_members().await?;
        let calls = members.into_iter().map(|(b, m)| async move {
            let r = m.topics(kind).await;
            (b, r)
        });
        let mut found = Vec::new();
        for (b, r) in join_all(calls).await {
            match r {
                Ok(t) => found.push((b, t.into_iter().filter(|c| is_kind(c, kind)).collect())),
                Err(e) => warn!(broker = b.name, error = %e, "topic listing left out a group"),
            }
        }
        Ok(Self::merge_topics(found))
    }

    async fn send(&self, message: Message, queue: QueueChoice) -> Result<SendResult> {
        let topic = message.topic.clone();
        let plan = self.plan(&topic, &queue).await?;
        let (broker, sent) = self
            .attempt(&topic, &plan, |m, q| {
                let msg = message.clone();
                async move { m.send(msg, q).await }
            })
            .await?;
        self.settle(&plan, &topic);
        Ok(self.send_result(&plan, &topic, broker, sent).await)
    }

    async fn send_batch(
        &self,
        messages: Vec<Message>,
        queue: QueueChoice,
    ) -> Result<Vec<SendResult>> {
        let topic = messages
            .first()
            .map(|m| m.topic.clone())
            .ok_or_else(|| Error::InvalidMessage("an empty batch".into()))?;
        let plan = self.plan(&topic, &queue).await?;
        let (broker, sent) = self
            .attempt(&topic, &plan, |m, q| {
                let batch = messages.clone();
                async move { m.send_batch(batch, q).await }
            })
            .await?;
        self.settle(&plan, &topic);
        let mut out = Vec::with_capacity(sent.len());
        for s in sent {
            out.push(self.send_result(&plan, &topic, broker, s).await);
        }
        Ok(out)
    }

    async fn send_encoded(&self, batch: EncodedBatch, queue: QueueChoice) -> Result<BatchSent> {
        let topic = batch.topic.clone();
        let plan = self.plan(&topic, &queue).await?;
        let (at, mut sent) = self
            .attempt(&topic, &plan, |m, q| {
                let b = batch.clone();
                async move { m.send_encoded(b, q).await }
            })
            .await?;
        self.settle(&plan, &topic);
        sent.queue_id = match plan.global(at, sent.queue_id) {
            Some(q) => q,
            None => self.global(&topic, plan.name(at), sent.queue_id).await,
        };
        Ok(sent)
    }

    async fn send_back(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        delay_level: Option<u8>,
    ) -> Result<SendBackResult> {
        let (b, m, local) = self.owner(topic, queue_id).await?;
        let mut r = m
            .send_back(group, topic, local, offset, delay_level)
            .await?;
        r.sent.queue_id = self.global(&r.sent.topic, &b.name, r.sent.queue_id).await;
        Ok(r)
    }

    /// `All` on every group. `One(offset)` names an offset of one group's DLQ, so
    /// it is refused unless a single group holds the group's dead letters.
    async fn resend_dead_letters(
        &self,
        group: &str,
        which: DeadLetters,
    ) -> Result<Vec<SendResult>> {
        let results = match which {
            DeadLetters::All => {
                self.on_all(|m| async move { m.resend_dead_letters(group, which).await })
                    .await?
            }
            DeadLetters::One(_) => {
                let dlq = rocketgate_core::broker::schedule::dlq_topic(group);
                let route =
                    self.refresh_route(&dlq)
                        .await?
                        .ok_or_else(|| Error::MessageNotFound {
                            what: format!("in {dlq:?}: it does not exist"),
                        })?;
                if route.placements().len() != 1 {
                    return Err(Error::InvalidArgument(format!(
                        "{dlq:?} is on {} broker groups: a dead letter's offset names no single one; resend them all",
                        route.placements().len()
                    )));
                }
                self.on_route(&route, |m| async move {
                    m.resend_dead_letters(group, which).await
                })
                .await
            }
        };
        let mut out = Vec::new();
        for (broker, sent) in gather("resend dead letters", results)? {
            for s in sent {
                let q = self.global(&s.topic, &broker, s.queue_id).await;
                out.push(SendResult { queue_id: q, ..s });
            }
        }
        Ok(out)
    }

    async fn pull(&self, request: PullRequest) -> Result<PullResult> {
        let (_, m, local) = self.owner(&request.topic, request.queue_id).await?;
        let global = request.queue_id;
        let mut r = m
            .pull(PullRequest {
                queue_id: local,
                ..request
            })
            .await?;
        for d in &mut r.messages {
            d.queue_id = global;
        }
        Ok(r)
    }

    async fn pop(&self, request: PopRequest) -> Result<Vec<Popped>> {
        self.pop_detached(request).await
    }

    async fn ack(&self, receipt: &str) -> Result<()> {
        let (broker, inner) = Self::split_receipt(receipt)?;
        self.member_named(&broker).await?.ack(&inner).await
    }

    async fn change_invisibility(
        &self,
        receipt: &str,
        invisible: Duration,
    ) -> Result<ReceiptHandle> {
        let (broker, inner) = Self::split_receipt(receipt)?;
        let mut renewed = self
            .member_named(&broker)
            .await?
            .change_invisibility(&inner, invisible)
            .await?;
        renewed.broker = Some(broker);
        Ok(renewed)
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<()> {
        let (broker, inner) = Self::split_receipt(receipt)?;
        self.member_named(&broker).await?.nack(&inner, delay).await
    }

    /// To every group: each one hands out its own queues among the members it
    /// knows, so all must know every member.
    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<()> {
        let results = self
            .on_all(|m| {
                let h = heartbeat.clone();
                async move { m.heartbeat(h).await }
            })
            .await?;
        gather("heartbeat", results).map(|_| ())
    }

    async fn unregister(&self, group: &str, member: &str) -> Result<()> {
        let results = self
            .on_all(|m| async move { m.unregister(group, member).await })
            .await?;
        gather("unregister", results).map(|_| ())
    }

    /// Every group's share for `member`, in global ids. Each group gives each of
    /// its queues to exactly one member of the ones it knows, and every group
    /// knows the same members (heartbeats go to all), so every global queue has
    /// exactly one owner.
    async fn assignment(&self, group: &str, member: &str, topic: &str) -> Result<Vec<u32>> {
        let route = self.route(topic).await?;
        let results = self
            .on_route(&route, |m| async move {
                m.assignment(group, member, topic).await
            })
            .await;
        let mut out: Vec<u32> = gather("assignment", results)?
            .into_iter()
            .flat_map(|(broker, qs)| {
                let base = route.base(&broker).unwrap_or(0);
                qs.into_iter().map(move |q| base + q)
            })
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    async fn query_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<u64>> {
        let (_, m, local) = self.owner(topic, queue_id).await?;
        m.query_offset(group, member, topic, local).await
    }

    async fn commit_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Result<()> {
        let (_, m, local) = self.owner(topic, queue_id).await?;
        m.commit_offset(group, member, topic, local, offset).await
    }

    async fn reset_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        to: OffsetReset,
    ) -> Result<Vec<(u32, u64)>> {
        let route = self.route(topic).await?;
        let results = self
            .on_route(&route, |m| async move {
                m.reset_offset(group, member, topic, to).await
            })
            .await;
        let mut out: Vec<(u32, u64)> = gather("reset offset", results)?
            .into_iter()
            .flat_map(|(broker, qs)| {
                let base = route.base(&broker).unwrap_or(0);
                qs.into_iter().map(move |(q, o)| (base + q, o))
            })
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    async fn lock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<()> {
        let (_, m, local) = self.owner(topic, queue_id).await?;
        m.lock_queue(group, member, topic, local).await
    }

    async fn unlock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<()> {
        let (_, m, local) = self.owner(topic, queue_id).await?;
        m.unlock_queue(group, member, topic, local).await
    }

    /// Stored by the group the send would go to; the handle names it.
    async fn send_half(
        &self,
        producer_group: &str,
        message: Message,
        queue: QueueChoice,
    ) -> Result<HalfSent> {
        let topic = message.topic.clone();
        let plan = self.plan(&topic, &queue).await?;
        let (broker, half) = self
            .attempt(&topic, &plan, |m, q| {
                let msg = message.clone();
                async move { m.send_half(producer_group, msg, q).await }
            })
            .await?;
        self.settle(&plan, &topic);
        let sent = self.send_result(&plan, &topic, broker, half.sent).await;
        let mut transaction = half.transaction;
        transaction.broker = Some(plan.name(broker).to_owned());
        Ok(HalfSent { sent, transaction })
    }

    async fn end_transaction(
        &self,
        handle: &TransactionHandle,
        resolution: Resolution,
    ) -> Result<Option<SendResult>> {
        let broker = handle.broker.clone().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "transaction handle {handle} names no broker group (a proxy's handles are <broker>@<offsets>)"
            ))
        })?;
        let local = TransactionHandle {
            broker: None,
            ..handle.clone()
        };
        let m = self.member_named(&broker).await?;
        match m.end_transaction(&local, resolution).await? {
            Some(s) => {
                let q = self.global(&s.topic, &broker, s.queue_id).await;
                Ok(Some(SendResult { queue_id: q, ..s }))
            }
            None => Ok(None),
        }
    }

    /// On every group, and on groups that join later; the checker gets handles
    /// that name their group.
    async fn register_transaction_checker(
        &self,
        producer_group: &str,
        checker: Arc<dyn TransactionChecker>,
    ) -> Result<CheckerRegistration> {
        let id = self
            .inner
            .checkers
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.inner.checkers.by_id).insert(
            id,
            Checker {
                group: producer_group.to_owned(),
                checker,
                on: Default::default(),
                registrations: Vec::new(),
            },
        );
        // Members made from now on register it themselves (`member_at`); the ones
        // listed here are registered unless that already happened.
        for (b, m) in self.all_members().await? {
            self.inner.register_checker(id, &b.name, &b.addr, &m).await;
        }
        let inner = Arc::downgrade(&self.inner);
        Ok(CheckerRegistration::new(move || {
            if let Some(inner) = inner.upgrade() {
                let removed = lock(&inner.checkers.by_id).remove(&id);
                drop(removed);
            }
        }))
    }

    async fn queue_stats(&self, topic: &str) -> Result<Vec<QueueStats>> {
        let route = self.route(topic).await?;
        let results = self
            .on_route(&route, |m| async move { m.queue_stats(topic).await })
            .await;
        let mut out: Vec<QueueStats> = gather("queue stats", results)?
            .into_iter()
            .flat_map(|(broker, stats)| {
                let base = route.base(&broker).unwrap_or(0);
                stats.into_iter().map(move |s| QueueStats {
                    queue_id: base + s.queue_id,
                    ..s
                })
            })
            .collect();
        out.sort_by_key(|s| s.queue_id);
        Ok(out)
    }

    async fn offset_by_time(&self, topic: &str, queue_id: u32, ts_ms: i64) -> Result<u64> {
        let (_, m, local) = self.owner(topic, queue_id).await?;
        m.offset_by_time(topic, local, ts_ms).await
    }

    async fn set_max_reconsume_times(&self, group: &str, max: Option<u32>) -> Result<()> {
        let results = self
            .on_all(|m| async move { m.set_max_reconsume_times(group, max).await })
            .await?;
        gather("set max reconsume times", results).map(|_| ())
    }

    async fn set_fifo(&self, group: &str, fifo: bool) -> Result<()> {
        let results = self
            .on_all(|m| async move { m.set_fifo(group, fifo).await })
            .await?;
        gather("set fifo", results).map(|_| ())
    }

    async fn groups(&self) -> Result<Vec<String>> {
        let results = self.on_all(|m| async move { m.groups().await }).await?;
        let mut all: Vec<String> = gather("groups", results)?
            .into_iter()
            .flat_map(|(_, g)| g)
            .collect();
        all.sort();
        all.dedup();
        Ok(all)
    }

    /// Merged over the groups: members by id (the latest heartbeat), progress in
    /// global queue ids.
    async fn group_info(&self, group: &str) -> Result<GroupInfo> {
        let results = self
            .on_all(|m| async move { m.group_info(group).await })
            .await?;
        let results: Vec<(String, Result<GroupInfo>)> = results
            .into_iter()
            .filter(|(_, r)| !matches!(r, Err(Error::GroupNotFound { .. })))
            .collect();
        let found = gather("group info", results)?;
        let mut merged: Option<GroupInfo> = None;
        for (broker, mut info) in found {
            for p in &mut info.progress {
                p.queue_id = self.global(&p.topic.clone(), &broker, p.queue_id).await;
            }
            match &mut merged {
                None => merged = Some(info),
                Some(m) => {
                    m.mode = m.mode.or(info.mode);
                    m.fifo |= info.fifo;
                    for member in info.members {
                        match m.members.iter_mut().find(|x| x.member == member.member) {
                            Some(x) if x.last_seen_ms < member.last_seen_ms => *x = member,
                            Some(_) => {}
                            None => m.members.push(member),
                        }
                    }
                    m.progress.extend(info.progress);
                }
            }
        }
        let mut info = merged.ok_or_else(|| Error::GroupNotFound {
            group: group.to_owned(),
        })?;
        info.members.sort_by(|a, b| a.member.cmp(&b.member));
        info.progress
            .sort_by(|a, b| (&a.topic, a.queue_id).cmp(&(&b.topic, b.queue_id)));
        Ok(info)
    }

    /// The group whose address the offset id names, else every group in turn.
    async fn message_by_id(&self, msg_id: &str) -> Result<Delivered> {
        let (broker, d) = self
            .find_by_id(msg_id, |m| async move { m.message_by_id(msg_id).await })
            .await?;
        Ok(self.delivered(&broker, d).await)
    }

    async fn messages_by_key(&self, topic: &str, key: &str, max: usize) -> Result<Vec<Delivered>> {
        let route = self.route(topic).await?;
        let results = self
            .on_route(&route, |m| async move {
                m.messages_by_key(topic, key, max).await
            })
            .await;
        let mut out = Vec::new();
        for (broker, found) in gather("messages by key", results)? {
            let base = route.base(&broker).unwrap_or(0);
            out.extend(found.into_iter().map(|d| Delivered {
                queue_id: base + d.queue_id,
                ..d
            }));
        }
        out.sort_by_key(|d| std::cmp::Reverse(record::store_timestamp_of(&d.record)));
        out.truncate(max);
        Ok(out)
    }

    async fn messages_by_time(
        &self,
        topic: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<Delivered>> {
        let route = self.route(topic).await?;
        let results = self
            .on_route(&route, |m| async move {
                m.messages_by_time(topic, begin_ms, end_ms, max).await
            })
            .await;
        let mut out = Vec::new();
        for (broker, found) in gather("messages by time", results)? {
            let base = route.base(&broker).unwrap_or(0);
            out.extend(found.into_iter().map(|d| Delivered {
                queue_id: base + d.queue_id,
                ..d
            }));
        }
        out.sort_by_key(|d| record::store_timestamp_of(&d.record));
        out.truncate(max);
        Ok(out)
    }

    fn delay_limits(&self) -> DelayLimits {
        lock(&self.inner.delay_limits).clone()
    }

    async fn delayed(&self, topic: &str, max: usize) -> Result<Vec<Delayed>> {
        let route = self.route(topic).await?;
        let results = self
            .on_route(&route, |m| async move { m.delayed(topic, max).await })
            .await;
        let mut out = Vec::new();
        for (broker, found) in gather("delayed", results)? {
            let base = route.base(&broker).unwrap_or(0);
            out.extend(found.into_iter().map(|d| Delayed {
                queue_id: base + d.queue_id,
                ..d
            }));
        }
        out.sort_by_key(|d| d.deliver_at_ms);
        out.truncate(max);
        Ok(out)
    }

    async fn cancel_delayed(&self, id: &str) -> Result<Delayed> {
        let (broker, d) = self
            .find_by_id(id, |m| async move { m.cancel_delayed(id).await })
            .await?;
        let q = self.global(&d.topic, &broker, d.queue_id).await;
        Ok(Delayed { queue_id: q, ..d })
    }

    async fn sync_visible(&self) {
        if let Ok(members) = self.all_members().await {
            join_all(
                members
                    .into_iter()
                    .map(|(_, m)| async move { m.sync_visible().await }),
            )
            .await;
        }
    }
}
