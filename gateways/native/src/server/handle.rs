//! Request dispatch: each request code to the handler that answers it.

use rocketgate_core::broker::MessagingApi;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::server::Peer;
use tracing::debug;

use super::reply::{Fail, ok};
use super::{Ctx, admin, api, consumer, pull, send, txn};

/// Answers one request. Never fails: a failure is a response with its code.
pub(crate) async fn handle<B: MessagingApi>(
    ctx: &Ctx<B>,
    peer: Peer,
    req: RemotingCommand,
) -> RemotingCommand {
    if rocketgate_remoting::code::api::is_api(req.code) {
        return api::handle(ctx, peer, &req).await;
    }
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
