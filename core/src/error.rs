//! The one error type of the core. Gateways map these to their own status codes.
//!
//! The detailed errors it wraps (a malformed record, a rejected filter
//! expression, a bad name, bad delay levels) are defined here too, below every
//! module that returns them, so this module depends on no other part of the
//! crate; each is re-exported where it is raised (`store::record::RecordError`,
//! `broker::filter::{FilterError, Position}`, `broker::schedule::{InvalidName,
//! DelayLevelsError}`).

use std::fmt;
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

    /// A sync-replicated send whose copies did not arrive in time: it is in the
    /// master's log, so its outcome is unknown (it may still be delivered).
    #[error(
        "not replicated after {waited:?}: waiting for offset {offset}, replicas confirmed up to {confirmed}"
    )]
    ReplicationTimeout {
        offset: u64,
        confirmed: u64,
        waited: std::time::Duration,
    },

    /// A sync-replicated send on a master with fewer in-sync slaves than it needs.
    #[error(
        "no in-sync slave: {needed} copies are required and only {in_sync} slave(s) are in sync"
    )]
    NoInSyncReplica { needed: u32, in_sync: u32 },

    /// A write to a slave of a broker group: slaves only take the master's log.
    #[error("this broker is a read-only slave; send to the master ({master})")]
    ReadOnlyReplica { master: String },

    /// A write to a master that may no longer be the only one: under a controller its
    /// write lease expired (no controller majority answered in time) or it was fenced
    /// (another broker is master at a higher epoch). Refused at append time, or —
    /// when the lease ended while the write waited — after it is in the log: then
    /// its outcome is unknown, as with [`Error::ReplicationTimeout`]. `reason` says
    /// which.
    #[error("{reason}")]
    NotLeader { reason: String },

    #[error("malformed record: {0}")]
    Record(#[from] RecordError),

    #[error("the store is shut down")]
    ShutDown,

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A topic name that cannot be used as a directory name on disk.
    #[error("invalid topic name {topic:?}: {reason}")]
    InvalidTopicName { topic: String, reason: &'static str },

    #[error("invalid filter expression: {0}")]
    InvalidFilter(#[from] FilterError),

    #[error("invalid name: {0}")]
    InvalidName(#[from] InvalidName),

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

    /// A group deletion refused because the group still has live consumers
    /// (`force` deletes it anyway).
    #[error(
        "consumer group {group:?} has {members} live consumer(s) ({names}); stop them first or force the deletion"
    )]
    GroupInUse {
        group: String,
        members: usize,
        /// Who, comma-separated (for the message).
        names: String,
    },

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
    InvalidDelayLevels(#[from] DelayLevelsError),
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

/// Why bytes are not a valid record. The commit log wraps it with the file and
/// offset into [`Error::Corrupt`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record truncated: {needed} bytes needed, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic code {0:#010x}")]
    BadMagic(u32),
    #[error("impossible total size {0}")]
    BadTotalSize(i64),
    #[error("{field} length {len} does not fit in the record")]
    BadLength { field: &'static str, len: i64 },
    #[error("fields end at byte {fields_end} but the total size is {total_size}")]
    SizeMismatch {
        fields_end: usize,
        total_size: usize,
    },
    #[error("{0} is not valid UTF-8")]
    NotUtf8(&'static str),
    #[error("body CRC mismatch: stored {stored}, computed {computed}")]
    BodyCrc { stored: u32, computed: u32 },
    #[error("record CRC mismatch: stored {stored}, computed {computed}")]
    RecordCrc { stored: u32, computed: u32 },
    #[error("the __CRC32# property is missing or malformed")]
    MissingRecordCrc,
}

/// Where in an expression an error was found. `line` and `column` are 1-based and
/// count characters, not bytes; `offset` is the byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub offset: usize,
    pub line: usize,
    pub column: usize,
}

impl Position {
    /// The position of byte `offset` in `src` (clamped to the end, and to a char
    /// boundary, so it is safe for any offset).
    pub(crate) fn locate(src: &str, offset: usize) -> Self {
        let mut offset = offset.min(src.len());
        while !src.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &src[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Position {
            offset,
            line,
            column,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 1 {
            write!(f, "column {}", self.column)
        } else {
            write!(f, "line {}, column {}", self.line, self.column)
        }
    }
}

/// Why an expression was rejected at subscribe time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum FilterError {
    /// The expression is not well formed, or is well formed but meaningless
    /// (`'a' > 1`, `x BETWEEN 5 AND 1`).
    #[error("{message} at {position}")]
    Syntax { message: String, position: Position },

    #[error("filter expression is {len} bytes long; the maximum is {max} bytes")]
    TooLong { len: usize, max: usize },

    #[error("filter expression nests deeper than {max} levels at {position}")]
    TooDeep { max: usize, position: Position },

    #[error("unknown filter type {0:?}; expected TAG or SQL92")]
    UnknownType(String),
}

impl FilterError {
    pub(crate) fn syntax(src: &str, offset: usize, message: impl Into<String>) -> Self {
        FilterError::Syntax {
            message: message.into(),
            position: Position::locate(src, offset),
        }
    }

    /// Where the problem is, when it has a place in the expression.
    pub fn position(&self) -> Option<Position> {
        match self {
            FilterError::Syntax { position, .. } | FilterError::TooDeep { position, .. } => {
                Some(*position)
            }
            FilterError::TooLong { .. } | FilterError::UnknownType(_) => None,
        }
    }
}

/// A delay-level string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelayLevelsError {
    #[error(
        "delay levels are empty; expected e.g. \"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h\""
    )]
    Empty,
    #[error(
        "delay level {level} is {text:?}: expected a positive whole number followed by s, m, h or d (e.g. 30s, 2h)"
    )]
    BadLevel { level: usize, text: String },
    #[error("{count} delay levels configured; the maximum is 256")]
    TooMany { count: usize },
}

/// A topic or group name that breaks RocketMQ's naming rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    #[error("{what} name is empty")]
    Empty { what: &'static str },
    #[error("{what} name is {len} characters long; the maximum is {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error(
        "{what} name {name:?} has the illegal character {ch:?} at position {position}; allowed are letters, digits, '%', '|', '_' and '-'"
    )]
    IllegalChar {
        what: &'static str,
        name: String,
        ch: char,
        /// 1-based character position.
        position: usize,
    },
    #[error("topic {0:?} is reserved for the broker")]
    Reserved(String),
}
