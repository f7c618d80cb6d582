//! The TCP side: an accept loop that also runs the liveness scan, and one task per
//! connection that owns its socket.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use rocketgate_native::{FrameCodec, RemotingCommand, code::response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::handler::{self, State};
use crate::kv::KvConfig;
use crate::routes::{ConnId, RouteTable};
use crate::{Error, NamesrvSettings};

/// A peer that does not take its responses within this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Shared by the connection tasks and the scan. One short std lock: every holder does a
/// table lookup or update and never awaits while holding it.
type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves a table that is still structurally valid.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the accept loop can tell a connection task.
enum Outbound {
    /// The broker on this connection expired: close it.
    Close,
}

/// A bound, not yet running NameServer.
pub struct NameServer {
    listener: TcpListener,
    settings: NamesrvSettings,
    state: Shared,
}

/// Controls a spawned [`NameServer`]. Dropping it stops the server too (in the
/// background); [`NameServerHandle::stop`] also waits for the connections to close.
pub struct NameServerHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl NameServerHandle {
    /// Stops accepting, closes every connection, and returns when done.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

impl NameServer {
    /// Binds `addr` (port 0 = any free port) and returns the address actually bound.
    pub async fn bind(
        addr: SocketAddr,
        settings: NamesrvSettings,
    ) -> Result<(NameServer, SocketAddr), Error> {
        let bind_err = |source| Error::Bind { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let state = Arc::new(Mutex::new(State {
            routes: RouteTable::new(settings.broker_expiry),
            kv: KvConfig::default(),
        }));
        Ok((
            NameServer {
                listener,
                settings,
                state,
            },
            local,
        ))
    }

    /// Runs on the current tokio runtime until [`NameServerHandle::stop`].
    pub fn spawn(self) -> NameServerHandle {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(self.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        NameServerHandle { stop, task }
    }

    /// Serves until `shutdown` completes, then closes every connection.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let NameServer {
            listener,
            settings,
            state,
        } = self;
        let local = listener.local_addr().ok();
        info!(addr = ?local, ?settings, "NameServer listening");
        let codec = FrameCodec::new(settings.max_frame_len);
        let (closing, _) = watch::channel(false);
        // Owned by this loop alone: the outbound channel of every open connection.
        let mut outbound: HashMap<ConnId, mpsc::Sender<Outbound>> = HashMap::new();
        let mut conns = JoinSet::new();
        let mut next_id: ConnId = 1;
        let mut scan = tokio::time::interval(settings.scan_interval);
        scan.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tokio::pin!(shutdown);

        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let id = next_id;
                        next_id += 1;
                        let (tx, rx) = mpsc::channel(4);
                        outbound.insert(id, tx);
                        let conn = Connection { id, peer, stream, codec, state: state.clone() };
                        conns.spawn(conn.serve(rx, closing.subscribe()));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = scan.tick() => {
                    let expired = lock(&state).routes.tick(Instant::now().into_std());
                    for e in expired {
                        info!(broker = %e.broker_addr, "broker expired");
                        if let Some(tx) = outbound.get(&e.conn) {
                            let _ = tx.try_send(Outbound::Close);
                        }
                    }
                }
                Some(done) = conns.join_next() => {
                    if let Ok(id) = done {
                        outbound.remove(&id);
                    }
                    // A panicked task's sender is closed; drop such entries.
                    outbound.retain(|_, tx| !tx.is_closed());
                }
                _ = &mut shutdown => break,
            }
        }
        drop(listener);
        closing.send_replace(true);
        while conns.join_next().await.is_some() {}
        info!(addr = ?local, "NameServer stopped");
    }
}

struct Connection {
    id: ConnId,
    peer: SocketAddr,
    stream: TcpStream,
    codec: FrameCodec,
    state: Shared,
}

enum Next {
    Read(std::io::Result<usize>),
    Close(&'static str),
}

impl Connection {
    /// Reads requests and answers them in order until the peer leaves, the stream turns
    /// bad, the broker on it expires, or the server stops. Returns its id.
    async fn serve(
        mut self,
        mut outbound: mpsc::Receiver<Outbound>,
        mut closing: watch::Receiver<bool>,
    ) -> ConnId {
        debug!(peer = %self.peer, conn = self.id, "connected");
        let mut buf = BytesMut::with_capacity(4096);
        let mut out = BytesMut::new();
        let why = loop {
            if let Err(why) = self.answer_buffered(&mut buf, &mut out) {
                // Flush what was answered before the bad frame, then drop the peer.
                let _ = self.flush(&mut out).await;
                break why;
            }
            if let Err(why) = self.flush(&mut out).await {
                break why;
            }
            let next = tokio::select! {
                r = self.stream.read_buf(&mut buf) => Next::Read(r),
                Some(Outbound::Close) = outbound.recv() => Next::Close("broker expired"),
                _ = closing.wait_for(|c| *c) => Next::Close("server stopping"),
            };
            match next {
                Next::Read(Ok(0)) => break "peer closed".to_string(),
                Next::Read(Ok(_)) => {}
                Next::Read(Err(e)) => break format!("read failed: {e}"),
                Next::Close(why) => break why.to_string(),
            }
        };
        let gone = lock(&self.state).routes.connection_closed(self.id);
        debug!(peer = %self.peer, conn = self.id, %why, "disconnected");
        if !gone.is_empty() {
            info!(peer = %self.peer, brokers = ?gone, %why, "brokers left with their connection");
        }
        self.id
    }

    /// Answers every whole request in `buf` into `out`. Err: the stream is unusable.
    fn answer_buffered(&self, buf: &mut BytesMut, out: &mut BytesMut) -> Result<(), String> {
        loop {
            let req = match self.codec.decode(buf) {
                Ok(Some(req)) => req,
                Ok(None) => return Ok(()),
                Err(e) => {
                    warn!(peer = %self.peer, error = %e, "bad frame; closing connection");
                    return Err(format!("bad frame: {e}"));
                }
            };
            if req.is_response() {
                continue;
            }
            let resp = handler::handle(
                &mut lock(&self.state),
                &req,
                self.id,
                Instant::now().into_std(),
            );
            if req.is_oneway() {
                continue;
            }
            if let Err(e) = self.codec.encode(&resp, out) {
                warn!(peer = %self.peer, error = %e, "response does not fit a frame");
                let fallback = RemotingCommand::response_to(&req, response::SYSTEM_ERROR)
                    .with_remark(format!("response too large: {e}"));
                self.codec
                    .encode(&fallback, out)
                    .map_err(|e| format!("cannot encode error response: {e}"))?;
            }
        }
    }

    async fn flush(&mut self, out: &mut BytesMut) -> Result<(), String> {
        if out.is_empty() {
            return Ok(());
        }
        let written = tokio::time::timeout(WRITE_TIMEOUT, self.stream.write_all(out)).await;
        out.clear();
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("write failed: {e}")),
            Err(_) => Err("write timed out".into()),
        }
    }
}
