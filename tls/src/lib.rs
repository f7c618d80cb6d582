//! # rocketgate-tls
//!
//! TLS for every door, with rustls (the `ring` provider; no OpenSSL):
//!
//! - [`Acceptor`]: a server configuration built from PEM files (certificate chain,
//!   private key, optionally a client CA for mTLS), swapped for a new one when the
//!   files change ([`Acceptor::reload_if_changed`], polled by [`Acceptor::spawn_reload`]).
//!   A connection keeps the certificate it shook hands with; only new connections see
//!   a new one. A bad new file is logged and the old configuration kept.
//! - [`Incoming`]: a TCP listener turned into a queue of ready connections, in one of
//!   three [`Mode`]s (plain, TLS, or RocketMQ's *permissive*: TLS when the first byte
//!   is a ClientHello's `0x16`, plain otherwise). Handshakes run on tasks of their
//!   own, so a slow or silent client never holds up the accept loop.
//! - [`identity`]: the verified client certificate's name (subject CN, else the first
//!   DNS or e-mail SAN), handed to each door as `tls_identity: Option<String>`.
//! - [`origin`]: the browser `Origin` allow-list of the HTTP and WebSocket doors.
//! - [`client_config`]: a client configuration trusting a CA file (our native
//!   client, the benchmark, tests).
//!
//! This crate knows no protocol: doors take a [`Stream`] and speak theirs over it.
//! Start reading at [`Acceptor`], then [`Incoming`].

mod acceptor;
mod client;
pub mod identity;
mod incoming;
pub mod origin;
mod pem;

use std::path::PathBuf;

pub use acceptor::{Acceptor, ClientAuth, ReloadHandle, TlsSettings};
pub use client::{Dialer, client_config, client_config_with_certificate};
pub use incoming::{Conn, Incoming, Mode, Stream};
pub use origin::{OriginCheck, Origins};
pub use rustls;
pub use tokio_rustls;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {what} {path}: {reason}")]
    File {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{what} {path} holds no {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("TLS configuration rejected: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA {path} is not usable: {reason}")]
    ClientCa { path: PathBuf, reason: String },
}
