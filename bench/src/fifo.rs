//! `rocketgate bench fifo`: POP receive throughput of an ordered (FIFO) group
//! against a concurrent one, same backlog, same consumers, same run.
//!
//! A backlog is written straight to the store over the topic's queues; then, for
//! each kind of group in turn, `consumers` tasks POP batches and ack every message
//! (one `ack` per message, as a receiver does) until the backlog is consumed. The FIFO
//! run also checks that each queue's messages were acked in queue order.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    Broker, BrokerSettings, MessagingApi, PopRequest, SystemClock, TopicConfig,
};
use rocketgate_core::store::{FlushMode, Message, Store, StoreDeps, StoreSettings};

#[derive(Debug, Clone, Args)]
pub struct FifoBenchArgs {
    /// Directory for the benchmark's store (a fresh subdirectory, deleted after).
    #[arg(long, default_value = "bench-data")]
    pub dir: PathBuf,
    /// Backlog each group consumes, in messages.
    #[arg(long, default_value_t = 400_000)]
    pub messages: u64,
    /// Message body size in bytes.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Queues of the topic.
    #[arg(long, default_value_t = 8)]
    pub queues: u32,
    /// Consumer tasks per group.
    #[arg(long, default_value_t = 8)]
    pub consumers: usize,
    /// Messages per POP.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
}

pub fn run(args: FifoBenchArgs) -> anyhow::Result<()> {
    let dir = args.dir.join("fifo");
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
    println!("# rocketgate bench fifo");
    rt.block_on(broker.create_topic(TopicConfig::new("orders", args.queues)))?;
    let body = bytes::Bytes::from(vec![b'f'; args.size]);
    let per_queue = args.messages / u64::from(args.queues);
    for q in 0..args.queues {
        let mut left = per_queue;
        while left > 0 {
            let n = left.min(256);
            let batch: Vec<Message> = (0..n)
                .map(|_| Message::new("orders", q, body.clone()))
                .collect();
            store.put_batch(&batch)?;
            left -= n;
        }
    }
    store.wait_dispatched(Duration::from_secs(600));
    let total = per_queue * u64::from(args.queues);
    println!(
        "backlog: {total} messages of {} B over {} queues; {} consumers, {} per POP, one ack per message",
        args.size, args.queues, args.consumers, args.batch
    );
    let concurrent = rt.block_on(consume(&broker, &args, "bench-concurrent", false, total))?;
    println!("concurrent group: {concurrent:.0} msgs/s");
    let fifo = rt.block_on(consume(&broker, &args, "bench-fifo", true, total))?;
    println!("fifo group:       {fifo:.0} msgs/s (every queue acked in order)");
    println!("fifo / concurrent: {:.2}", fifo / concurrent);
    broker.close()?;
    store.close()?;
    drop(broker);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Consumes the whole backlog with `args.consumers` tasks; returns msgs/s.
async fn consume(
    broker: &Arc<Broker>,
    args: &FifoBenchArgs,
    group: &str,
    fifo: bool,
    total: u64,
) -> anyhow::Result<f64> {
    broker.set_fifo(group, fifo).await?;
    // The last acked offset of each queue, to check the FIFO run's order.
    let last: Arc<Mutex<HashMap<u32, u64>>> = Arc::default();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.consumers {
        let (broker, last) = (broker.clone(), last.clone());
        let req = PopRequest {
            group: group.to_owned(),
            topic: "orders".into(),
            filter: Filter::all(),
            max_messages: args.batch,
            invisible: Duration::from_secs(60),
            wait: Duration::from_millis(50),
        };
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            let mut idle = 0;
            while idle < 3 {
                let popped = broker.pop(req.clone()).await?;
                if popped.is_empty() {
                    idle += 1;
                    continue;
                }
                idle = 0;
                for p in popped {
                    broker.ack(&p.receipt.to_string()).await?;
                    if fifo {
                        let (q, o) = (p.message.queue_id, p.message.queue_offset);
                        let mut l = last.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                        let prev = l.insert(q, o);
                        anyhow::ensure!(
                            prev.is_none_or(|prev| prev < o),
                            "queue {q}: offset {o} acked after {prev:?}"
                        );
                    }
                    done += 1;
                }
            }
            anyhow::Ok(done)
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    anyhow::ensure!(done == total, "{group}: consumed {done} of {total}");
    // The consumers' last empty POPs (3 waits each) are not consumption.
    let secs = start.elapsed().as_secs_f64() - 3.0 * 0.05;
    Ok(total as f64 / secs.max(1e-3))
}
