//! Shared by the integration tests: a real broker and native server on 127.0.0.1:0, and
//! a raw remoting connection built on the crate's own codec.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
use rocketgate_core::store::{DiskSpace, Store, StoreDeps, StoreSettings};
use rocketgate_native::{Server, ServerHandle, ServerSettings};
use rocketgate_remoting::codec::{FLAG_ONEWAY, FrameCodec, RemotingCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const WAIT: Duration = Duration::from_secs(20);

pub struct Node {
    pub addr: SocketAddr,
    pub broker: Arc<Broker>,
    pub server: Option<ServerHandle>,
    _dir: tempfile::TempDir,
}

pub struct Options {
    pub auto_create: bool,
    pub flush: Option<rocketgate_core::store::FlushMode>,
    pub settings: ServerSettings,
    pub disk: Option<Arc<dyn DiskSpace>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            auto_create: true,
            flush: None,
            settings: ServerSettings::default(),
            disk: None,
        }
    }
}

impl Node {
    pub async fn start() -> Node {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(opts: Options) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let mut deps = StoreDeps::fixed_usage(0.1);
        if let Some(d) = opts.disk {
            deps.disk = d;
        }
        let mut store_opts = StoreSettings {
            segment_size: 16 << 20,
            ..StoreSettings::default()
        };
        if let Some(f) = opts.flush {
            store_opts.flush = f;
        }
        let (store, _) = Store::open(dir.path(), store_opts.clone(), deps).unwrap();
        let broker = Broker::open(
            Arc::new(store),
            BrokerSettings {
                auto_create_topics: opts.auto_create,
                ..BrokerSettings::default()
            },
            Arc::new(SystemClock),
        )
        .unwrap();
        let broker = Arc::new(broker);
        broker.spawn_delay_delivery();
        let settings = ServerSettings {
            store_host: store_opts.store_host,
            ..opts.settings
        };
        let (server, addr) = Server::bind("127.0.0.1:0".parse().unwrap(), broker.clone(), settings)
            .await
            .unwrap();
        Node {
            addr,
            broker,
            server: Some(server.spawn()),
            _dir: dir,
        }
    }

    /// Waits until every stored message is in its consume queue (dispatch is
    /// asynchronous; a pull right after a send may not see it yet).
    pub async fn settle(&self) {
        let b = self.broker.clone();
        let done = tokio::task::spawn_blocking(move || b.store().wait_dispatched(WAIT))
            .await
            .unwrap();
        assert!(done, "dispatch caught up");
    }

    pub async fn conn(&self) -> Conn {
        Conn::connect(self.addr).await
    }
}

/// One raw connection: requests out, responses matched by opaque, pushed requests kept.
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    next: i32,
    pub pushed: Vec<RemotingCommand>,
    pub early: Vec<RemotingCommand>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Conn {
        Conn {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            next: 1,
            pushed: Vec::new(),
            early: Vec::new(),
        }
    }

    /// Sends without waiting; returns the opaque.
    pub async fn send(&mut self, mut cmd: RemotingCommand) -> i32 {
        cmd.opaque = self.next;
        self.next += 1;
        let mut out = BytesMut::new();
        FrameCodec::default().encode(&cmd, &mut out).unwrap();
        self.stream.write_all(&out).await.unwrap();
        cmd.opaque
    }

    pub async fn oneway(&mut self, mut cmd: RemotingCommand) {
        cmd.flag |= FLAG_ONEWAY;
        self.send(cmd).await;
    }

    /// Next frame from the server (None: closed).
    pub async fn frame(&mut self) -> Option<RemotingCommand> {
        loop {
            if let Some(c) = FrameCodec::default().decode(&mut self.buf).unwrap() {
                return Some(c);
            }
            let n = tokio::time::timeout(WAIT, self.stream.read_buf(&mut self.buf))
                .await
                .expect("the server answers")
                .unwrap_or(0);
            if n == 0 {
                return None;
            }
        }
    }

    /// Waits for the response with `opaque`.
    pub async fn response(&mut self, opaque: i32) -> RemotingCommand {
        if let Some(i) = self.early.iter().position(|c| c.opaque == opaque) {
            return self.early.remove(i);
        }
        loop {
            let c = self.frame().await.expect("connection open");
            if !c.is_response() {
                self.pushed.push(c);
            } else if c.opaque == opaque {
                return c;
            } else {
                self.early.push(c);
            }
        }
    }

    pub async fn ask(&mut self, cmd: RemotingCommand) -> RemotingCommand {
        let o = self.send(cmd).await;
        self.response(o).await
    }

    /// Waits until a request with `code` has been pushed to us.
    pub async fn pushed(&mut self, code: i32) -> RemotingCommand {
        loop {
            if let Some(i) = self.pushed.iter().position(|c| c.code == code) {
                return self.pushed.remove(i);
            }
            let c = self.frame().await.expect("connection open");
            if c.is_response() {
                self.early.push(c);
            } else {
                self.pushed.push(c);
            }
        }
    }

    pub async fn raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }
}

/// Where the native server's "topics changed" signal reaches the registrar once it runs.
type Kick = Arc<std::sync::Mutex<Option<Box<dyn Fn() + Send + Sync>>>>;

/// A whole cluster in-process: NameServer + broker + native server, registered.
pub struct Cluster {
    pub namesrv: String,
    pub broker_addr: SocketAddr,
    pub broker: Arc<Broker>,
    servers: std::sync::Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    /// The broker's registration with the NameServer, until [`Cluster::register`].
    registrar: std::sync::Mutex<Option<(rocketgate_remoting::Registrar, Kick)>>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub async fn start() -> Cluster {
        Cluster::start_with_auth(rocketgate_auth::Auth::disabled()).await
    }

    /// A cluster whose broker checks signatures and the ACL with `auth`.
    pub async fn start_with_auth(auth: Arc<rocketgate_auth::Auth>) -> Cluster {
        let cluster = Cluster::start_unregistered(auth).await;
        cluster.register();
        cluster
    }

    /// Registers the broker with the NameServer (once; later calls do nothing).
    pub fn register(&self) {
        if let Some((registrar, kick)) = self.registrar.lock().unwrap().take() {
            let handle = registrar.spawn();
            *kick.lock().unwrap() = Some(Box::new(handle.trigger()));
            self.servers.lock().unwrap().push(Box::new(handle));
        }
    }

    /// A cluster whose broker the NameServer does not know until [`Cluster::register`]
    /// (a broker still starting).
    pub async fn start_unregistered(auth: Arc<rocketgate_auth::Auth>) -> Cluster {
        use rocketgate_namesrv::{NameServer, NamesrvSettings};
        use rocketgate_remoting::protocol::WireTopicConfig as WireTopic;
        use rocketgate_remoting::{BrokerIdentity, Registrar};

        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let broker_addr = listener.local_addr().unwrap();
        let store_opts = StoreSettings {
            segment_size: 16 << 20,
            store_host: broker_addr,
            ..StoreSettings::default()
        };
        let (store, _) = Store::open(dir.path(), store_opts, StoreDeps::fixed_usage(0.1)).unwrap();
        let broker = Arc::new(
            Broker::open(
                Arc::new(store),
                BrokerSettings {
                    member_timeout: Duration::from_secs(30),
                    transaction_check_interval: Duration::from_millis(300),
                    transaction_timeout: Duration::from_millis(300),
                    ..BrokerSettings::default()
                },
                Arc::new(SystemClock),
            )
            .unwrap(),
        );
        broker.spawn_delay_delivery();
        broker.spawn_transaction_checks();
        let (ns, ns_addr) =
            NameServer::bind("127.0.0.1:0".parse().unwrap(), NamesrvSettings::default())
                .await
                .unwrap();
        let ns = ns.spawn();
        let b = broker.clone();
        let topics = move || {
            b.route_snapshot()
                .into_iter()
                .map(|t| {
                    let mut w = WireTopic::new(t.name, t.write_queues);
                    w.read_queue_nums = t.read_queues;
                    w.perm = u32::from(t.perm.0);
                    w
                })
                .collect::<Vec<_>>()
        };
        let registrar = Registrar::new(
            BrokerIdentity {
                cluster: "DefaultCluster".into(),
                name: "broker-a".into(),
                id: 0,
                addr: broker_addr.to_string(),
                ha_addr: String::new(),
            },
            vec![ns_addr.to_string()],
            Duration::from_secs(30),
            Arc::new(topics),
        );
        let settings = ServerSettings {
            store_host: broker_addr,
            auth,
            ..ServerSettings::default()
        };
        let (server, _) = Server::from_listener(listener, broker.clone(), settings).unwrap();
        // Re-registers at once when topics change, once the registrar runs.
        let kick: Kick = Arc::default();
        let k = kick.clone();
        let server = server
            .on_topics_changed(Arc::new(move || {
                if let Some(f) = k.lock().unwrap().as_ref() {
                    f();
                }
            }))
            .spawn();
        Cluster {
            namesrv: ns_addr.to_string(),
            broker_addr,
            broker,
            servers: std::sync::Mutex::new(vec![Box::new(server), Box::new(ns)]),
            registrar: std::sync::Mutex::new(Some((registrar, kick))),
            _dir: dir,
        }
    }

    pub fn config(&self) -> rocketgate_native::client::ClientSettings {
        rocketgate_native::client::ClientSettings::new([self.namesrv.clone()])
            .with_route_refresh(Duration::from_secs(1))
            .with_heartbeat_interval(Duration::from_secs(1))
    }
}

/// Waits (up to [`WAIT`]) until `f` holds, checking whenever `changed` is notified or
/// every 50 ms.
pub async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
