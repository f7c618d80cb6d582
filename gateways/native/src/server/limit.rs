//! Connections per client address (`auth.max_connections_per_address`): a
//! connection source in front of the remoting loop that admits each new connection
//! under [`ConnectionLimit`] and closes one over it at once, with a log line and
//! `rocketgate_connections_refused_total{door="native"}` (remoting has no frame to
//! say "too many" before a request arrives; RocketMQ clients retry another time).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use rocketgate_auth::{ConnectionLimit, ConnectionSlot};
use rocketgate_remoting::server::{Accept, Accepted};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `inner`'s connections, at most the limit per address at once.
pub(super) struct Limited<A> {
    pub inner: A,
    pub limit: ConnectionLimit,
}

impl<A: Accept> Accept for Limited<A> {
    type Io = Slotted<A::Io>;

    async fn accept(&mut self) -> io::Result<Accepted<Self::Io>> {
        loop {
            let c = self.inner.accept().await?;
            match self.limit.admit(c.addr.ip()) {
                Some(slot) => {
                    return Ok(Accepted {
                        io: Slotted {
                            io: c.io,
                            _slot: slot,
                        },
                        addr: c.addr,
                        tls_identity: c.tls_identity,
                    });
                }
                None => {
                    metrics::counter!("rocketgate_connections_refused_total", "door" => "native")
                        .increment(1);
                    tracing::warn!(peer = %c.addr, "native connection closed: too many connections from this address (auth.max_connections_per_address)");
                    drop(c.io);
                }
            }
        }
    }
}

/// A connection holding its place under the limit until it is dropped.
pub(super) struct Slotted<Io> {
    io: Io,
    _slot: ConnectionSlot,
}

impl<Io: AsyncRead + Unpin> AsyncRead for Slotted<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Slotted<Io> {
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
