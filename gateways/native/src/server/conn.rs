//! One connection: a task that owns the socket and `select!`s over reads, its outbound
//! channel (responses of finished requests, and requests the broker pushes to the
//! client) and shutdown. Requests run as tasks of this connection, so closing it
//! cancels its suspended pulls.

use std::net::SocketAddr;
use std::sync::Arc;

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
            if let Err(why) = self.dispatch_buffered(&mut buf, &tx, &mut requests) {
                break why;
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
                Next::Out(cmd) => {
                    self.encode(&cmd, &mut out);
                    // Write whatever else is ready in the same syscall.
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

    /// Starts a task for every whole request in `buf`. Err: the stream is unusable.
    fn dispatch_buffered(
        &self,
        buf: &mut BytesMut,
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
            let ctx = self.ctx.clone();
            let tx = tx.clone();
            let peer = self.peer;
            requests.spawn(async move {
                let oneway = req.is_oneway();
                let resp = handle::handle(&ctx, peer, req).await;
                if !oneway {
                    let _ = tx.send(resp).await;
                }
            });
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
