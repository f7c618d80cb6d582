//! Starting processes: standalone, namesrv, broker, bench.

use anyhow::Context;
use rocketgate_config::{Config, Override};

use crate::cli::{CheckArgs, Cli, Command, StandaloneArgs, listen_flag};

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
        // Exits with the admin CLI's own codes (main.rs handles it first).
        Some(Command::Admin(_)) => unreachable!("admin is run by main"),
        Some(Command::Verify(args)) => check(&args, false),
        Some(Command::Repair(args)) => check(&args, true),
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

/// `verify` / `repair` found problems (left, for repair): exit code 5.
#[derive(Debug)]
pub struct ProblemsFound(pub u64);

impl std::fmt::Display for ProblemsFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} problem(s) in the data directory", self.0)
    }
}

impl std::error::Error for ProblemsFound {}

/// `rocketgate verify` and `rocketgate repair` (offline; a running node's lock
/// makes them refuse, exit code 3). They may move under `rocketgate admin`
/// when the operations issue adds it.
fn check(args: &CheckArgs, repair: bool) -> anyhow::Result<()> {
    use rocketgate_core::store::check;
    let config = args.common.load(Vec::new())?;
    let settings = crate::node::store_options(&config);
    let dir = &config.data_dir;
    let context = || format!("checking the data directory {}", dir.display());
    let (found, after) = if repair {
        let found = check::repair(dir, &settings).with_context(context)?;
        (
            Some(found),
            check::verify(dir, &settings).with_context(context)?,
        )
    } else {
        (None, check::verify(dir, &settings).with_context(context)?)
    };
    if args.json {
        let json = match &found {
            Some(found) => serde_json::json!({ "found": found, "after": after }),
            None => serde_json::to_value(&after)?,
        };
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        if let Some(found) = &found {
            println!("{}", found.to_text());
            println!("after repair:");
        }
        print!("{}", after.to_text());
    }
    match after.problems() {
        0 => Ok(()),
        n => Err(ProblemsFound(n).into()),
    }
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
