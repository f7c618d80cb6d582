//! Queue offsets, message lookup, topic creation and statistics: what admin tools and
//! the clients' `MQAdmin` side ask a broker.

use bytes::BytesMut;
use rocketgate_core::broker::{Delivered, MessagingApi, Perm, TopicConfig};
use rocketgate_core::store::record::encode_msg_id;

use super::Ctx;
use super::reply::{Fail, Handled, core_fail, ok, parse, parse_opt, queue_id, required};
use rocketgate_remoting::body::{
    MessageQueue, OffsetWrapper, TopicOffset, consume_stats_json, field, topic_stats_json,
};
use rocketgate_remoting::code::response;
use rocketgate_remoting::codec::RemotingCommand;

/// Bounds of one queue: `(min, max, last store time)`.
async fn queue_bounds<B: MessagingApi>(
    ctx: &Ctx<B>,
    topic: &str,
    queue: u32,
) -> Result<(u64, u64, Option<i64>), Fail> {
    let stats = ctx.broker.queue_stats(topic).await.map_err(core_fail)?;
    stats
        .into_iter()
        .find(|q| q.queue_id == queue)
        .map(|q| (q.min_offset, q.max_offset, q.last_store_ms))
        .ok_or_else(|| {
            Fail::new(
                response::SYSTEM_ERROR,
                format!("topic {topic:?} has no queue {queue}"),
            )
        })
}

pub(crate) async fn max_offset<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let topic = required(req, field::TOPIC)?;
    let (_, max, _) = queue_bounds(ctx, topic, queue_id(req)?).await?;
    Ok(ok(req).with_field(field::OFFSET, max))
}

pub(crate) async fn min_offset<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let topic = required(req, field::TOPIC)?;
    let (min, _, _) = queue_bounds(ctx, topic, queue_id(req)?).await?;
    Ok(ok(req).with_field(field::OFFSET, min))
}

pub(crate) async fn search_offset<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let topic = required(req, field::TOPIC)?;
    let queue = queue_id(req)?;
    let ts: i64 = parse(req, field::TIMESTAMP)?;
    let offset = ctx
        .broker
        .offset_by_time(topic, queue, ts)
        .await
        .map_err(core_fail)?;
    Ok(ok(req).with_field(field::OFFSET, offset))
}

fn records_body(found: &[Delivered]) -> BytesMut {
    let mut body = BytesMut::with_capacity(found.iter().map(|d| d.record.len()).sum());
    for d in found {
        body.extend_from_slice(&d.record);
    }
    body
}

pub(crate) async fn query_message<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let topic = required(req, field::TOPIC)?;
    let key = required(req, field::KEY)?;
    let max: i32 = parse_opt(req, field::MAX_NUM)?.unwrap_or(32);
    let begin: i64 = parse_opt(req, field::BEGIN_TIMESTAMP)?.unwrap_or(0);
    let end: i64 = parse_opt(req, field::END_TIMESTAMP)?.unwrap_or(i64::MAX);
    let unique = req.field(field::UNIQUE_KEY_QUERY) == Some("true");
    let found: Vec<Delivered> = if unique {
        match ctx.broker.message_by_id(key).await {
            Ok(d) => vec![d],
            Err(rocketgate_core::Error::MessageNotFound { .. }) => Vec::new(),
            Err(e) => return Err(core_fail(e)),
        }
    } else {
        let max = usize::try_from(max).unwrap_or(0).clamp(1, 64);
        ctx.broker
            .messages_by_key(topic, key, max)
            .await
            .map_err(core_fail)?
    };
    let found: Vec<Delivered> = found
        .into_iter()
        .filter(|d| {
            d.view()
                .is_ok_and(|v| (begin..=end).contains(&v.store_timestamp()))
        })
        .collect();
    if found.is_empty() {
        return Err(Fail::new(
            response::QUERY_NOT_FOUND,
            format!("no message of {topic:?} with key {key:?}"),
        ));
    }
    Ok(ok(req)
        .with_field(field::INDEX_LAST_UPDATE_TIMESTAMP, 0)
        .with_field(field::INDEX_LAST_UPDATE_PHYOFFSET, 0)
        .with_body(records_body(&found).freeze()))
}

pub(crate) async fn view_message<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let phys: i64 = parse(req, field::OFFSET)?;
    let phys = u64::try_from(phys)
        .map_err(|_| Fail::new(response::SYSTEM_ERROR, format!("offset {phys} is illegal")))?;
    let id = encode_msg_id(ctx.settings.store_host, phys);
    let found = ctx.broker.message_by_id(&id).await.map_err(|e| {
        Fail::new(
            response::SYSTEM_ERROR,
            format!("can not find message by the offset {phys}: {e}"),
        )
    })?;
    Ok(ok(req).with_body(found.record))
}

pub(crate) async fn create_topic<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let topic = required(req, field::TOPIC)?;
    let read: u32 = parse_opt(req, field::READ_QUEUE_NUMS)?.unwrap_or(16);
    let write: u32 = parse_opt(req, field::WRITE_QUEUE_NUMS)?.unwrap_or(read);
    let perm: u8 = parse_opt(req, field::PERM)?.unwrap_or(Perm::READ_WRITE.0);
    let mut config = TopicConfig::new(topic, write).with_perm(Perm(perm));
    config.read_queues = read;
    let created = match ctx.broker.create_topic(config.clone()).await {
        Err(rocketgate_core::Error::TopicExists { .. }) => ctx.broker.update_topic(config).await,
        other => other,
    };
    created.map_err(core_fail)?;
    (ctx.topics_changed)();
    Ok(ok(req))
}

pub(crate) async fn topic_stats<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let topic = required(req, field::TOPIC)?;
    let stats = ctx.broker.queue_stats(topic).await.map_err(core_fail)?;
    let table: Vec<(MessageQueue, TopicOffset)> = stats
        .into_iter()
        .map(|q| {
            (
                MessageQueue::new(topic, &ctx.settings.broker_name, q.queue_id),
                TopicOffset {
                    min_offset: q.min_offset,
                    max_offset: q.max_offset,
                    last_update_timestamp: q.last_store_ms.unwrap_or(0),
                },
            )
        })
        .collect();
    Ok(ok(req).with_body(topic_stats_json(&table)))
}

pub(crate) async fn consume_stats<B: MessagingApi>(ctx: &Ctx<B>, req: &RemotingCommand) -> Handled {
    let group = required(req, field::CONSUMER_GROUP)?;
    let only_topic = req.field(field::TOPIC).filter(|t| !t.is_empty());
    let info = ctx.broker.group_info(group).await.map_err(|e| match e {
        rocketgate_core::Error::TopicNotFound { .. } => core_fail(e),
        e => Fail::new(response::CONSUMER_NOT_ONLINE, e.to_string()),
    })?;
    let table: Vec<(MessageQueue, OffsetWrapper)> = info
        .progress
        .into_iter()
        .filter(|p| only_topic.is_none_or(|t| t == p.topic))
        .map(|p| {
            (
                MessageQueue::new(&p.topic, &ctx.settings.broker_name, p.queue_id),
                OffsetWrapper {
                    broker_offset: p.max_offset,
                    consumer_offset: p.committed.unwrap_or(0),
                    pull_offset: p.committed.unwrap_or(0),
                    last_timestamp: 0,
                },
            )
        })
        .collect();
    Ok(ok(req).with_body(consume_stats_json(&table, 0.0)))
}
