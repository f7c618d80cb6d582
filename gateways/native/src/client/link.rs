//! Connections of the client: one multiplexed [`Link`] per address, owned by a task
//! that `select!`s over socket reads and outgoing frames. Responses are matched to
//! requests by opaque; requests the server pushes (consumer-ids-changed, transaction
//! checks) go to the [`Links`]' push channel. [`Links`] reconnects on demand, with
//! exponential back-off per address after a failed connect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::debug;

use crate::Error;
use crate::code::version;
use crate::codec::{FLAG_ONEWAY, FrameCodec, LanguageCode, RemotingCommand, SerializeType};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A request the server pushed, and the link it came on (to answer on).
pub(crate) struct Pushed {
    #[allow(dead_code)] // answered on by the transactional producer
    pub addr: String,
    pub command: RemotingCommand,
}

type Pending = Arc<Mutex<HashMap<i32, oneshot::Sender<RemotingCommand>>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One connection. Cheap to share; dropped when the last holder lets go.
pub(crate) struct Link {
    addr: String,
    out: mpsc::Sender<RemotingCommand>,
    /// Requests waiting for their response, by opaque. Std lock, held for one map op.
    pending: Pending,
    next_opaque: AtomicI32,
}

impl Link {
    async fn connect(addr: &str, pushes: mpsc::UnboundedSender<Pushed>) -> Result<Link, Error> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Connect {
                addr: addr.to_owned(),
                source: std::io::ErrorKind::TimedOut.into(),
            })?
            .map_err(|source| Error::Connect {
                addr: addr.to_owned(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let (out, rx) = mpsc::channel(1024);
        let pending: Pending = Arc::default();
        tokio::spawn(run(addr.to_owned(), stream, rx, pending.clone(), pushes));
        Ok(Link {
            addr: addr.to_owned(),
            out,
            pending,
            next_opaque: AtomicI32::new(1),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.out.is_closed()
    }

    fn stamp(&self, cmd: &mut RemotingCommand) -> i32 {
        let opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed) & i32::MAX;
        cmd.opaque = opaque;
        cmd.language = LanguageCode::Rust;
        cmd.version = version::CURRENT;
        // The compact binary header: cheaper to write and to parse than JSON, and the
        // peer answers in the same form.
        cmd.serialize_type = SerializeType::RocketMq;
        opaque
    }

    /// Sends `cmd` and waits up to `timeout` for its response (whatever its code).
    pub async fn request(
        &self,
        mut cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, Error> {
        let opaque = self.stamp(&mut cmd);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(opaque, tx);
        let closed = || Error::ConnectionClosed {
            addr: self.addr.clone(),
        };
        if self.out.send(cmd).await.is_err() {
            lock(&self.pending).remove(&opaque);
            return Err(closed());
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(_)) => Err(closed()),
            Err(_) => {
                lock(&self.pending).remove(&opaque);
                Err(Error::Timeout {
                    addr: self.addr.clone(),
                    timeout,
                })
            }
        }
    }

    /// Sends `cmd` flagged one-way; nothing comes back.
    pub async fn oneway(&self, mut cmd: RemotingCommand) -> Result<(), Error> {
        self.stamp(&mut cmd);
        cmd.flag |= FLAG_ONEWAY;
        self.out
            .send(cmd)
            .await
            .map_err(|_| Error::ConnectionClosed {
                addr: self.addr.clone(),
            })
    }
}

/// The socket task of one link. Ends when the peer closes, the stream turns bad, or
/// every [`Link`] handle is gone; pending requests then fail as closed.
async fn run(
    addr: String,
    mut stream: TcpStream,
    mut rx: mpsc::Receiver<RemotingCommand>,
    pending: Pending,
    pushes: mpsc::UnboundedSender<Pushed>,
) {
    let codec = FrameCodec::default();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut out = BytesMut::new();
    let why = 'conn: loop {
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        tokio::select! {
            read = stream.read_buf(&mut buf) => {
                match read {
                    Ok(0) => break "peer closed".to_string(),
                    Err(e) => break format!("read failed: {e}"),
                    Ok(_) => {}
                }
                loop {
                    match codec.decode(&mut buf) {
                        Ok(Some(cmd)) if cmd.is_response() => {
                            if let Some(tx) = lock(&pending).remove(&cmd.opaque) {
                                let _ = tx.send(cmd);
                            }
                        }
                        Ok(Some(cmd)) => {
                            let _ = pushes.send(Pushed { addr: addr.clone(), command: cmd });
                        }
                        Ok(None) => break,
                        Err(e) => break 'conn format!("bad frame: {e}"),
                    }
                }
            }
            next = rx.recv() => {
                let Some(cmd) = next else { break "client dropped the link".to_string() };
                let mut batch = vec![cmd];
                while batch.len() < 256 {
                    match rx.try_recv() {
                        Ok(c) => batch.push(c),
                        Err(_) => break,
                    }
                }
                for cmd in &batch {
                    if let Err(e) = codec.encode(cmd, &mut out) {
                        // Fail just this request.
                        debug!(%addr, error = %e, "request does not encode");
                        lock(&pending).remove(&cmd.opaque);
                    }
                }
                if let Err(e) = stream.write_all(&out).await {
                    break format!("write failed: {e}");
                }
                out.clear();
            }
        }
    };
    debug!(%addr, %why, "link closed");
    // Dropping the senders fails every waiting request as closed.
    lock(&pending).clear();
}

struct Backoff {
    until: Instant,
    next: Duration,
}

/// Every link of one client, by address, reconnecting on demand.
pub(crate) struct Links {
    /// Std lock, held for map lookups only; connecting happens outside it.
    links: Mutex<HashMap<String, Arc<Link>>>,
    backoff: Mutex<HashMap<String, Backoff>>,
    pushes: mpsc::UnboundedSender<Pushed>,
}

impl Links {
    pub fn new(pushes: mpsc::UnboundedSender<Pushed>) -> Links {
        Links {
            links: Mutex::default(),
            backoff: Mutex::default(),
            pushes,
        }
    }

    /// The open link to `addr`, connecting if there is none.
    pub async fn get(&self, addr: &str) -> Result<Arc<Link>, Error> {
        if let Some(l) = lock(&self.links).get(addr).filter(|l| !l.is_closed()) {
            return Ok(l.clone());
        }
        if let Some(b) = lock(&self.backoff).get(addr) {
            let now = Instant::now();
            if b.until > now {
                return Err(Error::Unreachable {
                    addr: addr.to_owned(),
                    retry_in: b.until - now,
                });
            }
        }
        match Link::connect(addr, self.pushes.clone()).await {
            Ok(link) => {
                lock(&self.backoff).remove(addr);
                let link = Arc::new(link);
                let mut links = lock(&self.links);
                // Another task may have connected meanwhile; keep one.
                let kept = links
                    .entry(addr.to_owned())
                    .and_modify(|l| {
                        if l.is_closed() {
                            *l = link.clone();
                        }
                    })
                    .or_insert_with(|| link.clone());
                Ok(kept.clone())
            }
            Err(e) => {
                let mut b = lock(&self.backoff);
                let entry = b.entry(addr.to_owned()).or_insert(Backoff {
                    until: Instant::now(),
                    next: FIRST_BACKOFF,
                });
                entry.until = Instant::now() + entry.next;
                entry.next = (entry.next * 2).min(MAX_BACKOFF);
                Err(e)
            }
        }
    }

    /// Sends a request to `addr` and returns its response, whatever its code.
    pub async fn request(
        &self,
        addr: &str,
        cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, Error> {
        self.get(addr).await?.request(cmd, timeout).await
    }

    /// [`Links::request`], with any code but `SUCCESS` turned into [`Error::Refused`].
    pub async fn call(
        &self,
        addr: &str,
        cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, Error> {
        let resp = self.request(addr, cmd, timeout).await?;
        if resp.code != crate::code::response::SUCCESS {
            return Err(refused(addr, &resp));
        }
        Ok(resp)
    }

    pub async fn oneway(&self, addr: &str, cmd: RemotingCommand) -> Result<(), Error> {
        self.get(addr).await?.oneway(cmd).await
    }

    /// Drops every link (their tasks end once in-flight users let go).
    pub fn close_all(&self) {
        lock(&self.links).clear();
    }
}

/// The error for a failure response.
pub(crate) fn refused(addr: &str, resp: &RemotingCommand) -> Error {
    Error::Refused {
        addr: addr.to_owned(),
        code: resp.code,
        remark: resp.remark.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_connect_backs_off() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let links = Links::new(tx);
        // Bind then drop: a port nobody listens on.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.to_string())
            .unwrap();
        assert!(matches!(links.get(&addr).await, Err(Error::Connect { .. })));
        // Right after, the address is in back-off: no new connect attempt.
        assert!(matches!(
            links.get(&addr).await,
            Err(Error::Unreachable { .. })
        ));
    }
}
