//! The master's side of the replication stream: one task per slave connection.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{info, warn};

use super::codec::{Frame, RefuseCode, VERSION, VERSION_1};
use super::{BoxIo, read_frame};

/// Where the master's slave connections come from: a `TcpListener`, or the binary's
/// TLS listener.
pub trait Accept: Send + 'static {
    /// The next connection, ready to speak the stream (TLS handshake done).
    fn accept(
        &mut self,
    ) -> impl std::future::Future<Output = std::io::Result<(BoxIo, SocketAddr)>> + Send;
}

impl Accept for TcpListener {
    async fn accept(&mut self) -> std::io::Result<(BoxIo, SocketAddr)> {
        let (sock, peer) = TcpListener::accept(self).await?;
        let _ = sock.set_nodelay(true);
        Ok((Box::new(sock), peer))
    }
}

/// The master's log and its group state, as the stream needs them.
pub trait Source: Send + Sync + 'static {
    /// `(oldest retained offset, end the master vouches for)`.
    fn bounds(&self) -> (u64, u64);
    fn segment_size(&self) -> u64;
    /// Up to `max` bytes of whole records from `from`: `(bytes, next offset)`. The
    /// bytes are written to the socket as they are (a view of the log, not a copy).
    fn ship(&self, from: u64, max: usize) -> Result<Option<(bytes::Bytes, u64)>, String>;
    /// Resolves once there may be more than `from` to ship (early is fine: the
    /// stream asks [`Source::ship`] again). The broker's store wakes it when its
    /// shippable end moves; this default, for a source that cannot, polls every 1 ms.
    fn wait_shippable(&self, from: u64) -> impl std::future::Future<Output = ()> + Send {
        let _ = from;
        tokio::time::sleep(Duration::from_millis(1))
    }
    /// The high watermark, sent along with every run.
    fn confirmed(&self) -> u64;
    fn joined(&self, conn: u64, broker_id: u64, peer: SocketAddr, offset: u64);
    /// A slave's report; an error (an offset beyond the end) drops the slave.
    fn acked(&self, conn: u64, offset: u64) -> Result<(), String>;
    fn left(&self, conn: u64);
    /// Consumer positions a slave's doors committed (an OFFSETS frame); an error is
    /// logged, the slave stays.
    fn slave_offsets(&self, _conn: u64, _body: &[u8]) -> Result<(), String> {
        Ok(())
    }
    /// The master epoch this node took writes at (controller mode); 0 outside
    /// controller mode. A slave that knows a higher one is refused (`StaleMaster`), and
    /// a change while slaves are connected closes their streams (they reconnect and
    /// learn the new list).
    fn epoch(&self) -> u64 {
        0
    }
    /// This master's epoch file, `(epoch, start)` oldest first (empty outside
    /// controller mode).
    fn epochs(&self) -> Vec<(u64, u64)> {
        vec![]
    }
    /// Where a slave's log (`slave`'s epochs, ending at `slave_end`) stops agreeing
    /// with this master's (`master`, ending at `master_end`): core's
    /// `store::epoch::divergence`. Asked only when both lists are non-empty. The
    /// default (`slave_end`: no divergence known) suits a source without epochs.
    fn divergence(
        &self,
        _slave: &[(u64, u64)],
        slave_end: u64,
        _master: &[(u64, u64)],
        _master_end: u64,
    ) -> u64 {
        slave_end
    }
}

/// How the master serves its slaves.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `broker.name`: a slave of another group is refused.
    pub group: String,
    pub secret: Vec<u8>,
    /// A heartbeat goes out when nothing else did for this long; a slave silent for
    /// four of them is dropped.
    pub heartbeat: Duration,
    /// Bytes per run (at least one record is always sent whole).
    pub batch: usize,
    /// How long a stream that ran out of log waits, once woken by new bytes, before
    /// it ships them: zero under sync replication (a send waits for its copy), about
    /// 1 ms under async, where shipping every append as it comes would make runs of
    /// one message and cost the master more per message than its own append.
    pub gather: Duration,
}

/// Stops the server: [`Handle::stop`] closes the listener and every slave connection.
pub struct Handle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Handle {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Serves slaves on `listener` until stopped.
pub fn serve<S: Source, A: Accept>(mut listener: A, source: Arc<S>, settings: Settings) -> Handle {
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let next_id = AtomicU64::new(1);
        let mut conns = JoinSet::new();
        let settings = Arc::new(settings);
        loop {
            tokio::select! {
                _ = stopped.changed() => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((sock, peer)) => {
                        let conn = next_id.fetch_add(1, Ordering::Relaxed);
                        let source = source.clone();
                        let settings = settings.clone();
                        let stopped = stopped.clone();
                        conns.spawn(async move {
                            match run(sock, peer, conn, &*source, &settings, stopped).await {
                                Ok(()) => info!(%peer, conn, "replication: slave disconnected"),
                                Err(e) => warn!(%peer, conn, error = %e, "replication: slave connection ended"),
                            }
                            source.left(conn);
                        });
                    }
                    Err(e) => {
                        warn!(error = %e, "replication: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        conns.shutdown().await;
    });
    Handle { stop, task }
}

async fn refuse(
    sock: &mut BoxIo,
    peer: SocketAddr,
    code: RefuseCode,
    reason: String,
) -> std::io::Result<()> {
    warn!(%peer, ?code, %reason, "replication: refused a slave");
    let mut out = Vec::new();
    Frame::Refuse {
        code,
        reason: reason.clone(),
    }
    .encode(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(2), sock.write_all(&out)).await;
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!("refused ({code:?}): {reason}"),
    ))
}

/// What the master answers an admitted HELLO with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Admitted {
    /// WELCOME's `start`.
    start: u64,
    /// The master's end (WELCOME's `master_end`), read once with the divergence.
    end: u64,
    /// The slave's log parts from this master's at `start`, below its end: it must cut
    /// its log there first, so it is not streamed to (nor counted) on this connection.
    diverged: bool,
    epoch: u64,
    epochs: Vec<(u64, u64)>,
}

/// Whether an epoch list from the wire keeps the epoch file's order rules.
fn well_ordered(epochs: &[(u64, u64)]) -> bool {
    epochs.iter().all(|(e, _)| *e > 0)
        && epochs
            .windows(2)
            .all(|w| w[1].0 > w[0].0 && w[1].1 >= w[0].1)
}

/// Checks a slave's HELLO; where its stream starts, or why it is refused.
fn admit(
    hello: &super::Hello,
    source: &impl Source,
    settings: &Settings,
) -> Result<Admitted, (RefuseCode, String)> {
    if hello.version != VERSION && hello.version != VERSION_1 {
        return Err((
            RefuseCode::Version,
            format!(
                "protocol version {} (this master speaks {VERSION_1} and {VERSION})",
                hello.version
            ),
        ));
    }
    if !super::same_secret(&hello.secret, &settings.secret) {
        return Err((RefuseCode::Secret, "wrong shared secret (ha.secret)".into()));
    }
    if hello.group != settings.group {
        return Err((
            RefuseCode::Group,
            format!(
                "group `{}` is not this master's `{}`",
                hello.group, settings.group
            ),
        ));
    }
    if hello.broker_id == 0 {
        return Err((RefuseCode::BrokerId, "broker id 0 is the master's".into()));
    }
    if hello.segment_size != source.segment_size() {
        return Err((
            RefuseCode::SegmentSize,
            format!(
                "segment size {} differs from the master's {}",
                hello.segment_size,
                source.segment_size()
            ),
        ));
    }
    if !well_ordered(&hello.epochs) {
        return Err((
            RefuseCode::Protocol,
            format!(
                "the slave's epoch list {:?} is out of order (epochs must rise, starts must not fall)",
                hello.epochs
            ),
        ));
    }
    let (epoch, epochs) = (source.epoch(), source.epochs());
    let (min, end) = source.bounds();
    let admitted = |start, diverged| Admitted {
        start,
        end,
        diverged,
        epoch,
        epochs: epochs.clone(),
    };
    // The newest epoch the slave knows of: from the controller, or its own file (a
    // node that was master at an epoch is never to follow an older master).
    let known = hello.epoch.max(hello.epochs.last().map_or(0, |(e, _)| *e));
    if known > epoch {
        return Err((
            RefuseCode::StaleMaster,
            format!(
                "this master is at epoch {epoch}, the slave knows epoch {known}: a newer master exists"
            ),
        ));
    }
    if !hello.epochs.is_empty() && !epochs.is_empty() {
        let point = source
            .divergence(&hello.epochs, hello.log_end, &epochs, end)
            .min(hello.log_end);
        if point < hello.log_end {
            return Ok(admitted(point, true));
        }
    }
    if hello.log_end > end {
        return Err((
            RefuseCode::BeyondEnd,
            format!(
                "the slave's log ends at {} beyond the master's end {end}",
                hello.log_end
            ),
        ));
    }
    // A slave behind the oldest retained byte starts over there (its log must be
    // empty; it checks that itself). A brand-new slave copies the whole retained log.
    Ok(admitted(hello.log_end.max(min), false))
}

async fn run(
    mut sock: BoxIo,
    peer: SocketAddr,
    conn: u64,
    source: &impl Source,
    settings: &Settings,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut buf = BytesMut::with_capacity(4096);
    let silence = settings.heartbeat * 4;
    let hello = match tokio::time::timeout(
        silence.max(Duration::from_secs(5)),
        read_frame(&mut sock, &mut buf),
    )
    .await
    {
        Err(_) => {
            return refuse(
                &mut sock,
                peer,
                RefuseCode::Protocol,
                "no HELLO in time".into(),
            )
            .await;
        }
        Ok(Err(e)) => {
            return refuse(
                &mut sock,
                peer,
                RefuseCode::Protocol,
                format!("not a replication stream: {e}"),
            )
            .await;
        }
        Ok(Ok(None)) => return Ok(()),
        Ok(Ok(Some(Frame::Hello(h)))) => h,
        Ok(Ok(Some(other))) => {
            return refuse(
                &mut sock,
                peer,
                RefuseCode::Protocol,
                format!("expected HELLO, got {:?}", other.name()),
            )
            .await;
        }
    };
    let admitted = match admit(&hello, source, settings) {
        Ok(a) => a,
        Err((code, reason)) => return refuse(&mut sock, peer, code, reason).await,
    };
    let (epoch, end, mut next) = (admitted.epoch, admitted.end, admitted.start);
    let mut out = Vec::new();
    Frame::Welcome {
        version: hello.version,
        start: next,
        master_end: end,
        epoch,
        epochs: admitted.epochs,
    }
    .encode(&mut out);
    sock.write_all(&out).await?;
    if admitted.diverged {
        // The slave cuts its log back to `next` (durably) and comes back; until then
        // it holds bytes this master never wrote there, so it is not a copy of anything.
        warn!(%peer, conn, broker_id = hello.broker_id, slave_end = hello.log_end, truncate_to = next, master_end = end, "replication: the slave's log parts from this master's; it must truncate before following");
        if next < source.bounds().0 {
            warn!(%peer, conn, truncate_to = next, "replication: the slave's common point is below this master's oldest retained byte: after its cut it cannot follow (empty its data directory)");
        }
        let _ = sock.shutdown().await;
        return Ok(());
    }
    source.joined(conn, hello.broker_id, peer, next);
    let shipped_bytes = super::meters::shipped(hello.broker_id);
    info!(%peer, conn, broker_id = hello.broker_id, from = next, master_end = end, "replication: slave joined");

    let (mut rd, mut wr) = tokio::io::split(sock);
    let mut last_heard = Instant::now();
    let mut last_sent = Instant::now();
    // Out of log (the last run took all there was): wait to be woken before shipping
    // again.
    let mut caught_up = false;
    loop {
        if caught_up {
            // Wait for more log, a heartbeat's turn, or a reason to stop, reading acks
            // meanwhile. Async replication gathers for `gather` once woken.
            let mut gather_until: Option<Instant> = None;
            loop {
                let now = Instant::now();
                if gather_until.is_some_and(|g| now >= g) || now >= last_sent + settings.heartbeat {
                    break;
                }
                let tick = gather_until
                    .unwrap_or(now + CHECK_EVERY)
                    .min(last_sent + settings.heartbeat);
                tokio::select! {
                    r = read_frame(&mut rd, &mut buf) => {
                        last_heard = Instant::now();
                        if !heard(r?, peer, conn, source, &mut wr).await? {
                            return Ok(());
                        }
                    }
                    _ = source.wait_shippable(next), if gather_until.is_none() => {
                        if settings.gather.is_zero() {
                            break;
                        }
                        gather_until = Some(Instant::now() + settings.gather);
                    }
                    _ = tokio::time::sleep_until(tick) => {}
                    _ = stopped.changed() => return Ok(()),
                }
                if !check(source, epoch, peer, conn, last_heard, silence)? || *stopped.borrow() {
                    return Ok(());
                }
            }
        }
        // Never ship under an epoch this stream did not start with.
        if !check(source, epoch, peer, conn, last_heard, silence)? || *stopped.borrow() {
            return Ok(());
        }
        // Ship what there is: the run straight from the log behind a DATA head, in
        // one vectored write. A run that took all there was leaves the stream caught
        // up (it waits, and gathers, before the next); one the batch cut short does not.
        let end = source.bounds().1;
        let shipped = source
            .ship(next, settings.batch)
            .map_err(std::io::Error::other)?;
        match shipped {
            Some((bytes, after)) => {
                let head = Frame::data_header(next, source.confirmed(), bytes.len());
                write_all_vectored(&mut wr, &head, &bytes).await?;
                shipped_bytes.add(bytes.len() as u64);
                caught_up = after >= end;
                next = after;
                last_sent = Instant::now();
            }
            None => {
                caught_up = true;
                if last_sent.elapsed() >= settings.heartbeat {
                    let head = Frame::data_header(next, source.confirmed(), 0);
                    wr.write_all(&head).await?;
                    last_sent = Instant::now();
                }
            }
        }
        // Acks that already arrived, without waiting.
        loop {
            tokio::select! {
                biased;
                r = read_frame(&mut rd, &mut buf) => {
                    last_heard = Instant::now();
                    if !heard(r?, peer, conn, source, &mut wr).await? {
                        return Ok(());
                    }
                }
                _ = std::future::ready(()) => break,
            }
        }
    }
}

/// How often a waiting stream looks at its epoch and its slave's silence.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// Writes `head` then `body` with as few vectored writes as the socket takes (the
/// run is not copied into a frame buffer).
async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    head: &[u8],
    body: &[u8],
) -> std::io::Result<()> {
    let (mut head, mut body) = (head, body);
    while !head.is_empty() {
        let n = w
            .write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        body = &body[n - from_head..];
    }
    w.write_all(body).await
}

/// Acts on a frame from the slave; `false` at the end of the stream.
async fn heard<W: tokio::io::AsyncWrite + Unpin>(
    frame: Option<Frame>,
    peer: SocketAddr,
    conn: u64,
    source: &impl Source,
    wr: &mut W,
) -> std::io::Result<bool> {
    match frame {
        None => Ok(false),
        Some(Frame::Ack { log_end }) => {
            if let Err(e) = source.acked(conn, log_end) {
                let mut w = Vec::new();
                warn!(%peer, conn, error = %e, "replication: refused an acknowledgement; dropping the slave");
                Frame::Refuse {
                    code: RefuseCode::BeyondEnd,
                    reason: e.clone(),
                }
                .encode(&mut w);
                let _ = wr.write_all(&w).await;
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
            }
            Ok(true)
        }
        Some(Frame::Offsets { body }) => {
            if let Err(e) = source.slave_offsets(conn, &body) {
                warn!(%peer, conn, error = %e, "replication: a slave's consumer positions were not taken");
            }
            Ok(true)
        }
        Some(other) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected {} from a slave", other.name()),
        )),
    }
}

/// Whether the stream goes on: not when this master's epoch moved (`false`: the
/// slave reconnects and learns the new list), nor when the slave went silent (an
/// error).
fn check(
    source: &impl Source,
    epoch: u64,
    peer: SocketAddr,
    conn: u64,
    last_heard: Instant,
    silence: Duration,
) -> std::io::Result<bool> {
    if source.epoch() != epoch {
        info!(%peer, conn, from = epoch, to = source.epoch(), "replication: this master's epoch changed; closing the stream (the slave reconnects)");
        return Ok(false);
    }
    if last_heard.elapsed() > silence {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no acknowledgement for {silence:?}"),
        ));
    }
    Ok(true)
}
