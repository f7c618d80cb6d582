//! Every endpoint, once: the table [`endpoints`] builds the axum router *and*
//! the OpenAPI 3.1 document served at `/v1/openapi.json`, so the two cannot drift.
//!
//! Each entry names its handler and, with the builder methods of [`Endpoint`], the
//! types the handler takes and answers: `.query::<Q>()` (a `utoipa::IntoParams`
//! query struct the handler deserializes), `.json::<T>()` (a request body),
//! `.answers::<T>(status)` (a response body), `.errors(&[…])`. The schemas come from
//! `#[derive(utoipa::ToSchema)]` on those very types, so a field added to a
//! response shows up in the document. Documenting a new route is one entry here
//! (docs/http.md, "The OpenAPI document"); `tests/openapi.rs` fails for a route
//! served outside this table or an entry without a documented answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::{MethodRouter, delete, get, patch, post, put};
use axum::{Extension, Router};
use rocketgate_core::broker::MessagingApi;
use serde_json::{Map, Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::schema::Schema;
use utoipa::{IntoParams, PartialSchema, ToSchema};

use crate::error::{ErrorBody, ErrorCode};
use crate::wire::BodyLimit;
use crate::{Ctx, access, admin, consume, dashboard, inspect, ops, publish, users};

/// What an answer carries.
#[derive(Debug, Clone)]
pub enum Payload {
    /// No body (`204`).
    Empty,
    /// A body of this content type and JSON Schema (`$ref` to a component or inline).
    Body(&'static str, Value),
    /// A body of one of these content types (static files), as bytes.
    Files(&'static [&'static str]),
}

/// One documented answer of an endpoint.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub description: &'static str,
    pub payload: Payload,
}

/// One endpoint: how it is documented and what serves it.
pub struct Endpoint<B> {
    pub method: Method,
    pub path: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    /// More words for the document (headers, rules); optional.
    pub description: Option<&'static str>,
    /// Query (and header) parameters as OpenAPI parameter objects.
    pub params: Vec<Value>,
    /// The request body: content type and schema.
    pub body: Option<(&'static str, Value)>,
    /// Successful answers (at least one; `tests/openapi.rs` checks).
    pub answers: Vec<Answer>,
    /// Error statuses this endpoint answers besides the common ones (400 for
    /// bad input, 401/403 with auth, 413 with a body, 429, 500, 503: see
    /// [`COMMON_ERRORS`]).
    pub errors: Vec<u16>,
    /// Named schemas the above refer to (`#/components/schemas/...`).
    pub schemas: Vec<(String, RefOr<Schema>)>,
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
        description: None,
        params: Vec::new(),
        body: None,
        answers: Vec::new(),
        errors: Vec::new(),
        schemas: Vec::new(),
        handler,
    }
}

const JSON: &str = "application/json";

/// Errors every endpoint may answer (each is documented with the error envelope).
pub const COMMON_ERRORS: &[u16] = &[400, 401, 403, 413, 429, 500, 503];

impl<B> Endpoint<B> {
    /// A `$ref` to `T`'s schema, registering it and what it refers to.
    fn schema_ref<T: ToSchema>(&mut self) -> Value {
        let name = T::name().into_owned();
        self.schemas.push((name.clone(), T::schema()));
        T::schemas(&mut self.schemas);
        json!({ "$ref": format!("#/components/schemas/{name}") })
    }

    /// The query parameters of `Q` (the struct the handler's `Query` extracts).
    fn query<Q: IntoParams>(mut self) -> Self {
        for p in Q::into_params(|| Some(ParameterIn::Query)) {
            self.params.push(param_json(&p));
        }
        self
    }
    /// A JSON request body of type `T`.
    fn json<T: ToSchema>(mut self) -> Self {
        let schema = self.schema_ref::<T>();
        self.body = Some((JSON, schema));
        self
    }
    /// A non-empty JSON array of `T` as the request body (`wire::JsonArray<T>`).
    fn json_array<T: ToSchema>(mut self) -> Self {
        let items = self.schema_ref::<T>();
        self.body = Some((
            JSON,
            json!({ "type": "array", "items": items, "minItems": 1 }),
        ));
        self
    }
    /// The request body is bytes of any content type (the message body).
    fn raw_body(mut self) -> Self {
        self.body = Some(("*/*", json!({})));
        self
    }
    /// A JSON answer of type `T` with `status`.
    fn answers<T: ToSchema>(mut self, status: u16, description: &'static str) -> Self {
        let schema = self.schema_ref::<T>();
        self.answers.push(Answer {
            status,
            description,
            payload: Payload::Body(JSON, schema),
        });
        self
    }
    /// An answer without a body.
    fn empty(mut self, status: u16, description: &'static str) -> Self {
        self.answers.push(Answer {
            status,
            description,
            payload: Payload::Empty,
        });
        self
    }
    /// An answer of another content type (text, event streams).
    fn answers_as(
        mut self,
        status: u16,
        description: &'static str,
        content_type: &'static str,
        schema: Value,
    ) -> Self {
        self.answers.push(Answer {
            status,
            description,
            payload: Payload::Body(content_type, schema),
        });
        self
    }
    /// A static file of one of `content_types`.
    fn file(
        mut self,
        status: u16,
        description: &'static str,
        content_types: &'static [&'static str],
    ) -> Self {
        self.answers.push(Answer {
            status,
            description,
            payload: Payload::Files(content_types),
        });
        self
    }
    /// Error statuses this endpoint answers besides [`COMMON_ERRORS`].
    fn errors(mut self, statuses: &[u16]) -> Self {
        self.errors.extend_from_slice(statuses);
        self
    }
    fn describe(mut self, text: &'static str) -> Self {
        self.description = Some(text);
        self
    }
}

/// A utoipa parameter as JSON, without `null` in its type: an absent query
/// parameter is how "none" is said, a `null` cannot be sent.
fn param_json(p: &utoipa::openapi::path::Parameter) -> Value {
    let mut v = serde_json::to_value(p).unwrap_or_default();
    if let Some(schema) = v.get_mut("schema") {
        strip_null(schema);
    }
    v
}

fn strip_null(schema: &mut Value) {
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types[0].clone();
            schema["type"] = only;
        }
    }
    if let Some(Value::Array(alts)) = schema.get_mut("oneOf") {
        alts.retain(|a| a.get("type") != Some(&json!("null")));
        if alts.len() == 1 {
            let only = alts[0].clone();
            *schema = only;
        }
    }
}

/// Every endpoint of the HTTP door.
pub fn endpoints<B: MessagingApi + 'static>() -> Vec<Endpoint<B>> {
    use Method as M;
    use admin::*;
    use consume::{
        Acked, HandlesBody, HandlesFailed, InvisibilityBody, Messages, Nacked, ReceiveQuery,
        Renewed, Replay, ReplayQuery,
    };
    use publish::{BatchEntry, BatchPublished, BatchQuery, PublishQuery, Published};
    vec![
        ep(
            M::POST,
            "/v1/topics/{topic}/messages",
            "messages",
            "Publish one message; the request body is the message body, byte for byte",
            post(publish::publish::<B>),
        )
        .describe(
            "User properties travel as headers `x-rg-prop-<name>: <value>` (names \
             lowercase; RocketMQ system names are refused with `400 reserved_property`).",
        )
        .query::<PublishQuery>()
        .raw_body()
        .answers::<Published>(201, "stored; a transactional publish adds `transaction_id`")
        .errors(&[404, 413]),
        ep(
            M::POST,
            "/v1/topics/{topic}/messages/batch",
            "messages",
            "Publish a JSON array of messages in one append",
            post(publish::publish_batch::<B>),
        )
        .query::<BatchQuery>()
        .json_array::<BatchEntry>()
        .answers::<BatchPublished>(201, "stored, in order, in one queue")
        .errors(&[404, 413]),
        ep(
            M::GET,
            "/v1/topics/{topic}/messages",
            "lookup",
            "Find messages of a topic by key or store time",
            get(admin::messages_by_key::<B>),
        )
        .query::<FindQuery>()
        .answers::<Messages>(200, "by key newest first, by time oldest first")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/messages/{msg_id}",
            "lookup",
            "Find a message by its id",
            get(admin::message_by_id::<B>),
        )
        .query::<LookupQuery>()
        .answers::<crate::wire::MessageJson>(200, "the message")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/groups/{group}/topics/{topic}/messages",
            "consume",
            "Receive messages (POP with long polling); ack them by receipt handle",
            get(consume::receive::<B>),
        )
        .query::<ReceiveQuery>()
        .answers::<Messages>(200, "received (leased) messages; empty when the wait ran out")
        .errors(&[404, 409]),
        ep(
            M::GET,
            "/v1/groups/{group}/topics/{topic}/stream",
            "consume",
            "Server-Sent Events: one `message` event per message as it arrives",
            get(consume::stream::<B>),
        )
        .query::<ReceiveQuery>()
        .answers_as(
            200,
            "`event: message` with a message (as in a receive) as `data`; `event: error` \
             with the error envelope ends the stream",
            "text/event-stream",
            json!({ "type": "string" }),
        )
        .errors(&[404, 409]),
        ep(
            M::POST,
            "/v1/groups/{group}/acks",
            "consume",
            "Ack received messages by receipt handle",
            post(consume::ack::<B>),
        )
        .json::<HandlesBody>()
        .answers::<Acked>(200, "every handle acked")
        .answers::<HandlesFailed>(
            410,
            "a handle was stale (the others were acked): the first failure and every handle's outcome",
        )
        .errors(&[404]),
        ep(
            M::POST,
            "/v1/groups/{group}/nacks",
            "consume",
            "Give messages back: they reappear after `delay_ms` with the attempt raised",
            post(consume::nack::<B>),
        )
        .json::<HandlesBody>()
        .answers::<Nacked>(200, "every handle nacked")
        .answers::<HandlesFailed>(
            410,
            "a handle was stale (the others were nacked): the first failure and every handle's outcome",
        )
        .errors(&[404]),
        ep(
            M::PATCH,
            "/v1/groups/{group}/invisibility",
            "consume",
            "Change how long a received message stays invisible",
            patch(consume::invisibility::<B>),
        )
        .json::<InvisibilityBody>()
        .answers::<Renewed>(200, "the new handle (the old one is stale)")
        .errors(&[404, 410]),
        ep(
            M::GET,
            "/v1/topics/{topic}/queues/{queue}/messages",
            "consume",
            "Replay one queue from an offset (no group state)",
            get(consume::replay::<B>),
        )
        .query::<ReplayQuery>()
        .answers::<Replay>(200, "a page of the queue")
        .errors(&[404]),
        ep(
            M::POST,
            "/v1/transactions/{id}/commit",
            "transactions",
            "Commit a transactional message: it becomes visible",
            post(admin::commit::<B>),
        )
        .answers::<TransactionEnd>(200, "committed, with where the message went")
        .errors(&[404, 409]),
        ep(
            M::POST,
            "/v1/transactions/{id}/rollback",
            "transactions",
            "Roll back a transactional message: it is dropped",
            post(admin::rollback::<B>),
        )
        .answers::<TransactionEnd>(200, "rolled back")
        .errors(&[404, 409]),
        ep(
            M::GET,
            "/v1/topics",
            "admin",
            "List topics",
            get(admin::list_topics::<B>),
        )
        .query::<ListTopics>()
        .answers::<TopicList>(200, "the topics"),
        ep(
            M::POST,
            "/v1/topics",
            "admin",
            "Create a topic",
            post(admin::create_topic::<B>),
        )
        .json::<CreateTopic>()
        .answers::<TopicJson>(201, "created")
        .errors(&[409]),
        ep(
            M::GET,
            "/v1/topics/{topic}",
            "admin",
            "Describe a topic with its per-queue offsets",
            get(admin::describe_topic::<B>),
        )
        .answers::<TopicDetail>(200, "the topic")
        .errors(&[404]),
        ep(
            M::PATCH,
            "/v1/topics/{topic}",
            "admin",
            "Change a topic's queue counts or permission",
            patch(admin::update_topic::<B>),
        )
        .json::<UpdateTopic>()
        .answers::<TopicJson>(200, "the topic as changed")
        .errors(&[404]),
        ep(
            M::DELETE,
            "/v1/topics/{topic}",
            "admin",
            "Delete a topic",
            delete(admin::delete_topic::<B>),
        )
        .empty(204, "deleted")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/topics/{topic}/delayed",
            "admin",
            "List the topic's delayed messages not delivered yet, soonest first",
            get(admin::list_delayed::<B>),
        )
        .query::<DelayedQuery>()
        .answers::<DelayedList>(200, "pending delayed messages")
        .errors(&[404]),
        ep(
            M::DELETE,
            "/v1/delayed/{id}",
            "admin",
            "Cancel a pending delayed message (by the id its publish answered)",
            delete(admin::cancel_delayed::<B>),
        )
        .answers::<DelayedJson>(200, "what was cancelled")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/groups",
            "admin",
            "List consumer groups",
            get(admin::list_groups::<B>),
        )
        .answers::<GroupList>(200, "the groups"),
        ep(
            M::GET,
            "/v1/groups/{group}",
            "admin",
            "Describe a group: members, committed offsets, lag",
            get(admin::describe_group::<B>),
        )
        .answers::<GroupJson>(200, "the group")
        .errors(&[404]),
        ep(
            M::PATCH,
            "/v1/groups/{group}",
            "admin",
            "Change a group's settings (max_reconsume_times before the DLQ, fifo ordering)",
            patch(admin::update_group::<B>),
        )
        .json::<GroupSettings>()
        .answers::<GroupJson>(200, "the group as changed")
        .errors(&[404]),
        ep(
            M::DELETE,
            "/v1/groups/{group}",
            "admin",
            "Delete a group: settings, offsets, POP state, retry topic (`?dlq=true`: its DLQ too); `?force=true` while it has consumers",
            delete(inspect::delete_group::<B>),
        )
        .query::<inspect::DeleteGroupQuery>()
        .answers::<inspect::GroupDeletedJson>(200, "what was deleted")
        .errors(&[404, 409]),
        ep(
            M::POST,
            "/v1/groups/{group}/offsets/reset",
            "admin",
            "Reset a group's offsets on a topic to earliest, latest or a time",
            post(admin::reset_offsets::<B>),
        )
        .json::<ResetOffsets>()
        .answers::<OffsetsReset>(200, "where each queue now starts")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/groups/{group}/dlq",
            "admin",
            "List the group's dead letters",
            get(admin::list_dead_letters::<B>),
        )
        .query::<ReplayQuery>()
        .answers::<Replay>(200, "a page of `%DLQ%<group>` (empty when there is none)")
        .errors(&[404]),
        ep(
            M::POST,
            "/v1/groups/{group}/dlq/resend",
            "admin",
            "Re-send dead letters to their original topic",
            post(admin::resend_dead_letters::<B>),
        )
        .json::<Resend>()
        .answers::<Resent>(200, "where each went")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/users",
            "admin",
            "List users (no secrets)",
            get(users::list::<B>),
        )
        .answers::<users::UserList>(200, "the users"),
        ep(
            M::PUT,
            "/v1/users/{name}",
            "admin",
            "Create or change a user: password, roles, rules, access keys",
            put(users::put::<B>),
        )
        .json::<users::PutUser>()
        .answers::<users::UserPut>(200, "stored"),
        ep(
            M::DELETE,
            "/v1/users/{name}",
            "admin",
            "Delete a user",
            delete(users::delete::<B>),
        )
        .empty(204, "deleted"),
        ep(
            M::POST,
            "/v1/users/{name}/api_keys",
            "admin",
            "Make an API key for a user (shown once)",
            post(users::new_api_key::<B>),
        )
        .answers::<users::ApiKey>(200, "the new key, shown this once"),
        ep(
            M::POST,
            "/v1/users/reload",
            "admin",
            "Read the user store file again",
            post(users::reload::<B>),
        )
        .empty(204, "reloaded"),
        ep(
            M::GET,
            "/v1/broker",
            "admin",
            "This broker: name, cluster, store positions, disk",
            get(admin::broker_info::<B>),
        )
        .answers::<BrokerInfo>(200, "this broker"),
        ep(
            M::GET,
            "/v1/cluster",
            "admin",
            "Brokers and clusters as the NameServer knows them",
            get(admin::cluster_info::<B>),
        )
        .answers::<ClusterInfo>(200, "the cluster view of a NameServer")
        .errors(&[502]),
        ep(
            M::GET,
            "/v1/session",
            "session",
            "Who the caller is and whether they may change things (admin) or only read (monitor)",
            get(access::session::<B>),
        )
        .answers::<access::Session>(200, "the caller"),
        ep(
            M::GET,
            "/health",
            "ops",
            "Liveness, with readiness and the disk state",
            get(ops::health::<B>),
        )
        .answers::<ops::Health>(200, "serving"),
        ep(
            M::GET,
            "/health/ready",
            "ops",
            "Readiness: 503 when the disk is full or shutting down",
            get(ops::ready::<B>),
        )
        .answers::<ops::Health>(200, "ready")
        .answers::<ops::Health>(503, "not ready: `reasons` says why"),
        // ---- operations API (inspect.rs; docs/http.md "Operations API") ----
        ep(
            M::GET,
            "/healthz",
            "ops",
            "Liveness: 200 while the process serves",
            get(inspect::healthz::<B>),
        )
        .answers::<inspect::Healthz>(200, "serving: `{\"status\":\"ok\"}`"),
        ep(
            M::GET,
            "/readyz",
            "ops",
            "Readiness: store, disk, NameServer registration, doors listening; 503 lists what is not ready",
            get(inspect::readyz::<B>),
        )
        .answers::<inspect::Readyz>(200, "ready: every check passes")
        .answers::<inspect::Readyz>(503, "not ready: `not_ready` names the failed checks"),
        ep(
            M::GET,
            "/v1/topics/{topic}/status",
            "admin",
            "Per-queue min/max offset and last store time of a topic",
            get(inspect::topic_status::<B>),
        )
        .answers::<inspect::TopicStatus>(200, "the topic's queues")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/groups/{group}/progress",
            "admin",
            "A group's lag per topic and queue, and its consumers",
            get(inspect::group_progress::<B>),
        )
        .answers::<inspect::GroupProgress>(200, "lag per queue and who consumes")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/groups/{group}/connections",
            "admin",
            "Who consumes as a group, through which door",
            get(inspect::group_connections::<B>),
        )
        .answers::<inspect::Connections>(200, "the group's consumers")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/connections",
            "admin",
            "Who is connected, through which door (MQTT, WebSocket, HTTP consumers, native)",
            get(inspect::connections::<B>),
        )
        .answers::<inspect::Connections>(200, "every connection the node knows of"),
        ep(
            M::GET,
            "/v1/messages",
            "lookup",
            "Search a topic's messages by key or store-time range, with body previews",
            get(inspect::search::<B>),
        )
        .query::<inspect::SearchQuery>()
        .answers::<inspect::SearchResult>(200, "by key newest first, by time oldest first")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/mqtt/sessions",
            "admin",
            "MQTT sessions, connected or offline",
            get(inspect::mqtt_sessions::<B>),
        )
        .answers::<inspect::MqttSessions>(200, "every session")
        .errors(&[404]),
        ep(
            M::DELETE,
            "/v1/mqtt/sessions/{client_id}",
            "admin",
            "Disconnect an MQTT client (v5: reason 0x98); `?discard=true` drops the session",
            delete(inspect::kick_mqtt::<B>),
        )
        .query::<inspect::KickQuery>()
        .answers::<inspect::KickJson>(200, "what was done")
        .errors(&[404]),
        ep(
            M::GET,
            "/v1/config",
            "admin",
            "Effective settings and where each came from (secrets redacted)",
            get(inspect::config::<B>),
        )
        .answers::<inspect::ConfigJson>(200, "every setting with its source")
        .errors(&[404]),
        // ---- the web dashboard (dashboard.rs, docs/dashboard.md): static files ----
        ep(
            M::GET,
            "/dashboard",
            "dashboard",
            "The web dashboard's page (embedded; it calls the admin API like any client)",
            get(dashboard::index),
        )
        .file(200, "the page", &[dashboard::HTML])
        .empty(304, "not modified (`If-None-Match` named the current `ETag`)"),
        ep(
            M::GET,
            "/dashboard/",
            "dashboard",
            "The web dashboard's page, as `/dashboard`",
            get(dashboard::index),
        )
        .file(200, "the page", &[dashboard::HTML])
        .empty(304, "not modified (`If-None-Match` named the current `ETag`)"),
        ep(
            M::GET,
            "/dashboard/{file}",
            "dashboard",
            "A file of the web dashboard (script, style sheet, icon)",
            get(dashboard::file),
        )
        .file(200, "the file", dashboard::CONTENT_TYPES)
        .empty(304, "not modified (`If-None-Match` named the current `ETag`)")
        .errors(&[404]),
        ep(
            M::GET,
            "/metrics",
            "ops",
            "Prometheus metrics",
            get(ops::metrics::<B>),
        )
        .answers_as(
            200,
            "Prometheus text exposition format",
            "text/plain",
            json!({ "type": "string" }),
        ),
        ep(
            M::GET,
            "/v1/openapi.json",
            "ops",
            "This document",
            get(openapi::<B>),
        )
        .answers_as(
            200,
            "the OpenAPI 3.1 document",
            JSON,
            json!({ "type": "object" }),
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

/// The OpenAPI 3.1 document of [`endpoints`].
pub fn openapi_document<B: MessagingApi + 'static>() -> Value {
    let mut paths = Map::new();
    let mut schemas: BTreeMap<String, Value> = BTreeMap::new();
    schemas.insert(
        ErrorBody::name().into_owned(),
        serde_json::to_value(ErrorBody::schema()).unwrap_or_default(),
    );
    let mut nested = Vec::new();
    ErrorBody::schemas(&mut nested);
    for e in endpoints::<B>() {
        nested.extend(e.schemas.iter().cloned());
        let mut params: Vec<Value> = path_params(e.path).map(path_param).collect();
        params.extend(e.params.iter().cloned());
        let mut responses = Map::new();
        for a in &e.answers {
            let mut r = json!({ "description": a.description });
            match &a.payload {
                Payload::Body(ct, schema) => {
                    r["content"] = json!({ *ct: { "schema": schema } });
                }
                Payload::Files(types) => {
                    let content: Map<String, Value> = types
                        .iter()
                        .map(|ct| ((*ct).to_owned(), json!({ "schema": { "type": "string" } })))
                        .collect();
                    r["content"] = Value::Object(content);
                }
                Payload::Empty => {}
            }
            responses.insert(a.status.to_string(), r);
        }
        let errors = COMMON_ERRORS.iter().chain(&e.errors);
        for status in errors.filter(|s| applies(&e, **s)) {
            responses
                .entry(status.to_string())
                .or_insert_with(|| error_response(*status));
        }
        let mut op = json!({
            "tags": [e.tag],
            "summary": e.summary,
            "operationId": operation_id(&e.method, e.path),
            "parameters": params,
            "responses": responses,
        });
        if let Some(d) = e.description {
            op["description"] = json!(d);
        }
        if access::Need::of(e.tag) == access::Need::Open {
            // Probes and scrapers: never asks for credentials.
            op["security"] = json!([]);
        }
        if let Some((ct, schema)) = &e.body {
            op["requestBody"] =
                json!({ "required": true, "content": { *ct: { "schema": schema } } });
        }
        let item = paths
            .entry(e.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        item[e.method.as_str().to_ascii_lowercase()] = op;
    }
    for (name, schema) in nested {
        schemas
            .entry(name)
            .or_insert_with(|| serde_json::to_value(schema).unwrap_or_default());
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "rocketgate HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Publish, stateless receive/ack, replay, admin. Every error is \
                `{\"error\":{\"code\",\"message\"}}` with the status of its code. Generated \
                from the handlers' types (gateways/http/src/routes.rs); see docs/http.md.",
            "license": { "name": "Apache-2.0", "identifier": "Apache-2.0" }
        },
        "paths": paths,
        // Credentials are needed only with `auth.enabled = true` (docs/security.md);
        // with auth off (the default) every endpoint is open.
        "security": [ {}, { "bearer": [] }, { "basic": [] } ],
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`Authorization: Bearer <API key or JWT>` (docs/security.md)"
                },
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "`Authorization: Basic base64(user:password)` of the user store"
                }
            }
        }
    })
}

/// Whether a common error status can come from this endpoint.
fn applies<B>(e: &Endpoint<B>, status: u16) -> bool {
    let open = access::Need::of(e.tag) == access::Need::Open;
    match status {
        // Probes, scrapers, the dashboard's files: no credentials.
        401 | 403 => !open,
        // Probes and the scraper are never refused for load.
        429 => !ops::exempt(e.path),
        // Nothing to get wrong in a request without parameters or body.
        400 => !(open && e.params.is_empty() && e.body.is_none()),
        413 => e.body.is_some(),
        _ => true,
    }
}

/// An error answer: the envelope, with the codes of this status listed.
fn error_response(status: u16) -> Value {
    let codes: Vec<&str> = ErrorCode::ALL
        .iter()
        .filter(|c| c.status().as_u16() == status)
        .map(|c| c.as_str())
        .collect();
    let description = if codes.is_empty() {
        "an error".to_owned()
    } else {
        format!("an error: `{}`", codes.join("`, `"))
    };
    json!({
        "description": description,
        "content": { JSON: { "schema": { "$ref": "#/components/schemas/ErrorBody" } } }
    })
}

/// What a topic name may be (RocketMQ's rule, `schedule::validate_topic`).
pub const TOPIC_NAME: &str = "^[A-Za-z0-9%|_-]{1,127}$";
/// What a group name may be (`schedule::validate_group`).
pub const GROUP_NAME: &str = "^[A-Za-z0-9%|_-]{1,255}$";

/// A path parameter: `queue` is a queue id, every other one a name.
fn path_param(name: &str) -> Value {
    let (schema, description) = match name {
        "queue" => (
            json!({ "type": "integer", "format": "uint32", "minimum": 0 }),
            "queue id",
        ),
        "topic" => (
            json!({ "type": "string", "pattern": TOPIC_NAME }),
            "topic name",
        ),
        "group" => (
            json!({ "type": "string", "pattern": GROUP_NAME }),
            "consumer group name",
        ),
        "msg_id" => (
            json!({ "type": "string" }),
            "offset message id or the producer's unique key",
        ),
        "id" => (json!({ "type": "string" }), "the id the publish answered"),
        "name" => (json!({ "type": "string" }), "user name"),
        "client_id" => (json!({ "type": "string" }), "MQTT client id"),
        "file" => (
            json!({ "type": "string", "enum": dashboard::FILE_NAMES }),
            "file name",
        ),
        _ => (json!({ "type": "string" }), ""),
    };
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": schema })
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
