//! `rocketgate bench ws`: fan-out through the WebSocket door. One publisher
//! connection publishes 100 B messages; N subscriber connections, each its own
//! broadcasting subscriber, receive every one of them and ack. The broker runs as
//! a separate `rocketgate standalone` process (so its memory can be measured per
//! connection); publisher and subscribers are tasks of this process.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::stats::{Latencies, fmt_dur};

#[derive(Debug, Clone, Args)]
pub struct WsBenchArgs {
    /// Directory for the broker's store (a fresh subdirectory, deleted after).
    #[arg(long, default_value = "bench-data")]
    pub dir: std::path::PathBuf,
    /// Subscriber counts to run, one scenario each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub subscribers: Vec<usize>,
    /// Total deliveries per scenario (messages = deliveries / subscribers).
    #[arg(long, default_value_t = 1_000_000)]
    pub deliveries: u64,
    /// Message body size in bytes.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Publish rate in messages/s (0 = as fast as the publisher's window allows).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Publishes the publisher keeps outstanding.
    #[arg(long, default_value_t = 32)]
    pub window: usize,
    /// Queues of the topic.
    #[arg(long, default_value_t = 4)]
    pub queues: u32,
    /// Only connect and subscribe, then report the broker's RSS per idle
    /// connection (no messages).
    #[arg(long)]
    pub idle: bool,
    /// With `--idle`: the door measured, `json` (`/v1/ws`, one subscription each)
    /// or `mqtt` (`/mqtt`, CONNECT and one SUBSCRIBE each).
    #[arg(long, value_enum, default_value_t = Door::Json)]
    pub door: Door,
    /// How `/v1/ws` subscribers consume: `broadcasting` (every subscriber gets
    /// every message: pulls of every queue) or `clustering` (POP).
    #[arg(long, value_enum, default_value_t = Mode::Broadcasting)]
    pub mode: Mode,
    /// The `rocketgate` binary to run as the broker (default: this one), e.g. an
    /// older build for a before/after comparison in one run.
    #[arg(long, value_name = "PATH")]
    pub broker_exe: Option<std::path::PathBuf>,
    /// With `--idle`: subscriptions per connection (0 = connections only).
    #[arg(long, default_value_t = 1)]
    pub subscriptions: usize,
}

/// The WebSocket door `--idle` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Door {
    Json,
    Mqtt,
}

/// How `/v1/ws` subscribers consume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Broadcasting,
    Clustering,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Broadcasting => "broadcasting",
            Mode::Clustering => "clustering",
        }
    }
}

pub fn run(args: WsBenchArgs) -> anyhow::Result<()> {
    crate::stats::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.idle {
        return rt.block_on(idle_all(&args));
    }
    println!("# rocketgate bench ws");
    println!(
        "{:>6} {:>9} {:>12} {:>14} {:>10} {:>10} {:>10} {:>10} {:>14}",
        "subs", "messages", "deliveries", "deliveries/s", "p50", "p99", "p999", "max", "RSS/conn"
    );
    for &n in &args.subscribers {
        let dir = args.dir.join(format!("ws-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let node = Node::start(&dir, args.queues, args.broker_exe.as_deref())?;
        let result = rt.block_on(scenario(node.addr, node.pid(), n, &args));
        drop(node);
        let _ = std::fs::remove_dir_all(&dir);
        let r = result?;
        let mut lat = r.latencies;
        let s = lat.summary();
        println!(
            "{:>6} {:>9} {:>12} {:>14.0} {:>10} {:>10} {:>10} {:>10} {:>11.1}KiB",
            n,
            r.messages,
            r.deliveries,
            r.deliveries as f64 / r.secs,
            fmt_dur(s.p50),
            fmt_dur(s.p99),
            fmt_dur(s.p999),
            fmt_dur(s.max),
            r.rss_per_conn as f64 / 1024.0
        );
    }
    Ok(())
}

/// The broker under test: `rocketgate standalone` on free ports.
struct Node {
    child: Child,
    addr: SocketAddr,
}

impl Node {
    fn start(
        dir: &std::path::Path,
        queues: u32,
        exe: Option<&std::path::Path>,
    ) -> anyhow::Result<Node> {
        let exe = match exe {
            Some(e) => e.to_path_buf(),
            None => std::env::current_exe().context("locating the rocketgate binary")?,
        };
        let mut child = Command::new(exe)
            .args([
                "standalone",
                "--namesrv",
                "0",
                "--native",
                "0",
                "--mqtt",
                "0",
            ])
            .args(["--http", "0", "--ws", "0", "--data-dir"])
            .arg(dir)
            .env("ROCKETGATE_BROKER__DEFAULT_QUEUE_NUMS", queues.to_string())
            .env("ROCKETGATE_STORE__SEGMENT_SIZE", "256MiB")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting rocketgate standalone")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut addr = None;
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let line = line?;
            if let Some(a) = line.strip_prefix("rocketgate: ws listening on ") {
                addr = Some(a.trim().parse()?);
            }
            if line.contains("ready") {
                break;
            }
        }
        // Keep reading, so the node never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        let addr = addr.context("the node did not announce its WebSocket address")?;
        Ok(Node { child, addr })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGTERM: a clean shutdown, then wait for it.
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

struct Outcome {
    messages: u64,
    deliveries: u64,
    secs: f64,
    latencies: Latencies,
    rss_per_conn: u64,
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<Ws> {
    let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws")).await?;
    Ok(ws)
}

/// A client connection with small buffers (the generator holds thousands of them
/// in `--idle`), to `path`, asking for `protocol` if given.
async fn connect_lean(addr: SocketAddr, path: &str, protocol: Option<&str>) -> anyhow::Result<Ws> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
    let mut req = format!("ws://{addr}{path}").into_client_request()?;
    if let Some(p) = protocol {
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", p.parse()?);
    }
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(4096);
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config), false).await?;
    Ok(ws)
}

/// `--idle`: for each subscriber count, a fresh broker, that many idle connections
/// (each subscribed), and the broker's RSS growth per connection.
async fn idle_all(args: &WsBenchArgs) -> anyhow::Result<()> {
    println!(
        "# rocketgate bench ws --idle --door {:?} --mode {}",
        args.door,
        args.mode.name()
    );
    println!(
        "{:>8} {:>14} {:>12} {:>12} {:>14}",
        "conns", "broker RSS", "RSS/conn", "anon/conn", "connects/s"
    );
    for &n in &args.subscribers {
        let dir = args.dir.join(format!("ws-idle-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let node = Node::start(&dir, args.queues, args.broker_exe.as_deref())?;
        let result = idle(node.addr, node.pid(), n, args).await;
        drop(node);
        let _ = std::fs::remove_dir_all(&dir);
        let (rss, per, anon_per, rate) = result?;
        println!(
            "{:>8} {:>11.1}MiB {:>9.1}KiB {:>9.1}KiB {:>14.0}",
            n,
            rss as f64 / (1024.0 * 1024.0),
            per as f64 / 1024.0,
            anon_per as f64 / 1024.0,
            rate
        );
    }
    Ok(())
}

/// Opens `n` subscribed connections; (broker RSS after, RSS growth per connection,
/// `RssAnon` growth per connection, connections per second). `RssAnon` leaves out
/// the memory-mapped commit log, whose pages the store's pre-faulting thread
/// touches whenever it gets a core (up to 16 MiB: 16 KiB per connection at 1,000).
async fn idle(
    addr: SocketAddr,
    pid: u32,
    n: usize,
    args: &WsBenchArgs,
) -> anyhow::Result<(u64, u64, u64, f64)> {
    let topic = format!("idle{n}");
    // The topic exists before the measurement (its queues are not per connection).
    let mut publisher = connect(addr).await?;
    publisher
        .send(Message::text(format!(
            r#"{{"op":"publish","topic":"{topic}","body":"warm-up"}}"#
        )))
        .await?;
    let first = next_text(&mut publisher).await?;
    anyhow::ensure!(
        first.contains("send_result"),
        "warm-up publish failed: {first}"
    );
    // Let the broker settle after start-up before the baseline.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = crate::stats::rss_of(pid).context("reading the broker's RSS")?;
    let anon_before = crate::stats::status_bytes(pid, "RssAnon").context("reading RssAnon")?;
    let started = Instant::now();
    let door = args.door;
    let mode = args.mode.name();
    let subscriptions = args.subscriptions;
    let held: Vec<Ws> = futures_util::stream::iter(0..n)
        .map(|i| {
            let topic = topic.clone();
            async move {
                match door {
                    Door::Json => {
                        let mut ws = connect_lean(addr, "/v1/ws", None).await?;
                        for k in 0..subscriptions {
                            ws.send(Message::text(format!(
                                r#"{{"op":"subscribe","id":"s{i}-{k}","topic":"{topic}","group":"idle-{k}","mode":"{mode}","start":"latest","credit":10}}"#
                            )))
                            .await?;
                            let answer = next_text(&mut ws).await?;
                            anyhow::ensure!(answer.contains("subscribed"), "subscribe failed: {answer}");
                        }
                        Ok(ws)
                    }
                    Door::Mqtt => {
                        let mut ws = connect_lean(addr, "/mqtt", Some("mqtt")).await?;
                        let v = crate::mqtt::Version::V4;
                        let mut out = bytes::BytesMut::new();
                        v.connect(&format!("idle-{i}"), 0, &mut out)
                            .map_err(|e| anyhow::anyhow!("encoding CONNECT: {e:?}"))?;
                        ws.send(Message::binary(out.split().freeze())).await?;
                        next_binary(&mut ws, 0x20).await?;
                        if subscriptions == 0 {
                            return Ok(ws);
                        }
                        v.subscribe(&format!("{topic}/{i}"), mqttbytes::QoS::AtLeastOnce, 1, &mut out)
                            .map_err(|e| anyhow::anyhow!("encoding SUBSCRIBE: {e:?}"))?;
                        ws.send(Message::binary(out.split().freeze())).await?;
                        next_binary(&mut ws, 0x90).await?;
                        Ok(ws)
                    }
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<anyhow::Result<Ws>>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    // Allocations made lazily after the answers (pulls, long-poll waiters) settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = crate::stats::rss_of(pid).context("reading the broker's RSS")?;
    let anon_after = crate::stats::status_bytes(pid, "RssAnon").context("reading RssAnon")?;
    drop(held);
    Ok((
        after,
        after.saturating_sub(before) / n as u64,
        anon_after.saturating_sub(anon_before) / n as u64,
        rate,
    ))
}

/// Waits for a binary message whose first byte (the MQTT packet type) is `first`.
async fn next_binary(ws: &mut Ws, first: u8) -> anyhow::Result<()> {
    let next = async {
        loop {
            match ws.next().await {
                None => anyhow::bail!("the connection closed"),
                Some(m) => {
                    if let Message::Binary(b) = m? {
                        anyhow::ensure!(
                            b.first() == Some(&first),
                            "expected packet type {first:#x}, got {:?}",
                            b.first()
                        );
                        return Ok(());
                    }
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), next)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 60 s"))?
}

/// The next text frame (within 60 s, whatever control frames arrive meanwhile).
async fn next_text(ws: &mut Ws) -> anyhow::Result<String> {
    let next = async {
        loop {
            match ws.next().await {
                None => anyhow::bail!("the connection closed"),
                Some(m) => {
                    if let Message::Text(t) = m? {
                        return Ok(t.to_string());
                    }
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), next)
        .await
        .map_err(|_| anyhow::anyhow!("no frame within 60 s"))?
}

/// The number after `"field":` in a flat JSON frame (enough for the bench's own parsing).
fn field_u64(frame: &str, field: &str) -> Option<u64> {
    let at = frame.find(&format!("\"{field}\":"))? + field.len() + 3;
    let digits: String = frame[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// The send time (ns since `base`) the publisher wrote at the start of the body.
fn body_stamp(frame: &str) -> Option<u64> {
    let at = frame.find("\"body\":\"")? + 8;
    frame.get(at..at + 20)?.parse().ok()
}

async fn scenario(
    addr: SocketAddr,
    pid: u32,
    n: usize,
    args: &WsBenchArgs,
) -> anyhow::Result<Outcome> {
    let messages = (args.deliveries / n as u64).max(1);
    let topic = format!("fanout{n}");
    let mut publisher = connect(addr).await?;
    // The first publish creates the topic; subscribers start after it.
    publisher
        .send(Message::text(format!(
            r#"{{"op":"publish","topic":"{topic}","body":"warm-up"}}"#
        )))
        .await?;
    let first = next_text(&mut publisher).await?;
    anyhow::ensure!(
        first.contains("send_result"),
        "warm-up publish failed: {first}"
    );

    let rss_before = crate::stats::rss_of(pid).unwrap_or(0);
    let base = Instant::now();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n);
    let mut subs = Vec::with_capacity(n);
    for i in 0..n {
        let mut ws = connect(addr).await?;
        let subscribe = format!(
            r#"{{"op":"subscribe","id":"s{i}","topic":"{topic}","group":"bench","mode":"broadcasting","start":"latest","credit":{}}}"#,
            messages * 2
        );
        ws.send(Message::text(subscribe)).await?;
        let ready = ready_tx.clone();
        subs.push(tokio::spawn(async move {
            let answer = next_text(&mut ws).await?;
            anyhow::ensure!(answer.contains("subscribed"), "subscribe failed: {answer}");
            let _ = ready.send(()).await;
            let mut lat = Latencies::with_capacity(messages as usize);
            let mut got = 0u64;
            let mut last_done = Instant::now();
            // Highest offset received per queue since the last ack.
            let mut unacked: std::collections::BTreeMap<u64, u64> = Default::default();
            while got < messages {
                let frame = next_text(&mut ws).await?;
                let now = base.elapsed().as_nanos() as u64;
                let Some(stamp) = body_stamp(&frame) else {
                    continue;
                };
                lat.record(Duration::from_nanos(now.saturating_sub(stamp)));
                got += 1;
                last_done = Instant::now();
                let q = field_u64(&frame, "queue_id").unwrap_or(0);
                let o = field_u64(&frame, "queue_offset").unwrap_or(0);
                unacked.insert(q, o);
                if got.is_multiple_of(100) || got == messages {
                    // Ack everything received, one cumulative ack per queue.
                    for (q, o) in std::mem::take(&mut unacked) {
                        ws.send(Message::text(format!(
                            r#"{{"op":"ack","id":"s{i}","queue_id":{q},"offset":{o}}}"#
                        )))
                        .await?;
                    }
                }
            }
            let _ = ws.close(None).await;
            anyhow::Ok((lat, last_done))
        }));
    }
    drop(ready_tx);
    for _ in 0..n {
        ready_rx
            .recv()
            .await
            .context("a subscriber failed before subscribing")?;
    }
    let rss_after = crate::stats::rss_of(pid).unwrap_or(0);

    // Publish with a window of outstanding requests, optionally paced.
    let start = Instant::now();
    let pad = args.size.saturating_sub(20);
    let (mut sink, mut stream) = publisher.split();
    let (permits_tx, mut permits_rx) = tokio::sync::mpsc::channel::<()>(args.window.max(1));
    for _ in 0..args.window.max(1) {
        permits_tx.send(()).await?;
    }
    let acks = tokio::spawn(async move {
        let mut ok = 0u64;
        while ok < messages {
            match stream.next().await {
                Some(Ok(Message::Text(t))) => {
                    anyhow::ensure!(t.contains("send_result"), "publish failed: {t}");
                    ok += 1;
                    let _ = permits_tx.send(()).await;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the publisher connection closed"),
            }
        }
        anyhow::Ok(stream)
    });
    for k in 0..messages {
        if args.rate > 0 {
            let due = start + Duration::from_secs_f64(k as f64 / args.rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        permits_rx.recv().await.context("publisher acks stopped")?;
        let stamp = base.elapsed().as_nanos() as u64;
        let body = format!("{stamp:020}{}", "x".repeat(pad));
        sink.send(Message::text(format!(
            r#"{{"op":"publish","topic":"{topic}","body":"{body}"}}"#
        )))
        .await?;
    }
    let _stream = acks.await??;

    let mut latencies = Latencies::with_capacity((messages as usize) * n);
    let mut end = start;
    for s in subs {
        let (lat, last) = s.await??;
        latencies.merge(lat);
        end = end.max(last);
    }
    Ok(Outcome {
        messages,
        deliveries: messages * n as u64,
        secs: end.duration_since(start).as_secs_f64(),
        latencies,
        rss_per_conn: rss_after.saturating_sub(rss_before) / n as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_and_stamps_of_message_frames() {
        let f = r#"{"type":"message","queue_id":3,"queue_offset":1234,"body":"00000000000000004242xxxx"}"#;
        assert_eq!(field_u64(f, "queue_id"), Some(3));
        assert_eq!(field_u64(f, "queue_offset"), Some(1234));
        assert_eq!(body_stamp(f), Some(4242));
    }
}
