//! The store's latency histograms (docs/metrics.md): what an append costs its
//! caller (append + durability wait, per call: a batch is one sample) and what
//! one flush round costs (the msync/fdatasync). Statics in
//! [`rocketgate_base::meter`], registered when a store opens.

use rocketgate_base::meter::{Histogram, register_histogram};

/// `rocketgate_store_append_duration_seconds`: one append call until it returns
/// (durable under sync flush, replicated where the group requires it).
pub static APPEND: Histogram = Histogram::new();

/// `rocketgate_store_flush_duration_seconds`: one flush round (the sync call).
pub static FLUSH: Histogram = Histogram::new();

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
