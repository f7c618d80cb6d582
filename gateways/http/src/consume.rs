//! Consuming without server-side sessions: receive (a POP with long polling),
//! ack / nack / change invisibility by receipt handle, an SSE stream built on
//! the same POP, and replay of a queue by offset (a pull, no group state).
//!
//! Nothing about a consumer is remembered here: the receipt handle names the
//! group, queue, offset and delivery, so any gateway process can ack what
//! another handed out.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    MessagingApi, OffsetReset, PopRequest, Popped, PullRequest, PullStatus, ReceiptHandle,
};
use serde::{Deserialize, Serialize};

use crate::Ctx;
use crate::error::{self, Error, Result};
use crate::wire::{Encoding, Json, MessageJson, Path, Query};

/// A group that never appears in offsets: replay reads without group state.
const REPLAY_GROUP: &str = "rocketgate-http-replay";

/// The filter of a request: `filter` (default `*`) in `filter_type` `tag` or `sql`.
pub(crate) fn parse_filter(filter: Option<&str>, filter_type: Option<&str>) -> Result<Filter> {
    let expr = filter.unwrap_or("*");
    let f = match filter_type.unwrap_or("tag") {
        "tag" | "TAG" => Filter::tag(expr),
        "sql" | "sql92" | "SQL92" => Filter::sql92(expr),
        other => {
            return Err(Error::bad(
                "filter_type",
                format!("{other:?} is not `tag` or `sql`"),
            ));
        }
    };
    f.map_err(|e| Error::bad("filter", e.to_string()))
}

/// Query parameters of a receive (and of the stream, which ignores `wait_ms`).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReceiveQuery {
    /// A tag expression (`a || b`, default `*`) or, with `filter_type=sql`, an SQL92
    /// selector over properties.
    pub filter: Option<String>,
    /// `tag` (default) or `sql`.
    #[param(pattern = "^(tag|sql)$")]
    pub filter_type: Option<String>,
    /// At most this many messages (default 16; at most `http.max_messages`, 32).
    #[param(minimum = 1)]
    pub max: Option<usize>,
    /// Long poll: wait up to this long (ms) for a message (default 0; capped at
    /// `http.max_wait`). The stream ignores it.
    pub wait_ms: Option<u64>,
    /// How long (ms) received messages stay invisible to others without an ack
    /// (default 30000; 100 .. 43200000).
    #[param(minimum = 100, maximum = 43_200_000)]
    pub invisible_ms: Option<u64>,
    /// `auto` (default: text when UTF-8, else base64) or `base64`.
    #[serde(default)]
    #[param(inline)]
    pub encoding: Encoding,
    /// `fifo`: the group is an ordered (FIFO) group from now on (remembered; see
    /// `PATCH /v1/groups/{group}`); `concurrent` (or absent): the group as it is.
    #[param(pattern = "^(fifo|concurrent)$")]
    pub order: Option<String>,
    /// Where the group starts if it has no position on the topic yet: `earliest`
    /// (the default for a new group), `latest`, or a time in ms since the epoch.
    pub start: Option<String>,
}

/// Received messages.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Messages {
    pub messages: Vec<MessageJson>,
}

/// Longest invisibility a request may ask for.
const MAX_INVISIBLE: Duration = Duration::from_secs(12 * 3600);

/// A receive's `order`: `fifo` makes the group an ordered one (idempotent: the
/// group's setting is written only when it changes).
async fn declare_order<B: MessagingApi>(ctx: &Ctx<B>, group: &str, q: &ReceiveQuery) -> Result<()> {
    match q.order.as_deref() {
        None | Some("concurrent") => Ok(()),
        Some("fifo") => Ok(ctx.api.set_fifo(group, true).await?),
        Some(other) => Err(Error::bad(
            "order",
            format!("{other:?} is not `fifo` or `concurrent`"),
        )),
    }
}

/// A receive's `start`: a group with no position on the topic yet starts there
/// (docs/broker.md, "Where a new group starts"); a group that has one ignores it.
async fn apply_start<B: MessagingApi>(
    ctx: &Ctx<B>,
    group: &str,
    topic: &str,
    q: &ReceiveQuery,
) -> Result<()> {
    let Some(start) = q.start.as_deref() else {
        return Ok(());
    };
    let to: OffsetReset = start.parse().map_err(|e: String| Error::bad("start", e))?;
    let queues = ctx.api.topic(topic).await?.read_queues;
    for queue in 0..queues {
        if ctx
            .api
            .query_offset(group, "", topic, queue)
            .await?
            .is_some()
        {
            return Ok(());
        }
    }
    ctx.api.reset_offset(group, "", topic, to).await?;
    Ok(())
}

fn pop_request<B>(
    ctx: &Ctx<B>,
    group: String,
    topic: String,
    q: &ReceiveQuery,
) -> Result<PopRequest> {
    let max = q.max.unwrap_or(16);
    if max == 0 || max > ctx.settings.max_messages {
        return Err(Error::bad(
            "max",
            format!("must be between 1 and {}", ctx.settings.max_messages),
        ));
    }
    let invisible = match q.invisible_ms {
        None => ctx.settings.default_invisible,
        Some(ms) => Duration::from_millis(ms),
    };
    if invisible < Duration::from_millis(100) || invisible > MAX_INVISIBLE {
        return Err(Error::bad(
            "invisible_ms",
            format!("must be between 100 and {}", MAX_INVISIBLE.as_millis()),
        ));
    }
    Ok(PopRequest {
        group,
        topic,
        filter: parse_filter(q.filter.as_deref(), q.filter_type.as_deref())?,
        max_messages: max,
        invisible,
        wait: Duration::from_millis(q.wait_ms.unwrap_or(0)).min(ctx.settings.max_wait),
    })
}

pub(crate) fn popped_json(p: &Popped, encoding: Encoding) -> Result<MessageJson> {
    let mut m = MessageJson::from_delivered(&p.message, encoding)?;
    m.receipt_handle = Some(p.receipt.to_string());
    m.delivery_attempt = Some(p.attempt());
    m.invisible_until = Some(p.receipt.invisible_until_ms);
    Ok(m)
}

fn count_out(topic: &str, popped: &[Popped]) {
    if popped.is_empty() {
        return;
    }
    let bytes: usize = popped.iter().map(|p| p.message.record.len()).sum();
    let now = rocketgate_core::clock::now_ms();
    for p in popped {
        if let Some(ts) = rocketgate_core::store::record::store_timestamp_of(&p.message.record) {
            crate::meters::METERS.delivered(now, ts);
        }
    }
    let labels = [
        ("protocol", "http".to_owned()),
        ("topic", rocketgate_core::labels::topic(topic)),
    ];
    metrics::counter!("rocketgate_messages_out_total", &labels).increment(popped.len() as u64);
    metrics::counter!("rocketgate_bytes_out_total", &labels).increment(bytes as u64);
}

/// `GET /v1/groups/{group}/topics/{topic}/messages`
pub async fn receive<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    ConnectInfo(peer): ConnectInfo<crate::Peer>,
    Path((group, topic)): Path<(String, String)>,
    Query(q): Query<ReceiveQuery>,
) -> Result<axum::Json<Messages>> {
    let started = Instant::now();
    ctx.pop_consumers.seen(&group, &topic, peer.addr);
    declare_order(&ctx, &group, &q).await?;
    apply_start(&ctx, &group, &topic, &q).await?;
    let req = pop_request(&ctx, group, topic.clone(), &q)?;
    let popped = tokio::select! {
        r = ctx.api.pop(req) => r?,
        _ = ctx.stopping() => Vec::new(),
    };
    count_out(&topic, &popped);
    crate::meters::RECEIVE.record_since(started);
    let messages = popped
        .iter()
        .map(|p| popped_json(p, q.encoding))
        .collect::<Result<_>>()?;
    Ok(axum::Json(Messages { messages }))
}

/// `GET /v1/groups/{group}/topics/{topic}/stream`: Server-Sent Events, one
/// `message` event per message (data: the message JSON, id: its msg_id). Each is
/// leased like a receive; ack through `/acks`, or it reappears.
pub async fn stream<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    ConnectInfo(peer): ConnectInfo<crate::Peer>,
    Path((group, topic)): Path<(String, String)>,
    Query(q): Query<ReceiveQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    ctx.pop_consumers.seen(&group, &topic, peer.addr);
    declare_order(&ctx, &group, &q).await?;
    apply_start(&ctx, &group, &topic, &q).await?;
    let mut req = pop_request(&ctx, group, topic.clone(), &q)?;
    // The first POP answers bad topics and filters with a status, before the stream starts.
    req.wait = Duration::ZERO;
    let first = ctx.api.pop(req.clone()).await?;
    count_out(&topic, &first);
    req.wait = ctx.settings.max_wait;
    let state = StreamState {
        ctx,
        req,
        encoding: q.encoding,
        buf: first.into(),
        done: false,
    };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(p) = st.buf.pop_front() {
                let ev = match popped_json(&p, st.encoding) {
                    Ok(m) => json_event("message", &m).id(m.msg_id),
                    Err(e) => error_event(&e),
                };
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            tokio::select! {
                r = st.ctx.api.pop(st.req.clone()) => match r {
                    Ok(popped) => {
                        count_out(&st.req.topic, &popped);
                        st.buf.extend(popped);
                    }
                    Err(e) => {
                        st.done = true;
                        return Some((Ok(error_event(&Error::Core(e))), st));
                    }
                },
                _ = st.ctx.stopping() => return None,
            }
        }
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

struct StreamState<B> {
    ctx: Arc<Ctx<B>>,
    req: PopRequest,
    encoding: Encoding,
    buf: VecDeque<Popped>,
    done: bool,
}

fn json_event<T: Serialize>(name: &str, value: &T) -> Event {
    let data = serde_json::to_string(value).unwrap_or_default();
    Event::default().event(name).data(data)
}

fn error_event(e: &Error) -> Event {
    let (_, code) = e.status();
    json_event("error", &error::body(code, &e.to_string()))
}

/// Receipt handles in a request body: `receipt_handle` or `receipt_handles`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HandlesBody {
    #[serde(default)]
    pub receipt_handle: Option<String>,
    #[serde(default)]
    pub receipt_handles: Vec<String>,
    /// Nacks only: redeliver after this long (default 0: now).
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

impl HandlesBody {
    fn handles(self, group: &str) -> Result<Vec<String>> {
        let mut all = self.receipt_handles;
        all.extend(self.receipt_handle);
        if all.is_empty() {
            return Err(Error::bad("receipt_handles", "no receipt handle given"));
        }
        for h in &all {
            let parsed: ReceiptHandle = h.parse()?;
            if parsed.group != group {
                return Err(Error::bad(
                    "receipt_handles",
                    format!("handle of group {:?} sent to group {group:?}", parsed.group),
                ));
            }
        }
        Ok(all)
    }
}

/// Per-handle outcome when some handles of a request failed.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Outcome {
    pub receipt_handle: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<error::ErrorDetail>,
}

/// The answer of an ack where every handle was acked.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Acked {
    pub acked: usize,
}

/// The answer of a nack where every handle was nacked.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Nacked {
    pub nacked: usize,
}

/// An ack or nack where some handle failed: the first failure's error, and what
/// happened to each handle, in order (the others were done).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HandlesFailed {
    pub error: error::ErrorDetail,
    pub results: Vec<Outcome>,
}

/// Acts on every handle, in `order` (indices into `handles`); all fine: `200`
/// with `done(n)`. Otherwise the status of the first failure (in the request's
/// order), with the usual error plus `results` saying what happened to each.
async fn each_handle<F, Fut, T>(
    handles: Vec<String>,
    order: Vec<usize>,
    done: fn(usize) -> T,
    act: F,
) -> Response
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = rocketgate_core::Result<()>>,
    T: Serialize,
{
    let mut failed: Vec<Option<Error>> = handles.iter().map(|_| None).collect();
    for i in order {
        if let Some(h) = handles.get(i)
            && let Err(e) = act(h.clone()).await
        {
            failed[i] = Some(Error::Core(e));
        }
    }
    if failed.iter().all(Option::is_none) {
        return axum::Json(done(handles.len())).into_response();
    }
    let mut first: Option<Error> = None;
    let mut results = Vec::with_capacity(handles.len());
    for (h, e) in handles.into_iter().zip(failed) {
        results.push(Outcome {
            receipt_handle: h,
            ok: e.is_none(),
            error: e.as_ref().map(|e| error::ErrorDetail {
                code: e.status().1.to_owned(),
                message: e.to_string(),
            }),
        });
        if let Some(e) = e {
            first.get_or_insert(e);
        }
    }
    let e = first.unwrap_or_else(|| Error::bad("receipt_handles", "no handle failed"));
    let (status, code) = e.status();
    let body = HandlesFailed {
        error: error::ErrorDetail {
            code: code.to_owned(),
            message: e.to_string(),
        },
        results,
    };
    (status, axum::Json(body)).into_response()
}

/// The order a nack gives handles back in: per queue, the latest message first.
/// In a FIFO group a nack also gives back every later in-flight message of its
/// queue (their handles go stale), so nacking a batch front to back would refuse
/// all but its first handle; back to front, each handle is still current when
/// its turn comes and the end state is the same: all of them due again, to be
/// redelivered in queue order. (Other groups do not care about the order.)
fn nack_order(handles: &[String]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..handles.len()).collect();
    // (Parsed before: `HandlesBody::handles` refuses what does not parse.)
    let key = |i: &usize| {
        handles[*i]
            .parse::<ReceiptHandle>()
            .ok()
            .map(|h| (h.topic, h.queue_id, std::cmp::Reverse(h.queue_offset)))
    };
    order.sort_by_cached_key(key);
    order
}

/// `POST /v1/groups/{group}/acks`
pub async fn ack<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Json(body): Json<HandlesBody>,
) -> Result<Response> {
    if body.delay_ms.is_some() {
        return Err(Error::bad("delay_ms", "acks take no delay"));
    }
    let handles = body.handles(&group)?;
    let api = &ctx.api;
    let order = (0..handles.len()).collect();
    Ok(each_handle(
        handles,
        order,
        |acked| Acked { acked },
        |h| async move { api.ack(&h).await },
    )
    .await)
}

/// `POST /v1/groups/{group}/nacks`: the messages reappear after `delay_ms`
/// (default 0) with their delivery attempt raised; after the group's maximum
/// attempts a message goes to the group's dead-letter queue.
pub async fn nack<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Json(body): Json<HandlesBody>,
) -> Result<Response> {
    let delay = Duration::from_millis(body.delay_ms.unwrap_or(0));
    if delay > MAX_INVISIBLE {
        return Err(Error::bad(
            "delay_ms",
            format!("must be at most {}", MAX_INVISIBLE.as_millis()),
        ));
    }
    let handles = body.handles(&group)?;
    let api = &ctx.api;
    let order = nack_order(&handles);
    Ok(each_handle(
        handles,
        order,
        |nacked| Nacked { nacked },
        |h| async move { api.nack(&h, delay).await },
    )
    .await)
}

/// Body of `PATCH /v1/groups/{group}/invisibility`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InvisibilityBody {
    pub receipt_handle: String,
    pub invisible_ms: u64,
}

/// The replacement of a handle whose invisibility changed.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Renewed {
    pub receipt_handle: String,
    pub invisible_until: i64,
}

/// `PATCH /v1/groups/{group}/invisibility`: the message stays invisible for
/// `invisible_ms` from now; the answer's handle replaces the old one.
pub async fn invisibility<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path(group): Path<String>,
    Json(body): Json<InvisibilityBody>,
) -> Result<axum::Json<Renewed>> {
    let invisible = Duration::from_millis(body.invisible_ms);
    if invisible > MAX_INVISIBLE {
        return Err(Error::bad(
            "invisible_ms",
            format!("must be at most {}", MAX_INVISIBLE.as_millis()),
        ));
    }
    let handles = HandlesBody {
        receipt_handle: Some(body.receipt_handle),
        ..Default::default()
    }
    .handles(&group)?;
    let renewed = ctx.api.change_invisibility(&handles[0], invisible).await?;
    Ok(axum::Json(Renewed {
        receipt_handle: renewed.to_string(),
        invisible_until: renewed.invisible_until_ms,
    }))
}

/// Query parameters of a replay.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReplayQuery {
    /// The queue offset to start at (default 0; below the queue's minimum the
    /// answer says `offset_moved` and where to go on).
    pub offset: Option<u64>,
    /// At most this many messages (default 16; at most `http.max_messages`, 32).
    #[param(minimum = 1)]
    pub max: Option<usize>,
    /// A tag expression (default `*`) or, with `filter_type=sql`, an SQL92 selector.
    pub filter: Option<String>,
    /// `tag` (default) or `sql`.
    #[param(pattern = "^(tag|sql)$")]
    pub filter_type: Option<String>,
    /// Wait up to this long (ms) when there is nothing at `offset` yet (capped at
    /// `http.max_wait`).
    pub wait_ms: Option<u64>,
    /// `auto` (default) or `base64`.
    #[serde(default)]
    #[param(inline)]
    pub encoding: Encoding,
}

/// A page of a queue.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Replay {
    /// `found`, `no_new_message` or `offset_moved`.
    #[schema(pattern = "^(found|no_new_message|offset_moved)$")]
    pub status: String,
    pub messages: Vec<MessageJson>,
    /// Where the next page starts.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

/// Reads one queue from an offset, without any group state.
pub(crate) async fn read_queue<B: MessagingApi>(
    ctx: &Ctx<B>,
    topic: String,
    queue_id: u32,
    q: &ReplayQuery,
) -> Result<Replay> {
    let max = q.max.unwrap_or(16);
    if max == 0 || max > ctx.settings.max_messages {
        return Err(Error::bad(
            "max",
            format!("must be between 1 and {}", ctx.settings.max_messages),
        ));
    }
    let req = PullRequest {
        group: REPLAY_GROUP.into(),
        member: String::new(),
        topic,
        queue_id,
        offset: q.offset.unwrap_or(0),
        max_messages: max,
        filter: parse_filter(q.filter.as_deref(), q.filter_type.as_deref())?,
        wait: Duration::from_millis(q.wait_ms.unwrap_or(0)).min(ctx.settings.max_wait),
    };
    let r = tokio::select! {
        r = ctx.api.pull(req) => r?,
        _ = ctx.stopping() => return Err(Error::ShuttingDown),
    };
    let status = match r.status {
        PullStatus::Found => "found",
        PullStatus::NoNewMessage => "no_new_message",
        PullStatus::OffsetMoved => "offset_moved",
    };
    Ok(Replay {
        status: status.into(),
        messages: r
            .messages
            .iter()
            .map(|d| MessageJson::from_delivered(d, q.encoding))
            .collect::<Result<_>>()?,
        next_offset: r.next_offset,
        min_offset: r.min_offset,
        max_offset: r.max_offset,
    })
}

/// `GET /v1/topics/{topic}/queues/{queue}/messages`
pub async fn replay<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    Path((topic, queue_id)): Path<(String, u32)>,
    Query(q): Query<ReplayQuery>,
) -> Result<axum::Json<Replay>> {
    Ok(axum::Json(read_queue(&ctx, topic, queue_id, &q).await?))
}

/// 204 No Content.
pub(crate) fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}
