//! The server side: a rustls configuration built from PEM files and swapped when the
//! files change (certificate rotation without a restart).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rocketgate_base::sync;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use crate::Error;

/// Whether clients must present a certificate signed by `client_ca` (mTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// No client certificates asked for.
    #[default]
    None,
    /// Asked for; a client without one is let in (with no identity), a client with
    /// one that does not verify is refused.
    Optional,
    /// A verified client certificate is required to connect.
    Required,
}

/// What an [`Acceptor`] is built with.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM CA bundle client certificates are verified against (with `client_auth`
    /// other than `None`).
    pub client_ca: Option<PathBuf>,
    pub client_auth: ClientAuth,
    /// How often the files are checked for changes; zero: never.
    pub reload_interval: Duration,
    /// A client that has not finished its handshake within this long is dropped.
    pub handshake_timeout: Duration,
}

impl TlsSettings {
    /// Settings with the defaults: no client certificates, files checked every 5 s,
    /// 10 s to finish a handshake.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        TlsSettings {
            cert: cert.into(),
            key: key.into(),
            client_ca: None,
            client_auth: ClientAuth::None,
            reload_interval: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
        }
    }

    /// The settings of `[tls]`, or `None` when no door uses TLS.
    pub fn from_config(c: &rocketgate_config::TlsConfig) -> Option<TlsSettings> {
        if !c.enabled() {
            return None;
        }
        let set = |p: &PathBuf| (!p.as_os_str().is_empty()).then(|| p.clone());
        Some(TlsSettings {
            client_ca: set(&c.client_ca),
            client_auth: match c.client_auth {
                rocketgate_config::ClientAuth::None => ClientAuth::None,
                rocketgate_config::ClientAuth::Optional => ClientAuth::Optional,
                rocketgate_config::ClientAuth::Required => ClientAuth::Required,
            },
            reload_interval: c.reload_interval,
            ..TlsSettings::new(&c.cert, &c.key)
        })
    }

    fn files(&self) -> Vec<&Path> {
        let mut f = vec![self.cert.as_path(), self.key.as_path()];
        if let Some(ca) = &self.client_ca {
            f.push(ca);
        }
        f
    }
}

/// A file's modification time and length: a change of either means "reload".
type Stamp = Option<(SystemTime, u64)>;

fn stamps(settings: &TlsSettings) -> Vec<Stamp> {
    settings
        .files()
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

struct Inner {
    settings: TlsSettings,
    /// The configuration new handshakes use; replaced whole on reload (a handshake
    /// clones the `Arc` and never holds the lock).
    current: RwLock<Arc<ServerConfig>>,
    /// The files' stamps when last read (good or bad), so one bad file is reported
    /// once, not at every poll.
    seen: Mutex<Vec<Stamp>>,
}

/// Accepts TLS connections with the current certificate. Cheap to clone; every
/// clone sees reloads.
#[derive(Clone)]
pub struct Acceptor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("settings", &self.inner.settings)
            .finish()
    }
}

fn build(settings: &TlsSettings) -> Result<ServerConfig, Error> {
    let certs = crate::pem::certs("TLS certificate", &settings.cert)?;
    let key = crate::pem::key(&settings.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (settings.client_auth, &settings.client_ca) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(Error::ClientCa {
                path: PathBuf::new(),
                reason: "client_auth asks for client certificates but no client_ca is set".into(),
            });
        }
        (auth, Some(ca)) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in crate::pem::certs("client CA", ca)? {
                roots.add(cert).map_err(|e| Error::ClientCa {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| Error::ClientCa {
                path: ca.clone(),
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    Ok(builder.with_single_cert(certs, key)?)
}

impl Acceptor {
    /// Reads the files and builds the first configuration; a missing or bad file is
    /// an error naming it.
    pub fn new(settings: TlsSettings) -> Result<Acceptor, Error> {
        let seen = stamps(&settings);
        let config = build(&settings)?;
        Ok(Acceptor {
            inner: Arc::new(Inner {
                settings,
                current: RwLock::new(Arc::new(config)),
                seen: Mutex::new(seen),
            }),
        })
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.inner.settings
    }

    /// The configuration the next handshake uses.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        sync::read(&self.inner.current).clone()
    }

    /// Rebuilds the configuration if any file changed since it was last read:
    /// `Ok(true)` when a new one is in use, `Ok(false)` when nothing changed, an
    /// error (and the old configuration kept) when the new files are bad.
    pub fn reload_if_changed(&self) -> Result<bool, Error> {
        let now = stamps(&self.inner.settings);
        {
            let mut seen = sync::lock(&self.inner.seen);
            if *seen == now {
                return Ok(false);
            }
            *seen = now;
        }
        let config = build(&self.inner.settings)?;
        *sync::write(&self.inner.current) = Arc::new(config);
        Ok(true)
    }

    /// Checks the files every `reload_interval` on a task of the current runtime
    /// (none when the interval is zero) until the handle is dropped.
    pub fn spawn_reload(&self) -> ReloadHandle {
        let every = self.inner.settings.reload_interval;
        if every.is_zero() {
            return ReloadHandle(None);
        }
        let me = self.clone();
        let cert = self.inner.settings.cert.display().to_string();
        ReloadHandle(Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let me = me.clone();
                // File reads and key parsing: off the async workers.
                match tokio::task::spawn_blocking(move || me.reload_if_changed()).await {
                    Ok(Ok(true)) => tracing::info!(%cert, "TLS certificate reloaded"),
                    Ok(Ok(false)) | Err(_) => {}
                    Ok(Err(e)) => tracing::warn!(
                        %cert,
                        error = %e,
                        "TLS files changed but cannot be used; keeping the previous certificate"
                    ),
                }
            }
        })))
    }

    /// Performs the server side of a handshake (bounded by `handshake_timeout`) and
    /// returns the stream with the verified client certificate's name, if any.
    pub async fn accept<IO>(&self, io: IO) -> io::Result<(TlsStream<IO>, Option<String>)>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server_config());
        let stream =
            tokio::time::timeout(self.inner.settings.handshake_timeout, acceptor.accept(io))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
        let identity = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| crate::identity::name(leaf));
        Ok((stream, identity))
    }
}

/// Stops the reload task when dropped.
#[derive(Debug)]
pub struct ReloadHandle(Option<JoinHandle<()>>);

impl Drop for ReloadHandle {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.abort();
        }
    }
}
