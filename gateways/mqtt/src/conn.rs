//! One client connection: one task that owns the socket and the session while
//! connected. Outgoing packets are encoded into one buffer and written by the
//! same task's loop whenever the socket takes them (many packets per socket
//! write); there is no writer task, whose task and channel cost each idle
//! connection more than a kilobyte (issue #10).
//!
//! Incoming PUBLISHes read in one go are stored with one core `send_batch` per
//! run of the same core topic, and acknowledged only after it returns. Outgoing
//! messages are in `deliver.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mqttbytes::v5::{
    ConnAck, ConnAckProperties, Connect, ConnectReturnCode, Disconnect, DisconnectProperties,
    DisconnectReasonCode, Packet, PubComp, PubCompReason, PubRel,
};
use rocketgate_core::broker::MessagingApi;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::codec::{self, CodecError, Version};
use crate::router::{Feed, Inbox, Interest};
use crate::server::{Shared, Slot, Takeover, lock};
use crate::session::Session;
use crate::state::WillRecord;
use crate::topic;

/// Why a connection ends.
pub(crate) enum End {
    /// The client sent DISCONNECT (publish the will only for reason 0x04).
    Client { will: bool },
    /// The socket closed or failed without DISCONNECT.
    Closed,
    /// The server closes it with this v5 reason code.
    Server(DisconnectReasonCode, String),
    /// Another connection took the session over.
    Takeover(Takeover),
    /// The server is stopping.
    Shutdown,
}

impl End {
    pub(crate) fn protocol(reason: impl Into<String>) -> End {
        End::Server(DisconnectReasonCode::ProtocolError, reason.into())
    }
}

pub(crate) struct Conn<B> {
    pub shared: Arc<Shared<B>>,
    pub version: Version,
    pub peer: SocketAddr,
    pub conn_id: u64,
    pub session: Box<Session>,
    /// Encoded packets not yet written to the socket.
    pub out: BytesMut,
    /// The client's Receive Maximum (outgoing window) and Maximum Packet Size.
    pub client_receive_max: usize,
    pub client_max_packet: usize,
    pub client_alias_max: u16,
    pub problem_info: bool,
    // B-tree maps and sets here: empty, they take 24 bytes where a hash map
    // takes 48, and most connections keep them empty (memory per connection).
    /// Topic aliases both ways (v5), made on first use: most connections never
    /// use one, and every byte of this struct is in every connection's task.
    pub aliases: Option<Box<Aliases>>,
    pub ready: crate::ready::ReadyQueue,
    pub pending: BTreeSet<(Arc<str>, u32)>,
    /// Queues of a QoS 0 session that overflowed: they skip ahead to live.
    pub skipping: BTreeSet<(Arc<str>, u32)>,
    pub joined: BTreeSet<Arc<str>>,
    pub inbox: Inbox,
    /// Feeds from the router; made when the session first follows a topic
    /// ([`Conn::router_inbox`]), as most connections of a device fleet follow few
    /// or none and a channel costs each about a kilobyte.
    feeds: Option<mpsc::Receiver<Feed>>,
    pub shares: crate::share::Members,
    pub(crate) pubs: Vec<crate::inbound::PendingPub>,
    /// The last catch-up pull ended far from the end of its queue.
    pub far_behind: bool,
}

/// A v5 connection's topic aliases.
#[derive(Default)]
pub struct Aliases {
    /// From the client: alias -> topic name.
    pub incoming: BTreeMap<u16, String>,
    /// Towards the client: topic name -> alias.
    pub outgoing: BTreeMap<String, u16>,
}

pub(crate) async fn run<B, IO>(shared: Arc<Shared<B>>, io: IO, peer: SocketAddr)
where
    B: MessagingApi + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut inbuf = BytesMut::with_capacity(8 * 1024);
    let max = shared.settings.max_packet_size as usize;
    let first = tokio::time::timeout(
        shared.settings.connect_timeout,
        Box::pin(read_connect(&mut rd, &mut inbuf, max)),
    )
    .await;
    let (version, connect) = match first {
        Ok(Ok(c)) => c,
        Ok(Err(Some(reply))) => {
            let _ = wr.write_all(&reply).await;
            let _ = wr.shutdown().await;
            return;
        }
        Ok(Err(None)) | Err(_) => return,
    };
    let lagged = Arc::new(Notify::new());
    let (tk_tx, tk_rx) = oneshot::channel::<Takeover>();
    let mut tk_rx = Some(tk_rx);
    let conn_id = shared.next_id();
    let mut conn = Conn {
        shared: shared.clone(),
        version,
        peer,
        conn_id,
        session: Box::new(Session::new("", 0)),
        out: BytesMut::new(),
        client_receive_max: usize::from(shared.settings.max_inflight.max(1)),
        client_max_packet: usize::MAX,
        client_alias_max: 0,
        problem_info: true,
        aliases: None,
        ready: Default::default(),
        pending: BTreeSet::new(),
        skipping: BTreeSet::new(),
        joined: BTreeSet::new(),
        inbox: Inbox {
            id: conn_id,
            tx: crate::router::no_feeds(),
            lagged: lagged.clone(),
            overflowed: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            client_slow: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        },
        feeds: None,
        shares: crate::share::Members::new(),
        pubs: Vec::new(),
        far_behind: false,
    };
    // Rare or one-off steps run boxed: their state would otherwise be part of
    // every connection's task for its whole life (memory per idle connection).
    let keep_alive = match Box::pin(conn.accept(connect, tk_tx)).await {
        Some(k) => k,
        None => {
            let out = std::mem::take(&mut conn.out);
            drop(conn);
            write_out(&mut wr, out).await;
            return;
        }
    };
    // Packets that came in the same read as CONNECT.
    let mut early = if inbuf.is_empty() {
        // Most clients wait for CONNACK: start the connection on a small buffer.
        inbuf = BytesMut::with_capacity(READ_SMALL);
        None
    } else {
        Box::pin(conn.on_bytes(&mut inbuf)).await
    };
    let mut shutdown = shared.shutdown.clone();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_seen = Instant::now();
    // Written but not flushed (a WebSocket stream frames on flush).
    let mut unflushed = false;
    // The signals that rarely fire are waited on by futures that live across
    // the turns of the loop: made anew each turn, each registered and removed a
    // waiter under a lock (three per turn, several turns per message).
    let stopping = shutdown.changed();
    tokio::pin!(stopping);
    let lag = lagged.notified();
    tokio::pin!(lag);
    let topics = topic_change(shared.router.topic_list());
    tokio::pin!(topics);
    let mut topics_open = true;
    let end = loop {
        if let Some(end) = early.take() {
            break end;
        }
        if !conn.pending.is_empty() && conn.ready.len() < crate::deliver::READY_LOW {
            Box::pin(conn.fill_ready()).await;
        }
        // While the client does not take what was written, make no more
        // (the ready queue and the window hold the rest).
        let writable = conn.out.len() < OUT_HIGH;
        if writable {
            conn.pump();
        }
        conn.settle_acks();
        let room = conn.ready.len() < crate::deliver::READY_HIGH;
        if inbuf.capacity() - inbuf.len() < READ_SMALL {
            inbuf.reserve(READ_SMALL);
        }
        let spare = inbuf.capacity() - inbuf.len();
        // While catching up from near the end of the log, take no feeds: the
        // router then waits for this session as for any that does not drain, so
        // the publishers it follows slow down and the catch-up can overtake them
        // (discarding the feeds instead, it raced unthrottled publishers through
        // the log). One far behind (a reconnecting session with a backlog) goes on
        // discarding them and holds nobody back. Either way go on pulling at once
        // instead of waiting for the next event.
        let catching_up = !conn.pending.is_empty();
        let hold = catching_up && !conn.far_behind;
        let pull_more = catching_up && conn.ready.len() < crate::deliver::READY_LOW;
        // Not taking feeds because the client's window is full, or its socket:
        // the router must not wait for this session (see router.rs).
        conn.inbox
            .client_slow
            .store(!room || !writable, std::sync::atomic::Ordering::Release);
        tokio::select! {
            biased;
            _ = &mut stopping => break End::Shutdown,
            Some(t) = taken_over(&mut tk_rx) => break End::Takeover(t),
            // Early in the order, so a busy session still commits every second.
            // The keep-alive is checked here too (to the second: one timer per
            // connection instead of a new one each turn of the loop).
            _ = tick.tick() => {
                if keep_alive.is_some_and(|k| last_seen.elapsed() >= k) {
                    break End::Server(
                        DisconnectReasonCode::KeepAliveTimeout,
                        "no packet within 1.5 times the keep-alive".into(),
                    );
                }
                Box::pin(conn.commit()).await
            }
            r = drain(&mut wr, &mut conn.out, &mut unflushed), if !conn.out.is_empty() || unflushed => match r {
                Err(_) | Ok(Drained::Closed) => break End::Closed,
                Ok(Drained::Wrote) => {}
                Ok(Drained::Flushed) => {
                    if conn.out.capacity() > OUT_KEEP {
                        // Not kept for an idle connection.
                        conn.out = BytesMut::new();
                    }
                }
            },
            // Not reading while the client does not read: a client that only
            // publishes would otherwise pile up acknowledgements here.
            r = rd.read_buf(&mut inbuf), if writable => match r {
                Ok(0) | Err(_) => break End::Closed,
                Ok(n) => {
                    last_seen = Instant::now();
                    if let Some(end) = Box::pin(conn.on_bytes(&mut inbuf)).await {
                        break end;
                    }
                    size_read_buffer(&mut inbuf, n, spare);
                    if n >= FAIR_SHARE || !conn.out.is_empty() {
                        // A busy publisher gives the worker back after each
                        // large read (see FAIR_SHARE). And what this read has to
                        // answer (PUBACKs) goes out after the deliveries it set
                        // off: the router and subscriber tasks it woke run first,
                        // so when many publishers send at once each delivery waits
                        // for the reads and deliveries before it but not for their
                        // acknowledgements too (QoS 1 at 10k msgs/s, publishers on
                        // one tick: p50 183 -> 153 us, p99 568 -> 418 us; flat-out
                        // throughput the same).
                        tokio::task::yield_now().await;
                    }
                }
            },
            Some(b) = recv_made(&mut conn.feeds), if room && !hold => {
                conn.on_batch(b);
                while conn.ready.len() < crate::deliver::READY_HIGH
                    && let Some(Ok(b)) = conn.feeds.as_mut().map(|f| f.try_recv())
                {
                    conn.on_batch(b);
                }
            }
            _ = &mut lag => {
                lag.set(lagged.notified());
                Box::pin(conn.recheck()).await
            }
            _ = std::future::ready(()), if pull_more => {}
            Some(o) = recv_made(&mut conn.shares.rx), if room => {
                conn.on_offer(o);
                while conn.ready.len() < crate::deliver::READY_HIGH
                    && let Some(Ok(o)) = conn.shares.rx.as_mut().map(|r| r.try_recv())
                {
                    conn.on_offer(o);
                }
            }
            (rx, changed) = &mut topics, if topics_open => {
                topics_open = changed;
                let list = changed.then(|| rx.borrow().clone());
                topics.set(topic_change(rx));
                if let Some(list) = list {
                    Box::pin(conn.on_topics(&list)).await;
                }
            }
        }
    };
    Box::pin(conn.finish(end, &mut tk_rx)).await;
    let out = std::mem::take(&mut conn.out);
    drop(conn);
    write_out(&mut wr, out).await;
}

/// Encoded output beyond this and the connection stops making more (and stops
/// reading) until the socket takes some: its client is slow.
const OUT_HIGH: usize = 256 * 1024;
/// An output buffer larger than this is dropped once written out.
const OUT_KEEP: usize = 4096;

/// The connection taking this one's session over; pending forever once the
/// slot's sender is gone without one (the oneshot is not polled again).
async fn taken_over(rx: &mut Option<oneshot::Receiver<Takeover>>) -> Option<Takeover> {
    let Some(r) = rx.as_mut() else {
        return std::future::pending().await;
    };
    let t = r.await.ok();
    *rx = None;
    t
}

/// The next message of a channel made on first use (the router's feeds, the
/// shared groups' offers); pending forever while it does not exist.
async fn recv_made<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// The next change of the topic list (`false`: the router is gone), with the
/// receiver back, so that one future waits across the turns of the loop.
async fn topic_change<T>(mut rx: watch::Receiver<T>) -> (watch::Receiver<T>, bool) {
    let changed = rx.changed().await.is_ok();
    (rx, changed)
}

enum Drained {
    /// Part of the output was written; the socket takes the rest later.
    Wrote,
    /// All of it was written and flushed.
    Flushed,
    Closed,
}

/// Writes what it can of `out` (one write) and, once it is all written, flushes
/// in the same turn (a no-op for TCP; a WebSocket stream frames on flush).
/// `unflushed` is set while written bytes wait for a flush, so one that pends
/// (and is dropped for another branch) is done on a later turn.
async fn drain<W: AsyncWrite + Unpin>(
    w: &mut W,
    out: &mut BytesMut,
    unflushed: &mut bool,
) -> std::io::Result<Drained> {
    if !out.is_empty() {
        if w.write_buf(out).await? == 0 {
            return Ok(Drained::Closed);
        }
        *unflushed = true;
        if !out.is_empty() {
            return Ok(Drained::Wrote);
        }
    }
    w.flush().await?;
    *unflushed = false;
    Ok(Drained::Flushed)
}

/// The last packets of a connection, then the end of the stream (bounded: a
/// client that does not read is not waited for long).
async fn write_out<W: AsyncWrite + Unpin>(w: &mut W, out: BytesMut) {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        if w.write_all(&out).await.is_ok() {
            let _ = w.flush().await;
        }
        let _ = w.shutdown().await;
    })
    .await;
}

/// A read this large means the client streams: the connection yields to the
/// other tasks of its worker after handling it. Tokio's cooperative budget
/// counts socket reads, not bytes, so without this one QoS 0 publisher could
/// handle 128 reads of 64 KiB (half a million small PUBLISHes) in one poll, and
/// a hundred of them flat out left the subscribers' tasks unpolled for seconds:
/// a shared group's members stopped taking messages and the group stopped
/// delivering (issue #6).
const FAIR_SHARE: usize = 16 * 1024;

/// A quiet connection's read buffer: small, so thousands of idle connections
/// hold a few hundred bytes each instead of kilobytes (it is part of the
/// memory per connection that issue #10 measures).
const READ_SMALL: usize = 256;
/// What a busy connection reads at most in one go.
const READ_LARGE: usize = 64 * 1024;

/// After a read of `n` bytes into `spare` free bytes has been handled: a read
/// that filled the buffer means more is coming, so it grows (up to
/// [`READ_LARGE`] free); a short
/// read that left nothing over means the client went quiet, so a large buffer
/// is swapped for a small one.
fn size_read_buffer(inbuf: &mut BytesMut, n: usize, spare: usize) {
    if n >= spare {
        inbuf.reserve((2 * n).clamp(8 * 1024, READ_LARGE));
    } else if inbuf.is_empty() && n < READ_SMALL && inbuf.capacity() > READ_SMALL {
        *inbuf = BytesMut::with_capacity(READ_SMALL);
    }
}

/// Reads the CONNECT. `Err(Some(bytes))`: refuse with this reply; `Err(None)`: just close.
async fn read_connect<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    max: usize,
) -> Result<(Version, Connect), Option<Bytes>> {
    loop {
        match codec::peek_connect_level(buf) {
            Ok(Some(level)) => {
                let version = match level {
                    4 => Version::V4,
                    5 => Version::V5,
                    3 => {
                        let mut out = BytesMut::new();
                        let ack =
                            ConnAck::new(ConnectReturnCode::UnsupportedProtocolVersion, false);
                        let _ = codec::write(Version::V4, &Packet::ConnAck(ack), &mut out);
                        return Err(Some(out.freeze()));
                    }
                    _ => {
                        let mut out = BytesMut::new();
                        let ack =
                            ConnAck::new(ConnectReturnCode::UnsupportedProtocolVersion, false);
                        let _ = codec::write(Version::V5, &Packet::ConnAck(ack), &mut out);
                        return Err(Some(out.freeze()));
                    }
                };
                match codec::read(version, buf, max) {
                    Ok(Some(Packet::Connect(c))) => return Ok((version, c)),
                    Ok(None) => {}
                    Ok(Some(_)) => return Err(None),
                    Err(e) => {
                        tracing::debug!(error = %e, "bad CONNECT");
                        let code = match (&e, version) {
                            (_, Version::V4) => return Err(None),
                            (CodecError::TooLarge { .. }, _) => ConnectReturnCode::PacketTooLarge,
                            (CodecError::Malformed(_), _) => ConnectReturnCode::MalformedPacket,
                            (CodecError::Protocol(_), _) => ConnectReturnCode::ProtocolError,
                        };
                        let mut out = BytesMut::new();
                        let _ = codec::write(
                            version,
                            &Packet::ConnAck(ConnAck::new(code, false)),
                            &mut out,
                        );
                        return Err(Some(out.freeze()));
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "connection refused before CONNECT");
                return Err(None);
            }
        }
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(_) => {
                if buf.len() > max + 8 {
                    return Err(None);
                }
            }
        }
    }
}

impl<B: MessagingApi + 'static> Conn<B> {
    pub fn send(&mut self, p: &Packet) {
        if let Err(e) = codec::write(self.version, p, &mut self.out) {
            tracing::warn!(error = %e, "encoding a packet failed");
        }
    }

    /// Tells the router what the subscriptions want of each followed core topic
    /// (after they changed), so the session is handed only what it may match.
    pub(crate) fn refresh_interest(&mut self) {
        let inbox = self.router_inbox();
        for t in &self.joined {
            let interest = Interest::of(&self.session.subs, t);
            self.shared.router.join(t, inbox.clone(), interest);
        }
    }

    /// The session's inbox for joining the router, its channel made now if
    /// it has none yet.
    pub(crate) fn router_inbox(&mut self) -> Inbox {
        if self.feeds.is_none() {
            let (tx, rx) = mpsc::channel(64);
            self.inbox.tx = tx;
            self.feeds = Some(rx);
        }
        self.inbox.clone()
    }

    pub fn reason(&self, s: String) -> Option<String> {
        (self.version == Version::V5 && self.problem_info).then_some(s)
    }

    /// Handles CONNECT: session take-over or resumption, CONNACK. The keep-alive
    /// deadline span, or `None` when the connection is refused.
    async fn accept(
        &mut self,
        c: Connect,
        takeover: oneshot::Sender<Takeover>,
    ) -> Option<Option<Duration>> {
        let s = self.shared.settings.clone();
        let v5 = self.version == Version::V5;
        let props = c.properties.as_ref();
        let refuse = |this: &mut Self, code: ConnectReturnCode, why: &str| {
            tracing::debug!(peer = %this.peer, why, "CONNECT refused");
            let mut ack = ConnAck::new(code, false);
            if v5 {
                let mut p = ConnAckProperties::new();
                p.reason_string = Some(why.to_owned());
                ack.properties = Some(p);
            }
            this.send(&Packet::ConnAck(ack));
            None
        };
        let mut client_id = c.client_id.clone();
        let mut assigned = None;
        if client_id.is_empty() {
            if !v5 && !c.clean_session {
                return refuse(
                    self,
                    ConnectReturnCode::ClientIdentifierNotValid,
                    "an empty client id needs a clean session",
                );
            }
            client_id = format!("rg-{:016x}", rand::random::<u64>());
            assigned = v5.then(|| client_id.clone());
        }
        if let Some(p) = props {
            if p.receive_maximum == Some(0) {
                return refuse(self, ConnectReturnCode::ProtocolError, "receive maximum 0");
            }
            if p.max_packet_size == Some(0) {
                return refuse(
                    self,
                    ConnectReturnCode::ProtocolError,
                    "maximum packet size 0",
                );
            }
            if p.authentication_method.is_some() {
                return refuse(
                    self,
                    ConnectReturnCode::BadAuthenticationMethod,
                    "enhanced authentication is not supported",
                );
            }
            self.client_receive_max = usize::from(p.receive_maximum.unwrap_or(u16::MAX))
                .min(usize::from(s.max_inflight.max(1)));
            self.client_max_packet = p.max_packet_size.map(|m| m as usize).unwrap_or(usize::MAX);
            self.client_alias_max = p.topic_alias_max.unwrap_or(0);
            self.problem_info = p.request_problem_info != Some(0);
        }
        let will = match &c.last_will {
            Some(w) => {
                if let Err(e) = topic::check_name(&w.topic) {
                    let code = if v5 {
                        ConnectReturnCode::TopicNameInvalid
                    } else {
                        ConnectReturnCode::ServerUnavailable
                    };
                    return refuse(self, code, &format!("will topic: {e}"));
                }
                Some(WillRecord::from_last_will(w))
            }
            None => None,
        };
        let asked_expiry = if v5 {
            props.and_then(|p| p.session_expiry_interval).unwrap_or(0)
        } else if c.clean_session {
            0
        } else {
            u32::MAX
        };
        let expiry = asked_expiry.min(s.max_session_expiry);
        let mut keep_alive = c.keep_alive;
        let mut server_keep_alive = None;
        if s.max_keep_alive > 0 && (keep_alive == 0 || keep_alive > s.max_keep_alive) {
            keep_alive = s.max_keep_alive;
            server_keep_alive = Some(keep_alive);
        }

        // Take the session: from the registry, or from the connection holding it.
        let previous = lock(&self.shared.sessions).insert(
            client_id.clone(),
            Slot::Online {
                conn_id: self.conn_id,
                takeover,
            },
        );
        let mut old = match previous {
            Some(Slot::Offline { session, .. }) => Some(session),
            Some(Slot::Online { takeover, .. }) => {
                let (tx, rx) = oneshot::channel();
                if takeover.send(tx).is_ok() {
                    tokio::time::timeout(Duration::from_secs(5), rx)
                        .await
                        .ok()
                        .and_then(Result::ok)
                } else {
                    None
                }
            }
            None => None,
        };
        if c.clean_session
            && let Some(mut o) = old.take()
        {
            // A clean start ends the old session; its pending will goes out now.
            if let Some(w) = o.will.take() {
                self.shared.fire_will(&o.client_id, w.to_publish()).await;
            }
            self.shared.files.remove_session(&o.client_id);
        }
        let session_present = old.is_some();
        let mut session = old.unwrap_or_else(|| Box::new(Session::new(&client_id, expiry)));
        session.expiry = expiry;
        session.will = will;
        self.session = session;
        self.shared.save_if_kept(&self.session);

        let mut ack = ConnAck::new(ConnectReturnCode::Success, session_present);
        if v5 {
            let mut p = ConnAckProperties::new();
            if expiry != asked_expiry {
                p.session_expiry_interval = Some(expiry);
            }
            p.receive_max = Some(s.receive_maximum);
            p.max_packet_size = Some(s.max_packet_size);
            p.assigned_client_identifier = assigned;
            p.topic_alias_max = Some(s.topic_alias_maximum);
            p.server_keep_alive = server_keep_alive;
            p.retain_available = Some(1);
            p.wildcard_subscription_available = Some(1);
            p.subscription_identifiers_available = Some(1);
            p.shared_subscription_available = Some(1);
            ack.properties = Some(p);
        }
        self.send(&Packet::ConnAck(ack));
        tracing::debug!(client = %client_id, peer = %self.peer, ?self.version, session_present, "connected");
        // Boxed: its futures (catch-up reads of the log) would otherwise make every
        // connection's task that much larger for all its life.
        Box::pin(self.resume()).await;
        Some((keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500)))
    }

    /// Reads every whole packet in `buf`; `Some(end)` ends the connection.
    async fn on_bytes(&mut self, buf: &mut BytesMut) -> Option<End> {
        let max = self.shared.settings.max_packet_size as usize;
        loop {
            let packet = match codec::read(self.version, buf, max) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => {
                    self.flush_publishes().await;
                    let code = match e {
                        CodecError::TooLarge { .. } => DisconnectReasonCode::PacketTooLarge,
                        CodecError::Malformed(_) => DisconnectReasonCode::MalformedPacket,
                        CodecError::Protocol(_) => DisconnectReasonCode::ProtocolError,
                    };
                    return Some(End::Server(code, e.to_string()));
                }
            };
            let end = match packet {
                Packet::Publish(p) => self.on_publish(p).await,
                other => match self.flush_publishes().await {
                    Some(end) => Some(end),
                    None => self.on_packet(other).await,
                },
            };
            if end.is_some() {
                self.flush_publishes().await;
                return end;
            }
        }
        self.flush_publishes().await
    }

    async fn on_packet(&mut self, packet: Packet) -> Option<End> {
        match packet {
            Packet::PubRel(r) => {
                let mut c = PubComp::new(r.pkid);
                if !self.session.qos2_in.remove(&r.pkid) {
                    c.reason = PubCompReason::PacketIdentifierNotFound;
                }
                self.send(&Packet::PubComp(c));
            }
            Packet::PubAck(a) => self.on_ack(a.pkid, false),
            Packet::PubRec(r) => {
                let failed = (r.reason as u8) >= 0x80;
                if failed {
                    self.on_ack(r.pkid, false);
                } else if let Some(f) = self.session.inflight.get_mut(&r.pkid) {
                    f.released = true;
                    self.send(&Packet::PubRel(PubRel::new(r.pkid)));
                } else {
                    let mut rel = PubRel::new(r.pkid);
                    rel.reason = mqttbytes::v5::PubRelReason::PacketIdentifierNotFound;
                    self.send(&Packet::PubRel(rel));
                }
            }
            Packet::PubComp(c) => self.on_ack(c.pkid, true),
            Packet::Subscribe(s) => return self.on_subscribe(s).await,
            Packet::Unsubscribe(u) if u.filters.is_empty() => {
                return Some(End::protocol("UNSUBSCRIBE without a topic filter"));
            }
            Packet::Unsubscribe(u) => self.on_unsubscribe(u).await,
            Packet::PingReq => self.send(&Packet::PingResp),
            Packet::Disconnect(d) => {
                if let Some(e) = d
                    .properties
                    .as_ref()
                    .and_then(|p| p.session_expiry_interval)
                {
                    if self.session.expiry == 0 && e != 0 {
                        return Some(End::protocol(
                            "session expiry set on DISCONNECT after connecting with 0",
                        ));
                    }
                    self.session.expiry = e.min(self.shared.settings.max_session_expiry);
                }
                return Some(End::Client {
                    will: d.reason_code == DisconnectReasonCode::DisconnectWithWillMessage,
                });
            }
            Packet::Connect(_) => return Some(End::protocol("a second CONNECT")),
            other => return Some(End::protocol(format!("a client does not send {other:?}"))),
        }
        None
    }

    /// Ends the connection: DISCONNECT where due, offsets committed, session
    /// handed over or put offline, will published or scheduled.
    async fn finish(&mut self, end: End, tk_rx: &mut Option<oneshot::Receiver<Takeover>>) {
        let client_id = self.session.client_id.clone();
        let disconnect = match &end {
            End::Server(code, why) => Some((*code, why.clone())),
            End::Takeover(_) => Some((
                DisconnectReasonCode::SessionTakenOver,
                "another connection took the session over".to_string(),
            )),
            End::Shutdown => Some((
                DisconnectReasonCode::ServerShuttingDown,
                "the server is shutting down".to_string(),
            )),
            _ => None,
        };
        if let Some((code, why)) = disconnect {
            tracing::debug!(client = %client_id, ?code, why, "server closes the connection");
            if self.version == Version::V5 {
                let mut d = Disconnect::new();
                d.reason_code = code;
                d.properties = self.reason(why).map(|s| DisconnectProperties {
                    session_expiry_interval: None,
                    reason_string: Some(s),
                    user_properties: Vec::new(),
                    server_reference: None,
                });
                self.send(&Packet::Disconnect(d));
            }
        }
        self.detach().await;
        let publish_will = !matches!(end, End::Client { will: false } | End::Shutdown);
        let session = std::mem::replace(&mut self.session, Box::new(Session::new("", 0)));
        match end {
            End::Takeover(t) => self.hand_over(session, t).await,
            End::Shutdown => {
                self.shared.save_if_kept(&session);
                lock(&self.shared.sessions).remove(&client_id);
            }
            _ => {
                let Err(session) = self
                    .shared
                    .session_offline(session, publish_will, self.conn_id)
                    .await
                else {
                    return;
                };
                if let Some(rx) = tk_rx.take()
                    && let Ok(Ok(t)) = tokio::time::timeout(Duration::from_secs(5), rx).await
                {
                    // Taken over while ending: the new connection waits for the session.
                    self.hand_over(session, t).await;
                }
            }
        }
    }

    async fn hand_over(&mut self, mut session: Box<Session>, t: Takeover) {
        if let Some(w) = session.will.take()
            && w.delay == 0
        {
            self.shared
                .fire_will(&session.client_id, w.to_publish())
                .await;
        }
        let _ = t.send(session);
    }
}
