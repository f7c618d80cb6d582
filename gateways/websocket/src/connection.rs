//! One `/v1/ws` connection. Its task owns the socket and `select!`s over client
//! frames, the outbound buffer its subscriptions fill, pings and shutdown.
//! Requests are handled in arrival order, so a `pong` confirms that every
//! earlier request of the connection was processed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    ConsumeMode, Heartbeat, MessagingApi, OffsetReset, QueueChoice, ReceiptHandle, Subscription,
};
use rocketgate_tls::Stream;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::auth::{AuthAttempt, AuthDecision, Authenticator, Door};
use crate::protocol::error_code;
use crate::protocol::{self, AckTarget, Envelope, Request, Start, Subscribe};
use crate::settings::Settings;
use crate::subscription::{Feed, Outbox, Shared, parse_broadcast_receipt, stopped};

/// Frames the outbound buffer holds at most, whatever their size.
const OUTBOUND_FRAMES: usize = 1024;
/// Frames written to the socket before one flush.
const WRITE_BATCH: usize = 64;

/// What the server shares with every connection.
pub(crate) struct Context<B> {
    pub broker: Arc<B>,
    /// `/v1/ws` connections per client address (`max_connections_per_address`).
    pub conn_limit: rocketgate_auth::ConnectionLimit,
    pub settings: Arc<Settings>,
    pub auth: Arc<dyn Authenticator>,
    /// `ws.allowed_origins`, checked at the upgrade.
    pub origins: rocketgate_tls::Origins,
    /// Connections with subscriptions, for the admin API.
    pub subscribers: Subscribers,
}

/// The `/v1/ws` connections that hold subscriptions (`GET /v1/connections`),
/// updated at each subscribe and unsubscribe and when a connection ends, never
/// on the message path. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Subscribers(Arc<SubscribersInner>);

#[derive(Debug, Default)]
struct SubscribersInner {
    next: std::sync::atomic::AtomicU64,
    by_conn: std::sync::Mutex<HashMap<u64, Subscriber>>,
}

/// One `/v1/ws` connection with subscriptions.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscriber {
    pub peer: SocketAddr,
    /// Unix ms the connection was opened.
    pub since_ms: i64,
    /// (subscription id, group, topic)
    pub subscriptions: Vec<(String, String, String)>,
}

impl Subscribers {
    /// Every connection with subscriptions, oldest first.
    pub fn list(&self) -> Vec<Subscriber> {
        let mut v: Vec<(u64, Subscriber)> = rocketgate_core::sync::lock(&self.0.by_conn)
            .iter()
            .map(|(id, s)| (*id, s.clone()))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v.into_iter().map(|(_, s)| s).collect()
    }

    fn next_id(&self) -> u64 {
        self.0
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self, conn: u64, s: Option<Subscriber>) {
        let mut map = rocketgate_core::sync::lock(&self.0.by_conn);
        match s {
            Some(s) => map.insert(conn, s),
            None => map.remove(&conn),
        };
    }
}

struct Sub {
    spec: Subscribe,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Sub {
    async fn end(self) {
        self.shared
            .unsubscribed
            .store(true, std::sync::atomic::Ordering::Release);
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

/// A request's failure: error code and message.
type Failure = (&'static str, String);

struct Conn<B> {
    ctx: Arc<Context<B>>,
    /// Its key in [`Subscribers`], and when it was opened (unix ms).
    id: u64,
    since_ms: i64,
    peer: SocketAddr,
    /// The verified TLS client certificate's name (WSS with mTLS): offered to the
    /// authenticator with the first frame's token too.
    tls_identity: Option<String>,
    /// What this connection may publish and subscribe to (`None`: everything).
    grant: Option<Arc<rocketgate_auth::Grant>>,
    subs: HashMap<String, Sub>,
    outbox: Outbox,
}

fn close(code: CloseCode, reason: &str) -> Option<CloseFrame> {
    Some(CloseFrame {
        code,
        reason: reason.into(),
    })
}

/// The close code of a connection whose credential expired (a JWT's `exp`): 4401,
/// in the range RFC 6455 leaves to applications, after HTTP's 401.
pub(crate) const TOKEN_EXPIRED: u16 = 4401;

/// What the upgrade decided about a `/v1/ws` connection.
pub(crate) struct Opened {
    pub peer: SocketAddr,
    pub tls_identity: Option<String>,
    /// The first frame must be `auth`.
    pub token_required: bool,
    pub grant: Option<Arc<rocketgate_auth::Grant>>,
    /// When the credential presented at the upgrade expires.
    pub expires_at: Option<std::time::SystemTime>,
    /// Its place under the per-address limit, given back when the connection ends.
    pub _slot: rocketgate_auth::ConnectionSlot,
}

/// The tokio instant of a wall-clock expiry (already past: now).
fn deadline_of(at: std::time::SystemTime) -> Instant {
    let left = at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    Instant::now() + left
}

/// One connection more than `max_connections_per_address` allows: closed at once
/// with 1013 "try again later" and the reason.
pub(crate) async fn refuse_over_limit(mut ws: WebSocketStream<Stream>, peer: SocketAddr) {
    metrics::counter!("rocketgate_connections_refused_total", "door" => "ws").increment(1);
    tracing::warn!(%peer, "WebSocket connection refused: too many connections from this address");
    let frame = close(
        CloseCode::Again,
        "too many connections from this address (max_connections_per_address)",
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), ws.close(frame)).await;
}

/// An upgraded `/v1/ws` socket and what serving it needs: one boxed argument,
/// because an `async fn` keeps room for its arguments for its whole life beside
/// the locals they move into (~460 bytes of every idle connection's task).
pub(crate) struct Upgraded<B> {
    pub ws: WebSocketStream<Stream>,
    pub ctx: Arc<Context<B>>,
    pub opened: Opened,
    pub closing: watch::Receiver<bool>,
}

/// Serves one upgraded `/v1/ws` socket until either side closes it.
pub(crate) async fn serve<B: MessagingApi + 'static>(upgraded: Box<Upgraded<B>>) {
    let Upgraded {
        mut ws,
        ctx,
        opened:
            Opened {
                peer,
                tls_identity,
                token_required,
                grant,
                expires_at,
                _slot,
            },
        mut closing,
    } = *{ upgraded }; // (the box is freed here, not when the connection ends)
    let settings = ctx.settings.clone();
    let _open = OpenConnection::new();
    let (outbox, mut outbound, budget) = Outbox::new(settings.outbound_buffer, OUTBOUND_FRAMES);
    if let Some(id) = &tls_identity {
        tracing::info!(%peer, tls_identity = %id, "WebSocket connection with a client certificate");
    }
    let mut conn = Conn {
        id: ctx.subscribers.next_id(),
        since_ms: rocketgate_core::clock::now_ms(),
        ctx,
        peer,
        tls_identity,
        grant,
        subs: HashMap::new(),
        outbox,
    };
    let mut authed = !token_required;
    let auth_deadline = Instant::now() + settings.handshake_timeout;
    // When the credential stops being valid: the connection ends then.
    let mut expiry = expires_at.map(deadline_of);
    let mut last_heard = Instant::now();
    let mut ping = tokio::time::interval_at(
        Instant::now() + settings.ping_interval,
        settings.ping_interval,
    );
    let max = settings.max_message_size;

    let close_with: Option<CloseFrame> = loop {
        tokio::select! {
            _ = stopped(&mut closing) => break close(CloseCode::Away, "server shutting down"),
            msg = ws.next() => {
                last_heard = Instant::now();
                let text = match msg {
                    None => break None,
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Binary(_))) => {
                        let f = protocol::error_frame(&None, "unsupported_data",
                            "binary frames are not part of /v1/ws: send JSON text frames", None);
                        if ws.send(Message::text(f)).await.is_err() { break None; }
                        continue;
                    }
                    Some(Ok(Message::Close(_))) => break None,
                    Some(Ok(_)) => continue, // ping/pong: answered by tungstenite
                    Some(Err(WsError::Capacity(CapacityError::MessageTooLong { size, .. }))) => {
                        tracing::debug!(%peer, size, "frame over the limit");
                        break close(CloseCode::Size, &format!("message too big: the limit is {max} bytes"));
                    }
                    Some(Err(WsError::Capacity(_))) => {
                        break close(CloseCode::Size, &format!("message too big: the limit is {max} bytes"));
                    }
                    Some(Err(WsError::Utf8(_))) => break close(CloseCode::Invalid, "text frame is not UTF-8"),
                    Some(Err(WsError::Protocol(e))) => {
                        break close(CloseCode::Protocol, &format!("protocol error: {e}"));
                    }
                    Some(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "read failed");
                        break None;
                    }
                };
                if !authed {
                    match conn.authenticate(&text) {
                        Ok((reply, grant, expires_at)) => {
                            authed = true;
                            conn.grant = grant;
                            expiry = expires_at.map(deadline_of);
                            if ws.send(Message::text(reply)).await.is_err() { break None; }
                            continue;
                        }
                        Err(reason) => break close(CloseCode::Policy, &reason),
                    }
                }
                // A request's work (subscribe: offsets, registration) is boxed, so
                // an idle connection's task does not carry its state (issue #33).
                let replies = Box::pin(conn.handle(&text)).await;
                let mut failed = false;
                for r in replies {
                    if ws.feed(Message::text(r)).await.is_err() { failed = true; break; }
                }
                if failed || ws.flush().await.is_err() { break None; }
            }
            Some(out) = outbound.recv() => {
                let mut failed = out.wanted() && ws.feed(Message::text(out.text)).await.is_err();
                let mut n = 1;
                while !failed && n < WRITE_BATCH {
                    match outbound.try_recv() {
                        Ok(out) => failed = out.wanted() && ws.feed(Message::text(out.text)).await.is_err(),
                        Err(_) => break,
                    }
                    n += 1;
                }
                if failed || ws.flush().await.is_err() { break None; }
            }
            _ = ping.tick() => {
                if last_heard.elapsed() > settings.ping_interval * 2 {
                    break close(CloseCode::Away, "no answer to pings");
                }
                if ws.send(Message::Ping(Default::default())).await.is_err() { break None; }
            }
            _ = sleep_until_some(expiry) => {
                tracing::info!(%peer, "WebSocket connection closed: its token expired");
                let f = protocol::error_frame(&None, "token_expired",
                    "the token of this connection expired; connect again with a new one", None);
                let _ = ws.send(Message::text(f)).await;
                break close(CloseCode::from(TOKEN_EXPIRED), "token expired");
            }
            _ = tokio::time::sleep_until(auth_deadline), if !authed => {
                break close(CloseCode::Policy, "authentication required: send {\"op\":\"auth\",\"token\":...} first");
            }
        }
    };
    // Let the subscriptions finish (commit, give leases back) without the socket.
    budget.close();
    drop(outbound);
    conn.ctx.subscribers.set(conn.id, None);
    for (_, sub) in conn.subs.drain() {
        Box::pin(sub.end()).await;
    }
    if let Some(frame) = &close_with {
        tracing::debug!(%peer, code = %frame.code, reason = %frame.reason, "closing");
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), ws.close(close_with)).await;
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A successful `auth` frame: the reply, the grant and when the token expires.
type Authed = (
    String,
    Option<Arc<rocketgate_auth::Grant>>,
    Option<std::time::SystemTime>,
);

impl<B: MessagingApi + 'static> Conn<B> {
    /// The first frame when the authenticator asked for a token.
    fn authenticate(&self, text: &str) -> Result<Authed, String> {
        let Ok(Envelope {
            req,
            request: Request::Auth { token },
        }) = protocol::parse(text)
        else {
            return Err(
                "authentication required: the first frame must be {\"op\":\"auth\",\"token\":...}"
                    .into(),
            );
        };
        match self.ctx.auth.authenticate(&AuthAttempt {
            door: Door::Json,
            peer: self.peer,
            token: Some(&token),
            first_frame: true,
            tls_identity: self.tls_identity.as_deref(),
        }) {
            AuthDecision::Allow => Ok((protocol::authenticated_frame(&req), None, None)),
            AuthDecision::AllowWith { grant, expires_at } => {
                Ok((protocol::authenticated_frame(&req), Some(grant), expires_at))
            }
            AuthDecision::Deny(reason) => Err(reason),
            AuthDecision::TokenRequired => Err("the token was not accepted".into()),
        }
    }

    /// Updates this connection's entry in [`Subscribers`].
    fn show_subscriptions(&self) {
        let subs: Vec<(String, String, String)> = self
            .subs
            .iter()
            .map(|(id, s)| (id.clone(), s.spec.group.clone(), s.spec.topic.clone()))
            .collect();
        let entry = (!subs.is_empty()).then_some(Subscriber {
            peer: self.peer,
            since_ms: self.since_ms,
            subscriptions: subs,
        });
        self.ctx.subscribers.set(self.id, entry);
    }

    /// Handles one text frame; returns the frames to answer with.
    async fn handle(&mut self, text: &str) -> Vec<String> {
        let Envelope { req, request } = match protocol::parse(text) {
            Ok(e) => e,
            Err(bad) => {
                return vec![protocol::error_frame(
                    &bad.req,
                    bad.code,
                    &bad.message,
                    None,
                )];
            }
        };
        let result: Result<Option<String>, Failure> = match request {
            Request::Ping => Ok(Some(protocol::pong_frame(&req))),
            Request::Auth { .. } => Ok(Some(protocol::authenticated_frame(&req))),
            Request::Publish(p) => self.publish(*p, &req).await.map(Some),
            Request::Subscribe(s) => {
                let r = self.subscribe(s, &req).await.map(Some);
                self.show_subscriptions();
                r
            }
            Request::Unsubscribe { id } => match self.subs.remove(&id) {
                Some(sub) => {
                    sub.end().await;
                    self.show_subscriptions();
                    Ok(Some(protocol::unsubscribed_frame(&req, &id)))
                }
                None => Err(unknown(&id)),
            },
            Request::Credit { id, n } => match self.subs.get(&id) {
                Some(sub) => {
                    sub.shared.add_credit(n);
                    Ok(None)
                }
                None => Err(unknown(&id)),
            },
            Request::Ack(target) => self.settle(target, None).await.map(|_| None),
            Request::Nack { target, delay_ms } => self
                .settle(target, Some(Duration::from_millis(delay_ms)))
                .await
                .map(|_| None),
        };
        match result {
            Ok(reply) => reply.into_iter().collect(),
            Err((code, message)) => vec![protocol::error_frame(&req, code, &message, None)],
        }
    }

    /// A publish, its delay checked against the broker's limits first: a delay
    /// beyond the maximum or a `deliver_at` in the past is refused, never capped
    /// or delivered at once.
    async fn publish(&self, p: protocol::Publish, req: &Option<Value>) -> Result<String, Failure> {
        let started = std::time::Instant::now();
        let mut message = p.message;
        if let Some(g) = &self.grant {
            let name = match message.tags() {
                Some(t) if !t.is_empty() => format!("{}/{t}", message.topic),
                _ => message.topic.clone(),
            };
            if !g.may_publish(&name) {
                metrics::counter!("rocketgate_acl_denied_total", "door" => "ws", "action" => "publish")
                    .increment(1);
                return Err(("forbidden", format!("not allowed to publish to {name}")));
            }
        }
        if let Some(delay) = p.delay {
            let limits = self.ctx.broker.delay_limits();
            if let Some((name, value)) = limits
                .property(delay, rocketgate_core::clock::now_ms())
                .map_err(|e| error_code(&e))?
            {
                message.insert_property(name, value);
            }
        }
        let choice = p
            .sharding_key
            .map_or(QueueChoice::RoundRobin, QueueChoice::ShardingKey);
        let topic = message.topic.clone();
        let bytes = message.body.len();
        let sent = self
            .ctx
            .broker
            .send(message, choice)
            .await
            .map_err(|e| error_code(&e))?;
        crate::meters::count_in(&topic, bytes);
        crate::meters::METERS.publish.record_since(started);
        Ok(protocol::send_result_frame(req, &sent))
    }

    async fn subscribe(&mut self, s: Subscribe, req: &Option<Value>) -> Result<String, Failure> {
        if let Some(old) = self.subs.get(&s.id) {
            if !old.shared.lock().ended {
                return Err((
                    "duplicate_subscription",
                    format!(
                        "subscription {:?} exists on this connection; unsubscribe first",
                        s.id
                    ),
                ));
            }
            if let Some(old) = self.subs.remove(&s.id) {
                old.end().await;
            }
        }
        if let Some(g) = &self.grant
            && !g.may_subscribe(&s.topic, Some(&s.group))
        {
            metrics::counter!("rocketgate_acl_denied_total", "door" => "ws", "action" => "subscribe")
                .increment(1);
            return Err((
                "forbidden",
                format!("not allowed to read {} as group {}", s.topic, s.group),
            ));
        }
        if self.subs.len() >= self.ctx.settings.max_subscriptions {
            return Err((
                "too_many_subscriptions",
                format!(
                    "a connection holds at most {} subscriptions",
                    self.ctx.settings.max_subscriptions
                ),
            ));
        }
        let core = |e: rocketgate_core::Error| error_code(&e);
        let filter = Filter::parse(s.filter_type, &s.filter)
            .map_err(|e| ("invalid_filter", e.to_string()))?;
        let broker = &self.ctx.broker;
        let queues = broker.topic(&s.topic).await.map_err(core)?.read_queues;
        if s.fifo {
            broker.set_fifo(&s.group, true).await.map_err(core)?;
        }
        let member = match s.mode {
            ConsumeMode::Clustering => String::new(),
            ConsumeMode::Broadcasting => {
                broker
                    .heartbeat(Heartbeat {
                        group: s.group.clone(),
                        member: s.id.clone(),
                        mode: ConsumeMode::Broadcasting,
                        subscriptions: vec![Subscription {
                            topic: s.topic.clone(),
                            filter_type: s.filter_type,
                            expression: s.filter.clone(),
                        }],
                    })
                    .await
                    .map_err(core)?;
                s.id.clone()
            }
        };
        let positions = async {
            let mut next = vec![0u64; queues as usize];
            let mut resumed = false;
            for q in 0..queues {
                if let Some(o) = broker.query_offset(&s.group, &member, &s.topic, q).await? {
                    next[q as usize] = o;
                    resumed = true;
                }
            }
            if !resumed {
                let reset = match s.start {
                    Start::Latest => Some(OffsetReset::Latest),
                    Start::Earliest => Some(OffsetReset::Earliest),
                    Start::Timestamp(t) => Some(OffsetReset::Timestamp(t)),
                    Start::Offset(_) => None,
                };
                if let Some(to) = reset {
                    for (q, o) in broker.reset_offset(&s.group, &member, &s.topic, to).await? {
                        if let Some(slot) = next.get_mut(q as usize) {
                            *slot = o;
                        }
                    }
                } else if let Start::Offset(o) = s.start {
                    for q in 0..queues {
                        broker
                            .commit_offset(&s.group, &member, &s.topic, q, o)
                            .await?;
                        next[q as usize] = o;
                    }
                }
            }
            Ok::<_, rocketgate_core::Error>((next, resumed))
        }
        .await;
        let (next, resumed) = match positions {
            Ok(p) => p,
            Err(e) => {
                if s.mode == ConsumeMode::Broadcasting {
                    let _ = broker.unregister(&s.group, &member).await;
                }
                return Err(core(e));
            }
        };
        let next = if s.mode == ConsumeMode::Broadcasting {
            next
        } else {
            Vec::new()
        };
        let shared = Arc::new(Shared::new(s.credit, next));
        let (stop, stopped) = watch::channel(false);
        let feed = Feed {
            broker: broker.clone(),
            spec: s.clone(),
            filter,
            shared: shared.clone(),
            outbox: self.outbox.clone(),
            settings: self.ctx.settings.clone(),
            stop: stopped,
        };
        let task = tokio::spawn(feed.run());
        let reply = protocol::subscribed_frame(req, &s.id, s.credit, resumed);
        self.subs.insert(
            s.id.clone(),
            Sub {
                spec: s,
                shared,
                stop,
                task,
            },
        );
        Ok(reply)
    }

    /// Ack (`nack` = None) or nack (after `delay`) what `target` names.
    async fn settle(&mut self, target: AckTarget, nack: Option<Duration>) -> Result<(), Failure> {
        let broker = self.ctx.broker.clone();
        match target {
            AckTarget::Receipt(r) => {
                if let Some((id, q, o)) = parse_broadcast_receipt(&r) {
                    let sub = self.subs.get(id).ok_or_else(|| unknown(id))?;
                    let found = {
                        let mut st = sub.shared.lock();
                        match nack {
                            None => st.in_flight.remove(&(q, o)).is_some(),
                            Some(d) => st
                                .in_flight
                                .get_mut(&(q, o))
                                .map(|l| l.redeliver_at = Some(Instant::now() + d))
                                .is_some(),
                        }
                    };
                    if !found {
                        return Err(("stale_receipt", format!("{r:?} names no un-acked delivery")));
                    }
                    sub.shared.wake.notify_one();
                    if nack.is_none() {
                        commit(&*broker, sub, q).await?;
                    }
                    return Ok(());
                }
                let handle: ReceiptHandle = r
                    .parse()
                    .map_err(|e: rocketgate_core::Error| error_code(&e))?;
                let result = match nack {
                    None => broker.ack(&r).await,
                    Some(d) => broker.nack(&r, d).await,
                };
                for sub in self.subs.values() {
                    let s = &sub.spec;
                    if s.mode == ConsumeMode::Clustering
                        && s.group == handle.group
                        && s.topic == handle.topic
                    {
                        let mut st = sub.shared.lock();
                        let key = (handle.queue_id, handle.queue_offset);
                        if st.in_flight.get(&key).is_some_and(|l| l.receipt == r) {
                            st.in_flight.remove(&key);
                            drop(st);
                            sub.shared.wake.notify_one();
                        }
                    }
                }
                result.map_err(|e| error_code(&e))
            }
            AckTarget::UpTo {
                id,
                queue_id,
                offset,
            } => {
                let sub = self.subs.get(&id).ok_or_else(|| unknown(&id))?;
                let taken: Vec<String> = {
                    let mut st = sub.shared.lock();
                    let keys: Vec<(u32, u64)> = st
                        .in_flight
                        .range((queue_id, 0)..=(queue_id, offset))
                        .map(|(k, _)| *k)
                        .collect();
                    match (sub.spec.mode, nack) {
                        (ConsumeMode::Broadcasting, Some(d)) => {
                            for k in &keys {
                                if let Some(l) = st.in_flight.get_mut(k) {
                                    l.redeliver_at = Some(Instant::now() + d);
                                }
                            }
                            Vec::new()
                        }
                        _ => keys
                            .iter()
                            .filter_map(|k| st.in_flight.remove(k))
                            .map(|l| l.receipt)
                            .collect(),
                    }
                };
                sub.shared.wake.notify_one();
                match sub.spec.mode {
                    ConsumeMode::Broadcasting => {
                        if nack.is_none() {
                            commit(&*broker, sub, queue_id).await?;
                        }
                    }
                    ConsumeMode::Clustering => {
                        // A nack goes latest first: in a FIFO group each nack gives
                        // back the later messages of its queue too (their handles
                        // go stale), so front to back every nack but the first would
                        // be refused; back to front each is current when its turn
                        // comes, and all are redelivered in queue order.
                        let taken: Vec<String> = match nack {
                            Some(_) => taken.into_iter().rev().collect(),
                            None => taken,
                        };
                        for r in taken {
                            // A stale one was redelivered elsewhere: not ours to settle.
                            let _ = match nack {
                                None => broker.ack(&r).await,
                                Some(d) => broker.nack(&r, d).await,
                            };
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// Broadcasting: commits a queue's lowest un-acked offset.
async fn commit<B: MessagingApi>(broker: &B, sub: &Sub, queue: u32) -> Result<(), Failure> {
    let low = sub.shared.lock().low_water(queue);
    if let Some(o) = low {
        let s = &sub.spec;
        broker
            .commit_offset(&s.group, &s.id, &s.topic, queue, o)
            .await
            .map_err(|e| error_code(&e))?;
    }
    Ok(())
}

fn unknown(id: &str) -> Failure {
    (
        "unknown_subscription",
        format!("no subscription {id:?} on this connection"),
    )
}

/// `rocketgate_connections{protocol="ws"}` while a `/v1/ws` connection runs (also
/// when its task ends by a panic).
struct OpenConnection;

impl OpenConnection {
    fn new() -> OpenConnection {
        metrics::gauge!("rocketgate_connections", "protocol" => "ws").increment(1.0);
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!("rocketgate_connections", "protocol" => "ws").decrement(1.0);
    }
}
