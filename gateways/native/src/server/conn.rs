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

/// What the door keeps per connection.
pub(super) struct Session {
    pub peer: Peer,
    /// The verified TLS client certificate's name (TLS with mTLS), `None` without
    /// one: an unsigned request's user when `auth.certificate_identity` is on.
    pub tls_identity: Option<String>,
    /// The connection's last grant (see `access.rs`).
    access: ConnAccess,
}

/// The native door's [`Handler`]: every connection shares the server's context.
pub(super) struct Door<B> {
    pub ctx: Arc<Ctx<B>>,
}

impl<B: MessagingApi + 'static> Handler for Door<B> {
    type Session = Session;

    fn open(&self, peer: Peer, outbound: Outbound) -> Session {
        self.open_with_identity(peer, outbound, None)
    }

    fn open_with_identity(
        &self,
        peer: Peer,
        outbound: Outbound,
        tls_identity: Option<String>,
    ) -> Session {
        if let Some(id) = &tls_identity {
            tracing::info!(peer = %peer.addr, tls_identity = %id, "native connection with a client certificate");
        }
        self.ctx.clients.connected(peer.id, outbound);
        metrics::gauge!("rocketgate_connections", "protocol" => "native").increment(1.0);
        Session {
            peer,
            tls_identity,
            access: ConnAccess::default(),
        }
    }

    fn handle(&self, session: &mut Session, req: RemotingCommand) -> Answer {
        if let Err(Fail { code, remark }) = session.access.authorize(
            &self.ctx.settings.auth,
            session.peer.addr.ip(),
            session.tls_identity.as_deref(),
            &req,
        ) {
            tracing::debug!(peer = %session.peer.addr, code = req.code, %remark, "request refused");
            return Answer::Now(RemotingCommand::response_to(&req, code).with_remark(remark));
        }
        // Most requests (a send under async flush, admin requests) complete without
        // waiting; the loop then answers them inline on its first poll.
        let ctx = self.ctx.clone();
        let peer = session.peer;
        Answer::Later(Box::pin(
            async move { handle::handle(&ctx, peer, req).await },
        ))
    }

    async fn close(&self, session: Session, _why: &str) {
        metrics::gauge!("rocketgate_connections", "protocol" => "native").decrement(1.0);
        let departed = self.ctx.clients.disconnected(session.peer.id);
        if let Some(client_id) = departed.client_id {
            for group in departed.consumer_groups {
                super::consumer::member_left(&self.ctx, &group, &client_id).await;
            }
        }
    }
}
