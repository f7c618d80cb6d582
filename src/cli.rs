//! Command-line flags. Each flag becomes a config [`Override`], so flags, environment and
//! the TOML file share one set of names and one validation.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use rocketgate_config::{Config, Override, env_overrides, parse_listen};

#[derive(Debug, Parser)]
#[command(
    name = "rocketgate",
    version,
    about = "A durable message broker: RocketMQ-style core, MQTT/HTTP/WebSocket/native doors"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of `standalone`, accepted without the subcommand too.
    #[command(flatten)]
    pub standalone: StandaloneArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// NameServer + broker + every gateway in one process (the default).
    Standalone(StandaloneArgs),
    /// A NameServer alone.
    Namesrv(NamesrvArgs),
    /// A broker that registers with the given NameServers.
    Broker(BrokerArgs),
    /// Checks a stopped node's data directory: every record's checksums, and the
    /// consume queues and index against the commit log (docs/reliability.md).
    /// Exit code 0: no problems; 5: problems found.
    Verify(CheckArgs),
    /// Repairs a stopped node's data directory: truncates a bad tail,
    /// quarantines damaged records, rebuilds consume queues and index from the
    /// commit log (docs/reliability.md). Exit code 0 when it verifies clean after.
    Repair(CheckArgs),
    /// Benchmarks (see docs/benchmarks.md).
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    Bench(rocketgate_bench::Command),
    /// Stands in for `bench` in a build without it, so asking for a benchmark says
    /// why there is none instead of "unrecognized subcommand".
    #[cfg(not(feature = "bench"))]
    #[command(hide = true, disable_help_flag = true)]
    Bench {
        #[arg(num_args = 0.., allow_hyphen_values = true, trailing_var_arg = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Clone, Args, Default)]
pub struct CommonArgs {
    /// TOML config file (see rocketgate.example.toml).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory (commit log, queues, index, checkpoints).
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Args, Default)]
pub struct StandaloneArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Embedded NameServer listen address (PORT or HOST:PORT; 0 = any free port).
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub namesrv: Option<std::net::SocketAddr>,
    /// Native (RocketMQ remoting) listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub native: Option<std::net::SocketAddr>,
    /// MQTT listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub mqtt: Option<std::net::SocketAddr>,
    /// HTTP listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub http: Option<std::net::SocketAddr>,
    /// WebSocket listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub ws: Option<std::net::SocketAddr>,
}

/// Flags of `verify` and `repair` (the data directory and store settings come
/// from the same config, environment and `--data-dir` as the node's).
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct NamesrvArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Listen address (PORT or HOST:PORT; 0 = any free port).
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// NameServers to register with, `host:port` separated by `;`.
    #[arg(long, value_name = "A;B")]
    pub namesrv: Option<String>,
    /// Native (RocketMQ remoting) listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub native: Option<std::net::SocketAddr>,
    /// Broker name.
    #[arg(long)]
    pub name: Option<String>,
    /// WebSocket listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub ws: Option<std::net::SocketAddr>,
}

impl CommonArgs {
    /// Loads the config: defaults, file, `ROCKETGATE_*` environment, then `flags`.
    pub fn load(&self, mut flags: Vec<Override>) -> anyhow::Result<Config> {
        let mut overrides = env_overrides(std::env::vars());
        if let Some(dir) = &self.data_dir {
            flags.push(Override::new(
                "data_dir",
                format!(
                    "\"{}\"",
                    dir.display()
                        .to_string()
                        .replace('\\', "\\\\")
                        .replace('"', "\\\"")
                ),
                "flag --data-dir",
            ));
        }
        overrides.append(&mut flags);
        Ok(Config::load(self.config.as_deref(), &overrides)?)
    }
}

/// A listen flag as a config override.
pub fn listen_flag(
    out: &mut Vec<Override>,
    key: &str,
    flag: &str,
    addr: Option<std::net::SocketAddr>,
) {
    if let Some(a) = addr {
        out.push(Override::new(
            &format!("listen.{key}"),
            a.to_string(),
            &format!("flag --{flag}"),
        ));
    }
}
