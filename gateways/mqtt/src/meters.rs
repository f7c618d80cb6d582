//! The MQTT door's metrics (docs/metrics.md), kept off the per-message path:
//! counters are looked up once per core topic and kept, and incremented once
//! per batch a connection stores or per run of one topic it writes; latencies go to
//! lock-free [`rocketgate_core::meter`] histograms; sessions and retained
//! messages are sampled at scrape time (registered by `server.rs`).

// Looked up per stored batch and per pump: foldhash (see router.rs, `Members`).
use foldhash::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use metrics::Counter;
use rocketgate_core::meter::DoorMeters;
use rocketgate_core::store::record::store_timestamp_of;
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

/// PUBLISH packets written to clients from core topic `topic`: `n` of them,
/// `bytes` of payload (one call per run of one topic in a pump, see [`Tally`]).
pub(crate) fn count_out(topic: &str, n: usize, bytes: usize) {
    let cached = read(topics_out()).get(topic).cloned();
    let (msgs, size) = cached.unwrap_or_else(|| {
        let labels = [
            ("protocol", "mqtt".to_owned()),
            ("topic", rocketgate_core::labels::topic(topic)),
        ];
        let pair = (
            metrics::counter!("rocketgate_messages_out_total", &labels),
            metrics::counter!("rocketgate_bytes_out_total", &labels),
        );
        write(topics_out())
            .entry(topic.to_owned())
            .or_insert(pair)
            .clone()
    });
    msgs.increment(n as u64);
    size.increment(bytes as u64);
    TOTALS[1].fetch_add(n as u64, Ordering::Relaxed);
    TOTALS[3].fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Messages and bytes out, per core topic (the `topic` label is capped).
fn topics_out() -> &'static RwLock<HashMap<String, Pair>> {
    static OUT: OnceLock<RwLock<HashMap<String, Pair>>> = OnceLock::new();
    OUT.get_or_init(Default::default)
}

/// The `topic` label of what a connection writes: `$SYS/…` publishes are
/// counted as `$SYS` (they have no core topic).
pub(crate) const SYS_TOPIC: &str = "$SYS";

/// What one pump of a connection wrote, per core topic: consecutive messages of
/// one topic (the usual case: a run of one router batch) are added up here and
/// counted with one lookup; a change of topic counts the run before it. No
/// allocation: the topic is the batch's own `Arc`.
#[derive(Default)]
pub(crate) struct Tally {
    topic: Option<Arc<str>>,
    n: usize,
    bytes: usize,
}

impl Tally {
    /// One PUBLISH of `bytes` payload bytes from core topic `topic`.
    pub fn add(&mut self, topic: &Arc<str>, bytes: usize) {
        match &self.topic {
            Some(t) if Arc::ptr_eq(t, topic) || **t == **topic => {}
            _ => {
                self.flush();
                self.topic = Some(topic.clone());
            }
        }
        self.n += 1;
        self.bytes += bytes;
    }

    /// Counts what was added (also done on drop).
    pub fn flush(&mut self) {
        if let Some(t) = self.topic.take() {
            count_out(&t, self.n, self.bytes);
        }
        self.n = 0;
        self.bytes = 0;
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.flush();
    }
}

/// When a message was stored, as much as a delivery-latency sample needs: the
/// low 32 bits of its store timestamp (ms) with the lowest bit set, so 0 means
/// "none" (a retained or `$SYS` message) and the stamp still fits in the
/// padding of a session's in-flight entry (1 ms off at most). Differences
/// are taken modulo 2^32 ms: right for latencies under 24 days (longer
/// ones, like a clock step backwards, count as 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stored(u32);

impl Stored {
    /// No store timestamp: no latency sample.
    pub const NONE: Stored = Stored(0);

    /// The stamp of a stored record (`NONE` when it has no readable timestamp).
    pub fn of(record: &[u8]) -> Stored {
        store_timestamp_of(record).map_or(Stored::NONE, Stored::at)
    }

    /// The stamp of store time `ms`.
    pub fn at(ms: i64) -> Stored {
        Stored((ms as u32) | 1)
    }

    /// Milliseconds from the store until `now_ms` (`None`: no stamp).
    pub fn since(self, now_ms: i64) -> Option<u64> {
        if self.0 == 0 {
            return None;
        }
        let d = (now_ms as u32 | 1).wrapping_sub(self.0);
        // A step backwards wraps to a huge value: 0 instead.
        Some(if d > u32::MAX / 2 { 0 } else { u64::from(d) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_measures_across_the_32_bit_wrap_and_clamps_a_step_back() {
        let t = 0x1_FFFF_FFF0_i64;
        assert_eq!(Stored::at(t).since(t + 100), Some(100));
        assert_eq!(Stored::at(t).since(t + 40), Some(40));
        assert_eq!(Stored::at(t).since(t - 5), Some(0));
        assert_eq!(Stored::NONE.since(t), None);
        assert_ne!(Stored::at(0), Stored::NONE);
    }
}
