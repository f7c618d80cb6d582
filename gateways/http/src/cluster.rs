//! The cluster view for `GET /v1/cluster`: one `GET_BROKER_CLUSTER_INFO`
//! request to a NameServer over the shared remoting client. NameServers are tried
//! in order; the first that answers wins. Over TLS when `namesrv.ca` is set.

use std::time::Duration;

use rocketgate_remoting::client::Link;
use rocketgate_remoting::code::{request, response, version};
use rocketgate_remoting::protocol::{ClusterInfo, from_json};
use rocketgate_remoting::{LanguageCode, RemotingCommand};

use crate::error::{Error, Result};

/// How long one NameServer gets to answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Asks the NameServers in turn; returns who answered and what.
pub(crate) async fn query(
    addrs: &[String],
    tls: Option<&rocketgate_tls::Dialer>,
) -> Result<(String, ClusterInfo)> {
    if addrs.is_empty() {
        return Err(Error::NameServer {
            reason: "no NameServer address is configured (http.namesrv_addrs)".into(),
        });
    }
    let mut failures = Vec::new();
    for addr in addrs {
        match tokio::time::timeout(TIMEOUT, ask(addr, tls)).await {
            Ok(Ok(info)) => return Ok((addr.clone(), info)),
            Ok(Err(why)) => failures.push(format!("{addr}: {why}")),
            Err(_) => failures.push(format!("{addr}: no answer within {TIMEOUT:?}")),
        }
    }
    Err(Error::NameServer {
        reason: failures.join("; "),
    })
}

async fn ask(addr: &str, tls: Option<&rocketgate_tls::Dialer>) -> Result<ClusterInfo, String> {
    // One question per link: the link closes when it is dropped here.
    let link = match tls {
        None => Link::connect(addr, TIMEOUT, None)
            .await
            .map_err(|e| e.to_string())?,
        Some(d) => {
            let tls = d.connect(addr, TIMEOUT).await.map_err(|e| e.to_string())?;
            Link::over(addr, tls, None)
        }
    };
    let cmd = RemotingCommand {
        code: request::GET_BROKER_CLUSTER_INFO,
        language: LanguageCode::Rust,
        version: version::CURRENT,
        ..Default::default()
    };
    let reply = link.call(cmd, TIMEOUT).await.map_err(|e| e.to_string())?;
    if reply.code != response::SUCCESS {
        return Err(format!(
            "answered code {}: {}",
            reply.code,
            reply.remark.unwrap_or_default()
        ));
    }
    from_json(&reply.body).map_err(|e| format!("bad cluster info: {e}"))
}
