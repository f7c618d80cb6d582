//! `rocketgate bench mqtt-sink`: a trivial in-memory MQTT 3.1.1 forwarder used only to
//! measure the load generator's own ceiling. It acks what it is sent, forwards each
//! PUBLISH to the subscribers whose filter is the exact topic or a `prefix/#` filter
//! (one member of a `$share/<group>/…` group, round-robin), stores nothing, retains
//! nothing and checks nothing. It is not a broker; it is the fastest thing that
//! speaks the same packets, so a benchmark can show that the generator is not the
//! bottleneck when it measures a real broker.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use bytes::{Bytes, BytesMut};
use clap::Args;
use mqttbytes::QoS;
use mqttbytes::v4::{
    self, ConnAck, ConnectReturnCode, Packet, PubAck, SubAck, SubscribeReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

#[derive(Debug, Clone, Args)]
pub struct SinkArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:1884")]
    pub listen: SocketAddr,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

/// Forwarded bytes go to a subscriber's writer through a bounded channel of batches.
type Outbox = mpsc::Sender<Bytes>;

struct Route {
    /// Exact topic, or the prefix of a `prefix/#` filter (with its trailing `/`).
    pattern: String,
    wildcard: bool,
    /// `Some(group)` for a `$share/<group>/…` subscription: one member per message.
    group: Option<String>,
    members: Vec<Outbox>,
    next: AtomicUsize,
}

#[derive(Default)]
struct Routes {
    /// Written on SUBSCRIBE, read on every PUBLISH batch: an RwLock held briefly.
    table: RwLock<Vec<Route>>,
}

impl Routes {
    fn add(&self, filter: &str, out: Outbox) {
        let (group, filter) = match filter
            .strip_prefix("$share/")
            .and_then(|r| r.split_once('/'))
        {
            Some((g, f)) => (Some(g.to_string()), f),
            None => (None, filter),
        };
        let (pattern, wildcard) = match filter.strip_suffix('#') {
            Some(prefix) => (prefix.to_string(), true),
            None => (filter.to_string(), false),
        };
        let mut table = rocketgate_core::sync::write(&self.table);
        if group.is_some()
            && let Some(r) = table
                .iter_mut()
                .find(|r| r.group == group && r.pattern == pattern && r.wildcard == wildcard)
        {
            r.members.push(out);
            return;
        }
        table.push(Route {
            pattern,
            wildcard,
            group,
            members: vec![out],
            next: AtomicUsize::new(0),
        });
    }

    /// Appends `publish` to the batch of every matching subscriber.
    fn route(
        &self,
        topic: &str,
        payload: &Bytes,
        batches: &mut HashMap<usize, (Outbox, BytesMut)>,
    ) {
        let table = rocketgate_core::sync::read(&self.table);
        for route in table.iter() {
            let hit = if route.wildcard {
                topic.starts_with(&route.pattern)
            } else {
                topic == route.pattern
            };
            if !hit || route.members.is_empty() {
                continue;
            }
            let i = route.next.fetch_add(1, Ordering::Relaxed) % route.members.len();
            let out = &route.members[i];
            let key = out as *const Outbox as usize;
            let entry = batches
                .entry(key)
                .or_insert_with(|| (out.clone(), BytesMut::new()));
            let p = v4::Publish::from_bytes(topic, QoS::AtMostOnce, payload.clone());
            let _ = p.write(&mut entry.1);
        }
    }
}

pub fn run(args: SinkArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        println!(
            "rocketgate: mqtt-sink listening on {}",
            listener.local_addr()?
        );
        let routes = Arc::new(Routes::default());
        loop {
            let (stream, _) = listener.accept().await?;
            let routes = routes.clone();
            tokio::spawn(async move {
                let _ = connection(stream, routes).await;
            });
        }
    })
}

async fn connection(stream: TcpStream, routes: Arc<Routes>) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Bytes>(1024);
    let writer = tokio::spawn(async move {
        while let Some(b) = rx.recv().await {
            if wr.write_all(&b).await.is_err() {
                break;
            }
        }
    });
    let mut buf = BytesMut::with_capacity(256 * 1024);
    let mut batches: HashMap<usize, (Outbox, BytesMut)> = HashMap::new();
    loop {
        if rd.read_buf(&mut buf).await? == 0 {
            break;
        }
        let mut replies = BytesMut::new();
        loop {
            match v4::read(&mut buf, 1 << 20) {
                Ok(Packet::Connect(_)) => {
                    ConnAck::new(ConnectReturnCode::Success, false)
                        .write(&mut replies)
                        .ok();
                }
                Ok(Packet::Subscribe(s)) => {
                    for f in &s.filters {
                        routes.add(&f.path, tx.clone());
                    }
                    let codes = s
                        .filters
                        .iter()
                        .map(|_| SubscribeReasonCode::Success(QoS::AtMostOnce))
                        .collect();
                    SubAck::new(s.pkid, codes).write(&mut replies).ok();
                }
                Ok(Packet::Publish(p)) => {
                    if p.qos != QoS::AtMostOnce {
                        PubAck::new(p.pkid).write(&mut replies).ok();
                    }
                    routes.route(&p.topic, &p.payload, &mut batches);
                }
                Ok(Packet::PingReq) => replies.extend_from_slice(&[0xD0, 0]),
                Ok(Packet::Disconnect) => return Ok(()),
                Ok(_) => {}
                Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(e) => anyhow::bail!("bad packet: {e:?}"),
            }
        }
        if !replies.is_empty() && tx.send(replies.freeze()).await.is_err() {
            break;
        }
        for (_, (out, bytes)) in batches.drain() {
            let _ = out.send(bytes.freeze()).await;
        }
    }
    drop(tx);
    let _ = writer.await;
    Ok(())
}
