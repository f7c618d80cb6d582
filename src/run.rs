//! Starting processes: standalone, namesrv, broker, bench.

use anyhow::Context;
use rocketgate_config::{Config, Override};

use crate::cli::{CheckArgs, Cli, Command, StandaloneArgs, TruncateArgs, listen_flag};

pub fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None => standalone(cli.standalone),
        Some(Command::Standalone(args)) => standalone(args),
        Some(Command::Namesrv(args)) => {
            let mut flags = Vec::new();
            listen_flag(&mut flags, "namesrv", "listen", args.listen);
            let run = crate::cli::ControllerRunArgs {
                id: args.controller_id,
                listen: args.controller_listen.clone(),
                peers: args.controller_peers.clone(),
                ..Default::default()
            };
            run.overrides(&mut flags);
            let config = args.common.load(flags)?;
            namesrv(config, args.controller)
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
        Some(Command::Proxy(args)) => {
            let mut flags = Vec::new();
            listen_flag(&mut flags, "ws", "ws", args.ws);
            listen_flag(&mut flags, "mqtt", "mqtt", args.mqtt);
            listen_flag(&mut flags, "http", "http", args.http);
            if let Some(list) = &args.namesrv {
                flags.push(Override::new(
                    "broker.namesrv_addrs",
                    format!("\"{list}\""),
                    "flag --namesrv",
                ));
            }
            let config = args.common.load(flags)?;
            runtime()?.block_on(crate::proxy::run(config))
        }
        Some(Command::Controller(args)) => match args.admin {
            Some(admin) => {
                // `controller.ca` (config file or ROCKETGATE_CONTROLLER__CA) for TLS.
                let config = args.run.common.load(Vec::new())?;
                runtime()?.block_on(crate::controller::admin(admin, &config))
            }
            None => {
                let mut flags = Vec::new();
                args.run.overrides(&mut flags);
                let config = args.run.common.load(flags)?;
                runtime()?.block_on(crate::controller::run(config))
            }
        },
        Some(Command::User(cmd)) => crate::users::run(cmd),
        // Exits with the admin CLI's own codes (main.rs handles it first).
        Some(Command::Admin(_)) => unreachable!("admin is run by main"),
        Some(Command::Verify(args)) => check(&args, false),
        Some(Command::Repair(args)) => check(&args, true),
        Some(Command::Truncate(args)) => truncate(&args),
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
    rt.block_on(crate::serve::standalone(config))
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

/// `rocketgate truncate` (offline, like `repair`).
fn truncate(args: &TruncateArgs) -> anyhow::Result<()> {
    let config = args.common.load(Vec::new())?;
    let settings = crate::node::store_options(&config);
    let dir = &config.data_dir;
    let report = rocketgate_core::store::truncate::truncate(dir, &settings, args.to)
        .with_context(|| format!("truncating the log of {} at {}", dir.display(), args.to))?;
    // The broker's positions move back when it opens the store; do it now, so the
    // directory is consistent when this command returns.
    let store = std::sync::Arc::new(
        rocketgate_core::store::Store::open(dir, settings, Default::default())
            .context("reopening the store")?
            .0,
    );
    let broker = rocketgate_core::broker::Broker::open(
        store.clone(),
        crate::node::broker_options(&config),
        std::sync::Arc::new(rocketgate_core::clock::SystemClock),
    )
    .context("reopening the broker")?;
    broker.close().context("closing the broker")?;
    drop(broker);
    store.close().context("closing the store")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if report.removed_bytes == 0 {
        println!("the log already ends at {}: nothing cut", report.new_end);
    } else {
        println!(
            "cut the log from {} back to {} ({} bytes, kept in {}); {} records dispatched again",
            report.old_end,
            report.new_end,
            report.removed_bytes,
            report.kept_in.display(),
            report.redispatched_records
        );
    }
    Ok(())
}

fn namesrv(config: Config, controller: bool) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(crate::node::namesrv(config, controller))
}

fn broker(config: Config) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(crate::serve::broker(config))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    // Every server command builds its runtime here: one place for the limit.
    crate::limits::raise_fd_limit();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
