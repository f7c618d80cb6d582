//! The crate's one error type: what the broker server and the client can fail with.

use std::net::SocketAddr;

/// Everything this crate's server and client report. A broker's refusal carries its
/// RocketMQ response code and remark.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
