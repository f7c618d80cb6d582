//! The crate's one error type: what the framed client can fail with.

use std::time::Duration;

/// Why a remoting call (or a connect) failed. A peer's refusal is not an error here: the
/// response, whatever its code, is the caller's to judge.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    /// The connection closed (or turned unusable) before the response came.
    #[error("the connection to {addr} closed")]
    ConnectionClosed { addr: String },

    #[error("no answer from {addr} within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },

    /// The request does not fit a frame; the connection stays usable.
    #[error("cannot encode the request: {0}")]
    Codec(#[from] crate::codec::CodecError),
}
