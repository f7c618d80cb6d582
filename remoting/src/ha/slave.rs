//! The slave's side of the replication stream: connect, say where the log ends,
//! append every run, acknowledge; reconnect with back-off when the master goes away.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{info, warn};

use super::codec::{Frame, Hello, VERSION};
use super::{BoxIo, read_frame};

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
    Frame::Hello(Hello {
        version: VERSION,
        broker_id: settings.broker_id,
        log_end: target.log_end(),
        segment_size: target.segment_size(),
        group: settings.group.clone(),
        secret: settings.secret.clone(),
    })
    .encode(&mut out);
    sock.write_all(&out).await?;
    let mut buf = BytesMut::with_capacity(1 << 20);
    let welcome = tokio::time::timeout(timeout, read_frame(&mut sock, &mut buf))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer to HELLO"))??;
    let start = match welcome {
        Some(Frame::Welcome {
            start, master_end, ..
        }) => {
            status.master_end.store(master_end, Ordering::Release);
            start
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
    if start != target.log_end() {
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
    let mut acked = target.log_end();
    let mut last_ack = Instant::now();
    loop {
        let frame = tokio::time::timeout(timeout, read_frame(&mut sock, &mut buf))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("master silent for {timeout:?}"),
                )
            })??;
        match frame {
            None => return Ok(()),
            Some(Frame::Data {
                offset,
                confirmed,
                bytes,
            }) => {
                status.master_confirmed.store(confirmed, Ordering::Release);
                if !bytes.is_empty() {
                    let end = target.append(offset, bytes).await.map_err(bad)?;
                    status.master_end.fetch_max(end, Ordering::AcqRel);
                    acked = end;
                } else {
                    status.master_end.fetch_max(offset, Ordering::AcqRel);
                }
                // Acknowledge every run (a sync send waits for it) and every heartbeat.
                // Runs that arrived together share one ack.
                if buf.is_empty() || last_ack.elapsed() >= settings.heartbeat {
                    out.clear();
                    if last_ack.elapsed() >= settings.heartbeat
                        && let Some(body) = target.local_offsets()
                    {
                        Frame::Offsets { body: body.into() }.encode(&mut out);
                    }
                    Frame::Ack { log_end: acked }.encode(&mut out);
                    sock.write_all(&out).await?;
                    last_ack = Instant::now();
                }
            }
            Some(Frame::Refuse { code, reason }) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("the master dropped this slave ({code:?}): {reason}"),
                ));
            }
            Some(other) => return Err(bad(format!("unexpected {} from the master", other.name()))),
        }
    }
}

fn bad(e: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.into())
}
