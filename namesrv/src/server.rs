//! The TCP side: the shared remoting server loop ([`rocketgate_remoting::server::serve`])
//! with this NameServer's [`Handler`], and beside it the liveness scan, which closes the
//! connection a broker registered on when that broker expires.

use rocketgate_base::sync::lock;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::server::{self, Answer, Handler, Limits, Outbound, Peer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::info;

use crate::handler::{self, State};
use crate::kv::KvConfig;
use crate::routes::{ConnId, RouteTable};
use crate::{Error, NamesrvSettings};

/// A peer that does not take its responses within this long is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Only a close order ever reaches a connection from outside: a short queue will do.
const OUTBOUND_CAPACITY: usize = 4;

/// Shared by the connection tasks and the scan. One short std lock: every holder does a
/// table lookup or update and never awaits while holding it.
type Shared = Arc<Mutex<State>>;

/// A bound, not yet running NameServer.
pub struct NameServer {
    listener: TcpListener,
    settings: NamesrvSettings,
    state: Shared,
    auth: Arc<rocketgate_auth::Auth>,
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

/// Answers requests from the route table and KV config; remembers each connection's
/// outbound side so the scan can close a connection whose broker expired.
struct Routes {
    state: Shared,
    /// Open connections, by id. Std lock, held for one map operation; taken after
    /// (never while holding) the state lock.
    conns: Mutex<HashMap<ConnId, Outbound>>,
    /// With auth on, writes (registration, unregistration, KV, topic deletion) must be
    /// signed with the internal credential.
    auth: Arc<rocketgate_auth::Auth>,
}

impl Handler for Routes {
    type Session = Peer;

    fn open(&self, peer: Peer, outbound: Outbound) -> Peer {
        lock(&self.conns).insert(peer.id, outbound);
        peer
    }

    fn handle(&self, peer: &mut Peer, req: RemotingCommand) -> Answer {
        if let Err(remark) = internal_only(&self.auth, &req) {
            tracing::warn!(peer = %peer.addr, code = req.code, %remark, "NameServer write refused");
            metrics::counter!("rocketgate_auth_failures_total", "door" => "namesrv").increment(1);
            return Answer::Now(
                RemotingCommand::response_to(
                    &req,
                    rocketgate_remoting::code::response::NO_PERMISSION,
                )
                .with_remark(remark),
            );
        }
        let resp = handler::handle(
            &mut lock(&self.state),
            &req,
            peer.id,
            Instant::now().into_std(),
        );
        Answer::Now(resp)
    }

    async fn close(&self, peer: Peer, why: &str) {
        lock(&self.conns).remove(&peer.id);
        let gone = lock(&self.state).routes.connection_closed(peer.id);
        if !gone.is_empty() {
            info!(peer = %peer.addr, brokers = ?gone, %why, "brokers left with their connection");
        }
    }
}

impl Routes {
    /// Drops brokers silent for too long, and closes the connections they used.
    fn scan(&self) {
        let expired = lock(&self.state).routes.tick(Instant::now().into_std());
        for e in expired {
            info!(broker = %e.broker_addr, "broker expired");
            if let Some(outbound) = lock(&self.conns).get(&e.conn) {
                outbound.close("broker expired");
            }
        }
    }
}

/// Ok unless auth is on and `req` is a write not signed with the internal credential
/// (an anonymous UNREGISTER_BROKER would empty the cluster view).
fn internal_only(auth: &rocketgate_auth::Auth, req: &RemotingCommand) -> Result<(), String> {
    use rocketgate_remoting::code::request as r;
    if !auth.enabled()
        || !matches!(
            req.code,
            r::REGISTER_BROKER
                | r::UNREGISTER_BROKER
                | r::BROKER_HEARTBEAT
                | r::PUT_KV_CONFIG
                | r::DELETE_KV_CONFIG
                | r::DELETE_TOPIC_IN_NAMESRV
        )
    {
        return Ok(());
    }
    let fields: Vec<(&str, &str)> = req.ext_fields.iter().collect();
    match auth.verify_signed(fields.iter().copied(), &req.body) {
        Ok(who) if who.internal => Ok(()),
        Ok(who) => Err(format!(
            "user {:?} may not change the NameServer: only the internal credential (auth.internal_access_key) may",
            who.user
        )),
        Err(e) => Err(format!(
            "NameServer writes need the internal credential: {e}"
        )),
    }
}

impl NameServer {
    /// Checks NameServer writes against the internal credential of `auth` (when on).
    pub fn with_auth(mut self, auth: Arc<rocketgate_auth::Auth>) -> Self {
        self.auth = auth;
        self
    }

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
                auth: rocketgate_auth::Auth::disabled(),
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
            auth,
        } = self;
        let local = listener.local_addr().ok();
        info!(addr = ?local, ?settings, "NameServer listening");
        let routes = Arc::new(Routes {
            state,
            conns: Mutex::new(HashMap::new()),
            auth,
        });
        let limits = Limits {
            max_frame_len: settings.max_frame_len,
            write_timeout: WRITE_TIMEOUT,
            outbound_capacity: OUTBOUND_CAPACITY,
        };
        let scan = {
            let routes = routes.clone();
            async move {
                let mut tick = tokio::time::interval(settings.scan_interval);
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    routes.scan();
                }
            }
        };
        // The scan never ends on its own: the server's end (after its connections
        // closed) ends both.
        tokio::select! {
            _ = server::serve(listener, routes, limits, shutdown) => {}
            _ = scan => {}
        }
        info!(addr = ?local, "NameServer stopped");
    }
}
