//! The server loop: [`serve`] accepts connections and runs one task per connection that
//! owns its socket and `select!`s over socket reads, its outbound queue (answers of
//! requests still running, requests the server pushes to the peer, a close order) and
//! shutdown. What a request means is the [`Handler`]'s business.
//!
//! - **Order and batching**: every whole request of one read is handed to the handler in
//!   order; the answers that are ready at once leave together in one write, ahead of
//!   anything queued later.
//! - **Requests that wait** (an [`Answer::Later`], e.g. a long-polling pull) run as tasks
//!   of their connection, so closing it cancels them, and answer through the outbound
//!   queue. A future that is ready on its first poll is answered inline: no task, no
//!   queue hop.
//! - **Back-pressure**: the outbound queue is bounded ([`Limits::outbound_capacity`]), so a
//!   peer that does not read holds up its own handlers; a write that does not finish
//!   within [`Limits::write_timeout`] drops the peer, and no reading happens meanwhile.
//! - **Bad frames**: a length prefix over [`Limits::max_frame_len`] or a frame that does
//!   not decode closes that connection (after the answers before it), with a log line.
//!   Nothing a peer sends can panic the server or touch another connection.
//! - **One-way requests** run, but their answer is dropped; responses from the peer (to
//!   what we pushed) are ignored, nothing waits for them.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::code::response;
use crate::codec::{DEFAULT_MAX_FRAME_LEN, FrameCodec, RemotingCommand};

/// Read into at least this much free buffer space, growing it by `READ_CHUNK`.
const READ_MIN: usize = 16 * 1024;
const READ_CHUNK: usize = 64 * 1024;
/// Queued output gathered into one write at most (beyond a read's own answers).
const WRITE_GATHER: usize = 1 << 20;

/// Numbers the connections of one [`serve`] from 1, in accept order.
pub type ConnId = u64;

/// Who sent a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub id: ConnId,
    pub addr: SocketAddr,
}

/// How a connection behaves under load and abuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Upper bound on a frame's length prefix; a longer one closes the connection.
    pub max_frame_len: usize,
    /// A peer that does not take its output within this long is dropped.
    pub write_timeout: Duration,
    /// Answers and pushes waiting to be written per connection; a full queue holds up
    /// whoever adds to it.
    pub outbound_capacity: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            write_timeout: Duration::from_secs(10),
            outbound_capacity: 1024,
        }
    }
}

/// A handler's answer to one request.
pub enum Answer {
    /// Known at once.
    Now(RemotingCommand),
    /// Known when the future completes; it runs as a task of the connection if it is not
    /// ready on its first poll.
    Later(Pin<Box<dyn Future<Output = RemotingCommand> + Send>>),
}

/// What a server does with its connections and their requests. One value serves every
/// connection (behind an `Arc`); per-connection state lives in its [`Handler::Session`].
pub trait Handler: Send + Sync + 'static {
    /// What the handler keeps per connection.
    type Session: Send + 'static;

    /// A peer connected. `outbound` pushes requests to it or closes it from elsewhere.
    fn open(&self, peer: Peer, outbound: Outbound) -> Self::Session;

    /// A peer connected over TLS with a verified client certificate naming
    /// `tls_identity` (or without one: `None`). By default the same as [`Handler::open`];
    /// a handler that cares about the identity keeps it in its session.
    fn open_with_identity(
        &self,
        peer: Peer,
        outbound: Outbound,
        tls_identity: Option<String>,
    ) -> Self::Session {
        let _ = tls_identity;
        self.open(peer, outbound)
    }

    /// Answers one request. Called in the order requests arrive; the answer to a
    /// one-way request is dropped.
    fn handle(&self, session: &mut Self::Session, request: RemotingCommand) -> Answer;

    /// The connection closed (`why` says how); its requests still running are
    /// cancelled already.
    fn close(&self, session: Self::Session, why: &str) -> impl Future<Output = ()> + Send;
}

enum Out {
    Command(RemotingCommand),
    Close(&'static str),
}

/// Reaches one connection from outside its task: queue a command for it, or close it.
/// Cheap to clone; does not keep the connection open.
#[derive(Debug, Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Out>,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Out::Command(c) => write!(f, "Command({})", c.code),
            Out::Close(why) => write!(f, "Close({why})"),
        }
    }
}

impl Outbound {
    /// Queues `cmd` to be written, waiting while the queue is full. False: the
    /// connection is gone.
    pub async fn send(&self, cmd: RemotingCommand) -> bool {
        self.tx.send(Out::Command(cmd)).await.is_ok()
    }

    /// Queues `cmd` unless the queue is full or the connection gone (then false).
    pub fn try_send(&self, cmd: RemotingCommand) -> bool {
        self.tx.try_send(Out::Command(cmd)).is_ok()
    }

    /// Asks the connection to close after what is queued before this.
    pub fn close(&self, why: &'static str) {
        let _ = self.tx.try_send(Out::Close(why));
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// A connection as [`serve`] gets it from an [`Accept`].
#[derive(Debug)]
pub struct Accepted<Io> {
    pub io: Io,
    pub addr: SocketAddr,
    /// The verified TLS client certificate's name, when the connection is TLS with one.
    pub tls_identity: Option<String>,
}

/// Where [`serve`] gets connections: a [`TcpListener`], or a source that does a TLS
/// handshake first (the native door's TLS modes).
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection; an error is retried after a pause (out of descriptors).
    fn accept(&mut self) -> impl Future<Output = std::io::Result<Accepted<Self::Io>>> + Send;
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self) -> std::io::Result<Accepted<Self::Io>> {
        let (io, addr) = TcpListener::accept(self).await?;
        // Requests and answers are small and each awaited: never hold one back.
        let _ = io.set_nodelay(true);
        Ok(Accepted {
            io,
            addr,
            tls_identity: None,
        })
    }
}

/// Serves `listener` until `shutdown` completes, then closes every connection (running
/// requests are cancelled, [`Handler::close`] runs) and returns when all are done.
pub async fn serve<H: Handler, A: Accept>(
    mut listener: A,
    handler: Arc<H>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let codec = FrameCodec::new(limits.max_frame_len);
    let (closing, _) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut next_id: ConnId = 1;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(Accepted { io: stream, addr, tls_identity }) => {
                    let peer = Peer { id: next_id, addr };
                    next_id += 1;
                    let conn = Connection { peer, tls_identity, stream, codec, limits, handler: handler.clone() };
                    conns.spawn(conn.serve(closing.subscribe()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next() => {}
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    closing.send_replace(true);
    while conns.join_next().await.is_some() {}
}

struct Connection<H, Io> {
    peer: Peer,
    tls_identity: Option<String>,
    stream: Io,
    codec: FrameCodec,
    limits: Limits,
    handler: Arc<H>,
}

enum Next {
    Read(std::io::Result<usize>),
    Out(Out),
    Close(&'static str),
    Reaped,
}

impl<H: Handler, Io: AsyncRead + AsyncWrite + Unpin + Send> Connection<H, Io> {
    async fn serve(mut self, mut closing: watch::Receiver<bool>) {
        debug!(peer = %self.peer.addr, conn = self.peer.id, "connected");
        let (tx, mut rx) = mpsc::channel(self.limits.outbound_capacity.max(1));
        let mut session = self.handler.open_with_identity(
            self.peer,
            Outbound { tx: tx.clone() },
            self.tls_identity.take(),
        );
        let mut requests = JoinSet::new();
        let mut buf = BytesMut::with_capacity(8192);
        let mut out = BytesMut::new();
        let why = 'conn: loop {
            let dispatched =
                self.dispatch_buffered(&mut session, &mut buf, &mut out, &tx, &mut requests);
            // Whatever is ready (answers of this read, finished tasks) goes out in one
            // write; a bad frame still gets the answers before it.
            if !out.is_empty() || dispatched.is_err() {
                let mut close = None;
                while out.len() < WRITE_GATHER {
                    match rx.try_recv() {
                        Ok(Out::Command(cmd)) => self.encode(&cmd, &mut out),
                        Ok(Out::Close(why)) => {
                            close = Some(why);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if let Err(why) = self.flush(&mut out).await {
                    break why;
                }
                if let Some(why) = close {
                    break why.to_string();
                }
            }
            if let Err(why) = dispatched {
                break why;
            }
            if buf.capacity() - buf.len() < READ_MIN {
                buf.reserve(READ_CHUNK);
            }
            let next = tokio::select! {
                r = self.stream.read_buf(&mut buf) => Next::Read(r),
                Some(out) = rx.recv() => Next::Out(out),
                Some(_) = requests.join_next() => Next::Reaped,
                _ = closing.wait_for(|c| *c) => Next::Close("server stopping"),
            };
            match next {
                Next::Read(Ok(0)) => break "peer closed".to_string(),
                Next::Read(Ok(_)) | Next::Reaped => {}
                Next::Read(Err(e)) => break format!("read failed: {e}"),
                // Written (with whatever else is ready) at the top of the loop.
                Next::Out(Out::Command(cmd)) => self.encode(&cmd, &mut out),
                Next::Out(Out::Close(why)) => {
                    // What was queued before the order still leaves.
                    let _ = self.flush(&mut out).await;
                    break 'conn why.to_string();
                }
                Next::Close(why) => break why.to_string(),
            }
        };
        requests.abort_all();
        // Queued output is dropped with the queue; nobody can still be told about it.
        drop(rx);
        self.handler.close(session, &why).await;
        debug!(peer = %self.peer.addr, conn = self.peer.id, %why, "disconnected");
    }

    /// Hands every whole request in `buf` to the handler. An answer known at once is
    /// encoded into `out`; one that has to wait goes on as a task of this connection and
    /// answers through `tx`. Err: the stream is unusable.
    fn dispatch_buffered(
        &self,
        session: &mut H::Session,
        buf: &mut BytesMut,
        out: &mut BytesMut,
        tx: &mpsc::Sender<Out>,
        requests: &mut JoinSet<()>,
    ) -> Result<(), String> {
        loop {
            let req = match self.codec.decode(buf) {
                Ok(Some(req)) => req,
                Ok(None) => return Ok(()),
                Err(e) => {
                    warn!(peer = %self.peer.addr, error = %e, "bad frame; closing connection");
                    return Err(format!("bad frame: {e}"));
                }
            };
            if req.is_response() {
                // Answers to what we pushed (all one-way today): nothing waits for them.
                continue;
            }
            let oneway = req.is_oneway();
            let mut later = match self.handler.handle(session, req) {
                Answer::Now(resp) => {
                    if !oneway {
                        self.encode(&resp, out);
                    }
                    continue;
                }
                Answer::Later(fut) => fut,
            };
            // One poll with a no-op waker: if it is not ready, the task polls it again
            // with its own waker (every future accepts a new waker on each poll).
            let mut cx = Context::from_waker(Waker::noop());
            match later.as_mut().poll(&mut cx) {
                Poll::Ready(resp) => {
                    if !oneway {
                        self.encode(&resp, out);
                    }
                }
                Poll::Pending => {
                    let tx = tx.clone();
                    requests.spawn(async move {
                        let resp = later.await;
                        if !oneway {
                            let _ = tx.send(Out::Command(resp)).await;
                        }
                    });
                }
            }
        }
    }

    fn encode(&self, cmd: &RemotingCommand, out: &mut BytesMut) {
        if let Err(e) = self.codec.encode(cmd, out) {
            warn!(peer = %self.peer.addr, error = %e, "response does not fit a frame");
            let fallback = RemotingCommand::response_to(cmd, response::SYSTEM_ERROR)
                .with_remark(format!("response too large: {e}"));
            if let Err(e) = self.codec.encode(&fallback, out) {
                warn!(peer = %self.peer.addr, error = %e, "error response does not encode either");
            }
        }
    }

    async fn flush(&mut self, out: &mut BytesMut) -> Result<(), String> {
        if out.is_empty() {
            return Ok(());
        }
        let written =
            tokio::time::timeout(self.limits.write_timeout, self.stream.write_all(out)).await;
        out.clear();
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("write failed: {e}")),
            Err(_) => Err("write timed out".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::{mpsc, oneshot};

    use super::*;
    use crate::codec::{self, FLAG_ONEWAY};

    const WAIT: Duration = Duration::from_secs(5);
    /// Answered only once the test releases it.
    const SLOW: i32 = 1;

    /// Answers every request `SUCCESS` with its code as remark; `SLOW` waits for the
    /// test. Tells the test about every connection it opens and closes.
    struct Echo {
        release: Mutex<Option<oneshot::Receiver<()>>>,
        opened: mpsc::UnboundedSender<Outbound>,
        closed: mpsc::UnboundedSender<String>,
    }

    impl Handler for Echo {
        type Session = ();

        fn open(&self, _peer: Peer, outbound: Outbound) {
            let _ = self.opened.send(outbound);
        }

        fn handle(&self, _: &mut (), req: RemotingCommand) -> Answer {
            let resp = RemotingCommand::response_to(&req, response::SUCCESS)
                .with_remark(req.code.to_string());
            if req.code != SLOW {
                return Answer::Now(resp);
            }
            let release = self.release.lock().unwrap().take();
            Answer::Later(Box::pin(async move {
                if let Some(r) = release {
                    let _ = r.await;
                }
                resp
            }))
        }

        async fn close(&self, _: (), why: &str) {
            let _ = self.closed.send(why.to_string());
        }
    }

    struct Running {
        addr: SocketAddr,
        release: Option<oneshot::Sender<()>>,
        opened: mpsc::UnboundedReceiver<Outbound>,
        closed: mpsc::UnboundedReceiver<String>,
        stop: Option<oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    }

    async fn start(limits: Limits) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (release_tx, release_rx) = oneshot::channel();
        let (opened_tx, opened) = mpsc::unbounded_channel();
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let echo = Arc::new(Echo {
            release: Mutex::new(Some(release_rx)),
            opened: opened_tx,
            closed: closed_tx,
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, echo, limits, async {
            let _ = stopped.await;
        }));
        Running {
            addr,
            release: Some(release_tx),
            opened,
            closed,
            stop: Some(stop),
            task,
        }
    }

    fn frame(cmd: &RemotingCommand) -> BytesMut {
        let mut out = BytesMut::new();
        codec::encode(cmd, &mut out).unwrap();
        out
    }

    /// The next frame, or None once the server closed the connection.
    async fn next(sock: &mut TcpStream, buf: &mut BytesMut) -> Option<RemotingCommand> {
        tokio::time::timeout(WAIT, async {
            loop {
                if let Some(cmd) = codec::decode(buf).unwrap() {
                    return Some(cmd);
                }
                match sock.read_buf(buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("the server neither answered nor closed")
    }

    async fn remark_of(sock: &mut TcpStream, buf: &mut BytesMut) -> String {
        next(sock, buf).await.unwrap().remark.unwrap_or_default()
    }

    #[tokio::test]
    async fn a_bad_frame_closes_only_that_connection_after_the_answers_before_it() {
        let mut s = start(Limits::default()).await;
        let mut bad = TcpStream::connect(s.addr).await.unwrap();
        let mut good = TcpStream::connect(s.addr).await.unwrap();

        // A good request, then a frame whose header claims serialization type 9.
        let mut out = frame(&RemotingCommand::request(10, 1));
        out.extend_from_slice(&[0, 0, 0, 4, 9, 0, 0, 0]);
        bad.write_all(&out).await.unwrap();
        let mut buf = BytesMut::new();
        assert_eq!(remark_of(&mut bad, &mut buf).await, "10");
        assert!(
            next(&mut bad, &mut buf).await.is_none(),
            "closed after the bad frame"
        );
        let why = s.closed.recv().await.unwrap();
        assert!(why.starts_with("bad frame"), "{why}");

        good.write_all(&frame(&RemotingCommand::request(11, 2)))
            .await
            .unwrap();
        assert_eq!(remark_of(&mut good, &mut BytesMut::new()).await, "11");
    }

    #[tokio::test]
    async fn an_oversized_length_prefix_closes_the_connection_before_any_body() {
        let limits = Limits {
            max_frame_len: 1024,
            ..Limits::default()
        };
        let mut s = start(limits).await;
        let mut sock = TcpStream::connect(s.addr).await.unwrap();
        // 1 GiB announced; not one byte of it follows.
        sock.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
        assert!(next(&mut sock, &mut BytesMut::new()).await.is_none());
        assert!(s.closed.recv().await.unwrap().contains("exceeds the limit"));

        // The server still serves others.
        let mut other = TcpStream::connect(s.addr).await.unwrap();
        other
            .write_all(&frame(&RemotingCommand::request(12, 1)))
            .await
            .unwrap();
        assert_eq!(remark_of(&mut other, &mut BytesMut::new()).await, "12");
    }

    #[tokio::test]
    async fn a_waiting_request_does_not_hold_up_later_ones_and_oneways_get_no_answer() {
        let mut s = start(Limits::default()).await;
        let mut sock = TcpStream::connect(s.addr).await.unwrap();
        let mut oneway = RemotingCommand::request(13, 2);
        oneway.flag = FLAG_ONEWAY;
        let mut out = frame(&RemotingCommand::request(SLOW, 1));
        out.extend_from_slice(&frame(&oneway));
        out.extend_from_slice(&frame(&RemotingCommand::request(14, 3)));
        sock.write_all(&out).await.unwrap();

        let mut buf = BytesMut::new();
        let fast = next(&mut sock, &mut buf).await.unwrap();
        assert_eq!((fast.opaque, fast.remark.as_deref()), (3, Some("14")));
        s.release.take().unwrap().send(()).unwrap();
        let slow = next(&mut sock, &mut buf).await.unwrap();
        assert_eq!((slow.opaque, slow.remark.as_deref()), (1, Some("1")));
        // Nothing else: the one-way request was run but not answered.
        sock.write_all(&frame(&RemotingCommand::request(15, 4)))
            .await
            .unwrap();
        assert_eq!(next(&mut sock, &mut buf).await.unwrap().opaque, 4);
    }

    #[tokio::test]
    async fn outbound_pushes_to_and_closes_its_connection() {
        let mut s = start(Limits::default()).await;
        let mut sock = TcpStream::connect(s.addr).await.unwrap();
        let outbound = s.opened.recv().await.unwrap();
        assert!(outbound.try_send(RemotingCommand::request(40, 5)));
        let mut buf = BytesMut::new();
        let pushed = next(&mut sock, &mut buf).await.unwrap();
        assert_eq!((pushed.code, pushed.is_response()), (40, false));
        // The client's answer to a push is ignored.
        sock.write_all(&frame(&RemotingCommand::response_to(&pushed, 0)))
            .await
            .unwrap();

        outbound.close("broker expired");
        assert!(next(&mut sock, &mut buf).await.is_none());
        assert_eq!(s.closed.recv().await.unwrap(), "broker expired");
        tokio::time::timeout(WAIT, async {
            while !outbound.is_closed() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn shutdown_closes_every_connection_and_cancels_waiting_requests() {
        let mut s = start(Limits::default()).await;
        let mut sock = TcpStream::connect(s.addr).await.unwrap();
        sock.write_all(&frame(&RemotingCommand::request(SLOW, 1)))
            .await
            .unwrap();
        // The connection is open (and its slow request waiting) before the stop.
        s.opened.recv().await.unwrap();
        s.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(WAIT, &mut s.task)
            .await
            .unwrap()
            .unwrap();
        assert!(next(&mut sock, &mut BytesMut::new()).await.is_none());
        assert_eq!(s.closed.recv().await.unwrap(), "server stopping");
        assert!(
            TcpStream::connect(s.addr).await.is_err(),
            "no longer listening"
        );
    }
}
