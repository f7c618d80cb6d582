//! A broker over a small store in a temp dir with the MQTT server in front of it,
//! restartable on the same directory; raw-socket and rumqttc helpers.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use mqttbytes::v5;
use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};
use rocketgate_mqtt::{Handle, Server, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const WAIT: Duration = Duration::from_secs(20);

pub struct Node {
    pub dir: PathBuf,
    pub store: Arc<Store>,
    pub broker: Arc<Broker>,
    pub handle: Handle<Broker>,
    pub addr: SocketAddr,
}

pub fn store_options() -> StoreSettings {
    StoreSettings {
        segment_size: 1024 * 1024,
        max_message_size: 64 * 1024,
        flush: FlushMode::Async {
            interval: Duration::from_millis(10),
        },
        checkpoint_interval: Duration::from_millis(50),
        retention_check_interval: Duration::from_secs(3600),
        consume_queue_entries_per_file: 1024,
        index_slots: 256,
        index_entries_per_file: 1024,
        ..StoreSettings::default()
    }
}

pub fn settings(dir: &Path) -> Settings {
    let mut s = Settings::new(dir.join("mqtt"));
    s.max_packet_size = 32 * 1024;
    s.topic_poll = Duration::from_millis(100);
    s
}

impl Node {
    pub async fn start(dir: &Path) -> Node {
        Node::start_with(dir, settings(dir)).await
    }

    pub async fn start_with(dir: &Path, settings: Settings) -> Node {
        Node::start_on(dir, settings, StoreDeps::fixed_usage(0.1)).await
    }

    /// A node whose store uses `deps` (e.g. file operations with faults injected).
    pub async fn start_on(dir: &Path, settings: Settings, deps: StoreDeps) -> Node {
        let store = Arc::new(Store::open(dir, store_options(), deps).unwrap().0);
        let broker = Arc::new(
            Broker::open(
                store.clone(),
                BrokerSettings::default(),
                Arc::new(SystemClock),
            )
            .unwrap(),
        );
        let (server, addr) = Server::bind("127.0.0.1:0".parse().unwrap(), broker.clone(), settings)
            .await
            .unwrap();
        Node {
            dir: dir.to_owned(),
            store,
            broker,
            handle: server.spawn(),
            addr,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Stops the server, closes broker and store (a clean shutdown).
    pub async fn stop(self) {
        self.handle.stop().await;
        let broker = self.broker;
        let store = self.store;
        tokio::task::spawn_blocking(move || {
            broker.close().unwrap();
            drop(broker);
            store.close().unwrap();
        })
        .await
        .unwrap();
    }

    pub async fn restart(self) -> Node {
        let dir = self.dir.clone();
        self.stop().await;
        Node::start(&dir).await
    }
}

/// Every entry of the MQTT state topic so far: (header JSON, body).
pub async fn state_entries(node: &Node) -> Vec<(String, Vec<u8>)> {
    use rocketgate_core::broker::{MessagingApi, PullRequest, filter::Filter};
    use rocketgate_core::store::record::RecordView;
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let r = node
            .broker
            .pull(PullRequest {
                group: "test%state".into(),
                member: String::new(),
                topic: "rmq_sys_rg_door_mqtt_state".into(),
                queue_id: 0,
                offset: at,
                max_messages: 256,
                filter: Filter::all(),
                wait: Duration::ZERO,
            })
            .await
            .unwrap();
        if r.messages.is_empty() {
            return out;
        }
        for m in &r.messages {
            let v = RecordView::parse(&m.record).unwrap();
            let h = v
                .properties()
                .find(|(k, _)| *k == "mqtt.state")
                .map(|(_, v)| v.to_owned())
                .unwrap_or_default();
            out.push((h, v.body().to_vec()));
        }
        at = r.next_offset;
    }
}

/// A raw MQTT 5 / 3.1.1 connection for protocol-level tests.
pub struct Raw {
    pub sock: TcpStream,
    pub buf: BytesMut,
    pub v5: bool,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw {
            sock: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            v5: true,
        }
    }

    pub async fn send(&mut self, p: v5::Packet) {
        let mut out = BytesMut::new();
        match p {
            v5::Packet::Connect(c) => c.write(&mut out),
            v5::Packet::Publish(c) => c.write(&mut out),
            v5::Packet::Subscribe(c) => c.write(&mut out),
            v5::Packet::PubAck(c) => c.write(&mut out),
            v5::Packet::PubRec(c) => c.write(&mut out),
            v5::Packet::PubRel(c) => c.write(&mut out),
            v5::Packet::PubComp(c) => c.write(&mut out),
            v5::Packet::Unsubscribe(c) => c.write(&mut out),
            v5::Packet::PingReq => v5::PingReq.write(&mut out),
            v5::Packet::Disconnect(c) => c.write(&mut out),
            other => panic!("not a client packet: {other:?}"),
        }
        .unwrap();
        self.send_bytes(&out).await;
    }

    pub async fn send_bytes(&mut self, b: &[u8]) {
        self.sock.write_all(b).await.unwrap();
    }

    /// The next packet, or `None` when the server closed the connection.
    pub async fn recv(&mut self) -> Option<v5::Packet> {
        tokio::time::timeout(WAIT, async {
            loop {
                if !self.buf.is_empty() {
                    let before = self.buf.clone();
                    match v5::read(&mut self.buf, 1 << 20) {
                        Ok(p) => return Some(p),
                        Err(mqttbytes::Error::InsufficientBytes(_)) => {}
                        Err(e) => panic!("bad packet from the server: {e:?} in {:?}", &before[..]),
                    }
                }
                match self.sock.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("no packet from the server in time")
    }

    /// Connects as a v5 client and returns the CONNACK.
    pub async fn connect_v5(
        addr: SocketAddr,
        client_id: &str,
        props: Option<v5::ConnectProperties>,
    ) -> (Raw, v5::ConnAck) {
        let mut raw = Raw::connect(addr).await;
        let mut c = v5::Connect::new(client_id);
        c.keep_alive = 60;
        c.properties = props;
        raw.send(v5::Packet::Connect(c)).await;
        match raw.recv().await {
            Some(v5::Packet::ConnAck(a)) => (raw, a),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    /// Waits for the server's DISCONNECT (or the close) and returns its reason.
    pub async fn disconnect_reason(&mut self) -> Option<v5::DisconnectReasonCode> {
        loop {
            match self.recv().await {
                Some(v5::Packet::Disconnect(d)) => return Some(d.reason_code),
                Some(_) => continue,
                None => return None,
            }
        }
    }
}

pub fn connect_props() -> v5::ConnectProperties {
    v5::ConnectProperties {
        session_expiry_interval: None,
        receive_maximum: None,
        max_packet_size: None,
        topic_alias_max: None,
        request_response_info: None,
        request_problem_info: None,
        user_properties: Vec::new(),
        authentication_method: None,
        authentication_data: None,
    }
}
