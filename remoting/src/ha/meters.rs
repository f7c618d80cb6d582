//! Bytes through the replication stream (docs/metrics.md): what a master shipped
//! to each slave, what a slave received and applied. Counted once per data frame
//! (a run of up to `ha.batch` bytes), in [`rocketgate_base::meter`] counters
//! (this crate has no `metrics` facade); rendered with the rest of `/metrics`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use rocketgate_base::meter::{Counter, register_counter};
use rocketgate_base::sync::lock;

/// Distinct `slave` label values a master keeps; later broker ids share `other`.
/// (A broker group has a handful of slaves; this only bounds a misconfiguration.)
const SLAVE_CAP: usize = 64;

/// `rocketgate_replication_shipped_bytes_total{slave}`: log bytes a master sent to
/// the slave with that broker id (reconnects add to the same count). One counter
/// per broker id, made (and leaked: at most [`SLAVE_CAP`] + 1) on its first join.
pub(crate) fn shipped(broker_id: u64) -> &'static Counter {
    static BY_SLAVE: OnceLock<Mutex<HashMap<String, &'static Counter>>> = OnceLock::new();
    let mut map = lock(BY_SLAVE.get_or_init(Default::default));
    let mut label = broker_id.to_string();
    if !map.contains_key(&label) && map.len() >= SLAVE_CAP {
        label = rocketgate_base::labels::OTHER.to_owned();
    }
    if let Some(c) = map.get(&label) {
        return c;
    }
    let c: &'static Counter = Box::leak(Box::new(Counter::new()));
    register_counter(
        "rocketgate_replication_shipped_bytes_total",
        "Log bytes a master sent to each slave (by broker id).",
        &[("slave", &label)],
        c,
    );
    map.insert(label, c);
    c
}

/// `rocketgate_replication_received_bytes_total`: log bytes a slave received from
/// its master.
pub(crate) fn received() -> &'static Counter {
    static C: Counter = Counter::new();
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        register_counter(
            "rocketgate_replication_received_bytes_total",
            "Log bytes a slave received from its master.",
            &[],
            &C,
        )
    });
    &C
}

/// `rocketgate_replication_applied_bytes_total`: of those, the bytes appended to
/// the slave's log (a run that fails to append ends the connection uncounted).
pub(crate) fn applied() -> &'static Counter {
    static C: Counter = Counter::new();
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        register_counter(
            "rocketgate_replication_applied_bytes_total",
            "Log bytes a slave appended to its log from its master.",
            &[],
            &C,
        )
    });
    &C
}
