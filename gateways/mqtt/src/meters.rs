//! The MQTT door's metrics (docs/metrics.md), kept off the per-message path:
//! counters are looked up once (statics; per core topic for messages in) and
//! incremented once per batch a connection stores or writes; latencies go to
//! lock-free [`rocketgate_core::meter`] histograms; sessions and retained
//! messages are sampled at scrape time (registered by `server.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, RwLock};

use metrics::Counter;
use rocketgate_core::meter::DoorMeters;
use rocketgate_core::sync::{read, write};

/// Publish and delivery latency of the door (`protocol="mqtt"`).
pub(crate) static METERS: DoorMeters = DoorMeters::new();

/// `(messages, bytes)` counters.
type Pair = (Counter, Counter);

/// Messages and bytes in, per core topic (the `topic` label is capped).
fn topics_in() -> &'static RwLock<HashMap<String, Pair>> {
    static IN: OnceLock<RwLock<HashMap<String, Pair>>> = OnceLock::new();
    IN.get_or_init(Default::default)
}

/// PUBLISH messages and payload bytes in and out since the process started
/// (for `$SYS`; the facade's counters cannot be read back).
static TOTALS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// `(messages received, messages sent, bytes received, bytes sent)`.
pub(crate) fn totals() -> (u64, u64, u64, u64) {
    let t = |i: usize| TOTALS[i].load(Ordering::Relaxed);
    (t(0), t(1), t(2), t(3))
}

/// One stored batch of `n` messages, `bytes` of payload, to core topic `topic`.
pub(crate) fn count_in(topic: &str, n: usize, bytes: usize) {
    let cached = read(topics_in()).get(topic).cloned();
    let (msgs, size) = cached.unwrap_or_else(|| {
        let labels = [
            ("protocol", "mqtt".to_owned()),
            ("topic", rocketgate_core::labels::topic(topic)),
        ];
        let pair = (
            metrics::counter!("rocketgate_messages_in_total", &labels),
            metrics::counter!("rocketgate_bytes_in_total", &labels),
        );
        write(topics_in())
            .entry(topic.to_owned())
            .or_insert(pair)
            .clone()
    });
    msgs.increment(n as u64);
    size.increment(bytes as u64);
    TOTALS[0].fetch_add(n as u64, Ordering::Relaxed);
    TOTALS[2].fetch_add(bytes as u64, Ordering::Relaxed);
}

/// PUBLISH packets written to clients: `n` of them, `bytes` of payload. Per
/// door, not per topic: one write mixes topics, and a lookup per message is
/// what this avoids.
pub(crate) fn count_out(n: usize, bytes: usize) {
    static OUT: OnceLock<Pair> = OnceLock::new();
    let (msgs, size) = OUT.get_or_init(|| {
        (
            metrics::counter!("rocketgate_messages_out_total", "protocol" => "mqtt"),
            metrics::counter!("rocketgate_bytes_out_total", "protocol" => "mqtt"),
        )
    });
    msgs.increment(n as u64);
    size.increment(bytes as u64);
    TOTALS[1].fetch_add(n as u64, Ordering::Relaxed);
    TOTALS[3].fetch_add(bytes as u64, Ordering::Relaxed);
}
