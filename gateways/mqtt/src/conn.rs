//! One client connection: one task that owns the socket and the session while
//! connected, and composes the parts of a connection, each owning its state:
//! the output buffer (`output.rs`), incoming publishes (`inbound.rs`), what it
//! follows of the log (`follow.rs`), the messages waiting for the window
//! (`ready.rs`), the outgoing window (`window.rs`) and the shared-subscription
//! memberships (`members.rs`). The task's loop routes events between them: a
//! read goes to the packet handlers (`conn/packets.rs`), a router feed to what
//! it follows, a group's offer to its memberships, and each turn the window
//! takes what is ready. CONNECT and the end of a connection are
//! `conn/connect.rs`; enhanced authentication (AUTH, SCRAM-SHA-256) before
//! CONNACK and re-authentication after it are `conn/enhanced.rs`.
//!
//! Outgoing packets are encoded into one buffer and written by the same task's
//! loop whenever the socket takes them (many packets per socket write); there
//! is no writer task, whose task and channel cost each idle connection more
//! than a kilobyte (issue #10).

mod connect;
mod enhanced;
mod packets;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use mqttbytes::v5::DisconnectReasonCode;
use rocketgate_core::broker::MessagingApi;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::end::End;
use crate::follow::{Following, READY_HIGH, READY_LOW};
use crate::inbound::Inbound;
use crate::members::Members;
use crate::output::Output;
use crate::ready::ReadyQueue;
use crate::session::Session;
use crate::shared::{Shared, Takeover};
use crate::window::Window;

use self::connect::read_connect;

/// A connection's parts. Every byte here is in every connection's task (see
/// `server.rs`): rarely used state is boxed or made on first use.
pub(crate) struct Conn<B> {
    shared: Arc<Shared<B>>,
    peer: SocketAddr,
    session: Box<Session>,
    out: Output,
    /// Messages for the window: from the router's feeds and catch-up reads,
    /// shared groups' offers and retained messages.
    ready: ReadyQueue,
    following: Following,
    window: Window,
    inbound: Inbound,
    members: Members,
}

/// Where a connection's TLS client identity comes from: `()` for a plain socket
/// (zero bytes in every plain connection's task, see `server.rs`'s size guard), an
/// `Option<String>` for a TLS one.
pub(crate) trait TlsIdentity: Send + 'static {
    fn take(self) -> Option<String>;
}

impl TlsIdentity for () {
    fn take(self) -> Option<String> {
        None
    }
}

impl TlsIdentity for Option<String> {
    fn take(self) -> Option<String> {
        self
    }
}

/// What a connection starts from: one boxed argument, because an `async fn`
/// keeps room for its arguments for its whole life beside the locals they are
/// moved into (~80 bytes per idle connection, see `server.rs`).
pub(crate) struct Opened<B, IO, I, G> {
    pub shared: Arc<Shared<B>>,
    pub io: IO,
    pub peer: SocketAddr,
    pub tls_identity: I,
    /// Held until the connection ends (the server's count of running connections).
    pub guard: G,
}

/// Runs one connection. `tls_identity` is the name in the client's verified TLS
/// certificate (mTLS; `None` without one): it is logged at CONNECT and handed to
/// [`Conn::accept`], where the authentication layer takes it from there.
pub(crate) async fn run<B, IO, I, G>(opened: Box<Opened<B, IO, I, G>>)
where
    B: MessagingApi + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    I: TlsIdentity,
    G: Send,
{
    let Opened {
        shared,
        io,
        peer,
        tls_identity,
        guard: _guard,
    } = *{ opened }; // (the box is freed here, not when the connection ends)
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut inbuf = BytesMut::with_capacity(8 * 1024);
    // Boxed, and the CONNECT comes back boxed: what a step before the loop keeps
    // in this function's state stays in every connection's task for its whole
    // life (a local holding the CONNECT cost ~400 bytes each, see `server.rs`).
    let Some((version, connect)) =
        Box::pin(first_packet(&shared.settings, &mut rd, &mut wr, &mut inbuf)).await
    else {
        return;
    };
    // A moved service's refusal, enhanced authentication (boxed: rare, and every
    // byte of this function's state is in every connection's task, see `server.rs`;
    // the CONNECT goes in and comes back out so that it is not held here).
    let Ok((connect, enhanced)) = Box::pin(enhanced::before_accept(
        &shared.settings,
        &mut rd,
        &mut wr,
        &mut inbuf,
        connect,
        version,
        peer,
    ))
    .await
    else {
        return;
    };
    let (tk_tx, tk_rx) = oneshot::channel::<Takeover>();
    let mut tk_rx = Some(tk_rx);
    let mut conn = Conn {
        shared: shared.clone(),
        peer,
        session: Box::new(Session::new("", 0)),
        out: Output::new(version),
        ready: ReadyQueue::default(),
        following: Following::new(shared.next_id()),
        window: Window::new(shared.settings.max_inflight),
        inbound: Inbound::new(),
        members: Members::new(),
    };
    let lagged = conn.following.lagged();
    // Rare or one-off steps run boxed: their state would otherwise be part of
    // every connection's task for its whole life (memory per idle connection).
    let keep_alive =
        match Box::pin(conn.accept(connect, tk_tx, tls_identity.take(), enhanced)).await {
            Some(k) => k,
            None => {
                let out = conn.out.take();
                drop(conn);
                Box::pin(write_out(&mut wr, out)).await;
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
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_seen = Instant::now();
    // Written but not flushed (a WebSocket stream frames on flush).
    let mut unflushed = false;
    // The signals that rarely fire are waited on by futures that live across
    // the turns of the loop: made anew each turn, each registered and removed a
    // waiter under a lock (three per turn, several turns per message).
    // The stop is a `Notify` (64 bytes here) rather than the shutdown watch's
    // `changed()` (120): every byte of this state is in every idle connection.
    let stopping = shared.stopping(u64::from(peer.port()));
    tokio::pin!(stopping);
    if *shared.shutdown.borrow() {
        // Stopped before the waiter was made (it would never fire).
        early = early.or(Some(End::Shutdown));
    }
    let lag = lagged.notified();
    tokio::pin!(lag);
    // The topic list is watched only by sessions with a subscription whose first
    // level is a wildcard (only those follow topics made later): boxed and made
    // when the first such subscription comes, so the other connections carry 8
    // bytes for it instead of 160.
    let mut topics = None;
    let mut topics_open = true;
    let end = loop {
        if let Some(end) = early.take() {
            break end;
        }
        if topics.is_none() && topics_open && conn.session.follows_patterns() {
            let mut rx = shared.router.topic_list();
            // A topic the router listed between the subscription's own look at
            // the topics and now would be missed: look once more at once.
            rx.mark_changed();
            topics = Some(Box::pin(topic_change(rx)));
        }
        if conn.following.catching_up() && conn.ready.len() < READY_LOW {
            Box::pin(conn.fill_ready()).await;
        }
        // While the client does not take what was written, make no more
        // (the ready queue and the window hold the rest).
        let writable = conn.out.len() < OUT_HIGH;
        if writable {
            conn.window.pump(
                &mut conn.session,
                &mut conn.ready,
                &mut conn.out,
                &mut conn.members,
            );
        }
        conn.members.send_settled();
        let room = conn.ready.len() < READY_HIGH;
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
        let catching_up = conn.following.catching_up();
        let hold = catching_up && !conn.following.far_behind();
        let pull_more = catching_up && conn.ready.len() < READY_LOW;
        // Not taking feeds because the client's window is full, or its socket:
        // the router must not wait for this session (see router.rs).
        conn.following
            .client_slow()
            .store(!room || !writable, std::sync::atomic::Ordering::Release);
        tokio::select! {
            biased;
            () = &mut stopping => break End::Shutdown,
            Some(t) = taken_over(&mut tk_rx) => {
                // What the client sent on this connection before it opened the
                // new one (typically DISCONNECT, maybe with a session expiry of 0)
                // is handled first, as a broker reading both in order would.
                match Box::pin(read_pending(&mut conn, &mut rd, &mut inbuf)).await {
                    None => break End::Takeover(t),
                    Some(end) => {
                        // Ended by the client after all: `finish` hands the session
                        // to the new connection (or not, if the session ended).
                        let (tx, rx) = oneshot::channel();
                        let _ = tx.send(t);
                        tk_rx = Some(rx);
                        break end;
                    }
                }
            }
            // Early in the order, so a busy session still commits every second.
            // The keep-alive is checked here too (to the second: one timer per
            // connection instead of a new one each turn of the loop).
            _ = tick.tick() => {
                if conn
                    .session
                    .access
                    .as_ref()
                    .and_then(|a| a.expires_at)
                    .is_some_and(|t| std::time::SystemTime::now() >= t)
                {
                    break End::Server(
                        DisconnectReasonCode::NotAuthorized,
                        "the credentials (token) expired".into(),
                    );
                }
                if conn.reauth_overdue() {
                    break End::Server(
                        DisconnectReasonCode::NotAuthorized,
                        "the re-authentication did not finish in time".into(),
                    );
                }
                if keep_alive.is_some_and(|k| last_seen.elapsed() >= k) {
                    // While its output is full this connection does not read the
                    // client (below), so a slow reader's PINGREQs wait unread in the
                    // socket: what the client sent is read now, without waiting,
                    // before it is judged silent. (The hour-long soak's slow readers
                    // were dropped every few minutes for "keep-alive timeout".) One
                    // read per keep-alive period: a client that publishes and never
                    // reads still cannot pile up acknowledgements here.
                    let heard = if writable {
                        false
                    } else {
                        match tokio::time::timeout(Duration::ZERO, rd.read_buf(&mut inbuf)).await {
                            Ok(Ok(0) | Err(_)) => break End::Closed,
                            Ok(Ok(_)) => true,
                            Err(_) => false,
                        }
                    };
                    if !heard {
                        break End::Server(
                            DisconnectReasonCode::KeepAliveTimeout,
                            "no packet within 1.5 times the keep-alive".into(),
                        );
                    }
                    last_seen = Instant::now();
                    if let Some(end) = Box::pin(conn.on_bytes(&mut inbuf)).await {
                        break end;
                    }
                }
                conn.sys_tick();
                conn.session.refresh_inflight();
                Box::pin(conn.commit()).await
            }
            r = drain(&mut wr, conn.out.buf(), &mut unflushed), if !conn.out.is_empty() || unflushed => match r {
                Err(_) | Ok(Drained::Closed) => break End::Closed,
                Ok(Drained::Wrote) => {}
                Ok(Drained::Flushed) => conn.out.written(),
            },
            // Not reading while the client does not read: a client that only
            // publishes would otherwise pile up acknowledgements here.
            r = rd.read_buf(&mut inbuf), if writable => match r {
                Ok(0) | Err(_) => break End::Closed,
                Ok(n) => {
                    last_seen = Instant::now();
                    // Acknowledgements first, without the boxed `on_bytes` future
                    // (several KiB moved into a fresh box per read): a fan-out
                    // subscriber's reads are nothing else.
                    conn.take_acks(&mut inbuf);
                    if !inbuf.is_empty()
                        && let Some(end) = Box::pin(conn.on_bytes(&mut inbuf)).await
                    {
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
            Some(b) = conn.following.next_feed(), if room && !hold => {
                conn.following.on_batch(b, &mut conn.session, &mut conn.ready);
                while conn.ready.len() < READY_HIGH
                    && let Some(b) = conn.following.try_feed()
                {
                    conn.following.on_batch(b, &mut conn.session, &mut conn.ready);
                }
            }
            _ = &mut lag => {
                lag.set(lagged.notified());
                Box::pin(conn.recheck()).await
            }
            _ = std::future::ready(()), if pull_more => {}
            Some(o) = conn.members.next_offer(), if room => {
                let v5 = conn.out.v5();
                conn.members.on_offer(o, &conn.session, v5, &mut conn.ready);
                while conn.ready.len() < READY_HIGH
                    && let Some(o) = conn.members.try_offer()
                {
                    conn.members.on_offer(o, &conn.session, v5, &mut conn.ready);
                }
            }
            (rx, changed) = next_topics(&mut topics) => {
                if changed {
                    let list = rx.borrow().clone();
                    if let Some(t) = topics.as_mut() {
                        t.set(topic_change(rx));
                    }
                    Box::pin(conn.on_topics(&list)).await;
                } else {
                    // The router is gone.
                    topics = None;
                    topics_open = false;
                }
            }
        }
    };
    Box::pin(conn.finish(end, &mut tk_rx)).await;
    let out = conn.out.take();
    drop(conn);
    Box::pin(write_out(&mut wr, out)).await;
}

/// Handles what has already arrived on the socket, without waiting for more;
/// `Some(end)` when it ends the connection.
async fn read_pending<B, R>(conn: &mut Conn<B>, rd: &mut R, inbuf: &mut BytesMut) -> Option<End>
where
    B: MessagingApi + 'static,
    R: AsyncRead + Unpin,
{
    loop {
        // A zero timeout still polls the read once.
        match tokio::time::timeout(Duration::ZERO, rd.read_buf(inbuf)).await {
            Ok(Ok(n)) if n > 0 => {
                if let Some(end) = conn.on_bytes(inbuf).await {
                    return Some(end);
                }
            }
            _ => return None,
        }
    }
}

/// Encoded output beyond this and the connection stops making more (and stops
/// reading) until the socket takes some: its client is slow.
const OUT_HIGH: usize = 256 * 1024;

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

/// The next change of the topic list (`false`: the router is gone), with the
/// receiver back, so that one future waits across the turns of the loop.
async fn topic_change<T>(mut rx: watch::Receiver<T>) -> (watch::Receiver<T>, bool) {
    let changed = rx.changed().await.is_ok();
    (rx, changed)
}

/// The topic list's next change, when this connection watches it; pending
/// forever when it does not.
async fn next_topics<F, T>(watch: &mut Option<std::pin::Pin<Box<F>>>) -> T
where
    F: Future<Output = T>,
{
    match watch {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
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

/// Reads the CONNECT within the connect timeout. A packet that is not one is
/// answered as the protocol says (a CONNACK refusal where there is one) and the
/// connection closed: `None`.
async fn first_packet<R, W>(
    settings: &crate::Settings,
    rd: &mut R,
    wr: &mut W,
    inbuf: &mut BytesMut,
) -> Option<(crate::codec::Version, Box<mqttbytes::v5::Connect>)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let max = settings.max_packet_size as usize;
    match tokio::time::timeout(settings.connect_timeout, read_connect(rd, inbuf, max)).await {
        Ok(Ok((version, connect))) => Some((version, Box::new(connect))),
        Ok(Err(Some(reply))) => {
            let _ = wr.write_all(&reply).await;
            let _ = wr.shutdown().await;
            None
        }
        Ok(Err(None)) | Err(_) => None,
    }
}

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
