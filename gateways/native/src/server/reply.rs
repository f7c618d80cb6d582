//! What every request handler uses: reading header fields, and turning core errors
//! into RocketMQ response codes (the only place that mapping lives).

use std::str::FromStr;

use rocketgate_core::Error as CoreError;
use rocketgate_remoting::body::field;
use rocketgate_remoting::code::response;
use rocketgate_remoting::codec::RemotingCommand;

/// A failed request: the response code and remark it is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fail {
    pub code: i32,
    pub remark: String,
}

impl Fail {
    pub fn new(code: i32, remark: impl Into<String>) -> Self {
        Fail {
            code,
            remark: remark.into(),
        }
    }
}

pub(crate) type Handled = Result<RemotingCommand, Fail>;

/// A success response with no fields.
pub(crate) fn ok(req: &RemotingCommand) -> RemotingCommand {
    RemotingCommand::response_to(req, response::SUCCESS)
}

/// A required header field.
pub(crate) fn required<'a>(req: &'a RemotingCommand, name: &str) -> Result<&'a str, Fail> {
    req.field(name).ok_or_else(|| {
        Fail::new(
            response::SYSTEM_ERROR,
            format!("the custom header field {name} is missing"),
        )
    })
}

/// A required header field, parsed.
pub(crate) fn parse<T: FromStr>(req: &RemotingCommand, name: &str) -> Result<T, Fail> {
    let raw = required(req, name)?;
    raw.trim().parse().map_err(|_| {
        Fail::new(
            response::SYSTEM_ERROR,
            format!("the custom header field {name} has a bad value {raw:?}"),
        )
    })
}

/// An optional header field, parsed (absent or empty is `None`, malformed is an error).
pub(crate) fn parse_opt<T: FromStr>(req: &RemotingCommand, name: &str) -> Result<Option<T>, Fail> {
    match req.field(name).map(str::trim) {
        None | Some("") | Some("null") => Ok(None),
        Some(_) => parse(req, name).map(Some),
    }
}

/// A queue id field: a non-negative i32.
pub(crate) fn queue_id(req: &RemotingCommand) -> Result<u32, Fail> {
    let q: i32 = parse(req, field::QUEUE_ID)?;
    u32::try_from(q)
        .map_err(|_| Fail::new(response::SYSTEM_ERROR, format!("queueId {q} is illegal")))
}

/// The response code of a core error, with its text as the remark.
pub(crate) fn core_fail(e: CoreError) -> Fail {
    let code = match &e {
        CoreError::TopicNotFound { .. } => response::TOPIC_NOT_EXIST,
        CoreError::TopicExists { .. } => response::TOPIC_EXIST_ALREADY,
        CoreError::NoPermission { .. } => response::NO_PERMISSION,
        CoreError::FlushTimeout { .. } => response::FLUSH_DISK_TIMEOUT,
        // Sync replication (RocketMQ's SYNC_MASTER answers): no copy in time, or no
        // in-sync slave at all. A write to a slave is Apache RocketMQ's
        // SERVICE_NOT_AVAILABLE, its remark naming the slave role and the master.
        CoreError::ReplicationTimeout { .. } => response::FLUSH_SLAVE_TIMEOUT,
        CoreError::NoInSyncReplica { .. } => response::SLAVE_NOT_AVAILABLE,
        CoreError::ReadOnlyReplica { .. } => response::SERVICE_NOT_AVAILABLE,
        // A master without its controller lease, or fenced: like a slave, not the
        // broker to send to now (clients retry SERVICE_NOT_AVAILABLE elsewhere).
        CoreError::NotLeader { .. } => response::SERVICE_NOT_AVAILABLE,
        CoreError::DiskFull { .. } | CoreError::ShutDown | CoreError::FlushFailed(_) => {
            response::SERVICE_NOT_AVAILABLE
        }
        CoreError::MessageTooLarge { .. }
        | CoreError::InvalidMessage(_)
        | CoreError::DelayTooLong { .. } => response::MESSAGE_ILLEGAL,
        CoreError::InvalidFilter(_) => response::SUBSCRIPTION_PARSE_FAILED,
        CoreError::MessageNotFound { .. } => response::QUERY_NOT_FOUND,
        CoreError::MemberNotFound { .. } => response::CONSUMER_NOT_ONLINE,
        CoreError::QueueLocked { .. } => response::SYSTEM_BUSY,
        _ => response::SYSTEM_ERROR,
    };
    Fail::new(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_without_its_lease_answers_like_a_slave() {
        let reason = "this broker's master lease expired 1.2s ago; not taking writes";
        let f = core_fail(CoreError::NotLeader {
            reason: reason.into(),
        });
        assert_eq!(f.code, response::SERVICE_NOT_AVAILABLE);
        assert_eq!(f.remark, reason);
        let f = core_fail(CoreError::ReadOnlyReplica {
            master: "m:10912".into(),
        });
        assert_eq!(f.code, response::SERVICE_NOT_AVAILABLE);
    }
}
