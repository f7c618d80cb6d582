//! `rocketgate bench …`: load generators that print throughput, latency percentiles and
//! peak memory, and compare against a ceiling measured in the same run (a raw disk, a
//! trivial MQTT forwarder, an in-process native sink), plus `prefault`, the probe behind
//! the commit log's read-ahead advice.
//!
//! It owns the measuring side only: it drives the broker through its public crates
//! (`rocketgate-core`'s store and broker, the native door's client and server) or over a
//! socket, and must never be a dependency of those crates or carry code the broker
//! needs. The `rocketgate` binary links it behind its default-on `bench` feature, so a
//! `--no-default-features` build leaves it out (docs/benchmarks.md, "Build and binary
//! size"; the crates it depends on are all ones the broker uses too, so what that build
//! saves is this crate's code).
//!
//! Errors are `anyhow`: every one ends as a message printed by the command, and no
//! caller matches on them. Start reading at [`Command`] (one variant per subcommand,
//! each module named after it), then `stats.rs`, the percentiles all of them share.

// Raw syscalls (rlimits, signals, a probe's mapping): each unsafe block says why.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod auth;
pub mod consume;
pub mod fifo;
pub mod mqtt;
pub mod native;
mod native_sink;
mod node;
pub mod prefault;
pub mod proxy;
pub mod soak;
mod stats;
pub mod store;
pub mod ws;

use clap::Subcommand;

/// The `rocketgate bench` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Append throughput and latency of the storage engine, against the raw disk.
    Store(store::StoreBenchArgs),
    /// Catch-up read rate and long-poll wake-up latency through the broker's pull.
    Consume(consume::ConsumeBenchArgs),
    /// MQTT load generator for any MQTT 3.1.1 broker (rocketgate or a peer).
    Mqtt(mqtt::MqttBenchArgs),
    /// A trivial in-memory MQTT forwarder: the load generator's own ceiling.
    MqttSink(mqtt::sink::SinkArgs),
    /// Producers and a push consumer on the Rust client through the native door.
    Native(native::NativeBenchArgs),
    /// Fan-out through the WebSocket door: 1 publisher -> N subscribers.
    Ws(ws::WsBenchArgs),
    /// Time of first writes into a fresh file mapping, with and without MADV_RANDOM.
    Prefault(prefault::PrefaultArgs),
    /// What authentication and a large ACL cost at the MQTT door (issue #26).
    Auth(auth::AuthBenchArgs),
    /// POP receive of an ordered (FIFO) group against a concurrent one, same run.
    Fifo(fifo::FifoBenchArgs),
    /// The MQTT door over a broker in-process against over `RemoteBroker` (the
    /// broker API through the native door), same run (issue #29).
    Proxy(proxy::ProxyBenchArgs),
    /// Mixed traffic on every door for minutes: RSS, descriptors and p99 per minute
    /// to CSV and an SVG chart; fails on growth or a stopped door (issue #25).
    Soak(soak::SoakArgs),
}

/// Runs one `rocketgate bench` subcommand.
pub fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Store(args) => store::run(args),
        Command::Consume(args) => consume::run(args),
        Command::Mqtt(args) => mqtt::run(args),
        Command::MqttSink(args) => mqtt::sink::run(args),
        Command::Native(args) => native::run(args),
        Command::Ws(args) => ws::run(args),
        Command::Prefault(args) => prefault::run(args),
        Command::Auth(args) => auth::run(args),
        Command::Fifo(args) => fifo::run(args),
        Command::Proxy(args) => proxy::run(args),
        Command::Soak(args) => soak::run(args),
    }
}
