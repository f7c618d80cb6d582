//! The client side: trust a CA file, nothing else (no system roots: a broker's
//! certificate is usually issued by the operator's own CA).

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

use crate::Error;

/// A client configuration that trusts the certificates in the PEM file `ca`.
pub fn client_config(ca: &Path) -> Result<ClientConfig, Error> {
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
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(config)
}
