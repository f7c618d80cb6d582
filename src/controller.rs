//! `rocketgate controller …`: a controller process, the controller embedded in a
//! NameServer (`rocketgate namesrv --controller`), and the admin commands `status` and
//! `elect` (docs/controller.md).

use std::time::Duration;

use anyhow::Context;
use rocketgate_config::Config;
use rocketgate_controller::wire::Status;
use rocketgate_controller::{Controller, ControllerClient, ControllerSettings, parse_peers};
use rocketgate_tls::{Acceptor, ReloadHandle};

use crate::cli::{ControllerAdmin, ElectArgs, StatusArgs};

/// The controller's settings from the config: `[controller]` and `data_dir`.
pub fn settings(config: &Config) -> anyhow::Result<ControllerSettings> {
    let c = &config.controller;
    if c.peers.trim().is_empty() {
        anyhow::bail!(
            "a controller needs its peers: --peers 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT \
             (or controller.peers; one entry for a single controller)"
        );
    }
    let peers = parse_peers(&c.peers)?;
    let mut s = ControllerSettings::new(c.id, peers, c.dir(&config.data_dir));
    s.listen = c.listen.clone();
    s.broker_timeout = c.broker_timeout;
    s.allow_unclean_election = c.allow_unclean_election;
    s.raft_heartbeat = c.raft_heartbeat_interval;
    s.raft_election_timeout = c.raft_election_timeout;
    s.peer_tls = dialer(config)?;
    Ok(s)
}

/// The TLS client for controllers (`controller.ca`), `None` when not set.
pub fn dialer(config: &Config) -> anyhow::Result<Option<rocketgate_tls::Dialer>> {
    let ca = &config.controller.ca;
    if ca.as_os_str().is_empty() {
        return Ok(None);
    }
    let d = rocketgate_tls::Dialer::new(ca)
        .with_context(|| format!("loading controller.ca {}", ca.display()))?;
    Ok(Some(d))
}

/// The controller's TLS acceptor (`tls.controller`) and the task that reloads its
/// certificate.
fn acceptor(config: &Config) -> anyhow::Result<Option<(Acceptor, ReloadHandle)>> {
    Ok(
        crate::channel_tls::channel_acceptor(config, config.tls.controller, "tls.controller")?.map(
            |a| {
                let reload = a.spawn_reload();
                (a, reload)
            },
        ),
    )
}

/// A controller started by the binary, with the task that reloads its certificate.
pub struct Running {
    pub controller: Controller,
    _tls_reload: Option<ReloadHandle>,
}

impl Running {
    pub async fn shutdown(self) {
        self.controller.shutdown().await
    }
}

/// Starts the controller the config describes (for a process of its own or a NameServer).
pub async fn start(config: &Config) -> anyhow::Result<Running> {
    let mut s = settings(config)?;
    let tls = acceptor(config)?;
    let (acceptor, reload) = tls.map_or((None, None), |(a, r)| (Some(a), Some(r)));
    s.tls = acceptor;
    let dir = s.data_dir.clone();
    let c = Controller::start(s)
        .await
        .with_context(|| format!("starting the controller (data in {})", dir.display()))?;
    // The doors' announcement format, so harnesses read every listener one way.
    println!("rocketgate: controller listening on {}", c.local_addr());
    Ok(Running {
        controller: c,
        _tls_reload: reload,
    })
}

/// `rocketgate controller` (no admin subcommand): runs until SIGTERM / SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = crate::signal::shutdown_signal()?;
    let c = start(&config).await?;
    println!("rocketgate controller ready");
    shutdown.await;
    c.shutdown().await;
    Ok(())
}

fn client(list: &str, config: &Config) -> anyhow::Result<ControllerClient> {
    let c = ControllerClient::parse(list)?
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(10));
    Ok(match dialer(config)? {
        Some(d) => c.with_tls(d),
        None => c,
    })
}

/// `rocketgate controller status|elect`.
pub async fn admin(cmd: ControllerAdmin, config: &Config) -> anyhow::Result<()> {
    match cmd {
        ControllerAdmin::Status(StatusArgs { controllers, json }) => {
            let status = client(&controllers, config)?.status().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", status_text(&status));
            }
        }
        ControllerAdmin::Elect(ElectArgs {
            controllers,
            group,
            broker_id,
            json,
        }) => {
            let info = client(&controllers, config)?
                .elect(&group, broker_id)
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                println!(
                    "group {group}: master {} ({}) at epoch {}, in-sync set {:?}",
                    info.master_id.map(|m| m.to_string()).unwrap_or("-".into()),
                    info.master_address.as_deref().unwrap_or("-"),
                    info.master_epoch,
                    info.sync_state_set
                );
            }
        }
    }
    Ok(())
}

fn status_text(s: &Status) -> String {
    let mut out = format!(
        "leader: controller {} at {} (term {})\ncontrollers: {}\n",
        s.leader_id,
        s.leader_address,
        s.term,
        s.controllers
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if s.groups.is_empty() {
        out.push_str("no broker group registered\n");
    }
    for g in &s.groups {
        let i = &g.info;
        out.push_str(&format!(
            "group {}: master {} at epoch {}, in-sync set {:?} (epoch {})\n",
            i.broker_name,
            i.master_id.map(|m| m.to_string()).unwrap_or("-".into()),
            i.master_epoch,
            i.sync_state_set,
            i.sync_state_set_epoch
        ));
        for r in &g.replica_status {
            out.push_str(&format!(
                "  broker {} {} {} offset {} last heartbeat {}\n",
                r.broker_id,
                r.address,
                if r.alive { "alive" } else { "silent" },
                r.max_offset.map(|o| o.to_string()).unwrap_or("-".into()),
                r.last_heartbeat_ms_ago
                    .map(|ms| format!("{ms} ms ago"))
                    .unwrap_or("never (to this leader)".into()),
            ));
        }
    }
    out
}
