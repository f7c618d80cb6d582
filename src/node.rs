//! Wiring a running node: opens the store and starts each door that exists.

use std::sync::Arc;

use anyhow::Context;
use rocketgate_config::{Config, FlushMode as ConfigFlush};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreOptions};

/// Store options from the config.
pub fn store_options(config: &Config) -> StoreOptions {
    let s = &config.store;
    StoreOptions {
        segment_size: s.segment_size.0,
        max_message_size: s.max_message_size.0 as usize,
        flush: match s.flush {
            ConfigFlush::Sync => FlushMode::Sync {
                timeout: s.sync_flush_timeout,
            },
            ConfigFlush::Async => FlushMode::Async {
                interval: s.flush_interval,
            },
        },
        checkpoint_interval: s.checkpoint_interval,
        retention: s.retention,
        retention_check_interval: s.retention_check_interval,
        disk_soft_ratio: s.disk_soft_ratio,
        disk_hard_ratio: s.disk_hard_ratio,
        consume_queue_entries_per_file: s.consume_queue_entries_per_file,
        index_slots: s.index_slots,
        index_entries_per_file: s.index_entries_per_file,
        store_host: config.listen.native,
    }
}

fn open_store(config: &Config) -> anyhow::Result<Arc<Store>> {
    let (store, report) = Store::open(
        &config.data_dir,
        store_options(config),
        StoreDeps::default(),
    )
    .with_context(|| format!("opening the store in {}", config.data_dir.display()))?;
    let p = store.positions();
    tracing::info!(
        data_dir = %config.data_dir.display(),
        unclean_shutdown = report.unclean_shutdown,
        log_end = p.written,
        flush = ?config.store.flush,
        "store open"
    );
    Ok(Arc::new(store))
}

/// `rocketgate standalone`: NameServer + broker + gateways in one process.
pub async fn standalone(config: Config) -> anyhow::Result<()> {
    let store = open_store(&config)?;
    tracing::warn!(
        "only the storage engine is built so far; the NameServer (issue #4), native (#5), MQTT (#6), \
         HTTP (#7) and WebSocket (#8) doors are not listening yet"
    );
    let shutdown = shutdown_signal()?;
    println!(
        "rocketgate standalone ready (data in {})",
        config.data_dir.display()
    );
    shutdown.await;
    tracing::info!("shutting down");
    tokio::task::spawn_blocking(move || store.close())
        .await
        .context("joining the store close")??;
    Ok(())
}

/// `rocketgate broker`.
pub async fn broker(config: Config) -> anyhow::Result<()> {
    standalone(config).await
}

/// Registers for SIGINT/SIGTERM now (so a signal that arrives right after the
/// "ready" line is not lost) and returns a future that completes on the first one.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
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
