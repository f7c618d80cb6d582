//! One MQTT connection (3.1.1 or 5, `proto.rs`) of the load generator: connect, publish in batches,
//! subscribe and count. Packets are encoded and parsed with `mqttbytes` (the codec the
//! MQTT gateway uses); the hot path patches a pre-encoded PUBLISH instead of encoding
//! each message, and every socket write carries as many packets as are ready, so the
//! generator spends its time on the broker's replies, not on system calls.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{Buf, BytesMut};
use mqttbytes::QoS;
use rocketgate_tls::rustls::pki_types::ServerName;
use rocketgate_tls::tokio_rustls::TlsConnector;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::io::{BenchStream, ReadSide, WriteSide};
use tokio::sync::Notify;

use super::proto::{Pkt, Version};
use crate::stats::Latencies;

/// Largest packet the generator accepts from a broker.
const MAX_PACKET: usize = 1 << 20;
/// Bytes read per system call at most: a connection's read buffer. 32 KiB holds
/// ~700 small deliveries, more than one read brings; larger buffers were memory
/// the generator touched for the first time while measuring (256 KiB each, and
/// growing: 1,000 fan-out subscribers went through ~0.5 GiB of fresh pages, the
/// generator then busy in the kernel zeroing them while the broker waited).
const READ_CHUNK: usize = 32 * 1024;
/// Room asked for when a read buffer is nearly full. Half of it, so that the
/// buffer's own allocation takes it once what was read is parsed (`BytesMut`
/// moves the rest to the front): asking for a whole `READ_CHUNK` more grew the
/// buffer instead.
const REFILL: usize = READ_CHUNK / 2;
/// Messages written per system call at most.
const WRITE_BATCH: usize = 256;

/// Nanoseconds since the generator's epoch; publishers stamp it into the payload and
/// subscribers subtract it (one process, one clock).
pub fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What every connection task watches: recording on/off and the stop signal.
#[derive(Default)]
pub struct Phase {
    pub recording: AtomicBool,
    /// [`now_ns`] when recording began: only messages sent from then on count
    /// for latency (one sent during the warm-up and delivered after it is the
    /// warm-up's, not the measured load's).
    pub recording_since: AtomicU64,
    pub stop: AtomicBool,
}

impl Phase {
    pub fn start_recording(&self) {
        self.recording_since.store(now_ns(), Ordering::Relaxed);
        self.recording.store(true, Ordering::Release);
    }
}

/// Opens a TCP connection, from `source` when given (to use more than one source
/// address for many connections), with Nagle off; with `tls`, a TLS session on it
/// (the broker's IP address must be in its certificate).
pub async fn dial(
    broker: SocketAddr,
    source: Option<IpAddr>,
    tls: Option<&TlsConnector>,
) -> anyhow::Result<BenchStream> {
    let socket = if broker.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = source {
        defer_port_choice(&socket);
        socket
            .bind(SocketAddr::new(ip, 0))
            .with_context(|| format!("binding the source address {ip}"))?;
    }
    let stream = socket
        .connect(broker)
        .await
        .with_context(|| format!("connecting to {broker}"))?;
    stream.set_nodelay(true)?;
    match tls {
        None => Ok(BenchStream::Tcp(stream)),
        Some(connector) => {
            let name = ServerName::IpAddress(broker.ip().into());
            let tls = connector
                .connect(name, stream)
                .await
                .with_context(|| format!("TLS handshake with {broker}"))?;
            Ok(BenchStream::Tls(Box::new(tls)))
        }
    }
}

/// `IP_BIND_ADDRESS_NO_PORT`: a bind to (address, port 0) leaves the port to
/// `connect`, which picks one free for this 4-tuple. Without it the kernel picks
/// the port at bind time, one no other socket on that address holds — TIME_WAIT
/// ones included — and with tens of thousands of connections over a few source
/// addresses that search is what limits the connect rate (and a previous run's
/// TIME_WAIT sockets make it slower still). Best effort: on failure the bind
/// still works, only slower.
fn defer_port_choice(socket: &TcpSocket) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on a socket this function borrows, with a valid pointer to
    // an int and its size.
    unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Sends CONNECT and waits for a successful CONNACK.
pub async fn handshake(
    stream: &mut BenchStream,
    v: Version,
    client_id: &str,
    keep_alive: u16,
) -> anyhow::Result<()> {
    let mut out = BytesMut::new();
    v.connect(client_id, keep_alive, &mut out)
        .map_err(codec_err)?;
    stream.write_all(&out).await?;
    match read_one(stream, v, &mut BytesMut::new()).await? {
        Pkt::ConnAck { refused: None } => Ok(()),
        Pkt::ConnAck { refused: Some(why) } => bail!("the broker refused the connection: {why}"),
        other => bail!("expected CONNACK, got {other:?}"),
    }
}

/// Subscribes to `filter` and waits for the SUBACK.
pub async fn subscribe(
    stream: &mut BenchStream,
    v: Version,
    filter: &str,
    qos: QoS,
) -> anyhow::Result<()> {
    let mut buf = BytesMut::new();
    // A refusal is asked again a few times: NATS refuses a QoS 1 wildcard now and
    // then while its JetStream is still setting up just after it started.
    for attempt in 1..=SUBSCRIBE_ATTEMPTS {
        let mut out = BytesMut::new();
        v.subscribe(filter, qos, attempt, &mut out)
            .map_err(codec_err)?;
        stream.write_all(&out).await?;
        loop {
            match read_one(stream, v, &mut buf).await? {
                Pkt::SubAck { failed: false } => return Ok(()),
                Pkt::SubAck { failed: true } => break,
                // Retained or early messages may arrive first; they don't count.
                Pkt::Publish { .. } => continue,
                other => bail!("expected SUBACK, got {other:?}"),
            }
        }
        if attempt < SUBSCRIBE_ATTEMPTS {
            eprintln!("the broker refused the subscription to {filter}; asking again in 1 s");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    bail!("the broker refused the subscription to {filter} ({SUBSCRIBE_ATTEMPTS} times)")
}

/// How often a refused subscription is asked for (1 s apart).
const SUBSCRIBE_ATTEMPTS: u16 = 5;

async fn read_one(stream: &mut BenchStream, v: Version, buf: &mut BytesMut) -> anyhow::Result<Pkt> {
    loop {
        match v.read(buf, MAX_PACKET) {
            Ok(p) => return Ok(p),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {}
            Err(e) => bail!("bad packet from the broker: {e:?}"),
        }
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read_buf(buf))
            .await
            .context("the broker did not answer within 30 s")??;
        if n == 0 {
            bail!("the broker closed the connection");
        }
    }
}

fn codec_err(e: mqttbytes::Error) -> anyhow::Error {
    anyhow::anyhow!("encoding an MQTT packet: {e:?}")
}

/// A publisher's place in a [`Pacer`]'s schedule: its k-th message is due at
/// `base + offset + k / rate`.
#[derive(Debug, Clone)]
pub struct Slot {
    rate: f64,
    base: Instant,
    base_ns: u64,
    offset: Duration,
    wake: Arc<Notify>,
}

/// Spread arrivals (`--arrivals spread`): one thread wakes each of `n` publishers
/// in turn, `1 / (n * rate)` apart, with sub-millisecond sleeps (tokio's timer
/// wakes on 1 ms ticks, so publishers paced by it all send at once). A publisher
/// stamps what it sends when it sends it, so how late the thread or the task's
/// wake-up is does not count as the broker's latency.
pub struct Pacer {
    slots: Vec<Slot>,
}

impl Pacer {
    pub fn start(n: usize, rate: f64, phase: Arc<Phase>) -> anyhow::Result<Pacer> {
        let n = n.max(1);
        let base = Instant::now();
        let base_ns = now_ns();
        let step = Duration::from_secs_f64(1.0 / (n as f64 * rate));
        let slots: Vec<Slot> = (0..n)
            .map(|i| Slot {
                rate,
                base,
                base_ns,
                offset: step * i as u32,
                wake: Arc::new(Notify::new()),
            })
            .collect();
        let wakes: Vec<Arc<Notify>> = slots.iter().map(|s| s.wake.clone()).collect();
        std::thread::Builder::new()
            .name("bench-pacer".into())
            .spawn(move || {
                // Sleep as precisely as the kernel will (the default slack is 50 µs).
                // SAFETY: prctl with PR_SET_TIMERSLACK takes one integer argument.
                #[cfg(target_os = "linux")]
                unsafe {
                    libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0)
                };
                let mut j: u64 = 0;
                while !phase.stop.load(Ordering::Relaxed) {
                    let due = base + step.mul_f64(j as f64);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    wakes[(j % n as u64) as usize].notify_one();
                    j += 1;
                }
                // Let every publisher see the stop.
                for w in &wakes {
                    w.notify_one();
                }
            })
            .context("starting the pacing thread")?;
        Ok(Pacer { slots })
    }

    pub fn slot(&self, i: usize) -> Slot {
        self.slots[i % self.slots.len()].clone()
    }
}

/// How a publisher paces itself.
#[derive(Debug, Clone)]
pub enum Pace {
    /// As fast as the broker takes them (QoS 1: bounded by the in-flight window).
    Max,
    /// Open loop at this many messages per second. A message sent more than
    /// [`PACING_GRAIN_NS`] after it was due is stamped with the time it was *due*, so a
    /// stalled broker shows up as latency, not as a lower rate; one sent on time is
    /// stamped when sent (the 1 ms pacing tick's own lateness is not the broker's).
    Rate(f64),
    /// Open loop, woken by a [`Pacer`] at its own point of the schedule.
    Spread(Slot),
}

/// A pre-encoded PUBLISH whose packet id and payload stamp are patched per message.
struct Template {
    bytes: Vec<u8>,
    payload_at: usize,
    pkid_at: Option<usize>,
}

impl Template {
    fn new(v: Version, topic: &str, qos: QoS, size: usize) -> anyhow::Result<Template> {
        let size = size.max(16);
        let mut out = BytesMut::new();
        let pkid = u16::from(qos != QoS::AtMostOnce);
        v.publish(topic, qos, pkid, vec![0xAB; size], &mut out)
            .map_err(codec_err)?;
        let payload_at = out.len() - size;
        Ok(Template {
            bytes: out.to_vec(),
            payload_at,
            pkid_at: (qos != QoS::AtMostOnce).then(|| payload_at - v.after_pkid() - 2),
        })
    }

    fn push(&self, out: &mut BytesMut, pkid: u16, stamp_ns: u64, seq: u64) {
        let start = out.len();
        out.extend_from_slice(&self.bytes);
        let p = &mut out[start..];
        if let Some(at) = self.pkid_at {
            p[at..at + 2].copy_from_slice(&pkid.to_be_bytes());
        }
        p[self.payload_at..self.payload_at + 8].copy_from_slice(&stamp_ns.to_le_bytes());
        p[self.payload_at + 8..self.payload_at + 16].copy_from_slice(&seq.to_le_bytes());
    }
}

/// Counters a publisher shares with the report.
#[derive(Default)]
pub struct PubStats {
    pub sent: AtomicU64,
    pub acked: AtomicU64,
}

/// What one publisher sends and how.
pub struct PublishPlan {
    pub version: Version,
    pub topic: String,
    pub qos: QoS,
    pub size: usize,
    pub pace: Pace,
    /// QoS 1 messages in flight at most.
    pub window: u64,
}

/// Publishes to `plan.topic` until the phase says stop.
pub async fn publish(
    stream: BenchStream,
    plan: PublishPlan,
    phase: Arc<Phase>,
    stats: Arc<PubStats>,
) -> anyhow::Result<()> {
    let PublishPlan {
        version,
        topic,
        qos,
        size,
        pace,
        window,
    } = plan;
    let template = Template::new(version, &topic, qos, size)?;
    let (rd, mut wr) = stream.split();
    let acked = Arc::new(AtomicU64::new(0));
    let wake = Arc::new(Notify::new());
    let reader = tokio::spawn(read_acks(
        rd,
        version,
        acked.clone(),
        wake.clone(),
        phase.clone(),
    ));
    let window = if qos == QoS::AtMostOnce {
        u64::MAX
    } else {
        window.clamp(1, 65_000)
    };
    let started = Instant::now();
    let start_ns = now_ns();
    let mut out = BytesMut::with_capacity(WRITE_BATCH * template.bytes.len());
    let mut seq: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !phase.stop.load(Ordering::Relaxed) {
        let room = window.saturating_sub(seq - acked.load(Ordering::Acquire));
        if room == 0 {
            let notified = wake.notified();
            if window.saturating_sub(seq - acked.load(Ordering::Acquire)) == 0 {
                let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            }
            continue;
        }
        let (count, due) = match pace {
            Pace::Max => (room.min(WRITE_BATCH as u64), None),
            Pace::Rate(rate) => {
                tick.tick().await;
                let target = owed(started.elapsed(), rate);
                (target.saturating_sub(seq).min(room), Some((start_ns, rate)))
            }
            Pace::Spread(ref slot) => {
                slot.wake.notified().await;
                let start = slot.base + slot.offset;
                let target = match Instant::now().checked_duration_since(start) {
                    Some(d) => owed(d, slot.rate),
                    None => 0,
                };
                let start_ns = slot.base_ns + slot.offset.as_nanos() as u64;
                (
                    target.saturating_sub(seq).min(room),
                    Some((start_ns, slot.rate)),
                )
            }
        };
        out.clear();
        let now = now_ns();
        for _ in 0..count {
            let stamp = match due {
                // On time within the pacing's own grain (tokio's timer wakes
                // the 1 ms tick late, against a trivial sink up to ~3 ms on
                // this machine): stamped when sent, so that jitter is not the
                // broker's. Later than that, the publisher
                // was held up (a full window or socket: the broker's doing),
                // and the message is stamped when it was due.
                Some((start_ns, rate)) => {
                    let due = start_ns + due_ns(seq, rate);
                    if now.saturating_sub(due) > PACING_GRAIN_NS {
                        due
                    } else {
                        now
                    }
                }
                None => now,
            };
            template.push(&mut out, (seq % 65_535) as u16 + 1, stamp, seq);
            seq += 1;
        }
        if count > 0 {
            wr.write_all(&out).await.context("publishing")?;
            stats.sent.fetch_add(count, Ordering::Relaxed);
        }
    }
    let mut bye = BytesMut::new();
    version.disconnect(&mut bye).map_err(codec_err)?;
    let _ = wr.write_all(&bye).await;
    stats
        .acked
        .store(acked.load(Ordering::Relaxed), Ordering::Relaxed);
    reader.abort();
    Ok(())
}

async fn read_acks(
    mut rd: ReadSide,
    version: Version,
    acked: Arc<AtomicU64>,
    wake: Arc<Notify>,
    phase: Arc<Phase>,
) {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut n = 0;
        loop {
            match version.read(&mut buf, MAX_PACKET) {
                Ok(Pkt::PubAck) => n += 1,
                Ok(_) => {}
                Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(e) => {
                    if !phase.stop.load(Ordering::Relaxed) {
                        eprintln!("bench: bad packet from the broker: {e:?}");
                    }
                    return;
                }
            }
        }
        if n > 0 {
            acked.fetch_add(n, Ordering::Release);
            wake.notify_one();
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(REFILL);
        }
    }
}

/// Messages owed `elapsed` after the start of a schedule of `rate` per second: the
/// k-th (from 0) is owed from [`due_ns`]`(k)` on, the first at once.
fn owed(elapsed: Duration, rate: f64) -> u64 {
    (elapsed.as_secs_f64() * rate) as u64 + 1
}

/// When message `seq` of a schedule of `rate` per second is due, in ns from its start.
/// The same schedule as [`owed`]: a message stamped with its due time must not carry
/// the wait for the next one (open-loop publishers once counted each message as
/// owed one interval after this, so at 200 msgs/s per publisher every latency read
/// 5 ms too high).
fn due_ns(seq: u64, rate: f64) -> u64 {
    (seq as f64 * 1e9 / rate) as u64
}

/// How late a paced message may be sent and still be stamped with its send
/// time rather than its due time (see `publish`). Well below what it takes a
/// broker to hold a paced publisher up (a full 64-message window is 64 ms at 1k
/// msgs/s per publisher), above the generator's own lateness: against the
/// trivial sink at 10k msgs/s, p99 was 2.5 ms with a 2 ms grain and 0.4–0.5 ms
/// with a larger one.
const PACING_GRAIN_NS: u64 = 5_000_000;

/// What a subscriber saw while recording.
#[derive(Default)]
pub struct SubResult {
    pub received: u64,
    pub latencies: Latencies,
}

/// Reads messages until the phase says stop, acking QoS 1 deliveries in batches;
/// sends PINGREQ when it wrote nothing for `ping_every` (a QoS 0 subscriber, or one
/// that receives nothing, must still show the broker it is alive).
pub async fn consume(
    stream: BenchStream,
    version: Version,
    phase: Arc<Phase>,
    live: Arc<AtomicU64>,
    ping_every: Duration,
) -> anyhow::Result<SubResult> {
    let (mut rd, mut wr): (ReadSide, WriteSide) = stream.split();
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut acks = BytesMut::with_capacity(4096);
    let mut result = SubResult {
        received: 0,
        latencies: Latencies::with_capacity(1 << 16),
    };
    let mut last_write = Instant::now();
    loop {
        let read = tokio::time::timeout(Duration::from_millis(100), rd.read_buf(&mut buf)).await;
        if phase.stop.load(Ordering::Relaxed) {
            break;
        }
        if last_write.elapsed() >= ping_every {
            version.pingreq(&mut acks).map_err(codec_err)?;
        }
        match read {
            Err(_) => {} // nothing new: maybe time to ping
            Ok(Ok(0)) => bail!("the broker closed a subscriber connection"),
            Ok(Err(e)) => return Err(e).context("reading deliveries"),
            Ok(Ok(_)) => {}
        }
        let recording = phase.recording.load(Ordering::Acquire);
        let since = phase.recording_since.load(Ordering::Relaxed);
        let now = now_ns();
        let mut got = 0;
        loop {
            match version.read(&mut buf, MAX_PACKET) {
                Ok(Pkt::Publish { pkid, qos, payload }) => {
                    if qos != QoS::AtMostOnce {
                        version.puback(pkid, &mut acks).map_err(codec_err)?;
                    }
                    if recording && payload.len() >= 8 {
                        let stamp = (&payload[..8]).get_u64_le();
                        if stamp >= since {
                            result
                                .latencies
                                .record(Duration::from_nanos(now.saturating_sub(stamp)));
                        }
                        result.received += 1;
                    }
                    got += 1;
                }
                Ok(_) => {}
                Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(e) => bail!("bad packet from the broker: {e:?}"),
            }
        }
        live.fetch_add(got, Ordering::Relaxed);
        if !acks.is_empty() {
            wr.write_all(&acks).await.context("acking deliveries")?;
            acks.clear();
            last_write = Instant::now();
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(REFILL);
        }
    }
    let mut bye = BytesMut::new();
    version.disconnect(&mut bye).map_err(codec_err)?;
    let _ = wr.write_all(&bye).await;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mqttbytes::v4;
    use tokio::net::{TcpListener, TcpStream};

    async fn read_v4(s: &mut TcpStream, buf: &mut BytesMut) -> Option<v4::Packet> {
        loop {
            match v4::read(buf, MAX_PACKET) {
                Ok(p) => return Some(p),
                Err(mqttbytes::Error::InsufficientBytes(_)) => {}
                Err(_) => return None,
            }
            if s.read_buf(buf).await.ok()? == 0 {
                return None;
            }
        }
    }

    /// A broker that answers each SUBSCRIBE with the next of `grants` (true =
    /// granted QoS 1), and the packet ids it saw.
    async fn broker(grants: Vec<bool>) -> (SocketAddr, tokio::task::JoinHandle<Vec<u16>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = BytesMut::new();
            let mut seen = Vec::new();
            for grant in grants {
                let Some(v4::Packet::Subscribe(sub)) = read_v4(&mut s, &mut buf).await else {
                    break;
                };
                seen.push(sub.pkid);
                let code = if grant {
                    v4::SubscribeReasonCode::Success(QoS::AtLeastOnce)
                } else {
                    v4::SubscribeReasonCode::Failure
                };
                let mut out = BytesMut::new();
                v4::SubAck::new(sub.pkid, vec![code])
                    .write(&mut out)
                    .unwrap();
                s.write_all(&out).await.unwrap();
            }
            seen
        });
        (addr, task)
    }

    #[test]
    fn a_message_is_owed_from_its_due_time_on() {
        for rate in [200.0, 1_000.0, 33_333.0] {
            for seq in [0u64, 1, 7, 1_000, 123_456] {
                let due = Duration::from_nanos(due_ns(seq, rate));
                assert!(
                    owed(due + Duration::from_micros(1), rate) > seq,
                    "{rate} {seq}"
                );
                if let Some(before) = due.checked_sub(Duration::from_micros(1)) {
                    assert!(owed(before, rate) <= seq, "{rate} {seq}");
                }
            }
        }
    }

    #[tokio::test]
    async fn a_refused_subscription_is_asked_for_again() {
        let (addr, server) = broker(vec![false, true]).await;
        let mut s = BenchStream::Tcp(TcpStream::connect(addr).await.unwrap());
        subscribe(&mut s, Version::V4, "a/#", QoS::AtLeastOnce)
            .await
            .unwrap();
        assert_eq!(server.await.unwrap(), vec![1, 2]);
    }

    #[tokio::test]
    async fn a_subscription_refused_every_time_is_an_error() {
        let (addr, server) = broker(vec![false; SUBSCRIBE_ATTEMPTS as usize]).await;
        let mut s = BenchStream::Tcp(TcpStream::connect(addr).await.unwrap());
        let err = subscribe(&mut s, Version::V4, "a/#", QoS::AtLeastOnce)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("refused the subscription to a/#"),
            "{err}"
        );
        assert_eq!(server.await.unwrap().len(), SUBSCRIBE_ATTEMPTS as usize);
    }
}
