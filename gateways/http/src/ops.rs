//! Operations: `/health`, `/health/ready`, Prometheus `/metrics`, the
//! in-flight limit (429) and per-request metrics, and the JSON answers for
//! unknown routes.
//!
//! Metrics go through the `metrics` facade into one process-wide Prometheus
//! recorder, installed by the first HTTP server of the process; any other door
//! that records with `metrics::counter!` etc. shows up in the same `/metrics`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use rocketgate_core::broker::MessagingApi;

use crate::Ctx;
use crate::error::Error;

/// Latency buckets (seconds) of every `*_duration_seconds` histogram.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

use crate::meters::{METERS, RECEIVE};

/// Installs the process-wide recorder once (a no-op when another recorder was
/// installed first: `/metrics` then says so).
pub fn install_recorder() {
    METERS.register("http");
    rocketgate_core::meter::register_histogram(
        "rocketgate_receive_duration_seconds",
        "One receive (POP) call, long-poll wait included.",
        &[("protocol", "http")],
        &RECEIVE,
    );
    RECORDER.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_duration_seconds".into()), BUCKETS)
            .map_err(|e| tracing::warn!(error = %e, "metric buckets"))
            .ok()?;
        match builder.install_recorder() {
            Ok(handle) => Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "cannot install the metrics recorder; /metrics is empty");
                None
            }
        }
    });
}

/// Drains histogram samples into their buckets. The exporter keeps raw samples
/// until then, so this runs every few seconds even when nobody scrapes.
pub(crate) async fn upkeep_loop(mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = every.tick() => {
                if let Some(Some(h)) = RECORDER.get() {
                    h.run_upkeep();
                }
            }
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// `GET /metrics`: Prometheus text format. Store positions, disk usage and
/// consumer lag are sampled at scrape time.
pub async fn metrics<B: MessagingApi + 'static>(State(ctx): State<Arc<Ctx<B>>>) -> Response {
    // A proxy has no store of its own: no store or disk gauges.
    if let Some(s) = ctx.probe.status() {
        for (name, v) in [
            ("rocketgate_store_min_offset", s.log_min),
            ("rocketgate_store_flushed_offset", s.log_flushed),
            ("rocketgate_store_written_offset", s.log_written),
            ("rocketgate_store_dispatched_offset", s.log_dispatched),
            ("rocketgate_store_corrupt_records_total", s.corrupt_records),
            ("rocketgate_store_unread_dropped_total", s.unread_dropped),
        ] {
            metrics::gauge!(name).set(v as f64);
        }
        metrics::gauge!("rocketgate_disk_usage_ratio").set(s.disk_usage);
        if let (Some(free), Some(total)) = (s.disk_free_bytes, s.disk_total_bytes) {
            metrics::gauge!("rocketgate_disk_free_bytes").set(free as f64);
            metrics::gauge!("rocketgate_disk_total_bytes").set(total as f64);
        }
        metrics::gauge!("rocketgate_store_size_bytes")
            .set(s.log_written.saturating_sub(s.log_min) as f64);
        metrics::gauge!("rocketgate_disk_full").set(if s.disk_full() { 1.0 } else { 0.0 });
    }
    if let Some(r) = ctx.probe.replication() {
        if let Some(c) = r.confirmed_offset {
            metrics::gauge!("rocketgate_replication_confirmed_offset").set(c as f64);
        }
        let in_sync = r.slaves.iter().filter(|s| s.in_sync).count();
        metrics::gauge!("rocketgate_replication_in_sync_slaves").set(in_sync as f64);
        for s in &r.slaves {
            let id = s.broker_id.to_string();
            metrics::gauge!("rocketgate_replication_lag_bytes", "slave" => id.clone())
                .set(s.lag_bytes as f64);
            metrics::gauge!("rocketgate_replication_lag_ms", "slave" => id.clone())
                .set(s.lag_ms as f64);
            metrics::gauge!("rocketgate_replication_slave_offset", "slave" => id)
                .set(s.offset as f64);
        }
        if let Some(lag) = r.lag_bytes {
            metrics::gauge!("rocketgate_replication_lag_bytes", "slave" => "self").set(lag as f64);
        }
    }
    crate::admin::record_lag(&ctx).await;
    let text = match RECORDER.get() {
        Some(Some(h)) => {
            h.run_upkeep();
            let mut text = h.render();
            text.push_str(&rocketgate_core::meter::render());
            text
        }
        _ => "# no metrics recorder installed in this process\n".to_owned(),
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `GET /health`: liveness (always 200 while the process serves), with the
/// readiness verdict and the disk state.
pub async fn health<B: MessagingApi + 'static>(State(ctx): State<Arc<Ctx<B>>>) -> Response {
    let (_, body) = readiness(&ctx);
    axum::Json(body).into_response()
}

/// `GET /health/ready`: 200 when publishing works, 503 when the disk is full
/// or the gateway is shutting down.
pub async fn ready<B: MessagingApi + 'static>(State(ctx): State<Arc<Ctx<B>>>) -> Response {
    let (ok, body) = readiness(&ctx);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// `GET /health` and `GET /health/ready`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`: the process serves.
    pub status: String,
    /// Whether publishing works now (`/health/ready` answers 503 when not).
    pub ready: bool,
    /// Why it is not ready (empty when it is).
    pub reasons: Vec<String>,
    /// The local disk; `null` on a proxy (no store of its own).
    pub disk: Option<Disk>,
    /// The local store; `null` on a proxy.
    pub store: Option<crate::NodeStatus>,
}

/// The disk as health checks see it.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Disk {
    pub usage_ratio: f64,
    pub hard_ratio: f64,
    pub full: bool,
}

fn readiness<B>(ctx: &Ctx<B>) -> (bool, Health) {
    let s = ctx.probe.status();
    let stopping = *ctx.shutdown.borrow();
    let mut reasons = Vec::new();
    if let Some(s) = &s {
        if s.disk_full() {
            reasons.push(format!(
                "disk usage {:.1}% is above the hard limit of {:.1}%",
                s.disk_usage * 100.0,
                s.disk_hard_ratio * 100.0
            ));
        }
        if let Some(why) = &s.writes_stopped {
            reasons.push(format!("writes are stopped until a restart: {why}"));
        }
    }
    if stopping {
        reasons.push("shutting down".to_owned());
    }
    let ok = reasons.is_empty();
    let body = Health {
        status: "ok".into(),
        ready: ok,
        reasons,
        disk: s.as_ref().map(|s| Disk {
            usage_ratio: s.disk_usage,
            hard_ratio: s.disk_hard_ratio,
            full: s.disk_full(),
        }),
        store: s,
    };
    (ok, body)
}

/// Paths never refused for load: probes and scrapes must work under pressure.
/// Paths the in-flight limit never refuses (probes and the scraper).
pub(crate) fn exempt(path: &str) -> bool {
    path.starts_with("/health") || path == "/readyz" || path == "/metrics"
}

/// The in-flight limit (429 above it) and the per-request metrics
/// `rocketgate_http_requests_total{method,route,status}` and
/// `rocketgate_http_request_duration_seconds{method,route}`.
pub async fn track<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req.extensions().get::<MatchedPath>().cloned();
    let route = route.as_ref().map_or("unmatched", |m| m.as_str());
    let permit = if exempt(req.uri().path()) {
        None
    } else {
        match ctx.inflight.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                let limit = ctx.settings.max_inflight;
                let resp = Error::Overloaded { limit }.into_response();
                ctx.meters.request(&method, route, resp.status(), started);
                return resp;
            }
        }
    };
    let resp = next.run(req).await;
    drop(permit);
    ctx.meters.request(&method, route, resp.status(), started);
    resp
}

/// One route's request meters: (method, status, requests_total, request_duration_seconds).
type RouteMeters = Vec<(Method, u16, Counter, Histogram)>;

/// Metric handles by label set. The `metrics` macros build the key (allocating
/// each label's string) and look it up in the registry on every call; at tens of
/// thousands of requests a second that showed in the publish profile, so the
/// handles are looked up once per label set and kept here.
#[derive(Default)]
pub(crate) struct Meters {
    /// route → (method, status, requests_total, request_duration_seconds)
    requests: RwLock<HashMap<String, RouteMeters>>,
    /// topic → (messages_in_total, bytes_in_total) of the HTTP door
    topics_in: RwLock<HashMap<String, (Counter, Counter)>>,
}

impl Meters {
    /// `rocketgate_http_requests_total{method,route,status}` and
    /// `rocketgate_http_request_duration_seconds{method,route}`.
    fn request(&self, method: &Method, route: &str, status: StatusCode, started: Instant) {
        let status = status.as_u16();
        let elapsed = started.elapsed().as_secs_f64();
        let found = |m: &HashMap<String, RouteMeters>| {
            m.get(route)?
                .iter()
                .find(|(me, st, ..)| me == method && *st == status)
                .map(|(_, _, c, h)| (c.clone(), h.clone()))
        };
        let cached = found(&rocketgate_core::sync::read(&self.requests));
        let (counter, histogram) = cached.unwrap_or_else(|| {
            let mut map = rocketgate_core::sync::write(&self.requests);
            if let Some(h) = found(&map) {
                return h;
            }
            let labels = [
                ("method", method.as_str().to_owned()),
                ("route", route.to_owned()),
                ("status", status.to_string()),
            ];
            let c = metrics::counter!("rocketgate_http_requests_total", &labels);
            let h = metrics::histogram!("rocketgate_http_request_duration_seconds", &labels[..2]);
            map.entry(route.to_owned()).or_default().push((
                method.clone(),
                status,
                c.clone(),
                h.clone(),
            ));
            (c, h)
        });
        counter.increment(1);
        histogram.record(elapsed);
    }

    /// `rocketgate_messages_in_total` / `rocketgate_bytes_in_total`
    /// `{protocol="http",topic}` and `rocketgate_publish_duration_seconds{protocol="http"}`
    /// (a [`rocketgate_core::meter`] histogram).
    pub(crate) fn published(&self, topic: &str, n: usize, bytes: usize, started: Instant) {
        let cached = rocketgate_core::sync::read(&self.topics_in)
            .get(topic)
            .cloned();
        let (msgs, size) = cached.unwrap_or_else(|| {
            let labels = [
                ("protocol", "http".to_owned()),
                ("topic", rocketgate_core::labels::topic(topic)),
            ];
            let pair = (
                metrics::counter!("rocketgate_messages_in_total", &labels),
                metrics::counter!("rocketgate_bytes_in_total", &labels),
            );
            rocketgate_core::sync::write(&self.topics_in)
                .entry(topic.to_owned())
                .or_insert(pair)
                .clone()
        });
        msgs.increment(n as u64);
        size.increment(bytes as u64);
        METERS.publish.record_since(started);
    }
}

/// Unknown paths: a JSON 404.
pub async fn no_route(method: Method, uri: Uri) -> Error {
    Error::NoRoute {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

/// A known path with the wrong method: a JSON 405.
pub async fn wrong_method(method: Method, uri: Uri) -> Error {
    Error::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}
