//! # rocketgate-namesrv
//!
//! The NameServer: brokers register their topics here, clients ask it for routes. It owns
//! the route table (brokers, addresses, queues, liveness), the KV config, and the
//! [`Handler`](rocketgate_remoting::server::Handler) that answers RocketMQ remoting
//! requests from both over the shared server loop. NameServers never talk to each other; a
//! broker registers with each of them (see `rocketgate_remoting::Registrar`).
//!
//! It must not touch storage or know about gateways: it depends on `rocketgate-config` and
//! `rocketgate-remoting` only (codec, server loop), and keeps all its state in memory.
//!
//! Start reading at [`routes::RouteTable`] (the pure expiry state machine), then
//! [`handler::handle`] (request -> response), then [`NameServer::run`] (the server loop and the liveness scan).

#![forbid(unsafe_code)]

pub mod handler;
pub mod kv;
pub mod routes;
mod server;

use std::time::Duration;

pub use server::{NameServer, NameServerHandle};

/// NameServer tuning, usually from `rocketgate_config::NamesrvConfig`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamesrvSettings {
    /// How often silent brokers are looked for (Java: 10 s).
    pub scan_interval: Duration,
    /// A broker silent for longer than this is dropped (Java: 120 s).
    pub broker_expiry: Duration,
    /// Largest accepted frame; a longer length prefix closes that connection.
    pub max_frame_len: usize,
}

impl Default for NamesrvSettings {
    fn default() -> Self {
        NamesrvSettings::from(&rocketgate_config::NamesrvConfig::default())
    }
}

impl From<&rocketgate_config::NamesrvConfig> for NamesrvSettings {
    fn from(c: &rocketgate_config::NamesrvConfig) -> Self {
        NamesrvSettings {
            scan_interval: c.scan_interval,
            broker_expiry: c.broker_expiry,
            max_frame_len: rocketgate_remoting::codec::DEFAULT_MAX_FRAME_LEN,
        }
    }
}

/// Why the NameServer could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}
