//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong loading, changing or checking credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("user store {path} is not valid: {message}")]
    BadFile { path: PathBuf, message: String },
    #[error("JWT key: {0}")]
    JwtKey(String),
    #[error("{0}")]
    Invalid(String),
}

/// Why a login or a signed request was refused. The message never carries the
/// secret that was presented.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("credentials required")]
    Missing,
    #[error("bad user name or password")]
    BadCredentials,
    #[error("unknown or revoked token")]
    BadToken,
    #[error("JWT refused: {0}")]
    BadJwt(String),
    #[error("client certificates are not an identity here (auth.certificate_identity = false)")]
    CertificateNotAccepted,
    #[error("unknown AccessKey {0:?}")]
    UnknownAccessKey(String),
    #[error("request not signed (no AccessKey/Signature fields)")]
    Unsigned,
    #[error("signature does not match (AccessKey {0:?})")]
    BadSignature(String),
    #[error("too many connections from this address")]
    TooManyConnections,
    /// A SCRAM exchange that is not well formed (a wrong proof is `BadCredentials`).
    #[error("{0}")]
    Scram(crate::scram::ScramError),
}
