//! Shutdown on SIGTERM / SIGINT, for every long-running subcommand.

use anyhow::Context;

/// Registers for SIGINT/SIGTERM now (so a signal that arrives right after the
/// "ready" line is not lost) and returns a future that completes on the first one.
pub fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
