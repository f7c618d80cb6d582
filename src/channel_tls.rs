//! TLS for the node's internal channels: the NameServer and controller listeners
//! (`tls.namesrv`, `tls.controller`) and the NameServer client (`namesrv.ca`). A leaf
//! module, shared by the node and the controller commands.

use anyhow::Context;
use rocketgate_config::Config;
use rocketgate_tls::{Acceptor, TlsSettings};

/// The acceptor of an internal channel served with the node's certificate
/// (`tls.namesrv`, `tls.controller`) when `on`. No client certificate is asked for:
/// brokers, clients and proxies present none (they sign with the internal credential
/// or a user's AccessKey where it matters).
pub(crate) fn channel_acceptor(
    config: &Config,
    on: bool,
    what: &str,
) -> anyhow::Result<Option<Acceptor>> {
    if !on {
        return Ok(None);
    }
    let Some(settings) = TlsSettings::from_config(&config.tls) else {
        return Ok(None);
    };
    let settings = TlsSettings {
        client_ca: None,
        client_auth: rocketgate_tls::ClientAuth::None,
        ..settings
    };
    let a = Acceptor::new(settings)
        .with_context(|| format!("loading the TLS certificate for {what} (tls.cert, tls.key)"))?;
    Ok(Some(a))
}

/// The TLS client for NameServers (`namesrv.ca`), `None` when not set.
pub(crate) fn namesrv_dialer(config: &Config) -> anyhow::Result<Option<rocketgate_tls::Dialer>> {
    let ca = &config.namesrv.ca;
    if ca.as_os_str().is_empty() {
        return Ok(None);
    }
    let d = rocketgate_tls::Dialer::new(ca)
        .with_context(|| format!("loading namesrv.ca {}", ca.display()))?;
    Ok(Some(d))
}
