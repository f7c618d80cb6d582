//! The `rocketgate` binary: parses flags into a [`Config`], then starts a standalone
//! broker (embedded NameServer + broker + gateways), a NameServer alone, a broker alone,
//! or a benchmark (the `rocketgate-bench` crate, behind the default `bench` feature).
//! All wiring of the crates happens here and nowhere else.

mod cli;
mod node;
mod run;

use clap::Parser;

/// Every door allocates per message (request structs, headers, JSON); glibc's
/// malloc/free were ~14 % of an HTTP publish's CPU, mimalloc's thread-local free
/// lists cut most of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run::main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocketgate: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
