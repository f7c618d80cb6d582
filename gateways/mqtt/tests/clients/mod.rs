//! rumqttc clients for the tests: each runs its event loop in a task and hands
//! incoming packets over a channel.

#![allow(dead_code)]

use std::time::Duration;

use crate::support::{Node, WAIT};
use rumqttc::v5 as c5;
use rumqttc::v5::mqttbytes::v5 as p5;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A v3.1.1 client: its handle, the incoming packets, the event-loop task.
pub struct V4 {
    pub client: rumqttc::AsyncClient,
    pub rx: mpsc::UnboundedReceiver<rumqttc::Packet>,
    pub task: JoinHandle<()>,
}

pub fn v4(node: &Node, id: &str, clean: bool) -> V4 {
    let mut o = rumqttc::MqttOptions::new(id, "127.0.0.1", node.port());
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(clean);
    v4_with(o)
}

pub fn v4_with(o: rumqttc::MqttOptions) -> V4 {
    let (client, mut el) = rumqttc::AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(rumqttc::Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    V4 { client, rx, task }
}

impl V4 {
    pub async fn next<T>(&mut self, mut f: impl FnMut(rumqttc::Packet) -> Option<T>) -> T {
        tokio::time::timeout(WAIT, async {
            loop {
                let p = self.rx.recv().await.expect("client event loop ended");
                if let Some(t) = f(p) {
                    return t;
                }
            }
        })
        .await
        .expect("timed out waiting for a packet")
    }

    pub async fn connack(&mut self) -> bool {
        self.next(|p| match p {
            rumqttc::Packet::ConnAck(a) => Some(a.session_present),
            _ => None,
        })
        .await
    }

    pub async fn subscribe(&mut self, filter: &str, qos: rumqttc::QoS) {
        self.client.subscribe(filter, qos).await.unwrap();
        self.next(|p| matches!(p, rumqttc::Packet::SubAck(_)).then_some(()))
            .await;
    }

    pub async fn publish(&mut self) -> rumqttc::Publish {
        self.next(|p| match p {
            rumqttc::Packet::Publish(p) => Some(p),
            _ => None,
        })
        .await
    }
}

pub struct V5 {
    pub client: c5::AsyncClient,
    pub rx: mpsc::UnboundedReceiver<p5::Packet>,
    pub task: JoinHandle<()>,
}

/// The shared subscription the shared-subscription tests' members hold.
pub const SHARE_FILTER: &str = "$share/workers/jobs/#";

/// A v5 client connected and subscribed to [`SHARE_FILTER`] at QoS 1.
pub async fn share_member(node: &Node, id: &str) -> V5 {
    let mut m = v5_with(v5_opts(node, id));
    m.connack().await;
    m.subscribe(SHARE_FILTER, c5::mqttbytes::QoS::AtLeastOnce, None)
        .await;
    m
}

pub fn v5_opts(node: &Node, id: &str) -> c5::MqttOptions {
    let mut o = c5::MqttOptions::new(id, "127.0.0.1", node.port());
    o.set_keep_alive(Duration::from_secs(30));
    o
}

pub fn v5_with(o: c5::MqttOptions) -> V5 {
    let (client, mut el) = c5::AsyncClient::new(o, 100);
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(c5::Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(c5::ConnectionError::MqttState(c5::StateError::ServerDisconnect {
                    reason_code,
                    ..
                })) => {
                    // rumqttc reports a server DISCONNECT as an error: pass it on.
                    let _ = tx.send(p5::Packet::Disconnect(p5::Disconnect {
                        reason_code,
                        properties: None,
                    }));
                    return;
                }
                Err(_) => return,
            }
        }
    });
    V5 { client, rx, task }
}

impl V5 {
    /// Sends DISCONNECT and waits until the server has closed the connection:
    /// it has then handled the DISCONNECT (session offline, shared groups left).
    /// `client.disconnect()` alone only queues the packet in the client: until
    /// the server reads it, the connection still takes messages (and the client
    /// acknowledges them), which a test of "published while away" must not race.
    pub async fn disconnect_and_wait(&mut self) {
        self.client.disconnect().await.unwrap();
        let _ = tokio::time::timeout(WAIT, &mut self.task).await;
    }

    pub async fn next<T>(&mut self, mut f: impl FnMut(p5::Packet) -> Option<T>) -> T {
        tokio::time::timeout(WAIT, async {
            loop {
                let p = self.rx.recv().await.expect("client event loop ended");
                if let Some(t) = f(p) {
                    return t;
                }
            }
        })
        .await
        .expect("timed out waiting for a packet")
    }

    pub async fn connack(&mut self) -> p5::ConnAck {
        self.next(|p| match p {
            p5::Packet::ConnAck(a) => Some(a),
            _ => None,
        })
        .await
    }

    pub async fn subscribe(
        &mut self,
        filter: &str,
        qos: rumqttc::v5::mqttbytes::QoS,
        id: Option<usize>,
    ) {
        let props = p5::SubscribeProperties {
            id,
            user_properties: Vec::new(),
        };
        self.client
            .subscribe_with_properties(filter, qos, props)
            .await
            .unwrap();
        self.next(|p| matches!(p, p5::Packet::SubAck(_)).then_some(()))
            .await;
    }

    pub async fn publish(&mut self) -> p5::Publish {
        self.next(|p| match p {
            p5::Packet::Publish(p) => Some(p),
            _ => None,
        })
        .await
    }
}

pub fn topic_of(p: &p5::Publish) -> String {
    String::from_utf8(p.topic.to_vec()).unwrap()
}

pub fn filter(path: &str, rap: bool, rule: p5::RetainForwardRule) -> p5::Filter {
    p5::Filter {
        path: path.into(),
        qos: rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        nolocal: false,
        preserve_retain: rap,
        retain_forward_rule: rule,
    }
}

impl V5 {
    pub async fn subscribe_filter(&mut self, f: p5::Filter) {
        self.client.subscribe_many(vec![f]).await.unwrap();
        self.next(|p| matches!(p, p5::Packet::SubAck(_)).then_some(()))
            .await;
    }
}
