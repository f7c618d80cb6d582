//! What the native door does with a connection of the shared remoting server loop
//! ([`rocketgate_remoting::server::serve`]): registers its outbound side with
//! [`Clients`](super::clients::Clients) (so the broker can push requests to the client),
//! runs each request through `handle.rs`, and on close forgets the connection and takes
//! its consumers out of their groups. The loop owns the socket; a request that has to
//! wait (a long-polling pull, a sync-flush send) runs as a task of its connection, so
//! closing the connection cancels its suspended pulls.

use std::sync::Arc;

use rocketgate_core::broker::MessagingApi;
use rocketgate_remoting::RemotingCommand;
pub(crate) use rocketgate_remoting::server::Peer;
use rocketgate_remoting::server::{Answer, Handler, Outbound};

use super::Ctx;
use super::access::ConnAccess;
use super::handle;
use super::reply::Fail;

/// The native door's [`Handler`]: every connection shares the server's context.
pub(super) struct Door<B> {
    pub ctx: Arc<Ctx<B>>,
}

/// One connection: who it is, and its last grant (see `access.rs`).
pub(super) struct Conn {
    peer: Peer,
    access: ConnAccess,
}

impl<B: MessagingApi + 'static> Handler for Door<B> {
    type Session = Conn;

    fn open(&self, peer: Peer, outbound: Outbound) -> Conn {
        self.ctx.clients.connected(peer.id, outbound);
        Conn {
            peer,
            access: ConnAccess::default(),
        }
    }

    fn handle(&self, conn: &mut Conn, req: RemotingCommand) -> Answer {
        if let Err(Fail { code, remark }) = conn.access.authorize(&self.ctx.settings.auth, &req) {
            tracing::debug!(peer = %conn.peer.addr, code = req.code, %remark, "request refused");
            return Answer::Now(RemotingCommand::response_to(&req, code).with_remark(remark));
        }
        let peer = &mut conn.peer;
        // Most requests (a send under async flush, admin requests) complete without
        // waiting; the loop then answers them inline on its first poll.
        let ctx = self.ctx.clone();
        let peer = *peer;
        Answer::Later(Box::pin(
            async move { handle::handle(&ctx, peer, req).await },
        ))
    }

    async fn close(&self, conn: Conn, _why: &str) {
        let peer = conn.peer;
        let departed = self.ctx.clients.disconnected(peer.id);
        if let Some(client_id) = departed.client_id {
            for group in departed.consumer_groups {
                super::consumer::member_left(&self.ctx, &group, &client_id).await;
            }
        }
    }
}
