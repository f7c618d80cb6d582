//! Request dispatch, and the helpers every handler uses: reading header fields, and
//! turning core errors into RocketMQ response codes (the only place that mapping lives).

use std::str::FromStr;

use rocketgate_core::Error as CoreError;
use rocketgate_core::broker::MessagingApi;
use tracing::debug;

use super::conn::Peer;
use super::{Ctx, admin, consumer, pull, send, txn};
use rocketgate_remoting::body::field;
use rocketgate_remoting::code::{request, response};
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

/// Answers one request. Never fails: a failure is a response with its code.
pub(crate) async fn handle<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: RemotingCommand,
) -> RemotingCommand {
    let result = match req.code {
        request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
            send::send(ctx, peer, &req).await
        }
        request::PULL_MESSAGE | request::LITE_PULL_MESSAGE => pull::pull(ctx, peer, &req).await,
        request::HEART_BEAT => consumer::heartbeat(ctx, peer, &req).await,
        request::UNREGISTER_CLIENT => consumer::unregister(ctx, &req).await,
        request::GET_CONSUMER_LIST_BY_GROUP => consumer::consumer_list(ctx, &req),
        request::QUERY_CONSUMER_OFFSET => consumer::query_offset(ctx, peer, &req).await,
        request::UPDATE_CONSUMER_OFFSET => consumer::update_offset(ctx, peer, &req).await,
        request::CONSUMER_SEND_MSG_BACK => consumer::send_back(ctx, &req).await,
        request::LOCK_BATCH_MQ => consumer::lock_batch(ctx, &req).await,
        request::UNLOCK_BATCH_MQ => consumer::unlock_batch(ctx, &req).await,
        request::CHECK_CLIENT_CONFIG => Ok(ok(&req)),
        request::GET_MAX_OFFSET => admin::max_offset(ctx, &req).await,
        request::GET_MIN_OFFSET => admin::min_offset(ctx, &req).await,
        request::SEARCH_OFFSET_BY_TIMESTAMP => admin::search_offset(ctx, &req).await,
        request::QUERY_MESSAGE => admin::query_message(ctx, &req).await,
        request::VIEW_MESSAGE_BY_ID => admin::view_message(ctx, &req).await,
        request::UPDATE_AND_CREATE_TOPIC => admin::create_topic(ctx, &req).await,
        request::GET_TOPIC_STATS_INFO => admin::topic_stats(ctx, &req).await,
        request::GET_CONSUME_STATS => admin::consume_stats(ctx, &req).await,
        request::END_TRANSACTION => txn::end_transaction(ctx, &req).await,
        code => Err(Fail::new(
            response::REQUEST_CODE_NOT_SUPPORTED,
            format!("request code {code} is not supported"),
        )),
    };
    match result {
        Ok(resp) => resp,
        Err(fail) => {
            debug!(code = req.code, peer = %peer.addr, answer = fail.code, remark = %fail.remark, "request failed");
            RemotingCommand::response_to(&req, fail.code).with_remark(fail.remark)
        }
    }
}

/// A member left a consumer group (unregistered or disconnected): tell the core and
/// the remaining members.
pub(crate) async fn member_left<B: MessagingApi>(ctx: &Ctx<B>, group: &str, client_id: &str) {
    let _ = ctx.broker.unregister(group, client_id).await;
    notify_consumers(ctx, group);
}

/// `NOTIFY_CONSUMER_IDS_CHANGED` (one-way) to every member of `group`.
pub(crate) fn notify_consumers<B>(ctx: &Ctx<B>, group: &str) {
    let mut cmd = RemotingCommand::request(request::NOTIFY_CONSUMER_IDS_CHANGED, 0)
        .with_field(field::CONSUMER_GROUP, group);
    cmd.flag = rocketgate_remoting::codec::FLAG_ONEWAY;
    cmd.language = rocketgate_remoting::LanguageCode::Rust;
    cmd.version = rocketgate_remoting::code::version::CURRENT;
    let n = ctx.clients.push_to_consumers(group, &cmd);
    debug!(group, notified = n, "consumer ids changed");
}

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
        CoreError::DiskFull { .. } | CoreError::ShutDown => response::SERVICE_NOT_AVAILABLE,
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
