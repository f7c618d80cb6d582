//! `rocketgate bench native`: producers and a push consumer on our Rust client, through
//! the native door (like RocketMQ's benchmark tool). By default it starts a whole node
//! in-process (NameServer + broker + native server, async flush); `--namesrv` targets a
//! running cluster instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use rocketgate_native::client::{
    ClientSettings, ConsumeResult, Message, Producer, PushConsumer, PushConsumerSettings,
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::node::start_node;
use crate::stats::{Latencies, PeakRss, fmt_bytes, fmt_dur};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Send only.
    Produce,
    /// Send, then consume everything with a push consumer.
    Both,
}

#[derive(Debug, Clone, Args)]
pub struct NativeBenchArgs {
    #[arg(long, value_enum, default_value = "both")]
    pub mode: Mode,
    /// A running cluster's NameServers (`host:port;...`); default: an in-process node.
    #[arg(long)]
    pub namesrv: Option<String>,
    /// Data directory of the in-process node (a fresh subdirectory, deleted after).
    #[arg(long, default_value = "bench-data")]
    pub dir: PathBuf,
    #[arg(long, default_value = "BenchNative")]
    pub topic: String,
    #[arg(long, default_value_t = 8)]
    pub queues: u32,
    /// Messages in total.
    #[arg(long, default_value_t = 200_000)]
    pub messages: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Messages per send (1: single sends; more: batch sends).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Producers (each its own client and connection).
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Sends in flight per producer.
    #[arg(long, default_value_t = 16)]
    pub inflight: usize,
    /// Total send rate in messages/s, shared evenly by the producers (their sends
    /// staggered over one interval); 0 = as fast as the broker takes them. A
    /// producer that falls behind its schedule sends what it owes back to back,
    /// still at most `--inflight` at once.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Send to an in-process remoting sink that answers without storing (and skip
    /// consuming): the generator's own ceiling.
    #[arg(long)]
    pub sink: bool,
}

/// The system clock in unix milliseconds, as the timestamps in bench bodies carry it.
fn now_ms() -> u64 {
    rocketgate_core::clock::now_ms().max(0) as u64
}

/// A body of `size` bytes that starts with its send time (ms), for end-to-end latency.
fn body(size: usize) -> Vec<u8> {
    let mut b = now_ms().to_be_bytes().to_vec();
    b.resize(size.max(8), b'x');
    b
}

pub fn run(args: NativeBenchArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(args))
}

async fn run_async(args: NativeBenchArgs) -> anyhow::Result<()> {
    let dir = args.dir.join("native");
    let (namesrv, _node) = match &args.namesrv {
        Some(list) => (list.clone(), None),
        None if args.sink => {
            let node = crate::native_sink::start(&args.topic, args.queues).await?;
            (node.namesrv.clone(), Some(node))
        }
        None => {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let node = start_node(&dir).await?;
            (node.namesrv.clone(), Some(node))
        }
    };
    let config = || ClientSettings::from_list(&namesrv);
    let admin = Producer::start(config(), "bench-admin").await?;
    admin.create_topic(&args.topic, args.queues).await?;
    let target = if args.sink { "sink" } else { "broker" };
    PeakRss::reset();

    // ---- produce ----
    let producer_count = args.producers.max(1);
    let per_producer = args.messages / producer_count as u64;
    let total = per_producer * producer_count as u64;
    let mut clients = Vec::with_capacity(producer_count);
    for p in 0..producer_count {
        clients.push(Producer::start(config(), format!("bench-producers-{p}")).await?);
    }
    let started = Instant::now();
    let mut producers = JoinSet::new();
    for (p, producer) in clients.into_iter().enumerate() {
        let a = args.clone();
        // With `--rate`: message k of this producer is due at (k + p / producers) / its
        // share of the rate after the start.
        let schedule = (a.rate > 0.0).then(|| {
            (
                a.rate / producer_count as f64,
                p as f64 / producer_count as f64,
            )
        });
        producers.spawn(async move {
            let permits = Arc::new(Semaphore::new(a.inflight.max(1)));
            let mut sends = JoinSet::new();
            let mut lat = Latencies::with_capacity(per_producer as usize);
            let mut sent = 0u64;
            while sent < per_producer {
                let n = (a.batch.max(1) as u64).min(per_producer - sent);
                if let Some((rate, phase)) = schedule {
                    let due = started + Duration::from_secs_f64((sent as f64 + phase) / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                sent += n;
                let permit = permits.clone().acquire_owned().await?;
                let producer = producer.clone();
                let (topic, size) = (a.topic.clone(), a.size);
                sends.spawn(async move {
                    let t = Instant::now();
                    let r = if n == 1 {
                        producer
                            .send(Message::new(topic, body(size)))
                            .await
                            .map(drop)
                    } else {
                        // One body shared by the batch's messages (same send time).
                        let body = bytes::Bytes::from(body(size));
                        let batch = (0..n)
                            .map(|_| Message::new(topic.clone(), body.clone()))
                            .collect();
                        producer.send_batch(batch).await.map(drop)
                    };
                    drop(permit);
                    r.map(|()| t.elapsed())
                });
                while let Some(done) = sends.try_join_next() {
                    lat.record(done??);
                }
            }
            while let Some(done) = sends.join_next().await {
                lat.record(done??);
            }
            producer.shutdown().await;
            anyhow::Ok(lat)
        });
    }
    let mut lat = Latencies::default();
    while let Some(done) = producers.join_next().await {
        lat.merge(done??);
    }
    let secs = started.elapsed().as_secs_f64();
    let s = lat.summary();
    let paced = if args.rate > 0.0 {
        format!(" paced at {:.0} msgs/s", args.rate)
    } else {
        String::new()
    };
    println!(
        "native produce ({target}): {total} msgs of {} B, batch {}, {} producers x {} in flight{paced}: {:.0} msgs/s, {}/s; send latency p50 {} p99 {} p999 {} max {}",
        args.size,
        args.batch,
        args.producers,
        args.inflight,
        total as f64 / secs,
        fmt_bytes((total as f64 * args.size as f64 / secs) as u64),
        fmt_dur(s.p50),
        fmt_dur(s.p99),
        fmt_dur(s.p999),
        fmt_dur(s.max),
    );

    // ---- consume ----
    if args.mode == Mode::Both && !args.sink {
        let received = Arc::new(AtomicU64::new(0));
        let e2e = Arc::new(std::sync::Mutex::new(Latencies::with_capacity(
            total as usize,
        )));
        let (r, l) = (received.clone(), e2e.clone());
        let done = Arc::new(tokio::sync::Notify::new());
        let d = done.clone();
        let mut opts = PushConsumerSettings::new("bench-consumers").subscribe(&args.topic, "*");
        opts.batch_size = 32;
        opts.pull_batch = 256;
        opts.max_cached_per_queue = 4096;
        let started = Instant::now();
        let consumer = PushConsumer::start_concurrent(config(), opts, move |msgs| {
            let now = now_ms();
            let mut l = rocketgate_core::sync::lock(&l);
            for m in msgs {
                if let Some(ts) = m.body.get(..8) {
                    let sent = u64::from_be_bytes(ts.try_into().unwrap_or_default());
                    l.record(Duration::from_millis(now.saturating_sub(sent)));
                }
            }
            if r.fetch_add(msgs.len() as u64, Ordering::Relaxed) + msgs.len() as u64 >= total {
                d.notify_one();
            }
            ConsumeResult::Success
        })
        .await?;
        tokio::time::timeout(Duration::from_secs(600), done.notified())
            .await
            .context("the consumer did not receive everything within 10 minutes")?;
        let secs = started.elapsed().as_secs_f64();
        consumer.shutdown().await;
        let s = rocketgate_core::sync::lock(&e2e).summary();
        println!(
            "native consume (backlog): {total} msgs in {secs:.2}s: {:.0} msgs/s; end-to-end (send to listener, ms clock) p50 {} p99 {} max {}",
            total as f64 / secs,
            fmt_dur(s.p50),
            fmt_dur(s.p99),
            fmt_dur(s.max),
        );
    }
    println!("peak RSS {}", fmt_bytes(PeakRss::bytes()));
    admin.shutdown().await;
    if let Some(node) = _node {
        // Stop the node (and close its store) before deleting its files.
        drop(node);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
