//! Client registration and consumer bookkeeping: `HEART_BEAT`, `UNREGISTER_CLIENT`,
//! `GET_CONSUMER_LIST_BY_GROUP`, consumer offsets, `CONSUMER_SEND_MSG_BACK` and the
//! orderly-consumption queue locks.

use std::collections::BTreeMap;

use rocketgate_core::broker::{ConsumeMode, Heartbeat, MessagingApi, Subscription};
use rocketgate_core::store::record::encode_msg_id;
use tracing::debug;

use super::Ctx;
use super::clients::Sub;
use super::pull::filter_type;
use super::reply::{Fail, Handled, core_fail, ok, parse, parse_opt, queue_id, required};
use rocketgate_remoting::body::{
    ConsumerList, HeartbeatData, LockBatchRequest, LockBatchResponse, field,
};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::protocol::{from_json, to_json};
use rocketgate_remoting::server::Peer;

fn bad_body(what: &str, e: impl std::fmt::Display) -> Fail {
    Fail::new(
        response::SYSTEM_ERROR,
        format!("malformed {what} body: {e}"),
    )
}

pub(crate) async fn heartbeat<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
) -> Handled {
    let hb: HeartbeatData = from_json(&req.body).map_err(|e| bad_body("heartbeat", e))?;
    if hb.client_id.is_empty() {
        return Err(Fail::new(
            response::SYSTEM_ERROR,
            "the heartbeat has no clientID",
        ));
    }
    for c in &hb.consumer_data_set {
        let mode = match c.message_model.as_str() {
            "BROADCASTING" => ConsumeMode::Broadcasting,
            _ => ConsumeMode::Clustering,
        };
        let mut subs = BTreeMap::new();
        let mut subscriptions = Vec::new();
        for s in &c.subscription_data_set {
            let filter_type = filter_type(Some(s.expression_type.as_str()))?;
            subscriptions.push(Subscription {
                topic: s.topic.clone(),
                filter_type,
                expression: s.sub_string.clone(),
            });
            subs.insert(
                s.topic.clone(),
                Sub {
                    filter_type,
                    expression: s.sub_string.clone(),
                },
            );
        }
        ctx.broker
            .heartbeat(Heartbeat {
                group: c.group_name.clone(),
                member: hb.client_id.clone(),
                mode,
                subscriptions,
            })
            .await
            .map_err(core_fail)?;
        if ctx
            .clients
            .consumer_heartbeat(peer.id, &hb.client_id, &c.group_name, subs)
        {
            debug!(
                group = c.group_name,
                client = hb.client_id,
                "consumer joined"
            );
            notify_consumers(ctx, &c.group_name);
        }
    }
    for p in &hb.producer_data_set {
        ctx.clients
            .producer_heartbeat(peer.id, &hb.client_id, &p.group_name);
        super::txn::ensure_checker(ctx, &ctx.clients, &p.group_name).await;
    }
    Ok(ok(req))
}

pub(crate) async fn unregister<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let client_id = required(req, field::CLIENT_ID)?;
    if let Some(group) = req.field(field::CONSUMER_GROUP).filter(|g| !g.is_empty())
        && ctx.clients.leave_consumer_group(group, client_id)
    {
        member_left(ctx, group, client_id).await;
    }
    if let Some(group) = req.field(field::PRODUCER_GROUP).filter(|g| !g.is_empty()) {
        ctx.clients.leave_producer_group(group, client_id);
    }
    Ok(ok(req))
}

pub(crate) fn consumer_list<B>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let group = required(req, field::CONSUMER_GROUP)?;
    let ids = ctx.clients.consumer_ids(group);
    if ids.is_empty() {
        return Err(Fail::new(
            response::SYSTEM_ERROR,
            format!("no consumer of group {group:?} is connected"),
        ));
    }
    let body = ConsumerList {
        consumer_id_list: ids,
    };
    Ok(ok(req).with_body(to_json(&body)))
}

pub(crate) async fn query_offset<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
) -> Handled {
    let group = required(req, field::CONSUMER_GROUP)?;
    let topic = required(req, field::TOPIC)?;
    let queue = queue_id(req)?;
    let member = ctx.clients.client_id(peer.id).unwrap_or_default();
    match ctx
        .broker
        .query_offset(group, &member, topic, queue)
        .await
        .map_err(core_fail)?
    {
        Some(offset) => Ok(ok(req).with_field(field::OFFSET, offset)),
        None => Err(Fail::new(
            response::QUERY_NOT_FOUND,
            "Not found, maybe this group consumer boot first",
        )),
    }
}

pub(crate) async fn update_offset<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
) -> Handled {
    let group = required(req, field::CONSUMER_GROUP)?;
    let topic = required(req, field::TOPIC)?;
    let queue = queue_id(req)?;
    let offset: i64 = parse(req, field::COMMIT_OFFSET)?;
    let offset = u64::try_from(offset).map_err(|_| {
        Fail::new(
            response::SYSTEM_ERROR,
            format!("commitOffset {offset} is illegal"),
        )
    })?;
    let member = ctx.clients.client_id(peer.id).unwrap_or_default();
    ctx.broker
        .commit_offset(group, &member, topic, queue, offset)
        .await
        .map_err(core_fail)?;
    Ok(ok(req))
}

pub(crate) async fn send_back<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let group = required(req, field::GROUP)?;
    let phys: i64 = parse(req, field::OFFSET)?;
    let phys = u64::try_from(phys)
        .map_err(|_| Fail::new(response::SYSTEM_ERROR, format!("offset {phys} is illegal")))?;
    let delay: i32 = parse_opt(req, field::DELAY_LEVEL)?.unwrap_or(0);
    let id = encode_msg_id(ctx.settings.store_host, phys);
    let found = ctx.broker.message_by_id(&id).await.map_err(|e| {
        Fail::new(
            response::SYSTEM_ERROR,
            format!("look up message at commit-log offset {phys} failed: {e}"),
        )
    })?;
    let topic = found.view().map_err(core_fail)?.topic().to_owned();
    let level = u8::try_from(delay).ok().filter(|l| *l > 0);
    ctx.broker
        .send_back(group, &topic, found.queue_id, found.queue_offset, level)
        .await
        .map_err(core_fail)?;
    // The retry topic may be new: its route must reach the NameServers.
    ctx.note_topic(&format!("%RETRY%{group}"));
    Ok(ok(req))
}

pub(crate) async fn lock_batch<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let body: LockBatchRequest = from_json(&req.body).map_err(|e| bad_body("lock", e))?;
    let mut locked = Vec::new();
    for mq in body.mq_set {
        match ctx
            .broker
            .lock_queue(
                &body.consumer_group,
                &body.client_id,
                &mq.topic,
                mq.queue_id,
            )
            .await
        {
            Ok(()) => locked.push(mq),
            Err(e) => debug!(group = body.consumer_group, queue = ?mq, error = %e, "lock refused"),
        }
    }
    let resp = LockBatchResponse {
        lock_ok_mq_set: locked,
    };
    Ok(ok(req).with_body(to_json(&resp)))
}

pub(crate) async fn unlock_batch<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let body: LockBatchRequest = from_json(&req.body).map_err(|e| bad_body("unlock", e))?;
    for mq in body.mq_set {
        ctx.broker
            .unlock_queue(
                &body.consumer_group,
                &body.client_id,
                &mq.topic,
                mq.queue_id,
            )
            .await
            .map_err(core_fail)?;
    }
    Ok(ok(req))
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
