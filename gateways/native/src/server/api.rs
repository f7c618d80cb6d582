//! The broker API codes (`rocketgate_remoting::code::api`): a proxy's
//! [`RemoteBroker`](crate::client::RemoteBroker) calls the broker's `MessagingApi`
//! through them, one code per method (`docs/proxy-protocol.md`). Arguments and results
//! are JSON with the bytes raw in the body (`crate::api`); a core error comes back with
//! its kind. Waiting calls (a long-polling pull or POP) run as their connection's tasks
//! like every other request, so they never hold up the calls multiplexed with them.
//!
//! With auth on, only the internal credential may use these codes (`access.rs`): the
//! proxy is trusted and enforces each user's ACL at its own doors.
//!
//! Transaction checks: `REGISTER_CHECKER` registers, with the broker, a checker that
//! pushes `CHECK_TRANSACTION` (one-way, the half record as the body) to this
//! connection; the proxy's checker answers later through `END_TRANSACTION`. The
//! registration ends with `UNREGISTER_CHECKER` or when the connection closes.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use rocketgate_core::Error as CoreError;
use rocketgate_core::broker::{
    DeadLetters, HalfMessage, Heartbeat, MessagingApi, OffsetReset, QueueChoice, Resolution,
    TopicConfig, TopicKind, TransactionChecker, TransactionHandle,
};
use rocketgate_remoting::code::{api as code, response};
use rocketgate_remoting::codec::{DEFAULT_MAX_FRAME_LEN, FLAG_ONEWAY, RemotingCommand};
use rocketgate_remoting::server::Peer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

use super::Ctx;
use super::clients::{Clients, ConnId};
use super::reply::core_fail;
use crate::api::{
    self, BatchSentMeta, CheckMeta, EncodedMeta, MessageMeta, PopArgs, PoppedMeta, PullArgs,
    PullMeta, WireError, split_delivered,
};

enum Failure {
    Core(CoreError),
    /// The request itself is malformed (a bug or version skew of the proxy).
    Bad(String),
}

impl From<CoreError> for Failure {
    fn from(e: CoreError) -> Self {
        Failure::Core(e)
    }
}

type Out = Result<(String, Vec<Bytes>), Failure>;

fn args<T: DeserializeOwned>(json: &str) -> Result<T, Failure> {
    serde_json::from_str(json).map_err(|e| Failure::Bad(format!("malformed arguments: {e}")))
}

fn json<T: Serialize>(v: &T) -> Out {
    to_json(v).map(|j| (j, Vec::new()))
}

fn to_json<T: Serialize>(v: &T) -> Result<String, Failure> {
    serde_json::to_string(v).map_err(|e| Failure::Bad(format!("result does not encode: {e}")))
}

/// Answers one broker API request.
pub(crate) async fn handle<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: &RemotingCommand,
) -> RemotingCommand {
    let out = match api::unpack(req) {
        Ok((j, parts)) => call(ctx, peer, req.code, j, parts).await,
        Err(e) => Err(Failure::Bad(e)),
    };
    match out {
        Ok((j, parts)) => api::pack(
            RemotingCommand::response_to(req, response::SUCCESS),
            j,
            &parts,
        ),
        Err(Failure::Core(e)) => {
            let wire = serde_json::to_string(&WireError::of(&e)).unwrap_or_default();
            let fail = core_fail(e);
            let mut resp = RemotingCommand::response_to(req, fail.code).with_remark(fail.remark);
            resp.ext_fields.insert(api::ERROR, wire);
            resp
        }
        Err(Failure::Bad(why)) => {
            RemotingCommand::response_to(req, response::SYSTEM_ERROR).with_remark(why)
        }
    }
}

async fn call<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    code: i32,
    j: &str,
    parts: Vec<Bytes>,
) -> Out {
    let b = &*ctx.broker;
    match code {
        code::CREATE_TOPIC => json(&b.create_topic(args::<TopicConfig>(j)?).await?),
        code::UPDATE_TOPIC => json(&b.update_topic(args::<TopicConfig>(j)?).await?),
        code::DELETE_TOPIC => json(&b.delete_topic(&args::<String>(j)?).await?),
        code::TOPIC => json(&b.topic(&args::<String>(j)?).await?),
        code::TOPICS => json(&b.topics(args::<TopicKind>(j)?).await?),

        code::SEND => {
            let (meta, queue): (MessageMeta, QueueChoice) = args(j)?;
            let body = one_part(parts)?;
            json(&b.send(meta.join(body), queue).await?)
        }
        code::SEND_BATCH => {
            let (metas, queue): (Vec<MessageMeta>, QueueChoice) = args(j)?;
            if metas.len() != parts.len() {
                return Err(Failure::Bad(format!(
                    "{} messages but {} bodies",
                    metas.len(),
                    parts.len()
                )));
            }
            let messages = metas
                .into_iter()
                .zip(parts)
                .map(|(m, p)| m.join(p))
                .collect();
            json(&b.send_batch(messages, queue).await?)
        }
        code::SEND_ENCODED => {
            let (meta, queue): (EncodedMeta, QueueChoice) = args(j)?;
            let batch = meta.join(parts).map_err(Failure::Bad)?;
            json(&BatchSentMeta::of(b.send_encoded(batch, queue).await?))
        }
        code::SEND_BACK => {
            let (group, topic, queue_id, offset, level): (String, String, u32, u64, Option<u8>) =
                args(j)?;
            json(&b.send_back(&group, &topic, queue_id, offset, level).await?)
        }
        code::RESEND_DEAD_LETTERS => {
            let (group, which): (String, DeadLetters) = args(j)?;
            json(&b.resend_dead_letters(&group, which).await?)
        }

        code::PULL => {
            let request = args::<PullArgs>(j)?.request()?;
            let mut r = b.pull(request).await?;
            // What does not fit one frame is left for the next pull.
            let kept = fitting(r.messages.iter().map(|m| m.record.len()), budget(ctx));
            if kept < r.messages.len() {
                r.next_offset = r.messages[kept].queue_offset;
                r.messages.truncate(kept);
            }
            let (messages, parts) = split_delivered(r.messages);
            let meta = PullMeta {
                status: r.status.into(),
                messages,
                next_offset: r.next_offset,
                min_offset: r.min_offset,
                max_offset: r.max_offset,
            };
            Ok((to_json(&meta)?, parts))
        }
        code::POP => {
            let request = args::<PopArgs>(j)?.request()?;
            let mut popped = b.pop(request).await?;
            // What does not fit one frame is given back at once (visible again).
            let kept = fitting(popped.iter().map(|p| p.message.record.len()), budget(ctx));
            for p in popped.split_off(kept) {
                let receipt = p.receipt.to_string();
                if let Err(e) = b.change_invisibility(&receipt, Duration::ZERO).await {
                    tracing::debug!(error = %e, "giving back a POP that did not fit");
                }
            }
            let mut metas = Vec::with_capacity(popped.len());
            let mut parts = Vec::with_capacity(popped.len());
            for p in popped {
                metas.push(PoppedMeta(
                    p.message.queue_id,
                    p.message.queue_offset,
                    p.receipt.to_string(),
                ));
                parts.push(p.message.record);
            }
            Ok((to_json(&metas)?, parts))
        }
        code::ACK => json(&b.ack(&args::<String>(j)?).await?),
        code::CHANGE_INVISIBILITY => {
            let (receipt, ms): (String, u64) = args(j)?;
            let handle = b
                .change_invisibility(&receipt, Duration::from_millis(ms))
                .await?;
            json(&handle.to_string())
        }
        code::NACK => {
            let (receipt, ms): (String, u64) = args(j)?;
            json(&b.nack(&receipt, Duration::from_millis(ms)).await?)
        }

        code::HEARTBEAT => json(&b.heartbeat(args::<Heartbeat>(j)?).await?),
        code::UNREGISTER => {
            let (group, member): (String, String) = args(j)?;
            json(&b.unregister(&group, &member).await?)
        }
        code::ASSIGNMENT => {
            let (group, member, topic): (String, String, String) = args(j)?;
            json(&b.assignment(&group, &member, &topic).await?)
        }
        code::QUERY_OFFSET => {
            let (group, member, topic, q): (String, String, String, u32) = args(j)?;
            json(&b.query_offset(&group, &member, &topic, q).await?)
        }
        code::COMMIT_OFFSET => {
            let (group, member, topic, q, offset): (String, String, String, u32, u64) = args(j)?;
            json(&b.commit_offset(&group, &member, &topic, q, offset).await?)
        }
        code::RESET_OFFSET => {
            let (group, member, topic, to): (String, String, String, OffsetReset) = args(j)?;
            json(&b.reset_offset(&group, &member, &topic, to).await?)
        }
        code::LOCK_QUEUE => {
            let (group, member, topic, q): (String, String, String, u32) = args(j)?;
            json(&b.lock_queue(&group, &member, &topic, q).await?)
        }
        code::UNLOCK_QUEUE => {
            let (group, member, topic, q): (String, String, String, u32) = args(j)?;
            json(&b.unlock_queue(&group, &member, &topic, q).await?)
        }

        code::SEND_HALF => {
            let (group, meta, queue): (String, MessageMeta, QueueChoice) = args(j)?;
            let body = one_part(parts)?;
            json(&b.send_half(&group, meta.join(body), queue).await?)
        }
        code::END_TRANSACTION => {
            let (handle, resolution): (TransactionHandle, Resolution) = args(j)?;
            json(&b.end_transaction(&handle, resolution).await?)
        }
        code::REGISTER_CHECKER => {
            let (id, group): (u64, String) = args(j)?;
            let checker = Arc::new(ApiChecker {
                clients: Arc::downgrade(&ctx.clients),
                conn: peer.id,
                id,
            });
            let registration = b.register_transaction_checker(&group, checker).await?;
            ctx.clients.set_api_checker(peer.id, id, registration);
            json(&())
        }
        code::UNREGISTER_CHECKER => {
            let id: u64 = args(j)?;
            ctx.clients.remove_api_checker(peer.id, id);
            json(&())
        }

        code::QUEUE_STATS => json(&b.queue_stats(&args::<String>(j)?).await?),
        code::OFFSET_BY_TIME => {
            let (topic, q, ts): (String, u32, i64) = args(j)?;
            json(&b.offset_by_time(&topic, q, ts).await?)
        }
        code::SET_MAX_RECONSUME_TIMES => {
            let (group, max): (String, Option<u32>) = args(j)?;
            json(&b.set_max_reconsume_times(&group, max).await?)
        }
        code::SET_FIFO => {
            let (group, fifo): (String, bool) = args(j)?;
            json(&b.set_fifo(&group, fifo).await?)
        }
        code::GROUPS => json(&b.groups().await?),
        code::GROUP_INFO => json(&b.group_info(&args::<String>(j)?).await?),
        code::MESSAGE_BY_ID => {
            let d = b.message_by_id(&args::<String>(j)?).await?;
            delivered(ctx, vec![d])
        }
        code::MESSAGES_BY_KEY => {
            let (topic, key, max): (String, String, usize) = args(j)?;
            delivered(ctx, b.messages_by_key(&topic, &key, max).await?)
        }
        code::MESSAGES_BY_TIME => {
            let (topic, begin, end, max): (String, i64, i64, usize) = args(j)?;
            delivered(ctx, b.messages_by_time(&topic, begin, end, max).await?)
        }

        code::DELAY_LIMITS => json(&b.delay_limits()),
        code::DELAYED => {
            let (topic, max): (String, usize) = args(j)?;
            json(&b.delayed(&topic, max).await?)
        }
        code::CANCEL_DELAYED => json(&b.cancel_delayed(&args::<String>(j)?).await?),
        code::SYNC_VISIBLE => {
            b.sync_visible().await;
            json(&())
        }
        other => Err(Failure::Bad(format!("broker API code {other} is unknown"))),
    }
}

/// Bytes of records one answer carries at most: a frame (the smaller of ours and
/// what the client's link accepts), less room for the header.
fn budget<B>(ctx: &Ctx<B>) -> usize {
    let frame = ctx.settings.max_frame_len.min(DEFAULT_MAX_FRAME_LEN);
    frame.saturating_sub(1 << 20).max(frame / 2)
}

/// How many of the leading records fit `budget` bytes (at least one: a single record
/// is never larger than a frame's worth, the store refuses such messages).
fn fitting(sizes: impl Iterator<Item = usize>, budget: usize) -> usize {
    let mut total = 0usize;
    let mut n = 0;
    for size in sizes {
        total = total.saturating_add(size);
        if total > budget && n > 0 {
            break;
        }
        n += 1;
    }
    n
}

fn one_part(parts: Vec<Bytes>) -> Result<Bytes, Failure> {
    let n = parts.len();
    let mut it = parts.into_iter();
    match (it.next(), n) {
        (Some(p), 1) => Ok(p),
        _ => Err(Failure::Bad(format!("expected one body, got {n}"))),
    }
}

/// Lookups answer "at most `max`": what does not fit one frame is left out.
fn delivered<B>(ctx: &Ctx<B>, mut d: Vec<rocketgate_core::broker::Delivered>) -> Out {
    d.truncate(fitting(d.iter().map(|m| m.record.len()), budget(ctx)).max(1));
    let (meta, parts) = split_delivered(d);
    Ok((to_json(&meta)?, parts))
}

/// Hands the broker's checks of one producer group's half messages to a proxy
/// connection (`CHECK_TRANSACTION`, one-way). Holds the client table weakly.
struct ApiChecker {
    clients: Weak<Clients>,
    conn: ConnId,
    id: u64,
}

impl TransactionChecker for ApiChecker {
    fn check(&self, half: HalfMessage) {
        let Some(clients) = self.clients.upgrade() else {
            return;
        };
        let meta = CheckMeta {
            id: self.id,
            producer_group: half.producer_group,
            handle: half.handle,
            msg_id: half.msg_id,
            transaction_id: half.transaction_id,
            check_times: half.check_times,
        };
        let Ok(j) = serde_json::to_string(&meta) else {
            return;
        };
        let mut cmd = api::pack(
            RemotingCommand::request(code::CHECK_TRANSACTION, 0),
            j,
            &[half.record],
        );
        cmd.flag = FLAG_ONEWAY;
        cmd.language = rocketgate_remoting::LanguageCode::Rust;
        cmd.version = rocketgate_remoting::code::version::CURRENT;
        let asked = clients.push_to_conn(self.conn, cmd);
        tracing::debug!(group = meta.producer_group, handle = %meta.handle, asked, "transaction check-back to a proxy");
    }
}
