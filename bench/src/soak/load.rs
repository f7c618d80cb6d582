//! The soak's traffic, one driver per door. Every driver reconnects after an error
//! (counted) so one bad minute shows in the CSV instead of ending the run, and stops
//! when the stop signal turns true.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use mqttbytes::QoS;
use rocketgate_native::client::{
    ClientSettings, ConsumeFrom, ConsumeResult, Message as NativeMessage, Producer, PushConsumer,
    PushConsumerSettings,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::node::Node;
use super::{SoakArgs, Stats, stamp_of, stamped_body};
use crate::mqtt::proto::{Pkt, Version};

type Stop = watch::Receiver<bool>;

/// The running drivers.
pub(crate) struct Load {
    tasks: JoinSet<()>,
    consumer: PushConsumer,
    producer: Producer,
}

impl Load {
    /// Waits (up to 30 s) for the drivers to see the stop signal, then aborts the rest.
    pub(crate) async fn stop(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(30), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        // Before the node goes: the consumer's last offset commit needs it.
        self.consumer.shutdown().await;
        self.producer.shutdown().await;
    }
}

/// A distinct suffix per run, so topics and groups of two runs never meet.
fn run_id() -> String {
    format!("{}{}", std::process::id(), super::stamp_now() % 100_000)
}

async fn stopped(stop: &mut Stop) {
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Sleeps `d` unless the stop comes first (then `true`).
async fn pause(stop: &mut Stop, d: Duration) -> bool {
    tokio::select! {
        _ = stopped(stop) => true,
        _ = tokio::time::sleep(d) => false,
    }
}

pub(crate) async fn start(
    args: &SoakArgs,
    node: &Node,
    stats: Arc<Stats>,
    stop: Stop,
) -> anyhow::Result<Load> {
    let run = run_id();
    let mut tasks = JoinSet::new();
    // Topics first: the receivers of HTTP and WebSocket need them to exist.
    let http = node.addr("http");
    let ws_topic = format!("soakws{run}");
    let http_topic = format!("soakhttp{run}");
    for t in [&ws_topic, &http_topic] {
        let mut c = HttpConn::connect(http).await?;
        let (status, body) = c
            .request("POST", &format!("/v1/topics/{t}/messages"), "warm-up")
            .await?;
        if status / 100 != 2 {
            bail!("creating {t} over HTTP: {status} {body}");
        }
    }
    let (producer, consumer) = native(args, node, &run, stats.clone(), &mut tasks, &stop).await?;
    mqtt(args, node.addr("mqtt"), &run, &stats, &mut tasks, &stop).await?;
    for k in 0..args.ws_subscribers {
        let (addr, topic, stats, stop) = (
            node.addr("ws"),
            ws_topic.clone(),
            stats.clone(),
            stop.clone(),
        );
        let group = format!("soak-ws-{run}-{k}");
        tasks.spawn(retrying(stats, "ws", stop, move |s, st| {
            ws_subscriber(addr, topic.clone(), group.clone(), s, st)
        }));
    }
    {
        let (addr, topic, rate, stats, stop) = (
            node.addr("ws"),
            ws_topic,
            args.ws_rate,
            stats.clone(),
            stop.clone(),
        );
        tasks.spawn(retrying(stats, "ws", stop, move |s, st| {
            ws_publisher(addr, topic.clone(), rate, s, st)
        }));
    }
    for _ in 0..args.http_receivers {
        let (topic, group, stats, stop) = (
            http_topic.clone(),
            format!("soak-http-{run}"),
            stats.clone(),
            stop.clone(),
        );
        tasks.spawn(retrying(stats, "http", stop, move |s, st| {
            http_receiver(http, topic.clone(), group.clone(), s, st)
        }));
    }
    {
        let (rate, stats, stop) = (args.http_rate, stats.clone(), stop.clone());
        tasks.spawn(retrying(stats, "http", stop, move |s, st| {
            http_publisher(http, http_topic.clone(), rate, s, st)
        }));
    }
    Ok(Load {
        tasks,
        consumer,
        producer,
    })
}

/// Runs `session` until the stop, counting each error on `door` and starting over a
/// second later.
async fn retrying<F, Fut>(stats: Arc<Stats>, door: &'static str, mut stop: Stop, session: F)
where
    F: Fn(Arc<Stats>, Stop) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    loop {
        if *stop.borrow() {
            return;
        }
        match session(stats.clone(), stop.clone()).await {
            Ok(()) => return,
            Err(e) => {
                if *stop.borrow() {
                    return;
                }
                stats.door(door).error();
                eprintln!("soak: {door}: {e:#}");
                if pause(&mut stop, Duration::from_secs(1)).await {
                    return;
                }
            }
        }
    }
}

// ---- MQTT ----

/// mqttbytes' errors are not `std::error::Error`.
fn mq<T>(r: Result<T, mqttbytes::Error>) -> anyhow::Result<T> {
    r.map_err(|e| anyhow::anyhow!("MQTT encoding: {e:?}"))
}

async fn mqtt(
    args: &SoakArgs,
    addr: SocketAddr,
    run: &str,
    stats: &Arc<Stats>,
    tasks: &mut JoinSet<()>,
    stop: &Stop,
) -> anyhow::Result<()> {
    let n = args.mqtt_clients;
    let slow = ((n as f64 * args.slow_percent / 100.0).round() as usize).min(n);
    let ordinary = n - slow;
    let firehose = format!("soak/{run}/firehose");
    let interval = Duration::from_secs_f64(args.mqtt_interval.max(0.1));
    // Connections open 64 at a time, as devices coming online.
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    for i in 0..n {
        let role = if i < ordinary {
            let qos = if i % 2 == 0 {
                QoS::AtMostOnce
            } else {
                QoS::AtLeastOnce
            };
            Role::Ordinary {
                own: format!("soak/{run}/c/{i}"),
                peer: format!("soak/{run}/c/{}", (i + 1) % ordinary),
                qos,
                interval,
                // Spread the first publishes over one interval.
                phase: interval.mul_f64(i as f64 / ordinary.max(1) as f64),
            }
        } else {
            Role::Slow {
                firehose: firehose.clone(),
            }
        };
        let (client, gate) = (format!("soak-{run}-{i}"), gate.clone());
        tasks.spawn(retrying(
            stats.clone(),
            "mqtt",
            stop.clone(),
            move |s, st| mqtt_session(addr, client.clone(), role.clone(), gate.clone(), s, st),
        ));
    }
    if slow > 0 && args.firehose_rate > 0.0 {
        let role = Role::Firehose {
            topic: firehose,
            every: Duration::from_secs_f64(1.0 / args.firehose_rate),
        };
        let (client, gate) = (format!("soak-{run}-firehose"), gate.clone());
        tasks.spawn(retrying(
            stats.clone(),
            "mqtt",
            stop.clone(),
            move |s, st| mqtt_session(addr, client.clone(), role.clone(), gate.clone(), s, st),
        ));
    }
    Ok(())
}

#[derive(Clone)]
enum Role {
    /// Subscribed to `own`, publishing to `peer` every `interval` at `qos`.
    Ordinary {
        own: String,
        peer: String,
        qos: QoS,
        interval: Duration,
        phase: Duration,
    },
    /// A small receive window, read slowly; subscribed to the firehose at QoS 0.
    Slow { firehose: String },
    /// Publishes 1 KiB QoS 0 messages to the firehose.
    Firehose { topic: String, every: Duration },
}

async fn mqtt_session(
    addr: SocketAddr,
    client: String,
    role: Role,
    gate: Arc<tokio::sync::Semaphore>,
    stats: Arc<Stats>,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let v = Version::V4;
    let slow = matches!(role, Role::Slow { .. });
    let socket = tokio::net::TcpSocket::new_v4()?;
    if slow {
        socket.set_recv_buffer_size(4096)?;
    }
    let permit = gate.acquire_owned().await?;
    let stream = tokio::time::timeout(Duration::from_secs(30), socket.connect(addr))
        .await
        .context("MQTT connect timed out")??;
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    let mut out = BytesMut::new();
    mq(v.connect(&client, 60, &mut out))?;
    match &role {
        Role::Ordinary { own, qos, .. } => mq(v.subscribe(own, *qos, 1, &mut out))?,
        Role::Slow { firehose } => mq(v.subscribe(firehose, QoS::AtMostOnce, 1, &mut out))?,
        Role::Firehose { .. } => {}
    }
    wr.write_all(&out).await?;
    out.clear();
    let mut buf = BytesMut::with_capacity(8192);
    // CONNACK (and SUBACK) before anything else.
    let need_suback = !matches!(role, Role::Firehose { .. });
    let (mut connacked, mut subacked) = (false, !need_suback);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(connacked && subacked) {
        match v.read(&mut buf, 1 << 20) {
            Ok(Pkt::ConnAck { refused: Some(r) }) => bail!("CONNACK refused: {r}"),
            Ok(Pkt::ConnAck { refused: None }) => connacked = true,
            Ok(Pkt::SubAck { failed: true }) => bail!("SUBACK refused"),
            Ok(Pkt::SubAck { failed: false }) => subacked = true,
            Ok(_) => {}
            Err(mqttbytes::Error::InsufficientBytes(_)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                let n = tokio::time::timeout(left, rd.read_buf(&mut buf))
                    .await
                    .context("no CONNACK/SUBACK within 60 s")??;
                if n == 0 {
                    bail!("closed before CONNACK/SUBACK");
                }
            }
            Err(e) => bail!("bad packet: {e:?}"),
        }
    }
    drop(permit);
    let door = stats.door("mqtt");
    let (mut next_pub, every, pub_qos, pub_topic) = match &role {
        Role::Ordinary {
            peer,
            qos,
            interval,
            phase,
            ..
        } => (Instant::now() + *phase, *interval, *qos, Some(peer.clone())),
        Role::Firehose { topic, every } => {
            (Instant::now(), *every, QoS::AtMostOnce, Some(topic.clone()))
        }
        Role::Slow { .. } => (
            Instant::now(),
            Duration::from_secs(3600),
            QoS::AtMostOnce,
            None,
        ),
    };
    let size = if matches!(role, Role::Firehose { .. }) {
        1024
    } else {
        64
    };
    let mut next_ping = Instant::now() + Duration::from_secs(30);
    let mut pkid: u16 = 1;
    let mut small = [0u8; 512];
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => {
                mq(v.disconnect(&mut out))?;
                let _ = wr.write_all(&out).await;
                return Ok(());
            }
            _ = tokio::time::sleep_until(next_pub.into()), if pub_topic.is_some() => {
                let topic = pub_topic.as_deref().unwrap_or_default();
                pkid = pkid.checked_add(1).unwrap_or(1).max(1);
                mq(v.publish(topic, pub_qos, pkid, stamped_body(size).into_bytes(), &mut out))?;
                wr.write_all(&out).await?;
                out.clear();
                if !matches!(role, Role::Firehose { .. }) {
                    door.sent.fetch_add(1, Ordering::Relaxed);
                }
                next_pub += every;
                // Behind by more than a second (a stalled runtime): skip, never burst.
                if next_pub + Duration::from_secs(1) < Instant::now() {
                    next_pub = Instant::now() + every;
                }
            }
            _ = tokio::time::sleep_until(next_ping.into()) => {
                mq(v.pingreq(&mut out))?;
                wr.write_all(&out).await?;
                out.clear();
                next_ping += Duration::from_secs(30);
            }
            n = async {
                if slow {
                    // Slow: 512 bytes per 50 ms (10 KiB/s), below the firehose's rate.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let n = rd.read(&mut small).await?;
                    buf.extend_from_slice(&small[..n]);
                    std::io::Result::Ok(n)
                } else {
                    rd.read_buf(&mut buf).await
                }
            } => {
                if n? == 0 {
                    bail!("the broker closed the connection");
                }
                loop {
                    match v.read(&mut buf, 1 << 20) {
                        Ok(Pkt::Publish { pkid, qos, payload }) => {
                            if slow {
                                stats.slow_received.fetch_add(1, Ordering::Relaxed);
                            } else if let Some(s) = stamp_of(&payload) {
                                door.delivered(s);
                            }
                            if qos == QoS::AtLeastOnce {
                                mq(v.puback(pkid, &mut out))?;
                            }
                        }
                        Ok(_) => {}
                        Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                        Err(e) => bail!("bad packet: {e:?}"),
                    }
                }
                if !out.is_empty() {
                    wr.write_all(&out).await?;
                    out.clear();
                }
            }
        }
    }
}

// ---- WebSocket ----

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(addr: SocketAddr) -> anyhow::Result<Ws> {
    let (ws, _) = tokio::time::timeout(
        Duration::from_secs(30),
        tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws")),
    )
    .await
    .context("WebSocket connect timed out")??;
    Ok(ws)
}

/// A flat JSON frame, parsed.
fn frame(m: WsMessage) -> Option<serde_json::Value> {
    match m {
        WsMessage::Text(t) => serde_json::from_str(&t).ok(),
        _ => None,
    }
}

async fn ws_subscriber(
    addr: SocketAddr,
    topic: String,
    group: String,
    stats: Arc<Stats>,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let mut ws = ws_connect(addr).await?;
    let sub = serde_json::json!({"op":"subscribe","id":"s","topic":topic,"group":group,
        "start":"latest","credit":256});
    ws.send(WsMessage::text(sub.to_string())).await?;
    let door = stats.door("ws");
    let mut since_credit = 0u64;
    loop {
        let m = tokio::select! {
            _ = stopped(&mut stop) => { let _ = ws.close(None).await; return Ok(()); }
            m = tokio::time::timeout(Duration::from_secs(120), ws.next()) => m,
        };
        let m = m
            .context("no frame for 120 s")?
            .context("the server closed")??;
        let Some(f) = frame(m) else { continue };
        match f["type"].as_str() {
            Some("message") => {
                if let Some(s) = f["body"].as_str().and_then(|b| stamp_of(b.as_bytes())) {
                    door.delivered(s);
                }
                if let Some(r) = f["receipt"].as_str() {
                    let ack = serde_json::json!({"op":"ack","receipt":r});
                    ws.send(WsMessage::text(ack.to_string())).await?;
                }
                since_credit += 1;
                if since_credit >= 64 {
                    let c = serde_json::json!({"op":"credit","id":"s","n":since_credit});
                    ws.send(WsMessage::text(c.to_string())).await?;
                    since_credit = 0;
                }
            }
            Some("error") => bail!("subscriber error: {f}"),
            _ => {}
        }
    }
}

async fn ws_publisher(
    addr: SocketAddr,
    topic: String,
    rate: f64,
    stats: Arc<Stats>,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let ws = ws_connect(addr).await?;
    let (mut sink, mut stream) = ws.split();
    let door = stats.door("ws");
    let every = Duration::from_secs_f64(1.0 / rate.max(0.01));
    let mut next = Instant::now();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => return Ok(()),
            _ = tokio::time::sleep_until(next.into()) => {
                let p = serde_json::json!({"op":"publish","topic":topic,"body":stamped_body(64)});
                sink.send(WsMessage::text(p.to_string())).await?;
                door.sent.fetch_add(1, Ordering::Relaxed);
                next += every;
                if next + Duration::from_secs(1) < Instant::now() {
                    next = Instant::now() + every;
                }
            }
            m = stream.next() => {
                let m = m.context("the server closed")??;
                if let Some(f) = frame(m)
                    && f["type"] == "error"
                {
                    door.error();
                    eprintln!("soak: ws publish: {f}");
                }
            }
        }
    }
}

// ---- HTTP ----

/// A keep-alive HTTP/1.1 connection (bodies with `content-length`, as the door answers).
struct HttpConn {
    stream: tokio::net::TcpStream,
    addr: SocketAddr,
    buf: Vec<u8>,
}

impl HttpConn {
    async fn connect(addr: SocketAddr) -> anyhow::Result<HttpConn> {
        let stream = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        .context("HTTP connect timed out")??;
        stream.set_nodelay(true)?;
        Ok(HttpConn {
            stream,
            addr,
            buf: Vec::new(),
        })
    }

    /// One request; `(status, body)`. Waits up to 60 s for the answer.
    async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> anyhow::Result<(u16, String)> {
        let ctype = if body.starts_with('{') {
            "application/json"
        } else {
            "text/plain"
        };
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        self.stream.write_all(req.as_bytes()).await?;
        tokio::time::timeout(Duration::from_secs(60), self.response())
            .await
            .context("no HTTP answer within 60 s")?
    }

    async fn response(&mut self) -> anyhow::Result<(u16, String)> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).to_string();
                let status: u16 = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .context("no HTTP status")?;
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .context("an HTTP answer without content-length")?;
                while self.buf.len() < end + 4 + len {
                    let mut chunk = [0u8; 8192];
                    let n = self.stream.read(&mut chunk).await?;
                    if n == 0 {
                        bail!("closed mid-answer");
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                let body = String::from_utf8_lossy(&self.buf[end + 4..end + 4 + len]).to_string();
                self.buf.drain(..end + 4 + len);
                return Ok((status, body));
            }
            let mut chunk = [0u8; 8192];
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

async fn http_publisher(
    addr: SocketAddr,
    topic: String,
    rate: f64,
    stats: Arc<Stats>,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let mut c = HttpConn::connect(addr).await?;
    let door = stats.door("http");
    let every = Duration::from_secs_f64(1.0 / rate.max(0.01));
    let mut next = Instant::now();
    let path = format!("/v1/topics/{topic}/messages");
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => return Ok(()),
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        let (status, body) = c.request("POST", &path, &stamped_body(64)).await?;
        if status / 100 == 2 {
            door.sent.fetch_add(1, Ordering::Relaxed);
        } else {
            door.error();
            eprintln!("soak: http publish: {status} {body}");
        }
        next += every;
        if next + Duration::from_secs(1) < Instant::now() {
            next = Instant::now() + every;
        }
    }
}

async fn http_receiver(
    addr: SocketAddr,
    topic: String,
    group: String,
    stats: Arc<Stats>,
    mut stop: Stop,
) -> anyhow::Result<()> {
    let mut c = HttpConn::connect(addr).await?;
    let door = stats.door("http");
    let path =
        format!("/v1/groups/{group}/topics/{topic}/messages?wait_ms=2000&max=32&start=latest");
    let acks = format!("/v1/groups/{group}/acks");
    loop {
        let (status, body) = tokio::select! {
            _ = stopped(&mut stop) => return Ok(()),
            r = c.request("GET", &path, "") => r?,
        };
        if status != 200 {
            bail!("receive: {status} {body}");
        }
        let v: serde_json::Value = serde_json::from_str(&body).context("receive: bad JSON")?;
        let mut handles = Vec::new();
        for m in v["messages"].as_array().into_iter().flatten() {
            if let Some(s) = m["body"].as_str().and_then(|b| stamp_of(b.as_bytes())) {
                door.delivered(s);
            }
            if let Some(h) = m["receipt_handle"].as_str() {
                handles.push(h.to_string());
            }
        }
        if !handles.is_empty() {
            let ack = serde_json::json!({"receipt_handles": handles}).to_string();
            let (status, body) = c.request("POST", &acks, &ack).await?;
            if status != 200 {
                door.error();
                eprintln!("soak: http ack: {status} {body}");
            }
        }
    }
}

// ---- native ----

async fn native(
    args: &SoakArgs,
    node: &Node,
    run: &str,
    stats: Arc<Stats>,
    tasks: &mut JoinSet<()>,
    stop: &Stop,
) -> anyhow::Result<(Producer, PushConsumer)> {
    let settings = || ClientSettings::from_list(&node.addr("namesrv").to_string());
    let topic = format!("soaknative{run}");
    let producer = Producer::start(settings(), format!("soak-producer-{run}")).await?;
    producer.create_topic(&topic, 4).await?;
    let mut opts = PushConsumerSettings::new(format!("soak-native-{run}")).subscribe(&topic, "*");
    opts.consume_from = ConsumeFrom::Last;
    let s = stats.clone();
    let consumer = PushConsumer::start_concurrent(settings(), opts, move |msgs| {
        let door = s.door("native");
        for m in msgs {
            if let Some(st) = stamp_of(&m.body) {
                door.delivered(st);
            }
        }
        ConsumeResult::Success
    })
    .await?;
    let (p, rate, mut stop) = (producer.clone(), args.native_rate, stop.clone());
    tasks.spawn(async move {
        let door = stats.door("native");
        let every = Duration::from_secs_f64(1.0 / rate.max(0.01));
        let mut next = Instant::now();
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => return,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            match p
                .send(NativeMessage::new(
                    topic.clone(),
                    stamped_body(64).into_bytes(),
                ))
                .await
            {
                Ok(_) => {
                    door.sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    door.error();
                    eprintln!("soak: native send: {e}");
                }
            }
            next += every;
            if next + Duration::from_secs(1) < Instant::now() {
                next = Instant::now() + every;
            }
        }
    });
    Ok((producer, consumer))
}
