//! The one error type of the core. Gateways map these to their own status codes.

use std::path::PathBuf;

/// Everything the core can fail with. Variants carry structured fields so a
/// gateway can pick the right status code without parsing text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("corrupt data in {path} at offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },

    /// Another process has the data directory open (its pid when it recorded one).
    #[error("data directory {dir} is in use by {}; one process per data directory", match .holder { Some(pid) => format!("process {pid}"), None => "another process".to_owned() })]
    DataDirLocked { dir: PathBuf, holder: Option<u32> },

    #[error("invalid message: {0}")]
    InvalidMessage(String),

    #[error("message of {size} bytes exceeds the maximum of {max} bytes")]
    MessageTooLarge { size: usize, max: usize },

    #[error("offset {offset} is out of range (valid: {min}..{max})")]
    OffsetOutOfRange { offset: u64, min: u64, max: u64 },

    #[error(
        "disk full: usage {usage_percent:.1}% is above the hard limit of {limit_percent:.1}%; appends are refused until space is freed"
    )]
    DiskFull {
        usage_percent: f64,
        limit_percent: f64,
    },

    #[error("flush to disk failed: {0}")]
    FlushFailed(String),

    #[error("not durable after {waited:?}: waiting for offset {offset}, durable up to {durable}")]
    FlushTimeout {
        offset: u64,
        durable: u64,
        waited: std::time::Duration,
    },

    #[error("malformed record: {0}")]
    Record(#[from] crate::store::record::RecordError),

    #[error("the store is shut down")]
    ShutDown,

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A topic name that cannot be used as a directory name on disk.
    #[error("invalid topic name {topic:?}: {reason}")]
    InvalidTopicName { topic: String, reason: &'static str },

    #[error("invalid filter expression: {0}")]
    InvalidFilter(#[from] crate::broker::filter::FilterError),

    #[error("invalid name: {0}")]
    InvalidName(#[from] crate::broker::schedule::InvalidName),

    #[error("topic {topic:?} does not exist")]
    TopicNotFound { topic: String },

    #[error("topic {topic:?} already exists")]
    TopicExists { topic: String },

    /// The topic's permission bits (or a reserved name) forbid the operation.
    #[error("no {operation} permission on topic {topic:?}")]
    NoPermission {
        topic: String,
        operation: &'static str,
    },

    #[error("topic {topic:?} has no queue {queue_id} (it has {queues})")]
    QueueNotFound {
        topic: String,
        queue_id: u32,
        queues: u32,
    },

    #[error("member {member:?} is not registered in consumer group {group:?}")]
    MemberNotFound { group: String, member: String },

    #[error("consumer group {group:?} is {existing}; a member asked for {requested}")]
    GroupModeConflict {
        group: String,
        existing: &'static str,
        requested: &'static str,
    },

    #[error("queue {queue_id} of {topic:?} is locked by {owner:?} in group {group:?}")]
    QueueLocked {
        group: String,
        topic: String,
        queue_id: u32,
        owner: String,
    },

    /// A POP receipt handle that does not parse (garbled, truncated, or not one).
    #[error("malformed receipt handle {handle:?}: {reason}")]
    InvalidReceiptHandle {
        handle: String,
        reason: &'static str,
    },

    /// A well-formed POP receipt handle that no longer names a live delivery:
    /// acked already, or replaced by a redelivery or a change of invisibility.
    /// Acting on it does nothing, so it can never ack a newer delivery.
    #[error("stale receipt handle {handle:?}: {reason}")]
    StaleReceiptHandle {
        handle: String,
        reason: &'static str,
    },

    /// No stored message where the caller said: `what` names the place
    /// ("at offset 3 of queue 0 of topic \"t\"", "with id \"...\"").
    #[error("no message {what}")]
    MessageNotFound { what: String },

    #[error("consumer group {group:?} is unknown: no live member, offsets or settings")]
    GroupNotFound { group: String },

    /// No half message where a transaction handle points (garbled, never
    /// stored, or removed by retention).
    #[error("no transaction with handle {handle:?}")]
    TransactionNotFound { handle: String },

    /// The transaction was already committed or rolled back (or is being ended
    /// right now by another call).
    #[error("transaction {handle:?} is already committed or rolled back")]
    TransactionEnded { handle: String },

    /// A send asked for a delivery further away than the broker allows.
    #[error("delay of {requested:?} exceeds the maximum of {max:?}")]
    DelayTooLong {
        requested: std::time::Duration,
        max: std::time::Duration,
    },

    #[error("invalid delay levels: {0}")]
    InvalidDelayLevels(#[from] crate::broker::schedule::DelayLevelsError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an `io::Error` with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether this is the file system saying it has no space (or quota) left:
    /// callers turn it into [`Error::DiskFull`] for clients and refuse writes.
    pub fn is_out_of_space(&self) -> bool {
        matches!(self, Error::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
    }

    /// Whether this is the file system refusing writes (mounted read-only, or no
    /// permission on the data directory).
    pub fn is_read_only(&self) -> bool {
        matches!(self, Error::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM)))
    }
}
