//! Starting processes: standalone, namesrv, broker, bench.

use anyhow::Context;
use rocketgate_config::{Config, Override};

use crate::cli::{Cli, Command, StandaloneArgs, listen_flag};

pub fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None => standalone(cli.standalone),
        Some(Command::Standalone(args)) => standalone(args),
        Some(Command::Namesrv(args)) => {
            let mut flags = Vec::new();
            listen_flag(&mut flags, "namesrv", "listen", args.listen);
            let config = args.common.load(flags)?;
            namesrv(config)
        }
        Some(Command::Broker(args)) => {
            let mut flags = Vec::new();
            listen_flag(&mut flags, "native", "native", args.native);
            listen_flag(&mut flags, "ws", "ws", args.ws);
            listen_flag(&mut flags, "mqtt", "mqtt", args.mqtt);
            listen_flag(&mut flags, "http", "http", args.http);
            args.group.overrides(&mut flags);
            if let Some(list) = &args.namesrv {
                flags.push(Override::new(
                    "broker.namesrv_addrs",
                    format!("\"{list}\""),
                    "flag --namesrv",
                ));
            }
            if let Some(name) = &args.name {
                flags.push(Override::new(
                    "broker.name",
                    format!("\"{name}\""),
                    "flag --name",
                ));
            }
            let config = args.common.load(flags)?;
            broker(config)
        }
        Some(Command::User(cmd)) => crate::users::run(cmd),
        #[cfg(feature = "bench")]
        Some(Command::Bench(cmd)) => rocketgate_bench::run(cmd),
        #[cfg(not(feature = "bench"))]
        Some(Command::Bench { .. }) => anyhow::bail!(
            "this rocketgate was built without benchmarks (cargo's `--no-default-features`); \
             build with the default `bench` feature for `rocketgate bench`"
        ),
    }
}

fn standalone(args: StandaloneArgs) -> anyhow::Result<()> {
    let mut flags = Vec::new();
    listen_flag(&mut flags, "namesrv", "namesrv", args.namesrv);
    listen_flag(&mut flags, "native", "native", args.native);
    listen_flag(&mut flags, "mqtt", "mqtt", args.mqtt);
    listen_flag(&mut flags, "http", "http", args.http);
    listen_flag(&mut flags, "ws", "ws", args.ws);
    args.group.overrides(&mut flags);
    let config = args.common.load(flags)?;
    let rt = runtime()?;
    rt.block_on(crate::node::standalone(config))
}

fn namesrv(config: Config) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(crate::node::namesrv(config))
}

fn broker(config: Config) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(crate::node::broker(config))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
