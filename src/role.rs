//! The broker's side of the controller, first part (docs/controller.md, "The broker's
//! interface"): with `controller.addresses` set, the broker registers with the controller
//! leader and heartbeats every `controller.heartbeat_interval` (its group, id, native
//! address, commit-log end and the epoch it last learned), and logs the role each answer
//! gives it. Acting on the role — the epoch file, switching between master and slave, the
//! write lease, truncation — is the next step; until then `broker.id` still decides.

use std::sync::Arc;
use std::time::Duration;

use rocketgate_config::Config;
use rocketgate_controller::{ControllerClient, Heartbeat};
use rocketgate_core::store::Store;
use tokio::task::JoinHandle;

/// The running heartbeat sender.
pub struct Role {
    task: JoinHandle<()>,
}

impl Role {
    pub fn stop(self) {
        self.task.abort();
    }
}

/// Starts the sender when `controller.addresses` is set; `addr` is the broker's native
/// address as clients reach it.
pub fn start(config: &Config, store: Arc<Store>, addr: String) -> anyhow::Result<Option<Role>> {
    let list = config.controller.addresses.trim();
    if list.is_empty() {
        return Ok(None);
    }
    let every = config.controller.heartbeat_interval;
    // A heartbeat retried for longer than its period only delays the next one.
    let client =
        ControllerClient::parse(list)?.with_timeouts(every.min(Duration::from_secs(1)), every);
    let group = config.broker.name.clone();
    let id = config.broker.id;
    let task = tokio::spawn(async move {
        let mut epoch = 0u64;
        let mut registered = false;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let hb = Heartbeat {
                group: group.clone(),
                id,
                addr: addr.clone(),
                max_offset: store.positions().written as i64,
                epoch,
            };
            let answer = match registered {
                false => client.register(&hb).await,
                true => client.heartbeat(&hb).await,
            };
            match answer {
                Ok(info) => {
                    registered = true;
                    if info.master_epoch != epoch {
                        let role = match info.master_id {
                            Some(m) if m == id => "master".to_string(),
                            Some(m) => format!(
                                "slave of broker {m} at {}",
                                info.master_address.as_deref().unwrap_or("?")
                            ),
                            None => "no master yet".to_string(),
                        };
                        tracing::info!(
                            group = %group, id, epoch = info.master_epoch,
                            sync_set = ?info.sync_state_set, "controller: role {role}"
                        );
                        epoch = info.master_epoch;
                    }
                }
                Err(e) => {
                    tracing::warn!(group = %group, id, error = %e, "controller heartbeat failed")
                }
            }
        }
    });
    Ok(Some(Role { task }))
}
