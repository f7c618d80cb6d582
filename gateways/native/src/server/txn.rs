//! Transactional messages: half messages on send, `END_TRANSACTION` from the producer,
//! and `CHECK_TRANSACTION_STATE` pushed to a producer of the group when a half message
//! stays undecided (the core's check loop calls our [`Checker`]).

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use rocketgate_core::broker::{
    HalfMessage, MessagingApi, Resolution, TransactionChecker, TransactionHandle,
};
use rocketgate_core::store::record::encode_msg_id;
use tracing::debug;

use super::Ctx;
use super::clients::Clients;
use super::reply::{Fail, Handled, core_fail, ok, parse, parse_opt, required};
use rocketgate_remoting::body::{field, transaction};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::{FLAG_ONEWAY, RemotingCommand};

pub(crate) async fn end_transaction<B: MessagingApi>(
    ctx: &Ctx<B>,
    req: &RemotingCommand,
) -> Handled {
    required(req, field::PRODUCER_GROUP)?;
    let handle = TransactionHandle::at(
        parse(req, field::COMMIT_LOG_OFFSET)?,
        parse(req, field::TRAN_STATE_TABLE_OFFSET)?,
    );
    let decision: i32 = parse(req, field::COMMIT_OR_ROLLBACK)?;
    let resolution = match decision {
        transaction::COMMIT => Resolution::Commit,
        transaction::ROLLBACK => Resolution::Rollback,
        // Unknown: the producer cannot tell yet; the broker checks back later.
        transaction::NOT_TYPE => return Ok(ok(req)),
        other => {
            return Err(Fail::new(
                response::SYSTEM_ERROR,
                format!("commitOrRollback {other} is neither commit (8) nor rollback (12)"),
            ));
        }
    };
    let from_check: bool = parse_opt(req, field::FROM_TRANSACTION_CHECK)?.unwrap_or(false);
    debug!(%handle, ?resolution, from_check, "end transaction");
    ctx.broker
        .end_transaction(&handle, resolution)
        .await
        .map_err(core_fail)?;
    Ok(ok(req))
}

/// Answers the core's check-backs for one producer group by asking one of the group's
/// connected producers (`CHECK_TRANSACTION_STATE`, one-way); the producer replies with
/// `END_TRANSACTION`. Holds the client table weakly: a stopped server checks nothing.
pub(crate) struct Checker {
    pub clients: Weak<Clients>,
    pub group: String,
    pub store_host: SocketAddr,
}

impl TransactionChecker for Checker {
    fn check(&self, half: HalfMessage) {
        let Some(clients) = self.clients.upgrade() else {
            return;
        };
        let h = half.handle;
        let mut cmd = RemotingCommand::request(request::CHECK_TRANSACTION_STATE, 0)
            .with_field(field::TRAN_STATE_TABLE_OFFSET, h.half_queue_offset)
            .with_field(field::COMMIT_LOG_OFFSET, h.commit_log_offset)
            .with_field(field::MSG_ID, &half.msg_id)
            .with_field(
                field::TRANSACTION_ID,
                half.transaction_id.as_deref().unwrap_or(&half.msg_id),
            )
            .with_field(
                field::OFFSET_MSG_ID,
                encode_msg_id(self.store_host, h.commit_log_offset),
            )
            .with_body(half.record);
        cmd.flag = FLAG_ONEWAY;
        cmd.language = rocketgate_remoting::LanguageCode::Rust;
        cmd.version = rocketgate_remoting::code::version::CURRENT;
        let asked = clients.push_to_producer(&self.group, cmd);
        debug!(group = self.group, handle = %h, asked, "transaction check-back");
    }
}

/// A producer of `group` connected: make sure the core asks us about its group's
/// undecided transactions.
pub(crate) async fn ensure_checker<B: MessagingApi>(
    ctx: &Ctx<B>,
    clients: &Arc<Clients>,
    group: &str,
) {
    if clients.has_checker(group) {
        return;
    }
    let checker = Arc::new(Checker {
        clients: Arc::downgrade(clients),
        group: group.to_owned(),
        store_host: ctx.settings.store_host,
    });
    match ctx
        .broker
        .register_transaction_checker(group, checker)
        .await
    {
        Ok(registration) => clients.set_checker(group, registration),
        Err(e) => debug!(group, error = %e, "cannot register a transaction checker"),
    }
}
