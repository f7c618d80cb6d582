//! The acceptor and the listener through real sockets: reload (a bad file keeps the
//! old configuration), and the permissive mode telling TLS from plain by the first byte.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rocketgate_tls::rustls::pki_types::ServerName;
use rocketgate_tls::tokio_rustls::TlsConnector;
use rocketgate_tls::{Acceptor, ClientAuth, Incoming, Mode, Stream, TlsSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Ca {
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(dir: &Path) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.distinguished_name.push(DnType::CommonName, "test CA");
        std::fs::write(dir.join("ca.pem"), p.self_signed(&key).unwrap().pem()).unwrap();
        Ca {
            issuer: Issuer::new(p, key),
        }
    }

    /// Writes `<name>.pem` / `<name>.key` for a leaf with CN `cn` (and 127.0.0.1).
    fn leaf(&self, dir: &Path, name: &str, cn: &str) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        cert.der().to_vec()
    }
}

fn settings(dir: &Path) -> TlsSettings {
    TlsSettings::new(dir.join("server.pem"), dir.join("server.key"))
}

#[test]
fn reload_swaps_on_change_and_keeps_the_old_configuration_on_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path());
    ca.leaf(dir.path(), "server", "one");
    let acceptor = Acceptor::new(settings(dir.path())).unwrap();
    let first = acceptor.server_config();
    assert!(!acceptor.reload_if_changed().unwrap(), "nothing changed");
    assert!(Arc::ptr_eq(&first, &acceptor.server_config()));

    ca.leaf(dir.path(), "server", "the second one");
    assert!(acceptor.reload_if_changed().unwrap());
    let second = acceptor.server_config();
    assert!(!Arc::ptr_eq(&first, &second));

    std::fs::write(dir.path().join("server.key"), "garbage").unwrap();
    let err = acceptor.reload_if_changed().unwrap_err().to_string();
    assert!(err.contains("server.key"), "{err}");
    assert!(
        Arc::ptr_eq(&second, &acceptor.server_config()),
        "the old one is kept"
    );
    assert!(
        !acceptor.reload_if_changed().unwrap(),
        "a bad file is reported once"
    );
}

#[test]
fn missing_files_and_a_client_ca_without_a_file_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = Acceptor::new(settings(dir.path())).unwrap_err().to_string();
    assert!(err.contains("server.pem"), "{err}");
    let ca = Ca::new(dir.path());
    ca.leaf(dir.path(), "server", "s");
    let mut s = settings(dir.path());
    s.client_auth = ClientAuth::Required;
    let err = Acceptor::new(s).unwrap_err().to_string();
    assert!(err.contains("client_ca"), "{err}");
}

async fn tls_client(
    addr: std::net::SocketAddr,
    dir: &Path,
    client: Option<&str>,
) -> std::io::Result<rocketgate_tls::tokio_rustls::client::TlsStream<TcpStream>> {
    let roots = {
        let mut r = rocketgate_tls::rustls::RootCertStore::empty();
        let pem = std::fs::read(dir.join("ca.pem")).unwrap();
        use rocketgate_tls::rustls::pki_types::CertificateDer;
        use rocketgate_tls::rustls::pki_types::pem::PemObject;
        r.add(CertificateDer::from_pem_slice(&pem).unwrap())
            .unwrap();
        r
    };
    let provider = Arc::new(rocketgate_tls::rustls::crypto::ring::default_provider());
    let builder = rocketgate_tls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(name) => {
            use rocketgate_tls::rustls::pki_types::pem::PemObject;
            use rocketgate_tls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let cert = CertificateDer::from_pem_file(dir.join(format!("{name}.pem"))).unwrap();
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(vec![cert], key).unwrap()
        }
    };
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
}

#[tokio::test]
async fn permissive_serves_tls_and_plain_on_one_port_with_the_client_identity() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path());
    ca.leaf(dir.path(), "server", "server");
    ca.leaf(dir.path(), "client", "device-9");
    let mut s = settings(dir.path());
    s.client_ca = Some(dir.path().join("ca.pem"));
    s.client_auth = ClientAuth::Optional;
    let acceptor = Acceptor::new(s).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut incoming = Incoming::new(listener, Mode::Permissive(acceptor), "test").unwrap();
    let addr = incoming.local_addr();

    // Plain: the first byte is not 0x16.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"ping").await.unwrap();
    let mut c = tokio::time::timeout(Duration::from_secs(5), incoming.accept())
        .await
        .unwrap();
    assert!(matches!(c.stream, Stream::Plain(_)));
    assert_eq!(c.tls_identity, None);
    let mut got = [0u8; 4];
    c.stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping", "the peeked byte is still there");

    // TLS with a client certificate: its CN is the identity.
    let client = tokio::spawn({
        let dir = dir.path().to_path_buf();
        async move {
            let mut s = tls_client(addr, &dir, Some("client")).await.unwrap();
            s.write_all(b"hello").await.unwrap();
            s.flush().await.unwrap();
            let mut back = [0u8; 2];
            s.read_exact(&mut back).await.unwrap();
            back
        }
    });
    let mut c = tokio::time::timeout(Duration::from_secs(5), incoming.accept())
        .await
        .unwrap();
    assert!(c.stream.is_tls());
    assert_eq!(c.tls_identity.as_deref(), Some("device-9"));
    let mut got = [0u8; 5];
    c.stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello");
    c.stream.write_all(b"ok").await.unwrap();
    c.stream.flush().await.unwrap();
    assert_eq!(&client.await.unwrap(), b"ok");

    // TLS without a certificate (optional): in, without an identity.
    let client = tokio::spawn({
        let dir = dir.path().to_path_buf();
        async move {
            let mut s = tls_client(addr, &dir, None).await.unwrap();
            s.write_all(b"x").await.unwrap();
            s.flush().await.unwrap();
            s
        }
    });
    let c = tokio::time::timeout(Duration::from_secs(5), incoming.accept())
        .await
        .unwrap();
    assert!(c.stream.is_tls());
    assert_eq!(c.tls_identity, None);
    drop(client.await.unwrap());
}
