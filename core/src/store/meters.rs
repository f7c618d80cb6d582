//! The store's latency histograms (docs/metrics.md): what an append costs its
//! caller (append + durability wait, per call: a batch is one sample), what
//! one flush round costs (the msync/fdatasync), and on a slave how far behind
//! its master each replicated message landed. Statics in
//! [`rocketgate_base::meter`], registered when a store opens (the lag one when
//! a slave appends its first run).

use std::sync::Once;
use std::time::{SystemTime, UNIX_EPOCH};

use rocketgate_base::meter::{Batch, FINE_NS, Histogram, register_histogram};

/// `rocketgate_store_append_duration_seconds`: one append call until it returns
/// (durable under sync flush, replicated where the group requires it).
pub static APPEND: Histogram = Histogram::new();

/// `rocketgate_store_flush_duration_seconds`: one flush round (the sync call).
pub static FLUSH: Histogram = Histogram::new();

/// `rocketgate_replication_message_lag_seconds`: on a slave, per replicated
/// message, its local clock when the run holding it was appended minus the
/// master's store timestamp of the message. Fine buckets (0.1 to 100 ms).
pub static REPLICATION_LAG: Histogram = Histogram::with_bounds(&FINE_NS);

/// Records the lag of a run a slave just appended: `stamps` are its records'
/// store timestamps as the log's checks reported them (`(store_ms, records)`).
/// One clock read per run, a subtraction per stretch of equal timestamps, and one
/// atomic add per bucket touched.
///
/// The store timestamp is whole milliseconds (cut, not rounded), so a sample is
/// the true lag plus 0 to 1 ms; across machines it also carries the clock skew
/// between master and slave (a slave behind its master's clock reads less, down to
/// 0 for a timestamp in its future).
pub(crate) fn replicated(stamps: &[(i64, u32)]) {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        register_histogram(
            "rocketgate_replication_message_lag_seconds",
            "On a slave, per replicated message: its clock when the message was appended minus the master's store timestamp (+0..1 ms: the timestamp is whole ms; across machines includes clock skew).",
            &[],
            &REPLICATION_LAG,
        )
    });
    if stamps.is_empty() {
        return;
    }
    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
    let mut batch = Batch::for_histogram(&REPLICATION_LAG);
    for &(store_ms, n) in stamps {
        let lag = now_ns.saturating_sub(i128::from(store_ms) * 1_000_000);
        batch.record_many_ns(u64::try_from(lag).unwrap_or(0), n);
    }
    batch.add_to(&REPLICATION_LAG);
}

pub(crate) fn register() {
    register_histogram(
        "rocketgate_store_append_duration_seconds",
        "One append call (a message or a batch) until it returns: durable under sync flush, replicated where required.",
        &[],
        &APPEND,
    );
    register_histogram(
        "rocketgate_store_flush_duration_seconds",
        "One commit-log flush round (msync or fdatasync).",
        &[],
        &FLUSH,
    );
}
