//! `rocketgate proxy`: the MQTT, HTTP and WebSocket doors over a cluster of broker groups,
//! with no store of its own (RocketMQ 5's proxy in cluster mode; docs/proxy.md).
//!
//! The doors are the same code as a broker node's, generic over `MessagingApi`; here they
//! get the cluster's implementation (`rocketgate_native::cluster`): routes from the
//! NameServers, one remote member per broker group (its master, over the native door's
//! broker-API codes), a topic's queues across every group as one range. MQTT sessions,
//! subscriptions, retained messages and wills live in the brokers (the MQTT door keeps
//! them in system topics), so a device may reconnect to any proxy.

use std::sync::Arc;

use anyhow::Context;
use rocketgate_auth::Auth;
use rocketgate_config::Config;
use rocketgate_core::broker::MessagingApi;
use rocketgate_http as http;
use rocketgate_tls::{Acceptor, ReloadHandle};
use rocketgate_websocket as ws;

pub use crate::cluster_client::{ClusterApi, connect};
use crate::node::{
    Late, NodeProbe, announce, check_exposure, http_settings, open_auth, start_mqtt, start_tls,
    start_ws, tls_for,
};

/// The doors of a proxy, as one unit that starts and stops.
pub struct ProxyDoors<B: MessagingApi + 'static> {
    http: http::Handle,
    mqtt: rocketgate_mqtt::Handle<B>,
    ws: ws::Handle,
    _tls: Option<(Acceptor, ReloadHandle)>,
}

/// Readiness checks the HTTP door adds on a proxy (the broker groups it reaches).
pub type ExtraChecks = Box<dyn Fn() -> Vec<http::inspect::ReadyCheck> + Send + Sync>;

impl<B: MessagingApi + 'static> ProxyDoors<B> {
    /// Starts the HTTP, MQTT and WebSocket doors over `api`. `config` comes back with
    /// the addresses actually bound.
    pub async fn start(
        config: &mut Config,
        api: Arc<B>,
        auth: &Arc<Auth>,
        namesrvs: Vec<String>,
        extra_checks: ExtraChecks,
    ) -> anyhow::Result<ProxyDoors<B>> {
        let tls = start_tls(config)?;
        let late = Arc::new(Late::<B>::default());
        let probe = Arc::new(NodeProbe {
            store: None,
            group: None,
            late: late.clone(),
            config: config.clone(),
            extra_checks: Some(extra_checks),
        });
        let settings = http_settings(config, namesrvs, tls_for(&tls, config.tls.http), auth);
        let (server, addr) = http::Server::bind(config.listen.http, api.clone(), probe, settings)
            .await
            .with_context(|| format!("starting the HTTP gateway on {}", config.listen.http))?;
        announce("http", addr);
        let http = server.spawn();
        // No state files to import: a proxy never had a store.
        let mqtt = start_mqtt(
            config,
            &api,
            tls_for(&tls, config.tls.mqtt),
            auth,
            Default::default(),
        )
        .await?;
        let _ = late.mqtt.set(mqtt.streams());
        let ws = start_ws(
            config,
            &api,
            mqtt.streams(),
            tls_for(&tls, config.tls.ws),
            auth,
        )
        .await?;
        let _ = late.ws.set(ws.subscribers());
        let bound = crate::node::listening();
        for (door, addr) in &bound {
            match door.as_str() {
                "http" => config.listen.http = *addr,
                "mqtt" => config.listen.mqtt = *addr,
                "mqtts" => config.listen.mqtts = *addr,
                "ws" => config.listen.ws = *addr,
                _ => {}
            }
        }
        let _ = late.doors.set(bound);
        Ok(ProxyDoors {
            http,
            mqtt,
            ws,
            _tls: tls,
        })
    }

    /// Stops the doors (the MQTT door's sessions stay in the brokers).
    pub async fn stop(self) {
        self.ws.stop().await;
        self.http.stop().await;
        self.mqtt.stop().await;
    }
}

/// `rocketgate proxy`: the doors over the cluster behind `broker.namesrv_addrs`, until
/// SIGINT/SIGTERM.
pub async fn run(mut config: Config) -> anyhow::Result<()> {
    let namesrvs = config.broker.namesrv_addrs.clone();
    if namesrvs.is_empty() {
        anyhow::bail!(
            "a proxy needs the cluster's NameServers: --namesrv HOST:PORT;HOST:PORT \
             (or broker.namesrv_addrs in the config)"
        );
    }
    let l = config.listen.clone();
    check_exposure(
        &config,
        &[
            ("listen.mqtt", l.mqtt),
            ("listen.http", l.http),
            ("listen.ws", l.ws),
        ],
    )?;
    let auth = open_auth(&config, false)?;
    if auth.enabled() && auth.internal_credential().is_none() {
        anyhow::bail!(
            "authentication is on but auth.internal_secret is empty: a proxy calls the \
             brokers with the internal credential (set ROCKETGATE_AUTH__INTERNAL_SECRET as \
             on the brokers)"
        );
    }
    let shutdown = crate::signal::shutdown_signal()?;
    let api = Arc::new(
        connect(
            &namesrvs,
            auth.internal_credential().cloned(),
            &config.proxy,
            &config.namesrv.ca,
        )
        .await?,
    );
    let checks: ExtraChecks = {
        let api = Arc::downgrade(&api);
        Box::new(move || {
            api.upgrade()
                .map(|api| vec![brokers_check(&api)])
                .unwrap_or_default()
        })
    };
    let doors = ProxyDoors::start(&mut config, api.clone(), &auth, namesrvs, checks).await?;
    println!("rocketgate proxy ready");
    shutdown.await;
    tracing::info!("shutting down");
    doors.stop().await;
    Ok(())
}

/// `/readyz` on a proxy: it knows at least one broker group.
fn brokers_check(api: &ClusterApi) -> http::inspect::ReadyCheck {
    let known = api.known_brokers();
    http::inspect::ReadyCheck {
        name: "brokers".into(),
        ok: !known.is_empty(),
        detail: if known.is_empty() {
            "no broker group known yet (are the NameServers up, and a broker registered?)".into()
        } else {
            known
                .iter()
                .map(|b| format!("{} {}", b.name, b.addr))
                .collect::<Vec<_>>()
                .join(", ")
        },
    }
}
