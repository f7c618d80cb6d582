//! The door's two background tasks over the state log (`cluster.rs`):
//!
//! - the **tail** long-polls the state topic and applies every entry to the
//!   door's view, acting on what concerns it: another door's connection claimed
//!   a client id this door holds (the connection is closed with 0x8E and its
//!   session released to the log) or keeps offline (dropped; its will published
//!   when the claim is a clean start), this door adopted a dead door's
//!   sessions (they become its offline sessions, their wills scheduled);
//! - the **keeper** says the door is alive, adopts doors silent past
//!   `door_timeout` (the first adoption in the log wins, so a dead door's wills
//!   are published once), and writes a snapshot when one is due.

use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::broker::MessagingApi;
use rocketgate_core::sync::lock;

use crate::cluster::{Effect, Entry, StateLog};
use crate::shared::{Shared, Slot, Takeover};

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
                    act(&shared, e).await;
                }
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

async fn act<B: MessagingApi + 'static>(shared: &Arc<Shared<B>>, effect: Effect) {
    match effect {
        Effect::Claimed { client, clean } => {
            let slot = {
                let mut sessions = lock(&shared.sessions);
                match sessions.get(&client) {
                    Some(_) => sessions.remove(&client),
                    None => None,
                }
            };
            match slot {
                Some(Slot::Online {
                    conn_id, takeover, ..
                }) => {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let handed = if takeover.send(Takeover::new(tx)).is_ok() {
                            tokio::time::timeout(Duration::from_secs(5), rx)
                                .await
                                .ok()
                                .and_then(Result::ok)
                        } else {
                            None
                        };
                        // (None: the connection ended by itself meanwhile and
                        // released the session on its way out.)
                        if let Some(mut session) = handed {
                            if clean && let Some(w) = session.will.take() {
                                shared.fire_will(&client, w.to_publish()).await;
                            }
                            shared.save_session(&session, conn_id, true).await;
                            tracing::debug!(client = %client, "session taken over by another door");
                        }
                    });
                }
                Some(Slot::Offline { mut session, .. }) => {
                    if clean && let Some(w) = session.will.take() {
                        shared.fire_will(&client, w.to_publish()).await;
                    }
                }
                None => {}
            }
        }
        Effect::DoorDead {
            dead,
            adopted,
            disowned,
        } => {
            shared.shares.forget_door(dead);
            let n = adopted.len();
            for (record, _online) in adopted {
                shared.adopt(record, true);
            }
            if n > 0 {
                tracing::info!(
                    door = dead,
                    sessions = n,
                    "adopted the sessions of a dead MQTT door"
                );
            }
            let mut sessions = lock(&shared.sessions);
            for c in disowned {
                if matches!(sessions.get(&c), Some(Slot::Offline { .. })) {
                    sessions.remove(&c);
                }
            }
        }
        Effect::Retained => {}
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
