//! # rocketgate-websocket
//!
//! The WebSocket door: browsers (and any WebSocket client) consume and publish
//! through a small JSON protocol on `/v1/ws`, and MQTT over WebSocket is handed
//! to whoever serves MQTT on `/mqtt` (subprotocol `mqtt`).
//!
//! It owns the WebSocket handshake, the JSON protocol, per-connection flow
//! control (credits and a bounded outbound buffer) and the mapping of a
//! subscription onto the core: clustering subscriptions use POP, broadcasting
//! ones use pull with per-subscriber committed offsets. It does not speak MQTT:
//! `/mqtt` turns the WebSocket into a byte stream ([`WsByteStream`]) and passes
//! it to a [`StreamHandler`] the binary plugs in. It never touches the store
//! directly; everything goes through [`MessagingApi`].
//!
//! Start reading at [`Server`] (accept loop and routing), then `handshake.rs`
//! (HTTP upgrade, paths, subprotocols, the [`Authenticator`] seam),
//! `connection.rs` (one `/v1/ws` socket: requests in, frames out),
//! `subscription.rs` (the task that feeds one subscription) and `protocol.rs`
//! (the JSON frames). The protocol reference is `docs/websocket.md`.

#![forbid(unsafe_code)]

mod auth;
mod connection;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
mod handshake;
mod meters;
mod protocol;
mod server;
mod settings;
mod stream;
mod subscription;

pub use auth::{AllowAll, AuthAttempt, AuthDecision, Authenticator, Door};
pub use connection::{Subscriber, Subscribers};
pub use rocketgate_core::broker::MessagingApi;
pub use server::{Handle, Hooks, Server};
pub use settings::Settings;
pub use stream::{StreamHandler, WsByteStream};

use std::net::SocketAddr;

/// What can go wrong starting the WebSocket door. Problems of one connection
/// never surface here: they end that connection with a close code or an
/// `error` frame.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid WebSocket settings: {0}")]
    Settings(String),
}
