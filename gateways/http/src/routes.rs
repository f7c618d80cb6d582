//! Every endpoint, once: the table [`endpoints`] builds the axum router *and*
//! the OpenAPI 3 document served at `/v1/openapi.json`, so the two cannot drift.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::{MethodRouter, delete, get, patch, post, put};
use axum::{Extension, Router};
use rocketgate_core::broker::MessagingApi;
use serde_json::{Map, Value, json};

use crate::wire::BodyLimit;
use crate::{Ctx, access, admin, consume, inspect, ops, publish, users};

/// A parameter of an endpoint, for the document.
pub struct Param {
    pub name: &'static str,
    /// `query` or `header`.
    pub place: &'static str,
    pub description: &'static str,
}

const fn q(name: &'static str, description: &'static str) -> Param {
    Param {
        name,
        place: "query",
        description,
    }
}

/// One endpoint: how it is documented and what serves it.
pub struct Endpoint<B> {
    pub method: Method,
    pub path: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    pub params: Vec<Param>,
    /// Content type of the request body, if it takes one.
    pub body: Option<&'static str>,
    /// The status of a successful answer.
    pub success: u16,
    handler: MethodRouter<Arc<Ctx<B>>>,
}

fn ep<B>(
    method: Method,
    path: &'static str,
    tag: &'static str,
    summary: &'static str,
    handler: MethodRouter<Arc<Ctx<B>>>,
) -> Endpoint<B> {
    Endpoint {
        method,
        path,
        tag,
        summary,
        params: Vec::new(),
        body: None,
        success: 200,
        handler,
    }
}

impl<B> Endpoint<B> {
    fn params(mut self, params: Vec<Param>) -> Self {
        self.params = params;
        self
    }
    fn body(mut self, content_type: &'static str) -> Self {
        self.body = Some(content_type);
        self
    }
    fn success(mut self, status: u16) -> Self {
        self.success = status;
        self
    }
}

const JSON: &str = "application/json";

fn receive_params() -> Vec<Param> {
    vec![
        q(
            "filter",
            "tag expression (`a || b`, default `*`) or SQL92 selector",
        ),
        q("filter_type", "`tag` (default) or `sql`"),
        q("max", "at most this many messages (default 16)"),
        q(
            "wait_ms",
            "long poll: wait up to this long for a message (default 0)",
        ),
        q(
            "invisible_ms",
            "invisibility of received messages without an ack (default 30000)",
        ),
        q(
            "encoding",
            "`auto` (default: text when UTF-8, else base64) or `base64`",
        ),
        q(
            "start",
            "where a group with no position on the topic starts: `earliest` (default), `latest` or a time in ms",
        ),
        q(
            "order",
            "`fifo`: make the group an ordered (FIFO) group (remembered); `concurrent` or absent: as the group is",
        ),
    ]
}

fn replay_params() -> Vec<Param> {
    vec![
        q("offset", "queue offset to start at (default 0)"),
        q("max", "at most this many messages (default 16)"),
        q("filter", "tag expression or SQL92 selector"),
        q("filter_type", "`tag` (default) or `sql`"),
        q("wait_ms", "wait up to this long when nothing is there yet"),
        q("encoding", "`auto` (default) or `base64`"),
    ]
}

/// Every endpoint of the HTTP door.
pub fn endpoints<B: MessagingApi + 'static>() -> Vec<Endpoint<B>> {
    use Method as M;
    vec![
        ep(
            M::POST,
            "/v1/topics/{topic}/messages",
            "messages",
            "Publish one message; the request body is the message body, byte for byte",
            post(publish::publish::<B>),
        )
        .params(vec![
            q("tag", "the message tag"),
            q("keys", "comma-separated business keys"),
            q("delay", "a delay level (1..18) or a duration such as `30s`"),
            q("deliver_at", "deliver at this unix time (ms)"),
            q("sharding_key", "same key, same queue, in order"),
            q("queue", "this queue id"),
            q("transaction", "`begin`: store a transactional half message"),
            q(
                "producer_group",
                "producer group of a transactional message",
            ),
            Param {
                name: "x-rg-prop-<name>",
                place: "header",
                description: "a user property `<name>`",
            },
        ])
        .body("application/octet-stream")
        .success(201),
        ep(
            M::POST,
            "/v1/topics/{topic}/messages/batch",
            "messages",
            "Publish a JSON array of messages in one append",
            post(publish::publish_batch::<B>),
        )
        .params(vec![
            q("sharding_key", "queue of the whole batch by key"),
            q("queue", "this queue id"),
        ])
        .body(JSON)
        .success(201),
        ep(
            M::GET,
            "/v1/topics/{topic}/messages",
            "lookup",
            "Find messages of a topic by key or store time",
            get(admin::messages_by_key::<B>),
        )
        .params(vec![
            q("key", "a business key (KEYS) or unique key"),
            q("begin_ms", "stored at or after (unix ms)"),
            q("end_ms", "stored at or before (unix ms)"),
            q("max", "at most this many (default 32)"),
            q("encoding", "`auto` (default) or `base64`"),
        ]),
        ep(
            M::GET,
            "/v1/messages/{msg_id}",
            "lookup",
            "Find a message by its id",
            get(admin::message_by_id::<B>),
        )
        .params(vec![q("encoding", "`auto` (default) or `base64`")]),
        ep(
            M::GET,
            "/v1/groups/{group}/topics/{topic}/messages",
            "consume",
            "Receive messages (POP with long polling); ack them by receipt handle",
            get(consume::receive::<B>),
        )
        .params(receive_params()),
        ep(
            M::GET,
            "/v1/groups/{group}/topics/{topic}/stream",
            "consume",
            "Server-Sent Events: one `message` event per message as it arrives",
            get(consume::stream::<B>),
        )
        .params(receive_params()),
        ep(
            M::POST,
            "/v1/groups/{group}/acks",
            "consume",
            "Ack received messages by receipt handle",
            post(consume::ack::<B>),
        )
        .body(JSON),
        ep(
            M::POST,
            "/v1/groups/{group}/nacks",
            "consume",
            "Give messages back: they reappear after `delay_ms` with the attempt raised",
            post(consume::nack::<B>),
        )
        .body(JSON),
        ep(
            M::PATCH,
            "/v1/groups/{group}/invisibility",
            "consume",
            "Change how long a received message stays invisible",
            patch(consume::invisibility::<B>),
        )
        .body(JSON),
        ep(
            M::GET,
            "/v1/topics/{topic}/queues/{queue}/messages",
            "consume",
            "Replay one queue from an offset (no group state)",
            get(consume::replay::<B>),
        )
        .params(replay_params()),
        ep(
            M::POST,
            "/v1/transactions/{id}/commit",
            "transactions",
            "Commit a transactional message: it becomes visible",
            post(admin::commit::<B>),
        ),
        ep(
            M::POST,
            "/v1/transactions/{id}/rollback",
            "transactions",
            "Roll back a transactional message: it is dropped",
            post(admin::rollback::<B>),
        ),
        ep(
            M::GET,
            "/v1/topics",
            "admin",
            "List topics",
            get(admin::list_topics::<B>),
        )
        .params(vec![q("kind", "`user` (default), `system` or `all`")]),
        ep(
            M::POST,
            "/v1/topics",
            "admin",
            "Create a topic",
            post(admin::create_topic::<B>),
        )
        .body(JSON)
        .success(201),
        ep(
            M::GET,
            "/v1/topics/{topic}",
            "admin",
            "Describe a topic with its per-queue offsets",
            get(admin::describe_topic::<B>),
        ),
        ep(
            M::PATCH,
            "/v1/topics/{topic}",
            "admin",
            "Change a topic's queue counts or permission",
            patch(admin::update_topic::<B>),
        )
        .body(JSON),
        ep(
            M::DELETE,
            "/v1/topics/{topic}",
            "admin",
            "Delete a topic",
            delete(admin::delete_topic::<B>),
        )
        .success(204),
        ep(
            M::GET,
            "/v1/topics/{topic}/delayed",
            "admin",
            "List the topic's delayed messages not delivered yet, soonest first",
            get(admin::list_delayed::<B>),
        )
        .params(vec![q("max", "at most this many (default 100)")]),
        ep(
            M::DELETE,
            "/v1/delayed/{id}",
            "admin",
            "Cancel a pending delayed message (by the id its publish answered)",
            delete(admin::cancel_delayed::<B>),
        ),
        ep(
            M::GET,
            "/v1/groups",
            "admin",
            "List consumer groups",
            get(admin::list_groups::<B>),
        ),
        ep(
            M::GET,
            "/v1/groups/{group}",
            "admin",
            "Describe a group: members, committed offsets, lag",
            get(admin::describe_group::<B>),
        ),
        ep(
            M::PATCH,
            "/v1/groups/{group}",
            "admin",
            "Change a group's settings (max_reconsume_times before the DLQ, fifo ordering)",
            patch(admin::update_group::<B>),
        )
        .body(JSON),
        ep(
            M::POST,
            "/v1/groups/{group}/offsets/reset",
            "admin",
            "Reset a group's offsets on a topic to earliest, latest or a time",
            post(admin::reset_offsets::<B>),
        )
        .body(JSON),
        ep(
            M::GET,
            "/v1/groups/{group}/dlq",
            "admin",
            "List the group's dead letters",
            get(admin::list_dead_letters::<B>),
        )
        .params(replay_params()),
        ep(
            M::POST,
            "/v1/groups/{group}/dlq/resend",
            "admin",
            "Re-send dead letters to their original topic",
            post(admin::resend_dead_letters::<B>),
        )
        .body(JSON),
        ep(
            M::GET,
            "/v1/users",
            "admin",
            "List users (no secrets)",
            get(users::list::<B>),
        ),
        ep(
            M::PUT,
            "/v1/users/{name}",
            "admin",
            "Create or change a user: password, roles, rules, access keys",
            put(users::put::<B>),
        )
        .body(JSON),
        ep(
            M::DELETE,
            "/v1/users/{name}",
            "admin",
            "Delete a user",
            delete(users::delete::<B>),
        ),
        ep(
            M::POST,
            "/v1/users/{name}/api_keys",
            "admin",
            "Make an API key for a user (shown once)",
            post(users::new_api_key::<B>),
        ),
        ep(
            M::POST,
            "/v1/users/reload",
            "admin",
            "Read the user store file again",
            post(users::reload::<B>),
        ),
        ep(
            M::GET,
            "/v1/broker",
            "admin",
            "This broker: name, cluster, store positions, disk",
            get(admin::broker_info::<B>),
        ),
        ep(
            M::GET,
            "/v1/cluster",
            "admin",
            "Brokers and clusters as the NameServer knows them",
            get(admin::cluster_info::<B>),
        ),
        ep(
            M::GET,
            "/v1/session",
            "session",
            "Who the caller is and whether they may change things (admin) or only read (monitor)",
            get(access::session::<B>),
        ),
        ep(
            M::GET,
            "/health",
            "ops",
            "Liveness, with readiness and the disk state",
            get(ops::health::<B>),
        ),
        ep(
            M::GET,
            "/health/ready",
            "ops",
            "Readiness: 503 when the disk is full or shutting down",
            get(ops::ready::<B>),
        ),
        // ---- operations API (inspect.rs; docs/http.md "Operations API") ----
        ep(
            M::GET,
            "/healthz",
            "ops",
            "Liveness: 200 while the process serves",
            get(inspect::healthz::<B>),
        ),
        ep(
            M::GET,
            "/readyz",
            "ops",
            "Readiness: store, disk, NameServer registration, doors listening; 503 lists what is not ready",
            get(inspect::readyz::<B>),
        ),
        ep(
            M::GET,
            "/v1/topics/{topic}/status",
            "admin",
            "Per-queue min/max offset and last store time of a topic",
            get(inspect::topic_status::<B>),
        ),
        ep(
            M::GET,
            "/v1/groups/{group}/progress",
            "admin",
            "A group's lag per topic and queue, and its consumers",
            get(inspect::group_progress::<B>),
        ),
        ep(
            M::GET,
            "/v1/groups/{group}/connections",
            "admin",
            "Who consumes as a group, through which door",
            get(inspect::group_connections::<B>),
        ),
        ep(
            M::GET,
            "/v1/connections",
            "admin",
            "Who is connected, through which door (MQTT, WebSocket, HTTP consumers, native)",
            get(inspect::connections::<B>),
        ),
        ep(
            M::GET,
            "/v1/messages",
            "lookup",
            "Search a topic's messages by key or store-time range, with body previews",
            get(inspect::search::<B>),
        )
        .params(vec![
            q("topic", "the topic (required)"),
            q("key", "a business key (KEYS) or unique key"),
            q("begin", "stored at or after (unix ms)"),
            q("end", "stored at or before (unix ms)"),
            q("limit", "at most this many (default 32)"),
            q("preview", "body bytes shown (default 256; 0: all)"),
            q("encoding", "`auto` (default) or `base64`"),
        ]),
        ep(
            M::GET,
            "/v1/mqtt/sessions",
            "admin",
            "MQTT sessions, connected or offline",
            get(inspect::mqtt_sessions::<B>),
        ),
        ep(
            M::DELETE,
            "/v1/mqtt/sessions/{client_id}",
            "admin",
            "Disconnect an MQTT client (v5: reason 0x98); `?discard=true` drops the session",
            delete(inspect::kick_mqtt::<B>),
        )
        .params(vec![q("discard", "`true`: drop the session too")]),
        ep(
            M::GET,
            "/v1/config",
            "admin",
            "Effective settings and where each came from (secrets redacted)",
            get(inspect::config::<B>),
        ),
        ep(
            M::GET,
            "/metrics",
            "ops",
            "Prometheus metrics",
            get(ops::metrics::<B>),
        ),
        ep(
            M::GET,
            "/v1/openapi.json",
            "ops",
            "This document",
            get(openapi::<B>),
        ),
    ]
}

/// The router of every endpoint, with the body limit, the in-flight limit,
/// request metrics and JSON answers for unknown routes.
pub fn router<B: MessagingApi + 'static>(ctx: Arc<Ctx<B>>) -> Router {
    let max_body = ctx.settings.max_body;
    let mut router: Router<Arc<Ctx<B>>> = Router::new();
    let auth_on = ctx.settings.auth.enabled();
    for e in endpoints::<B>() {
        let handler = if auth_on {
            let need = access::Need::of_endpoint(e.tag, &e.method, e.path);
            e.handler.route_layer(axum::middleware::from_fn_with_state(
                (ctx.clone(), need),
                access::check::<B>,
            ))
        } else {
            e.handler
        };
        router = router.route(e.path, handler);
    }
    router
        .merge(crate::dashboard::routes())
        .fallback(ops::no_route)
        .method_not_allowed_fallback(ops::wrong_method)
        .layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            ops::track::<B>,
        ))
        .layer(DefaultBodyLimit::max(max_body))
        .layer(Extension(BodyLimit(max_body)))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(rocketgate_tls::Origins::new(&ctx.settings.allowed_origins)),
            crate::origin::guard,
        ))
        .with_state(ctx)
}

/// The OpenAPI 3 document of [`endpoints`].
pub fn openapi_document<B: MessagingApi + 'static>() -> Value {
    let mut paths = Map::new();
    for e in endpoints::<B>() {
        let mut params: Vec<Value> = path_params(e.path)
            .map(|name| json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        params.extend(e.params.iter().map(|p| {
            json!({ "name": p.name, "in": p.place, "required": false, "description": p.description, "schema": { "type": "string" } })
        }));
        let mut op = json!({
            "tags": [e.tag],
            "summary": e.summary,
            "operationId": operation_id(&e.method, e.path),
            "parameters": params,
            "responses": {
                e.success.to_string(): { "description": "success" },
                "default": {
                    "description": "an error",
                    "content": { JSON: { "schema": { "$ref": "#/components/schemas/Error" } } }
                }
            }
        });
        if let Some(ct) = e.body {
            op["requestBody"] = json!({ "required": true, "content": { ct: { "schema": {} } } });
        }
        let item = paths
            .entry(e.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        item[e.method.as_str().to_ascii_lowercase()] = op;
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "rocketgate HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Publish, stateless receive/ack, replay, admin. See docs/http.md."
        },
        "paths": paths,
        "components": { "schemas": { "Error": {
            "type": "object",
            "required": ["error"],
            "properties": { "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": { "code": { "type": "string" }, "message": { "type": "string" } }
            } }
        } } }
    })
}

fn path_params(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
}

fn operation_id(method: &Method, path: &str) -> String {
    let mut id = method.as_str().to_ascii_lowercase();
    for seg in path.split('/').filter(|s| !s.is_empty() && *s != "v1") {
        id.push('_');
        id.push_str(seg.trim_start_matches('{').trim_end_matches('}'));
    }
    id.replace(['.', '-'], "_")
}

/// `GET /v1/openapi.json` (built once per server).
pub async fn openapi<B: MessagingApi + 'static>(
    axum::extract::State(ctx): axum::extract::State<Arc<Ctx<B>>>,
) -> axum::Json<Value> {
    axum::Json(ctx.openapi.get_or_init(openapi_document::<B>).clone())
}
