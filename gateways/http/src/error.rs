//! The one error type of the HTTP door, and the only place where errors become
//! HTTP statuses. Every error answer has the body
//! `{"error": {"code": "...", "message": "..."}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rocketgate_core::Error as CoreError;

/// Everything an HTTP request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A query parameter, header, path segment or body field the client got wrong.
    #[error("{field}: {reason}")]
    BadInput { field: String, reason: String },

    /// A user property whose name is reserved for the broker or the MQTT door.
    #[error("property {name:?} is reserved (RocketMQ system properties and `mqtt.*` names)")]
    ReservedProperty { name: String },

    #[error("no message {what}")]
    MessageNotFound { what: String },

    /// Something the path names does not exist (an MQTT session, …).
    #[error("no {what}")]
    NotFound { what: String },

    #[error("no route for {method} {path}")]
    NoRoute { method: String, path: String },

    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },

    #[error("request body exceeds the maximum of {max} bytes")]
    TooLarge { max: usize },

    #[error("overloaded: {limit} requests already in flight; retry later")]
    Overloaded { limit: usize },

    /// A browser page whose origin is not in `http.allowed_origins`.
    #[error("requests from origin {origin:?} are not allowed (http.allowed_origins)")]
    ForbiddenOrigin { origin: String },

    #[error("the gateway is shutting down")]
    ShuttingDown,

    /// No NameServer is configured, or none answered.
    #[error("NameServer: {reason}")]
    NameServer { reason: String },

    #[error(transparent)]
    Core(#[from] CoreError),

    /// No valid credentials (401).
    #[error("{reason}")]
    Unauthorized { reason: String },

    /// Authenticated, but the ACL does not allow this (403).
    #[error("{reason}")]
    Forbidden { reason: String },

    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A bad-input error naming the field.
    pub fn bad(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::BadInput {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The status and stable error code of this error.
    pub fn status(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            Error::BadInput { .. } => (S::BAD_REQUEST, "bad_request"),
            Error::ReservedProperty { .. } => (S::BAD_REQUEST, "reserved_property"),
            Error::MessageNotFound { .. } => (S::NOT_FOUND, "message_not_found"),
            Error::NotFound { .. } => (S::NOT_FOUND, "not_found"),
            Error::NoRoute { .. } => (S::NOT_FOUND, "no_route"),
            Error::MethodNotAllowed { .. } => (S::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Error::TooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "too_large"),
            Error::Overloaded { .. } => (S::TOO_MANY_REQUESTS, "overloaded"),
            Error::ForbiddenOrigin { .. } => (S::FORBIDDEN, "forbidden_origin"),
            Error::ShuttingDown => (S::SERVICE_UNAVAILABLE, "shutting_down"),
            Error::NameServer { .. } => (S::BAD_GATEWAY, "namesrv_unavailable"),
            Error::Bind { .. } => (S::INTERNAL_SERVER_ERROR, "internal"),
            Error::Unauthorized { .. } => (S::UNAUTHORIZED, "unauthorized"),
            Error::Forbidden { .. } => (S::FORBIDDEN, "forbidden"),
            Error::Core(e) => core_status(e),
        }
    }
}

/// Core errors by what the client can do about them: fix the request (4xx),
/// wait for the broker (503), or nothing (500: a fault of the server itself).
fn core_status(e: &CoreError) -> (StatusCode, &'static str) {
    use StatusCode as S;
    match e {
        CoreError::InvalidMessage(_) => (S::BAD_REQUEST, "invalid_message"),
        CoreError::MessageTooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "too_large"),
        CoreError::OffsetOutOfRange { .. } => (S::BAD_REQUEST, "offset_out_of_range"),
        CoreError::DiskFull { .. } => (S::SERVICE_UNAVAILABLE, "disk_full"),
        CoreError::FlushTimeout { .. } => (S::SERVICE_UNAVAILABLE, "flush_timeout"),
        // Sync replication: stored on the master but not (yet) on enough copies; the
        // outcome is unknown (it may still be delivered).
        CoreError::ReplicationTimeout { .. } | CoreError::NoInSyncReplica { .. } => {
            (S::SERVICE_UNAVAILABLE, "replication_timeout")
        }
        // A slave of a broker group: the message names the master to send to.
        CoreError::ReadOnlyReplica { .. } => (S::SERVICE_UNAVAILABLE, "read_only_replica"),
        // A failed sync: not acknowledged; the node takes writes again after a restart.
        CoreError::FlushFailed(_) => (S::SERVICE_UNAVAILABLE, "flush_failed"),
        CoreError::ShutDown => (S::SERVICE_UNAVAILABLE, "shutting_down"),
        CoreError::InvalidArgument(_) => (S::BAD_REQUEST, "invalid_argument"),
        CoreError::InvalidTopicName { .. } | CoreError::InvalidName(_) => {
            (S::BAD_REQUEST, "invalid_name")
        }
        CoreError::InvalidFilter(_) => (S::BAD_REQUEST, "invalid_filter"),
        CoreError::TopicNotFound { .. } => (S::NOT_FOUND, "topic_not_found"),
        CoreError::TopicExists { .. } => (S::CONFLICT, "topic_exists"),
        CoreError::NoPermission { .. } => (S::FORBIDDEN, "no_permission"),
        CoreError::QueueNotFound { .. } => (S::NOT_FOUND, "queue_not_found"),
        CoreError::MemberNotFound { .. } => (S::NOT_FOUND, "member_not_found"),
        CoreError::GroupModeConflict { .. } => (S::CONFLICT, "group_mode_conflict"),
        CoreError::QueueLocked { .. } => (S::CONFLICT, "queue_locked"),
        CoreError::InvalidReceiptHandle { .. } => (S::BAD_REQUEST, "invalid_receipt_handle"),
        CoreError::StaleReceiptHandle { .. } => (S::GONE, "stale_receipt_handle"),
        CoreError::MessageNotFound { .. } => (S::NOT_FOUND, "message_not_found"),
        CoreError::GroupNotFound { .. } => (S::NOT_FOUND, "group_not_found"),
        CoreError::TransactionNotFound { .. } => (S::NOT_FOUND, "transaction_not_found"),
        CoreError::TransactionEnded { .. } => (S::CONFLICT, "transaction_ended"),
        CoreError::DelayTooLong { .. } => (S::BAD_REQUEST, "delay_too_long"),
        _ => (S::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// The JSON error body.
pub(crate) fn body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({ "error": { "code": code, "message": message } })
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status();
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %self, "request failed");
        }
        (status, Json(body(code, &self.to_string()))).into_response()
    }
}
