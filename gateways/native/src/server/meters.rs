//! The native door's metrics (docs/metrics.md): counters per core topic
//! (label capped), looked up once per topic and kept; latencies in lock-free
//! [`rocketgate_core::meter`] histograms.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use metrics::Counter;
use rocketgate_core::broker::Delivered;
use rocketgate_core::meter::DoorMeters;
use rocketgate_core::store::record::store_timestamp_of;
use rocketgate_core::sync::{read, write};

/// Publish and delivery latency of the door (`protocol="native"`).
pub(crate) static METERS: DoorMeters = DoorMeters::new();

/// `(messages, bytes)` counters.
type Pair = (Counter, Counter);

#[derive(Clone, Copy)]
enum Way {
    In,
    Out,
}

fn pair(way: Way, topic: &str) -> Pair {
    type Map = RwLock<HashMap<String, Pair>>;
    static IN: OnceLock<Map> = OnceLock::new();
    static OUT: OnceLock<Map> = OnceLock::new();
    let (map, msgs, bytes) = match way {
        Way::In => (
            &IN,
            "rocketgate_messages_in_total",
            "rocketgate_bytes_in_total",
        ),
        Way::Out => (
            &OUT,
            "rocketgate_messages_out_total",
            "rocketgate_bytes_out_total",
        ),
    };
    let map = map.get_or_init(Default::default);
    if let Some(p) = read(map).get(topic) {
        return p.clone();
    }
    let labels = [
        ("protocol", "native".to_owned()),
        ("topic", rocketgate_core::labels::topic(topic)),
    ];
    let p = (
        metrics::counter!(msgs, &labels),
        metrics::counter!(bytes, &labels),
    );
    write(map).entry(topic.to_owned()).or_insert(p).clone()
}

/// `n` sent messages (a single send or a batch) of `bytes` body bytes, stored.
pub(crate) fn count_in(topic: &str, n: usize, bytes: usize) {
    let (m, b) = pair(Way::In, topic);
    m.increment(n as u64);
    b.increment(bytes as u64);
}

/// The messages of one pull answer (bytes: the stored records).
pub(crate) fn count_out(topic: &str, messages: &[Delivered]) {
    if messages.is_empty() {
        return;
    }
    let (n, b) = pair(Way::Out, topic);
    n.increment(messages.len() as u64);
    b.increment(messages.iter().map(|m| m.record.len() as u64).sum());
    let now = rocketgate_core::clock::now_ms();
    let mut latency = rocketgate_core::meter::Batch::default();
    for m in messages {
        if let Some(ts) = store_timestamp_of(&m.record) {
            latency.delivered(now, ts);
        }
    }
    latency.add_to(&METERS.delivery);
}
