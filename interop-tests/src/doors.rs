//! The four doors as a test sees them: publish one message through a door, or open a
//! receiver on a door and take messages from it. Each door is driven by a real client:
//! MQTT by `mosquitto_pub` / `mosquitto_sub` (MQTT 5, QoS 1), HTTP by `curl`,
//! WebSocket by `tokio-tungstenite` speaking the `/v1/ws` JSON protocol, native by the
//! project's Rust client (`rocketgate_native::client`).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures_util::{SinkExt, StreamExt};
use rocketgate_native::client::{
    ClientSettings, ConsumeFrom, ConsumeResult, Message as NativeMessage, Producer, PushConsumer,
    PushConsumerSettings, ReceivedMessage,
};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::Node;

/// A door of the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Door {
    Mqtt,
    Http,
    Ws,
    Native,
}

impl fmt::Display for Door {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Door::Mqtt => "MQTT",
            Door::Http => "HTTP",
            Door::Ws => "WebSocket",
            Door::Native => "native",
        })
    }
}

/// What a message looks like on its way in.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub topic: String,
    pub tag: String,
    pub keys: Vec<String>,
    pub properties: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Outgoing {
    /// The matrix message: a tag with a `/` (an MQTT sub-path), two keys, two user
    /// properties and a body with zero bytes and bytes that are not UTF-8.
    pub fn sample(topic: &str) -> Outgoing {
        Outgoing {
            topic: topic.to_string(),
            tag: "room1/temp".to_string(),
            keys: vec!["order-1".to_string(), "user-7".to_string()],
            properties: [("color", "red"), ("size", "9")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: b"\x00\x01rocket\xffgate\xfe\x00\x80\xc3\x28end".to_vec(),
        }
    }

    /// A small text message `n` of a sequence (for the longer scenarios).
    pub fn numbered(topic: &str, n: usize) -> Outgoing {
        Outgoing {
            topic: topic.to_string(),
            tag: "seq".to_string(),
            keys: vec![format!("k{n}")],
            properties: [("n".to_string(), n.to_string())].into_iter().collect(),
            body: format!("message {n}").into_bytes(),
        }
    }
}

/// What came out of a door.
#[derive(Debug, Clone, Default)]
pub struct Got {
    pub topic: String,
    /// The tag, or for MQTT the topic path after the first level.
    pub tag: Option<String>,
    pub keys: Vec<String>,
    pub properties: BTreeMap<String, String>,
    pub body: Vec<u8>,
    /// When the store wrote it (ms; MQTT does not say).
    pub store_timestamp: Option<i64>,
}

/// Which fields a (publisher, consumer) pair can carry end to end.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub keys: bool,
}

impl Expect {
    pub fn between(publisher: Door, consumer: Door) -> Expect {
        Expect {
            keys: publisher.carries_keys() && consumer.carries_keys(),
        }
    }
}

impl Door {
    pub const ALL: [Door; 4] = [Door::Mqtt, Door::Http, Door::Ws, Door::Native];

    pub fn short(self) -> &'static str {
        match self {
            Door::Mqtt => "mqtt",
            Door::Http => "http",
            Door::Ws => "ws",
            Door::Native => "native",
        }
    }

    /// MQTT has no message keys; every other door does.
    pub fn carries_keys(self) -> bool {
        self != Door::Mqtt
    }

    /// Publishes one message and returns once the door acknowledged it as stored.
    pub async fn publish(self, node: &Node, m: &Outgoing) -> anyhow::Result<()> {
        match self {
            Door::Mqtt => mqtt_publish(node, m),
            Door::Http => http_publish(node, m),
            Door::Ws => ws_publish(node, m).await,
            Door::Native => native_publish(node, m).await,
        }
    }

    /// Publishes one message to be delivered 5 seconds later, each door its own way:
    /// MQTT topic `$delayed/5/<topic>/<tag>`, HTTP `deliver_at=<now + 5000>`,
    /// WebSocket `delay_ms: 5000`, native delay level 2 (5 s). Returns the time (ms,
    /// taken just before publishing) plus the delay: no delivery may come earlier.
    pub async fn publish_delayed_5s(self, node: &Node, m: &Outgoing) -> anyhow::Result<i64> {
        const DELAY_MS: i64 = 5000;
        let before = crate::now_ms();
        match self {
            Door::Mqtt => {
                let mut delayed = m.clone();
                delayed.topic = format!("$delayed/{}/{}", DELAY_MS / 1000, m.topic);
                mqtt_publish(node, &delayed)?
            }
            Door::Http => {
                http_publish_with(node, m, &format!("&deliver_at={}", before + DELAY_MS))?
            }
            Door::Ws => ws_publish_with(node, m, json!({"delay_ms": DELAY_MS})).await?,
            Door::Native => native_publish_with(node, m, Some(2)).await?,
        }
        Ok(before + DELAY_MS)
    }

    /// Opens a receiver of `topic` for consumer group `group` (MQTT: a subscription of
    /// `topic/#`, ready before this returns).
    pub async fn receiver(self, node: &Node, topic: &str, group: &str) -> anyhow::Result<Receiver> {
        Ok(match self {
            Door::Mqtt => Receiver::Mqtt(MqttSub::start(node, topic)?),
            Door::Http => Receiver::Http {
                base: format!("http://{}", node.addr("http")),
                topic: topic.to_string(),
                group: group.to_string(),
            },
            Door::Ws => Receiver::Ws(Box::new(WsSub::start(node, topic, group).await?)),
            Door::Native => Receiver::Native(NativeSub::start(node, topic, group).await?),
        })
    }
}

/// Creates a topic through the HTTP admin API (409 = it exists: fine).
pub async fn create_topic(node: &Node, topic: &str, queues: u32) -> anyhow::Result<()> {
    let url = format!("http://{}/v1/topics", node.addr("http"));
    let body = json!({"name": topic, "queues": queues}).to_string();
    let (status, text) = curl(&[
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
        "--data-binary",
        &body,
        &url,
    ])?;
    if status != 201 && status != 409 {
        bail!("creating topic {topic}: HTTP {status}: {text}");
    }
    Ok(())
}

/// Runs curl, returns (status, body). `-w` appends the status on its own last line.
pub fn curl(args: &[&str]) -> anyhow::Result<(u16, String)> {
    let out = tokio::task::block_in_place(|| {
        Command::new("curl")
            .args(["-sS", "--max-time", "60", "-w", "\n%{http_code}"])
            .args(args)
            .output()
    })
    .context("running curl (scripts/install-test-deps installs it)")?;
    if !out.status.success() {
        bail!("curl failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok((status.trim().parse().unwrap_or(0), body.to_string()))
}

fn temp_body(body: &[u8]) -> anyhow::Result<tempfile::NamedTempFile> {
    let mut f = tempfile::NamedTempFile::new()?;
    f.write_all(body)?;
    f.flush()?;
    Ok(f)
}

fn mqtt_publish(node: &Node, m: &Outgoing) -> anyhow::Result<()> {
    let file = temp_body(&m.body)?;
    let addr = node.addr("mqtt");
    let mut cmd = Command::new("mosquitto_pub");
    cmd.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args([
            "-V",
            "mqttv5",
            "-q",
            "1",
            "-t",
            &format!("{}/{}", m.topic, m.tag),
        ])
        .arg("-f")
        .arg(file.path());
    for (k, v) in &m.properties {
        cmd.args(["-D", "publish", "user-property", k, v]);
    }
    let out = tokio::task::block_in_place(|| cmd.output())
        .context("running mosquitto_pub (scripts/install-test-deps installs it)")?;
    if !out.status.success() {
        bail!(
            "mosquitto_pub failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn http_publish(node: &Node, m: &Outgoing) -> anyhow::Result<()> {
    http_publish_with(node, m, "")
}

/// An HTTP publish with `extra` appended to the query (`&deliver_at=...`).
fn http_publish_with(node: &Node, m: &Outgoing, extra: &str) -> anyhow::Result<()> {
    let file = temp_body(&m.body)?;
    let url = format!(
        "http://{}/v1/topics/{}/messages?tag={}&keys={}{extra}",
        node.addr("http"),
        m.topic,
        m.tag,
        m.keys.join(",")
    );
    let data = format!("@{}", file.path().display());
    let mut args: Vec<String> = vec!["--data-binary".into(), data];
    for (k, v) in &m.properties {
        args.push("-H".into());
        args.push(format!("x-rg-prop-{k}: {v}"));
    }
    args.push(url);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, text) = curl(&refs)?;
    if status != 201 {
        bail!("HTTP publish: {status}: {text}");
    }
    Ok(())
}

pub type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn ws_connect(node: &Node) -> anyhow::Result<WsStream> {
    let url = format!("ws://{}/v1/ws", node.addr("ws"));
    let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .with_context(|| format!("connecting to {url}"))?;
    Ok(ws)
}

pub async fn ws_send(ws: &mut WsStream, frame: Value) -> anyhow::Result<()> {
    ws.send(WsMessage::Text(frame.to_string().into())).await?;
    Ok(())
}

/// The next JSON frame (pings and other control frames skipped).
pub async fn ws_next(ws: &mut WsStream, timeout: Duration) -> anyhow::Result<Value> {
    loop {
        let frame = tokio::time::timeout(timeout, ws.next())
            .await
            .context("no WebSocket frame in time")?
            .context("the WebSocket closed")??;
        if let WsMessage::Text(t) = frame {
            return Ok(serde_json::from_str(t.as_str())?);
        }
    }
}

async fn ws_publish(node: &Node, m: &Outgoing) -> anyhow::Result<()> {
    ws_publish_with(node, m, json!({})).await
}

/// A WebSocket publish with the fields of `extra` added to the frame.
async fn ws_publish_with(node: &Node, m: &Outgoing, extra: Value) -> anyhow::Result<()> {
    let mut ws = ws_connect(node).await?;
    let mut frame = json!({"op": "publish", "req": "p", "topic": m.topic, "tag": m.tag,
        "keys": m.keys, "properties": m.properties, "body": B64.encode(&m.body),
        "encoding": "base64"});
    if let (Some(f), Value::Object(x)) = (frame.as_object_mut(), extra) {
        f.extend(x);
    }
    ws_send(&mut ws, frame).await?;
    loop {
        let f = ws_next(&mut ws, Duration::from_secs(30)).await?;
        match f["type"].as_str() {
            Some("send_result") => break,
            Some("error") => bail!("WebSocket publish refused: {f}"),
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(())
}

pub fn native_config(node: &Node) -> ClientSettings {
    ClientSettings::new([node.addr("namesrv").to_string()])
}

async fn native_publish(node: &Node, m: &Outgoing) -> anyhow::Result<()> {
    native_publish_with(node, m, None).await
}

/// A native send, with a RocketMQ delay level when given.
async fn native_publish_with(
    node: &Node,
    m: &Outgoing,
    delay_level: Option<u8>,
) -> anyhow::Result<()> {
    let producer = Producer::start(native_config(node), "interop-producers").await?;
    let mut msg = NativeMessage::new(m.topic.clone(), m.body.clone())
        .with_tag(m.tag.clone())
        .with_keys(m.keys.clone());
    if let Some(level) = delay_level {
        msg = msg.with_delay_level(level);
    }
    for (k, v) in &m.properties {
        msg = msg.with_property(k.clone(), v.clone());
    }
    let sent = producer.send(msg).await;
    producer.shutdown().await;
    sent?;
    Ok(())
}

/// A consumer on one door.
pub enum Receiver {
    Mqtt(MqttSub),
    Http {
        base: String,
        topic: String,
        group: String,
    },
    Ws(Box<WsSub>),
    Native(NativeSub),
}

impl Receiver {
    /// The next message, acknowledged (MQTT: PUBACK by the client; HTTP and WebSocket:
    /// acked by receipt handle; native: consumed successfully).
    pub async fn next(&mut self, timeout: Duration) -> anyhow::Result<Got> {
        match self {
            Receiver::Mqtt(s) => s.next(timeout),
            Receiver::Http { base, topic, group } => http_next(base, topic, group, timeout),
            Receiver::Ws(s) => s.next(timeout).await,
            Receiver::Native(s) => s.next(timeout),
        }
    }

    pub async fn close(self) {
        match self {
            Receiver::Mqtt(mut s) => s.stop(),
            Receiver::Http { .. } => {}
            Receiver::Ws(mut s) => {
                let _ = s.ws.close(None).await;
            }
            Receiver::Native(s) => s.consumer.shutdown().await,
        }
    }
}

/// `mosquitto_sub -V mqttv5 -q 1 -t <topic>/#`, printing one line per message.
pub struct MqttSub {
    child: Child,
    lines: mpsc::Receiver<String>,
    topic: String,
}

impl MqttSub {
    fn start(node: &Node, topic: &str) -> anyhow::Result<MqttSub> {
        Self::start_filter(node, topic, &format!("{topic}/#"))
    }

    /// `mosquitto_sub` on any MQTT filter whose first level is `topic`
    /// (e.g. `sensors/+/temp`), ready (SUBACK seen) when this returns.
    pub fn start_filter(node: &Node, topic: &str, filter: &str) -> anyhow::Result<MqttSub> {
        let addr = node.addr("mqtt");
        // Line-buffered: a piped mosquitto_sub would hold its output in a block buffer.
        let mut child = Command::new("stdbuf")
            .args(["-oL", "mosquitto_sub"])
            .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
            .args(["-V", "mqttv5", "-q", "1", "-d", "-t", filter])
            .args(["-F", "MSG|%t|%x|%P"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("running mosquitto_sub (scripts/install-test-deps installs it)")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let lines = crate::lines_of(stdout);
        let sub = MqttSub {
            child,
            lines,
            topic: topic.to_string(),
        };
        // -d prints the SUBACK: from then on, publishes reach it.
        loop {
            let line = sub
                .lines
                .recv_timeout(Duration::from_secs(30))
                .context("mosquitto_sub got no SUBACK")?;
            if line.contains("received SUBACK") {
                return Ok(sub);
            }
        }
    }

    /// The next message delivered to the subscription.
    pub fn next(&mut self, timeout: Duration) -> anyhow::Result<Got> {
        loop {
            let line = tokio::task::block_in_place(|| self.lines.recv_timeout(timeout))
                .context("no MQTT message in time")?;
            let Some(rest) = line.strip_prefix("MSG|") else {
                continue;
            };
            let mut parts = rest.splitn(3, '|');
            let mqtt_topic = parts.next().unwrap_or_default();
            let hex = parts.next().unwrap_or_default();
            let props = parts.next().unwrap_or_default();
            let (first, path) = match mqtt_topic.split_once('/') {
                Some((t, p)) => (t, Some(p.to_string())),
                None => (mqtt_topic, None),
            };
            if first != self.topic {
                bail!(
                    "MQTT delivery on {mqtt_topic}, subscribed to {}/#",
                    self.topic
                );
            }
            let body = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .context("mosquitto_sub printed bad hex")?;
            let properties = props
                .split(' ')
                .filter_map(|kv| kv.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            return Ok(Got {
                topic: first.to_string(),
                tag: path,
                keys: Vec::new(),
                properties,
                body,
                store_timestamp: None,
            });
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MqttSub {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A message in the JSON shape the HTTP and WebSocket doors share.
fn got_from_json(m: &Value, encoding_field: &str) -> anyhow::Result<Got> {
    let body = m["body"].as_str().context("no body")?;
    let body = match m[encoding_field].as_str() {
        Some("base64") => B64.decode(body).context("bad base64 body")?,
        _ => body.as_bytes().to_vec(),
    };
    Ok(Got {
        topic: m["topic"].as_str().unwrap_or_default().to_string(),
        tag: m["tag"].as_str().map(str::to_string),
        keys: m["keys"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|k| k.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        properties: m["properties"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        body,
        store_timestamp: m["store_timestamp"].as_i64(),
    })
}

fn http_next(base: &str, topic: &str, group: &str, timeout: Duration) -> anyhow::Result<Got> {
    let url = format!(
        "{base}/v1/groups/{group}/topics/{topic}/messages?max=1&encoding=base64&wait_ms={}",
        timeout.as_millis().min(30_000)
    );
    let (status, text) = curl(&[&url])?;
    if status != 200 {
        bail!("HTTP receive: {status}: {text}");
    }
    let v: Value = serde_json::from_str(&text).with_context(|| format!("bad JSON: {text}"))?;
    let m = v["messages"]
        .as_array()
        .and_then(|a| a.first())
        .context("no HTTP message in time")?;
    let got = got_from_json(m, "body_encoding")?;
    let receipt = m["receipt_handle"].as_str().context("no receipt_handle")?;
    let ack = json!({"receipt_handle": receipt}).to_string();
    let (status, text) = curl(&[
        "-H",
        "content-type: application/json",
        "--data-binary",
        &ack,
        &format!("{base}/v1/groups/{group}/acks"),
    ])?;
    if status != 200 {
        bail!("HTTP ack: {status}: {text}");
    }
    Ok(got)
}

/// A `/v1/ws` clustering subscription from the earliest message, acking each one.
pub struct WsSub {
    ws: WsStream,
}

impl WsSub {
    async fn start(node: &Node, topic: &str, group: &str) -> anyhow::Result<WsSub> {
        let mut ws = ws_connect(node).await?;
        ws_send(
            &mut ws,
            json!({"op": "subscribe", "req": "s", "id": "it", "topic": topic, "group": group,
                   "mode": "clustering", "start": "earliest", "credit": 100}),
        )
        .await?;
        loop {
            let f = ws_next(&mut ws, Duration::from_secs(30)).await?;
            match f["type"].as_str() {
                Some("subscribed") => return Ok(WsSub { ws }),
                Some("error") => bail!("WebSocket subscribe refused: {f}"),
                _ => {}
            }
        }
    }

    async fn next(&mut self, timeout: Duration) -> anyhow::Result<Got> {
        loop {
            let f = ws_next(&mut self.ws, timeout).await?;
            match f["type"].as_str() {
                Some("message") => {
                    let got = got_from_json(&f, "encoding")?;
                    let receipt = f["receipt"].as_str().context("no receipt")?.to_string();
                    ws_send(&mut self.ws, json!({"op": "ack", "receipt": receipt})).await?;
                    ws_send(&mut self.ws, json!({"op": "credit", "id": "it", "n": 1})).await?;
                    return Ok(got);
                }
                Some("error") => bail!("WebSocket error: {f}"),
                _ => {}
            }
        }
    }
}

/// A native push consumer (clustering, from the first message) feeding a channel.
pub struct NativeSub {
    consumer: PushConsumer,
    rx: mpsc::Receiver<Got>,
}

impl NativeSub {
    async fn start(node: &Node, topic: &str, group: &str) -> anyhow::Result<NativeSub> {
        let (tx, rx) = mpsc::channel();
        let options = PushConsumerSettings::new(group)
            .subscribe(topic, "*")
            .consume_from(ConsumeFrom::First);
        let consumer = PushConsumer::start_concurrent(native_config(node), options, move |msgs| {
            for m in msgs {
                let _ = tx.send(got_from_native(m));
            }
            ConsumeResult::Success
        })
        .await?;
        Ok(NativeSub { consumer, rx })
    }

    fn next(&mut self, timeout: Duration) -> anyhow::Result<Got> {
        tokio::task::block_in_place(|| self.rx.recv_timeout(timeout))
            .context("no native message in time")
    }
}

/// RocketMQ's system properties are not user properties.
fn is_system_property(name: &str) -> bool {
    name.chars()
        .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
        || name.starts_with("__")
}

fn got_from_native(m: &ReceivedMessage) -> Got {
    Got {
        topic: m.topic.clone(),
        tag: m.tag().map(str::to_string),
        keys: m
            .properties
            .get("KEYS")
            .map(|k| k.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        properties: m
            .properties
            .iter()
            .filter(|(k, _)| !is_system_property(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        body: m.body.to_vec(),
        store_timestamp: Some(m.store_timestamp),
    }
}
