//! The listener: accepts TCP connections, performs the upgrade and hands each
//! socket to its door (`/v1/ws` JSON connections run here, `/mqtt` streams go to
//! the [`StreamHandler`]).

use std::net::SocketAddr;
use std::sync::Arc;

use rocketgate_core::broker::MessagingApi;
use rocketgate_tls::{Acceptor, Incoming, Mode, OriginCheck, Stream};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tracing::{debug, info};

use crate::Error;
use crate::auth::{AllowAll, Authenticator, Door};
use crate::connection::{self, Context, Subscribers};
use crate::handshake::{self, Refusal};
use crate::settings::Settings;
use crate::stream::{StreamHandler, WsByteStream};

/// tungstenite's read buffer per connection. It is allocated at the upgrade and
/// zero-filled to its full size on the first read, so its default (128 KiB) was
/// ~83 % of an idle connection's memory (~155 KiB, issue #33), and 4 KiB was still a
/// quarter of it. A frame larger than this still arrives whole: the buffer grows to
/// the frame's length, and each read system call takes at most this many bytes —
/// a client sending large frames pays one call per KiB, which is cheap beside
/// what the broker does with each message; most `/v1/ws` clients (dashboards)
/// send a few small requests and receive.
pub(crate) const READ_BUFFER: usize = 1 << 10;
/// Bytes tungstenite gathers before it writes to the socket on its own (a flush
/// writes whatever is gathered). The buffer keeps the capacity it once reached, so
/// this also bounds what a connection keeps after a burst (default 128 KiB); the
/// connection flushes after every batch of frames anyway.
pub(crate) const WRITE_BUFFER: usize = 16 << 10;

/// What the binary plugs into the door.
#[derive(Clone)]
pub struct Hooks {
    /// Who may connect (default: everyone).
    pub auth: Arc<dyn Authenticator>,
    /// Serves `/mqtt`; without one, `/mqtt` answers `501 Not Implemented`.
    pub mqtt: Option<Arc<dyn StreamHandler>>,
    /// WSS: every connection is TLS with this acceptor's current certificate.
    pub tls: Option<Acceptor>,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            auth: Arc::new(AllowAll),
            mqtt: None,
            tls: None,
        }
    }
}

/// A bound, not yet running WebSocket door.
pub struct Server<B> {
    listener: Incoming,
    ctx: Arc<Context<B>>,
    mqtt: Option<Arc<dyn StreamHandler>>,
}

/// Controls a spawned [`Server`]. Dropping it stops the server too (in the
/// background); [`Handle::stop`] also waits for the connections to close.
pub struct Handle {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    subscribers: Subscribers,
}

impl Handle {
    /// The `/v1/ws` connections holding subscriptions (for the admin API).
    pub fn subscribers(&self) -> Subscribers {
        self.subscribers.clone()
    }

    /// Stops accepting, closes every connection (1001 "going away"; `/mqtt`
    /// streams read end of stream), and returns when the JSON connections are done.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

impl<B: MessagingApi + 'static> Server<B> {
    /// Binds `addr` (port 0 = any free port) and returns the address bound.
    pub async fn bind(
        addr: SocketAddr,
        broker: Arc<B>,
        settings: Settings,
        hooks: Hooks,
    ) -> Result<(Server<B>, SocketAddr), Error> {
        settings.check()?;
        crate::meters::METERS.register("ws");
        let bind_err = |source| Error::Bind { addr, source };
        let tcp = TcpListener::bind(addr).await.map_err(bind_err)?;
        let mode = match hooks.tls {
            Some(acceptor) => Mode::Tls(acceptor),
            None => Mode::Plain,
        };
        let listener = Incoming::new(tcp, mode, "ws").map_err(bind_err)?;
        let local = listener.local_addr();
        let ctx = Arc::new(Context {
            conn_limit: rocketgate_auth::ConnectionLimit::new(settings.max_connections_per_address),
            origins: rocketgate_tls::Origins::new(&settings.allowed_origins),
            broker,
            settings: Arc::new(settings),
            auth: hooks.auth,
            subscribers: Subscribers::default(),
        });
        Ok((
            Server {
                listener,
                ctx,
                mqtt: hooks.mqtt,
            },
            local,
        ))
    }

    /// Runs the server on its own task.
    pub fn spawn(self) -> Handle {
        let (stop, mut stopped) = watch::channel(false);
        let subscribers = self.ctx.subscribers.clone();
        let task = tokio::spawn(self.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        Handle {
            stop,
            task,
            subscribers,
        }
    }

    /// Serves until `shutdown` completes, then closes every connection.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut listener = self.listener;
        let local = listener.local_addr();
        info!(addr = %local, "WebSocket door listening");
        let (closing, _) = watch::channel(false);
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                c = listener.accept() => {
                    let ctx = self.ctx.clone();
                    let mqtt = self.mqtt.clone();
                    conns.spawn(accept(Box::new(Accepted {
                        stream: c.stream,
                        peer: c.peer,
                        tls_identity: c.tls_identity,
                        ctx,
                        mqtt,
                        closing: closing.subscribe(),
                    })));
                },
                Some(_) = conns.join_next() => {}
                _ = &mut shutdown => break,
            }
        }
        drop(listener);
        closing.send_replace(true);
        while conns.join_next().await.is_some() {}
        info!(addr = %local, "WebSocket door stopped");
    }
}

/// An accepted socket and what its upgrade needs: one boxed argument, for the
/// reason given at [`connection::Upgraded`].
struct Accepted<B> {
    stream: Stream,
    peer: SocketAddr,
    tls_identity: Option<String>,
    ctx: Arc<Context<B>>,
    mqtt: Option<Arc<dyn StreamHandler>>,
    closing: watch::Receiver<bool>,
}

/// A connection's task: the upgrade (boxed: what it needs is dropped before
/// the connection is served instead of staying in the task for its life), then
/// the door it asked for.
async fn accept<B: MessagingApi + 'static>(accepted: Box<Accepted<B>>) {
    if let Some(upgraded) = Box::pin(open(accepted)).await {
        connection::serve(upgraded).await
    }
}

/// Upgrades an accepted socket: a `/v1/ws` connection to serve, or `None` when
/// the upgrade was refused or the connection went to the MQTT door.
async fn open<B: MessagingApi + 'static>(
    accepted: Box<Accepted<B>>,
) -> Option<Box<connection::Upgraded<B>>> {
    let Accepted {
        mut stream,
        peer,
        tls_identity,
        ctx,
        mqtt,
        closing,
    } = *{ accepted };
    let upgrade = read_upgrade(&mut stream, peer, &tls_identity, &ctx, &mqtt).await?;
    let max = ctx.settings.max_message_size;
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let ws = WebSocketStream::from_partially_read(stream, upgrade.rest, Role::Server, Some(config))
        .await;
    debug!(%peer, door = ?upgrade.door, protocol = ?upgrade.protocol, "upgraded");
    match upgrade.door {
        Door::Json => {
            // Counted after the upgrade so a browser sees why (1013 and a reason)
            // instead of a failed handshake it cannot read.
            let Some(slot) = ctx.conn_limit.admit(peer.ip()) else {
                connection::refuse_over_limit(ws, peer).await;
                return None;
            };
            Some(Box::new(connection::Upgraded {
                ws,
                ctx,
                opened: connection::Opened {
                    peer,
                    tls_identity,
                    token_required: upgrade.token_required,
                    grant: upgrade.grant,
                    expires_at: upgrade.expires_at,
                    _slot: slot,
                },
                closing,
            }))
        }
        Door::Mqtt => {
            if let Some(handler) = mqtt {
                handler.serve(WsByteStream::new(ws, closing), peer, tls_identity);
            }
            None
        }
    }
}

/// Reads the upgrade request and answers it: the accepted upgrade, or `None`
/// once a refusal has been sent.
async fn read_upgrade<B: MessagingApi + 'static>(
    stream: &mut Stream,
    peer: SocketAddr,
    tls_identity: &Option<String>,
    ctx: &Context<B>,
    mqtt: &Option<Arc<dyn StreamHandler>>,
) -> Option<handshake::Upgrade> {
    let head =
        match tokio::time::timeout(ctx.settings.handshake_timeout, handshake::read_head(stream))
            .await
        {
            Ok(Ok(head)) => head,
            Ok(Err(refusal)) => {
                handshake::refuse(stream, &refusal).await;
                return None;
            }
            Err(_) => {
                handshake::refuse(stream, &Refusal::timeout()).await;
                return None;
            }
        };
    let (upgrade, answer) = match handshake::accept(
        &head,
        peer,
        tls_identity.as_deref(),
        &*ctx.auth,
        mqtt.is_some(),
    )
    .and_then(|ok| match handshake::origin(&head, &ctx.origins) {
        OriginCheck::Refused => Err(Refusal::forbidden_origin()),
        OriginCheck::None | OriginCheck::Allowed => Ok(ok),
    }) {
        Ok(ok) => ok,
        Err(refusal) => {
            debug!(%peer, ?refusal, "upgrade refused");
            handshake::refuse(stream, &refusal).await;
            return None;
        }
    };
    stream.write_all(&answer).await.ok()?;
    Some(upgrade)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
    use rocketgate_core::store::{Store, StoreDeps, StoreSettings};

    /// Guards the idle-connection memory of issue #33 (docs/benchmarks.md): an idle
    /// `/v1/ws` connection keeps its connection task and, per subscription, the
    /// subscription's futures, each allocated at its full size. Measured in a
    /// release build (a debug build makes the connection task 32 bytes larger);
    /// the limits are those sizes: a new field or an await with a large future in
    /// these loops shows here first — box it, or raise the limit after measuring
    /// with `rocketgate bench ws --idle --subscribers 1000`.
    #[tokio::test]
    async fn an_idle_connections_futures_stay_small() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            Store::open(
                dir.path(),
                StoreSettings::default(),
                StoreDeps::fixed_usage(0.1),
            )
            .unwrap()
            .0,
        );
        let broker = Arc::new(
            Broker::open(store, BrokerSettings::default(), Arc::new(SystemClock)).unwrap(),
        );
        let (server, _) = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            broker,
            Settings::default(),
            Hooks::default(),
        )
        .await
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (sock, peer) = listener.accept().await.unwrap();
        let (_closing, closing) = watch::channel(false);
        let task = accept(Box::new(Accepted {
            stream: Stream::Plain(sock),
            peer,
            tls_identity: None,
            ctx: server.ctx.clone(),
            mqtt: None,
            closing,
        }));
        let mut sizes = vec![("connection task", std::mem::size_of_val(&task))];
        sizes.extend(crate::subscription::idle_future_sizes(&server.ctx.broker));
        let limits = [
            // 1,480 bytes in a debug build on 2026-12-07 (2,400 before the
            // arguments were boxed and the upgrade moved out of the task): tokio's
            // cell adds 104 and rounds to 128, so up to 1,688 stays in mimalloc's
            // 1,792-byte class (it was in the 2,560 one).
            ("connection task", 1_792 - 104),
            ("subscription task", 816),
            // The loop holds the topic wait that replaced a waiting pull per
            // queue (+104 bytes, four 800-byte pulls fewer); the clustering
            // loop no longer carries a dead-letter send (boxed in `pop`).
            ("broadcasting loop", 1_248),
            ("clustering loop", 1_752),
            ("waiting pull", 800),
        ];
        for ((what, size), (_, limit)) in sizes.iter().zip(limits) {
            assert!(
                *size <= limit,
                "the {what} future is {size} bytes, above {limit}: {sizes:?}"
            );
        }
    }
}
