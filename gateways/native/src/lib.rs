//! # rocketgate-native
//!
//! The native door: RocketMQ's *remoting* protocol, wire-compatible with Java RocketMQ and
//! its SDKs, on the broker side and in our Rust client. This crate owns how messages
//! travel in commands ([`message`]: the stored record layout of a pull, batch bodies),
//! the broker-side [`server`] (RocketMQ clients send, pull, heartbeat, commit offsets and
//! run transactions here), the async Rust [`client`] (producer, pull and push
//! consumers, transactional producer) and the [`cluster`]: the broker API
//! (`MessagingApi`) over many broker groups, routed by the NameServers, which a proxy
//! hands to its MQTT, HTTP and WebSocket doors (`docs/proxy.md`).
//!
//! The wire itself is not here: the codec, request codes, headers and JSON bodies, the
//! framed client link, the server loop and the broker's NameServer registration are in
//! `rocketgate-remoting`, shared with the NameServer and the HTTP door.
//!
//! It must not know about storage (the core is reached through its `Broker` API only) nor
//! about other gateways, and must not grow a second codec or connection loop.
//!
//! Start reading at [`server`] (then `server/handle.rs`, the request dispatch) for the
//! broker side, at [`client`] for the client, and at [`cluster`] for the routing over
//! broker groups. `docs/native.md` lists the supported
//! request codes and the client's API.

#![forbid(unsafe_code)]

mod api;
pub mod client;
pub mod cluster;
mod error;
pub mod message;
pub mod server;

pub use error::Error;
pub use server::{Server, ServerHandle, ServerSettings, TlsMode};
