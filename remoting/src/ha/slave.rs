//! The slave's side of the replication stream: connect, say where the log ends,
//! append every run, acknowledge; reconnect with back-off when the master goes away.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::codec::{Frame, Hello, VERSION, VERSION_1};
use super::{BoxIo, read_frame};

/// Unacknowledged bytes after which a slave acks even while more runs are waiting.
const ACK_BYTES: u64 = 4 << 20;
/// How long a slave holds bytes unacknowledged while more runs are waiting.
const ACK_DELAY: Duration = Duration::from_millis(1);

/// Wraps a connected `TcpStream` for the stream (the binary's TLS client: a
/// handshake that verifies the master's certificate).
#[derive(Clone)]
pub struct Connector(
    #[allow(clippy::type_complexity)]
    pub  Arc<
        dyn Fn(TcpStream) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<BoxIo>> + Send>>
            + Send
            + Sync,
    >,
);

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connector")
    }
}

/// The slave's log, as the stream needs it.
pub trait Target: Send + Sync + 'static {
    /// Where the log ends (the next offset it needs).
    fn log_end(&self) -> u64;
    fn segment_size(&self) -> u64;
    /// Moves an empty log's start (a brand-new slave of a master whose oldest
    /// retained segment starts at `start`).
    fn restart_at(&self, start: u64) -> Result<(), String>;
    /// Appends a run at `offset`; the offset this slave may acknowledge.
    fn append(
        &self,
        offset: u64,
        bytes: bytes::Bytes,
    ) -> impl Future<Output = Result<u64, String>> + Send;
    /// Consumer positions committed through this slave's doors that the master may
    /// not have (sent as an OFFSETS frame when following starts and with the
    /// heartbeat acks while there are any); `None`: nothing to send.
    fn local_offsets(&self) -> Option<Vec<u8>> {
        None
    }
    /// The newest master epoch this slave learned from the controller (0: not in
    /// controller mode). It may rise while following: a master below it is refused at
    /// WELCOME, and a stream from one is dropped at its next frame.
    fn known_epoch(&self) -> u64 {
        0
    }
    /// This slave's epoch file, `(epoch, start)` oldest first. While it is empty and
    /// [`Target::known_epoch`] is 0 the slave speaks protocol version 1, as before.
    fn epochs(&self) -> Vec<(u64, u64)> {
        vec![]
    }
    /// The master says this log parts from its own at `to` (below the log's end): cut
    /// the log back to `to` durably — and the epoch file after it — before anything
    /// is appended. The follow loop returns after the call and reconnects after its
    /// back-off; `Ok` means the cut was taken in hand (the broker's supervisor stops
    /// the node, truncates, restarts it as a slave). The default refuses: a slave
    /// without epochs never gets such an answer.
    fn truncate(&self, to: u64) -> Result<(), String> {
        Err(format!("cannot truncate the log to {to}"))
    }
    /// The master's epoch file (version 2 WELCOME), before anything from it is
    /// appended: the slave records the entries for what it holds, and the rest as the
    /// bytes they describe arrive (each before its bytes). An error drops the stream.
    fn adopt_epochs(&self, _master: &[(u64, u64)]) -> Result<(), String> {
        Ok(())
    }
}

/// Who this slave is and where its master is.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The master's replication address, `host:port`.
    pub master: String,
    pub group: String,
    pub broker_id: u64,
    pub secret: Vec<u8>,
    pub heartbeat: Duration,
    /// TLS to the master (`None`: plain TCP).
    pub tls: Option<Connector>,
}

/// What the slave knows about its master, for operators.
#[derive(Debug, Default)]
pub struct Status {
    pub connected: AtomicBool,
    /// The master's end at the last run or heartbeat.
    pub master_end: AtomicU64,
    /// The master's confirmed offset at the last run or heartbeat.
    pub master_confirmed: AtomicU64,
}

/// The running follow loop.
pub struct Handle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    pub status: Arc<Status>,
}

impl Handle {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Follows the master until stopped.
pub fn spawn<T: Target>(target: Arc<T>, settings: Settings) -> Handle {
    let (stop, mut stopped) = watch::channel(false);
    let status = Arc::new(Status::default());
    let st = status.clone();
    let task = tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            let started = Instant::now();
            let r = tokio::select! {
                r = follow(&*target, &settings, &st) => r,
                _ = stopped.changed() => break,
            };
            st.connected.store(false, Ordering::Release);
            match r {
                Ok(()) => {
                    info!(master = %settings.master, "replication: the master closed the stream")
                }
                Err(e) => {
                    warn!(master = %settings.master, error = %e, "replication: not following the master; retrying")
                }
            }
            if started.elapsed() > Duration::from_secs(5) {
                backoff = Duration::from_millis(100);
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped.changed() => break,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    });
    Handle { stop, task, status }
}

async fn follow(target: &impl Target, settings: &Settings, status: &Status) -> std::io::Result<()> {
    let timeout = settings.heartbeat * 4;
    let sock = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&settings.master))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = sock.set_nodelay(true);
    let mut sock: BoxIo = match &settings.tls {
        Some(tls) => tokio::time::timeout(Duration::from_secs(5), (tls.0)(sock))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
            })??,
        None => Box::new(sock),
    };
    let mut out = Vec::new();
    let (known, epochs) = (target.known_epoch(), target.epochs());
    // Without epochs in play, version 1: the bytes an older master admits.
    let version = if known == 0 && epochs.is_empty() {
        VERSION_1
    } else {
        VERSION
    };
    let log_end = target.log_end();
    Frame::Hello(Hello {
        version,
        broker_id: settings.broker_id,
        log_end,
        segment_size: target.segment_size(),
        group: settings.group.clone(),
        secret: settings.secret.clone(),
        epoch: known,
        epochs,
    })
    .encode(&mut out);
    sock.write_all(&out).await?;
    let mut buf = BytesMut::with_capacity(1 << 20);
    let welcome = tokio::time::timeout(timeout, read_frame(&mut sock, &mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer to HELLO"))??;
    let (start, master_epoch, master_epochs) = match welcome {
        Some(Frame::Welcome {
            version: answered,
            start,
            master_end,
            epoch,
            epochs,
        }) => {
            if answered != version {
                return Err(bad(format!(
                    "the master answered protocol version {version} with version {answered}"
                )));
            }
            status.master_end.store(master_end, Ordering::Release);
            (start, epoch, epochs)
        }
        Some(Frame::Refuse { code, reason }) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("the master refused this slave ({code:?}): {reason}"),
            ));
        }
        Some(other) => return Err(bad(format!("expected WELCOME, got {}", other.name()))),
        None => return Ok(()),
    };
    // A master older than the newest this slave knows of must gather no copies.
    let known = target.known_epoch();
    if master_epoch < known {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the master is at epoch {master_epoch}, this slave knows epoch {known}: a newer master exists"
            ),
        ));
    }
    if start < log_end {
        // Only a version-2 master answers so: the logs part at `start`.
        warn!(master = %settings.master, log_end, truncate_to = start, master_epoch, "replication: this log parts from the master's; truncating before following");
        target
            .truncate(start)
            .map_err(|e| bad(format!("cannot truncate the log to {start}: {e}")))?;
        return Ok(());
    }
    if version == VERSION {
        target
            .adopt_epochs(&master_epochs)
            .map_err(|e| bad(format!("cannot record the master's epochs: {e}")))?;
    }
    if start != log_end {
        target
            .restart_at(start)
            .map_err(|e| bad(format!("cannot start at {start}: {e}")))?;
        info!(
            start,
            "replication: an empty log starts at the master's oldest retained segment"
        );
    }
    status.connected.store(true, Ordering::Release);
    info!(master = %settings.master, from = start, "replication: following the master");
    if let Some(body) = target.local_offsets() {
        out.clear();
        Frame::Offsets { body: body.into() }.encode(&mut out);
        sock.write_all(&out).await?;
    }
    // Frames are read by a task of their own and handed over as they complete, so
    // the socket keeps draining (and the master sending) while a run is checked,
    // written and dispatched here.
    let (rd, mut wr) = tokio::io::split(sock);
    let (tx, mut rx) = tokio::sync::mpsc::channel(READ_AHEAD);
    // In a `JoinSet`: the reader is aborted when the follow loop ends or is dropped.
    let mut reader = tokio::task::JoinSet::new();
    reader.spawn(read_ahead(rd, buf, tx));
    // What this slave holds, what it last told the master, and since when it holds
    // more than that.
    let mut held = target.log_end();
    let mut acked = held;
    let mut unacked_since = Instant::now();
    let mut last_offsets = Instant::now();
    loop {
        let frames = tokio::time::timeout(timeout, rx.recv())
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("master silent for {timeout:?}"),
                )
            })?
            .ok_or_else(|| std::io::Error::other("the stream's reader stopped"))??;
        let Some(frames) = frames else {
            return Ok(());
        };
        let count = frames.len();
        for (i, frame) in frames.into_iter().enumerate() {
            if target.known_epoch() > master_epoch {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "a master newer than epoch {master_epoch} was elected; leaving this one"
                    ),
                ));
            }
            match frame {
                Frame::Data {
                    offset,
                    confirmed,
                    bytes,
                } => {
                    status.master_confirmed.store(confirmed, Ordering::Release);
                    let heartbeat = bytes.is_empty();
                    if !heartbeat {
                        let n = bytes.len() as u64;
                        super::meters::received().add(n);
                        let end = target.append(offset, bytes).await.map_err(bad)?;
                        super::meters::applied().add(n);
                        status.master_end.fetch_max(end, Ordering::AcqRel);
                        if held == acked {
                            unacked_since = Instant::now();
                        }
                        held = end;
                    } else {
                        status.master_end.fetch_max(offset, Ordering::AcqRel);
                    }
                    // A sync send waits for this ack, so it goes out as soon as no
                    // whole frame is waiting (a partly read one does not hold it
                    // back); runs read back to back share one, at least every
                    // ACK_BYTES and ACK_DELAY. Every heartbeat is answered (the master
                    // drops a silent slave).
                    let due = heartbeat
                        || (i + 1 == count && rx.is_empty())
                        || held - acked >= ACK_BYTES
                        || unacked_since.elapsed() >= ACK_DELAY;
                    if due {
                        out.clear();
                        if last_offsets.elapsed() >= settings.heartbeat
                            && let Some(body) = target.local_offsets()
                        {
                            Frame::Offsets { body: body.into() }.encode(&mut out);
                            last_offsets = Instant::now();
                        }
                        Frame::Ack { log_end: held }.encode(&mut out);
                        wr.write_all(&out).await?;
                        acked = held;
                    }
                }
                Frame::Refuse { code, reason } => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("the master dropped this slave ({code:?}): {reason}"),
                    ));
                }
                other => return Err(bad(format!("unexpected {} from the master", other.name()))),
            }
        }
    }
}

/// Batches of frames the reader hands over; at most this many wait (each one
/// read's worth of whole frames, a few MiB at most).
const READ_AHEAD: usize = 4;

/// What the reader hands over: the whole frames one read completed, `None` at a
/// clean end of the stream, or the error that ended it.
type Batch = std::io::Result<Option<Vec<Frame>>>;

/// Reads frames from the master and hands them over in order until the stream ends,
/// fails, or the follow loop goes away.
async fn read_ahead<R: tokio::io::AsyncRead + Unpin>(
    mut rd: R,
    mut buf: BytesMut,
    tx: tokio::sync::mpsc::Sender<Batch>,
) {
    loop {
        let batch = read_frames(&mut rd, &mut buf).await;
        let more = matches!(batch, Ok(Some(_)));
        if tx.send(batch).await.is_err() || !more {
            return;
        }
    }
}

/// The next frame, waiting for it, and every further whole frame already read.
async fn read_frames<R: tokio::io::AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut) -> Batch {
    let Some(first) = read_frame(rd, buf).await? else {
        return Ok(None);
    };
    let mut frames = vec![first];
    while let Some(frame) = Frame::decode_from(buf).map_err(|e| bad(e.to_string()))? {
        frames.push(frame);
    }
    Ok(Some(frames))
}

fn bad(e: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.into())
}
