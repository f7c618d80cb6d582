//! `rocketgate admin switchover`: a manual change of a broker group's master by the
//! controllers (docs/controller.md, "Manual"), as `rocketgate controller elect` does,
//! with what it needs found through the node when not given: the controllers from
//! its `controller.addresses` (`GET /v1/config`), the group from its broker name
//! (`GET /v1/broker`). Prints the new master and epoch.

use std::time::Duration;

use clap::Args;
use rocketgate_controller::ControllerClient;
use serde_json::Value;

use super::client::{Client, Failure, exit};
use super::table;

#[derive(Debug, Args)]
pub struct SwitchoverArgs {
    /// The broker group (default: the node's own).
    #[arg(long)]
    pub group: Option<String>,
    /// The broker to make master (default: the controllers' best in-sync broker).
    #[arg(long)]
    pub broker_id: Option<u64>,
    /// The controllers, `host:port;host:port` (default: the node's
    /// `controller.addresses`).
    #[arg(long, env = "ROCKETGATE_ADMIN_CONTROLLERS", value_name = "LIST")]
    pub controllers: Option<String>,
}

pub async fn run(client: &Client, json: bool, args: SwitchoverArgs) -> Result<(), Failure> {
    let controllers = match args.controllers {
        Some(c) => c,
        None => {
            let cfg = client.get("/v1/config").await?;
            let found = cfg["settings"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["key"] == "controller.addresses")
                .and_then(|s| s["value"].as_str().map(str::to_owned))
                .unwrap_or_default();
            if found.trim().is_empty() {
                return Err(Failure::usage(
                    "the node has no controller (controller.addresses is empty): a switchover \
                     needs controller mode; give --controllers HOST:PORT if the node is not the \
                     one to ask",
                ));
            }
            found
        }
    };
    let group = match args.group {
        Some(g) => g,
        None => {
            let b = client.get("/v1/broker").await?;
            b["broker_name"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| Failure::usage("the node named no broker group; give --group"))?
        }
    };
    let ctl = ControllerClient::parse(&controllers)
        .map_err(|e| Failure::usage(format!("--controllers: {e}")))?
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(10));
    let info = ctl.elect(&group, args.broker_id).await.map_err(|e| {
        use rocketgate_controller::Error as E;
        let code = match &e {
            E::NoLeader { .. } | E::Io { .. } | E::Remoting(_) => exit::UNREACHABLE,
            _ => exit::USAGE,
        };
        Failure {
            code,
            message: format!("switchover of {group}: {e}"),
        }
    })?;
    let v = serde_json::to_value(&info).unwrap_or(Value::Null);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string())
        );
        return Ok(());
    }
    let set: Vec<String> = info.sync_state_set.iter().map(u64::to_string).collect();
    table::pairs(vec![
        ("group", group),
        (
            "master",
            info.master_id
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "address",
            info.master_address.clone().unwrap_or_else(|| "-".into()),
        ),
        ("epoch", info.master_epoch.to_string()),
        ("in-sync set", set.join(", ")),
    ]);
    Ok(())
}
