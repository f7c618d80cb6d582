//! `rocketgate bench auth --storm-seconds S`: what a connect storm costs the clients
//! already connected (issue #26: their QoS 1 p99 within 1.5× of the same load without
//! the connects).
//!
//! `--storm-clients` connections publish QoS 1 at a fixed rate each for the whole run;
//! the run alternates phase A (only that traffic) and phase B (the same traffic plus a
//! storm of CONNECT/CONNACK/DISCONNECT cycles), `--storm-rounds` times, with a short
//! settle gap between phases whose samples are dropped. Each publish is timed from its
//! write to its PUBACK and counted in the phase it was written in. The storm is either
//! known credentials at `--storm-rate` connects/s (the verified-credential cache
//! answers) or, with `--storm-distinct`, as many connects as the server answers of
//! users it has not verified yet (every one an argon2id verification: the users share
//! one password, so each user ‖ password is a cache miss the first time). With
//! `--storm-control` each round has a phase C too: the same storm against a trivial
//! MQTT acceptor in this process, which tells the clients' and the kernel's share
//! of what a storm costs the connected clients from the broker's.
//!
//! The server is an in-process node on a runtime of its own, or, with `--storm-bin`
//! (repeatable), `rocketgate standalone` from the given binaries on free ports, each
//! started and stopped in turn and the whole list run `--storm-cycles` times: old
//! and new interleaved in one run. For a started binary the CPU its threads used per
//! phase (from `/proc/<pid>/task/*/stat`, grouped by thread name) is printed too.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::BytesMut;
use clap::Args;
use mqttbytes::QoS;
use mqttbytes::v4::{self, Packet};
use rocketgate_auth::{Action, Auth, Rule, UserEntry, store};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{connect, read_packet, scratch};
use crate::stats::{Latencies, Summary, fmt_dur};

#[derive(Debug, Clone, Args)]
pub struct StormArgs {
    /// Storm mode: seconds of each phase (A: traffic alone, B: traffic + connects);
    /// 0 = the regular figures instead.
    #[arg(long, default_value_t = 0)]
    pub storm_seconds: u64,
    /// A/B phase pairs per server.
    #[arg(long, default_value_t = 4)]
    pub storm_rounds: usize,
    /// Connects per second of known credentials in phase B (0 = as fast as answered).
    #[arg(long, default_value_t = 1000)]
    pub storm_rate: u64,
    /// Connects at once in phase B.
    #[arg(long, default_value_t = 32)]
    pub storm_concurrency: usize,
    /// Phase B connects with credentials not verified yet (argon2id each), as fast as
    /// the server answers, instead of known ones at `--storm-rate`.
    #[arg(long)]
    pub storm_distinct: bool,
    /// Users for `--storm-distinct` (each used once per server; more connects reuse them).
    #[arg(long, default_value_t = 2000)]
    pub storm_users: usize,
    /// Connected clients publishing QoS 1 throughout.
    #[arg(long, default_value_t = 16)]
    pub storm_clients: usize,
    /// QoS 1 publishes per second of each connected client.
    #[arg(long, default_value_t = 50)]
    pub storm_msg_rate: u64,
    /// A third phase per round: the same storm answered by a trivial acceptor in
    /// this process (the clients' and the kernel's share of a storm, without the
    /// broker's).
    #[arg(long)]
    pub storm_control: bool,
    /// `rocketgate` binaries to start as the server, in turn (repeatable), each
    /// optionally followed by settings of its own: "PATH KEY=VALUE…" (e.g.
    /// "target/release/rocketgate ROCKETGATE_AUTH__VERIFY_SHARE=0.25"); none: an
    /// in-process node.
    #[arg(long)]
    pub storm_bin: Vec<PathBuf>,
    /// Times the list of servers is run (old, new, old, new…).
    #[arg(long, default_value_t = 1)]
    pub storm_cycles: usize,
}

/// Dropped samples between phases, so one phase's tail does not land in the next.
const SETTLE: Duration = Duration::from_millis(300);
const PASSWORD: &str = "storm-pw";

/// What one server measured.
#[derive(Debug)]
pub struct Outcome {
    pub label: String,
    pub quiet: Summary,
    pub storm: Summary,
    /// `--storm-control`: the same storm answered by a trivial acceptor instead.
    pub control: Option<Summary>,
    /// p99 ratio storm / quiet per round.
    pub round_ratios: Vec<f64>,
    /// p99 ratio control / quiet per round (`--storm-control`).
    pub control_ratios: Vec<f64>,
    /// Successful connects to the server in phase B and their rate.
    pub connects: u64,
    pub connect_rate: f64,
    pub refused: u64,
    /// Publishes acknowledged (A, B).
    pub acked: (usize, usize),
    /// CPU seconds per thread group in A, B (and C), of the server when it is a
    /// process and of this process's generator threads (`gen:`).
    pub cpu: BTreeMap<String, [f64; 3]>,
}

impl Outcome {
    /// p99 of all B phases over p99 of all A phases.
    pub fn ratio(&self) -> f64 {
        self.storm.p99.as_secs_f64() / self.quiet.p99.as_secs_f64().max(1e-9)
    }

    /// The median of the per-round p99 ratios: one disturbed phase (another
    /// process on a shared machine) moves it less than the pooled ratio.
    pub fn median_round_ratio(&self) -> f64 {
        median(&self.round_ratios)
    }
}

fn median(r: &[f64]) -> f64 {
    let mut r = r.to_vec();
    r.sort_by(f64::total_cmp);
    match r.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => r[n / 2],
        n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
    }
}

/// The users the server needs: `bench` (publishes on `bench/#`), `storm` (the known
/// credentials) and `s0…` (`--storm-distinct`), all with one password hashed once.
fn write_users(auth: &Auth, s: &StormArgs) -> anyhow::Result<()> {
    let phc = store::hash_password(PASSWORD.as_bytes());
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "bench".into(),
            password: phc.clone(),
            rules: vec![Rule::allow(&[Action::Publish], &["bench/#"])],
            ..UserEntry::default()
        });
        f.upsert(UserEntry {
            name: "storm".into(),
            password: phc.clone(),
            ..UserEntry::default()
        });
        if s.storm_distinct {
            for i in 0..s.storm_users {
                f.upsert(UserEntry {
                    name: format!("s{i}"),
                    password: phc.clone(),
                    ..UserEntry::default()
                });
            }
        }
    })?;
    Ok(())
}

fn auth_settings(users_file: PathBuf) -> rocketgate_auth::Settings {
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = users_file;
    s
}

/// Runs storm mode with the `bench auth` arguments; prints and returns the outcomes.
pub fn run(dir: &Path, s: &StormArgs) -> anyhow::Result<Vec<Outcome>> {
    anyhow::ensure!(
        s.storm_clients > 0 && s.storm_msg_rate > 0,
        "no traffic to measure"
    );
    let gen_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-gen")
        .enable_all()
        .build()?;
    let mut out = Vec::new();
    if s.storm_bin.is_empty() {
        let node_dir = dir.join("storm-node");
        scratch(&node_dir)?;
        let auth = Auth::open(auth_settings(node_dir.join("users.toml")))?;
        write_users(&auth, s)?;
        let node_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("rg-node")
            .enable_all()
            .build()?;
        let node = node_rt.block_on(super::node(&node_dir, auth))?;
        let addr = node.addr;
        let o = gen_rt.block_on(measure("in-process".into(), addr, None, s));
        node_rt.block_on(node.stop())?;
        let _ = std::fs::remove_dir_all(&node_dir);
        out.push(o?);
    } else {
        for _ in 0..s.storm_cycles.max(1) {
            for bin in &s.storm_bin {
                let node_dir = dir.join("storm-node");
                scratch(&node_dir)?;
                let users = node_dir.join("users.toml");
                let auth = Auth::open(auth_settings(users.clone()))?;
                write_users(&auth, s)?;
                drop(auth);
                // "PATH KEY=VALUE…": settings of that server only.
                let spec = bin.to_string_lossy().into_owned();
                let mut words = spec.split_whitespace();
                let path = PathBuf::from(words.next().unwrap_or_default());
                let env: Vec<(&str, &str)> = words.filter_map(|w| w.split_once('=')).collect();
                let mut server = Server::start(&path, &node_dir, &users, &env)?;
                let o = gen_rt.block_on(measure(
                    bin.display().to_string(),
                    server.mqtt,
                    Some(server.child.id()),
                    s,
                ));
                server.stop();
                let _ = std::fs::remove_dir_all(&node_dir);
                out.push(o?);
            }
        }
    }
    print(s, &out);
    Ok(out)
}

fn print(s: &StormArgs, out: &[Outcome]) {
    let storm = if s.storm_distinct {
        format!(
            "distinct credentials (argon2id each), as fast as answered, {} at once",
            s.storm_concurrency
        )
    } else {
        format!(
            "known credentials at {}/s, {} at once",
            s.storm_rate, s.storm_concurrency
        )
    };
    println!(
        "rocketgate bench auth (storm): {} clients × {} QoS 1/s (100 B) throughout; \
         {} s phases, {} A/B rounds; storm: {storm}",
        s.storm_clients, s.storm_msg_rate, s.storm_seconds, s.storm_rounds
    );
    for o in out {
        println!("  server {}", o.label);
        for (name, l, n) in [
            ("A quiet", &o.quiet, o.acked.0),
            ("B storm", &o.storm, o.acked.1),
        ] {
            println!(
                "    {name}  p50 {:>9}  p99 {:>9}  p999 {:>9}  max {:>9}  ({n} acked)",
                fmt_dur(l.p50),
                fmt_dur(l.p99),
                fmt_dur(l.p999),
                fmt_dur(l.max)
            );
        }
        if let Some(c) = &o.control {
            println!(
                "    C sink   p50 {:>9}  p99 {:>9}  p999 {:>9}  max {:>9}  (the same storm, answered by a trivial acceptor)",
                fmt_dur(c.p50),
                fmt_dur(c.p99),
                fmt_dur(c.p999),
                fmt_dur(c.max)
            );
        }
        let rounds: Vec<String> = o.round_ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "    p99 B/A {:.2}×  (rounds: {}; median {:.2})  connects in B: {} at {:.1}/s, {} refused",
            o.ratio(),
            rounds.join(" "),
            o.median_round_ratio(),
            o.connects,
            o.connect_rate,
            o.refused
        );
        if let Some(c) = &o.control {
            let rounds: Vec<String> = o.control_ratios.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "    p99 C/A {:.2}×  (rounds: {}; median {:.2})",
                c.p99.as_secs_f64() / o.quiet.p99.as_secs_f64().max(1e-9),
                rounds.join(" "),
                median(&o.control_ratios)
            );
        }
        let per: Vec<String> = o
            .cpu
            .iter()
            .filter(|(_, t)| t.iter().any(|v| *v >= 0.005))
            .map(|(g, t)| {
                let c = if o.control.is_some() {
                    format!("/{:.2}", t[2])
                } else {
                    String::new()
                };
                format!("{g} {:.2}/{:.2}{c}", t[0], t[1])
            })
            .collect();
        println!(
            "    CPU s in A/B{} by thread (gen: this generator): {}",
            if o.control.is_some() { "/C" } else { "" },
            per.join(", ")
        );
    }
}

/// Latencies per phase of a run (round `r`, kind `k`: index `r * kinds + k`).
type Samples = Arc<Mutex<Vec<Latencies>>>;

async fn measure(
    label: String,
    addr: SocketAddr,
    pid: Option<u32>,
    s: &StormArgs,
) -> anyhow::Result<Outcome> {
    // Kinds of phase: 0 quiet, 1 storm on the server, 2 the storm on the sink.
    let kinds = if s.storm_control { 3 } else { 2 };
    let phases = s.storm_rounds.max(1) * kinds;
    let sink = if s.storm_control {
        Some(Sink::start()?)
    } else {
        None
    };
    let samples: Samples = Arc::new(Mutex::new(
        (0..phases).map(|_| Latencies::default()).collect(),
    ));
    // The phase publishes are counted in; u64::MAX: settling, not counted.
    let phase = Arc::new(AtomicU64::new(u64::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for i in 0..s.storm_clients {
        let (sock, buf, code) =
            connect(addr, &format!("bench-{i}"), Some(("bench", PASSWORD))).await?;
        anyhow::ensure!(code == 0, "CONNACK {code} for a publishing client");
        clients.push(tokio::spawn(publisher(
            sock,
            buf,
            format!("bench/storm/{i}"),
            s.storm_msg_rate,
            phase.clone(),
            stop.clone(),
            samples.clone(),
        )));
    }
    // Warm up (connections, topics, the first publishes' allocations).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let storm_state = Arc::new(StormState::default());
    let control_state = Arc::new(StormState::default());
    let mut cpu: BTreeMap<String, [f64; 3]> = BTreeMap::new();
    let mut storm_time = Duration::ZERO;
    for p in 0..phases {
        let kind = p % kinds;
        let before = cpu_now(pid);
        let started = Instant::now();
        let storm_stop = Arc::new(AtomicBool::new(false));
        let workers = match (kind, &sink) {
            (1, _) => spawn_storm(addr, s, storm_state.clone(), storm_stop.clone(), started),
            (2, Some(sink)) => spawn_storm(
                sink.addr,
                s,
                control_state.clone(),
                storm_stop.clone(),
                started,
            ),
            _ => Vec::new(),
        };
        phase.store(p as u64, Ordering::Release);
        tokio::time::sleep(Duration::from_secs(s.storm_seconds)).await;
        phase.store(u64::MAX, Ordering::Release);
        storm_stop.store(true, Ordering::Release);
        for w in workers {
            w.await??;
        }
        if kind == 1 {
            storm_time += started.elapsed();
        }
        let after = cpu_now(pid);
        for (g, t) in after {
            cpu.entry(g.clone()).or_default()[kind] += t - before.get(&g).copied().unwrap_or(0.0);
        }
        tokio::time::sleep(SETTLE).await;
    }
    stop.store(true, Ordering::Release);
    for c in clients {
        c.await??;
    }
    drop(sink);
    let mut all = std::mem::take(&mut *samples.lock().expect("samples"));
    let p99 = |l: &mut Latencies| l.summary().p99.as_secs_f64();
    let (mut round_ratios, mut control_ratios) = (Vec::new(), Vec::new());
    for round in all.chunks_mut(kinds) {
        let quiet = p99(&mut round[0]).max(1e-9);
        round_ratios.push(p99(&mut round[1]) / quiet);
        if kinds == 3 {
            control_ratios.push(p99(&mut round[2]) / quiet);
        }
    }
    let mut merged: Vec<Latencies> = (0..kinds).map(|_| Latencies::default()).collect();
    for (i, l) in all.into_iter().enumerate() {
        merged[i % kinds].merge(l);
    }
    let acked = (merged[0].len(), merged[1].len());
    let connects = storm_state.ok.load(Ordering::Relaxed);
    Ok(Outcome {
        label,
        quiet: merged[0].summary(),
        storm: merged[1].summary(),
        control: merged.get_mut(2).map(Latencies::summary),
        round_ratios,
        control_ratios,
        connects,
        connect_rate: connects as f64 / storm_time.as_secs_f64().max(1e-9),
        refused: storm_state.refused.load(Ordering::Relaxed)
            + control_state.refused.load(Ordering::Relaxed),
        acked,
        cpu,
    })
}

/// A trivial MQTT acceptor on a thread of its own (`--storm-control`): it answers
/// CONNECT with CONNACK and closes on DISCONNECT, so a storm against it costs the
/// machine the clients' side and the kernel's TCP work, and nothing of the broker.
struct Sink {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sink {
    fn start() -> anyhow::Result<Sink> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("bench-sink".into())
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    loop {
                        tokio::select! {
                            _ = &mut stopped => return,
                            accepted = listener.accept() => {
                                if let Ok((sock, _)) = accepted {
                                    tokio::spawn(sink_conn(sock));
                                }
                            }
                        }
                    }
                });
            })?;
        Ok(Sink {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn sink_conn(mut sock: TcpStream) {
    let mut buf = BytesMut::new();
    let Ok(Packet::Connect(_)) = read_packet(&mut sock, &mut buf).await else {
        return;
    };
    let mut out = BytesMut::new();
    if v4::ConnAck::new(v4::ConnectReturnCode::Success, false)
        .write(&mut out)
        .is_err()
    {
        return;
    }
    if sock.write_all(&out).await.is_err() {
        return;
    }
    let _ = read_packet(&mut sock, &mut buf).await;
}

/// One connected client: a QoS 1 publish every `1/rate` s, each timed from its write
/// to its PUBACK (read by a task of its own, so a late PUBACK never delays a write).
async fn publisher(
    sock: TcpStream,
    mut buf: BytesMut,
    topic: String,
    rate: u64,
    phase: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    samples: Samples,
) -> anyhow::Result<()> {
    let (mut rd, mut wr) = sock.into_split();
    let pending: Arc<Mutex<HashMap<u16, (Instant, u64)>>> = Arc::default();
    let reader = {
        let pending = pending.clone();
        tokio::spawn(async move {
            loop {
                let p = match read_half(&mut rd, &mut buf).await {
                    Ok(p) => p,
                    Err(_) => return,
                };
                if let Packet::PubAck(a) = p {
                    let done = Instant::now();
                    let sent = pending.lock().expect("pending").remove(&a.pkid);
                    if let Some((at, ph)) = sent
                        && let Some(l) = samples.lock().expect("samples").get_mut(ph as usize)
                    {
                        l.record(done - at);
                    }
                }
            }
        })
    };
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let payload = vec![b'x'; 100];
    let mut pkid: u16 = 0;
    let mut out = BytesMut::new();
    while !stop.load(Ordering::Acquire) {
        tick.tick().await;
        pkid = pkid.wrapping_add(1).max(1);
        let mut p = v4::Publish::new(&topic, QoS::AtLeastOnce, payload.clone());
        p.pkid = pkid;
        p.write(&mut out).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let ph = phase.load(Ordering::Acquire);
        pending
            .lock()
            .expect("pending")
            .insert(pkid, (Instant::now(), ph));
        wr.write_all(&out).await?;
        out.clear();
    }
    // The last PUBACKs.
    let until = Instant::now() + Duration::from_secs(5);
    while !pending.lock().expect("pending").is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reader.abort();
    Ok(())
}

async fn read_half(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
) -> anyhow::Result<Packet> {
    use tokio::io::AsyncReadExt;
    loop {
        match v4::read(buf, 1 << 20) {
            Ok(p) => return Ok(p),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {}
            Err(e) => anyhow::bail!("bad packet: {e:?}"),
        }
        if rd.read_buf(buf).await? == 0 {
            anyhow::bail!("closed");
        }
    }
}

#[derive(Default)]
struct StormState {
    ok: AtomicU64,
    refused: AtomicU64,
    /// Next slot of the rate (known credentials) or next user (distinct).
    next: AtomicU64,
}

fn spawn_storm(
    addr: SocketAddr,
    s: &StormArgs,
    state: Arc<StormState>,
    stop: Arc<AtomicBool>,
    started: Instant,
) -> Vec<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let slot0 = state.next.load(Ordering::Relaxed);
    (0..s.storm_concurrency.max(1))
        .map(|w| {
            let (state, stop) = (state.clone(), stop.clone());
            let (distinct, rate, users) = (s.storm_distinct, s.storm_rate, s.storm_users.max(1));
            tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let n = state.next.fetch_add(1, Ordering::Relaxed);
                    let user = if distinct {
                        format!("s{}", n % users as u64)
                    } else {
                        // Rate 0: as fast as answered.
                        if let Some(gap) = ((n - slot0) * 1_000_000_000).checked_div(rate) {
                            tokio::time::sleep_until((started + Duration::from_nanos(gap)).into())
                                .await;
                            if stop.load(Ordering::Acquire) {
                                return anyhow::Ok(());
                            }
                        }
                        "storm".to_owned()
                    };
                    // A device reconnecting with its own client id.
                    let id = format!("storm-{w}");
                    match cycle(addr, &id, &user).await {
                        Ok(0) => state.ok.fetch_add(1, Ordering::Relaxed),
                        Ok(_) | Err(_) => state.refused.fetch_add(1, Ordering::Relaxed),
                    };
                }
                Ok(())
            })
        })
        .collect()
}

/// CONNECT, CONNACK, DISCONNECT; the CONNACK code.
async fn cycle(addr: SocketAddr, id: &str, user: &str) -> anyhow::Result<u8> {
    let (mut sock, _, code) = connect(addr, id, Some((user, PASSWORD))).await?;
    let mut out = BytesMut::new();
    v4::Disconnect
        .write(&mut out)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    sock.write_all(&out).await?;
    Ok(code)
}

/// CPU seconds per thread group of the server (when it is a process of its own)
/// and of this process's generator threads (`gen:` prefixed).
fn cpu_now(server: Option<u32>) -> HashMap<String, f64> {
    let mut out = server.map(thread_cpu).unwrap_or_default();
    for (g, t) in thread_cpu(std::process::id()) {
        if g.starts_with("bench-gen") {
            out.insert(format!("gen:{g}"), t);
        }
    }
    out
}

/// CPU seconds (user + system) of the process's threads, summed per thread name
/// (digits dropped, so `tokio-runtime-w` and numbered pools group).
fn thread_cpu(pid: u32) -> HashMap<String, f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // pid (comm) state … utime stime are fields 14 and 15; comm may hold spaces.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name: String = stat[open + 1..close]
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        // rest[0] is field 3 (state): utime = field 14 = rest[11], stime = rest[12].
        *out.entry(name).or_insert(0.0) += (ticks(11) + ticks(12)) as f64 / hz;
    }
    out
}

/// A `rocketgate standalone` started from a given binary on free ports, with auth on.
struct Server {
    child: Child,
    mqtt: SocketAddr,
}

impl Server {
    fn start(bin: &Path, dir: &Path, users: &Path, env: &[(&str, &str)]) -> anyhow::Result<Server> {
        use std::io::{BufRead, BufReader};
        let log = std::fs::File::create(dir.join("node.log"))?;
        let mut cmd = Command::new(bin);
        // The binary reads ROCKETGATE_* as settings: none of ours leak into it.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ROCKETGATE_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .args(["standalone", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--namesrv", "0", "--native", "0", "--mqtt", "0"])
            .args(["--http", "0", "--ws", "0"])
            .env("ROCKETGATE_LISTEN__HA", "127.0.0.1:0")
            .env("ROCKETGATE_STORE__SEGMENT_SIZE", "64MiB")
            .env("ROCKETGATE_AUTH__ENABLED", "true")
            .env("ROCKETGATE_AUTH__USERS_FILE", users)
            .env("ROCKETGATE_AUTH__INTERNAL_SECRET", "bench-internal-secret")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut mqtt = None;
        for line in lines.by_ref() {
            let line = line?;
            if let Some(addr) = line.strip_prefix("rocketgate: mqtt listening on ") {
                mqtt = Some(addr.trim().parse()?);
            }
            if line.contains("ready") {
                break;
            }
        }
        std::thread::spawn(move || lines.for_each(drop));
        let mut server = Server {
            child,
            mqtt: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        match mqtt {
            Some(a) => server.mqtt = a,
            None => {
                server.stop();
                anyhow::bail!(
                    "{} did not announce its MQTT address (log: {})",
                    bin.display(),
                    dir.join("node.log").display()
                );
            }
        }
        Ok(server)
    }

    fn stop(&mut self) {
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny storm against an in-process node: both phases measured, the storm's
    /// connects accepted, and each kind of storm counted.
    #[test]
    fn a_tiny_storm_measures_both_phases() {
        let dir = tempfile_dir("storm-known");
        for distinct in [false, true] {
            let s = StormArgs {
                storm_seconds: 1,
                storm_rounds: 1,
                storm_rate: 200,
                storm_concurrency: 4,
                storm_distinct: distinct,
                storm_users: 20,
                storm_clients: 2,
                storm_msg_rate: 50,
                storm_control: distinct,
                storm_bin: Vec::new(),
                storm_cycles: 1,
            };
            let out = run(&dir, &s).expect("storm run");
            let o = &out[0];
            assert!(o.acked.0 > 20 && o.acked.1 > 20, "acked {:?}", o.acked);
            assert!(o.connects > 0, "no connect in phase B");
            assert_eq!(o.refused, 0);
            assert!(o.ratio().is_finite());
            assert_eq!(o.round_ratios.len(), 1);
            assert_eq!(o.control.is_some(), distinct);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("rg-{name}-{}", std::process::id()))
    }
}
