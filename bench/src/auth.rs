//! `rocketgate bench auth`: what authentication and the ACL cost at the MQTT door,
//! in one run on one in-process node per configuration:
//!
//! - QoS 1 publish throughput with auth off, then with auth on and a user holding
//!   `--rules` ACL rules (all but one on other topics, so every first decision scans
//!   them all; later ones are the grant's cached lookup), and the ratio;
//! - reconnects/s with known credentials (CONNECT, CONNACK, DISCONNECT; after the
//!   first, the keyed-HMAC credential cache answers);
//! - verifications/s for distinct credentials (every CONNECT a cache miss: an
//!   argon2id verification on the broker's idle-priority verifier threads);
//! - with `--storm-seconds`, instead: the QoS 1 p99 of connected clients with and
//!   without a connect storm ([`storm`]).

mod storm;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Args;
use mqttbytes::QoS;
use mqttbytes::v4::{self, Packet};
use rocketgate_auth::{Action, Auth, Rule, UserEntry, store};
use rocketgate_core::broker::{Broker, BrokerSettings, SystemClock};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Args)]
pub struct AuthBenchArgs {
    /// Seconds of publishing per configuration.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// ACL rules of the publishing user.
    #[arg(long, default_value_t = 10_000)]
    pub rules: usize,
    /// Publishing connections (QoS 1, 64 in flight each).
    #[arg(long, default_value_t = 4)]
    pub publishers: usize,
    /// Reconnects with known credentials.
    #[arg(long, default_value_t = 3000)]
    pub reconnects: usize,
    /// Distinct users for the verification rate.
    #[arg(long, default_value_t = 32)]
    pub distinct: usize,
    /// Scratch directory (emptied before and after).
    #[arg(long, default_value = "bench-data")]
    pub dir: std::path::PathBuf,
    #[command(flatten)]
    pub storm: storm::StormArgs,
}

fn scratch(dir: &std::path::Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    Ok(())
}

struct Node {
    addr: SocketAddr,
    handle: rocketgate_mqtt::Handle<Broker>,
    broker: Arc<Broker>,
    store: Arc<Store>,
}

async fn node(dir: &std::path::Path, auth: Arc<Auth>) -> anyhow::Result<Node> {
    let opts = StoreSettings {
        segment_size: 256 << 20,
        flush: FlushMode::Async {
            interval: Duration::from_millis(500),
        },
        ..StoreSettings::default()
    };
    let store = Arc::new(Store::open(dir, opts, StoreDeps::fixed_usage(0.1))?.0);
    let broker = Arc::new(Broker::open(
        store.clone(),
        BrokerSettings::default(),
        Arc::new(SystemClock),
    )?);
    let mut settings = rocketgate_mqtt::Settings::new(dir.join("mqtt"));
    settings.auth = auth;
    let (server, addr) =
        rocketgate_mqtt::Server::bind("127.0.0.1:0".parse()?, broker.clone(), settings).await?;
    Ok(Node {
        addr,
        handle: server.spawn(),
        broker,
        store,
    })
}

impl Node {
    async fn stop(self) -> anyhow::Result<()> {
        self.handle.stop().await;
        let (b, s) = (self.broker, self.store);
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            b.close()?;
            drop(b);
            s.close()?;
            Ok(())
        })
        .await??;
        Ok(())
    }
}

async fn read_packet(sock: &mut TcpStream, buf: &mut BytesMut) -> anyhow::Result<Packet> {
    loop {
        match v4::read(buf, 1 << 20) {
            Ok(p) => return Ok(p),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {}
            Err(e) => anyhow::bail!("bad packet: {e:?}"),
        }
        if sock.read_buf(buf).await? == 0 {
            anyhow::bail!("closed");
        }
    }
}

async fn connect(
    addr: SocketAddr,
    id: &str,
    login: Option<(&str, &str)>,
) -> anyhow::Result<(TcpStream, BytesMut, u8)> {
    let mut sock = TcpStream::connect(addr).await?;
    sock.set_nodelay(true)?;
    let mut c = v4::Connect::new(id);
    c.keep_alive = 60;
    if let Some((u, p)) = login {
        c.set_login(u, p);
    }
    let mut out = BytesMut::new();
    c.write(&mut out).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    sock.write_all(&out).await?;
    let mut buf = BytesMut::new();
    match read_packet(&mut sock, &mut buf).await? {
        Packet::ConnAck(a) => Ok((sock, buf, a.code as u8)),
        other => anyhow::bail!("expected CONNACK, got {other:?}"),
    }
}

/// QoS 1 publishes per second over `publishers` connections for `seconds`.
async fn throughput(
    addr: SocketAddr,
    login: Option<(&str, &str)>,
    a: &AuthBenchArgs,
) -> anyhow::Result<f64> {
    let acked = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(a.seconds);
    let mut tasks = Vec::new();
    for i in 0..a.publishers {
        let (mut sock, mut buf, code) = connect(addr, &format!("pub-{i}"), login).await?;
        anyhow::ensure!(code == 0, "CONNACK {code}");
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let payload = vec![b'x'; 100];
            let topic = format!("bench/t{i}");
            let mut pkid: u16 = 0;
            let mut inflight = 0usize;
            let mut out = BytesMut::new();
            loop {
                while inflight < 64 && Instant::now() < until {
                    pkid = pkid.wrapping_add(1).max(1);
                    let mut p = v4::Publish::new(&topic, QoS::AtLeastOnce, payload.clone());
                    p.pkid = pkid;
                    p.write(&mut out).map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    inflight += 1;
                }
                if !out.is_empty() {
                    sock.write_all(&out).await?;
                    out.clear();
                }
                if inflight == 0 {
                    return anyhow::Ok(());
                }
                if let Packet::PubAck(_) = read_packet(&mut sock, &mut buf).await? {
                    inflight -= 1;
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    Ok(acked.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Connections (CONNECT + CONNACK + DISCONNECT) per second, 8 at a time.
async fn reconnects(
    addr: SocketAddr,
    logins: Vec<(String, String)>,
    n: usize,
) -> anyhow::Result<f64> {
    let logins = Arc::new(logins);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (logins, next) = (logins.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return anyhow::Ok(());
                }
                let (u, p) = &logins[i % logins.len()];
                let (mut sock, _, code) =
                    connect(addr, &format!("re-{w}-{i}"), Some((u, p))).await?;
                anyhow::ensure!(code == 0, "CONNACK {code}");
                let mut out = BytesMut::new();
                v4::Disconnect
                    .write(&mut out)
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                sock.write_all(&out).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

pub fn run(a: AuthBenchArgs) -> anyhow::Result<()> {
    if a.storm.storm_seconds > 0 {
        storm::run(&a.dir, &a.storm)?;
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let off_dir = a.dir.join("auth-off");
        scratch(&off_dir)?;
        let off = node(&off_dir, Auth::disabled()).await?;
        let base = throughput(off.addr, None, &a).await?;
        let reconnect_off = reconnects(off.addr, vec![("any".into(), "any".into())], a.reconnects).await?;
        off.stop().await?;

        let on_dir = a.dir.join("auth-on");
        scratch(&on_dir)?;
        let mut s = rocketgate_auth::Settings::disabled();
        s.enabled = true;
        s.users_file = on_dir.join("users.toml");
        let auth = Auth::open(s)?;
        let distinct: Vec<(String, String)> = (0..a.distinct).map(|i| (format!("d{i}"), format!("pw-{i}"))).collect();
        let hashes: Vec<String> = tokio::task::spawn_blocking({
            let d = distinct.clone();
            move || d.iter().map(|(_, p)| store::hash_password(p.as_bytes())).collect()
        })
        .await?;
        auth.update(|f| {
            let mut rules: Vec<Rule> = (1..a.rules)
                .map(|i| Rule::allow(&[Action::Publish, Action::Subscribe], &[&format!("other{i}/+/#")]))
                .collect();
            rules.push(Rule::allow(&[Action::Publish], &["bench/#"]));
            f.upsert(UserEntry {
                name: "bench".into(),
                password: store::hash_password(b"bench-pw"),
                rules,
                ..UserEntry::default()
            });
            for ((u, _), h) in distinct.iter().zip(hashes) {
                f.upsert(UserEntry {
                    name: u.clone(),
                    password: h,
                    ..UserEntry::default()
                });
            }
        })?;
        let on = node(&on_dir, auth).await?;
        let with_acl = throughput(on.addr, Some(("bench", "bench-pw")), &a).await?;
        let known = reconnects(on.addr, vec![("bench".into(), "bench-pw".into())], a.reconnects).await?;
        let misses = reconnects(on.addr, distinct.clone(), distinct.len()).await?;
        on.stop().await?;
        let _ = std::fs::remove_dir_all(&off_dir);
        let _ = std::fs::remove_dir_all(&on_dir);
        println!("rocketgate bench auth: {} s per run, {} publishers, QoS 1, 100 B", a.seconds, a.publishers);
        println!("  publish, auth off                 {base:>10.0} msg/s");
        println!("  publish, auth on, {:>6} rules    {with_acl:>10.0} msg/s  ({:.1} % of auth off)", a.rules, with_acl / base * 100.0);
        println!("  reconnects, auth off              {reconnect_off:>10.0} /s  ({} connects, 8 at a time)", a.reconnects);
        println!("  reconnects, known credentials     {known:>10.0} /s  ({} connects, 8 at a time)", a.reconnects);
        println!("  verifications, distinct passwords {misses:>10.1} /s  ({} users, argon2id m=19MiB t=2 p=1)", a.distinct);
        anyhow::Ok(())
    })
}
