//! A listener as a queue of ready connections: TCP accepted, TLS handshake done
//! (on a task per connection), client identity known.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::Acceptor;

/// The first byte of a TLS record carrying a handshake (a ClientHello opens with it).
const TLS_HANDSHAKE: u8 = 0x16;

/// What a listener speaks.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Plain TCP.
    Plain,
    /// TLS only: anything else fails its handshake and is closed.
    Tls(Acceptor),
    /// RocketMQ's `permissive`: TLS when the first byte is `0x16`, plain otherwise.
    /// No plain protocol of ours starts with `0x16` (a remoting frame's first byte is
    /// the high byte of its length, 0x16 only for frames over 352 MiB).
    Permissive(Acceptor),
}

impl Mode {
    pub fn is_tls(&self) -> bool {
        !matches!(self, Mode::Plain)
    }
}

/// A connection as a door sees it.
#[derive(Debug)]
pub struct Conn {
    pub stream: Stream,
    pub peer: SocketAddr,
    /// The verified client certificate's name (mTLS), `None` without one.
    pub tls_identity: Option<String>,
}

/// A plain or TLS connection: one type, so a door is written once for both.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    /// Boxed: a TLS session is ~1 KiB, and most connections in a mixed listener
    /// need not pay for it.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Stream {
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

/// The accepted, ready connections of one listener. Dropping it closes the listener.
pub struct Incoming {
    rx: mpsc::Receiver<Conn>,
    local: SocketAddr,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("local", &self.local)
            .finish()
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Incoming {
    /// Starts accepting on `listener` (a task of the current runtime); `door` names
    /// the door in log lines.
    pub fn new(listener: TcpListener, mode: Mode, door: &'static str) -> io::Result<Incoming> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(accept_loop(listener, mode, door, tx));
        Ok(Incoming { rx, local, task })
    }

    /// The next ready connection. Pending forever once the listener failed for good
    /// (it never does on its own; transient accept errors are retried).
    pub async fn accept(&mut self) -> Conn {
        match self.rx.recv().await {
            Some(c) => c,
            None => std::future::pending().await,
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

async fn accept_loop(
    listener: TcpListener,
    mode: Mode,
    door: &'static str,
    tx: mpsc::Sender<Conn>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = tx.closed() => return,
            r = listener.accept() => match r {
                Ok(ok) => ok,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(door, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        match &mode {
            Mode::Plain => {
                let conn = Conn {
                    stream: Stream::Plain(tcp),
                    peer,
                    tls_identity: None,
                };
                if tx.send(conn).await.is_err() {
                    return;
                }
            }
            Mode::Tls(acceptor) => {
                tokio::spawn(handshake(
                    acceptor.clone(),
                    tcp,
                    peer,
                    door,
                    tx.clone(),
                    false,
                ));
            }
            Mode::Permissive(acceptor) => {
                tokio::spawn(handshake(
                    acceptor.clone(),
                    tcp,
                    peer,
                    door,
                    tx.clone(),
                    true,
                ));
            }
        }
    }
}

async fn handshake(
    acceptor: Acceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    door: &'static str,
    tx: mpsc::Sender<Conn>,
    permissive: bool,
) {
    if permissive {
        let mut first = [0u8; 1];
        let peeked =
            tokio::time::timeout(acceptor.settings().handshake_timeout, tcp.peek(&mut first)).await;
        match peeked {
            Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => {}
            Ok(Ok(1)) => {
                let conn = Conn {
                    stream: Stream::Plain(tcp),
                    peer,
                    tls_identity: None,
                };
                let _ = tx.send(conn).await;
                return;
            }
            _ => return,
        }
    }
    match acceptor.accept(tcp).await {
        Ok((tls, tls_identity)) => {
            if let Some(id) = &tls_identity {
                tracing::info!(door, %peer, tls_identity = %id, "TLS client certificate verified");
            }
            let conn = Conn {
                stream: Stream::Tls(Box::new(tls)),
                peer,
                tls_identity,
            };
            let _ = tx.send(conn).await;
        }
        Err(e) => tracing::debug!(door, %peer, error = %e, "TLS handshake failed"),
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
