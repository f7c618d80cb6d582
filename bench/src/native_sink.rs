//! `rocketgate bench native --sink`: the load generator against a trivial remoting
//! sink that answers every request with SUCCESS and every send with a made-up queue
//! offset, storing nothing. What the bench reaches against it is the generator's
//! own ceiling (our Rust client plus the bench loop), measured in the same run as
//! the real broker to show which side limits a figure.

use std::sync::Arc;

use rocketgate_namesrv::{NameServer, NamesrvSettings};
use rocketgate_remoting::RemotingCommand;
use rocketgate_remoting::body::field;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::protocol::WireTopicConfig as WireTopic;
use rocketgate_remoting::server::{self, Answer, Handler, Limits, Outbound, Peer};
use tokio::net::TcpListener;

use crate::node::Node;

/// A NameServer, and a sink registered with it as broker `broker-a` serving
/// `topic` with `queues` queues.
pub(super) async fn start(topic: &str, queues: u32) -> anyhow::Result<Node> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (ns, ns_addr) =
        NameServer::bind("127.0.0.1:0".parse()?, NamesrvSettings::default()).await?;
    let ns = ns.spawn();
    let wire = WireTopic::new(topic.to_owned(), queues);
    let topics = move || vec![wire.clone()];
    let registrar = crate::node::registrar(addr, ns_addr, Arc::new(topics));
    // Runs as long as the bench process: nothing stops it.
    tokio::spawn(server::serve(
        listener,
        Arc::new(Sink),
        Limits::default(),
        std::future::pending(),
    ));
    Ok(Node {
        namesrv: ns_addr.to_string(),
        _handles: vec![Box::new(registrar), Box::new(ns)],
    })
}

/// Answers on the shared server loop, so the requests of one read leave in one write
/// as they do from the real server.
struct Sink;

impl Handler for Sink {
    /// The next made-up queue offset of this connection.
    type Session = u64;

    fn open(&self, _peer: Peer, _outbound: Outbound) -> u64 {
        0
    }

    fn handle(&self, next_offset: &mut u64, req: RemotingCommand) -> Answer {
        Answer::Now(answer(&req, next_offset))
    }

    async fn close(&self, _next_offset: u64, _why: &str) {}
}

fn answer(req: &RemotingCommand, next_offset: &mut u64) -> RemotingCommand {
    let ok = RemotingCommand::response_to(req, response::SUCCESS);
    match req.code {
        request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
            let queue = req.field("e").or(req.field(field::QUEUE_ID)).unwrap_or("0");
            let offset = *next_offset;
            *next_offset += 1;
            ok.with_static_field(field::MSG_ID, "7F00000100002A9F0000000000000000")
                .with_field(field::QUEUE_ID, queue)
                .with_field(field::QUEUE_OFFSET, offset)
                .with_static_field(field::MSG_REGION, "DefaultRegion")
                .with_static_field(field::TRACE_ON, "true")
        }
        _ => ok,
    }
}
