//! Test certificates made on the spot with `rcgen`: a CA, a server certificate for
//! `localhost` / `127.0.0.1` signed by it, a client certificate (mTLS) and an
//! unrelated CA (the "wrong CA" a client must not trust), as PEM files in a directory.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SerialNumber,
};
use rocketgate_tls::rustls::pki_types::CertificateDer;

/// A test CA with its certificate files.
pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The server certificate in use (DER), to compare with what a server presents.
    pub server_der: CertificateDer<'static>,
    /// SHA-256 of the server key's SubjectPublicKeyInfo, base64 (Chromium's
    /// `--ignore-certificate-errors-spki-list`).
    pub server_spki_sha256: String,
}

fn ca(name: &str) -> anyhow::Result<(CertificateParams, KeyPair)> {
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok((p, key))
}

impl Pki {
    /// Writes `ca.pem`, `server.pem`/`server.key`, `client.pem`/`client.key` (CN
    /// `client_cn`) and `wrong-ca.pem` into `dir`.
    pub fn new(dir: &Path, client_cn: &str) -> anyhow::Result<Pki> {
        let (params, key) = ca("rocketgate test CA")?;
        let cert = params.self_signed(&key)?;
        std::fs::write(dir.join("ca.pem"), cert.pem())?;
        let issuer = Issuer::new(params, key);

        let (wrong, wrong_key) = ca("some other CA")?;
        std::fs::write(
            dir.join("wrong-ca.pem"),
            wrong.self_signed(&wrong_key)?.pem(),
        )?;

        let client_key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, client_cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = p.signed_by(&client_key, &issuer)?;
        std::fs::write(dir.join("client.pem"), client.pem())?;
        std::fs::write(dir.join("client.key"), client_key.serialize_pem())?;

        let mut pki = Pki {
            dir: dir.to_path_buf(),
            issuer,
            server_der: CertificateDer::from(Vec::new()),
            server_spki_sha256: String::new(),
        };
        pki.issue_server(1)?;
        Ok(pki)
    }

    /// Issues a new server certificate (serial `serial`, a new key) and replaces
    /// `server.pem` and `server.key` with it, each file written whole at once.
    pub fn issue_server(&mut self, serial: u64) -> anyhow::Result<()> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        p.distinguished_name
            .push(DnType::CommonName, "rocketgate test server");
        p.serial_number = Some(SerialNumber::from(serial));
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = p.signed_by(&key, &self.issuer)?;
        for (name, text) in [
            ("server.key", key.serialize_pem()),
            ("server.pem", cert.pem()),
        ] {
            let tmp = self.dir.join(format!("{name}.tmp"));
            std::fs::write(&tmp, text).context("writing a certificate file")?;
            std::fs::rename(&tmp, self.dir.join(name))?;
        }
        self.server_der = cert.der().clone();
        let spki = key.subject_public_key_info();
        let digest = ring_sha256(&spki);
        use base64::Engine;
        self.server_spki_sha256 = base64::engine::general_purpose::STANDARD.encode(digest);
        Ok(())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `ROCKETGATE_TLS__*` settings naming these files.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "ROCKETGATE_TLS__CERT".into(),
                self.path("server.pem").display().to_string(),
            ),
            (
                "ROCKETGATE_TLS__KEY".into(),
                self.path("server.key").display().to_string(),
            ),
            (
                "ROCKETGATE_TLS__CLIENT_CA".into(),
                self.path("ca.pem").display().to_string(),
            ),
        ]
    }
}

fn ring_sha256(data: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .to_vec()
}
