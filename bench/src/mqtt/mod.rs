//! `rocketgate bench mqtt`: an MQTT load generator that any MQTT 3.1.1 broker can be
//! measured with (rocketgate, Mosquitto, rumqttd, NATS, RabbitMQ), so `bench/compare`
//! runs the *same* generator against each and reports ratios.
//!
//! Scenarios: `p2p` (publisher i → subscriber i), `fanout` (1 publisher → N
//! subscribers), `fanin` (N publishers → a `$share` group of subscribers, or one
//! subscriber with `--no-shared`), `idle` (open N connections and report the broker's
//! RSS per connection). Publishers run flat out (`--rate 0`, QoS 1 bounded by
//! `--inflight`) or open loop at a fixed total rate; every payload carries its send
//! (or due) time, so subscribers measure publish→deliver latency.
//!
//! The generator must not be what limits the figures: packets are pre-encoded and
//! patched, many go out per system call, acks are read and written in batches, and
//! connections are spread over `--threads` runtime workers. `rocketgate bench
//! mqtt-sink` is a trivial forwarder to measure the generator's own ceiling.

mod conn;
mod io;
pub(crate) mod proto;
pub mod sink;

pub use proto::Version;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use futures_util::{StreamExt, stream};
use mqttbytes::QoS;
use rocketgate_tls::tokio_rustls::TlsConnector;

use self::io::BenchStream;

use self::conn::{Pace, Phase, PubStats};
use crate::stats::{Latencies, PeakRss, fmt_bytes, fmt_dur, raise_fd_limit, rss_of};

/// Connections opened concurrently while setting up a run.
const CONNECT_AT_ONCE: usize = 64;
/// Keep-alive of the generator's connections (seconds); subscribers ping at half of it
/// so one that receives nothing for a while is not closed by the broker.
const KEEP_ALIVE: u16 = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Arrivals {
    Tick,
    Spread,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Publisher i → subscriber i, one topic each.
    P2p,
    /// One publisher → every subscriber.
    Fanout,
    /// Every publisher → one shared-subscription group (or one subscriber).
    Fanin,
    /// Only connect, then report the broker's memory per connection.
    Idle,
}

#[derive(Debug, Clone, Args)]
pub struct MqttBenchArgs {
    /// The broker's MQTT address.
    #[arg(long, default_value = "127.0.0.1:1883")]
    pub broker: SocketAddr,
    #[arg(long, value_enum, default_value = "p2p")]
    pub scenario: Scenario,
    /// Publisher connections (fanout always uses 1).
    #[arg(long, default_value_t = 10)]
    pub publishers: usize,
    /// Subscriber connections (fanin: the members of the shared group).
    #[arg(long, default_value_t = 10)]
    pub subscribers: usize,
    /// QoS of publishing and subscribing (0 or 1).
    #[arg(long, default_value_t = 1)]
    pub qos: u8,
    /// Payload bytes (at least 16: send time + sequence number).
    #[arg(long, default_value_t = 16)]
    pub size: usize,
    /// Total publish rate in messages/s; 0 = as fast as the broker takes them.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// With `--rate`: `tick` sends what each publisher owes on a shared 1 ms tick
    /// (every publisher at once: bursts); `spread` staggers the publishers evenly
    /// over each publisher's interval (a pacing thread with sub-millisecond sleeps),
    /// so messages arrive one by one, as from independent devices.
    #[arg(long, value_enum, default_value_t = Arrivals::Tick)]
    pub arrivals: Arrivals,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Warm-up seconds (not measured).
    #[arg(long, default_value_t = 2)]
    pub warmup: u64,
    /// QoS 1 messages in flight per publisher (unacked window).
    #[arg(long, default_value_t = 256)]
    pub inflight: u64,
    /// Runtime worker threads of the generator.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Fan-in without a shared subscription: one subscriber of `…/#`.
    #[arg(long)]
    pub no_shared: bool,
    /// Topic prefix (each run adds a random suffix so runs never see each other).
    #[arg(long, default_value = "bench")]
    pub topic: String,
    /// Idle scenario: connections to open.
    #[arg(long, default_value_t = 1000)]
    pub connections: usize,
    /// Source addresses to spread connections over (e.g. 127.0.0.1,127.0.0.2), for
    /// more connections than one address has ephemeral ports.
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<IpAddr>,
    /// Idle scenario: spread the connections over this many loopback source
    /// addresses (127.0.0.1, 127.0.0.2, … across 127.0.0.0/8), past the ~28k
    /// ephemeral ports one source address has; instead of `--sources`.
    #[arg(long, value_name = "N")]
    pub spread_sources: Option<u32>,
    /// Idle scenario: keep the connections open this many seconds after measuring
    /// (so another generator can run traffic beside them).
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    pub hold: u64,
    /// Idle scenario: handshakes (TCP connect, CONNECT, CONNACK) in flight at once
    /// while opening the connections. 64 keeps the broker's core busy; 256 and
    /// 1,024 measured slower here (docs/benchmarks.md, connect rate).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub connect_at_once: usize,
    /// The broker's process id: its RSS is reported (and per connection for `idle`).
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Also print one `RESULT {json}` line for scripts.
    #[arg(long)]
    pub json: bool,
    /// MQTT version of every connection: 3.1.1 or 5.
    #[arg(long, value_enum, default_value_t = Version::V4)]
    pub mqtt_version: Version,
    /// Connect with TLS, trusting the CA certificates in this PEM file (the broker's
    /// IP address must be in its certificate); e.g. `--broker 127.0.0.1:8883`.
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<std::path::PathBuf>,
}

/// The TLS connector of `--tls-ca`, if given.
fn connector(args: &MqttBenchArgs) -> anyhow::Result<Option<TlsConnector>> {
    let Some(ca) = &args.tls_ca else {
        return Ok(None);
    };
    let config = rocketgate_tls::client_config(ca).context("--tls-ca")?;
    Ok(Some(TlsConnector::from(Arc::new(config))))
}

/// One run's figures.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub published: u64,
    acked: u64,
    pub received: u64,
    pub seconds: f64,
    pub latencies: Option<crate::stats::Summary>,
    broker_rss: Option<u64>,
    per_connection: Option<f64>,
    /// Idle: connections opened per second (CONNECT to CONNACK, `--connect-at-once`
    /// at a time).
    connect_rate: Option<f64>,
}

pub fn run(args: MqttBenchArgs) -> anyhow::Result<()> {
    let report = measure(&args)?;
    print_report(&args, &report);
    Ok(())
}

/// One run of the generator on a runtime of its own; the figures, not printed.
pub(crate) fn measure(args: &MqttBenchArgs) -> anyhow::Result<Report> {
    let args = args.clone();
    if args.qos > 1 {
        bail!("--qos must be 0 or 1");
    }
    if args.size < 16 {
        bail!("--size must be at least 16 (the payload carries a timestamp and a sequence)");
    }
    raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    PeakRss::reset();
    let report = rt.block_on(async {
        match args.scenario {
            Scenario::Idle => idle(&args).await,
            _ => traffic(&args).await,
        }
    })?;
    Ok(report)
}

fn qos(args: &MqttBenchArgs) -> QoS {
    if args.qos == 0 {
        QoS::AtMostOnce
    } else {
        QoS::AtLeastOnce
    }
}

/// (publish topics, subscription filters) of a scenario.
fn layout(args: &MqttBenchArgs, run: &str) -> (Vec<String>, Vec<String>) {
    let base = format!("{}/{run}", args.topic);
    match args.scenario {
        Scenario::P2p => {
            let n = args.publishers.max(1);
            let topics: Vec<String> = (0..n).map(|i| format!("{base}/p2p/{i}")).collect();
            (topics.clone(), topics)
        }
        Scenario::Fanout => (
            vec![format!("{base}/fanout")],
            vec![format!("{base}/fanout"); args.subscribers.max(1)],
        ),
        Scenario::Fanin => {
            let topics = (0..args.publishers.max(1))
                .map(|i| format!("{base}/fanin/{i}"))
                .collect();
            let subs = if args.no_shared {
                vec![format!("{base}/fanin/#")]
            } else {
                vec![format!("$share/bench/{base}/fanin/#"); args.subscribers.max(1)]
            };
            (topics, subs)
        }
        Scenario::Idle => (vec![], vec![]),
    }
}

fn source(args: &MqttBenchArgs, i: usize) -> Option<IpAddr> {
    if let Some(n) = args.spread_sources.filter(|n| *n > 0) {
        return Some(loopback_source(i as u32 % n));
    }
    (!args.sources.is_empty()).then(|| args.sources[i % args.sources.len()])
}

/// The `k`-th loopback source address: 127.0.0.1, 127.0.0.2, …, skipping the
/// .0 and .255 of each /24 (some tools treat them as network and broadcast).
fn loopback_source(k: u32) -> IpAddr {
    let per_24 = 254;
    let (high, low) = (k / per_24, k % per_24 + 1);
    let n: u32 = (127 << 24) | ((high & 0xffff) << 8) | low;
    IpAddr::V4(std::net::Ipv4Addr::from(n))
}

/// The descriptors `connections` need in this process; a clear error when the
/// limit (already raised to the hard one) is too low, saying how to raise it.
fn check_fd_limit(connections: usize, broker_pid: Option<u32>) -> anyhow::Result<()> {
    let need = connections as u64 + 64;
    let have = crate::stats::fd_limit();
    if have.is_some_and(|have| have < need) {
        bail!(
            "{connections} connections need ~{need} open files in this process, and its \
             limit is {} (the hard limit: raise it with `ulimit -Hn {need}` as root, \
             LimitNOFILE= in a systemd unit, or `docker run --ulimit nofile={need}:{need}`; \
             `sysctl fs.nr_open` must be above it). The broker needs as many.",
            have.unwrap_or(0)
        );
    }
    if let Some(pid) = broker_pid
        && let Some(broker) = crate::stats::fd_limit_of(pid)
        && broker < need
    {
        eprintln!(
            "  warning: the broker (pid {pid}) may open {broker} files: it will refuse \
             connections past that; start it with a higher hard limit"
        );
    }
    Ok(())
}

async fn traffic(args: &MqttBenchArgs) -> anyhow::Result<Report> {
    let run = format!("{:08x}", rand::random::<u32>());
    let (topics, filters) = layout(args, &run);
    let qos = qos(args);
    let phase = Arc::new(Phase::default());
    let live = Arc::new(AtomicU64::new(0));

    // Every connection is opened (CONNECT/CONNACK, SUBACK) before anything is
    // published, CONNECT_AT_ONCE at a time: one after another, 1,000 publishers took
    // ~90 s on a loaded machine while the first ones already published, so the
    // figure mixed the connect storm with the steady state it is meant to show.
    let run = run.as_str();
    let tls = connector(args)?;
    let tls = tls.as_ref();
    let subscribed: Vec<anyhow::Result<BenchStream>> =
        stream::iter(filters.iter().enumerate().map(|(i, filter)| async move {
            let mut s = conn::dial(args.broker, source(args, i), tls).await?;
            let v = args.mqtt_version;
            conn::handshake(&mut s, v, &format!("rg-bench-{run}-s{i}"), KEEP_ALIVE).await?;
            conn::subscribe(&mut s, v, filter, qos).await?;
            Ok(s)
        }))
        .buffered(CONNECT_AT_ONCE)
        .collect()
        .await;
    let first_pub = filters.len();
    let connected: Vec<anyhow::Result<BenchStream>> =
        stream::iter(topics.iter().enumerate().map(|(i, _)| async move {
            let mut s = conn::dial(args.broker, source(args, i + first_pub), tls)
                .await
                .with_context(|| format!("publisher {i}"))?;
            conn::handshake(
                &mut s,
                args.mqtt_version,
                &format!("rg-bench-{run}-p{i}"),
                KEEP_ALIVE,
            )
            .await?;
            Ok(s)
        }))
        .buffered(CONNECT_AT_ONCE)
        .collect()
        .await;
    let mut subs = Vec::new();
    for s in subscribed {
        subs.push(tokio::spawn(conn::consume(
            s?,
            args.mqtt_version,
            phase.clone(),
            live.clone(),
            Duration::from_secs(u64::from(KEEP_ALIVE) / 2),
        )));
    }
    let per_pub_rate = (args.rate > 0.0).then(|| args.rate / topics.len() as f64);
    let pacer = match (per_pub_rate, args.arrivals) {
        (Some(rate), Arrivals::Spread) => {
            Some(conn::Pacer::start(topics.len(), rate, phase.clone())?)
        }
        _ => None,
    };
    let mut pubs = Vec::new();
    let mut pub_stats = Vec::new();
    for (i, (topic, s)) in topics.iter().zip(connected).enumerate() {
        let s = s?;
        let stats = Arc::new(PubStats::default());
        pub_stats.push(stats.clone());
        let pace = match (per_pub_rate, &pacer) {
            (None, _) => Pace::Max,
            (Some(rate), None) => Pace::Rate(rate),
            (Some(_), Some(p)) => Pace::Spread(p.slot(i)),
        };
        let plan = conn::PublishPlan {
            version: args.mqtt_version,
            topic: topic.clone(),
            qos,
            size: args.size,
            pace,
            window: args.inflight,
        };
        pubs.push(tokio::spawn(conn::publish(s, plan, phase.clone(), stats)));
    }

    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    let sent_before: u64 = pub_stats
        .iter()
        .map(|s| s.sent.load(Ordering::Relaxed))
        .sum();
    phase.start_recording();
    let started = Instant::now();
    let mut last = 0;
    for _ in 0..args.seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = live.load(Ordering::Relaxed);
        eprintln!("  {:>10} msgs/s delivered", now - last);
        last = now;
    }
    phase.recording.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let sent_after: u64 = pub_stats
        .iter()
        .map(|s| s.sent.load(Ordering::Relaxed))
        .sum();
    let broker_rss = args.broker_pid.and_then(rss_of);
    phase.stop.store(true, Ordering::Relaxed);

    for p in pubs {
        p.await.context("publisher task")??;
    }
    let mut latencies = Latencies::default();
    let mut received = 0;
    for s in subs {
        let r = s.await.context("subscriber task")??;
        received += r.received;
        latencies.merge(r.latencies);
    }
    let acked = pub_stats
        .iter()
        .map(|s| s.acked.load(Ordering::Relaxed))
        .sum();
    Ok(Report {
        published: sent_after - sent_before,
        acked,
        received,
        seconds,
        latencies: (received > 0).then(|| latencies.summary()),
        broker_rss,
        per_connection: None,
        connect_rate: None,
    })
}

async fn idle(args: &MqttBenchArgs) -> anyhow::Result<Report> {
    let pid = args
        .broker_pid
        .context("the idle scenario needs --broker-pid to read the broker's memory")?;
    check_fd_limit(args.connections, Some(pid))?;
    let before = rss_of(pid).context("reading the broker's RSS")?;
    let run = format!("{:08x}", rand::random::<u32>());
    let started = Instant::now();
    let tls = connector(args)?;
    let opened = AtomicU64::new(0);
    // `--connect-at-once` handshakes in flight: the connect rate is the broker's, not
    // one round trip after another.
    let held: Vec<BenchStream> = stream::iter(0..args.connections)
        .map(|i| {
            let (tls, run, opened) = (tls.as_ref(), &run, &opened);
            async move {
                let mut s = conn::dial(args.broker, source(args, i), tls)
                    .await
                    .with_context(|| format!("connection {i}"))?;
                conn::handshake(&mut s, args.mqtt_version, &format!("rg-idle-{run}-{i}"), 0)
                    .await
                    .with_context(|| format!("connection {i}"))?;
                let n = opened.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_multiple_of(10_000) {
                    eprintln!("  {n} connections");
                }
                anyhow::Ok(s)
            }
        })
        .buffer_unordered(args.connect_at_once.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let connect_secs = started.elapsed().as_secs_f64();
    // Let the broker settle (allocations made lazily after CONNACK).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_of(pid).context("reading the broker's RSS")?;
    let n = held.len();
    if args.hold > 0 {
        eprintln!(
            "  {n} connections open ({:.0} B each); holding them {} s",
            after.saturating_sub(before) as f64 / n as f64,
            args.hold
        );
        tokio::time::sleep(Duration::from_secs(args.hold)).await;
    }
    drop(held);
    Ok(Report {
        seconds: started.elapsed().as_secs_f64(),
        broker_rss: Some(after),
        per_connection: Some(after.saturating_sub(before) as f64 / n as f64),
        connect_rate: Some(n as f64 / connect_secs),
        ..Report::default()
    })
}

fn print_report(args: &MqttBenchArgs, r: &Report) {
    let name = format!("{:?}", args.scenario).to_lowercase();
    let rate = if args.rate > 0.0 {
        format!("{}/s", args.rate)
    } else {
        "max".into()
    };
    println!(
        "mqtt {name}: qos {} size {} B publishers {} subscribers {} rate {rate} against {}",
        args.qos, args.size, args.publishers, args.subscribers, args.broker
    );
    let gen_rss = PeakRss::bytes();
    let mut json = format!(
        "{{\"scenario\":\"{name}\",\"qos\":{},\"size\":{},\"rate\":{},\"generator_peak_rss\":{gen_rss}",
        args.qos, args.size, args.rate
    );
    if let Some(per) = r.per_connection {
        let rate = r.connect_rate.unwrap_or(0.0);
        println!(
            "  {} idle connections: broker RSS {} ({per:.0} B per connection), \
             {rate:.0} connects/s",
            args.connections,
            fmt_bytes(r.broker_rss.unwrap_or(0))
        );
        json.push_str(&format!(
            ",\"connections\":{},\"broker_rss\":{},\"rss_per_connection\":{per:.0},\
             \"connects_per_s\":{rate:.0}",
            args.connections,
            r.broker_rss.unwrap_or(0)
        ));
    } else {
        let pub_rate = r.published as f64 / r.seconds;
        let recv_rate = r.received as f64 / r.seconds;
        println!(
            "  published {:.0} msgs/s, delivered {:.0} msgs/s over {:.1} s (acked {} total)",
            pub_rate, recv_rate, r.seconds, r.acked
        );
        // The counts too: bench/cost divides instructions by delivered messages.
        json.push_str(&format!(
            ",\"published_per_s\":{pub_rate:.0},\"delivered_per_s\":{recv_rate:.0},\
             \"published\":{},\"delivered\":{}",
            r.published, r.received
        ));
        if let Some(l) = r.latencies {
            println!(
                "  latency publish→deliver p50 {} p99 {} p999 {} max {}",
                fmt_dur(l.p50),
                fmt_dur(l.p99),
                fmt_dur(l.p999),
                fmt_dur(l.max)
            );
            json.push_str(&format!(
                ",\"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1}",
                l.p50.as_secs_f64() * 1e6,
                l.p99.as_secs_f64() * 1e6,
                l.p999.as_secs_f64() * 1e6
            ));
        }
        if let Some(rss) = r.broker_rss {
            println!("  broker RSS {}", fmt_bytes(rss));
            json.push_str(&format!(",\"broker_rss\":{rss}"));
        }
    }
    println!("  generator peak RSS {}", fmt_bytes(gen_rss));
    json.push('}');
    if args.json {
        println!("RESULT {json}");
    }
}
