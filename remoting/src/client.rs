//! The framed client: one multiplexed [`Link`] per connection, owned by a task that
//! `select!`s over socket reads and outgoing frames. Every call gets a fresh opaque and
//! its response is matched back by it, so any number of calls may be in flight on one
//! link. Requests the server initiates (a broker asking a producer about a transaction,
//! telling a consumer its group changed) go to a [`Pushed`] channel when the caller
//! asked for one, and are dropped otherwise.
//!
//! A link does not reconnect: once it closes, every pending and later call fails with
//! [`Error::ConnectionClosed`], and the owner connects again (with whatever back-off
//! suits it).

use rocketgate_base::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use crate::Error;
use crate::codec::{CodecError, FLAG_ONEWAY, FrameCodec, RemotingCommand};

/// Frames queued for the socket task; a full queue holds up the callers.
const OUTBOUND_CAPACITY: usize = 1024;
/// Frames the socket task gathers into one write.
const WRITE_BATCH: usize = 256;
/// Read into at least this much free buffer space, growing it by `READ_CHUNK`.
const READ_MIN: usize = 16 * 1024;
const READ_CHUNK: usize = 64 * 1024;

/// A request the server sent on a link, and the address of that link (to answer on).
#[derive(Debug)]
pub struct Pushed {
    pub addr: String,
    pub command: RemotingCommand,
}

/// What a waiting call is told: its response, or why its request never left.
type Reply = Result<RemotingCommand, CodecError>;

/// Calls waiting for their response, by opaque. Std lock, held for one map operation.
type Pending = Arc<Mutex<HashMap<i32, oneshot::Sender<Reply>>>>;

/// One connection to a remoting peer. Share it behind an `Arc`; the socket closes when
/// the last holder drops it (or the peer closes first).
pub struct Link {
    addr: String,
    out: mpsc::Sender<RemotingCommand>,
    pending: Pending,
    next_opaque: AtomicI32,
}

impl Link {
    /// Connects to `addr` (`host:port`) within `timeout`. Requests the server initiates
    /// go to `pushes` when given, else they are dropped.
    pub async fn connect(
        addr: &str,
        timeout: Duration,
        pushes: Option<mpsc::UnboundedSender<Pushed>>,
    ) -> Result<Link, Error> {
        let connect_err = |source| Error::Connect {
            addr: addr.to_owned(),
            source,
        };
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| connect_err(std::io::ErrorKind::TimedOut.into()))?
            .map_err(connect_err)?;
        // Requests and responses are small and answered one by one: never wait for more.
        let _ = stream.set_nodelay(true);
        Ok(Link::over(addr, stream, pushes))
    }

    /// A link over a stream connected already (TLS: the caller did the handshake).
    /// `addr` names the peer in errors and [`Pushed`].
    pub fn over<Io>(addr: &str, stream: Io, pushes: Option<mpsc::UnboundedSender<Pushed>>) -> Link
    where
        Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (out, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let pending: Pending = Arc::default();
        tokio::spawn(run(addr.to_owned(), stream, rx, pending.clone(), pushes));
        Link {
            addr: addr.to_owned(),
            out,
            pending,
            next_opaque: AtomicI32::new(1),
        }
    }

    /// The address this link was opened to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// True once the connection is gone; every call on it fails.
    pub fn is_closed(&self) -> bool {
        self.out.is_closed()
    }

    /// Completes when the connection closes (the peer left, or a frame did not decode).
    pub async fn closed(&self) {
        self.out.closed().await
    }

    fn stamp(&self, cmd: &mut RemotingCommand) -> i32 {
        // Positive, as Java's `RemotingCommand.requestId` is.
        let opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed) & i32::MAX;
        cmd.opaque = opaque;
        opaque
    }

    fn closed_error(&self) -> Error {
        Error::ConnectionClosed {
            addr: self.addr.clone(),
        }
    }

    /// Sends `cmd` under a fresh opaque and waits up to `timeout` for its response,
    /// whatever its code.
    pub async fn call(
        &self,
        mut cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, Error> {
        let opaque = self.stamp(&mut cmd);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(opaque, tx);
        if self.out.send(cmd).await.is_err() {
            lock(&self.pending).remove(&opaque);
            return Err(self.closed_error());
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(resp))) => Ok(resp),
            Ok(Ok(Err(e))) => Err(Error::Codec(e)),
            // The socket task dropped every waiter: the connection is gone.
            Ok(Err(_)) => Err(self.closed_error()),
            Err(_) => {
                lock(&self.pending).remove(&opaque);
                Err(Error::Timeout {
                    addr: self.addr.clone(),
                    timeout,
                })
            }
        }
    }

    /// Sends `cmd` flagged one-way; nothing comes back, and an encoding failure is only
    /// logged.
    pub async fn oneway(&self, mut cmd: RemotingCommand) -> Result<(), Error> {
        self.stamp(&mut cmd);
        cmd.flag |= FLAG_ONEWAY;
        self.out.send(cmd).await.map_err(|_| self.closed_error())
    }
}

/// The socket task of one link. Ends when the peer closes, the stream turns bad, or
/// every [`Link`] handle is gone; pending calls then fail as closed.
async fn run<Io: AsyncRead + AsyncWrite + Unpin>(
    addr: String,
    mut stream: Io,
    mut rx: mpsc::Receiver<RemotingCommand>,
    pending: Pending,
    pushes: Option<mpsc::UnboundedSender<Pushed>>,
) {
    let codec = FrameCodec::default();
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::new();
    let why = 'conn: loop {
        if buf.capacity() - buf.len() < READ_MIN {
            buf.reserve(READ_CHUNK);
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
                            // No waiter: the call timed out, or it was a one-way send.
                            if let Some(tx) = lock(&pending).remove(&cmd.opaque) {
                                let _ = tx.send(Ok(cmd));
                            }
                        }
                        Ok(Some(cmd)) => match &pushes {
                            Some(p) => {
                                let _ = p.send(Pushed { addr: addr.clone(), command: cmd });
                            }
                            None => debug!(%addr, code = cmd.code, "server request dropped"),
                        },
                        Ok(None) => break,
                        Err(e) => break 'conn format!("bad frame: {e}"),
                    }
                }
            }
            next = rx.recv() => {
                let Some(cmd) = next else { break "every holder dropped the link".to_string() };
                let mut batch = vec![cmd];
                while batch.len() < WRITE_BATCH {
                    match rx.try_recv() {
                        Ok(c) => batch.push(c),
                        Err(_) => break,
                    }
                }
                for cmd in &batch {
                    if let Err(e) = codec.encode(cmd, &mut out) {
                        // Fail just this call; the stream is still in step.
                        debug!(%addr, error = %e, "request does not encode");
                        if let Some(tx) = lock(&pending).remove(&cmd.opaque) {
                            let _ = tx.send(Err(e));
                        }
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
    // Closing the queue first makes `is_closed` true before any waiter hears of it.
    rx.close();
    // Dropping the senders fails every waiting call as closed.
    lock(&pending).clear();
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::codec::{self, FLAG_RESPONSE};

    const WAIT: Duration = Duration::from_secs(5);

    /// A peer that accepts one connection and hands it to the test.
    async fn peer() -> (String, tokio::task::JoinHandle<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = tokio::spawn(async move { listener.accept().await.unwrap().0 });
        (addr, accepted)
    }

    /// Reads whole frames until `n` have arrived.
    async fn read_frames(
        sock: &mut TcpStream,
        buf: &mut BytesMut,
        n: usize,
    ) -> Vec<RemotingCommand> {
        let mut got = Vec::new();
        while got.len() < n {
            if let Some(cmd) = codec::decode(buf).unwrap() {
                got.push(cmd);
                continue;
            }
            assert_ne!(sock.read_buf(buf).await.unwrap(), 0, "link closed early");
        }
        got
    }

    fn answer(req: &RemotingCommand, remark: &str) -> BytesMut {
        let mut out = BytesMut::new();
        codec::encode(
            &RemotingCommand::response_to(req, 0).with_remark(remark),
            &mut out,
        )
        .unwrap();
        out
    }

    #[tokio::test]
    async fn responses_are_matched_by_opaque_whatever_their_order() {
        let (addr, accepted) = peer().await;
        let (push_tx, mut push_rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link::connect(&addr, WAIT, Some(push_tx)).await.unwrap());
        let mut sock = accepted.await.unwrap();

        let first = tokio::spawn({
            let link = link.clone();
            async move { link.call(RemotingCommand::request(1, 0), WAIT).await }
        });
        let second = tokio::spawn({
            let link = link.clone();
            async move { link.call(RemotingCommand::request(2, 0), WAIT).await }
        });
        let mut buf = BytesMut::new();
        let reqs = read_frames(&mut sock, &mut buf, 2).await;
        assert_ne!(
            reqs[0].opaque, reqs[1].opaque,
            "each call gets a fresh opaque"
        );

        // A response nobody waits for and a request of the server's own come first;
        // then the answers, last request first.
        let mut out = BytesMut::new();
        let stray = RemotingCommand {
            opaque: 9999,
            flag: FLAG_RESPONSE,
            ..Default::default()
        };
        codec::encode(&stray, &mut out).unwrap();
        codec::encode(&RemotingCommand::request(39, 77), &mut out).unwrap();
        for req in reqs.iter().rev() {
            out.extend_from_slice(&answer(req, &format!("answer to {}", req.code)));
        }
        sock.write_all(&out).await.unwrap();

        let first = first.await.unwrap().unwrap();
        let second = second.await.unwrap().unwrap();
        assert_eq!(first.remark.as_deref(), Some("answer to 1"));
        assert_eq!(second.remark.as_deref(), Some("answer to 2"));
        let pushed = push_rx.recv().await.unwrap();
        assert_eq!(
            (pushed.command.code, pushed.addr.as_str()),
            (39, addr.as_str())
        );
    }

    #[tokio::test]
    async fn pending_calls_fail_as_closed_when_the_peer_leaves() {
        let (addr, accepted) = peer().await;
        let link = Arc::new(Link::connect(&addr, WAIT, None).await.unwrap());
        let mut sock = accepted.await.unwrap();
        let calls: Vec<_> = (0..3)
            .map(|code| {
                let link = link.clone();
                tokio::spawn(
                    async move { link.call(RemotingCommand::request(code, 0), WAIT).await },
                )
            })
            .collect();
        // Every request reached the peer before it leaves without answering.
        read_frames(&mut sock, &mut BytesMut::new(), 3).await;
        drop(sock);
        for call in calls {
            let err = call.await.unwrap().unwrap_err();
            assert!(matches!(err, Error::ConnectionClosed { .. }), "{err:?}");
        }
        tokio::time::timeout(WAIT, link.closed()).await.unwrap();
        assert!(link.is_closed());
        let later = link.call(RemotingCommand::request(1, 0), WAIT).await;
        assert!(
            matches!(later, Err(Error::ConnectionClosed { .. })),
            "{later:?}"
        );
    }

    #[tokio::test]
    async fn a_bad_frame_from_the_peer_closes_the_link() {
        let (addr, accepted) = peer().await;
        let link = Arc::new(Link::connect(&addr, WAIT, None).await.unwrap());
        let mut sock = accepted.await.unwrap();
        let call = tokio::spawn({
            let link = link.clone();
            async move { link.call(RemotingCommand::request(1, 0), WAIT).await }
        });
        read_frames(&mut sock, &mut BytesMut::new(), 1).await;
        // A length prefix far over the 16 MiB limit.
        sock.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let err = call.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::ConnectionClosed { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn an_unanswered_call_times_out_and_a_late_answer_is_dropped() {
        let (addr, accepted) = peer().await;
        let link = Link::connect(&addr, WAIT, None).await.unwrap();
        let mut sock = accepted.await.unwrap();
        let timeout = Duration::from_millis(200);
        let err = link
            .call(RemotingCommand::request(1, 0), timeout)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Timeout { timeout: t, .. } if t == timeout),
            "{err:?}"
        );

        // The late answer matches no waiter; the next call gets its own answer.
        let mut buf = BytesMut::new();
        let late = read_frames(&mut sock, &mut buf, 1).await.remove(0);
        sock.write_all(&answer(&late, "late")).await.unwrap();
        let next =
            tokio::spawn(async move { link.call(RemotingCommand::request(2, 0), WAIT).await });
        let req = read_frames(&mut sock, &mut buf, 1).await.remove(0);
        sock.write_all(&answer(&req, "on time")).await.unwrap();
        let resp = next.await.unwrap().unwrap();
        assert_eq!(resp.remark.as_deref(), Some("on time"));
    }

    #[tokio::test]
    async fn oneway_sends_carry_the_flag_and_expect_nothing() {
        let (addr, accepted) = peer().await;
        let link = Link::connect(&addr, WAIT, None).await.unwrap();
        let mut sock = accepted.await.unwrap();
        link.oneway(RemotingCommand::request(7, 0)).await.unwrap();
        let got = read_frames(&mut sock, &mut BytesMut::new(), 1)
            .await
            .remove(0);
        assert_eq!(got.code, 7);
        assert!(got.is_oneway());
    }

    #[tokio::test]
    async fn connecting_to_nobody_is_a_connect_error() {
        // Bind then drop: a port nobody listens on.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.to_string())
            .unwrap();
        let err = Link::connect(&addr, WAIT, None).await.err().unwrap();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    }
}
