//! One connection: a task that owns the socket and `select!`s over reads, its outbound
//! channel (responses of finished requests, and requests the broker pushes to the
//! client) and shutdown. Requests run as tasks of this connection, so closing it
//! cancels its suspended pulls.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use rocketgate_core::broker::MessagingApi;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::Ctx;
use super::clients::ConnId;
use super::handle;
use crate::code::response;
use crate::codec::{FrameCodec, RemotingCommand};

/// Responses and pushes waiting to be written; a full channel holds up the handlers.
const OUTBOUND_CAPACITY: usize = 1024;
/// Read into at least this much free buffer space, growing it by `READ_CHUNK`.
const READ_MIN: usize = 16 * 1024;
const READ_CHUNK: usize = 64 * 1024;

/// Who sent a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub id: ConnId,
    pub addr: SocketAddr,
}

pub(super) struct Connection<B> {
    peer: Peer,
    stream: TcpStream,
    codec: FrameCodec,
    ctx: Arc<Ctx<B>>,
}

enum Next {
    Read(std::io::Result<usize>),
    Out(RemotingCommand),
    Close(&'static str),
    Reaped,
}

impl<B: MessagingApi + 'static> Connection<B> {
    pub fn new(
        id: ConnId,
        addr: SocketAddr,
        stream: TcpStream,
        codec: FrameCodec,
        ctx: Arc<Ctx<B>>,
    ) -> Self {
        Connection {
            peer: Peer { id, addr },
            stream,
            codec,
            ctx,
        }
    }

    pub async fn serve(mut self, mut closing: watch::Receiver<bool>) {
        debug!(peer = %self.peer.addr, conn = self.peer.id, "connected");
        let (tx, mut rx) = mpsc::channel(OUTBOUND_CAPACITY);
        self.ctx.clients.connected(self.peer.id, tx.clone());
        let mut requests = JoinSet::new();
        let mut buf = BytesMut::with_capacity(8192);
        let mut out = BytesMut::new();
        let why = loop {
            let dispatched = self.dispatch_buffered(&mut buf, &mut out, &tx, &mut requests);
            // Whatever is ready (answers of this read, finished tasks) goes out in one
            // write; a bad frame still gets the answers before it.
            if !out.is_empty() || dispatched.is_err() {
                while out.len() < 1 << 20 {
                    match rx.try_recv() {
                        Ok(cmd) => self.encode(&cmd, &mut out),
                        Err(_) => break,
                    }
                }
                if let Err(why) = self.flush(&mut out).await {
                    break why;
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
                Some(cmd) = rx.recv() => Next::Out(cmd),
                Some(_) = requests.join_next() => Next::Reaped,
                _ = closing.wait_for(|c| *c) => Next::Close("server stopping"),
            };
            match next {
                Next::Read(Ok(0)) => break "peer closed".to_string(),
                Next::Read(Ok(_)) | Next::Reaped => {}
                Next::Read(Err(e)) => break format!("read failed: {e}"),
                // Written (with whatever else is ready) at the top of the loop.
                Next::Out(cmd) => self.encode(&cmd, &mut out),
                Next::Close(why) => break why.to_string(),
            }
        };
        requests.abort_all();
        let departed = self.ctx.clients.disconnected(self.peer.id);
        if let Some(client_id) = departed.client_id {
            for group in departed.consumer_groups {
                handle::member_left(&self.ctx, &group, &client_id).await;
            }
        }
        debug!(peer = %self.peer.addr, conn = self.peer.id, %why, "disconnected");
    }

    /// Answers every whole request in `buf`. A request whose handler completes
    /// without waiting (a send under async flush, most admin requests) is answered
    /// inline into `out`: no task, no channel hop, and the answers of one read leave in
    /// one write. One that has to wait (a long-polling pull, a sync-flush send) goes on
    /// as a task of this connection and answers through `tx`.
    /// Err: the stream is unusable.
    fn dispatch_buffered(
        &self,
        buf: &mut BytesMut,
        out: &mut BytesMut,
        tx: &mpsc::Sender<RemotingCommand>,
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
            let ctx = self.ctx.clone();
            let peer = self.peer;
            let mut answer = Box::pin(async move { handle::handle(&ctx, peer, req).await });
            // One poll with a no-op waker: if it is not ready, the task polls it again
            // with its own waker (every future accepts a new waker on each poll).
            let mut cx = Context::from_waker(Waker::noop());
            match answer.as_mut().poll(&mut cx) {
                Poll::Ready(resp) => {
                    if !oneway {
                        self.encode(&resp, out);
                    }
                }
                Poll::Pending => {
                    let tx = tx.clone();
                    requests.spawn(async move {
                        let resp = answer.await;
                        if !oneway {
                            let _ = tx.send(resp).await;
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
            let _ = self.codec.encode(&fallback, out);
        }
    }

    async fn flush(&mut self, out: &mut BytesMut) -> Result<(), String> {
        if out.is_empty() {
            return Ok(());
        }
        let timeout = self.ctx.settings.write_timeout;
        let written = tokio::time::timeout(timeout, self.stream.write_all(out)).await;
        out.clear();
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("write failed: {e}")),
            Err(_) => Err("write timed out".into()),
        }
    }
}
