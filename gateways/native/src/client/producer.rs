//! [`Producer`]: sends through the route the NameServers give, choosing queues
//! round-robin (or by sharding key / selector), retrying on another queue — on another
//! broker when there is one — when a send fails, all within one send timeout.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use rocketgate_core::broker::sharding_queue;
use tokio::time::Instant;
use tracing::debug;

use super::ClientSettings;
use super::link::{Pushed, refused};
use super::message::{Message, SendResult, now_ms, unique_id_at};
use super::session::Session;
use crate::Error;
use crate::message::encode_batch_entry_with;
use rocketgate_remoting::body::{MessageQueue, field, transaction};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;

/// Bytes of a batch entry besides its body, for sizing the request body once: the
/// fixed fields and typical properties (`UNIQ_KEY`, `WAIT`, a tag).
const BATCH_ENTRY_OVERHEAD: usize = 22 + 80;
use rocketgate_core::store::record::property;

/// Sends messages. Cheap to clone; clones share connections and routes.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub session: Arc<Session>,
    pub group: String,
    send_timeout: Duration,
    retries: u32,
    round_robin: AtomicUsize,
}

/// Which queue a send goes to.
enum Target<'a> {
    /// Round-robin over the write queues, retrying elsewhere on failure.
    Any,
    /// This queue, no retry elsewhere (ordering would break).
    Queue(MessageQueue),
    /// The queue a function of the write queues picks.
    Select(&'a (dyn Fn(&[MessageQueue]) -> usize + Sync)),
}

/// Response codes after which another queue or broker may succeed.
fn retryable(e: &Error) -> bool {
    match e.code() {
        Some(code) => matches!(
            code,
            response::SYSTEM_BUSY
                | response::SYSTEM_ERROR
                | response::SERVICE_NOT_AVAILABLE
                | response::TOPIC_NOT_EXIST
                | response::NO_PERMISSION
                | response::FLUSH_DISK_TIMEOUT
        ),
        None => !matches!(e, Error::InvalidArgument(_) | Error::Codec(_)),
    }
}

impl Producer {
    /// Starts a producer of `group` (send timeout 3 s, 2 retries).
    pub async fn start(
        config: ClientSettings,
        group: impl Into<String>,
    ) -> Result<Producer, Error> {
        let (session, pushes) = Session::start(config);
        Ok(Self::with_session(session, group.into(), pushes))
    }

    pub(super) fn with_session(
        session: Arc<Session>,
        group: String,
        mut pushes: tokio::sync::mpsc::UnboundedReceiver<Pushed>,
    ) -> Producer {
        // A plain producer has nothing to answer; drain what brokers push.
        tokio::spawn(async move { while pushes.recv().await.is_some() {} });
        session.update_heartbeat(|hb| {
            hb.producer_data_set
                .push(rocketgate_remoting::body::ProducerData {
                    group_name: group.clone(),
                })
        });
        Producer {
            inner: Arc::new(Inner {
                session,
                group,
                send_timeout: Duration::from_secs(3),
                retries: 2,
                round_robin: AtomicUsize::new(0),
            }),
        }
    }

    /// Sets the time one send may take, retries included (default 3 s).
    pub fn with_send_timeout(mut self, timeout: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.send_timeout = timeout;
        }
        self
    }

    /// Sets how often a failed round-robin send is retried on another queue (default 2).
    pub fn with_retries(mut self, retries: u32) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.retries = retries;
        }
        self
    }

    pub fn group(&self) -> &str {
        &self.inner.group
    }

    /// The queues a send to `topic` can go to.
    pub async fn write_queues(&self, topic: &str) -> Result<Vec<MessageQueue>, Error> {
        Ok(self.inner.session.route(topic).await?.write_queues.clone())
    }

    /// Sends and waits until the broker stored the message.
    pub async fn send(&self, msg: Message) -> Result<SendResult, Error> {
        self.inner.send(&msg, Target::Any).await
    }

    /// Starts a send in the background; the returned future resolves to its result
    /// (dropping it does not cancel the send).
    ///
    /// ```no_run
    /// # use rocketgate_native::client::{Message, Producer};
    /// # async fn demo(producer: Producer) -> Result<(), rocketgate_native::Error> {
    /// let pending: Vec<_> = (0..64)
    ///     .map(|i| producer.send_async(Message::new("orders", format!("order {i}"))))
    ///     .collect();
    /// for p in pending {
    ///     p.await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn send_async(
        &self,
        msg: Message,
    ) -> impl Future<Output = Result<SendResult, Error>> + Send + 'static {
        let inner = self.inner.clone();
        let task = tokio::spawn(async move { inner.send(&msg, Target::Any).await });
        async move { task.await.map_err(|_| Error::Shutdown)? }
    }

    /// Sends without waiting for the broker (no result, no retry).
    pub async fn send_oneway(&self, msg: Message) -> Result<(), Error> {
        let inner = &self.inner;
        let route = inner.session.route(&msg.topic).await?;
        let mq = inner
            .pick(&route.write_queues, None)
            .ok_or_else(|| Error::NoRoute {
                topic: msg.topic.clone(),
            })?;
        let addr = inner.addr(&mq)?;
        let (cmd, _) = inner.send_command(&msg, mq.queue_id as i32);
        inner.session.links.oneway(&addr, cmd).await
    }

    /// Sends to one queue (ordering within the queue is kept; no retry elsewhere).
    pub async fn send_to_queue(
        &self,
        msg: Message,
        queue: MessageQueue,
    ) -> Result<SendResult, Error> {
        self.inner.send(&msg, Target::Queue(queue)).await
    }

    /// Sends to the queue of `sharding_key` (Java's `SelectMessageQueueByHash`), so
    /// every message with the same key is stored, and consumed, in order.
    pub async fn send_ordered(
        &self,
        msg: Message,
        sharding_key: &str,
    ) -> Result<SendResult, Error> {
        let pick =
            |queues: &[MessageQueue]| sharding_queue(sharding_key, queues.len() as u32) as usize;
        self.inner.send(&msg, Target::Select(&pick)).await
    }

    /// Sends to the queue `selector` picks (an index into the write queues).
    pub async fn send_with_selector(
        &self,
        msg: Message,
        selector: impl Fn(&[MessageQueue]) -> usize + Sync,
    ) -> Result<SendResult, Error> {
        self.inner.send(&msg, Target::Select(&selector)).await
    }

    /// Sends messages of one topic as one batch into one queue; one result each.
    pub async fn send_batch(&self, msgs: Vec<Message>) -> Result<Vec<SendResult>, Error> {
        self.inner.send_batch(msgs).await
    }

    /// Creates (or updates) `topic` with `queues` read and write queues on every
    /// broker, and waits until the NameServers serve its route.
    pub async fn create_topic(&self, topic: &str, queues: u32) -> Result<(), Error> {
        let s = &self.inner.session;
        // A broker that just started may not have registered yet.
        let deadline = Instant::now() + s.timeout() * 3;
        let brokers = s.brokers_within(s.timeout() * 3).await?;
        if brokers.is_empty() {
            return Err(Error::NoRoute {
                topic: topic.to_owned(),
            });
        }
        for (_, addr) in &brokers {
            let cmd = RemotingCommand::request(request::UPDATE_AND_CREATE_TOPIC, 0)
                .with_field(field::TOPIC, topic)
                .with_field(field::READ_QUEUE_NUMS, queues)
                .with_field(field::WRITE_QUEUE_NUMS, queues)
                .with_field(field::PERM, 6);
            s.links.call(addr, cmd, s.timeout()).await?;
        }
        // The brokers re-register at once; wait until a NameServer has the new route.
        loop {
            match s.refresh_route(topic).await {
                Ok(r) if r.write_queues.len() == brokers.len() * queues as usize => return Ok(()),
                Ok(_) | Err(Error::NoRoute { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(_) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Stops: unregisters the group from every broker and closes the connections.
    pub async fn shutdown(self) {
        self.inner.unregister().await;
    }
}

impl Inner {
    fn addr(&self, mq: &MessageQueue) -> Result<String, Error> {
        self.session
            .broker_addr(&mq.broker_name)
            .ok_or_else(|| Error::NoRoute {
                topic: mq.topic.clone(),
            })
    }

    /// The next queue round-robin, avoiding `avoid_broker` when another broker exists.
    fn pick(&self, queues: &[MessageQueue], avoid_broker: Option<&str>) -> Option<MessageQueue> {
        if queues.is_empty() {
            return None;
        }
        for _ in 0..queues.len() {
            let i = self.round_robin.fetch_add(1, Ordering::Relaxed) % queues.len();
            if Some(queues[i].broker_name.as_str()) != avoid_broker {
                return Some(queues[i].clone());
            }
        }
        let i = self.round_robin.fetch_add(1, Ordering::Relaxed) % queues.len();
        Some(queues[i].clone())
    }

    /// A `SEND_MESSAGE_V2` request for `msg` to queue `queue_id` (-1: the broker picks),
    /// and the unique id it carries.
    fn send_command(&self, msg: &Message, queue_id: i32) -> (RemotingCommand, String) {
        // One clock read for the id and the born timestamp.
        let now = now_ms();
        let uniq = unique_id_at(now as u64);
        let half = msg
            .properties
            .get(property::TRANSACTION_PREPARED)
            .map(String::as_str)
            == Some("true");
        let sys_flag = if half {
            transaction::PREPARED
        } else {
            transaction::NOT_TYPE
        };
        let mut cmd = RemotingCommand::request(request::SEND_MESSAGE_V2, 0);
        cmd.ext_fields.reserve(11);
        let cmd = cmd
            .with_field("a", &self.group)
            .with_field("b", &msg.topic)
            .with_static_field("c", "TBW102")
            .with_static_field("d", "4")
            .with_field("e", queue_id)
            .with_field("f", sys_flag)
            .with_field("g", now)
            .with_field("h", msg.flag)
            .with_field("i", msg.properties_string(&uniq))
            .with_static_field("j", "0")
            .with_static_field("k", "false")
            .with_body(msg.body.clone());
        (cmd, uniq)
    }

    async fn send(&self, msg: &Message, target: Target<'_>) -> Result<SendResult, Error> {
        let deadline = Instant::now() + self.send_timeout;
        let attempts = match target {
            Target::Any => 1 + self.retries,
            _ => 1,
        };
        let mut last_broker: Option<String> = None;
        let mut last_err = None;
        for attempt in 1..=attempts {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                last_err.get_or_insert(Error::Timeout {
                    addr: "any broker".into(),
                    timeout: self.send_timeout,
                });
                break;
            }
            match self
                .send_once(msg, &target, last_broker.as_deref(), remaining)
                .await
            {
                Ok(r) => return Ok(r),
                Err((broker, e)) => {
                    debug!(topic = msg.topic, attempt, error = %e, "send failed");
                    let again = retryable(&e);
                    // The route may be stale: a broker gone, or a master that lost its
                    // role (a failover: the NameServers name the new master within a
                    // second). The next attempt asks the NameServers again.
                    if matches!(
                        e,
                        Error::ConnectionClosed { .. }
                            | Error::Timeout { .. }
                            | Error::Connect { .. }
                            | Error::Unreachable { .. }
                    ) || matches!(
                        e.code(),
                        Some(response::TOPIC_NOT_EXIST | response::SERVICE_NOT_AVAILABLE)
                    ) {
                        self.session.forget_route(&msg.topic);
                    }
                    last_broker = broker;
                    last_err = Some(e);
                    if !again {
                        break;
                    }
                }
            }
        }
        let last = last_err.unwrap_or(Error::Shutdown);
        if attempts == 1 {
            return Err(last);
        }
        Err(Error::SendFailed {
            attempts,
            last: Box::new(last),
        })
    }

    /// One attempt. On failure, also the broker it went to.
    async fn send_once(
        &self,
        msg: &Message,
        target: &Target<'_>,
        avoid_broker: Option<&str>,
        timeout: Duration,
    ) -> Result<SendResult, (Option<String>, Error)> {
        let (mq, addr) = match self.session.route(&msg.topic).await {
            Ok(route) => {
                let queues = &route.write_queues;
                let mq = match target {
                    Target::Any => self.pick(queues, avoid_broker),
                    Target::Queue(q) => Some(q.clone()),
                    Target::Select(f) if !queues.is_empty() => {
                        queues.get(f(queues) % queues.len()).cloned()
                    }
                    Target::Select(_) => None,
                };
                let mq = mq.ok_or_else(|| {
                    (
                        None,
                        Error::NoRoute {
                            topic: msg.topic.clone(),
                        },
                    )
                })?;
                let addr = self.addr(&mq).map_err(|e| (None, e))?;
                (Some(mq), addr)
            }
            // An unknown topic: let a broker create it on first send (queue -1: the
            // broker picks), as RocketMQ's default-topic route does.
            Err(Error::NoRoute { .. }) if matches!(target, Target::Any) => {
                let brokers = self
                    .session
                    .brokers_within(timeout)
                    .await
                    .map_err(|e| (None, e))?;
                let i = self.round_robin.fetch_add(1, Ordering::Relaxed);
                let (_, addr) =
                    brokers
                        .get(i % brokers.len().max(1))
                        .cloned()
                        .ok_or_else(|| {
                            (
                                None,
                                Error::NoRoute {
                                    topic: msg.topic.clone(),
                                },
                            )
                        })?;
                (None, addr)
            }
            Err(e) => return Err((None, e)),
        };
        let queue_id = mq.as_ref().map_or(-1, |q| q.queue_id as i32);
        let broker = mq.as_ref().map(|q| q.broker_name.clone());
        let (cmd, uniq) = self.send_command(msg, queue_id);
        let resp = self
            .session
            .links
            .request(&addr, cmd, timeout)
            .await
            .map_err(|e| (broker.clone(), e))?;
        if resp.code != response::SUCCESS {
            return Err((broker, refused(&addr, &resp)));
        }
        let parsed = parse_sent(&addr, &resp, uniq).map_err(|e| (broker.clone(), e))?;
        let queue = match mq {
            Some(q) => q,
            None => {
                self.session.forget_route(&msg.topic);
                MessageQueue::new(&msg.topic, "", parsed.1)
            }
        };
        let (offset_msg_id, _, queue_offset, msg_id) = (parsed.0, parsed.1, parsed.2, parsed.3);
        Ok(SendResult {
            msg_id,
            offset_msg_id,
            queue,
            queue_offset,
            transaction_id: resp.field(field::TRANSACTION_ID).map(str::to_owned),
        })
    }

    async fn send_batch(&self, msgs: Vec<Message>) -> Result<Vec<SendResult>, Error> {
        let Some(first) = msgs.first() else {
            return Err(Error::InvalidArgument("an empty batch".into()));
        };
        let topic = first.topic.clone();
        if msgs.iter().any(|m| m.topic != topic) {
            return Err(Error::InvalidArgument("a batch goes to one topic".into()));
        }
        let route = self.session.route(&topic).await?;
        let mq = self
            .pick(&route.write_queues, None)
            .ok_or_else(|| Error::NoRoute {
                topic: topic.clone(),
            })?;
        let addr = self.addr(&mq)?;
        let mut body = BytesMut::with_capacity(
            msgs.iter()
                .map(|m| m.body.len() + BATCH_ENTRY_OVERHEAD)
                .sum(),
        );
        let mut ids = Vec::with_capacity(msgs.len());
        let now = now_ms();
        for m in &msgs {
            let uniq = unique_id_at(now as u64);
            encode_batch_entry_with(m.flag, &m.body, &mut body, |out| {
                m.write_properties(&uniq, out)
            });
            ids.push(uniq);
        }
        let mut cmd = RemotingCommand::request(request::SEND_BATCH_MESSAGE, 0)
            .with_field("a", &self.group)
            .with_field("b", &topic)
            .with_static_field("c", "TBW102")
            .with_static_field("d", "4")
            .with_field("e", mq.queue_id)
            .with_field("f", 0)
            .with_field("g", now)
            .with_field("h", 0)
            .with_field("i", "")
            .with_static_field("j", "0")
            .with_static_field("k", "false")
            .with_field("m", true)
            .with_body(body.freeze());
        cmd.code = request::SEND_BATCH_MESSAGE;
        let resp = self
            .session
            .links
            .call(&addr, cmd, self.send_timeout)
            .await?;
        let (offset_ids, _, first_offset, _) = parse_sent(&addr, &resp, String::new())?;
        let offset_ids: Vec<&str> = offset_ids.split(',').collect();
        Ok(ids
            .into_iter()
            .enumerate()
            .map(|(i, msg_id)| SendResult {
                msg_id,
                offset_msg_id: offset_ids.get(i).copied().unwrap_or_default().to_owned(),
                queue: mq.clone(),
                queue_offset: first_offset + i as u64,
                transaction_id: None,
            })
            .collect())
    }

    pub(super) async fn unregister(&self) {
        let s = &self.session;
        if let Ok(brokers) = s.brokers().await {
            for (_, addr) in brokers {
                let cmd = RemotingCommand::request(request::UNREGISTER_CLIENT, 0)
                    .with_field(field::CLIENT_ID, s.client_id())
                    .with_field(field::PRODUCER_GROUP, &self.group);
                let _ = s.links.call(&addr, cmd, s.timeout()).await;
            }
        }
        s.links.close_all();
    }
}

/// `(offset msg id(s), queue id, queue offset, unique id)` of a send response.
fn parse_sent(
    addr: &str,
    resp: &RemotingCommand,
    uniq: String,
) -> Result<(String, u32, u64, String), Error> {
    let bad = |what: &str| Error::Protocol {
        addr: addr.to_owned(),
        what: format!("send response: {what}"),
    };
    let offset_id = resp.field(field::MSG_ID).ok_or_else(|| bad("no msgId"))?;
    let queue_id = resp
        .field(field::QUEUE_ID)
        .and_then(|q| q.parse().ok())
        .ok_or_else(|| bad("no queueId"))?;
    let queue_offset = resp
        .field(field::QUEUE_OFFSET)
        .and_then(|q| q.parse().ok())
        .ok_or_else(|| bad("no queueOffset"))?;
    Ok((offset_id.to_owned(), queue_id, queue_offset, uniq))
}
