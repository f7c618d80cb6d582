//! `SEND_MESSAGE` (v1 header), `SEND_MESSAGE_V2` (one-letter header) and
//! `SEND_BATCH_MESSAGE` (Java's batch body encoding).

use std::str::FromStr;

use rocketgate_core::broker::{MessagingApi, QueueChoice, SendResult};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::property;

use super::Ctx;
use super::conn::Peer;
use super::handle::{Fail, Handled, core_fail};
use super::txn;
use crate::body::{SEND_V2_NAMES, field};
use crate::code::{request, response};
use crate::codec::RemotingCommand;
use crate::message::{decode_batch, decode_properties};

/// A send header, whichever of the two layouts it came in.
pub(crate) struct SendHeader {
    pub producer_group: String,
    pub topic: String,
    pub queue_id: i32,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub flag: i32,
    pub properties: Vec<(String, String)>,
    pub reconsume_times: i32,
    pub batch: bool,
}

/// The header fields of a send request under their v1 names, read from the request
/// itself whichever layout it came in (no renamed copy of the field map).
struct Fields<'a> {
    req: &'a RemotingCommand,
    v2: bool,
}

impl Fields<'_> {
    fn raw(&self, long: &str) -> Option<&str> {
        if !self.v2 {
            return self.req.field(long);
        }
        SEND_V2_NAMES
            .iter()
            .find(|(_, l)| *l == long)
            .and_then(|(short, _)| self.req.field(short))
    }

    /// Absent, empty or `null` is `None`; malformed is an error naming the v1 field.
    fn opt<T: FromStr>(&self, long: &str) -> Result<Option<T>, Fail> {
        match self.raw(long).map(str::trim) {
            None | Some("") | Some("null") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                Fail::new(
                    response::SYSTEM_ERROR,
                    format!("the custom header field {long} has a bad value {v:?}"),
                )
            }),
        }
    }
}

impl SendHeader {
    fn parse(req: &RemotingCommand) -> Result<SendHeader, Fail> {
        let v2 = req.code == request::SEND_MESSAGE_V2
            || (req.code == request::SEND_BATCH_MESSAGE && req.field("b").is_some());
        let f = Fields { req, v2 };
        let topic = f.raw(field::TOPIC).map(str::trim).ok_or_else(|| {
            Fail::new(
                response::SYSTEM_ERROR,
                format!("the custom header field {} is missing", field::TOPIC),
            )
        })?;
        if topic.is_empty() {
            return Err(Fail::new(response::MESSAGE_ILLEGAL, "the topic is empty"));
        }
        Ok(SendHeader {
            producer_group: f.raw(field::PRODUCER_GROUP).unwrap_or_default().to_owned(),
            topic: topic.to_owned(),
            queue_id: f.opt(field::QUEUE_ID)?.unwrap_or(-1),
            sys_flag: f.opt(field::SYS_FLAG)?.unwrap_or(0),
            born_timestamp: f.opt(field::BORN_TIMESTAMP)?.unwrap_or(0),
            flag: f.opt(field::FLAG)?.unwrap_or(0),
            properties: decode_properties(f.raw(field::PROPERTIES).unwrap_or_default()),
            reconsume_times: f.opt(field::RECONSUME_TIMES)?.unwrap_or(0),
            batch: f.opt(field::BATCH)?.unwrap_or(false),
        })
    }

    pub(crate) fn queue_choice(&self) -> QueueChoice {
        match u32::try_from(self.queue_id) {
            Ok(q) => QueueChoice::Queue(q),
            Err(_) => QueueChoice::RoundRobin,
        }
    }

    fn message(&self, peer: Peer, flag: i32, body: bytes::Bytes) -> Message {
        let mut m = Message::new(self.topic.clone(), 0, body);
        m.flag = flag;
        m.sys_flag = self.sys_flag;
        m.born_timestamp = self.born_timestamp;
        m.born_host = peer.addr;
        m.reconsume_times = self.reconsume_times;
        m
    }
}

pub(crate) async fn send<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
) -> Handled {
    let Ok(_permit) = ctx.inflight.try_acquire() else {
        return Err(Fail::new(
            response::SYSTEM_BUSY,
            "[TOO_MANY_REQUESTS] broker busy: too many sends in flight, try again later",
        ));
    };
    let mut header = SendHeader::parse(req)?;
    let resp = if req.code == request::SEND_BATCH_MESSAGE || header.batch {
        send_batch(ctx, peer, req, &header).await?
    } else {
        let mut m = header.message(peer, header.flag, req.body.clone());
        m.properties = std::mem::take(&mut header.properties);
        if m.property(property::TRANSACTION_PREPARED) == Some("true") {
            txn::send_half(ctx, req, &header, m).await?
        } else {
            let sent = ctx
                .broker
                .send(m, header.queue_choice())
                .await
                .map_err(core_fail)?;
            sent_response(req, &sent, sent.append.msg_id.clone())
        }
    };
    ctx.note_topic(&header.topic);
    Ok(resp)
}

async fn send_batch<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
    header: &SendHeader,
) -> Handled {
    let entries =
        decode_batch(&req.body).map_err(|e| Fail::new(response::MESSAGE_ILLEGAL, e.to_string()))?;
    if entries.is_empty() {
        return Err(Fail::new(response::MESSAGE_ILLEGAL, "the batch is empty"));
    }
    let messages: Vec<Message> = entries
        .into_iter()
        .map(|e| {
            let mut m = header.message(peer, e.flag, e.body);
            m.properties = e.properties;
            m
        })
        .collect();
    if messages
        .iter()
        .any(|m| m.property(property::TRANSACTION_PREPARED) == Some("true"))
    {
        return Err(Fail::new(
            response::MESSAGE_ILLEGAL,
            "a batch cannot hold transactional messages",
        ));
    }
    let sent = ctx
        .broker
        .send_batch(messages, header.queue_choice())
        .await
        .map_err(core_fail)?;
    let first = sent
        .first()
        .ok_or_else(|| Fail::new(response::SYSTEM_ERROR, "nothing was stored"))?;
    let ids: Vec<&str> = sent.iter().map(|s| s.append.msg_id.as_str()).collect();
    Ok(sent_response(req, first, ids.join(",")))
}

/// `SendMessageResponseHeader`: where the (first) message went.
pub(crate) fn sent_response(
    req: &RemotingCommand,
    sent: &SendResult,
    msg_id: String,
) -> RemotingCommand {
    RemotingCommand::response_to(req, response::SUCCESS)
        .with_field(field::MSG_ID, msg_id)
        .with_field(field::QUEUE_ID, sent.queue_id)
        .with_field(field::QUEUE_OFFSET, sent.append.queue_offset)
        .with_static_field(field::MSG_REGION, "DefaultRegion")
        .with_static_field(field::TRACE_ON, "true")
}
