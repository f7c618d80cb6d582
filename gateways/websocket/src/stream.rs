//! `/mqtt`: the WebSocket as a byte stream, for a protocol served elsewhere.
//!
//! MQTT over WebSocket carries MQTT packets in binary messages, and a packet may
//! span messages or share one. [`WsByteStream`] hides that: reads return the
//! bytes of binary messages in order, as if from a TCP socket; writes are
//! gathered and sent as one binary message per flush (or per 64 KiB). A close
//! from the peer, or the server stopping, reads as end of stream; shutting the
//! writer down sends a close frame. A text message is an error (MQTT over
//! WebSocket is binary only).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures_util::{Sink, Stream};
use rocketgate_tls::Stream as Io;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// Serves a byte stream that arrived over WebSocket (the MQTT door implements
/// it with its `serve_stream`). `serve` must not block: it spawns the session
/// and returns. Closures `Fn(WsByteStream, SocketAddr, Option<String>)` are
/// handlers too. `tls_identity` is the verified client certificate's name (WSS with
/// mTLS), for the authentication layer of the protocol served.
pub trait StreamHandler: Send + Sync + 'static {
    fn serve(&self, io: WsByteStream, peer: SocketAddr, tls_identity: Option<String>);
}

impl<F> StreamHandler for F
where
    F: Fn(WsByteStream, SocketAddr, Option<String>) + Send + Sync + 'static,
{
    fn serve(&self, io: WsByteStream, peer: SocketAddr, tls_identity: Option<String>) {
        self(io, peer, tls_identity)
    }
}

/// Largest binary message one flush sends; more written bytes go in the next.
const MAX_OUT_FRAME: usize = 64 * 1024;

/// A WebSocket carrying a byte stream in binary messages; `AsyncRead + AsyncWrite`.
pub struct WsByteStream {
    ws: WebSocketStream<Io>,
    /// The unread rest of the last binary message.
    unread: Bytes,
    /// Written bytes not yet sent.
    unsent: BytesMut,
    /// Completes when the server stops.
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
    eof: bool,
}

impl std::fmt::Debug for WsByteStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsByteStream")
            .field("unread", &self.unread.len())
            .field("unsent", &self.unsent.len())
            .field("eof", &self.eof)
            .finish()
    }
}

impl WsByteStream {
    pub(crate) fn new(ws: WebSocketStream<Io>, mut closing: watch::Receiver<bool>) -> Self {
        WsByteStream {
            ws,
            unread: Bytes::new(),
            unsent: BytesMut::new(),
            closing: Box::pin(async move {
                let _ = closing.wait_for(|c| *c).await;
            }),
            eof: false,
        }
    }

    /// Sends what was written as one binary message and flushes the socket.
    fn poll_send_unsent(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.unsent.is_empty() {
            ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io::Error::other)?;
            let frame = self.unsent.split().freeze();
            Pin::new(&mut self.ws)
                .start_send(Message::Binary(frame))
                .map_err(io::Error::other)?;
        }
        Pin::new(&mut self.ws)
            .poll_flush(cx)
            .map_err(io::Error::other)
    }
}

impl AsyncRead for WsByteStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.unread.is_empty() {
                let n = this.unread.len().min(buf.remaining());
                buf.put_slice(&this.unread.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof || this.closing.as_mut().poll(cx).is_ready() {
                this.eof = true;
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(b))) => this.unread = b,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a text message on a binary (MQTT) WebSocket",
                    )));
                }
                Some(Ok(Message::Close(_))) | None => {
                    this.eof = true;
                    return Poll::Ready(Ok(()));
                }
                Some(Ok(_)) => {} // ping/pong: tungstenite answers pings itself
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
            }
        }
    }
}

impl AsyncWrite for WsByteStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.unsent.len() >= MAX_OUT_FRAME {
            ready!(this.poll_send_unsent(cx))?;
        }
        let n = data.len().min(MAX_OUT_FRAME - this.unsent.len());
        this.unsent.extend_from_slice(&data[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send_unsent(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_unsent(cx))?;
        match ready!(Pin::new(&mut this.ws).poll_close(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            // Already closed by the peer: nothing left to say.
            Err(tokio_tungstenite::tungstenite::Error::ConnectionClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io::Error::other(e))),
        }
    }
}
