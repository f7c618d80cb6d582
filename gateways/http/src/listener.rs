//! The TCP listener under axum: counts open connections for `/metrics`
//! (`rocketgate_connections{protocol="http"}`) and sets `TCP_NODELAY`.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

const CONNECTIONS: &str = "rocketgate_connections";

/// The client's address, as handlers see it (`ConnectInfo<Peer>`).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

pub(crate) struct Counted(TcpListener);

impl Counted {
    pub(crate) fn new(l: TcpListener) -> Self {
        Counted(l)
    }
}

impl axum::serve::Listener for Counted {
    type Io = CountedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    metrics::gauge!(CONNECTIONS, "protocol" => "http").increment(1.0);
                    return (CountedStream(stream), addr);
                }
                // Out of file descriptors and the like: wait, as axum's own listener does.
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

impl Connected<IncomingStream<'_, Counted>> for Peer {
    fn connect_info(stream: IncomingStream<'_, Counted>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// A connection that takes itself off the gauge when dropped.
pub(crate) struct CountedStream(TcpStream);

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
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
