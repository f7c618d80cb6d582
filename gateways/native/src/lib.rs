//! # rocketgate-native
//!
//! The native door: RocketMQ's *remoting* protocol, wire-compatible with Java RocketMQ and
//! its SDKs. This crate owns the frame [`codec`] (pure, no tokio, no sockets; shared by the
//! NameServer, the broker-side server and our Rust client), the request/response [`code`]s,
//! the JSON bodies of the NameServer [`protocol`] and of the broker ([`body`]), how messages
//! travel in commands ([`message`]), the broker's [`Registrar`], which keeps a broker
//! registered with every NameServer, the broker-side [`server`] (RocketMQ clients send,
//! pull, heartbeat, commit offsets and run transactions here) and the async Rust
//! [`client`] (producer, pull and push consumers, transactional producer).
//!
//! It must not know about storage (the core is reached through its `Broker` API only) nor
//! about other gateways; the codec must never grow I/O.
//!
//! Start reading at [`codec::FrameCodec::decode`], then [`protocol`], then [`Registrar`];
//! for the broker side [`server`] (then `server/handle.rs`), for the client [`client`].
//! `docs/remoting.md` has the byte layout with worked examples, `docs/native.md` the
//! supported request codes and the client's API.

pub mod body;
pub mod client;
pub mod code;
pub mod codec;
mod error;
pub mod message;
pub mod protocol;
mod registrar;
pub mod server;

pub use codec::{CodecError, FrameCodec, LanguageCode, RemotingCommand, SerializeType};
pub use error::Error;
pub use registrar::{BrokerIdentity, Registrar, RegistrarHandle, TopicSource};
pub use server::{Server, ServerHandle, ServerSettings};
