//! Shared set-up: a real broker on a temp dir behind the WebSocket door, and a
//! small JSON client over tokio-tungstenite.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use rocketgate_core::broker::{Broker, BrokerSettings, MessagingApi, SystemClock, TopicConfig};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};
use rocketgate_websocket::{Handle, Hooks, Server, Settings};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

/// How long any "eventually" wait lasts before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

pub struct Env {
    pub dir: tempfile::TempDir,
    pub broker: Arc<Broker>,
    pub addr: SocketAddr,
    pub handle: Option<Handle>,
}

pub fn store_options() -> StoreSettings {
    StoreSettings {
        segment_size: 4 << 20,
        max_message_size: 1 << 20,
        flush: FlushMode::Async {
            interval: Duration::from_millis(10),
        },
        checkpoint_interval: Duration::from_millis(50),
        retention_check_interval: Duration::from_secs(3600),
        consume_queue_entries_per_file: 1024,
        index_slots: 256,
        index_entries_per_file: 4096,
        ..StoreSettings::default()
    }
}

pub fn open_broker(dir: &std::path::Path) -> Arc<Broker> {
    let store = Arc::new(
        Store::open(dir, store_options(), StoreDeps::fixed_usage(0.1))
            .unwrap()
            .0,
    );
    Arc::new(Broker::open(store, BrokerSettings::default(), Arc::new(SystemClock)).unwrap())
}

impl Env {
    pub async fn start() -> Env {
        Env::with(Settings::default(), Hooks::default()).await
    }

    /// For pages served from `http://127.0.0.1:<any port>` (`ws.allowed_origins`).
    #[allow(dead_code)]
    pub async fn for_pages() -> Env {
        let settings = Settings {
            allowed_origins: vec!["http://127.0.0.1:*".into()],
            ..Settings::default()
        };
        Env::with(settings, Hooks::default()).await
    }

    pub async fn with(settings: Settings, hooks: Hooks) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let broker = open_broker(dir.path());
        let (server, addr) = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            broker.clone(),
            settings,
            hooks,
        )
        .await
        .unwrap();
        Env {
            dir,
            broker,
            addr,
            handle: Some(server.spawn()),
        }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/v1/ws", self.addr)
    }

    pub async fn topic(&self, name: &str, queues: u32) {
        self.broker
            .create_topic(TopicConfig::new(name, queues))
            .await
            .unwrap();
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.url()).await
    }

    pub async fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop().await;
        }
    }
}

pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_req: u64,
    /// Frames that arrived while a call waited for its answer, in order.
    stashed: std::collections::VecDeque<Value>,
}

impl Client {
    pub async fn connect(url: &str) -> Client {
        let (ws, _) = tokio::time::timeout(WAIT, connect_async(url))
            .await
            .unwrap()
            .unwrap();
        Client {
            ws,
            next_req: 0,
            stashed: Default::default(),
        }
    }

    pub async fn send(&mut self, v: Value) {
        self.ws.send(Message::text(v.to_string())).await.unwrap();
    }

    /// The next JSON frame (control frames skipped).
    pub async fn recv(&mut self) -> Value {
        if let Some(v) = self.stashed.pop_front() {
            return v;
        }
        self.recv_new().await
    }

    async fn recv_new(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame in time")
                .expect("the connection is open")
                .expect("a good frame");
            match msg {
                Message::Text(t) => return serde_json::from_str(&t).unwrap(),
                Message::Close(c) => panic!("closed by the server: {c:?}"),
                _ => continue,
            }
        }
    }

    /// The close frame the server ends with (other frames skipped).
    pub async fn closed(&mut self) -> Option<(u16, String)> {
        loop {
            match tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a close in time")
            {
                Some(Ok(Message::Close(c))) => {
                    return c.map(|c| (u16::from(c.code), c.reason.to_string()));
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// Sends a request with a fresh `req` id and returns the frame that answers it;
    /// frames that arrive first (such as messages) are returned in `others` and
    /// also kept for later `recv`s.
    pub async fn call(&mut self, mut v: Value) -> (Value, Vec<Value>) {
        self.next_req += 1;
        let id = format!("r{}", self.next_req);
        v["req"] = json!(id);
        self.send(v).await;
        let mut others = Vec::new();
        loop {
            let f = self.recv_new().await;
            if f["req"] == json!(id) {
                return (f, others);
            }
            others.push(f.clone());
            self.stashed.push_back(f);
        }
    }

    /// A ping round trip: every earlier request has been processed when it returns.
    pub async fn barrier(&mut self) -> Vec<Value> {
        let (pong, others) = self.call(json!({"op": "ping"})).await;
        assert_eq!(pong["type"], "pong");
        others
    }

    pub async fn subscribe(&mut self, v: Value) -> Value {
        let mut v = v;
        v["op"] = json!("subscribe");
        let (answer, _) = self.call(v).await;
        assert_eq!(answer["type"], "subscribed", "{answer}");
        answer
    }

    pub async fn publish(&mut self, topic: &str, body: &str) -> Value {
        let (answer, _) = self
            .call(json!({"op": "publish", "topic": topic, "body": body}))
            .await;
        assert_eq!(answer["type"], "send_result", "{answer}");
        answer
    }

    /// The next `n` message frames (anything else is a test failure).
    pub async fn messages(&mut self, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < n {
            let f = self.recv().await;
            assert_eq!(f["type"], "message", "{f}");
            out.push(f);
        }
        out
    }
}

pub fn bodies(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .map(|f| f["body"].as_str().unwrap().to_owned())
        .collect()
}
