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
use super::handle;

/// The native door's [`Handler`]: every connection shares the server's context.
pub(super) struct Door<B> {
    pub ctx: Arc<Ctx<B>>,
}

impl<B: MessagingApi + 'static> Handler for Door<B> {
    type Session = Peer;

    fn open(&self, peer: Peer, outbound: Outbound) -> Peer {
        self.ctx.clients.connected(peer.id, outbound);
        metrics::gauge!("rocketgate_connections", "protocol" => "native").increment(1.0);
        peer
    }

    fn handle(&self, peer: &mut Peer, req: RemotingCommand) -> Answer {
        // Most requests (a send under async flush, admin requests) complete without
        // waiting; the loop then answers them inline on its first poll.
        let ctx = self.ctx.clone();
        let peer = *peer;
        Answer::Later(Box::pin(
            async move { handle::handle(&ctx, peer, req).await },
        ))
    }

    async fn close(&self, peer: Peer, _why: &str) {
        metrics::gauge!("rocketgate_connections", "protocol" => "native").decrement(1.0);
        let departed = self.ctx.clients.disconnected(peer.id);
        if let Some(client_id) = departed.client_id {
            for group in departed.consumer_groups {
                super::consumer::member_left(&self.ctx, &group, &client_id).await;
            }
        }
    }
}
