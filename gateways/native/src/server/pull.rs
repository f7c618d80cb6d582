//! `PULL_MESSAGE` with long polling. The response body is the stored records back to
//! back, exactly as the commit log holds them.

use std::time::Duration;

use bytes::BytesMut;
use rocketgate_core::broker::filter::{Filter, FilterType};
use rocketgate_core::broker::{MessagingApi, PullRequest, PullStatus};
use tracing::debug;

use super::Ctx;
use super::reply::{Fail, Handled, core_fail, parse, parse_opt, queue_id, required};
use rocketgate_remoting::body::{expression, field, pull_flag};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::server::Peer;

/// Messages one pull returns at most, whatever it asks for.
const MAX_PULL_MESSAGES: usize = 1024;

pub(crate) fn filter_type(name: Option<&str>) -> Result<FilterType, Fail> {
    match name.unwrap_or(expression::TAG) {
        "" | expression::TAG => Ok(FilterType::Tag),
        expression::SQL92 => Ok(FilterType::Sql92),
        other => Err(Fail::new(
            response::SUBSCRIPTION_PARSE_FAILED,
            format!("unsupported expression type {other:?}"),
        )),
    }
}

pub(crate) async fn pull<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
) -> Handled {
    let group = required(req, field::CONSUMER_GROUP)?;
    let topic = required(req, field::TOPIC)?;
    let queue_id = queue_id(req)?;
    let offset: i64 = parse(req, field::QUEUE_OFFSET)?;
    let max: i32 = parse_opt(req, field::MAX_MSG_NUMS)?.unwrap_or(32);
    let sys_flag: i32 = parse_opt(req, field::SYS_FLAG)?.unwrap_or(0);
    let member = ctx.clients.client_id(peer.id).unwrap_or_default();

    let filter = match req.field(field::SUBSCRIPTION) {
        Some(expr)
            if sys_flag & pull_flag::SUBSCRIPTION != 0
                || req.code == request::LITE_PULL_MESSAGE =>
        {
            let kind = filter_type(req.field(field::EXPRESSION_TYPE))?;
            Filter::parse(kind, expr)
        }
        _ => match ctx.clients.subscription(group, topic) {
            Some(sub) => Filter::parse(sub.filter_type, &sub.expression),
            None => {
                return Err(Fail::new(
                    response::SUBSCRIPTION_NOT_EXIST,
                    format!(
                        "group {group:?} has no subscription of {topic:?}: heartbeat first, or \
                         send the subscription with the pull"
                    ),
                ));
            }
        },
    }
    .map_err(|e| Fail::new(response::SUBSCRIPTION_PARSE_FAILED, e.to_string()))?;

    let commit = parse_opt::<i64>(req, field::COMMIT_OFFSET)?.filter(|c| *c >= 0);
    if let Some(commit) = commit.filter(|_| sys_flag & pull_flag::COMMIT_OFFSET != 0)
        && let Err(e) = ctx
            .broker
            .commit_offset(group, &member, topic, queue_id, commit as u64)
            .await
    {
        debug!(group, topic, queue_id, error = %e, "commit with pull failed");
    }

    let wait = if sys_flag & pull_flag::SUSPEND != 0 {
        let asked: i64 = parse_opt(req, field::SUSPEND_TIMEOUT_MILLIS)?.unwrap_or(0);
        Duration::from_millis(asked.max(0) as u64).min(ctx.settings.max_suspend)
    } else {
        Duration::ZERO
    };
    let requested = offset.max(0) as u64;
    let result = ctx
        .broker
        .pull(PullRequest {
            group: group.to_owned(),
            member,
            topic: topic.to_owned(),
            queue_id,
            offset: requested,
            max_messages: usize::try_from(max)
                .unwrap_or(1)
                .clamp(1, MAX_PULL_MESSAGES),
            filter,
            wait,
        })
        .await
        .map_err(core_fail)?;

    let (code, remark) = match result.status {
        PullStatus::Found => (response::SUCCESS, None),
        PullStatus::NoNewMessage if result.next_offset > requested => (
            response::PULL_RETRY_IMMEDIATELY,
            Some("no matched message; continue from nextBeginOffset"),
        ),
        PullStatus::NoNewMessage => (response::PULL_NOT_FOUND, Some("no new message")),
        PullStatus::OffsetMoved => (
            response::PULL_OFFSET_MOVED,
            Some("the offset is out of the queue's range; continue from nextBeginOffset"),
        ),
    };
    super::meters::count_out(topic, &result.messages);
    let mut body = BytesMut::with_capacity(result.messages.iter().map(|m| m.record.len()).sum());
    for m in &result.messages {
        body.extend_from_slice(&m.record);
    }
    let mut resp = RemotingCommand::response_to(req, code)
        .with_field(field::NEXT_BEGIN_OFFSET, result.next_offset)
        .with_field(field::MIN_OFFSET, result.min_offset)
        .with_field(field::MAX_OFFSET, result.max_offset)
        .with_field(
            field::SUGGEST_WHICH_BROKER_ID,
            ctx.settings.slave_read.suggest(result.behind_bytes),
        )
        .with_body(body.freeze());
    if let Some(r) = remark {
        resp = resp.with_remark(r);
    }
    Ok(resp)
}
