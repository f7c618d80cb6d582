//! The listener under axum: counts open connections for `/metrics`
//! (`rocketgate_connections{protocol="http"}`) and per client address
//! (`auth.max_connections_per_address`: a keep-alive connection holds its place
//! until it closes; one over the limit is answered `429` with a JSON body and
//! closed, before axum sees it); plain or TLS (HTTPS), handshakes done before a
//! connection gets here (`rocketgate_tls::Incoming`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use rocketgate_auth::{ConnectionLimit, ConnectionSlot};
use rocketgate_tls::{Incoming, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const CONNECTIONS: &str = "rocketgate_connections";

/// The client, as handlers see it (`ConnectInfo<Peer>`).
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The verified TLS client certificate's name (HTTPS with mTLS), `None`
    /// without one; the authentication layer takes it from here.
    pub tls_identity: Option<Arc<str>>,
}

pub(crate) struct Counted {
    incoming: Incoming,
    limit: ConnectionLimit,
}

impl Counted {
    pub(crate) fn new(incoming: Incoming, limit: ConnectionLimit) -> Self {
        Counted { incoming, limit }
    }
}

/// The answer to a connection over the per-address limit.
const TOO_MANY: &str = r#"{"error":{"code":"too_many_connections","message":"too many connections from this address (auth.max_connections_per_address); close one or try again later"}}"#;

/// Reads what the client sent first (its request head, bounded in size and time)
/// so closing does not reset the connection before it reads the answer, then
/// answers 429 and closes.
async fn refuse(mut io: Stream, peer: SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    metrics::counter!("rocketgate_connections_refused_total", "door" => "http").increment(1);
    tracing::warn!(%peer, "HTTP connection refused: too many connections from this address");
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), read_head).await;
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{TOO_MANY}",
        TOO_MANY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = io.write_all(answer.as_bytes()).await;
        let _ = io.shutdown().await;
    })
    .await;
}

impl axum::serve::Listener for Counted {
    type Io = CountedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let c = self.incoming.accept().await;
            let Some(slot) = self.limit.admit(c.peer.ip()) else {
                tokio::spawn(refuse(c.stream, c.peer));
                continue;
            };
            metrics::gauge!(CONNECTIONS, "protocol" => "http").increment(1.0);
            let stream = CountedStream {
                io: c.stream,
                tls_identity: c.tls_identity.map(Arc::from),
                _slot: slot,
            };
            return (stream, c.peer);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.incoming.local_addr())
    }
}

impl Connected<IncomingStream<'_, Counted>> for Peer {
    fn connect_info(stream: IncomingStream<'_, Counted>) -> Self {
        Peer {
            addr: *stream.remote_addr(),
            tls_identity: stream.io().tls_identity.clone(),
        }
    }
}

/// A connection that takes itself off the gauge when dropped.
pub(crate) struct CountedStream {
    io: Stream,
    tls_identity: Option<Arc<str>>,
    /// Its place under the per-address limit.
    _slot: ConnectionSlot,
}

impl Drop for CountedStream {
    fn drop(&mut self) {
        metrics::gauge!(CONNECTIONS, "protocol" => "http").decrement(1.0);
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
