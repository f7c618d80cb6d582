//! The `rocketgate` binary: parses flags into a [`Config`], then starts a standalone
//! broker (embedded NameServer + broker + gateways), a NameServer alone, a broker alone,
//! or a benchmark (the `rocketgate-bench` crate, behind the default `bench` feature).
//! All wiring of the crates happens here and nowhere else.

#![forbid(unsafe_code)]

mod admin;
mod channel_tls;
mod cli;
mod cluster_client;
mod controller;
mod ha;
mod limits;
mod node;
mod provenance;
mod proxy;
mod role;
mod run;
mod serve;
mod signal;
mod users;

use clap::Parser;

/// Every door allocates per message (request structs, headers, JSON); glibc's
/// malloc/free were ~14 % of an HTTP publish's CPU, mimalloc's thread-local free
/// lists cut most of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        // `rocketgate admin` promises scripts exit code 1 for bad arguments
        // (clap's own is 2, which the admin CLI uses for "not found").
        Err(e) if e.use_stderr() && std::env::args().nth(1).as_deref() == Some("admin") => {
            let _ = e.print();
            return std::process::ExitCode::from(admin::exit::USAGE);
        }
        Err(e) => e.exit(),
    };
    if let Some(cli::Command::Admin(args)) = cli.command {
        return std::process::ExitCode::from(admin::run(args));
    }
    // openraft logs every unreachable peer at info/error while a controller waits for
    // the others: warn keeps a controller's log readable (RUST_LOG overrides).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run::main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocketgate: {e:#}");
            let code = exit_code(&e);
            match code {
                EXIT_DATA_DIR_LOCKED => eprintln!(
                    "rocketgate: stop the other process, or give this one its own --data-dir"
                ),
                EXIT_DISK_UNUSABLE => eprintln!(
                    "rocketgate: the data directory's file system is full or read-only; \
                     free space (or remount it read-write) and start again"
                ),
                _ => {}
            }
            std::process::ExitCode::from(code)
        }
    }
}

/// The exit code for a failed run, so scripts and supervisors can tell "another
/// node has this data directory" and "the disk cannot take writes" (neither is
/// fixed by restarting) from other failures (docs/reliability.md).
fn exit_code(e: &anyhow::Error) -> u8 {
    use rocketgate_core::Error as CoreError;
    if e.downcast_ref::<run::ProblemsFound>().is_some() {
        return EXIT_PROBLEMS_FOUND;
    }
    let core = e.chain().find_map(|c| c.downcast_ref::<CoreError>());
    match core {
        Some(CoreError::DataDirLocked { .. }) => EXIT_DATA_DIR_LOCKED,
        Some(c) if c.is_out_of_space() || c.is_read_only() => EXIT_DISK_UNUSABLE,
        Some(CoreError::DiskFull { .. }) => EXIT_DISK_UNUSABLE,
        _ => 1,
    }
}

/// Another process holds the data directory's lock.
const EXIT_DATA_DIR_LOCKED: u8 = 3;
/// The data directory's file system is full or read-only.
const EXIT_DISK_UNUSABLE: u8 = 4;
/// `verify` (or `repair`, after repairing) found problems in the data directory.
const EXIT_PROBLEMS_FOUND: u8 = 5;
