//! The crate's one error type: what the broker server and the client can fail with.

use std::net::SocketAddr;
use std::time::Duration;

/// Everything this crate's server and client report. A broker's or NameServer's
/// refusal carries its RocketMQ response code and remark.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    /// A recent connect failed; the next attempt waits for its back-off.
    #[error("{addr} is unreachable (retrying in {retry_in:?})")]
    Unreachable { addr: String, retry_in: Duration },

    #[error("the connection to {addr} closed")]
    ConnectionClosed { addr: String },

    #[error("no answer from {addr} within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },

    #[error("cannot encode the request: {0}")]
    Codec(#[from] rocketgate_remoting::codec::CodecError),

    /// The peer answered with a failure code.
    #[error("{addr} answered code {code}: {remark}")]
    Refused {
        addr: String,
        code: i32,
        remark: String,
    },

    /// The peer's answer does not parse.
    #[error("malformed answer from {addr}: {what}")]
    Protocol { addr: String, what: String },

    #[error("no NameServer knows a route for topic {topic:?}")]
    NoRoute { topic: String },

    #[error("no NameServer address configured")]
    NoNameServer,

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("TLS: {0}")]
    Tls(#[from] rocketgate_tls::Error),

    #[error("the client is shut down")]
    Shutdown,

    /// Every attempt of a send failed; the last failure is the source.
    #[error("send failed after {attempts} attempt(s)")]
    SendFailed {
        attempts: u32,
        #[source]
        last: Box<Error>,
    },
}

impl From<rocketgate_remoting::Error> for Error {
    /// The link's failures keep the variants this crate always reported them as.
    fn from(e: rocketgate_remoting::Error) -> Self {
        use rocketgate_remoting::Error as Link;
        match e {
            Link::Connect { addr, source } => Error::Connect { addr, source },
            Link::ConnectionClosed { addr } => Error::ConnectionClosed { addr },
            Link::Timeout { addr, timeout } => Error::Timeout { addr, timeout },
            Link::Codec(e) => Error::Codec(e),
        }
    }
}

impl Error {
    /// The RocketMQ response code, when a peer refused.
    pub fn code(&self) -> Option<i32> {
        match self {
            Error::Refused { code, .. } => Some(*code),
            Error::SendFailed { last, .. } => last.code(),
            _ => None,
        }
    }
}
