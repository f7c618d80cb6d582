//! The client side of a cluster of broker groups: routes from the NameServers and one
//! [`RemoteBroker`] per group's master. Used by `rocketgate proxy` (its doors run over
//! it) and by the admin CLI's multi-group topic commands; a leaf, so neither depends
//! on the other.

use std::sync::Arc;

use anyhow::Context;
use rocketgate_auth::AccessKey;
use rocketgate_config::ProxyConfig;
use rocketgate_native::client::{ClientSettings, RemoteBroker, RemoteSettings};
use rocketgate_native::cluster::{
    BrokerAddr, Cluster, ClusterSettings, NameServerRoutes, unavailable,
};

/// The cluster API a proxy's doors run over: routes from the NameServers, one
/// [`RemoteBroker`] per broker group's master.
pub type ClusterApi = Cluster<RemoteBroker, NameServerRoutes>;

/// The cluster over `namesrvs`, its members signing with `credential` (the brokers'
/// internal one) when auth is on, over TLS with `proxy.broker_ca` (and to the
/// NameServers with `namesrv_ca`, `namesrv.ca`).
pub async fn connect(
    namesrvs: &[String],
    credential: Option<AccessKey>,
    proxy: &ProxyConfig,
    namesrv_ca: &std::path::Path,
) -> anyhow::Result<ClusterApi> {
    let mut client = ClientSettings::new(namesrvs.iter().cloned());
    if !namesrv_ca.as_os_str().is_empty() {
        client = client
            .with_namesrv_tls_ca(namesrv_ca)
            .with_context(|| format!("reading namesrv.ca {}", namesrv_ca.display()))?;
    }
    if let Some(c) = &credential {
        client = client.with_credentials(&c.access_key, &c.secret_key);
    }
    let mut base = RemoteSettings::new(String::new()).with_request_timeout(proxy.request_timeout);
    if let Some(c) = &credential {
        base = base.with_credentials(c.clone());
    }
    if !proxy.broker_ca.as_os_str().is_empty() {
        base = base
            .with_tls_ca(&proxy.broker_ca)
            .with_context(|| format!("reading proxy.broker_ca {}", proxy.broker_ca.display()))?;
    }
    let routes = NameServerRoutes::new(client);
    Ok(
        Cluster::start(routes, ClusterSettings::default(), move |b: &BrokerAddr| {
            let settings = RemoteSettings {
                addr: b.addr.clone(),
                ..base.clone()
            };
            let name = b.name.clone();
            async move {
                RemoteBroker::connect(settings)
                    .await
                    .map(Arc::new)
                    .map_err(|e| unavailable(format!("broker {name} is unavailable: {e}")))
            }
        })
        .await,
    )
}
