//! # rocketgate-core
//!
//! The storage engine and the broker semantics of rocketgate, RocketMQ-style.
//! This crate owns every byte on disk and every rule about who gets which message.
//! It must not know any wire protocol: no sockets, no HTTP/MQTT/remoting types.
//! Gateways decode their protocol, call into this crate, and encode the answer.
//!
//! Where to start reading:
//! - [`store::record`] — the on-disk message layout (RocketMQ's), shared with the
//!   native gateway so a pull response is the stored bytes.
//! - [`store::commit_log`] — the append-only, memory-mapped log of every message.
//! - [`store::consume_queue`] and [`store::index`] — the per-queue and per-key views.
//! - [`store::Store`] — ties them together: dispatch, flush, checkpoint, recovery,
//!   retention. Start here.

pub mod broker;
pub mod error;
pub mod store;

pub use error::{Error, Result};
