//! The client side: trust a CA file, nothing else (no system roots: a broker's
//! certificate is usually issued by the operator's own CA); optionally present a
//! client certificate (mTLS).

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

use crate::Error;

/// A client configuration that trusts the certificates in the PEM file `ca`.
pub fn client_config(ca: &Path) -> Result<ClientConfig, Error> {
    Ok(builder(ca)?.with_no_client_auth())
}

/// [`client_config`] presenting the client certificate chain in the PEM file
/// `cert` with its private key `key` (mTLS).
pub fn client_config_with_certificate(
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<ClientConfig, Error> {
    let chain = crate::pem::certs("client certificate", cert)?;
    let key = crate::pem::key(key)?;
    builder(ca)?
        .with_client_auth_cert(chain, key)
        .map_err(|e| Error::ClientCa {
            path: cert.to_path_buf(),
            reason: e.to_string(),
        })
}

fn builder(
    ca: &Path,
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>, Error> {
    let mut roots = RootCertStore::empty();
    for cert in crate::pem::certs("CA file", ca)? {
        roots.add(cert).map_err(|e| Error::ClientCa {
            path: ca.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
    Ok(config)
}

/// Connects to servers over TLS, trusting one CA file: the remoting links to
/// NameServers and controllers (`namesrv.ca`, `controller.ca`). The name checked in
/// the server's certificate is the host part of the address dialled (an IP address
/// or a DNS name), unless one name is given for all. Cheap to clone.
#[derive(Clone)]
pub struct Dialer {
    config: Arc<ClientConfig>,
    server_name: Option<String>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Dialer {
    /// A dialer trusting the certificates in the PEM file `ca`.
    pub fn new(ca: &Path) -> Result<Dialer, Error> {
        Ok(Dialer {
            config: Arc::new(client_config(ca)?),
            server_name: None,
        })
    }

    /// Checks every server's certificate for `name` instead of the dialled host.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Dialer {
        self.server_name = Some(name.into());
        self
    }

    /// Opens a TCP connection to `addr` (`host:port`) and shakes hands, both within
    /// `timeout`.
    pub async fn connect(
        &self,
        addr: &str,
        timeout: std::time::Duration,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let host = match &self.server_name {
            Some(n) => n.clone(),
            None => addr
                .rsplit_once(':')
                .map_or(addr, |(host, _)| host)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
        };
        let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{host:?} is not a server name for TLS"),
            )
        })?;
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let dial = async {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            // Requests and answers are small and awaited one by one.
            let _ = tcp.set_nodelay(true);
            connector.connect(name, tcp).await
        };
        tokio::time::timeout(timeout, dial).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("TLS connection to {addr} not made within {timeout:?}"),
            )
        })?
    }
}
