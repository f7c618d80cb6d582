//! Shared set-up for the HTTP tests: a real broker on a temp dir, the HTTP
//! gateway on 127.0.0.1:0, and two clients: hyper over the socket, and `curl`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
use rocketgate_core::store::{DiskSpace, FlushMode, Store, StoreDeps, StoreSettings};
use rocketgate_http::{Handle, Server, Settings, StoreProbe};
use serde_json::Value;

pub const MAX_BODY: usize = 64 * 1024;
pub const HARD_RATIO: f64 = 0.9;

/// A disk whose usage the test sets (percent).
pub struct Gauge(pub AtomicU64);

impl DiskSpace for Gauge {
    fn usage_ratio(&self, _: &Path) -> std::io::Result<f64> {
        Ok(self.0.load(Ordering::SeqCst) as f64 / 100.0)
    }
}

pub struct Node {
    pub dir: tempfile::TempDir,
    pub store: Arc<Store>,
    pub broker: Arc<Broker>,
    pub disk: Arc<Gauge>,
    pub addr: SocketAddr,
    pub settings: Settings,
    handle: Option<Handle>,
}

pub fn settings() -> Settings {
    Settings {
        max_body: MAX_BODY,
        max_wait: Duration::from_secs(30),
        ..Settings::default()
    }
}

pub fn broker_options() -> BrokerSettings {
    BrokerSettings {
        default_queues: 2,
        ..BrokerSettings::default()
    }
}

pub async fn start() -> Node {
    start_with(settings(), broker_options()).await
}

pub async fn start_with(settings: Settings, opts: BrokerSettings) -> Node {
    start_on(settings, opts, rocketgate_core::store::io::Files::os()).await
}

/// A node whose store uses `files` (file operations with faults injected).
pub async fn start_on(
    settings: Settings,
    opts: BrokerSettings,
    files: rocketgate_core::store::io::Files,
) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(Gauge(AtomicU64::new(10)));
    let store_opts = StoreSettings {
        segment_size: 4 << 20,
        max_message_size: MAX_BODY,
        flush: FlushMode::Async {
            interval: Duration::from_millis(10),
        },
        checkpoint_interval: Duration::from_millis(100),
        retention_check_interval: Duration::from_secs(3600),
        disk_hard_ratio: HARD_RATIO,
        disk_soft_ratio: 0.85,
        consume_queue_entries_per_file: 1024,
        index_slots: 1024,
        index_entries_per_file: 4096,
        ..StoreSettings::default()
    };
    let deps = StoreDeps {
        disk: disk.clone(),
        files,
        ..StoreDeps::fixed_usage(0.1)
    };
    let store = Arc::new(Store::open(dir.path(), store_opts, deps).unwrap().0);
    let broker = Arc::new(Broker::open(store.clone(), opts, Arc::new(SystemClock)).unwrap());
    broker.spawn_delay_delivery();
    let (handle, addr) = gateway(&broker, &store, settings.clone()).await;
    Node {
        dir,
        store,
        broker,
        disk,
        addr,
        settings,
        handle: Some(handle),
    }
}

/// Another gateway instance over the same broker (stateless consumers).
pub async fn gateway(
    broker: &Arc<Broker>,
    store: &Arc<Store>,
    settings: Settings,
) -> (Handle, SocketAddr) {
    let probe = Arc::new(StoreProbe::new(store.clone(), HARD_RATIO));
    let (server, addr) = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        broker.clone(),
        probe,
        settings,
    )
    .await
    .unwrap();
    (server.spawn(), addr)
}

impl Node {
    pub async fn stop(mut self) {
        if let Some(h) = self.handle.take() {
            h.stop().await;
        }
        self.broker.close().unwrap();
        self.store.close().unwrap();
    }

    /// Sets the disk usage (percent) and lets the store notice.
    pub fn set_disk(&self, percent: u64) {
        self.disk.0.store(percent, Ordering::SeqCst);
        self.store.run_retention().unwrap();
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts an error answer: this status, this code, the JSON error shape.
    pub fn expect_error(&self, status: u16, code: &str) -> Value {
        let v = self.json();
        assert_eq!(self.status, status, "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        v
    }
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> hyper::Response<Incoming> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    sender
        .send_request(req.body(Full::new(body)).unwrap())
        .await
        .unwrap()
}

/// One request on a fresh connection; the whole answer.
pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Resp {
    let resp = send(addr, method, path, headers, body.into()).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Resp {
        status,
        headers,
        body,
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    call(addr, "GET", path, &[], Bytes::new()).await
}

pub async fn post_json(addr: SocketAddr, path: &str, body: Value) -> Resp {
    call(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

pub async fn patch_json(addr: SocketAddr, path: &str, body: Value) -> Resp {
    call(
        addr,
        "PATCH",
        path,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

/// Publishes `body` to `topic` with the query string `query`; asserts 201.
pub async fn publish(addr: SocketAddr, topic: &str, query: &str, body: impl Into<Bytes>) -> Value {
    let r = call(
        addr,
        "POST",
        &format!("/v1/topics/{topic}/messages{query}"),
        &[],
        body,
    )
    .await;
    assert_eq!(r.status, 201, "{:?}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// Receives from (group, topic) with the query string `query`; the messages.
pub async fn receive(addr: SocketAddr, group: &str, topic: &str, query: &str) -> Vec<Value> {
    let r = get(
        addr,
        &format!("/v1/groups/{group}/topics/{topic}/messages{query}"),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    r.json()["messages"].as_array().unwrap().clone()
}

/// Receives until `n` messages arrived (each receive long-polls up to 10 s).
pub async fn receive_n(addr: SocketAddr, group: &str, topic: &str, n: usize) -> Vec<Value> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} arrived",
            got.len()
        );
        got.extend(receive(addr, group, topic, "?wait_ms=10000&max=32").await);
    }
    got
}

pub async fn ack(addr: SocketAddr, group: &str, handles: &[&str]) -> Resp {
    post_json(
        addr,
        &format!("/v1/groups/{group}/acks"),
        serde_json::json!({ "receipt_handles": handles }),
    )
    .await
}

/// The body of a received message, decoded.
pub fn body_of(m: &Value) -> Vec<u8> {
    use base64::Engine as _;
    let b = m["body"].as_str().unwrap();
    match m["body_encoding"].as_str().unwrap() {
        "utf8" => b.as_bytes().to_vec(),
        "base64" => base64::engine::general_purpose::STANDARD.decode(b).unwrap(),
        other => panic!("unknown encoding {other}"),
    }
}

/// An SSE stream being read.
pub struct Events {
    body: Incoming,
    buf: String,
}

/// Opens an SSE stream; asserts 200 and `text/event-stream`.
pub async fn events(addr: SocketAddr, path: &str) -> Events {
    let resp = send(
        addr,
        "GET",
        path,
        &[("accept", "text/event-stream")],
        Bytes::new(),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    Events {
        body: resp.into_body(),
        buf: String::new(),
    }
}

impl Events {
    /// The next event that has data: (event name, data as JSON). Waits up to 20 s.
    pub async fn next(&mut self) -> (String, Value) {
        tokio::time::timeout(Duration::from_secs(20), self.next_inner())
            .await
            .expect("an SSE event within 20 s")
    }

    /// The next event with data within `d` (`None`: none came). What was
    /// read of an event not yet whole is kept for the next call.
    pub async fn next_within(&mut self, d: Duration) -> Option<(String, Value)> {
        tokio::time::timeout(d, self.next_inner()).await.ok()
    }

    /// Reads until the server ends the stream.
    pub async fn closed(&mut self) {
        while let Some(frame) = self.body.frame().await {
            if frame.is_err() {
                return;
            }
        }
    }

    async fn next_inner(&mut self) -> (String, Value) {
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut name = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if !data.is_empty() {
                    return (name, serde_json::from_str(&data).unwrap());
                }
            }
            let frame = self.body.frame().await.expect("stream open").unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }
}

/// Runs `curl -sS` with `args`; returns (status, body). The URL is among `args`.
pub fn curl(args: &[&str]) -> (u16, Vec<u8>) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut stdout = out.stdout;
    let nl = stdout.iter().rposition(|b| *b == b'\n').unwrap();
    let status = std::str::from_utf8(&stdout[nl + 1..])
        .unwrap()
        .parse()
        .unwrap();
    stdout.truncate(nl);
    (status, stdout)
}

/// `curl` that runs off the async threads.
pub async fn curl_async(args: Vec<String>) -> (u16, Vec<u8>) {
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(&a)
    })
    .await
    .unwrap()
}
