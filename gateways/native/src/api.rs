//! The broker API over the native door: how a `MessagingApi` call and its answer travel
//! in a remoting command, shared by the broker side (`server/api.rs`) and
//! the client's `RemoteBroker`. Byte layout and the code of every method:
//! `docs/proxy-protocol.md`.
//!
//! A command carries its arguments (or result) as JSON in the header field `j`; bytes
//! that matter for speed (message bodies and properties of sends, the stored records of
//! pulls, POPs and lookups, the half record of a check) never go through JSON: they
//! travel back to back in the frame body, their lengths in the header field `l`
//! (comma-separated). A failure carries the core error as JSON in `e` (the response
//! code is the RocketMQ code the native door answers that error with, so a plain
//! remoting client still sees a sensible code).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rocketgate_core::Error as CoreError;
use rocketgate_core::broker::filter::{Filter, FilterType};
use rocketgate_core::broker::{Delivered, PopRequest, PullRequest, PullStatus};
use rocketgate_core::error::{FilterError, InvalidName};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::{BatchSent, EncodedBatch, EncodedEntry, Placed};
use rocketgate_remoting::codec::RemotingCommand;
use serde::{Deserialize, Serialize};

/// Header field: the JSON arguments or result.
pub(crate) const JSON: &str = "j";
/// Header field: the lengths of the raw parts of the body, comma-separated.
pub(crate) const LENS: &str = "l";
/// Header field: the core error of a failure, as JSON.
pub(crate) const ERROR: &str = "e";

/// Puts `json` and the raw `parts` into `cmd`.
pub(crate) fn pack(mut cmd: RemotingCommand, json: String, parts: &[Bytes]) -> RemotingCommand {
    cmd.ext_fields.insert(JSON, json);
    if let [one] = parts {
        // One part (a send's body, a lookup's record): the body is that part, no copy.
        cmd.ext_fields.insert(LENS, one.len().to_string());
        cmd.body = one.clone();
    } else if !parts.is_empty() {
        let mut lens = String::with_capacity(parts.len() * 4);
        let mut body = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                lens.push(',');
            }
            lens.push_str(&p.len().to_string());
            body.extend_from_slice(p);
        }
        cmd.ext_fields.insert(LENS, lens);
        cmd.body = body.freeze();
    }
    cmd
}

/// The JSON and the raw parts of `cmd` (parts share the frame's buffer).
pub(crate) fn unpack(cmd: &RemotingCommand) -> Result<(&str, Vec<Bytes>), String> {
    let json = cmd.field(JSON).unwrap_or("null");
    let mut parts = Vec::new();
    if let Some(lens) = cmd.field(LENS).filter(|l| !l.is_empty()) {
        let mut at = 0usize;
        for l in lens.split(',') {
            let n: usize = l
                .parse()
                .map_err(|_| format!("bad part length {l:?} in field {LENS}"))?;
            let end = at
                .checked_add(n)
                .filter(|e| *e <= cmd.body.len())
                .ok_or_else(|| {
                    format!(
                        "the parts' lengths exceed the body ({} bytes)",
                        cmd.body.len()
                    )
                })?;
            parts.push(cmd.body.slice(at..end));
            at = end;
        }
    }
    Ok((json, parts))
}

/// Takes the next raw part.
pub(crate) fn next_part(parts: &mut std::vec::IntoIter<Bytes>) -> Result<Bytes, String> {
    parts
        .next()
        .ok_or_else(|| "fewer raw parts than the JSON names".to_owned())
}

// ---- messages ----

/// A [`Message`] but its body (a raw part).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MessageMeta {
    pub topic: String,
    pub queue_id: u32,
    pub flag: i32,
    pub properties: Vec<(String, String)>,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

impl MessageMeta {
    pub fn split(m: Message) -> (MessageMeta, Bytes) {
        (
            MessageMeta {
                topic: m.topic,
                queue_id: m.queue_id,
                flag: m.flag,
                properties: m.properties,
                sys_flag: m.sys_flag,
                born_timestamp: m.born_timestamp,
                born_host: m.born_host,
                reconsume_times: m.reconsume_times,
                prepared_transaction_offset: m.prepared_transaction_offset,
            },
            m.body,
        )
    }

    pub fn join(self, body: Bytes) -> Message {
        let mut m = Message::new(self.topic, self.queue_id, body);
        m.flag = self.flag;
        m.properties = self.properties;
        m.sys_flag = self.sys_flag;
        m.born_timestamp = self.born_timestamp;
        m.born_host = self.born_host;
        m.reconsume_times = self.reconsume_times;
        m.prepared_transaction_offset = self.prepared_transaction_offset;
        m
    }
}

/// An [`EncodedBatch`] but its entries' properties and bodies (raw parts, in that
/// order per entry).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct EncodedMeta {
    pub topic: String,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: i32,
    /// Each entry's flag.
    pub flags: Vec<i32>,
}

impl EncodedMeta {
    pub fn split(b: EncodedBatch) -> (EncodedMeta, Vec<Bytes>) {
        let mut parts = Vec::with_capacity(b.entries.len() * 2);
        let mut flags = Vec::with_capacity(b.entries.len());
        for e in b.entries {
            flags.push(e.flag);
            parts.push(e.properties);
            parts.push(e.body);
        }
        (
            EncodedMeta {
                topic: b.topic,
                sys_flag: b.sys_flag,
                born_timestamp: b.born_timestamp,
                born_host: b.born_host,
                reconsume_times: b.reconsume_times,
                flags,
            },
            parts,
        )
    }

    pub fn join(self, parts: Vec<Bytes>) -> Result<EncodedBatch, String> {
        if parts.len() != self.flags.len() * 2 {
            return Err(format!(
                "{} entries but {} raw parts",
                self.flags.len(),
                parts.len()
            ));
        }
        let mut parts = parts.into_iter();
        let mut entries = Vec::with_capacity(self.flags.len());
        for flag in self.flags {
            let properties = next_part(&mut parts)?;
            let body = next_part(&mut parts)?;
            entries.push(EncodedEntry {
                flag,
                body,
                properties,
            });
        }
        Ok(EncodedBatch {
            topic: self.topic,
            sys_flag: self.sys_flag,
            born_timestamp: self.born_timestamp,
            born_host: self.born_host,
            reconsume_times: self.reconsume_times,
            entries,
        })
    }
}

/// A [`BatchSent`] with each record as `[phys_offset, size, queue_offset]` (a batch
/// of small messages answered with named fields spent more bytes on the names than
/// the messages had).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct BatchSentMeta {
    pub topic: String,
    pub queue_id: u32,
    pub store_host: SocketAddr,
    pub store_timestamp: i64,
    pub records: Vec<(u64, u32, u64)>,
}

impl BatchSentMeta {
    pub fn of(b: BatchSent) -> BatchSentMeta {
        BatchSentMeta {
            records: b
                .records
                .iter()
                .map(|p| (p.phys_offset, p.size, p.queue_offset))
                .collect(),
            topic: b.topic,
            queue_id: b.queue_id,
            store_host: b.store_host,
            store_timestamp: b.store_timestamp,
        }
    }

    pub fn sent(self) -> BatchSent {
        BatchSent {
            records: self
                .records
                .into_iter()
                .map(|(phys_offset, size, queue_offset)| Placed {
                    phys_offset,
                    size,
                    queue_offset,
                })
                .collect(),
            topic: self.topic,
            queue_id: self.queue_id,
            store_host: self.store_host,
            store_timestamp: self.store_timestamp,
        }
    }
}

/// A filter as its type and expression (parsed again by the broker).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FilterMeta {
    pub filter_type: FilterType,
    pub expression: String,
}

impl FilterMeta {
    pub fn of(f: &Filter) -> FilterMeta {
        FilterMeta {
            filter_type: f.filter_type(),
            expression: f.expression().to_owned(),
        }
    }

    pub fn filter(&self) -> Result<Filter, CoreError> {
        Ok(Filter::parse(self.filter_type, &self.expression)?)
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PullArgs {
    pub group: String,
    pub member: String,
    pub topic: String,
    pub queue_id: u32,
    pub offset: u64,
    pub max_messages: usize,
    pub filter: FilterMeta,
    pub wait_ms: u64,
}

impl PullArgs {
    pub fn of(r: PullRequest) -> PullArgs {
        PullArgs {
            filter: FilterMeta::of(&r.filter),
            group: r.group,
            member: r.member,
            topic: r.topic,
            queue_id: r.queue_id,
            offset: r.offset,
            max_messages: r.max_messages,
            wait_ms: millis(r.wait),
        }
    }

    pub fn request(self) -> Result<PullRequest, CoreError> {
        Ok(PullRequest {
            filter: self.filter.filter()?,
            group: self.group,
            member: self.member,
            topic: self.topic,
            queue_id: self.queue_id,
            offset: self.offset,
            max_messages: self.max_messages,
            wait: Duration::from_millis(self.wait_ms),
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PopArgs {
    pub group: String,
    pub topic: String,
    pub filter: FilterMeta,
    pub max_messages: usize,
    pub invisible_ms: u64,
    pub wait_ms: u64,
}

impl PopArgs {
    pub fn of(r: PopRequest) -> PopArgs {
        PopArgs {
            filter: FilterMeta::of(&r.filter),
            group: r.group,
            topic: r.topic,
            max_messages: r.max_messages,
            invisible_ms: millis(r.invisible),
            wait_ms: millis(r.wait),
        }
    }

    pub fn request(self) -> Result<PopRequest, CoreError> {
        Ok(PopRequest {
            filter: self.filter.filter()?,
            group: self.group,
            topic: self.topic,
            max_messages: self.max_messages,
            invisible: Duration::from_millis(self.invisible_ms),
            wait: Duration::from_millis(self.wait_ms),
        })
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Where a delivered record came from; the record itself is a raw part.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct DeliveredMeta(pub u32, pub u64);

pub(crate) fn split_delivered(d: Vec<Delivered>) -> (Vec<DeliveredMeta>, Vec<Bytes>) {
    d.into_iter()
        .map(|d| (DeliveredMeta(d.queue_id, d.queue_offset), d.record))
        .unzip()
}

pub(crate) fn join_delivered(
    meta: Vec<DeliveredMeta>,
    parts: Vec<Bytes>,
) -> Result<Vec<Delivered>, String> {
    if meta.len() != parts.len() {
        return Err(format!(
            "{} records but {} raw parts",
            meta.len(),
            parts.len()
        ));
    }
    Ok(meta
        .into_iter()
        .zip(parts)
        .map(
            |(DeliveredMeta(queue_id, queue_offset), record)| Delivered {
                queue_id,
                queue_offset,
                record,
            },
        )
        .collect())
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum StatusMeta {
    Found,
    NoNewMessage,
    OffsetMoved,
}

impl From<PullStatus> for StatusMeta {
    fn from(s: PullStatus) -> Self {
        match s {
            PullStatus::Found => StatusMeta::Found,
            PullStatus::NoNewMessage => StatusMeta::NoNewMessage,
            PullStatus::OffsetMoved => StatusMeta::OffsetMoved,
        }
    }
}

impl From<StatusMeta> for PullStatus {
    fn from(s: StatusMeta) -> Self {
        match s {
            StatusMeta::Found => PullStatus::Found,
            StatusMeta::NoNewMessage => PullStatus::NoNewMessage,
            StatusMeta::OffsetMoved => PullStatus::OffsetMoved,
        }
    }
}

/// A pull result but its records.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PullMeta {
    pub status: StatusMeta,
    pub messages: Vec<DeliveredMeta>,
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

/// A popped message but its record: queue, offset and receipt handle.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PoppedMeta(pub u32, pub u64, pub String);

/// A check of an undecided half message, broker to proxy; the record is the body.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CheckMeta {
    /// The registration it is for.
    pub id: u64,
    pub producer_group: String,
    pub handle: rocketgate_core::broker::TransactionHandle,
    pub msg_id: String,
    pub transaction_id: Option<String>,
    pub check_times: u32,
}

// ---- errors ----

/// A core error on the wire: every variant a door answers with its own status keeps
/// its kind and fields; the rest keep their message ([`WireError::Other`]).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub(crate) enum WireError {
    InvalidMessage {
        message: String,
    },
    MessageTooLarge {
        size: usize,
        max: usize,
    },
    OffsetOutOfRange {
        offset: u64,
        min: u64,
        max: u64,
    },
    DiskFull {
        usage_percent: f64,
        limit_percent: f64,
    },
    FlushFailed {
        message: String,
    },
    FlushTimeout {
        offset: u64,
        durable: u64,
        waited_ms: u64,
    },
    ReplicationTimeout {
        offset: u64,
        confirmed: u64,
        waited_ms: u64,
    },
    NoInSyncReplica {
        needed: u32,
        in_sync: u32,
    },
    ReadOnlyReplica {
        master: String,
    },
    NotLeader {
        reason: String,
    },
    ShutDown,
    InvalidArgument {
        message: String,
    },
    InvalidTopicName {
        topic: String,
        reason: String,
    },
    InvalidFilter {
        error: FilterError,
    },
    InvalidName {
        name: NameWire,
    },
    TopicNotFound {
        topic: String,
    },
    TopicExists {
        topic: String,
    },
    NoPermission {
        topic: String,
        operation: String,
    },
    QueueNotFound {
        topic: String,
        queue_id: u32,
        queues: u32,
    },
    MemberNotFound {
        group: String,
        member: String,
    },
    GroupModeConflict {
        group: String,
        existing: String,
        requested: String,
    },
    QueueLocked {
        group: String,
        topic: String,
        queue_id: u32,
        owner: String,
    },
    InvalidReceiptHandle {
        handle: String,
        reason: String,
    },
    StaleReceiptHandle {
        handle: String,
        reason: String,
    },
    MessageNotFound {
        what: String,
    },
    GroupNotFound {
        group: String,
    },
    TransactionNotFound {
        handle: String,
    },
    TransactionEnded {
        handle: String,
    },
    DelayTooLong {
        requested_ms: u64,
        max_ms: u64,
    },
    Other {
        message: String,
    },
}

impl WireError {
    pub fn of(e: &CoreError) -> WireError {
        use CoreError as E;
        use WireError as W;
        match e {
            E::InvalidMessage(m) => W::InvalidMessage { message: m.clone() },
            E::MessageTooLarge { size, max } => W::MessageTooLarge {
                size: *size,
                max: *max,
            },
            E::OffsetOutOfRange { offset, min, max } => W::OffsetOutOfRange {
                offset: *offset,
                min: *min,
                max: *max,
            },
            E::DiskFull {
                usage_percent,
                limit_percent,
            } => W::DiskFull {
                usage_percent: *usage_percent,
                limit_percent: *limit_percent,
            },
            E::FlushFailed(m) => W::FlushFailed { message: m.clone() },
            E::FlushTimeout {
                offset,
                durable,
                waited,
            } => W::FlushTimeout {
                offset: *offset,
                durable: *durable,
                waited_ms: millis(*waited),
            },
            E::ReplicationTimeout {
                offset,
                confirmed,
                waited,
            } => W::ReplicationTimeout {
                offset: *offset,
                confirmed: *confirmed,
                waited_ms: millis(*waited),
            },
            E::NoInSyncReplica { needed, in_sync } => W::NoInSyncReplica {
                needed: *needed,
                in_sync: *in_sync,
            },
            E::ReadOnlyReplica { master } => W::ReadOnlyReplica {
                master: master.clone(),
            },
            E::NotLeader { reason } => W::NotLeader {
                reason: reason.clone(),
            },
            E::ShutDown => W::ShutDown,
            E::InvalidArgument(m) => W::InvalidArgument { message: m.clone() },
            E::InvalidTopicName { topic, reason } => W::InvalidTopicName {
                topic: topic.clone(),
                reason: (*reason).to_owned(),
            },
            E::InvalidFilter(f) => W::InvalidFilter { error: f.clone() },
            E::InvalidName(n) => W::InvalidName {
                name: NameWire::of(n),
            },
            E::TopicNotFound { topic } => W::TopicNotFound {
                topic: topic.clone(),
            },
            E::TopicExists { topic } => W::TopicExists {
                topic: topic.clone(),
            },
            E::NoPermission { topic, operation } => W::NoPermission {
                topic: topic.clone(),
                operation: (*operation).to_owned(),
            },
            E::QueueNotFound {
                topic,
                queue_id,
                queues,
            } => W::QueueNotFound {
                topic: topic.clone(),
                queue_id: *queue_id,
                queues: *queues,
            },
            E::MemberNotFound { group, member } => W::MemberNotFound {
                group: group.clone(),
                member: member.clone(),
            },
            E::GroupModeConflict {
                group,
                existing,
                requested,
            } => W::GroupModeConflict {
                group: group.clone(),
                existing: (*existing).to_owned(),
                requested: (*requested).to_owned(),
            },
            E::QueueLocked {
                group,
                topic,
                queue_id,
                owner,
            } => W::QueueLocked {
                group: group.clone(),
                topic: topic.clone(),
                queue_id: *queue_id,
                owner: owner.clone(),
            },
            E::InvalidReceiptHandle { handle, reason } => W::InvalidReceiptHandle {
                handle: handle.clone(),
                reason: (*reason).to_owned(),
            },
            E::StaleReceiptHandle { handle, reason } => W::StaleReceiptHandle {
                handle: handle.clone(),
                reason: (*reason).to_owned(),
            },
            E::MessageNotFound { what } => W::MessageNotFound { what: what.clone() },
            E::GroupNotFound { group } => W::GroupNotFound {
                group: group.clone(),
            },
            E::TransactionNotFound { handle } => W::TransactionNotFound {
                handle: handle.clone(),
            },
            E::TransactionEnded { handle } => W::TransactionEnded {
                handle: handle.clone(),
            },
            E::DelayTooLong { requested, max } => W::DelayTooLong {
                requested_ms: millis(*requested),
                max_ms: millis(*max),
            },
            other => W::Other {
                message: other.to_string(),
            },
        }
    }

    /// The core error again; `broker` names where an [`WireError::Other`] came from.
    pub fn into_core(self, broker: &str) -> CoreError {
        use CoreError as E;
        use WireError as W;
        match self {
            W::InvalidMessage { message } => E::InvalidMessage(message),
            W::MessageTooLarge { size, max } => E::MessageTooLarge { size, max },
            W::OffsetOutOfRange { offset, min, max } => E::OffsetOutOfRange { offset, min, max },
            W::DiskFull {
                usage_percent,
                limit_percent,
            } => E::DiskFull {
                usage_percent,
                limit_percent,
            },
            W::FlushFailed { message } => E::FlushFailed(message),
            W::FlushTimeout {
                offset,
                durable,
                waited_ms,
            } => E::FlushTimeout {
                offset,
                durable,
                waited: Duration::from_millis(waited_ms),
            },
            W::ReplicationTimeout {
                offset,
                confirmed,
                waited_ms,
            } => E::ReplicationTimeout {
                offset,
                confirmed,
                waited: Duration::from_millis(waited_ms),
            },
            W::NoInSyncReplica { needed, in_sync } => E::NoInSyncReplica { needed, in_sync },
            W::ReadOnlyReplica { master } => E::ReadOnlyReplica { master },
            W::NotLeader { reason } => E::NotLeader { reason },
            W::ShutDown => E::ShutDown,
            W::InvalidArgument { message } => E::InvalidArgument(message),
            W::InvalidTopicName { topic, reason } => E::InvalidTopicName {
                topic,
                reason: intern(reason),
            },
            W::InvalidFilter { error } => E::InvalidFilter(error),
            W::InvalidName { name } => E::InvalidName(name.into_core()),
            W::TopicNotFound { topic } => E::TopicNotFound { topic },
            W::TopicExists { topic } => E::TopicExists { topic },
            W::NoPermission { topic, operation } => E::NoPermission {
                topic,
                operation: intern(operation),
            },
            W::QueueNotFound {
                topic,
                queue_id,
                queues,
            } => E::QueueNotFound {
                topic,
                queue_id,
                queues,
            },
            W::MemberNotFound { group, member } => E::MemberNotFound { group, member },
            W::GroupModeConflict {
                group,
                existing,
                requested,
            } => E::GroupModeConflict {
                group,
                existing: intern(existing),
                requested: intern(requested),
            },
            W::QueueLocked {
                group,
                topic,
                queue_id,
                owner,
            } => E::QueueLocked {
                group,
                topic,
                queue_id,
                owner,
            },
            W::InvalidReceiptHandle { handle, reason } => E::InvalidReceiptHandle {
                handle,
                reason: intern(reason),
            },
            W::StaleReceiptHandle { handle, reason } => E::StaleReceiptHandle {
                handle,
                reason: intern(reason),
            },
            W::MessageNotFound { what } => E::MessageNotFound { what },
            W::GroupNotFound { group } => E::GroupNotFound { group },
            W::TransactionNotFound { handle } => E::TransactionNotFound { handle },
            W::TransactionEnded { handle } => E::TransactionEnded { handle },
            W::DelayTooLong {
                requested_ms,
                max_ms,
            } => E::DelayTooLong {
                requested: Duration::from_millis(requested_ms),
                max: Duration::from_millis(max_ms),
            },
            W::Other { message } => other(broker, message),
        }
    }
}

/// [`InvalidName`] on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum NameWire {
    Empty {
        what: String,
    },
    TooLong {
        what: String,
        len: usize,
        max: usize,
    },
    IllegalChar {
        what: String,
        name: String,
        ch: char,
        position: usize,
    },
    Reserved {
        topic: String,
    },
}

impl NameWire {
    fn of(n: &InvalidName) -> NameWire {
        match n {
            InvalidName::Empty { what } => NameWire::Empty {
                what: (*what).to_owned(),
            },
            InvalidName::TooLong { what, len, max } => NameWire::TooLong {
                what: (*what).to_owned(),
                len: *len,
                max: *max,
            },
            InvalidName::IllegalChar {
                what,
                name,
                ch,
                position,
            } => NameWire::IllegalChar {
                what: (*what).to_owned(),
                name: name.clone(),
                ch: *ch,
                position: *position,
            },
            InvalidName::Reserved(topic) => NameWire::Reserved {
                topic: topic.clone(),
            },
        }
    }

    fn into_core(self) -> InvalidName {
        match self {
            NameWire::Empty { what } => InvalidName::Empty { what: intern(what) },
            NameWire::TooLong { what, len, max } => InvalidName::TooLong {
                what: intern(what),
                len,
                max,
            },
            NameWire::IllegalChar {
                what,
                name,
                ch,
                position,
            } => InvalidName::IllegalChar {
                what: intern(what),
                name,
                ch,
                position,
            },
            NameWire::Reserved { topic } => InvalidName::Reserved(topic),
        }
    }
}

/// An error with no kind of its own: an internal failure of the broker, its message
/// kept (doors answer it as an internal error).
pub(crate) fn other(broker: &str, message: String) -> CoreError {
    CoreError::Io {
        path: PathBuf::from(format!("broker {broker}")),
        source: std::io::Error::other(message),
    }
}

/// The core keeps some reasons as `&'static str` (they are constants of the broker's
/// code); the few distinct ones that arrive are leaked once and reused.
fn intern(s: String) -> &'static str {
    static SEEN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut seen = rocketgate_core::sync::lock(&SEEN);
    if let Some(s) = seen.iter().find(|k| **k == s) {
        return s;
    }
    if seen.len() >= 256 {
        return "(reason not kept)";
    }
    let leaked: &'static str = Box::leak(s.into_boxed_str());
    seen.push(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip() {
        let cmd = pack(
            RemotingCommand::request(1, 0),
            "[1]".into(),
            &[
                Bytes::from_static(b"ab"),
                Bytes::new(),
                Bytes::from_static(b"c"),
            ],
        );
        let (json, parts) = unpack(&cmd).unwrap();
        assert_eq!(json, "[1]");
        assert_eq!(parts, vec![&b"ab"[..], &b""[..], &b"c"[..]]);
        let mut bad = cmd.clone();
        bad.ext_fields.insert(LENS, "2,0,9".to_owned());
        assert!(unpack(&bad).is_err());
    }

    #[test]
    fn errors_keep_their_kind() {
        let e = CoreError::StaleReceiptHandle {
            handle: "h".into(),
            reason: "acked",
        };
        let w: WireError =
            serde_json::from_str(&serde_json::to_string(&WireError::of(&e)).unwrap()).unwrap();
        let back = w.into_core("b");
        assert!(matches!(back, CoreError::StaleReceiptHandle { .. }));
        assert_eq!(back.to_string(), e.to_string());
    }
}
