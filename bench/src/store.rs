//! `rocketgate bench store`: append throughput and latency of the storage engine, for
//! each (flush mode, message size, producer count), next to the raw ceiling of the
//! same disk measured in the same run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rocketgate_core::store::{FlushMode, Message, Store, StoreDeps, StoreSettings};

use crate::stats::{Latencies, PeakRss, fmt_bytes, fmt_dur};

#[derive(Debug, Clone, Args)]
pub struct StoreBenchArgs {
    /// Directory for the benchmark's stores (a fresh subdirectory per run, deleted after).
    #[arg(long, default_value = "bench-data")]
    pub dir: PathBuf,
    /// Message body sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "100,1024,4096")]
    pub sizes: Vec<usize>,
    /// Concurrent producer counts.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub producers: Vec<usize>,
    /// Flush modes: async, sync.
    #[arg(long, value_delimiter = ',', default_value = "async,sync")]
    pub flush: Vec<String>,
    /// Messages per scenario (at most; see --seconds).
    #[arg(long, default_value_t = 500_000)]
    pub messages: u64,
    /// Upper bound on bytes written per scenario.
    #[arg(long, default_value = "1024", value_name = "MiB")]
    pub max_mib: u64,
    /// Stop a scenario after this many seconds even if not all messages were sent.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Segment size in MiB.
    #[arg(long, default_value_t = 1024)]
    pub segment_mib: u64,
    /// Appends each sync-flush producer keeps outstanding (1 = closed loop: send,
    /// wait for the ack, send the next). Async-flush acks are immediate, so 1 there.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub inflight: Vec<usize>,
    /// Accumulation mode: pre-fill the store with this many 100-byte messages first,
    /// then measure append latency (compare with a run on an empty store).
    #[arg(long, default_value_t = 0)]
    pub prefill: u64,
    /// The store's pre-faulting thread (`rg-prefault`): on, off, or both
    /// (`on,off`: the same scenarios twice, to see what it saves).
    #[arg(long, value_delimiter = ',', default_value = "on")]
    pub prefault: Vec<String>,
}

/// One scenario's result.
struct Row {
    flush: &'static str,
    size: usize,
    producers: usize,
    inflight: usize,
    msgs: u64,
    syncs: u64,
    secs: f64,
    lat: crate::stats::Summary,
    peak_rss: u64,
    /// Minor page faults per message taken by every thread but `rg-prefault`:
    /// the faults on the send path (appenders, inline dispatch, flusher).
    faults_per_msg: f64,
}

impl Row {
    fn msgs_per_sec(&self) -> f64 {
        self.msgs as f64 / self.secs
    }
    fn mb_per_sec(&self) -> f64 {
        self.msgs as f64 * self.size as f64 / self.secs / 1e6
    }
}

pub fn run(args: StoreBenchArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let volume = (args.max_mib << 20).min(args.messages * 1024).max(64 << 20);
    println!("# rocketgate bench store");
    println!(
        "# dir={} cores={} volume for raw ceilings={}",
        args.dir.display(),
        num_cpus(),
        fmt_bytes(volume)
    );

    let raw_mmap = raw_mmap_write(&args.dir, volume)?;
    let raw_sync = raw_fdatasync_per_mib(&args.dir, volume.min(256 << 20))?;
    println!("raw sequential mmap write:      {:>9.1} MB/s", raw_mmap);
    println!("raw write + fdatasync per 1MiB: {:>9.1} MB/s", raw_sync);
    println!();
    println!(
        "{:<6} {:>4} {:>6} {:>5} {:>5} {:>10} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "flush",
        "pref",
        "size",
        "prod",
        "infl",
        "msgs",
        "msgs/s",
        "MB/s",
        "vs raw",
        "p50",
        "p99",
        "p999",
        "max",
        "peak RSS",
        "msg/sync",
        "flt/msg"
    );
    let mut prefaults = Vec::new();
    for p in &args.prefault {
        prefaults.push(match p.as_str() {
            "on" => true,
            "off" => false,
            other => anyhow::bail!("--prefault: `{other}` is not on or off"),
        });
    }
    for (flush, &prefault) in args
        .flush
        .iter()
        .flat_map(|f| prefaults.iter().map(move |p| (f, p)))
    {
        let flush: &'static str = match flush.as_str() {
            "async" => "async",
            "sync" => "sync",
            other => anyhow::bail!("--flush: `{other}` is not async or sync"),
        };
        let inflights: &[usize] = if flush == "sync" {
            &args.inflight
        } else {
            &[1]
        };
        for &size in &args.sizes {
            for (&producers, &inflight) in args
                .producers
                .iter()
                .flat_map(|p| inflights.iter().map(move |i| (p, i)))
            {
                let row = scenario(&args, flush, size, producers, inflight, prefault)?;
                let ceiling = if flush == "async" { raw_mmap } else { raw_sync };
                println!(
                    "{:<6} {:>4} {:>6} {:>5} {:>5} {:>10} {:>12.0} {:>9.1} {:>8.0}% {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8.3}",
                    row.flush,
                    if prefault { "on" } else { "off" },
                    row.size,
                    row.producers,
                    row.inflight,
                    row.msgs,
                    row.msgs_per_sec(),
                    row.mb_per_sec(),
                    row.mb_per_sec() / ceiling * 100.0,
                    fmt_dur(row.lat.p50),
                    fmt_dur(row.lat.p99),
                    fmt_dur(row.lat.p999),
                    fmt_dur(row.lat.max),
                    fmt_bytes(row.peak_rss),
                    if row.flush == "sync" {
                        format!("{:.1}", row.msgs as f64 / row.syncs.max(1) as f64)
                    } else {
                        "-".to_string()
                    },
                    row.faults_per_msg,
                );
            }
        }
    }
    println!(
        "\n(vs raw: async rows against the raw mmap write, sync rows against write+fdatasync per 1MiB)"
    );
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn fresh_dir(base: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let dir = base.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn scenario(
    args: &StoreBenchArgs,
    flush: &'static str,
    size: usize,
    producers: usize,
    inflight: usize,
    prefault: bool,
) -> anyhow::Result<Row> {
    let dir = fresh_dir(&args.dir, &format!("store-{flush}-{size}-{producers}"))?;
    let opts = StoreSettings {
        segment_size: args.segment_mib << 20,
        flush: match flush {
            "sync" => FlushMode::Sync {
                timeout: Duration::from_secs(10),
            },
            _ => FlushMode::Async {
                interval: Duration::from_millis(500),
            },
        },
        prefault,
        ..StoreSettings::default()
    };
    let (store, _) = Store::open(&dir, opts, StoreDeps::fixed_usage(0.1))?;
    let store = Arc::new(store);
    if args.prefill > 0 {
        prefill(&store, args.prefill)?;
    }
    let total = args
        .messages
        .min((args.max_mib << 20) / size as u64)
        .max(producers as u64);
    // Producers are tokio tasks, as in the gateways; each keeps `inflight` appends
    // outstanding (1 = wait for each ack before the next send).
    let tasks = producers * inflight;
    let per_task = (total / tasks as u64).max(1);
    let done = Arc::new(AtomicU64::new(0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    PeakRss::reset();
    let syncs_before = store.sync_count();
    let faults_before = send_path_faults();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.seconds);
    let body = bytes::Bytes::from(vec![b'x'; size]);
    let mut lat = rt.block_on(async {
        let mut handles = Vec::new();
        for t in 0..tasks {
            let store = store.clone();
            let done = done.clone();
            let body = body.clone();
            handles.push(tokio::spawn(async move {
                let mut lat = Latencies::with_capacity(per_task as usize);
                for i in 0..per_task {
                    if i % 16 == 0 && Instant::now() >= deadline {
                        break;
                    }
                    let msg = Message::new("bench", (t % 8) as u32, body.clone());
                    let t0 = Instant::now();
                    store.put_batch_async(std::slice::from_ref(&msg)).await?;
                    lat.record(t0.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(lat)
            }));
        }
        let mut all = Latencies::default();
        for h in handles {
            all.merge(h.await??);
        }
        anyhow::Ok(all)
    })?;
    let secs = start.elapsed().as_secs_f64();
    let faults = send_path_faults().saturating_sub(faults_before);
    let peak_rss = PeakRss::bytes();
    let syncs = store.sync_count() - syncs_before;
    let msgs = done.load(Ordering::Relaxed);
    store.close()?;
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Row {
        flush,
        size,
        producers,
        inflight,
        msgs,
        syncs,
        secs,
        lat: lat.summary(),
        peak_rss,
        faults_per_msg: faults as f64 / msgs.max(1) as f64,
    })
}

/// Minor page faults of every thread of this process except `rg-prefault`
/// (`/proc/self/task/*/stat`); the runtime's workers move tasks between threads,
/// so only the sum means something. Threads that ended meanwhile are not
/// counted: the store's and the runtime's live through a scenario.
fn send_path_faults() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            let (comm, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            // minflt is field 10 of stat(5); `rest` starts at field 3.
            let minflt: u64 = rest.split_whitespace().nth(7)?.parse().ok()?;
            (comm != "rg-prefault").then_some(minflt)
        })
        .sum()
}

fn prefill(store: &Store, n: u64) -> anyhow::Result<()> {
    let t = Instant::now();
    let body = vec![b'p'; 100];
    let batch: Vec<Message> = (0..256)
        .map(|i| Message::new("prefill", i % 8, body.clone()))
        .collect();
    let mut done = 0;
    while done < n {
        store.put_batch(&batch)?;
        done += batch.len() as u64;
    }
    store.wait_dispatched(Duration::from_secs(600));
    println!(
        "# prefilled {done} messages of 100 B in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Sequential memcpy into a memory-mapped file of `volume` bytes: what an async append
/// does at best. MB/s.
fn raw_mmap_write(base: &Path, volume: u64) -> anyhow::Result<f64> {
    let dir = fresh_dir(base, "raw-mmap")?;
    let chunk = vec![0xA5u8; 1 << 20];
    let file_size: u64 = 256 << 20;
    let start = Instant::now();
    let mut written = 0u64;
    let mut n = 0;
    while written < volume {
        let path = dir.join(format!("{n:020}"));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let len = file_size.min(volume - written);
        f.set_len(len)?;
        // SAFETY: the file is ours alone for this measurement.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f)? };
        for c in map.chunks_mut(chunk.len()) {
            c.copy_from_slice(&chunk[..c.len()]);
        }
        written += len;
        n += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(written as f64 / secs / 1e6)
}

/// `write(2)` of 1 MiB then `fdatasync`, repeated: the durable-write ceiling. MB/s.
fn raw_fdatasync_per_mib(base: &Path, volume: u64) -> anyhow::Result<f64> {
    use std::io::Write;
    let dir = fresh_dir(base, "raw-sync")?;
    let path = dir.join("data");
    let mut f = std::fs::File::create(&path)?;
    let chunk = vec![0x5Au8; 1 << 20];
    let start = Instant::now();
    let mut written = 0u64;
    while written < volume {
        f.write_all(&chunk)?;
        f.sync_data()?;
        written += chunk.len() as u64;
        if start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(written as f64 / secs / 1e6)
}
