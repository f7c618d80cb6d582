//! `rocketgate bench native --sink`: the load generator against a trivial remoting
//! sink that answers every request with SUCCESS and every send with a made-up queue
//! offset, storing nothing. What the bench reaches against it is the generator's
//! own ceiling (our Rust client plus the bench loop), measured in the same run as
//! the real broker to show which side limits a figure.

use std::sync::Arc;

use bytes::BytesMut;
use rocketgate_namesrv::{NameServer, NamesrvSettings};
use rocketgate_native::body::field;
use rocketgate_native::code::{request, response};
use rocketgate_native::protocol::TopicConfig as WireTopic;
use rocketgate_native::{FrameCodec, RemotingCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::native::Node;

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
    let registrar = super::native::registrar(addr, ns_addr, Arc::new(topics));
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let _ = sock.set_nodelay(true);
            tokio::spawn(serve(sock));
        }
    });
    Ok(Node {
        namesrv: ns_addr.to_string(),
        _handles: vec![Box::new(registrar), Box::new(ns)],
    })
}

/// Answers the requests of one read in one write, as the real server does.
async fn serve(mut sock: TcpStream) {
    let codec = FrameCodec::default();
    let mut rd = BytesMut::with_capacity(64 * 1024);
    let mut wr = BytesMut::with_capacity(64 * 1024);
    let mut next_offset = 0u64;
    loop {
        rd.reserve(64 * 1024);
        match sock.read_buf(&mut rd).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        loop {
            let req = match codec.decode(&mut rd) {
                Ok(Some(req)) => req,
                Ok(None) => break,
                Err(_) => return,
            };
            if req.is_oneway() {
                continue;
            }
            let resp = answer(&req, &mut next_offset);
            if codec.encode(&resp, &mut wr).is_err() {
                return;
            }
        }
        if !wr.is_empty() {
            if sock.write_all(&wr).await.is_err() {
                return;
            }
            wr.clear();
        }
    }
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
