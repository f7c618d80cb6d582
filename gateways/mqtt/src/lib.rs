//! # rocketgate-mqtt
//!
//! The MQTT door: MQTT 3.1.1 and 5.0 on one port (the version is taken from
//! CONNECT), over the core's [`MessagingApi`](rocketgate_core::broker::MessagingApi),
//! so every message lands in, and is served from, the same commit log the other
//! doors use. Also runs MQTT over any byte stream ([`Streams::serve_stream`]),
//! which the WebSocket door uses for `/mqtt`.
//!
//! Where to start reading: [`server`] (listener, sweeper), `shared.rs` (the
//! state every connection shares: session registry, the state log with the
//! retained messages), `tail.rs` (the state log's tail and keeper), then
//! `conn.rs`, one connection's task, which composes the parts of a connection
//! and routes events between them: `inbound.rs` (incoming PUBLISHes),
//! `follow.rs` (what it follows of the log: router feeds, catch-up, committed
//! offsets), `ready.rs` (messages waiting for the window), `window.rs` (the
//! outgoing window, acknowledgements), `members.rs` (its shared-subscription
//! memberships), `output.rs` (its encoded output); `conn/connect.rs` is
//! CONNECT and the end of a connection, `conn/enhanced.rs` the AUTH exchange
//! (SCRAM-SHA-256, re-authentication), `conn/packets.rs` the packets read.
//! Below them: `session.rs` (what outlives a connection), `share/` (the node's
//! shared-subscription groups, `group.rs` a group's task), `router.rs` (one
//! reader per core queue fanning out to sessions), `codec.rs` (pure framing
//! over mqttbytes, encoding `outgoing.rs`'s PUBLISH), `topic.rs` (the topic
//! mapping and wildcard matching), `message.rs` (PUBLISH <-> core message),
//! `cluster.rs` (the state log: sessions, retained messages, claims and door
//! liveness as entries of a system topic of the broker, shared by every door
//! over it; docs/mqtt.md "Where the state lives"), `state.rs` (the records, and
//! the import of an earlier version's files). Modules depend only on those
//! below them.
//!
//! ## The mapping
//! MQTT topic `T/a/b` is core topic `T` with tag `a/b`; a first level that is no
//! core topic name (empty, `$`, `.`, any UTF-8, too long) is the escaped core
//! topic `%MQTT%<percent-encoded T>` (`topic.rs`, docs/mqtt.md "Topic names"),
//! decoded again on delivery. A plain subscription
//! follows the core topics its filter can match, with one cursor per core queue
//! that is committed as the core consumer offset of group `mqtt%c%<client id>`;
//! `$share/<g>/<filter>` is the core clustering group `mqtt%s%<g>/<filter>`:
//! one task per group and core topic on this node (`share/`) rides the router's
//! batches like a session, hands each matching message to one member
//! round-robin, and commits its lowest unsettled offset per queue as that
//! group's consumer offset (the core's POP, used before, delivered 2-4x less in
//! fan-in; why is in docs/mqtt.md). Wildcards are matched here on the full MQTT
//! name.
//!
//! ## Codec choice
//! The codec is `mqttbytes` 0.6 (feature `v5`): MQTT 3.1.1 and 5.0 packets, its
//! only dependency is `bytes`. `rumqttd`'s `protocol` module is the maintained
//! descendant of the same code, but it is not a separate crate: even with
//! `default-features = false`, `rumqttd` 0.20 pulls in axum, clap, config,
//! metrics-exporter-prometheus, uuid, tracing-subscriber and more, a second
//! web framework and CLI parser in our tree for one module. `mqttbytes` is
//! unmaintained since 2021, so `codec.rs` wraps it: it frames and size-checks
//! packets itself (oversize is reported as such), reads the short v5
//! DISCONNECT forms the crate rejects, reads and writes AUTH (which it lacks;
//! `codec/auth.rs`), and lifts 3.1.1 packets into
//! the v5 model so the rest of the gateway handles one packet type.

#![forbid(unsafe_code)]

mod cluster;
mod codec;
mod conn;
mod end;
mod error;
mod follow;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
mod inbound;
mod members;
mod message;
mod meters;
mod outgoing;
mod output;
mod ready;
mod router;
pub mod server;
mod session;
mod settings;
mod share;
mod shared;
mod state;
mod sys;
mod tail;
mod topic;
mod window;

pub use error::{Error, Result};
pub use server::{Handle, Kicked, Server, SessionInfo, Settings, Streams};
pub use state::session_group;
