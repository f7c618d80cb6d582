//! `$SYS/#`: the broker's statistics under Mosquitto's names, for MQTT clients
//! (docs/mqtt.md, "$SYS"). Every `sys_interval` a task of the server samples
//! them into [`Sys`]; a value that changed gets a new generation. A subscriber
//! to a matching filter gets the current values at once on SUBSCRIBE (retained,
//! like Mosquitto's), and each changed value within a second of the update (the
//! connection looks on its one-second tick). They are never stored in the log,
//! are not matched by a leading wildcard (`#`, `+/…`: MQTT-4.7.2-1) and need
//! the ACL's subscribe permission on the filter when auth is on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rocketgate_core::sync::lock;

/// One `$SYS` topic's value and the generation it last changed in.
struct Entry {
    topic: Arc<str>,
    payload: Bytes,
    changed: u64,
}

/// Per-minute rates averaged over 1, 5 and 15 minutes (Mosquitto's `load/…`).
#[derive(Default)]
struct Load {
    last: Option<(Instant, u64)>,
    avg: [f64; 3],
}

impl Load {
    const WINDOWS: [f64; 3] = [60.0, 300.0, 900.0];

    fn update(&mut self, now: Instant, total: u64) -> [f64; 3] {
        if let Some((at, before)) = self.last {
            let dt = now.duration_since(at).as_secs_f64();
            if dt > 0.0 {
                let per_min = total.saturating_sub(before) as f64 * 60.0 / dt;
                for (avg, w) in self.avg.iter_mut().zip(Self::WINDOWS) {
                    *avg = per_min + (-dt / w).exp() * (*avg - per_min);
                }
            }
        }
        self.last = Some((now, total));
        self.avg
    }
}

/// What one sample reads of the door.
pub(crate) struct Sample {
    pub connected: usize,
    pub disconnected: usize,
    pub retained: usize,
}

struct State {
    entries: Vec<Entry>,
    received: Load,
    sent: Load,
}

/// The current `$SYS` values.
pub(crate) struct Sys {
    started: Instant,
    /// Raised by every update that changed a value; 0: never sampled.
    generation: AtomicU64,
    state: Mutex<State>,
}

impl Sys {
    pub fn new() -> Sys {
        Sys {
            started: Instant::now(),
            generation: AtomicU64::new(0),
            state: Mutex::new(State {
                entries: Vec::new(),
                received: Load::default(),
                sent: Load::default(),
            }),
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Takes a sample: the values that changed get the next generation.
    pub fn update(&self, s: Sample) {
        let now = Instant::now();
        let (received, sent, bytes_in, bytes_out) = crate::meters::totals();
        let mut st = lock(&self.state);
        let load_in = st.received.update(now, received);
        let load_out = st.sent.update(now, sent);
        let mut values: Vec<(String, String)> = [
            (
                "$SYS/broker/version",
                format!("rocketgate version {}", env!("CARGO_PKG_VERSION")),
            ),
            (
                "$SYS/broker/uptime",
                format!("{} seconds", self.started.elapsed().as_secs()),
            ),
            ("$SYS/broker/clients/connected", s.connected.to_string()),
            ("$SYS/broker/clients/active", s.connected.to_string()),
            (
                "$SYS/broker/clients/disconnected",
                s.disconnected.to_string(),
            ),
            ("$SYS/broker/clients/inactive", s.disconnected.to_string()),
            (
                "$SYS/broker/clients/total",
                (s.connected + s.disconnected).to_string(),
            ),
            ("$SYS/broker/messages/received", received.to_string()),
            ("$SYS/broker/messages/sent", sent.to_string()),
            (
                "$SYS/broker/publish/messages/received",
                received.to_string(),
            ),
            ("$SYS/broker/publish/messages/sent", sent.to_string()),
            ("$SYS/broker/publish/bytes/received", bytes_in.to_string()),
            ("$SYS/broker/publish/bytes/sent", bytes_out.to_string()),
            (
                "$SYS/broker/retained messages/count",
                s.retained.to_string(),
            ),
        ]
        .into_iter()
        .map(|(t, v)| (t.to_owned(), v))
        .collect();
        for (i, w) in ["1min", "5min", "15min"].iter().enumerate() {
            values.push((
                format!("$SYS/broker/load/messages/received/{w}"),
                format!("{:.2}", load_in[i]),
            ));
            values.push((
                format!("$SYS/broker/load/messages/sent/{w}"),
                format!("{:.2}", load_out[i]),
            ));
        }
        let next = self.generation() + 1;
        let mut changed = false;
        for (topic, value) in values {
            match st.entries.iter_mut().find(|e| *e.topic == *topic) {
                Some(e) if e.payload == value.as_bytes() => {}
                Some(e) => {
                    e.payload = Bytes::from(value);
                    e.changed = next;
                    changed = true;
                }
                None => {
                    st.entries.push(Entry {
                        topic: Arc::from(topic.as_str()),
                        payload: Bytes::from(value),
                        changed: next,
                    });
                    changed = true;
                }
            }
        }
        if changed {
            self.generation.store(next, Ordering::Release);
        }
    }

    /// `(topic, payload)` of the values changed after generation `since` (0:
    /// all) whose topic `matches`.
    pub fn changed_since(
        &self,
        since: u64,
        mut matches: impl FnMut(&str) -> bool,
    ) -> Vec<(Arc<str>, Bytes)> {
        lock(&self.state)
            .entries
            .iter()
            .filter(|e| e.changed > since && matches(&e.topic))
            .map(|e| (e.topic.clone(), e.payload.clone()))
            .collect()
    }
}

/// How often the updater looks (`interval` 0: never started).
pub(crate) fn period(interval: Duration) -> Option<Duration> {
    (!interval.is_zero()).then_some(interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_values_get_a_new_generation() {
        let sys = Sys::new();
        let sample = |c| Sample {
            connected: c,
            disconnected: 0,
            retained: 0,
        };
        sys.update(sample(1));
        let g1 = sys.generation();
        assert!(g1 > 0);
        let all = sys.changed_since(0, |t| t.starts_with("$SYS/broker/clients/"));
        assert!(
            all.iter()
                .any(|(t, p)| &**t == "$SYS/broker/clients/connected" && p == "1")
        );
        sys.update(sample(2));
        let changed = sys.changed_since(g1, |t| t == "$SYS/broker/clients/connected");
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].1, "2");
        let g2 = sys.generation();
        sys.update(sample(2));
        assert!(
            sys.changed_since(g2, |t| t == "$SYS/broker/clients/connected")
                .is_empty(),
            "an unchanged value is not sent again"
        );
    }

    #[test]
    fn load_is_a_per_minute_rate() {
        let mut l = Load::default();
        let t0 = Instant::now();
        l.update(t0, 0);
        let avg = l.update(t0 + Duration::from_secs(60), 600);
        // 600 per minute over one minute: the 1-minute average moved 63 % of the way.
        assert!(
            (avg[0] - 600.0 * (1.0 - (-1.0f64).exp())).abs() < 1e-6,
            "{avg:?}"
        );
        assert!(avg[1] < avg[0] && avg[2] < avg[1]);
    }
}
