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
    /// Serve TLS with this certificate (`tls.namesrv`); `None`: plain remoting.
    tls: Option<rocketgate_tls::Acceptor>,
}

/// The TLS listener as the remoting loop's connection source (`tls.namesrv`).
struct TlsIncoming(rocketgate_tls::Incoming);

impl server::Accept for TlsIncoming {
    type Io = rocketgate_tls::Stream;

    async fn accept(&mut self) -> std::io::Result<server::Accepted<Self::Io>> {
        let c = self.0.accept().await;
        Ok(server::Accepted {
            io: c.stream,
            addr: c.peer,
            tls_identity: c.tls_identity,
        })
    }
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
        let checked = internal_only(&self.auth, &req)
            .inspect_err(|_| {
                metrics::counter!("rocketgate_auth_failures_total", "door" => "namesrv")
                    .increment(1);
            })
            .and_then(|()| may_read(&self.auth, &req));
        if let Err(remark) = checked {
            tracing::warn!(peer = %peer.addr, code = req.code, %remark, "NameServer request refused");
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

/// Ok unless auth is on and `req` reads topic names the signer may not know: a
/// route (`GET_ROUTEINFO_BY_TOPIC`) needs a signed request whose user may publish
/// or subscribe to some name under the topic (`Grant::may_route`); the topic lists
/// (`GET_ALL_TOPIC_LIST_FROM_NAMESERVER`, `GET_TOPICS_BY_CLUSTER`) need the admin or
/// monitor permission. The internal credential may read everything. The cluster
/// view (`GET_BROKER_CLUSTER_INFO`: broker names and addresses, no topics) stays
/// open: clients and the HTTP door's cluster view find brokers with it.
fn may_read(auth: &rocketgate_auth::Auth, req: &RemotingCommand) -> Result<(), String> {
    use rocketgate_remoting::code::request as r;
    let route = req.code == r::GET_ROUTEINFO_BY_TOPIC;
    if !auth.enabled()
        || !(route
            || req.code == r::GET_ALL_TOPIC_LIST_FROM_NAMESERVER
            || req.code == r::GET_TOPICS_BY_CLUSTER)
    {
        return Ok(());
    }
    let fields: Vec<(&str, &str)> = req.ext_fields.iter().collect();
    let who = auth
        .verify_signed(fields.iter().copied(), &req.body)
        .map_err(|e| {
            format!("with authentication on, NameServer reads of topics must be signed: {e}")
        })?;
    let grant = auth.grant(&who, "");
    if route {
        let topic = req
            .field(rocketgate_remoting::protocol::field::TOPIC)
            .unwrap_or("");
        if grant.may_route(topic) {
            return Ok(());
        }
        metrics::counter!("rocketgate_acl_denied_total", "door" => "namesrv", "action" => "route")
            .increment(1);
        return Err(format!(
            "user {:?} may neither publish nor subscribe to {topic:?}, so may not read its route",
            who.user
        ));
    }
    if grant.may_monitor() {
        return Ok(());
    }
    metrics::counter!("rocketgate_acl_denied_total", "door" => "namesrv", "action" => "topic_list")
        .increment(1);
    Err(format!(
        "user {:?} may not list topics: that needs the admin or monitor permission",
        who.user
    ))
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
                tls: None,
            },
            local,
        ))
    }

    /// Serves TLS only, with `acceptor`'s certificate (`tls.namesrv`): brokers,
    /// clients and proxies then connect with `namesrv.ca`.
    pub fn with_tls(mut self, acceptor: rocketgate_tls::Acceptor) -> Self {
        self.tls = Some(acceptor);
        self
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
            tls,
        } = self;
        let local = listener.local_addr().ok();
        info!(addr = ?local, ?settings, tls = tls.is_some(), "NameServer listening");
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
        let serve = async move {
            match tls {
                None => server::serve(listener, routes, limits, shutdown).await,
                Some(acceptor) => {
                    // New certificate files are picked up while the server runs.
                    let _reload = acceptor.spawn_reload();
                    let mode = rocketgate_tls::Mode::Tls(acceptor);
                    match rocketgate_tls::Incoming::new(listener, mode, "namesrv") {
                        Ok(incoming) => {
                            server::serve(TlsIncoming(incoming), routes, limits, shutdown).await
                        }
                        Err(e) => tracing::error!(error = %e, "NameServer TLS listener failed"),
                    }
                }
            }
        };
        tokio::select! {
            _ = serve => {}
            _ = scan => {}
        }
        info!(addr = ?local, "NameServer stopped");
    }
}
