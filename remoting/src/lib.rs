//! # rocketgate-remoting
//!
//! RocketMQ's *remoting* protocol, shared by every part of rocketgate that speaks it (the
//! NameServer, the native door's broker server and Rust client, the HTTP door's cluster
//! view, the broker's NameServer registration). It owns the frame [`codec`] (pure: no
//! tokio, no sockets), the request/response [`code`]s, the JSON bodies of the NameServer
//! [`protocol`] and the header field names and bodies of the broker protocol ([`body`]);
//! on tokio, one framed [`client::Link`] (a request matched to its response by opaque),
//! one server loop ([`server::serve`]) and the broker's [`Registrar`], which keeps a
//! broker registered with every NameServer.
//!
//! It must not know about storage or any door: nothing here depends on `rocketgate-core`,
//! and what a request *means* is the business of the [`server::Handler`] a caller plugs
//! in. The codec modules must never grow I/O; sockets live in `client.rs`, `server.rs`
//! and `registrar.rs` only.
//!
//! Start reading at [`codec::FrameCodec::decode`], then [`protocol`]; for the networking
//! side [`server::serve`] and [`client::Link::call`]. `docs/remoting.md` has the byte
//! layout with worked examples.
// One audited `unsafe` (skipping a second UTF-8 check of ext fields, `codec/fields.rs`)
// is allowed where it stands; anything else is refused.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod body;
pub mod client;
pub mod code;
pub mod codec;
mod error;
pub mod ha;
pub mod protocol;
mod registrar;
pub mod server;

pub use codec::{CodecError, FrameCodec, LanguageCode, RemotingCommand, SerializeType};
pub use error::Error;
pub use registrar::{
    BrokerIdentity, Connector, Registrar, RegistrarHandle, Registrations, Signer, TopicSource,
};
