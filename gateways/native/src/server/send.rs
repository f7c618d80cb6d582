//! `SEND_MESSAGE` (v1 header), `SEND_MESSAGE_V2` (one-letter header) and
//! `SEND_BATCH_MESSAGE` (Java's batch body encoding).

use std::str::FromStr;

use bytes::Bytes;
use rocketgate_core::broker::{MessagingApi, QueueChoice, SEND_TIME_PROPERTIES, SendResult};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::{
    BatchSent, EncodedBatch, EncodedEntry, is_plain_properties, property,
};

use super::Ctx;
use super::reply::{Fail, Handled, core_fail};
use crate::message::{decode_batch_encoded, decode_properties};
use rocketgate_remoting::body::field;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::server::Peer;

/// A send header, whichever of the two layouts it came in.
pub(crate) struct SendHeader {
    pub producer_group: String,
    pub topic: String,
    pub queue_id: i32,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub flag: i32,
    /// The `properties` field as sent (`name\x01value\x02…`), shared with the frame:
    /// the core copies it into the record when it is plain.
    pub properties: Bytes,
    pub reconsume_times: i32,
    pub batch: bool,
}

/// A send header field: its v2 one-letter name and its v1 name (`SEND_V2_NAMES`),
/// so a lookup is one scan of the request's fields, not a table scan first.
type Name = (&'static str, &'static str);
const PRODUCER_GROUP: Name = ("a", field::PRODUCER_GROUP);
const TOPIC: Name = ("b", field::TOPIC);
const QUEUE_ID: Name = ("e", field::QUEUE_ID);
const SYS_FLAG: Name = ("f", field::SYS_FLAG);
const BORN_TIMESTAMP: Name = ("g", field::BORN_TIMESTAMP);
const FLAG: Name = ("h", field::FLAG);
const PROPERTIES: Name = ("i", field::PROPERTIES);
const RECONSUME_TIMES: Name = ("j", field::RECONSUME_TIMES);
const BATCH: Name = ("m", field::BATCH);

/// The header fields of a send request, read from the request itself whichever
/// layout it came in (no renamed copy of the field map).
struct Fields<'a> {
    req: &'a RemotingCommand,
    v2: bool,
}

impl Fields<'_> {
    fn key(&self, (short, long): Name) -> &'static str {
        if self.v2 { short } else { long }
    }

    fn raw(&self, name: Name) -> Option<&str> {
        self.req.field(self.key(name))
    }

    fn raw_bytes(&self, name: Name) -> Option<Bytes> {
        self.req.field_bytes(self.key(name))
    }

    /// Absent, empty or `null` is `None`; malformed is an error naming the v1 field.
    fn opt<T: FromStr>(&self, name: Name) -> Result<Option<T>, Fail> {
        let long = name.1;
        match self.raw(name).map(str::trim) {
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
        let topic = f.raw(TOPIC).map(str::trim).ok_or_else(|| {
            Fail::new(
                response::SYSTEM_ERROR,
                format!("the custom header field {} is missing", field::TOPIC),
            )
        })?;
        if topic.is_empty() {
            return Err(Fail::new(response::MESSAGE_ILLEGAL, "the topic is empty"));
        }
        Ok(SendHeader {
            producer_group: f.raw(PRODUCER_GROUP).unwrap_or_default().to_owned(),
            topic: topic.to_owned(),
            queue_id: f.opt(QUEUE_ID)?.unwrap_or(-1),
            sys_flag: f.opt(SYS_FLAG)?.unwrap_or(0),
            born_timestamp: f.opt(BORN_TIMESTAMP)?.unwrap_or(0),
            flag: f.opt(FLAG)?.unwrap_or(0),
            properties: f.raw_bytes(PROPERTIES).unwrap_or_default(),
            reconsume_times: f.opt(RECONSUME_TIMES)?.unwrap_or(0),
            batch: f.opt(BATCH)?.unwrap_or(false),
        })
    }

    pub(crate) fn queue_choice(&self) -> QueueChoice {
        match u32::try_from(self.queue_id) {
            Ok(q) => QueueChoice::Queue(q),
            Err(_) => QueueChoice::RoundRobin,
        }
    }

    /// The general-path message of a single send (transactional half messages).
    fn message(&self, peer: Peer, body: Bytes) -> Message {
        let mut m = Message::new(self.topic.clone(), 0, body);
        m.flag = self.flag;
        m.sys_flag = self.sys_flag;
        m.born_timestamp = self.born_timestamp;
        m.born_host = peer.addr;
        m.reconsume_times = self.reconsume_times;
        m.properties = decode_properties(&String::from_utf8_lossy(&self.properties));
        m
    }

    fn batch(&self, peer: Peer, entries: Vec<EncodedEntry>) -> EncodedBatch {
        EncodedBatch {
            topic: self.topic.clone(),
            sys_flag: self.sys_flag,
            born_timestamp: self.born_timestamp,
            born_host: peer.addr,
            reconsume_times: self.reconsume_times,
            entries,
        }
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
    let started = std::time::Instant::now();
    let header = SendHeader::parse(req)?;
    let batch = req.code == request::SEND_BATCH_MESSAGE || header.batch;
    let mut stored = (1, req.body.len());
    let resp = if batch {
        let (resp, n, bytes) = send_batch(ctx, peer, req, &header).await?;
        stored = (n, bytes);
        resp
    } else if !is_plain_properties(&header.properties, &SEND_TIME_PROPERTIES) {
        // Delays, transactions, or properties not in the stored form: parsed.
        let m = header.message(peer, req.body.clone());
        if m.property(property::TRANSACTION_PREPARED) == Some("true") {
            send_half(ctx, req, &header, m).await?
        } else {
            let sent = ctx
                .broker
                .send(m, header.queue_choice())
                .await
                .map_err(send_fail)?;
            sent_response(req, &sent, sent.append.msg_id.clone())
        }
    } else {
        // The header's properties go to the core as they came (no `String` per
        // name and value), copied into the record.
        let entry = EncodedEntry {
            flag: header.flag,
            body: req.body.clone(),
            properties: header.properties.clone(),
        };
        let sent = ctx
            .broker
            .send_encoded(header.batch(peer, vec![entry]), header.queue_choice())
            .await
            .map_err(send_fail)?;
        let msg_id = sent.msg_id(0).unwrap_or_default();
        batch_response(req, &sent, msg_id)
    };
    ctx.note_topic(&header.topic);
    super::meters::count_in(&header.topic, stored.0, stored.1);
    super::meters::METERS.publish.record_since(started);
    Ok(resp)
}

/// A batch body's entries go to the core as slices of the request (body and
/// properties), copied once into the commit log. Returns the answer, the
/// messages stored and their body bytes.
async fn send_batch<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
    header: &SendHeader,
) -> Result<(RemotingCommand, usize, usize), Fail> {
    let entries = decode_batch_encoded(&req.body)
        .map_err(|e| Fail::new(response::MESSAGE_ILLEGAL, e.to_string()))?;
    if entries.is_empty() {
        return Err(Fail::new(response::MESSAGE_ILLEGAL, "the batch is empty"));
    }
    let (n, bytes) = (
        entries.len(),
        entries.iter().map(|e| e.body.len()).sum::<usize>(),
    );
    let sent = ctx
        .broker
        .send_encoded(header.batch(peer, entries), header.queue_choice())
        .await
        .map_err(send_fail)?;
    let ids = sent.joined_msg_ids(',');
    Ok((batch_response(req, &sent, ids), n, bytes))
}

/// A failed send. A topic that does not exist and was not auto-created gets Java's
/// remark ("topic[…] not exist, apply first please!"), which RocketMQ users search
/// for, and says why: the send named a topic this broker will not create itself
/// (`broker.auto_create_topics` is off, or the name is reserved). The producer's
/// `defaultTopic` header plays no part: auto-creation is the broker's setting.
fn send_fail(e: rocketgate_core::Error) -> Fail {
    match e {
        rocketgate_core::Error::TopicNotFound { topic } => Fail::new(
            response::TOPIC_NOT_EXIST,
            format!(
                "topic[{topic}] not exist, apply first please! This broker does not \
                 create topics on send (broker.auto_create_topics is off, or the name \
                 is reserved): create it with the admin API first"
            ),
        ),
        other => core_fail(other),
    }
}

/// `SendMessageResponseHeader` for what [`MessagingApi::send_encoded`] stored.
fn batch_response(req: &RemotingCommand, sent: &BatchSent, msg_id: String) -> RemotingCommand {
    let first = sent.records.first().map_or(0, |p| p.queue_offset);
    response_fields(req, sent.queue_id, first, msg_id)
}

/// `SendMessageResponseHeader`: where the (first) message went.
pub(crate) fn sent_response(
    req: &RemotingCommand,
    sent: &SendResult,
    msg_id: String,
) -> RemotingCommand {
    response_fields(req, sent.queue_id, sent.append.queue_offset, msg_id)
}

fn response_fields(
    req: &RemotingCommand,
    queue_id: u32,
    queue_offset: u64,
    msg_id: String,
) -> RemotingCommand {
    RemotingCommand::response_to(req, response::SUCCESS)
        .with_field(field::MSG_ID, msg_id)
        .with_field(field::QUEUE_ID, queue_id)
        .with_field(field::QUEUE_OFFSET, queue_offset)
        .with_static_field(field::MSG_REGION, "DefaultRegion")
        .with_static_field(field::TRACE_ON, "true")
}

/// A transactional half message: stored invisible until the producer ends it.
pub(crate) async fn send_half<B: MessagingApi>(
    ctx: &Ctx<B>,
    req: &RemotingCommand,
    header: &SendHeader,
    message: Message,
) -> Handled {
    if header.producer_group.is_empty() {
        return Err(Fail::new(
            response::MESSAGE_ILLEGAL,
            "a transactional message needs its producer group",
        ));
    }
    let transaction_id = message
        .property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        .map(str::to_owned);
    let half = ctx
        .broker
        .send_half(&header.producer_group, message, header.queue_choice())
        .await
        .map_err(send_fail)?;
    let id = half.sent.append.msg_id.clone();
    let resp = sent_response(req, &half.sent, id.clone());
    Ok(resp.with_field(field::TRANSACTION_ID, transaction_id.unwrap_or(id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocketgate_remoting::body::SEND_V2_NAMES;

    #[test]
    fn field_names_are_the_v2_table() {
        for name in [
            PRODUCER_GROUP,
            TOPIC,
            QUEUE_ID,
            SYS_FLAG,
            BORN_TIMESTAMP,
            FLAG,
            PROPERTIES,
            RECONSUME_TIMES,
            BATCH,
        ] {
            assert!(SEND_V2_NAMES.contains(&name), "{name:?}");
        }
    }
}
