//! `rocketgate bench soak`: mixed traffic on every door for a long time, watching the
//! broker for leaks (issue #25 item 8).
//!
//! It starts a `rocketgate standalone` (or targets a running node: `--mqtt`, `--http`,
//! `--ws`, `--namesrv` and `--broker-pid` together) and drives, for `--minutes`:
//!
//! - MQTT: `--mqtt-clients` connections (2,000 by default), each subscribed to its own
//!   topic and publishing to its neighbour's every `--mqtt-interval` seconds, QoS 0 and
//!   1 alternating by client; `--slow-percent` of them are slow readers instead (a 4 KiB
//!   receive buffer, 512 bytes read per 50 ms) subscribed to a QoS 0 firehose that
//!   outruns them, so the broker has to bound what it holds for them;
//! - WebSocket: subscribers (each its own group) and one publisher;
//! - HTTP: one publisher and long-polling receivers of one group that ack what they get;
//! - native: our Rust client's producer and push consumer.
//!
//! Every `--row-seconds` (60: one row a minute) it appends a CSV row to
//! `OUT/soak.csv`: the broker's RSS (`VmRSS`, and `RssAnon`, the heap part), its open
//! descriptors, and per door messages/s received, p50/p99 publish→delivery latency and
//! errors. At the end it draws `OUT/soak.svg` and judges the run (see [`verdict`]): it
//! fails when the heap grew past the bound after the warm-up, descriptors grew, or a
//! door's traffic stopped in any row.
//!
//! The bound is on `RssAnon`, not `VmRSS`: the commit log is memory-mapped, so every
//! page written and touched counts in `VmRSS` as file-backed memory the kernel can
//! drop at will; it grows with the data written, not with a leak. Both are recorded.

mod chart;
mod load;
mod node;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use crate::stats::{Latencies, raise_fd_limit, status_bytes};

#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// How long to run (fractions allowed).
    #[arg(long, default_value_t = 60.0)]
    pub minutes: f64,
    /// How long to run in seconds (overrides `--minutes`; for short runs).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Seconds per CSV row.
    #[arg(long, default_value_t = 60.0)]
    pub row_seconds: f64,
    /// Rows at the start not judged (the RSS and descriptor baselines are taken at the
    /// end of them).
    #[arg(long, default_value_t = 2)]
    pub warmup_rows: usize,
    /// Where the CSV, the chart and the node's log go.
    #[arg(long, default_value = "soak-out")]
    pub out: PathBuf,
    /// MQTT connections.
    #[arg(long, default_value_t = 2000)]
    pub mqtt_clients: usize,
    /// Percent of the MQTT connections that are slow readers.
    #[arg(long, default_value_t = 3.0)]
    pub slow_percent: f64,
    /// Seconds between two publishes of one (ordinary) MQTT client.
    #[arg(long, default_value_t = 10.0)]
    pub mqtt_interval: f64,
    /// Messages/s of the QoS 0 firehose the slow readers subscribe to (1 KiB each).
    #[arg(long, default_value_t = 20.0)]
    pub firehose_rate: f64,
    /// WebSocket subscriber connections (each its own group, so each gets every message).
    #[arg(long, default_value_t = 10)]
    pub ws_subscribers: usize,
    /// WebSocket publishes per second.
    #[arg(long, default_value_t = 20.0)]
    pub ws_rate: f64,
    /// HTTP long-polling receivers (one group).
    #[arg(long, default_value_t = 4)]
    pub http_receivers: usize,
    /// HTTP publishes per second.
    #[arg(long, default_value_t = 20.0)]
    pub http_rate: f64,
    /// Native sends per second.
    #[arg(long, default_value_t = 50.0)]
    pub native_rate: f64,
    /// Allowed growth of the broker's `RssAnon` over its value at the end of the warm-up, MiB.
    #[arg(long, default_value_t = 64)]
    pub rss_growth_mib: u64,
    /// Allowed growth of the broker's open descriptors over the end of the warm-up.
    #[arg(long, default_value_t = 32)]
    pub fd_slack: u64,
    /// A running node's MQTT address (with `--http`, `--ws`, `--namesrv`, `--broker-pid`).
    #[arg(long)]
    pub mqtt: Option<std::net::SocketAddr>,
    #[arg(long)]
    pub http: Option<std::net::SocketAddr>,
    #[arg(long)]
    pub ws: Option<std::net::SocketAddr>,
    #[arg(long)]
    pub namesrv: Option<std::net::SocketAddr>,
    #[arg(long)]
    pub broker_pid: Option<u32>,
}

/// The doors, in CSV order.
pub(crate) const DOORS: [&str; 4] = ["mqtt", "ws", "http", "native"];

/// Counters of one door, shared by its load tasks and the sampler.
#[derive(Default)]
pub(crate) struct DoorStats {
    pub(crate) sent: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) errors: AtomicU64,
    latencies: std::sync::Mutex<Latencies>,
}

impl DoorStats {
    /// One delivery whose body carried `stamp` (see [`stamp`]).
    pub(crate) fn delivered(&self, stamp: u64) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let lat = Duration::from_nanos(stamp_now().saturating_sub(stamp));
        if let Ok(mut l) = self.latencies.lock() {
            l.record(lat);
        }
    }

    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every door's counters, plus the slow MQTT readers' deliveries.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) doors: [DoorStats; 4],
    pub(crate) slow_received: AtomicU64,
}

impl Stats {
    pub(crate) fn door(&self, name: &str) -> &DoorStats {
        let i = DOORS.iter().position(|d| *d == name).unwrap_or(0);
        &self.doors[i]
    }
}

static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Nanoseconds since the run's start: what every message body begins with (20 digits),
/// so the receiving side of any door measures publish→delivery.
pub(crate) fn stamp_now() -> u64 {
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A body: the stamp as 20 decimal digits, padded to `size` bytes.
pub(crate) fn stamped_body(size: usize) -> String {
    let mut s = format!("{:020}", stamp_now());
    while s.len() < size {
        s.push('x');
    }
    s
}

/// The stamp at the start of a body, if it has one.
pub(crate) fn stamp_of(body: &[u8]) -> Option<u64> {
    std::str::from_utf8(body.get(..20)?).ok()?.parse().ok()
}

/// One CSV row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) minute: f64,
    pub(crate) rss: u64,
    pub(crate) rss_anon: u64,
    pub(crate) fds: u64,
    /// Per door: (sent/s, received/s, p50 ms, p99 ms, errors in the row).
    pub(crate) doors: [(f64, f64, f64, f64, u64); 4],
    pub(crate) slow_per_sec: f64,
}

impl Row {
    fn header() -> String {
        let mut h = "minute,rss_mib,rss_anon_mib,fds".to_string();
        for d in DOORS {
            h.push_str(&format!(
                ",{d}_sent_per_s,{d}_recv_per_s,{d}_p50_ms,{d}_p99_ms,{d}_errors"
            ));
        }
        h.push_str(",mqtt_slow_recv_per_s");
        h
    }

    fn csv(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let mut s = format!(
            "{:.2},{:.1},{:.1},{}",
            self.minute,
            mib(self.rss),
            mib(self.rss_anon),
            self.fds
        );
        for (sent, recv, p50, p99, errors) in self.doors {
            s.push_str(&format!(",{sent:.1},{recv:.1},{p50:.2},{p99:.2},{errors}"));
        }
        s.push_str(&format!(",{:.1}", self.slow_per_sec));
        s
    }
}

fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// What the rows say about the run: the reasons it failed (empty: it passed).
pub(crate) fn verdict(rows: &[Row], args: &SoakArgs) -> Vec<String> {
    let mut failures = Vec::new();
    if rows.len() <= args.warmup_rows {
        failures.push(format!(
            "only {} rows: nothing after the {} warm-up rows to judge",
            rows.len(),
            args.warmup_rows
        ));
        return failures;
    }
    let base = &rows[args.warmup_rows.saturating_sub(1).min(rows.len() - 1)];
    let bound = base.rss_anon + args.rss_growth_mib * 1024 * 1024;
    for r in &rows[args.warmup_rows..] {
        if r.rss_anon > bound {
            failures.push(format!(
                "minute {:.2}: RssAnon {} MiB exceeds the bound {} MiB (warm-up {} MiB + {} MiB)",
                r.minute,
                r.rss_anon >> 20,
                bound >> 20,
                base.rss_anon >> 20,
                args.rss_growth_mib
            ));
        }
        if r.fds > base.fds + args.fd_slack {
            failures.push(format!(
                "minute {:.2}: {} open descriptors, {} at the end of the warm-up (slack {})",
                r.minute, r.fds, base.fds, args.fd_slack
            ));
        }
    }
    for r in rows {
        for (i, d) in DOORS.iter().enumerate() {
            if r.doors[i].1 <= 0.0 {
                failures.push(format!("minute {:.2}: no {d} traffic received", r.minute));
            }
        }
        if r.slow_per_sec <= 0.0 && args.mqtt_clients > 0 && args.slow_percent > 0.0 {
            failures.push(format!(
                "minute {:.2}: the slow MQTT readers received nothing",
                r.minute
            ));
        }
    }
    failures
}

pub fn run(args: SoakArgs) -> anyhow::Result<()> {
    raise_fd_limit();
    stamp_now();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let total = Duration::from_secs_f64(args.seconds.unwrap_or(args.minutes * 60.0));
    let row_every = Duration::from_secs_f64(args.row_seconds.max(1.0));
    let node = match (args.mqtt, args.http, args.ws, args.namesrv, args.broker_pid) {
        (Some(mqtt), Some(http), Some(ws), Some(namesrv), Some(pid)) => node::Node::Target {
            mqtt,
            http,
            ws,
            namesrv,
            pid,
        },
        (None, None, None, None, None) => node::Node::start(&args.out)?,
        _ => bail!(
            "targeting a running node needs all of --mqtt, --http, --ws, --namesrv and --broker-pid"
        ),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(drive(&args, &node, total, row_every));
    drop(node);
    rt.shutdown_timeout(Duration::from_secs(5));
    let rows = result?;
    chart::write(&args.out.join("soak.svg"), &rows)?;
    let failures = verdict(&rows, &args);
    println!(
        "soak: {} rows in {}, chart {}",
        rows.len(),
        args.out.join("soak.csv").display(),
        args.out.join("soak.svg").display()
    );
    if failures.is_empty() {
        println!("SOAK OK");
        Ok(())
    } else {
        for f in &failures {
            println!("SOAK FAILED: {f}");
        }
        bail!("the soak run failed ({} findings)", failures.len())
    }
}

async fn drive(
    args: &SoakArgs,
    node: &node::Node,
    total: Duration,
    row_every: Duration,
) -> anyhow::Result<Vec<Row>> {
    let stats = Arc::new(Stats::default());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let tasks = load::start(args, node, stats.clone(), stop).await?;
    let pid = node.pid();
    let mut csv = std::fs::File::create(args.out.join("soak.csv"))?;
    writeln!(csv, "{}", Row::header())?;
    println!("{}", Row::header());
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut last = [(0u64, 0u64, 0u64); 4];
    let mut last_slow = 0u64;
    let mut last_at = started;
    let mut next = started + row_every;
    while next <= started + total + Duration::from_millis(10) {
        tokio::time::sleep_until(next.into()).await;
        let now = Instant::now();
        let secs = now.duration_since(last_at).as_secs_f64();
        last_at = now;
        let mut doors = [(0.0, 0.0, 0.0, 0.0, 0u64); 4];
        for (i, d) in stats.doors.iter().enumerate() {
            let sent = d.sent.load(Ordering::Relaxed);
            let recv = d.received.load(Ordering::Relaxed);
            let errors = d.errors.load(Ordering::Relaxed);
            let mut lat = d
                .latencies
                .lock()
                .map(|mut l| std::mem::take(&mut *l))
                .unwrap_or_default();
            let s = lat.summary();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            doors[i] = (
                (sent - last[i].0) as f64 / secs,
                (recv - last[i].1) as f64 / secs,
                ms(s.p50),
                ms(s.p99),
                errors - last[i].2,
            );
            last[i] = (sent, recv, errors);
        }
        let slow = stats.slow_received.load(Ordering::Relaxed);
        let row = Row {
            minute: now.duration_since(started).as_secs_f64() / 60.0,
            rss: status_bytes(pid, "VmRSS").unwrap_or(0),
            rss_anon: status_bytes(pid, "RssAnon").unwrap_or(0),
            fds: open_fds(pid).unwrap_or(0),
            doors,
            slow_per_sec: (slow - last_slow) as f64 / secs,
        };
        last_slow = slow;
        writeln!(csv, "{}", row.csv())?;
        csv.flush()?;
        println!("{}", row.csv());
        rows.push(row);
        if status_bytes(pid, "VmRSS").is_none() {
            bail!("the broker (pid {pid}) is gone");
        }
        next += row_every;
    }
    let _ = stop_tx.send(true);
    tasks.stop().await;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SoakArgs,
    }

    fn row(minute: f64, rss_anon_mib: u64, fds: u64, recv: f64) -> Row {
        Row {
            minute,
            rss: rss_anon_mib << 21,
            rss_anon: rss_anon_mib << 20,
            fds,
            doors: [(1.0, recv, 1.0, 2.0, 0); 4],
            slow_per_sec: 1.0,
        }
    }

    #[test]
    fn judges_heap_growth_descriptors_and_stopped_doors() {
        let args = Cli::parse_from(["soak"]).args;
        let flat: Vec<Row> = (0..6).map(|m| row(m as f64, 100, 50, 10.0)).collect();
        assert!(verdict(&flat, &args).is_empty());
        let mut leak = flat.clone();
        leak[5].rss_anon = 200 << 20;
        assert_eq!(
            verdict(&leak, &args).len(),
            1,
            "{:?}",
            verdict(&leak, &args)
        );
        let mut fds = flat.clone();
        fds[4].fds = 50 + 33;
        assert_eq!(verdict(&fds, &args).len(), 1);
        let mut stopped = flat.clone();
        stopped[3].doors[2].1 = 0.0;
        let v = verdict(&stopped, &args);
        assert!(v.len() == 1 && v[0].contains("http"), "{v:?}");
        assert!(!verdict(&flat[..2], &args).is_empty(), "too short to judge");
    }

    #[test]
    fn bodies_carry_their_stamp() {
        let b = stamped_body(64);
        assert_eq!(b.len(), 64);
        let s = stamp_of(b.as_bytes()).unwrap();
        assert!(s <= stamp_now());
        assert_eq!(stamp_of(b"short"), None);
    }
}
