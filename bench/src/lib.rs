//! `rocketgate bench …`: load generators that print throughput, latency percentiles and
//! peak memory, and compare against a ceiling measured in the same run.

pub mod consume;
pub mod mqtt;
pub mod native;
mod native_sink;
mod stats;
pub mod store;
pub mod ws;

/// Runs one `rocketgate bench` subcommand.
pub fn run(cmd: crate::cli::BenchCommand) -> anyhow::Result<()> {
    match cmd {
        crate::cli::BenchCommand::Store(args) => store::run(args),
        crate::cli::BenchCommand::Consume(args) => consume::run(args),
        crate::cli::BenchCommand::Mqtt(args) => mqtt::run(args),
        crate::cli::BenchCommand::MqttSink(args) => mqtt::sink::run(args),
        crate::cli::BenchCommand::Native(args) => native::run(args),
        crate::cli::BenchCommand::Ws(args) => ws::run(args),
    }
}
