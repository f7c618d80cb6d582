//! What both consumers ask brokers: pulls, offsets, member lists, send-back and queue
//! locks.
//!
//! Where each goes (docs/replication.md, "Native consumers on a slave"): a pull to
//! the member of the queue's broker group the last pull answer suggested
//! (`suggestWhichBrokerId`: a master moves a far-behind consumer to a slave, the
//! slave sends it back once caught up), the master otherwise; offsets and member
//! lists to the master. Whichever it is, when it cannot be reached (the master is
//! down, the route still names it) the request goes to the group's next member —
//! the master, then the slaves by id — as RocketMQ's `findBrokerAddressInSubscribe`
//! falls back to any member. Queue locks go to the master only.

use rocketgate_core::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::session::Session;
use crate::Error;
use crate::message::ReceivedMessage;
use rocketgate_remoting::body::{
    ConsumerList, LockBatchRequest, LockBatchResponse, MessageQueue, field, pull_flag,
};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::protocol::{from_json, to_json};

/// A subscription expression: `TAG` (`*`, `a || b`) or `SQL92`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expression {
    pub kind: &'static str,
    pub text: String,
}

impl Expression {
    pub fn tag(text: impl Into<String>) -> Self {
        Expression {
            kind: rocketgate_remoting::body::expression::TAG,
            text: text.into(),
        }
    }
}

/// What one pull found.
#[derive(Debug)]
pub(crate) enum Pulled {
    Found {
        messages: Vec<ReceivedMessage>,
        next: u64,
    },
    /// Nothing (new or matching); continue from `next`.
    Nothing { next: u64 },
    /// The offset was out of range; continue from `next`.
    Moved { next: u64 },
}

/// The master's broker id.
const MASTER_ID: u64 = 0;

#[derive(Clone)]
pub(crate) struct Broker {
    pub session: Arc<Session>,
    pub group: String,
    /// Per queue: the broker id the last pull answer suggested (absent: the master).
    /// Std lock, map operations only.
    suggested: Arc<Mutex<HashMap<MessageQueue, u64>>>,
}

/// A failure that says nothing about the request, only that this member could not
/// be reached: the next member of the group is tried.
fn unreachable(e: &Error) -> bool {
    matches!(
        e,
        Error::Connect { .. } | Error::Unreachable { .. } | Error::ConnectionClosed { .. }
    )
}

impl Broker {
    pub fn new(session: Arc<Session>, group: String) -> Broker {
        Broker {
            session,
            group,
            suggested: Arc::default(),
        }
    }

    /// The master's address (queue locks need the master).
    fn addr(&self, mq: &MessageQueue) -> Result<String, Error> {
        self.session
            .broker_addr(&mq.broker_name)
            .ok_or_else(|| Error::NoRoute {
                topic: mq.topic.clone(),
            })
    }

    /// The members of `mq`'s broker group to try, best first: `prefer`, then the
    /// master, then the slaves by id.
    fn members_of(&self, mq: &MessageQueue, prefer: u64) -> Result<Vec<(u64, String)>, Error> {
        let group = self
            .session
            .group_addrs(&mq.broker_name)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| Error::NoRoute {
                topic: mq.topic.clone(),
            })?;
        let mut out: Vec<(u64, String)> = Vec::with_capacity(group.len());
        for id in [prefer, MASTER_ID].into_iter().chain(group.keys().copied()) {
            if let Some(a) = group.get(&id)
                && !out.iter().any(|(i, _)| *i == id)
            {
                out.push((id, a.clone()));
            }
        }
        Ok(out)
    }

    /// Which member the broker last suggested for `mq`.
    pub fn suggested(&self, mq: &MessageQueue) -> u64 {
        lock(&self.suggested).get(mq).copied().unwrap_or(MASTER_ID)
    }

    /// Sends `cmd` to the first member of `mq`'s group (from `prefer`) that can be
    /// reached; the answer, whatever its code, and who gave it.
    async fn request_any(
        &self,
        mq: &MessageQueue,
        prefer: u64,
        cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<(String, RemotingCommand), Error> {
        let mut last = None;
        for (id, addr) in self.members_of(mq, prefer)? {
            match self
                .session
                .links
                .request(&addr, cmd.clone(), timeout)
                .await
            {
                Ok(resp) => return Ok((addr, resp)),
                Err(e) if unreachable(&e) => {
                    tracing::debug!(%addr, id, error = %e, "broker unreachable; trying the next of its group");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::NoRoute {
            topic: mq.topic.clone(),
        }))
    }

    /// [`Broker::request_any`] from the master, any code but `SUCCESS` an error.
    async fn call_any(
        &self,
        mq: &MessageQueue,
        cmd: RemotingCommand,
    ) -> Result<(String, RemotingCommand), Error> {
        let (addr, resp) = self
            .request_any(mq, MASTER_ID, cmd, self.session.timeout())
            .await?;
        if resp.code != response::SUCCESS {
            return Err(super::link::refused(&addr, &resp));
        }
        Ok((addr, resp))
    }

    fn bad(addr: &str, what: String) -> Error {
        Error::Protocol {
            addr: addr.to_owned(),
            what,
        }
    }

    pub async fn pull(
        &self,
        mq: &MessageQueue,
        offset: u64,
        max: u32,
        expression: &Expression,
        suspend: Option<Duration>,
        commit: Option<u64>,
    ) -> Result<Pulled, Error> {
        let mut flags = pull_flag::SUBSCRIPTION;
        if suspend.is_some() {
            flags |= pull_flag::SUSPEND;
        }
        if commit.is_some() {
            flags |= pull_flag::COMMIT_OFFSET;
        }
        let suspend = suspend.unwrap_or_default();
        let cmd = RemotingCommand::request(request::PULL_MESSAGE, 0)
            .with_field(field::CONSUMER_GROUP, &self.group)
            .with_field(field::TOPIC, &mq.topic)
            .with_field(field::QUEUE_ID, mq.queue_id)
            .with_field(field::QUEUE_OFFSET, offset)
            .with_field(field::MAX_MSG_NUMS, max)
            .with_field(field::SYS_FLAG, flags)
            .with_field(field::COMMIT_OFFSET, commit.unwrap_or(0))
            .with_field(field::SUSPEND_TIMEOUT_MILLIS, suspend.as_millis() as u64)
            .with_field(field::SUBSCRIPTION, &expression.text)
            .with_field(field::SUB_VERSION, 0)
            .with_field(field::EXPRESSION_TYPE, expression.kind);
        let timeout = suspend + self.session.timeout();
        let (addr, resp) = self
            .request_any(mq, self.suggested(mq), cmd, timeout)
            .await?;
        // Where the next pull of this queue goes (RocketMQ's pullFromWhichNodeTable).
        if let Some(id) = resp
            .field(field::SUGGEST_WHICH_BROKER_ID)
            .and_then(|v| v.parse::<u64>().ok())
        {
            let mut s = lock(&self.suggested);
            if id == MASTER_ID {
                s.remove(mq);
            } else {
                s.insert(mq.clone(), id);
            }
        }
        let next = resp
            .field(field::NEXT_BEGIN_OFFSET)
            .and_then(|v| v.parse::<u64>().ok());
        let need_next =
            || next.ok_or_else(|| Self::bad(&addr, "pull response without nextBeginOffset".into()));
        match resp.code {
            response::SUCCESS => {
                let messages = ReceivedMessage::decode_all(&resp.body)
                    .map_err(|e| Self::bad(&addr, format!("pulled records: {e}")))?;
                Ok(Pulled::Found {
                    messages,
                    next: need_next()?,
                })
            }
            response::PULL_NOT_FOUND | response::PULL_RETRY_IMMEDIATELY => {
                Ok(Pulled::Nothing { next: need_next()? })
            }
            response::PULL_OFFSET_MOVED => Ok(Pulled::Moved { next: need_next()? }),
            _ => Err(super::link::refused(&addr, &resp)),
        }
    }

    /// The group's committed offset of `mq`; `None` if never committed.
    pub async fn query_offset(&self, mq: &MessageQueue) -> Result<Option<u64>, Error> {
        let cmd = RemotingCommand::request(request::QUERY_CONSUMER_OFFSET, 0)
            .with_field(field::CONSUMER_GROUP, &self.group)
            .with_field(field::TOPIC, &mq.topic)
            .with_field(field::QUEUE_ID, mq.queue_id);
        let (addr, resp) = self
            .request_any(mq, MASTER_ID, cmd, self.session.timeout())
            .await?;
        match resp.code {
            response::SUCCESS => resp
                .field(field::OFFSET)
                .and_then(|o| o.parse().ok())
                .map(Some)
                .ok_or_else(|| Self::bad(&addr, "offset response without offset".into())),
            response::QUERY_NOT_FOUND => Ok(None),
            _ => Err(super::link::refused(&addr, &resp)),
        }
    }

    /// Commits to the master, or — while it cannot be reached — to a slave, which
    /// hands the position to the master when it is back.
    pub async fn commit_offset(&self, mq: &MessageQueue, offset: u64) -> Result<(), Error> {
        let cmd = RemotingCommand::request(request::UPDATE_CONSUMER_OFFSET, 0)
            .with_field(field::CONSUMER_GROUP, &self.group)
            .with_field(field::TOPIC, &mq.topic)
            .with_field(field::QUEUE_ID, mq.queue_id)
            .with_field(field::COMMIT_OFFSET, offset);
        self.call_any(mq, cmd).await.map(drop)
    }

    async fn offset_request(
        &self,
        code: i32,
        mq: &MessageQueue,
        ts: Option<i64>,
    ) -> Result<u64, Error> {
        let mut cmd = RemotingCommand::request(code, 0)
            .with_field(field::TOPIC, &mq.topic)
            .with_field(field::QUEUE_ID, mq.queue_id);
        if let Some(ts) = ts {
            cmd = cmd.with_field(field::TIMESTAMP, ts);
        }
        let (addr, resp) = self.call_any(mq, cmd).await?;
        resp.field(field::OFFSET)
            .and_then(|o| o.parse().ok())
            .ok_or_else(|| Self::bad(&addr, "offset response without offset".into()))
    }

    pub async fn max_offset(&self, mq: &MessageQueue) -> Result<u64, Error> {
        self.offset_request(request::GET_MAX_OFFSET, mq, None).await
    }

    pub async fn min_offset(&self, mq: &MessageQueue) -> Result<u64, Error> {
        self.offset_request(request::GET_MIN_OFFSET, mq, None).await
    }

    pub async fn offset_by_time(&self, mq: &MessageQueue, ts_ms: i64) -> Result<u64, Error> {
        self.offset_request(request::SEARCH_OFFSET_BY_TIMESTAMP, mq, Some(ts_ms))
            .await
    }

    /// Client ids of the group's members, as the broker of `mq` knows them.
    pub async fn members(&self, mq: &MessageQueue) -> Result<Vec<String>, Error> {
        let cmd = RemotingCommand::request(request::GET_CONSUMER_LIST_BY_GROUP, 0)
            .with_field(field::CONSUMER_GROUP, &self.group);
        let (addr, resp) = self.call_any(mq, cmd).await?;
        let list: ConsumerList =
            from_json(&resp.body).map_err(|e| Self::bad(&addr, format!("consumer list: {e}")))?;
        let mut ids = list.consumer_id_list;
        ids.sort();
        Ok(ids)
    }

    /// Hands a message whose consumption failed back to its broker for a retry.
    pub async fn send_back(&self, msg: &ReceivedMessage, delay_level: i32) -> Result<(), Error> {
        // The broker that stored it: its address is the record's store host, when the
        // routes agree; else any master of the topic.
        let host = msg.store_host.to_string();
        let route = self.session.route(&msg.topic).await?;
        let addr = route
            .brokers
            .values()
            .find(|a| **a == host)
            .or_else(|| route.brokers.values().next())
            .cloned()
            .ok_or_else(|| Error::NoRoute {
                topic: msg.topic.clone(),
            })?;
        let cmd = RemotingCommand::request(request::CONSUMER_SEND_MSG_BACK, 0)
            .with_field(field::OFFSET, msg.commit_log_offset)
            .with_field(field::GROUP, &self.group)
            .with_field(field::DELAY_LEVEL, delay_level)
            .with_field(field::ORIGIN_MSG_ID, &msg.msg_id)
            .with_field(field::ORIGIN_TOPIC, msg.origin_topic())
            .with_field(field::UNIT_MODE, false)
            .with_field(field::MAX_RECONSUME_TIMES, 16);
        self.session
            .links
            .call(&addr, cmd, self.session.timeout())
            .await
            .map(drop)
    }

    /// Locks queues of one broker for orderly consumption; returns those now held.
    pub async fn lock(&self, mqs: &[MessageQueue]) -> Result<Vec<MessageQueue>, Error> {
        let Some(first) = mqs.first() else {
            return Ok(Vec::new());
        };
        let addr = self.addr(first)?;
        let body = LockBatchRequest {
            client_id: self.session.client_id().to_owned(),
            consumer_group: self.group.clone(),
            mq_set: mqs.to_vec(),
            only_this_broker: true,
        };
        let cmd = RemotingCommand::request(request::LOCK_BATCH_MQ, 0).with_body(to_json(&body));
        let resp = self
            .session
            .links
            .call(&addr, cmd, self.session.timeout())
            .await?;
        let locked: LockBatchResponse =
            from_json(&resp.body).map_err(|e| Self::bad(&addr, format!("lock response: {e}")))?;
        Ok(locked.lock_ok_mq_set)
    }

    pub async fn unlock(&self, mqs: &[MessageQueue]) -> Result<(), Error> {
        let Some(first) = mqs.first() else {
            return Ok(());
        };
        let addr = self.addr(first)?;
        let body = LockBatchRequest {
            client_id: self.session.client_id().to_owned(),
            consumer_group: self.group.clone(),
            mq_set: mqs.to_vec(),
            only_this_broker: true,
        };
        let cmd = RemotingCommand::request(request::UNLOCK_BATCH_MQ, 0).with_body(to_json(&body));
        self.session
            .links
            .call(&addr, cmd, self.session.timeout())
            .await
            .map(drop)
    }

    /// Leaves the group on every broker of the cluster.
    pub async fn unregister(&self) {
        let s = &self.session;
        if let Ok(brokers) = s.brokers().await {
            for (_, addr) in brokers {
                let cmd = RemotingCommand::request(request::UNREGISTER_CLIENT, 0)
                    .with_field(field::CLIENT_ID, s.client_id())
                    .with_field(field::CONSUMER_GROUP, &self.group);
                let _ = s.links.call(&addr, cmd, s.timeout()).await;
            }
        }
    }
}

/// This member's share of `queues` (RocketMQ's average allocation over the sorted
/// member list), computed with the core's pure allocator.
pub(crate) fn allocate(me: &str, members: &[String], queues: &[MessageQueue]) -> Vec<MessageQueue> {
    use rocketgate_core::broker::allocate::{self as alloc, AllocateStrategy};
    let mut members = members.to_vec();
    if !members.iter().any(|m| m == me) {
        // The broker has not seen our heartbeat yet: count ourselves in.
        members.push(me.to_owned());
        members.sort();
    }
    let core_queues: Vec<alloc::MessageQueue> = queues
        .iter()
        .map(|q| alloc::MessageQueue::new(&q.topic, &q.broker_name, q.queue_id))
        .collect();
    alloc::allocate(&AllocateStrategy::Average, me, &members, &core_queues)
        .into_iter()
        .map(|q| MessageQueue::new(q.topic, q.broker_name, q.queue_id))
        .collect()
}

/// Where a queue without a committed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumeFrom {
    /// Its oldest stored message.
    #[default]
    First,
    /// Only messages stored from now on.
    Last,
    /// The first message stored at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// The start of a queue with no committed offset.
pub(super) async fn start_offset(
    broker: &Broker,
    mq: &MessageQueue,
    from: ConsumeFrom,
) -> Result<u64, Error> {
    match from {
        // Offset 0; a pull there answers OFFSET_MOVED with the real minimum if
        // retention deleted the start.
        ConsumeFrom::First => Ok(0),
        ConsumeFrom::Last => broker.max_offset(mq).await,
        ConsumeFrom::Timestamp(ts) => broker.offset_by_time(mq, ts).await,
    }
}
