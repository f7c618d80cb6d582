//! Metrics the hot paths record without a lock or an allocation: latency
//! histograms on fixed buckets (two relaxed atomic adds per sample), counters
//! (one; for crates without the `metrics` facade) and gauges
//! sampled at scrape time (a closure over the component's own state). Each
//! component keeps its histograms in statics and registers them once; the HTTP
//! door's `/metrics` appends [`render`] to the `metrics` facade's output
//! (docs/metrics.md). Why not the facade for these: its histograms keep every
//! raw sample until the next upkeep (an allocation per block of samples), and
//! its macros build and look up the key on every call; per message at hundreds
//! of thousands a second both showed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// Upper bounds (nanoseconds) of a latency histogram's buckets, 0.1 ms to 30 s;
/// `+Inf` follows.
pub const LATENCY_NS: [u64; 17] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// Finer bounds (nanoseconds) between 0.1 and 100 ms, for figures whose targets
/// sit there (replication lag, ≤ 10 ms at p99): a p99 read off the buckets is
/// then within a few milliseconds instead of between 10 and 25.
pub const FINE_NS: [u64; 24] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    1_500_000,
    2_000_000,
    3_000_000,
    4_000_000,
    5_000_000,
    7_500_000,
    10_000_000,
    15_000_000,
    20_000_000,
    30_000_000,
    50_000_000,
    75_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// Buckets a histogram can have besides `+Inf` (the longest bounds above).
const MAX_BOUNDS: usize = FINE_NS.len();

/// A latency histogram: a count per bucket (not cumulative; the one after the
/// last bound is `+Inf`) and the sum in nanoseconds. `const`, so it lives in a
/// static.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds (ns), ascending, at most [`MAX_BOUNDS`].
    bounds: &'static [u64],
    counts: [AtomicU64; MAX_BOUNDS + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// On the latency bounds ([`LATENCY_NS`]).
    pub const fn new() -> Histogram {
        Histogram::with_bounds(&LATENCY_NS)
    }

    /// On `bounds` (nanoseconds, ascending, at most as many as [`FINE_NS`]).
    pub const fn with_bounds(bounds: &'static [u64]) -> Histogram {
        assert!(bounds.len() <= MAX_BOUNDS, "too many histogram bounds");
        Histogram {
            bounds,
            counts: [const { AtomicU64::new(0) }; MAX_BOUNDS + 1],
            sum_ns: AtomicU64::new(0),
        }
    }

    /// One sample.
    pub fn record(&self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// One sample: the time since `start`.
    pub fn record_since(&self, start: Instant) {
        self.record(start.elapsed());
    }

    /// One sample in milliseconds (store timestamps are milliseconds).
    pub fn record_ms(&self, ms: u64) {
        self.record_ns(ms.saturating_mul(1_000_000));
    }

    pub fn record_ns(&self, ns: u64) {
        let i = self.bounds.partition_point(|&b| b < ns);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Samples so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The upper bound (ns) of the bucket that holds the `q`-quantile of the
    /// samples so far (`None` with no samples; `u64::MAX` when it is `+Inf`):
    /// what a Prometheus `histogram_quantile` would put no higher than.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .take(self.bounds.len() + 1)
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut cumulative = 0;
        for (i, c) in counts.iter().enumerate() {
            cumulative += c;
            if cumulative >= rank {
                return Some(self.bounds.get(i).copied().unwrap_or(u64::MAX));
            }
        }
        Some(u64::MAX)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, c) in self.counts.iter().take(self.bounds.len() + 1).enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            // (an integer over 1e9 is correctly rounded: 100_000 prints 0.0001)
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_owned(), |&b| (b as f64 / 1e9).to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

/// The latency histograms every door has (`protocol` = the door).
#[derive(Debug)]
pub struct DoorMeters {
    /// `rocketgate_publish_duration_seconds`: a publish (or a batch) arrived
    /// until it was stored (acknowledged).
    pub publish: Histogram,
    /// `rocketgate_delivery_latency_seconds`: a message's store timestamp until
    /// the door hands it to a client (millisecond resolution).
    pub delivery: Histogram,
}

impl Default for DoorMeters {
    fn default() -> Self {
        Self::new()
    }
}

impl DoorMeters {
    pub const fn new() -> DoorMeters {
        DoorMeters {
            publish: Histogram::new(),
            delivery: Histogram::new(),
        }
    }

    /// Registers both under `protocol="{door}"` (idempotent).
    pub fn register(&'static self, door: &str) {
        register_histogram(
            "rocketgate_publish_duration_seconds",
            "A publish (or one batch) from arrival until stored.",
            &[("protocol", door)],
            &self.publish,
        );
        register_histogram(
            "rocketgate_delivery_latency_seconds",
            "A message's store timestamp until the door hands it to a client.",
            &[("protocol", door)],
            &self.delivery,
        );
    }

    /// One delivery of a record stored at `store_ms`, handed out at `now_ms`
    /// (a clock step backwards counts as 0).
    pub fn delivered(&self, now_ms: i64, store_ms: i64) {
        let ms = u64::try_from(now_ms.saturating_sub(store_ms)).unwrap_or(0);
        self.delivery.record_ms(ms);
    }
}

/// Samples gathered on one thread (a connection's pump, one pull answer, one
/// replicated run) and added to a shared [`Histogram`] at once: per batch one
/// atomic add per bucket touched instead of two per sample (the shared counters'
/// cache lines bounce between cores otherwise). On the latency bounds unless
/// made [`Batch::for_histogram`].
#[derive(Debug)]
pub struct Batch {
    bounds: &'static [u64],
    counts: [u32; MAX_BOUNDS + 1],
    sum_ns: u64,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            bounds: &LATENCY_NS,
            counts: [0; MAX_BOUNDS + 1],
            sum_ns: 0,
        }
    }
}

impl Batch {
    /// A batch on `h`'s bounds (what [`Batch::add_to`] of `h` needs).
    pub fn for_histogram(h: &Histogram) -> Batch {
        Batch {
            bounds: h.bounds,
            ..Batch::default()
        }
    }

    pub fn record_ns(&mut self, ns: u64) {
        self.record_many_ns(ns, 1);
    }

    /// `n` samples of `ns` each.
    pub fn record_many_ns(&mut self, ns: u64, n: u32) {
        let i = self.bounds.partition_point(|&b| b < ns);
        self.counts[i] = self.counts[i].saturating_add(n);
        self.sum_ns = self.sum_ns.saturating_add(ns.saturating_mul(u64::from(n)));
    }

    /// A delivery of a record stored at `store_ms`, handed out at `now_ms`.
    pub fn delivered(&mut self, now_ms: i64, store_ms: i64) {
        let ms = u64::try_from(now_ms.saturating_sub(store_ms)).unwrap_or(0);
        self.record_ns(ms.saturating_mul(1_000_000));
    }

    /// Adds the samples to `h` (nothing when there are none), which must have
    /// the batch's bounds.
    pub fn add_to(&self, h: &Histogram) {
        debug_assert!(
            self.bounds == h.bounds,
            "a batch added to a histogram on other bounds"
        );
        let mut any = false;
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 {
                h.counts[i].fetch_add(u64::from(c), Ordering::Relaxed);
                any = true;
            }
        }
        if any {
            h.sum_ns.fetch_add(self.sum_ns, Ordering::Relaxed);
        }
    }
}

/// A gauge's value at scrape time; `None` once its owner is gone (the entry is
/// then dropped).
pub type Sample = Box<dyn Fn() -> Option<f64> + Send + Sync>;

/// Gauges of one label at scrape time: `(label value, value)` pairs.
pub type Samples = Box<dyn Fn() -> Option<Vec<(String, f64)>> + Send + Sync>;

/// A count that only goes up, in a static (or leaked, one per label value of
/// a small bounded set): one relaxed atomic add per update.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

enum Source {
    Histogram(&'static Histogram),
    Counter(&'static Counter),
    Gauge(Sample),
}

struct Family {
    help: &'static str,
    /// Gauges whose label values are known only at scrape time.
    dynamic: Vec<(&'static str, Samples)>,
    /// `labels` (rendered: `a="x",b="y"`) → sources; gauges of one label set
    /// from several owners (two servers in one test process) are summed.
    series: BTreeMap<String, Vec<Source>>,
}

impl Family {
    fn new(help: &'static str) -> Family {
        Family {
            help,
            dynamic: Vec::new(),
            series: BTreeMap::new(),
        }
    }
}

static REGISTRY: Mutex<BTreeMap<&'static str, Family>> = Mutex::new(BTreeMap::new());

/// Renders label pairs as Prometheus does (`a="x",b="y"`), escaping values.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    let mut s = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(s, "{k}=\"{v}\"");
    }
    s
}

/// Registers a histogram under `name{labels}`; registering the same one again
/// is a no-op.
pub fn register_histogram(
    name: &'static str,
    help: &'static str,
    labels: &[(&str, &str)],
    h: &'static Histogram,
) {
    let mut reg = lock(&REGISTRY);
    let fam = reg.entry(name).or_insert_with(|| Family::new(help));
    let sources = fam.series.entry(self::labels(labels)).or_default();
    let known = sources
        .iter()
        .any(|s| matches!(s, Source::Histogram(x) if std::ptr::eq(*x, h)));
    if !known {
        sources.push(Source::Histogram(h));
    }
}

/// Registers a counter under `name{labels}` (rendered as a Prometheus
/// `counter`; counters of one label set are summed); registering the same one
/// again is a no-op.
pub fn register_counter(
    name: &'static str,
    help: &'static str,
    labels: &[(&str, &str)],
    c: &'static Counter,
) {
    let mut reg = lock(&REGISTRY);
    let fam = reg.entry(name).or_insert_with(|| Family::new(help));
    let sources = fam.series.entry(self::labels(labels)).or_default();
    let known = sources
        .iter()
        .any(|s| matches!(s, Source::Counter(x) if std::ptr::eq(*x, c)));
    if !known {
        sources.push(Source::Counter(c));
    }
}

/// Registers a gauge sampled at scrape time. `sample` returns `None` once what
/// it reads is gone (hold a `Weak`), which removes it.
pub fn register_gauge(
    name: &'static str,
    help: &'static str,
    labels: &[(&str, &str)],
    sample: impl Fn() -> Option<f64> + Send + Sync + 'static,
) {
    let mut reg = lock(&REGISTRY);
    let fam = reg.entry(name).or_insert_with(|| Family::new(help));
    fam.series
        .entry(self::labels(labels))
        .or_default()
        .push(Source::Gauge(Box::new(sample)));
}

/// Registers gauges of one label (`key`) whose values `sample` lists at scrape
/// time (bound the values: [`crate::labels`]); values of one label value from
/// several samplers are summed. `None` removes the sampler.
pub fn register_family(
    name: &'static str,
    help: &'static str,
    key: &'static str,
    sample: impl Fn() -> Option<Vec<(String, f64)>> + Send + Sync + 'static,
) {
    let mut reg = lock(&REGISTRY);
    let fam = reg.entry(name).or_insert_with(|| Family::new(help));
    fam.dynamic.push((key, Box::new(sample)));
}

/// Everything registered, in Prometheus text format (0.0.4).
pub fn render() -> String {
    let mut out = String::new();
    let mut reg = lock(&REGISTRY);
    for (name, fam) in reg.iter_mut() {
        let mut body = String::new();
        let mut kind = "gauge";
        for (labels, sources) in fam.series.iter_mut() {
            let mut gauge: Option<f64> = None;
            sources.retain(|s| match s {
                Source::Histogram(h) => {
                    kind = "histogram";
                    h.render(&mut body, name, labels);
                    true
                }
                Source::Counter(c) => {
                    kind = "counter";
                    *gauge.get_or_insert(0.0) += c.get() as f64;
                    true
                }
                Source::Gauge(f) => match f() {
                    Some(v) => {
                        *gauge.get_or_insert(0.0) += v;
                        true
                    }
                    None => false,
                },
            });
            if let Some(v) = gauge {
                if labels.is_empty() {
                    let _ = writeln!(body, "{name} {v}");
                } else {
                    let _ = writeln!(body, "{name}{{{labels}}} {v}");
                }
            }
        }
        let mut dynamic: BTreeMap<String, f64> = BTreeMap::new();
        fam.dynamic.retain(|(key, f)| match f() {
            Some(values) => {
                for (value, v) in values {
                    *dynamic.entry(self::labels(&[(key, &value)])).or_default() += v;
                }
                true
            }
            None => false,
        });
        for (labels, v) in dynamic {
            let _ = writeln!(body, "{name}{{{labels}}} {v}");
        }
        if !body.is_empty() {
            let _ = writeln!(out, "# HELP {name} {}", fam.help);
            let _ = writeln!(out, "# TYPE {name} {kind}");
            out.push_str(&body);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_as_counters_summed_per_label_set() {
        static A: Counter = Counter::new();
        static B: Counter = Counter::new();
        A.add(3);
        B.add(4);
        register_counter("test_counter_total", "c", &[("k", "x")], &A);
        register_counter("test_counter_total", "c", &[("k", "x")], &A);
        register_counter("test_counter_total", "c", &[("k", "x")], &B);
        A.add(1);
        let text = render();
        assert!(
            text.contains("# TYPE test_counter_total counter\n"),
            "{text}"
        );
        assert!(text.contains("test_counter_total{k=\"x\"} 8\n"), "{text}");
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        static H: Histogram = Histogram::new();
        H.record(Duration::from_micros(50));
        H.record(Duration::from_millis(3));
        H.record(Duration::from_secs(60));
        register_histogram("test_meter_seconds", "a test", &[("door", "x")], &H);
        register_histogram("test_meter_seconds", "a test", &[("door", "x")], &H);
        let text = render();
        assert!(
            text.contains("# TYPE test_meter_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("test_meter_seconds_bucket{door=\"x\",le=\"0.0001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("test_meter_seconds_bucket{door=\"x\",le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("test_meter_seconds_bucket{door=\"x\",le=\"30\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("test_meter_seconds_bucket{door=\"x\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("test_meter_seconds_count{door=\"x\"} 3\n"),
            "{text}"
        );
        assert_eq!(H.count(), 3, "registered twice, rendered once");
    }

    #[test]
    fn a_batch_adds_what_single_samples_would() {
        static ONE: Histogram = Histogram::new();
        static MANY: Histogram = Histogram::new();
        let mut b = Batch::default();
        for ns in [50_000, 3_000_000, 3_000_000, 60_000_000_000] {
            ONE.record_ns(ns);
            b.record_ns(ns);
        }
        b.add_to(&MANY);
        register_histogram("test_batch_one", "x", &[], &ONE);
        register_histogram("test_batch_many", "x", &[], &MANY);
        let text = render();
        let of = |name: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(name))
                .map(|l| l.replacen(name, "", 1))
                .collect()
        };
        assert_eq!(of("test_batch_one"), of("test_batch_many"));
        assert_eq!(MANY.count(), 4);
    }

    #[test]
    fn a_fine_histogram_renders_its_own_bounds_and_reads_quantiles_off_them() {
        static H: Histogram = Histogram::with_bounds(&FINE_NS);
        assert_eq!(H.quantile_ns(0.99), None, "no samples, no quantile");
        let mut b = Batch::for_histogram(&H);
        // 98 samples at 1.2 ms, one at 8 ms, one at 40 s.
        b.record_many_ns(1_200_000, 98);
        b.record_ns(8_000_000);
        b.record_ns(40_000_000_000);
        b.add_to(&H);
        register_histogram("test_fine_seconds", "x", &[], &H);
        let text = render();
        for line in [
            "test_fine_seconds_bucket{le=\"0.001\"} 0\n",
            "test_fine_seconds_bucket{le=\"0.0015\"} 98\n",
            "test_fine_seconds_bucket{le=\"0.0075\"} 98\n",
            "test_fine_seconds_bucket{le=\"0.01\"} 99\n",
            "test_fine_seconds_bucket{le=\"30\"} 99\n",
            "test_fine_seconds_bucket{le=\"+Inf\"} 100\n",
            "test_fine_seconds_count 100\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert_eq!(H.quantile_ns(0.5), Some(1_500_000));
        assert_eq!(H.quantile_ns(0.98), Some(1_500_000));
        assert_eq!(H.quantile_ns(0.99), Some(10_000_000));
        assert_eq!(H.quantile_ns(1.0), Some(u64::MAX));
        let sum = 98 * 1_200_000 + 8_000_000 + 40_000_000_000u64;
        assert!(
            text.contains(&format!("test_fine_seconds_sum {}\n", sum as f64 / 1e9)),
            "{text}"
        );
    }

    #[test]
    fn gauges_sum_per_label_set_and_drop_when_their_owner_is_gone() {
        let owner = std::sync::Arc::new(5.0);
        let weak = std::sync::Arc::downgrade(&owner);
        register_gauge("test_meter_gauge", "g", &[("k", "a\"b")], move || {
            weak.upgrade().map(|v| *v)
        });
        register_gauge("test_meter_gauge", "g", &[("k", "a\"b")], || Some(2.0));
        let text = render();
        assert!(
            text.contains("test_meter_gauge{k=\"a\\\"b\"} 7\n"),
            "{text}"
        );
        drop(owner);
        let text = render();
        assert!(
            text.contains("test_meter_gauge{k=\"a\\\"b\"} 2\n"),
            "{text}"
        );
    }
}
