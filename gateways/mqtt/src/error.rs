//! The one error type of the crate.

use std::path::PathBuf;

/// What can go wrong in the MQTT gateway. Protocol errors of one connection end
/// that connection (with a reason code where the version has one); they never
/// reach the server's caller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("i/o error on {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt state file {path}: {reason}")]
    CorruptState { path: PathBuf, reason: String },
    #[error("socket error: {0}")]
    Socket(#[from] std::io::Error),
    #[error("core: {0}")]
    Core(#[from] rocketgate_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
