//! [`RemoteBroker`]: one broker in another process as a [`MessagingApi`], so a door
//! written against the trait (MQTT, HTTP, WebSocket) runs over it unchanged — what a
//! `rocketgate proxy` node hands its doors. Every method is one request of the broker
//! API codes (`rocketgate_remoting::code::api`, `docs/proxy-protocol.md`) on one
//! multiplexed, reconnecting link of the client's [`Links`] (TLS and request signing
//! as the rest of the client).
//!
//! - **Errors**: a core error on the broker comes back as the same
//!   [`rocketgate_core::Error`] variant (fields kept; a few `&'static str` reasons are
//!   interned). A transport failure — connection refused or lost, no answer in time —
//!   is [`rocketgate_core::Error::NotLeader`] with a reason naming the broker: every
//!   door answers it as "unavailable, try again" (HTTP 503, MQTT 0x80, WebSocket
//!   `unavailable`), and for a send its outcome is unknown, as that variant says. It
//!   never hangs longer than the request timeout plus what the call asked to wait.
//! - **Long polls**: a pull or POP that may wait `w` is given `w` plus the request
//!   timeout before it counts as lost.
//! - **Transaction checks**: a registered checker is registered on the broker for this
//!   connection; the broker pushes `CHECK_TRANSACTION` and the checker is called here.
//!   After a reconnect every live registration is made again (a background task
//!   watches the link), and so are the delay limits ([`MessagingApi::delay_limits`] is
//!   sync: read at connect and cached).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use rocketgate_core::broker::delay::{DelayLimits, Delayed};
use rocketgate_core::broker::{
    CheckerRegistration, DeadLetters, Delivered, GroupInfo, HalfMessage, HalfSent, Heartbeat,
    MessagingApi, OffsetReset, PopRequest, Popped, PullRequest, PullResult, QueueChoice,
    QueueStats, ReceiptHandle, Resolution, SendBackResult, SendResult, TopicConfig, TopicKind,
    TransactionChecker, TransactionHandle,
};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::{BatchSent, EncodedBatch};
use rocketgate_core::sync::lock;
use rocketgate_core::{Error as CoreError, Result};
use rocketgate_remoting::code::{api as code, response};
use rocketgate_remoting::codec::RemotingCommand;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use super::link::{Links, Pushed};
use crate::api::{
    self, BatchSentMeta, CheckMeta, DeliveredMeta, EncodedMeta, MessageMeta, PopArgs, PoppedMeta,
    PullArgs, PullMeta, WireError, join_delivered, millis,
};

/// How to reach one broker's native door.
#[derive(Debug, Clone)]
pub struct RemoteSettings {
    /// `host:port` of the broker's native listener.
    pub addr: String,
    /// How long a call waits for its answer (plus whatever it asked to wait). Keep it
    /// longer than the broker's own waits (`store.sync_flush_timeout`, 5 s by default,
    /// and sync replication), so their errors arrive as themselves rather than as an
    /// unavailable broker. Default 10 s; a lost or refused connection fails at once
    /// whatever it is.
    pub request_timeout: Duration,
    /// TLS to the broker, trusting this configuration's roots.
    pub tls: Option<Arc<rocketgate_tls::rustls::ClientConfig>>,
    /// What every request is signed with: the internal credential when the broker
    /// has auth on (no other identity may call the broker API).
    pub credentials: Option<rocketgate_auth::AccessKey>,
}

impl RemoteSettings {
    pub fn new(addr: impl Into<String>) -> RemoteSettings {
        RemoteSettings {
            addr: addr.into(),
            request_timeout: Duration::from_secs(10),
            tls: None,
            credentials: None,
        }
    }

    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    pub fn with_credentials(mut self, credentials: rocketgate_auth::AccessKey) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// TLS to the broker, trusting the CA certificates in the PEM file `ca`.
    pub fn with_tls_ca(mut self, ca: &std::path::Path) -> Result<Self, crate::Error> {
        self.tls = Some(Arc::new(rocketgate_tls::client_config(ca)?));
        Ok(self)
    }
}

/// One remote broker as a [`MessagingApi`]. Cheap to clone (shared state).
#[derive(Clone)]
pub struct RemoteBroker {
    inner: Arc<Inner>,
}

struct Registered {
    group: String,
    checker: Arc<dyn TransactionChecker>,
}

struct Inner {
    addr: String,
    links: Links,
    timeout: Duration,
    delay_limits: RwLock<DelayLimits>,
    /// Live checker registrations by id. Std lock, held for map operations only.
    checkers: Mutex<HashMap<u64, Registered>>,
    next_id: AtomicU64,
    /// Dropped with the last handle: the background tasks end.
    _alive: watch::Sender<()>,
}

impl std::fmt::Debug for RemoteBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteBroker")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl RemoteBroker {
    /// Connects to the broker and reads its delay limits. Fails when the broker cannot
    /// be reached or refuses (e.g. `NO_PERMISSION` without the internal credential).
    pub async fn connect(settings: RemoteSettings) -> Result<RemoteBroker, crate::Error> {
        let (pushes, pushed) = mpsc::unbounded_channel();
        let links = Links::new(pushes, settings.credentials.clone()).with_tls(settings.tls, vec![]);
        let resp = links
            .call(
                &settings.addr,
                api::pack(
                    RemotingCommand::request(code::DELAY_LIMITS, 0),
                    "null".into(),
                    &[],
                ),
                settings.request_timeout,
            )
            .await?;
        let limits: DelayLimits = serde_json::from_str(resp.field(api::JSON).unwrap_or(""))
            .map_err(|e| crate::Error::Protocol {
                addr: settings.addr.clone(),
                what: format!("delay limits: {e}"),
            })?;
        let (alive, watch_alive) = watch::channel(());
        let inner = Arc::new(Inner {
            addr: settings.addr,
            links,
            timeout: settings.request_timeout,
            delay_limits: RwLock::new(limits),
            checkers: Mutex::default(),
            next_id: AtomicU64::new(1),
            _alive: alive,
        });
        tokio::spawn(serve_pushes(Arc::downgrade(&inner), pushed));
        tokio::spawn(keep_link(Arc::downgrade(&inner), watch_alive));
        Ok(RemoteBroker { inner })
    }

    /// The broker's address.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }
}

/// Bytes of bodies and properties one send request carries at most; a larger batch
/// goes in several requests (see [`RemoteBroker::send_encoded`]).
const CHUNK_BYTES: usize = 8 << 20;

/// The error a transport failure is: the broker is unavailable (see the module docs).
/// A request that cannot be encoded never left: it is the caller's message at fault.
fn unavailable(addr: &str, e: crate::Error) -> CoreError {
    use rocketgate_remoting::codec::CodecError;
    match e {
        crate::Error::Codec(CodecError::FrameTooLarge { len, max }) => CoreError::MessageTooLarge {
            size: usize::try_from(len).unwrap_or(usize::MAX),
            max,
        },
        crate::Error::Codec(e) => CoreError::InvalidMessage(format!("cannot be sent: {e}")),
        e => CoreError::NotLeader {
            reason: format!("the broker at {addr} is unavailable: {e}"),
        },
    }
}

/// Splits `items` into runs of at most [`CHUNK_BYTES`] (each run at least one item).
fn chunks<T>(items: Vec<T>, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let n = size(&item);
        match out.last_mut() {
            Some(run) if bytes.saturating_add(n) <= CHUNK_BYTES => {
                bytes += n;
                run.push(item);
            }
            _ => {
                bytes = n;
                out.push(vec![item]);
            }
        }
    }
    out
}

impl Inner {
    /// One call: its answer, or the core error it failed with.
    async fn exchange(
        &self,
        code: i32,
        json: String,
        parts: &[Bytes],
        wait: Duration,
    ) -> Result<RemotingCommand> {
        let cmd = api::pack(RemotingCommand::request(code, 0), json, parts);
        let resp = self
            .links
            .request(&self.addr, cmd, self.timeout.saturating_add(wait))
            .await
            .map_err(|e| unavailable(&self.addr, e))?;
        if resp.code == response::SUCCESS {
            return Ok(resp);
        }
        let remark = resp.remark.clone().unwrap_or_default();
        Err(match resp.field(api::ERROR) {
            Some(e) => match serde_json::from_str::<WireError>(e) {
                Ok(w) => w.into_core(&self.addr),
                Err(_) => api::other(&self.addr, remark),
            },
            None => api::other(&self.addr, format!("answered code {}: {remark}", resp.code)),
        })
    }

    fn decode<R: DeserializeOwned>(&self, resp: &RemotingCommand) -> Result<(R, Vec<Bytes>)> {
        let malformed = |what: String| api::other(&self.addr, format!("malformed answer: {what}"));
        let (j, parts) = api::unpack(resp).map_err(malformed)?;
        let r = serde_json::from_str(j).map_err(|e| malformed(e.to_string()))?;
        Ok((r, parts))
    }

    async fn call<A: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        code: i32,
        args: &A,
    ) -> Result<R> {
        let json = to_json(&self.addr, args)?;
        let resp = self.exchange(code, json, &[], Duration::ZERO).await?;
        Ok(self.decode(&resp)?.0)
    }

    async fn call_delivered<A: Serialize + ?Sized>(
        &self,
        code: i32,
        args: &A,
    ) -> Result<Vec<Delivered>> {
        let json = to_json(&self.addr, args)?;
        let resp = self.exchange(code, json, &[], Duration::ZERO).await?;
        let (meta, parts): (Vec<DeliveredMeta>, _) = self.decode(&resp)?;
        join_delivered(meta, parts).map_err(|e| api::other(&self.addr, e))
    }

    async fn register(&self, id: u64, group: &str) -> Result<()> {
        self.call(code::REGISTER_CHECKER, &(id, group)).await
    }

    /// After a reconnect: the broker forgot this connection's registrations.
    async fn restore(&self) {
        let live: Vec<(u64, String)> = lock(&self.checkers)
            .iter()
            .map(|(id, r)| (*id, r.group.clone()))
            .collect();
        for (id, group) in live {
            if let Err(e) = self.register(id, &group).await {
                tracing::warn!(broker = %self.addr, group, error = %e, "re-registering a transaction checker failed");
            }
        }
        match self.call::<_, DelayLimits>(code::DELAY_LIMITS, &()).await {
            Ok(l) => *self.delay_limits.write().unwrap_or_else(|p| p.into_inner()) = l,
            Err(e) => {
                tracing::debug!(broker = %self.addr, error = %e, "delay limits not refreshed")
            }
        }
    }
}

fn to_json<A: Serialize + ?Sized>(addr: &str, args: &A) -> Result<String> {
    serde_json::to_string(args).map_err(|e| api::other(addr, format!("arguments: {e}")))
}

/// Calls registered checkers with the broker's `CHECK_TRANSACTION` pushes.
async fn serve_pushes(inner: Weak<Inner>, mut pushed: mpsc::UnboundedReceiver<Pushed>) {
    while let Some(p) = pushed.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        if p.command.code != code::CHECK_TRANSACTION {
            tracing::debug!(broker = %p.addr, code = p.command.code, "push ignored");
            continue;
        }
        let decoded = api::unpack(&p.command).and_then(|(j, parts)| {
            let meta: CheckMeta = serde_json::from_str(j).map_err(|e| e.to_string())?;
            let record = parts.into_iter().next().unwrap_or_default();
            Ok((meta, record))
        });
        let (meta, record) = match decoded {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(broker = %p.addr, error = %e, "malformed transaction check");
                continue;
            }
        };
        let checker = lock(&inner.checkers)
            .get(&meta.id)
            .map(|r| r.checker.clone());
        if let Some(checker) = checker {
            checker.check(HalfMessage {
                producer_group: meta.producer_group,
                handle: meta.handle,
                msg_id: meta.msg_id,
                transaction_id: meta.transaction_id,
                record,
                check_times: meta.check_times,
            });
        }
    }
}

/// Watches the link: when a new one replaces a closed one, registers the checkers
/// again and refreshes the delay limits.
async fn keep_link(inner: Weak<Inner>, mut alive: watch::Receiver<()>) {
    let mut current: Option<usize> = None;
    loop {
        let got = {
            let Some(i) = inner.upgrade() else { return };
            let addr = i.addr.clone();
            let got = i.links.get(&addr).await;
            match got {
                Ok(link) => {
                    let id = Arc::as_ptr(&link) as usize;
                    if current.is_some_and(|c| c != id) {
                        i.restore().await;
                    }
                    current = Some(id);
                    Some(link)
                }
                Err(_) => None,
            }
        };
        match got {
            Some(link) => {
                tokio::select! {
                    _ = link.closed() => {}
                    _ = alive.changed() => return,
                }
            }
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = alive.changed() => return,
                }
            }
        }
    }
}

impl MessagingApi for RemoteBroker {
    async fn create_topic(&self, config: TopicConfig) -> Result<TopicConfig> {
        self.inner.call(code::CREATE_TOPIC, &config).await
    }

    async fn update_topic(&self, config: TopicConfig) -> Result<TopicConfig> {
        self.inner.call(code::UPDATE_TOPIC, &config).await
    }

    async fn delete_topic(&self, topic: &str) -> Result<()> {
        self.inner.call(code::DELETE_TOPIC, topic).await
    }

    async fn topic(&self, topic: &str) -> Result<TopicConfig> {
        self.inner.call(code::TOPIC, topic).await
    }

    async fn topics(&self, kind: TopicKind) -> Result<Vec<TopicConfig>> {
        self.inner.call(code::TOPICS, &kind).await
    }

    async fn send(&self, message: Message, queue: QueueChoice) -> Result<SendResult> {
        let i = &self.inner;
        let (meta, body) = MessageMeta::split(message);
        let json = to_json(&i.addr, &(meta, queue))?;
        let resp = i
            .exchange(code::SEND, json, &[body], Duration::ZERO)
            .await?;
        Ok(i.decode(&resp)?.0)
    }

    /// A batch larger than a request's worth ([`CHUNK_BYTES`]) goes in several
    /// requests to one queue (the first one's): in order, but not necessarily
    /// contiguous in it, and a failure after the first leaves the earlier part stored.
    async fn send_batch(
        &self,
        messages: Vec<Message>,
        queue: QueueChoice,
    ) -> Result<Vec<SendResult>> {
        let i = &self.inner;
        let mut queue = queue;
        let mut sent: Vec<SendResult> = Vec::with_capacity(messages.len());
        let mut runs = chunks(messages, |m| m.body.len());
        if runs.is_empty() {
            runs.push(Vec::new()); // for the broker's own answer to an empty batch
        }
        for run in runs {
            let (metas, bodies): (Vec<MessageMeta>, Vec<Bytes>) =
                run.into_iter().map(MessageMeta::split).unzip();
            let json = to_json(&i.addr, &(metas, &queue))?;
            let resp = i
                .exchange(code::SEND_BATCH, json, &bodies, Duration::ZERO)
                .await?;
            let part: Vec<SendResult> = i.decode(&resp)?.0;
            if let Some(first) = part.first() {
                queue = QueueChoice::Queue(first.queue_id);
            }
            sent.extend(part);
        }
        Ok(sent)
    }

    /// As [`Self::send_batch`] for a batch larger than [`CHUNK_BYTES`].
    async fn send_encoded(&self, batch: EncodedBatch, queue: QueueChoice) -> Result<BatchSent> {
        let i = &self.inner;
        let EncodedBatch {
            topic,
            sys_flag,
            born_timestamp,
            born_host,
            reconsume_times,
            entries,
        } = batch;
        let mut queue = queue;
        let mut sent: Option<BatchSent> = None;
        for run in chunks(entries, |e| e.body.len() + e.properties.len()) {
            let part = EncodedBatch {
                topic: topic.clone(),
                sys_flag,
                born_timestamp,
                born_host,
                reconsume_times,
                entries: run,
            };
            let (meta, parts) = EncodedMeta::split(part);
            let json = to_json(&i.addr, &(meta, &queue))?;
            let resp = i
                .exchange(code::SEND_ENCODED, json, &parts, Duration::ZERO)
                .await?;
            let part = i.decode::<BatchSentMeta>(&resp)?.0.sent();
            queue = QueueChoice::Queue(part.queue_id);
            match &mut sent {
                Some(s) => s.records.extend(part.records),
                None => sent = Some(part),
            }
        }
        // An empty batch: one request, for the broker's own answer to it.
        match sent {
            Some(s) => Ok(s),
            None => {
                let (meta, parts) = EncodedMeta::split(EncodedBatch {
                    topic,
                    sys_flag,
                    born_timestamp,
                    born_host,
                    reconsume_times,
                    entries: Vec::new(),
                });
                let json = to_json(&i.addr, &(meta, &queue))?;
                let resp = i
                    .exchange(code::SEND_ENCODED, json, &parts, Duration::ZERO)
                    .await?;
                Ok(i.decode::<BatchSentMeta>(&resp)?.0.sent())
            }
        }
    }

    async fn send_back(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        delay_level: Option<u8>,
    ) -> Result<SendBackResult> {
        let args = (group, topic, queue_id, offset, delay_level);
        self.inner.call(code::SEND_BACK, &args).await
    }

    async fn resend_dead_letters(
        &self,
        group: &str,
        which: DeadLetters,
    ) -> Result<Vec<SendResult>> {
        self.inner
            .call(code::RESEND_DEAD_LETTERS, &(group, which))
            .await
    }

    async fn pull(&self, request: PullRequest) -> Result<PullResult> {
        let i = &self.inner;
        let wait = request.wait;
        let json = to_json(&i.addr, &PullArgs::of(request))?;
        let resp = i.exchange(code::PULL, json, &[], wait).await?;
        let (meta, parts): (PullMeta, _) = i.decode(&resp)?;
        Ok(PullResult {
            status: meta.status.into(),
            messages: join_delivered(meta.messages, parts).map_err(|e| api::other(&i.addr, e))?,
            next_offset: meta.next_offset,
            min_offset: meta.min_offset,
            max_offset: meta.max_offset,
            // The proxy protocol does not carry it; only the native door uses it.
            behind_bytes: 0,
        })
    }

    async fn pop(&self, request: PopRequest) -> Result<Vec<Popped>> {
        let i = &self.inner;
        let wait = request.wait;
        let json = to_json(&i.addr, &PopArgs::of(request))?;
        let resp = i.exchange(code::POP, json, &[], wait).await?;
        let (metas, parts): (Vec<PoppedMeta>, Vec<Bytes>) = i.decode(&resp)?;
        if metas.len() != parts.len() {
            return Err(api::other(
                &i.addr,
                "POP records and receipts differ".into(),
            ));
        }
        metas
            .into_iter()
            .zip(parts)
            .map(|(PoppedMeta(queue_id, queue_offset, receipt), record)| {
                Ok(Popped {
                    receipt: receipt.parse::<ReceiptHandle>()?,
                    message: Delivered {
                        queue_id,
                        queue_offset,
                        record,
                    },
                })
            })
            .collect()
    }

    async fn ack(&self, receipt: &str) -> Result<()> {
        self.inner.call(code::ACK, receipt).await
    }

    async fn change_invisibility(
        &self,
        receipt: &str,
        invisible: Duration,
    ) -> Result<ReceiptHandle> {
        let handle: String = self
            .inner
            .call(code::CHANGE_INVISIBILITY, &(receipt, millis(invisible)))
            .await?;
        handle.parse()
    }

    async fn nack(&self, receipt: &str, delay: Duration) -> Result<()> {
        self.inner.call(code::NACK, &(receipt, millis(delay))).await
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> Result<()> {
        self.inner.call(code::HEARTBEAT, &heartbeat).await
    }

    async fn unregister(&self, group: &str, member: &str) -> Result<()> {
        self.inner.call(code::UNREGISTER, &(group, member)).await
    }

    async fn assignment(&self, group: &str, member: &str, topic: &str) -> Result<Vec<u32>> {
        self.inner
            .call(code::ASSIGNMENT, &(group, member, topic))
            .await
    }

    async fn query_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<u64>> {
        let args = (group, member, topic, queue_id);
        self.inner.call(code::QUERY_OFFSET, &args).await
    }

    async fn commit_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Result<()> {
        let args = (group, member, topic, queue_id, offset);
        self.inner.call(code::COMMIT_OFFSET, &args).await
    }

    async fn reset_offset(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        to: OffsetReset,
    ) -> Result<Vec<(u32, u64)>> {
        let args = (group, member, topic, to);
        self.inner.call(code::RESET_OFFSET, &args).await
    }

    async fn lock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<()> {
        let args = (group, member, topic, queue_id);
        self.inner.call(code::LOCK_QUEUE, &args).await
    }

    async fn unlock_queue(
        &self,
        group: &str,
        member: &str,
        topic: &str,
        queue_id: u32,
    ) -> Result<()> {
        let args = (group, member, topic, queue_id);
        self.inner.call(code::UNLOCK_QUEUE, &args).await
    }

    async fn send_half(
        &self,
        producer_group: &str,
        message: Message,
        queue: QueueChoice,
    ) -> Result<HalfSent> {
        let i = &self.inner;
        let (meta, body) = MessageMeta::split(message);
        let json = to_json(&i.addr, &(producer_group, meta, queue))?;
        let resp = i
            .exchange(code::SEND_HALF, json, &[body], Duration::ZERO)
            .await?;
        Ok(i.decode(&resp)?.0)
    }

    async fn end_transaction(
        &self,
        handle: &TransactionHandle,
        resolution: Resolution,
    ) -> Result<Option<SendResult>> {
        self.inner
            .call(code::END_TRANSACTION, &(handle, resolution))
            .await
    }

    async fn register_transaction_checker(
        &self,
        producer_group: &str,
        checker: Arc<dyn TransactionChecker>,
    ) -> Result<CheckerRegistration> {
        let i = &self.inner;
        let id = i.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&i.checkers).insert(
            id,
            Registered {
                group: producer_group.to_owned(),
                checker,
            },
        );
        if let Err(e) = i.register(id, producer_group).await {
            lock(&i.checkers).remove(&id);
            return Err(e);
        }
        let weak = Arc::downgrade(i);
        Ok(CheckerRegistration::new(move || {
            let Some(inner) = weak.upgrade() else { return };
            lock(&inner.checkers).remove(&id);
            // Tell the broker; if that fails, the broker still stops with the
            // connection, and checks for this id are ignored here meanwhile.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = inner.call::<_, ()>(code::UNREGISTER_CHECKER, &id).await;
                });
            }
        }))
    }

    async fn queue_stats(&self, topic: &str) -> Result<Vec<QueueStats>> {
        self.inner.call(code::QUEUE_STATS, topic).await
    }

    async fn offset_by_time(&self, topic: &str, queue_id: u32, ts_ms: i64) -> Result<u64> {
        self.inner
            .call(code::OFFSET_BY_TIME, &(topic, queue_id, ts_ms))
            .await
    }

    async fn set_max_reconsume_times(&self, group: &str, max: Option<u32>) -> Result<()> {
        self.inner
            .call(code::SET_MAX_RECONSUME_TIMES, &(group, max))
            .await
    }

    async fn set_fifo(&self, group: &str, fifo: bool) -> Result<()> {
        self.inner.call(code::SET_FIFO, &(group, fifo)).await
    }

    async fn groups(&self) -> Result<Vec<String>> {
        self.inner.call(code::GROUPS, &()).await
    }

    async fn group_info(&self, group: &str) -> Result<GroupInfo> {
        self.inner.call(code::GROUP_INFO, group).await
    }

    async fn message_by_id(&self, msg_id: &str) -> Result<Delivered> {
        let mut found = self
            .inner
            .call_delivered(code::MESSAGE_BY_ID, msg_id)
            .await?;
        found
            .pop()
            .ok_or_else(|| api::other(&self.inner.addr, "no record in the answer".into()))
    }

    async fn messages_by_key(&self, topic: &str, key: &str, max: usize) -> Result<Vec<Delivered>> {
        self.inner
            .call_delivered(code::MESSAGES_BY_KEY, &(topic, key, max))
            .await
    }

    async fn messages_by_time(
        &self,
        topic: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<Delivered>> {
        self.inner
            .call_delivered(code::MESSAGES_BY_TIME, &(topic, begin_ms, end_ms, max))
            .await
    }

    fn delay_limits(&self) -> DelayLimits {
        self.inner
            .delay_limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn delayed(&self, topic: &str, max: usize) -> Result<Vec<Delayed>> {
        self.inner.call(code::DELAYED, &(topic, max)).await
    }

    async fn cancel_delayed(&self, id: &str) -> Result<Delayed> {
        self.inner.call(code::CANCEL_DELAYED, id).await
    }

    async fn sync_visible(&self) {
        if let Err(e) = self.inner.call::<_, ()>(code::SYNC_VISIBLE, &()).await {
            tracing::debug!(broker = %self.inner.addr, error = %e, "sync_visible failed");
        }
    }
}
