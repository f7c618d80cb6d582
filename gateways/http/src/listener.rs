//! The listener under axum: counts open connections for `/metrics`
//! (`rocketgate_connections{protocol="http"}`); plain or TLS (HTTPS), handshakes
//! done before a connection gets here (`rocketgate_tls::Incoming`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
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

pub(crate) struct Counted(Incoming);

impl Counted {
    pub(crate) fn new(l: Incoming) -> Self {
        Counted(l)
    }
}

impl axum::serve::Listener for Counted {
    type Io = CountedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let c = self.0.accept().await;
        metrics::gauge!(CONNECTIONS, "protocol" => "http").increment(1.0);
        let stream = CountedStream {
            io: c.stream,
            tls_identity: c.tls_identity.map(Arc::from),
        };
        (stream, c.peer)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.0.local_addr())
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
