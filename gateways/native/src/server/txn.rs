//! Transactional messages: half messages on send, `END_TRANSACTION` from the producer,
//! and `CHECK_TRANSACTION_STATE` pushed to a producer of the group when a half message
//! stays undecided.

use rocketgate_core::broker::MessagingApi;
use rocketgate_core::store::Message;

use super::Ctx;
use super::handle::{Fail, Handled};
use super::send::SendHeader;
use crate::code::response;
use crate::codec::RemotingCommand;

pub(crate) async fn send_half<B: MessagingApi>(
    _ctx: &Ctx<B>,
    _req: &RemotingCommand,
    _header: &SendHeader,
    _message: Message,
) -> Handled {
    Err(Fail::new(
        response::NO_PERMISSION,
        "transactional messages are not supported by this broker yet",
    ))
}

pub(crate) async fn end_transaction<B: MessagingApi>(
    _ctx: &Ctx<B>,
    _req: &RemotingCommand,
) -> Handled {
    Err(Fail::new(
        response::NO_PERMISSION,
        "transactional messages are not supported by this broker yet",
    ))
}
