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
    /// The MQTT, HTTP and WebSocket doors over a cluster of broker groups, with no store
    /// of its own (docs/proxy.md): routes from the NameServers, sessions in the brokers.
    Proxy(ProxyArgs),
    /// A controller of automatic failover (docs/controller.md), or with `status` /
    /// `elect` an admin command to the controllers.
    Controller(ControllerArgs),
    /// Users of the user store (authentication; see docs/security.md).
    #[command(subcommand)]
    User(UserCommand),
    /// Checks a stopped node's data directory: every record's checksums, and the
    /// consume queues and index against the commit log (docs/reliability.md).
    /// Exit code 0: no problems; 5: problems found.
    Verify(CheckArgs),
    /// Repairs a stopped node's data directory: truncates a bad tail,
    /// quarantines damaged records, rebuilds consume queues and index from the
    /// commit log (docs/reliability.md). Exit code 0 when it verifies clean after.
    Repair(CheckArgs),
    /// Cuts a stopped node's commit log back to OFFSET (a record boundary), durably:
    /// what is cut is kept in `quarantine/truncated-OFFSET/`, the consume queues and
    /// index are rebuilt, consumer positions past the new ends move back to them
    /// (docs/reliability.md, "Truncation"). For a slave whose log runs past its
    /// master's, or an old master rejoining its group.
    Truncate(TruncateArgs),
    /// Operate a running node over its HTTP admin API (docs/operations.md).
    /// Exit codes: 0 ok, 1 usage or rejected, 2 not found, 3 unreachable,
    /// 4 unauthorized or forbidden.
    Admin(crate::admin::AdminArgs),
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
    /// Listen on non-loopback addresses with authentication off, deliberately
    /// (`auth.allow_anonymous`).
    #[arg(long, global = true)]
    pub allow_anonymous: bool,
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
    #[command(flatten)]
    pub group: GroupArgs,
}

/// Broker-group flags (docs/replication.md), in `standalone` and `broker`.
#[derive(Debug, Clone, Args, Default)]
pub struct GroupArgs {
    /// Replication port a master serves its slaves on (PORT or HOST:PORT).
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub ha: Option<std::net::SocketAddr>,
    /// 0 = master, > 0 = slave (`broker.id`); under a controller (`controller.addresses`), this
    /// broker's id in its group (1, 2, …) and the controller picks the master.
    #[arg(long, value_name = "N")]
    pub broker_id: Option<u64>,
    /// On a slave: the master's replication address, HOST:PORT (`ha.master`).
    #[arg(long, value_name = "HOST:PORT")]
    pub ha_master: Option<String>,
    /// On a master: `sync` or `async` acknowledgement (`ha.mode`).
    #[arg(long, value_name = "MODE")]
    pub ha_mode: Option<String>,
    /// The address registered with the NameServers and controllers instead of the
    /// listen address: HOST or HOST:PORT (`broker.advertised_address`; containers, NAT).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub advertised_address: Option<String>,
}

impl GroupArgs {
    /// The flags as config overrides.
    pub fn overrides(&self, out: &mut Vec<Override>) {
        listen_flag(out, "ha", "ha", self.ha);
        if let Some(id) = self.broker_id {
            out.push(Override::new(
                "broker.id",
                id.to_string(),
                "flag --broker-id",
            ));
        }
        if let Some(m) = &self.ha_master {
            out.push(Override::new(
                "ha.master",
                format!("\"{m}\""),
                "flag --ha-master",
            ));
        }
        if let Some(m) = &self.ha_mode {
            out.push(Override::new(
                "ha.mode",
                format!("\"{m}\""),
                "flag --ha-mode",
            ));
        }
        if let Some(a) = &self.advertised_address {
            out.push(Override::new(
                "broker.advertised_address",
                toml::Value::String(a.clone()).to_string(),
                "flag --advertised-address",
            ));
        }
    }
}

/// Flags of `proxy`.
#[derive(Debug, Clone, Args, Default)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The cluster's NameServers, `HOST:PORT;HOST:PORT` (`broker.namesrv_addrs`).
    #[arg(long, value_name = "LIST")]
    pub namesrv: Option<String>,
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

/// Flags of `truncate`.
#[derive(Debug, Clone, Args)]
pub struct TruncateArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The commit-log offset to cut at: the start of a record, at or below the end.
    #[arg(long, value_name = "OFFSET")]
    pub to: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct NamesrvArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Listen address (PORT or HOST:PORT; 0 = any free port). `--namesrv` is the same
    /// flag under the name `standalone` gives its embedded NameServer's listener.
    #[arg(long, visible_alias = "namesrv", value_name = "ADDR", value_parser = parse_listen)]
    pub listen: Option<std::net::SocketAddr>,
    /// Also run a controller in this process (`[controller]` of the config, or the
    /// --controller-* flags).
    #[arg(long)]
    pub controller: bool,
    /// The embedded controller's id (`controller.id`).
    #[arg(long, value_name = "N", requires = "controller")]
    pub controller_id: Option<u64>,
    /// The embedded controller's listen address (`controller.listen`).
    #[arg(long, value_name = "ADDR", requires = "controller")]
    pub controller_listen: Option<String>,
    /// Every controller, `1=HOST:PORT,…` (`controller.peers`).
    #[arg(long, value_name = "LIST", requires = "controller")]
    pub controller_peers: Option<String>,
}

/// `rocketgate controller`: run one (flags below), or `status` / `elect`.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ControllerArgs {
    #[command(subcommand)]
    pub admin: Option<ControllerAdmin>,
    #[command(flatten)]
    pub run: ControllerRunArgs,
}

/// Flags of a controller (`controller.*` in the config).
#[derive(Debug, Clone, Args, Default)]
pub struct ControllerRunArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// This controller's id, a key of --peers (`controller.id`).
    #[arg(long, value_name = "N")]
    pub id: Option<u64>,
    /// Where to listen, HOST:PORT; default: this id's address in --peers.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Every controller: `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT` (`controller.peers`).
    #[arg(long, value_name = "LIST")]
    pub peers: Option<String>,
}

impl ControllerRunArgs {
    /// The flags as config overrides.
    pub fn overrides(&self, out: &mut Vec<Override>) {
        if let Some(id) = self.id {
            out.push(Override::new("controller.id", id.to_string(), "flag --id"));
        }
        if let Some(l) = &self.listen {
            out.push(Override::new(
                "controller.listen",
                format!("\"{l}\""),
                "flag --listen",
            ));
        }
        if let Some(p) = &self.peers {
            out.push(Override::new(
                "controller.peers",
                format!("\"{p}\""),
                "flag --peers",
            ));
        }
    }
}

/// Admin commands to a controller group.
#[derive(Debug, Clone, Subcommand)]
pub enum ControllerAdmin {
    /// Groups, masters, epochs, in-sync sets and the brokers' liveness, from the leader.
    Status(StatusArgs),
    /// Moves a group's master: to --broker-id (alive, in the in-sync set), or to the best
    /// in-sync broker other than the current master.
    Elect(ElectArgs),
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The controllers, `HOST:PORT;HOST:PORT;…` (any of them; the leader is found).
    #[arg(long, value_name = "A;B;C")]
    pub controllers: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ElectArgs {
    /// The controllers, `HOST:PORT;HOST:PORT;…`.
    #[arg(long, value_name = "A;B;C")]
    pub controllers: String,
    /// The broker group (broker name).
    #[arg(long)]
    pub group: String,
    /// The broker to make master.
    #[arg(long, value_name = "N")]
    pub broker_id: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
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
    /// MQTT listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub mqtt: Option<std::net::SocketAddr>,
    /// HTTP listen address.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    pub http: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub group: GroupArgs,
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
        if self.allow_anonymous {
            flags.push(Override::new(
                "auth.allow_anonymous",
                "true",
                "flag --allow-anonymous",
            ));
        }
        overrides.append(&mut flags);
        let config = Config::load(self.config.as_deref(), &overrides)?;
        crate::provenance::record(self.config.as_deref(), &overrides);
        Ok(config)
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

/// `rocketgate user …` (run by `users.rs`).
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Adds a user, or changes one (what is given replaces what it had).
    Add(AddArgs),
    /// Removes a user.
    Remove {
        #[command(flatten)]
        common: CommonArgs,
        name: String,
    },
    /// Lists users (no secrets).
    List {
        #[command(flatten)]
        common: CommonArgs,
    },
}

#[derive(Debug, Args)]
pub struct AddArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The user name (MQTT user name, HTTP Basic user, JWT `sub`).
    pub name: String,
    /// The password (visible in `ps` and shell history: prefer --password-stdin).
    #[arg(long, conflicts_with = "password_stdin")]
    pub password: Option<String>,
    /// Read the password from standard input (one line).
    #[arg(long)]
    pub password_stdin: bool,
    /// A role (`admin` is built in: every action on every topic); repeatable.
    #[arg(long = "role", value_name = "ROLE")]
    pub roles: Vec<String>,
    /// Make an API key for `Authorization: Bearer` and WebSocket `?token=`; printed once.
    #[arg(long)]
    pub api_key: bool,
    /// A RocketMQ AccessKey for signed native requests (with --secret-key).
    #[arg(long, requires = "secret_key")]
    pub access_key: Option<String>,
    #[arg(long, requires = "access_key")]
    pub secret_key: Option<String>,
}
