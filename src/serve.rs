//! The long-running node commands that carry a broker: `rocketgate standalone` and
//! `rocketgate broker`. Each runs the broker part ([`BrokerNode`]) once, or — with
//! `controller.addresses` set — under the role supervisor (`crate::role`), which starts it
//! in whatever role the controller gives and again at every change.

use rocketgate_config::Config;

use crate::node::{BrokerNode, NodeParts, check_exposure, open_auth, start_namesrv};

/// `rocketgate standalone`: NameServer + broker + gateways in one process.
pub async fn standalone(config: Config) -> anyhow::Result<()> {
    let l = config.listen.clone();
    check_exposure(
        &config,
        &[
            ("listen.namesrv", l.namesrv),
            ("listen.native", l.native),
            ("listen.mqtt", l.mqtt),
            ("listen.http", l.http),
            ("listen.ws", l.ws),
        ],
    )?;
    let auth = open_auth(&config, true)?;
    // Before any door announces itself: a harness may signal as soon as it reads one.
    let shutdown = crate::signal::shutdown_signal()?;
    let (ns, ns_addr) = start_namesrv(&config, &auth).await?;
    let mut namesrvs = vec![ns_addr.to_string()];
    namesrvs.extend(config.broker.namesrv_addrs.iter().cloned());
    let parts = NodeParts {
        auth,
        http_namesrvs: namesrvs.clone(),
        namesrvs,
        controlled: None,
    };
    let ready = format!(
        "rocketgate standalone ready (data in {})",
        config.data_dir.display()
    );
    let result = run_broker(config, parts, shutdown, ready).await;
    ns.stop().await;
    result
}

/// Runs the broker part until `shutdown`: once, or under a controller (with
/// `controller.addresses`) in whatever role the controller gives it.
async fn run_broker(
    mut config: Config,
    parts: NodeParts,
    shutdown: impl std::future::Future<Output = ()>,
    ready: String,
) -> anyhow::Result<()> {
    if config.controlled() {
        return crate::role::run(config, parts, shutdown, ready).await;
    }
    let node = BrokerNode::start(&mut config, &parts).await?;
    println!("{ready}");
    shutdown.await;
    tracing::info!("shutting down");
    node.stop().await
}

/// `rocketgate broker`: a broker that registers with the configured NameServers.
pub async fn broker(config: Config) -> anyhow::Result<()> {
    if config.broker.namesrv_addrs.is_empty() {
        anyhow::bail!(
            "a broker needs NameServers to register with: --namesrv HOST:PORT;HOST:PORT \
             (or broker.namesrv_addrs in the config)"
        );
    }
    let l = config.listen.clone();
    check_exposure(
        &config,
        &[
            ("listen.native", l.native),
            ("listen.mqtt", l.mqtt),
            ("listen.http", l.http),
            ("listen.ws", l.ws),
        ],
    )?;
    let auth = open_auth(&config, false)?;
    let shutdown = crate::signal::shutdown_signal()?;
    let parts = NodeParts {
        auth,
        namesrvs: config.broker.namesrv_addrs.clone(),
        http_namesrvs: config.broker.namesrv_addrs.clone(),
        controlled: None,
    };
    let ready = format!(
        "rocketgate broker {} ready (data in {})",
        config.broker.name,
        config.data_dir.display()
    );
    run_broker(config, parts, shutdown, ready).await
}
