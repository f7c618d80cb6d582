//! PEM files in, DER out (through `rustls-pki-types`' own PEM reader).

use std::path::Path;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// Every certificate in a PEM file, in order (a chain: leaf first).
pub(crate) fn certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, Error> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| Error::File {
        what,
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let certs = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::File {
            what,
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::Empty {
            what,
            path: path.to_path_buf(),
            expected: "PEM certificate (-----BEGIN CERTIFICATE-----)",
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => Error::Empty {
            what: "TLS key",
            path: path.to_path_buf(),
            expected: "PEM private key",
        },
        e => Error::File {
            what: "TLS key",
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    })
}
