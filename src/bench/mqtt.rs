//! `rocketgate bench mqtt`: an MQTT 3.1.1 load generator for point-to-point, fan-in
//! (N publishers -> one shared subscription of N members) and fan-out (1 -> N), QoS 0
//! or 1. It speaks plain MQTT (the `mqttbytes` codec) so it can drive any broker
//! (`--addr`); without `--addr` it starts rocketgate in-process on a fresh store.
//!
//! Publishers encode many PUBLISH packets into one buffer per socket write (QoS 1:
//! up to `--inflight` unacknowledged), subscribers acknowledge a whole read's worth
//! of messages with one write, so the generator is not the bottleneck. Each payload
//! starts with the send time; the receiver turns it into publish -> receive latency.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Buf, BytesMut};
use clap::{Args, ValueEnum};
use mqttbytes::QoS;
use mqttbytes::v4::{self, Packet};
use rocketgate_core::broker::{Broker, BrokerOptions, SystemClock};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::stats::{Latencies, fmt_dur};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// One publisher, one subscriber.
    P2p,
    /// `--clients` publishers, one shared subscription with `--clients` members.
    FanIn,
    /// One publisher, `--clients` subscribers of the same topic.
    FanOut,
}

#[derive(Debug, Clone, Args)]
pub struct MqttBenchArgs {
    /// Broker to drive (`host:port`); without it rocketgate runs in-process.
    #[arg(long)]
    pub addr: Option<SocketAddr>,
    /// Store directory of the in-process broker (a fresh subdirectory, deleted after).
    #[arg(long, default_value = "bench-data")]
    pub dir: PathBuf,
    /// The in-process broker acknowledges only durable messages (group commit).
    #[arg(long)]
    pub sync: bool,
    #[arg(long, value_enum, default_value_t = Scenario::P2p)]
    pub scenario: Scenario,
    /// Publish and subscribe QoS (0 or 1).
    #[arg(long, default_value_t = 1)]
    pub qos: u8,
    /// Payload size in bytes (at least 8: the send time).
    #[arg(long, default_value_t = 16)]
    pub size: usize,
    /// Messages per publisher.
    #[arg(long, default_value_t = 200_000)]
    pub messages: u64,
    /// Publishers (fan-in) or subscribers (fan-out).
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Unacknowledged QoS 1 publishes per publisher.
    #[arg(long, default_value_t = 256)]
    pub inflight: usize,
}

pub fn run(args: MqttBenchArgs) -> anyhow::Result<()> {
    if args.qos > 1 {
        bail!("--qos must be 0 or 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match args.addr {
            Some(addr) => drive(&args, addr).await,
            None => {
                let dir = args.dir.join("mqtt");
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let flush = if args.sync {
                    FlushMode::Sync {
                        timeout: Duration::from_secs(5),
                    }
                } else {
                    FlushMode::Async {
                        interval: Duration::from_millis(500),
                    }
                };
                let opts = StoreOptions {
                    flush,
                    ..StoreOptions::default()
                };
                let (store, _) = Store::open(&dir, opts, StoreDeps::default())?;
                let store = Arc::new(store);
                let broker = Arc::new(Broker::open(
                    store.clone(),
                    BrokerOptions::default(),
                    Arc::new(SystemClock),
                )?);
                let settings = rocketgate_mqtt::Settings::new(dir.join("mqtt"));
                let (server, addr) =
                    rocketgate_mqtt::Server::bind("127.0.0.1:0".parse()?, broker.clone(), settings)
                        .await?;
                let handle = server.spawn();
                println!(
                    "in-process rocketgate on {addr} ({} flush)",
                    if args.sync { "sync" } else { "async" }
                );
                let r = drive(&args, addr).await;
                handle.stop().await;
                broker.close()?;
                store.close()?;
                let _ = std::fs::remove_dir_all(&dir);
                r
            }
        }
    })
}

async fn drive(args: &MqttBenchArgs, addr: SocketAddr) -> anyhow::Result<()> {
    let qos = if args.qos == 1 {
        QoS::AtLeastOnce
    } else {
        QoS::AtMostOnce
    };
    let run_id = std::process::id();
    let topic = format!("bench/{run_id}");
    let (publishers, subscribers, filter) = match args.scenario {
        Scenario::P2p => (1, 1, topic.clone()),
        Scenario::FanIn => (
            args.clients,
            args.clients,
            format!("$share/b{run_id}/{topic}"),
        ),
        Scenario::FanOut => (1, args.clients, topic.clone()),
    };
    let expected = match args.scenario {
        Scenario::FanOut => args.messages * subscribers as u64,
        _ => args.messages * publishers as u64,
    };
    let base = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let mut subs = Vec::new();
    for i in 0..subscribers {
        let (rd, wr) = connect(addr, &format!("bench-sub-{run_id}-{i}")).await?;
        let (rd, wr) = subscribe(rd, wr, &filter, qos).await?;
        subs.push(tokio::spawn(receive(
            rd,
            wr,
            base,
            received.clone(),
            done_rx.clone(),
        )));
    }
    let started = Instant::now();
    let mut pubs = Vec::new();
    for i in 0..publishers {
        let (rd, wr) = connect(addr, &format!("bench-pub-{run_id}-{i}")).await?;
        let (topic, n, size, window) = (topic.clone(), args.messages, args.size, args.inflight);
        pubs.push(tokio::spawn(publish(
            rd,
            wr,
            topic,
            qos,
            n,
            size.max(8),
            window,
            base,
        )));
    }
    for p in pubs {
        p.await??;
    }
    let published_in = started.elapsed();
    // Wait for every message, giving up after 10 s without progress.
    let mut last = 0;
    let mut idle_since = Instant::now();
    while received.load(Ordering::Relaxed) < expected {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = received.load(Ordering::Relaxed);
        if now != last {
            last = now;
            idle_since = Instant::now();
        } else if idle_since.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let elapsed = started.elapsed();
    let _ = done_tx.send(true);
    let mut lat = Latencies::with_capacity(expected as usize);
    for s in subs {
        if let Ok(Ok(l)) = s.await {
            lat.merge(l);
        }
    }
    let got = received.load(Ordering::Relaxed);
    let s = lat.summary();
    println!(
        "mqtt {:?} qos{} {} B: {} publisher(s), {} subscriber(s)",
        args.scenario, args.qos, args.size, publishers, subscribers
    );
    println!(
        "  published {} in {} ({:.0} msg/s)",
        args.messages * publishers as u64,
        fmt_dur(published_in),
        (args.messages * publishers as u64) as f64 / published_in.as_secs_f64()
    );
    println!(
        "  received  {got}/{expected} in {} ({:.0} msg/s)",
        fmt_dur(elapsed),
        got as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  publish->receive latency p50 {} p99 {} max {}",
        fmt_dur(s.p50),
        fmt_dur(s.p99),
        fmt_dur(s.max)
    );
    if got < expected {
        bail!("{} messages never arrived", expected - got);
    }
    Ok(())
}

fn codec(e: mqttbytes::Error) -> anyhow::Error {
    anyhow::anyhow!("encoding a packet: {e:?}")
}

async fn connect(addr: SocketAddr, id: &str) -> anyhow::Result<(OwnedReadHalf, OwnedWriteHalf)> {
    let sock = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    sock.set_nodelay(true)?;
    let (mut rd, mut wr) = sock.into_split();
    let mut c = v4::Connect::new(id);
    c.keep_alive = 60;
    let mut out = BytesMut::new();
    c.write(&mut out).map_err(codec)?;
    wr.write_all(&out).await?;
    let mut buf = BytesMut::new();
    match next_packet(&mut rd, &mut buf).await? {
        Packet::ConnAck(a) if a.code == v4::ConnectReturnCode::Success => Ok((rd, wr)),
        other => bail!("connect refused: {other:?}"),
    }
}

async fn subscribe(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    filter: &str,
    qos: QoS,
) -> anyhow::Result<(OwnedReadHalf, OwnedWriteHalf)> {
    let mut s = v4::Subscribe::new(filter, qos);
    s.pkid = 1;
    let mut out = BytesMut::new();
    s.write(&mut out).map_err(codec)?;
    wr.write_all(&out).await?;
    let mut buf = BytesMut::new();
    match next_packet(&mut rd, &mut buf).await? {
        Packet::SubAck(_) => Ok((rd, wr)),
        other => bail!("subscribe failed: {other:?}"),
    }
}

async fn next_packet(rd: &mut OwnedReadHalf, buf: &mut BytesMut) -> anyhow::Result<Packet> {
    loop {
        match v4::read(buf, 1 << 20) {
            Ok(p) => return Ok(p),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {}
            Err(e) => bail!("bad packet: {e:?}"),
        }
        if rd.read_buf(buf).await? == 0 {
            bail!("connection closed");
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn publish(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    topic: String,
    qos: QoS,
    n: u64,
    size: usize,
    window: usize,
    base: Instant,
) -> anyhow::Result<()> {
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut payload = vec![0u8; size];
    let mut sent = 0u64;
    let mut acked = 0u64;
    let mut pkid: u16 = 0;
    let burst = if qos == QoS::AtMostOnce {
        64
    } else {
        window.max(1)
    };
    while sent < n || acked < sent {
        // Fill the window (QoS 0: a burst), one socket write.
        while sent < n && (sent - acked) < burst as u64 {
            let t = base.elapsed().as_nanos() as u64;
            payload[..8].copy_from_slice(&t.to_be_bytes());
            let mut p = v4::Publish::new(topic.as_str(), qos, payload.clone());
            if qos != QoS::AtMostOnce {
                pkid = if pkid == u16::MAX { 1 } else { pkid + 1 };
                p.pkid = pkid;
            }
            p.write(&mut out).map_err(codec)?;
            sent += 1;
        }
        if !out.is_empty() {
            wr.write_all(&out).await?;
            out.clear();
        }
        if qos == QoS::AtMostOnce {
            acked = sent;
            continue;
        }
        // Read acknowledgements (as many as arrived).
        if rd.read_buf(&mut buf).await? == 0 {
            bail!("publisher connection closed");
        }
        loop {
            match v4::read(&mut buf, 1 << 20) {
                Ok(Packet::PubAck(_)) => acked += 1,
                Ok(_) => {}
                Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(e) => bail!("bad packet: {e:?}"),
            }
        }
    }
    let mut d = BytesMut::new();
    v4::Disconnect.write(&mut d).map_err(codec)?;
    let _ = wr.write_all(&d).await;
    Ok(())
}

async fn receive(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    base: Instant,
    received: Arc<AtomicU64>,
    mut done: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Latencies> {
    let mut lat = Latencies::with_capacity(1 << 16);
    let mut buf = BytesMut::with_capacity(256 * 1024);
    let mut acks = BytesMut::with_capacity(16 * 1024);
    loop {
        tokio::select! {
            r = rd.read_buf(&mut buf) => if r? == 0 {
                return Ok(lat);
            },
            _ = done.changed() => return Ok(lat),
        }
        let mut count = 0;
        loop {
            match v4::read(&mut buf, 1 << 20) {
                Ok(Packet::Publish(p)) => {
                    let mut pl = &p.payload[..];
                    if pl.len() >= 8 {
                        let t = pl.get_u64();
                        let now = base.elapsed().as_nanos() as u64;
                        lat.record(Duration::from_nanos(now.saturating_sub(t)));
                    }
                    if p.qos == QoS::AtLeastOnce {
                        v4::PubAck::new(p.pkid).write(&mut acks).map_err(codec)?;
                    }
                    count += 1;
                }
                Ok(_) => {}
                Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(e) => bail!("bad packet: {e:?}"),
            }
        }
        if !acks.is_empty() {
            wr.write_all(&acks).await?;
            acks.clear();
        }
        received.fetch_add(count, Ordering::Relaxed);
    }
}
