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
        let code = self.code();
        (code.status(), code.as_str())
    }

    /// The stable error code of this error (its status follows from it).
    pub fn code(&self) -> ErrorCode {
        use ErrorCode as C;
        match self {
            Error::BadInput { .. } => C::BadRequest,
            Error::ReservedProperty { .. } => C::ReservedProperty,
            Error::MessageNotFound { .. } => C::MessageNotFound,
            Error::NotFound { .. } => C::NotFound,
            Error::NoRoute { .. } => C::NoRoute,
            Error::MethodNotAllowed { .. } => C::MethodNotAllowed,
            Error::TooLarge { .. } => C::TooLarge,
            Error::Overloaded { .. } => C::Overloaded,
            Error::ForbiddenOrigin { .. } => C::ForbiddenOrigin,
            Error::ShuttingDown => C::ShuttingDown,
            Error::NameServer { .. } => C::NamesrvUnavailable,
            Error::Bind { .. } => C::Internal,
            Error::Unauthorized { .. } => C::Unauthorized,
            Error::Forbidden { .. } => C::Forbidden,
            Error::Core(e) => core_code(e),
        }
    }
}

/// Declares [`ErrorCode`]: each code once, with its status and its JSON name.
macro_rules! error_codes {
    ($($variant:ident = $status:literal $name:literal,)*) => {
        /// Every `error.code` the HTTP door answers, each with one status. The
        /// OpenAPI document lists them from [`ErrorCode::ALL`], so a code added
        /// here is documented.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ErrorCode { $($variant,)* }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears in `error.code`.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $name,)* }
            }

            /// The HTTP status that goes with the code.
            pub fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => match StatusCode::from_u16($status) {
                        Ok(s) => s,
                        Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
                    },)*
                }
            }
        }
    };
}

error_codes! {
    BadRequest = 400 "bad_request",
    ReservedProperty = 400 "reserved_property",
    InvalidMessage = 400 "invalid_message",
    OffsetOutOfRange = 400 "offset_out_of_range",
    InvalidArgument = 400 "invalid_argument",
    InvalidName = 400 "invalid_name",
    InvalidFilter = 400 "invalid_filter",
    InvalidReceiptHandle = 400 "invalid_receipt_handle",
    DelayTooLong = 400 "delay_too_long",
    Unauthorized = 401 "unauthorized",
    Forbidden = 403 "forbidden",
    ForbiddenOrigin = 403 "forbidden_origin",
    NoPermission = 403 "no_permission",
    MessageNotFound = 404 "message_not_found",
    NotFound = 404 "not_found",
    NoRoute = 404 "no_route",
    TopicNotFound = 404 "topic_not_found",
    QueueNotFound = 404 "queue_not_found",
    MemberNotFound = 404 "member_not_found",
    GroupNotFound = 404 "group_not_found",
    TransactionNotFound = 404 "transaction_not_found",
    MethodNotAllowed = 405 "method_not_allowed",
    TopicExists = 409 "topic_exists",
    GroupModeConflict = 409 "group_mode_conflict",
    GroupInUse = 409 "group_in_use",
    QueueLocked = 409 "queue_locked",
    TransactionEnded = 409 "transaction_ended",
    StaleReceiptHandle = 410 "stale_receipt_handle",
    TooLarge = 413 "too_large",
    Overloaded = 429 "overloaded",
    Internal = 500 "internal",
    NamesrvUnavailable = 502 "namesrv_unavailable",
    DiskFull = 503 "disk_full",
    FlushTimeout = 503 "flush_timeout",
    FlushFailed = 503 "flush_failed",
    ReplicationTimeout = 503 "replication_timeout",
    ReadOnlyReplica = 503 "read_only_replica",
    NotLeader = 503 "not_leader",
    ShuttingDown = 503 "shutting_down",
}

/// Core errors by what the client can do about them: fix the request (4xx),
/// wait for the broker (503), or nothing (500: a fault of the server itself).
fn core_code(e: &CoreError) -> ErrorCode {
    use ErrorCode as C;
    match e {
        CoreError::InvalidMessage(_) => C::InvalidMessage,
        CoreError::MessageTooLarge { .. } => C::TooLarge,
        CoreError::OffsetOutOfRange { .. } => C::OffsetOutOfRange,
        CoreError::DiskFull { .. } => C::DiskFull,
        CoreError::FlushTimeout { .. } => C::FlushTimeout,
        // Sync replication: stored on the master but not (yet) on enough copies; the
        // outcome is unknown (it may still be delivered).
        CoreError::ReplicationTimeout { .. } | CoreError::NoInSyncReplica { .. } => {
            C::ReplicationTimeout
        }
        // A slave of a broker group: the message names the master to send to.
        CoreError::ReadOnlyReplica { .. } => C::ReadOnlyReplica,
        // A master whose controller lease expired, or fenced: the message says which,
        // and whether the write is in the log (outcome unknown).
        CoreError::NotLeader { .. } => C::NotLeader,
        // A failed sync: not acknowledged; the node takes writes again after a restart.
        CoreError::FlushFailed(_) => C::FlushFailed,
        CoreError::ShutDown => C::ShuttingDown,
        CoreError::InvalidArgument(_) => C::InvalidArgument,
        CoreError::InvalidTopicName { .. } | CoreError::InvalidName(_) => C::InvalidName,
        CoreError::InvalidFilter(_) => C::InvalidFilter,
        CoreError::TopicNotFound { .. } => C::TopicNotFound,
        CoreError::TopicExists { .. } => C::TopicExists,
        CoreError::NoPermission { .. } => C::NoPermission,
        CoreError::QueueNotFound { .. } => C::QueueNotFound,
        CoreError::MemberNotFound { .. } => C::MemberNotFound,
        CoreError::GroupModeConflict { .. } => C::GroupModeConflict,
        CoreError::QueueLocked { .. } => C::QueueLocked,
        CoreError::InvalidReceiptHandle { .. } => C::InvalidReceiptHandle,
        CoreError::StaleReceiptHandle { .. } => C::StaleReceiptHandle,
        CoreError::MessageNotFound { .. } => C::MessageNotFound,
        CoreError::GroupNotFound { .. } => C::GroupNotFound,
        CoreError::GroupInUse { .. } => C::GroupInUse,
        CoreError::TransactionNotFound { .. } => C::TransactionNotFound,
        CoreError::TransactionEnded { .. } => C::TransactionEnded,
        CoreError::DelayTooLong { .. } => C::DelayTooLong,
        _ => C::Internal,
    }
}

/// The error envelope every error answer has (the OpenAPI schema `Error`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong: a stable `code` (see [`ErrorCode`]) and a message for people.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    #[schema(schema_with = code_schema)]
    pub code: String,
    pub message: String,
}

/// `error.code`: one of [`ErrorCode::ALL`].
fn code_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
        .description(Some(
            "stable error code; the status follows from it (docs/http.md, Errors)",
        ))
        .build()
}

/// The JSON error body.
pub(crate) fn body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!(ErrorBody {
        error: ErrorDetail {
            code: code.to_owned(),
            message: message.to_owned(),
        },
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_without_its_lease_is_503_not_leader() {
        let e = Error::Core(CoreError::NotLeader {
            reason: "this broker was fenced as master (broker 1 is master at epoch 3)".into(),
        });
        assert_eq!(e.status(), (StatusCode::SERVICE_UNAVAILABLE, "not_leader"));
        assert!(ErrorCode::ALL.contains(&ErrorCode::NotLeader), "documented");
        let sibling = Error::Core(CoreError::ReadOnlyReplica {
            master: "m:10912".into(),
        });
        assert_eq!(
            sibling.status(),
            (StatusCode::SERVICE_UNAVAILABLE, "read_only_replica")
        );
    }
}
