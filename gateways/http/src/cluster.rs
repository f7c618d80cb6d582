//! The cluster view for `GET /v1/cluster`: one `GET_BROKER_CLUSTER_INFO`
//! request to a NameServer over the native remoting codec (the shared wire
//! library, not the native door's server). NameServers are tried in order; the
//! first that answers wins.

use std::time::Duration;

use bytes::BytesMut;
use rocketgate_native::code::{request, response};
use rocketgate_native::protocol::{ClusterInfo, from_json};
use rocketgate_native::{FrameCodec, LanguageCode, RemotingCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{Error, Result};

/// How long one NameServer gets to answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Asks the NameServers in turn; returns who answered and what.
pub(crate) async fn query(addrs: &[String]) -> Result<(String, ClusterInfo)> {
    if addrs.is_empty() {
        return Err(Error::NameServer {
            reason: "no NameServer address is configured (http.namesrv_addrs)".into(),
        });
    }
    let mut failures = Vec::new();
    for addr in addrs {
        match tokio::time::timeout(TIMEOUT, ask(addr)).await {
            Ok(Ok(info)) => return Ok((addr.clone(), info)),
            Ok(Err(why)) => failures.push(format!("{addr}: {why}")),
            Err(_) => failures.push(format!("{addr}: no answer within {TIMEOUT:?}")),
        }
    }
    Err(Error::NameServer {
        reason: failures.join("; "),
    })
}

async fn ask(addr: &str) -> Result<ClusterInfo, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let codec = FrameCodec::default();
    let cmd = RemotingCommand {
        code: request::GET_BROKER_CLUSTER_INFO,
        language: LanguageCode::Rust,
        version: rocketgate_native::code::version::CURRENT,
        opaque: 1,
        ..Default::default()
    };
    let mut out = BytesMut::new();
    codec.encode(&cmd, &mut out).map_err(|e| e.to_string())?;
    stream
        .write_all(&out)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut buf = BytesMut::with_capacity(4096);
    let reply = loop {
        if let Some(frame) = codec.decode(&mut buf).map_err(|e| e.to_string())? {
            break frame;
        }
        let n = stream
            .read_buf(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("connection closed before the answer".into());
        }
    };
    if reply.code != response::SUCCESS {
        return Err(format!(
            "answered code {}: {}",
            reply.code,
            reply.remark.unwrap_or_default()
        ));
    }
    from_json(&reply.body).map_err(|e| format!("bad cluster info: {e}"))
}
