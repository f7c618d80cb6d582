//! `rocketgate bench consume`: how fast a catching-up consumer reads a backlog through
//! the broker's pull, and how soon an idle long-polling pull returns after an append.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    Broker, BrokerSettings, MessagingApi, PullRequest, PullStatus, QueueChoice, SystemClock,
    TopicConfig,
};
use rocketgate_core::store::{FlushMode, Message, Store, StoreDeps, StoreSettings};

use crate::stats::{Latencies, PeakRss, fmt_bytes, fmt_dur};

#[derive(Debug, Clone, Args)]
pub struct ConsumeBenchArgs {
    /// Directory for the benchmark's store (a fresh subdirectory, deleted after).
    #[arg(long, default_value = "bench-data")]
    pub dir: PathBuf,
    /// Backlog to read, in messages.
    #[arg(long, default_value_t = 2_000_000)]
    pub messages: u64,
    /// Message body size in bytes.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Queues of the topic (one catching-up reader task per queue).
    #[arg(long, default_value_t = 4)]
    pub queues: u32,
    /// Messages per pull.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Append-to-wake-up samples for the long-poll latency.
    #[arg(long, default_value_t = 2000)]
    pub wakeups: usize,
}

pub fn run(args: ConsumeBenchArgs) -> anyhow::Result<()> {
    let dir = args.dir.join("consume");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let opts = StoreSettings {
        flush: FlushMode::Async {
            interval: Duration::from_millis(500),
        },
        ..StoreSettings::default()
    };
    let (store, _) = Store::open(&dir, opts, StoreDeps::fixed_usage(0.1))?;
    let store = Arc::new(store);
    let broker = Arc::new(Broker::open(
        store.clone(),
        BrokerSettings::default(),
        Arc::new(SystemClock),
    )?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!("# rocketgate bench consume");
    rt.block_on(async {
        broker
            .create_topic(TopicConfig::new("backlog", args.queues))
            .await?;
        broker.create_topic(TopicConfig::new("idle", 1)).await?;
        anyhow::Ok(())
    })?;

    // The backlog, written straight to the store in batches (this measures reading).
    let t = Instant::now();
    let body = bytes::Bytes::from(vec![b'c'; args.size]);
    let per_queue = args.messages / u64::from(args.queues);
    for q in 0..args.queues {
        let mut left = per_queue;
        while left > 0 {
            let n = left.min(256);
            let batch: Vec<Message> = (0..n)
                .map(|_| Message::new("backlog", q, body.clone()).with_tags("t"))
                .collect();
            store.put_batch(&batch)?;
            left -= n;
        }
    }
    store.wait_dispatched(Duration::from_secs(600));
    let total = per_queue * u64::from(args.queues);
    println!(
        "backlog: {total} messages of {} B in {} queues, written in {:.1}s",
        args.size,
        args.queues,
        t.elapsed().as_secs_f64()
    );

    PeakRss::reset();
    let (read, secs) = rt.block_on(catch_up(&broker, &args))?;
    anyhow::ensure!(read == total, "read {read} of {total} messages");
    println!(
        "catch-up read: {read} messages in {secs:.2}s = {:.0} msgs/s ({:.1} MB/s of bodies), peak RSS {}",
        read as f64 / secs,
        read as f64 * args.size as f64 / secs / 1e6,
        fmt_bytes(PeakRss::bytes())
    );

    let mut lat = rt.block_on(wakeups(&broker, args.wakeups))?;
    let s = lat.summary();
    println!(
        "long-poll wake-up (append -> pull returns, idle queue), {} samples: p50 {} p99 {} p999 {} max {}",
        args.wakeups,
        fmt_dur(s.p50),
        fmt_dur(s.p99),
        fmt_dur(s.p999),
        fmt_dur(s.max)
    );

    broker.close()?;
    store.close()?;
    drop(broker);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// One task per queue pulls from offset 0 to the end; returns (messages, seconds).
async fn catch_up(broker: &Arc<Broker>, args: &ConsumeBenchArgs) -> anyhow::Result<(u64, f64)> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for q in 0..args.queues {
        let broker = broker.clone();
        let batch = args.batch;
        tasks.push(tokio::spawn(async move {
            let mut offset = 0;
            let mut read = 0u64;
            loop {
                let r = broker
                    .pull(PullRequest {
                        group: "bench".into(),
                        member: "reader".into(),
                        topic: "backlog".into(),
                        queue_id: q,
                        offset,
                        max_messages: batch,
                        filter: Filter::all(),
                        wait: Duration::ZERO,
                    })
                    .await?;
                read += r.messages.len() as u64;
                offset = r.next_offset;
                if r.status != PullStatus::Found && offset >= r.max_offset {
                    break;
                }
            }
            anyhow::Ok(read)
        }));
    }
    let mut read = 0;
    for t in tasks {
        read += t.await??;
    }
    Ok((read, start.elapsed().as_secs_f64()))
}

/// A pull waits on an idle queue; another task appends one message; the time from
/// just before the append to the pull's return is one sample.
async fn wakeups(broker: &Arc<Broker>, samples: usize) -> anyhow::Result<Latencies> {
    let mut lat = Latencies::with_capacity(samples);
    let mut offset = 0;
    for _ in 0..samples {
        let b = broker.clone();
        let waiter = tokio::spawn(async move {
            let r = b
                .pull(PullRequest {
                    group: "bench".into(),
                    member: "waiter".into(),
                    topic: "idle".into(),
                    queue_id: 0,
                    offset,
                    max_messages: 1,
                    filter: Filter::all(),
                    wait: Duration::from_secs(10),
                })
                .await;
            (Instant::now(), r)
        });
        // Let the pull reach its wait before appending.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let sent_at = Instant::now();
        broker
            .send(
                Message::new("idle", 0, b"ping".to_vec()),
                QueueChoice::Queue(0),
            )
            .await?;
        let (returned_at, r) = waiter.await?;
        let r = r?;
        anyhow::ensure!(r.status == PullStatus::Found, "the pull timed out");
        offset = r.next_offset;
        lat.record(returned_at.saturating_duration_since(sent_at));
    }
    Ok(lat)
}
