//! The door's two background tasks over the state log (`cluster.rs`):
//!
//! - the **tail** long-polls the state topic and applies every entry to the
//!   door's view, acting on what concerns it ([`Shared::act`]);
//! - the **keeper** says the door is alive, adopts doors silent past
//!   `door_timeout` (the first adoption in the log wins, so a dead door's wills
//!   are published once), and writes a snapshot when one is due.

use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::broker::MessagingApi;
use rocketgate_core::sync::lock;

use crate::cluster::{Entry, StateLog};
use crate::shared::Shared;

/// Runs until the door stops.
pub(crate) async fn tail<B: MessagingApi + 'static>(shared: Arc<Shared<B>>) {
    let mut stop = shared.shutdown.clone();
    let mut quiet = false;
    while !shared.loaded.load(std::sync::atomic::Ordering::Acquire) {
        let loaded = match StateLog::ensure_topics(&*shared.api).await {
            Ok(()) => shared.log.load(&*shared.api).await,
            Err(e) => Err(e),
        };
        match loaded {
            Ok(()) => {
                shared
                    .loaded
                    .store(true, std::sync::atomic::Ordering::Release);
                tracing::info!("MQTT state loaded");
            }
            Err(e) => {
                if !quiet {
                    tracing::warn!(error = %e, "the MQTT state topics cannot be read yet");
                    quiet = true;
                }
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
    let mut at = shared.log.applied();
    loop {
        let read = tokio::select! {
            _ = stop.changed() => return,
            r = StateLog::read(&*shared.api, at, Duration::from_millis(500)) => r,
        };
        match read {
            Ok((entries, next)) => {
                quiet = false;
                at = next.max(at);
                for e in shared.log.apply_all(entries, next) {
                    shared.act(e).await;
                }
                at = at.max(shared.log.applied());
            }
            Err(e) => {
                if !quiet {
                    tracing::warn!(error = %e, "reading the MQTT state topic failed");
                    quiet = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
    }
}

/// Runs until the door stops.
pub(crate) async fn keeper<B: MessagingApi + 'static>(shared: Arc<Shared<B>>) {
    let mut stop = shared.shutdown.clone();
    let s = &shared.settings;
    let mut tick = tokio::time::interval(s.door_liveness);
    let started_ms = crate::message::now_ms();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        shared
            .append(Entry::Alive {
                door: shared.log.me,
                at_ms: crate::message::now_ms(),
            })
            .await;
        let (orphaned, snapshot_due) = {
            let view = lock(&shared.log.view);
            let since_ms = view.last_snapshot.map_or(started_ms, |(_, at)| at);
            let age = crate::message::now_ms().saturating_sub(since_ms);
            let due = view.since_snapshot >= s.snapshot_entries
                || (view.since_snapshot > 0 && age >= s.snapshot_interval.as_millis() as i64);
            (view.orphaned(shared.log.me, s.door_timeout), due)
        };
        for dead in orphaned {
            tracing::info!(
                door = dead,
                "an MQTT door is silent past its timeout: adopting its sessions"
            );
            shared
                .append(Entry::Adopt {
                    dead,
                    by: shared.log.me,
                })
                .await;
        }
        if snapshot_due && let Err(e) = shared.log.write_snapshot(&*shared.api).await {
            tracing::warn!(error = %e, "writing an MQTT state snapshot failed");
        }
    }
}
