//! Connections of the client: one multiplexed [`Link`] (the shared remoting client) per
//! address. Requests the server pushes (consumer-ids-changed, transaction checks) go to
//! the [`Links`]' push channel. [`Links`] reconnects on demand, with exponential back-off
//! per address after a failed connect.

use rocketgate_core::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketgate_auth::{AccessKey, sign};
use rocketgate_remoting::client::Link;
pub(crate) use rocketgate_remoting::client::Pushed;
use rocketgate_remoting::code::version;
use rocketgate_remoting::codec::{LanguageCode, RemotingCommand, SerializeType};
use rocketgate_tls::rustls::ClientConfig;
use rocketgate_tls::rustls::pki_types::ServerName;
use rocketgate_tls::tokio_rustls::TlsConnector;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::Error;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Marks a request as ours and signs it when the client has credentials. The compact
/// binary header: cheaper to write and to parse than JSON, and the peer answers in the
/// same form.
fn stamp(mut cmd: RemotingCommand, credentials: Option<&AccessKey>) -> RemotingCommand {
    cmd.language = LanguageCode::Rust;
    cmd.version = version::CURRENT;
    cmd.serialize_type = SerializeType::RocketMq;
    if let Some(c) = credentials {
        sign(&mut cmd, c);
    }
    cmd
}

/// Adds `AccessKey` and `Signature` (RocketMQ's `AclClientRPCHook`).
pub fn sign(cmd: &mut RemotingCommand, c: &AccessKey) {
    cmd.ext_fields
        .insert(sign::ACCESS_KEY, c.access_key.clone());
    let signature = sign::signature(c.secret_key.as_bytes(), cmd.ext_fields.iter(), &cmd.body);
    cmd.ext_fields.insert(sign::SIGNATURE, signature);
}

struct Backoff {
    until: Instant,
    next: Duration,
}

/// Every link of one client, by address, reconnecting on demand.
pub(crate) struct Links {
    /// Std lock, held for map lookups only; connecting happens outside it.
    links: Mutex<HashMap<String, Arc<Link>>>,
    backoff: Mutex<HashMap<String, Backoff>>,
    pushes: mpsc::UnboundedSender<Pushed>,
    /// TLS for every address but the NameServers'.
    tls: Option<TlsConnector>,
    /// The NameServers' addresses, and TLS for them.
    namesrvs: Vec<String>,
    namesrv_tls: Option<TlsConnector>,
    credentials: Option<AccessKey>,
}

impl Links {
    pub fn new(pushes: mpsc::UnboundedSender<Pushed>, credentials: Option<AccessKey>) -> Links {
        Links {
            links: Mutex::default(),
            backoff: Mutex::default(),
            pushes,
            tls: None,
            namesrvs: Vec::new(),
            namesrv_tls: None,
            credentials,
        }
    }

    /// Connects with TLS to every address except `namesrvs`.
    pub fn with_tls(mut self, config: Option<Arc<ClientConfig>>, namesrvs: Vec<String>) -> Links {
        self.tls = config.map(TlsConnector::from);
        self.namesrvs = namesrvs;
        self
    }

    /// Connects with TLS to the NameServers (given to [`Links::with_tls`]).
    pub fn with_namesrv_tls(mut self, config: Option<Arc<ClientConfig>>) -> Links {
        self.namesrv_tls = config.map(TlsConnector::from);
        self
    }

    async fn connect(&self, addr: &str) -> Result<Link, Error> {
        let tls = if self.namesrvs.iter().any(|a| a == addr) {
            self.namesrv_tls.as_ref()
        } else {
            self.tls.as_ref()
        };
        let Some(connector) = tls else {
            return Ok(Link::connect(addr, CONNECT_TIMEOUT, Some(self.pushes.clone())).await?);
        };
        let connect_err = |source| Error::Connect {
            addr: addr.to_owned(),
            source,
        };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| connect_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
        let handshake = async {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            connector.connect(name, tcp).await
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| connect_err(std::io::ErrorKind::TimedOut.into()))?
            .map_err(connect_err)?;
        Ok(Link::over(addr, stream, Some(self.pushes.clone())))
    }

    /// The open link to `addr`, connecting if there is none.
    pub async fn get(&self, addr: &str) -> Result<Arc<Link>, Error> {
        if let Some(l) = lock(&self.links).get(addr).filter(|l| !l.is_closed()) {
            return Ok(l.clone());
        }
        if let Some(b) = lock(&self.backoff).get(addr) {
            let now = Instant::now();
            if b.until > now {
                return Err(Error::Unreachable {
                    addr: addr.to_owned(),
                    retry_in: b.until - now,
                });
            }
        }
        match self.connect(addr).await {
            Ok(link) => {
                lock(&self.backoff).remove(addr);
                let link = Arc::new(link);
                let mut links = lock(&self.links);
                // Another task may have connected meanwhile; keep one.
                let kept = links
                    .entry(addr.to_owned())
                    .and_modify(|l| {
                        if l.is_closed() {
                            *l = link.clone();
                        }
                    })
                    .or_insert_with(|| link.clone());
                Ok(kept.clone())
            }
            Err(e) => {
                let mut b = lock(&self.backoff);
                let entry = b.entry(addr.to_owned()).or_insert(Backoff {
                    until: Instant::now(),
                    next: FIRST_BACKOFF,
                });
                entry.until = Instant::now() + entry.next;
                entry.next = (entry.next * 2).min(MAX_BACKOFF);
                Err(e)
            }
        }
    }

    /// Sends a request to `addr` and returns its response, whatever its code.
    pub async fn request(
        &self,
        addr: &str,
        cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, Error> {
        Ok(self
            .get(addr)
            .await?
            .call(stamp(cmd, self.credentials.as_ref()), timeout)
            .await?)
    }

    /// [`Links::request`], with any code but `SUCCESS` turned into [`Error::Refused`].
    pub async fn call(
        &self,
        addr: &str,
        cmd: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, Error> {
        let resp = self.request(addr, cmd, timeout).await?;
        if resp.code != rocketgate_remoting::code::response::SUCCESS {
            return Err(refused(addr, &resp));
        }
        Ok(resp)
    }

    pub async fn oneway(&self, addr: &str, cmd: RemotingCommand) -> Result<(), Error> {
        Ok(self
            .get(addr)
            .await?
            .oneway(stamp(cmd, self.credentials.as_ref()))
            .await?)
    }

    /// Drops every link (their tasks end once in-flight users let go).
    pub fn close_all(&self) {
        lock(&self.links).clear();
    }
}

/// The error for a failure response.
pub(crate) fn refused(addr: &str, resp: &RemotingCommand) -> Error {
    Error::Refused {
        addr: addr.to_owned(),
        code: resp.code,
        remark: resp.remark.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_connect_backs_off() {
        let (tx, _rx) = mpsc::unbounded_channel();
        let links = Links::new(tx, None);
        // Bind then drop: a port nobody listens on.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.to_string())
            .unwrap();
        assert!(matches!(links.get(&addr).await, Err(Error::Connect { .. })));
        // Right after, the address is in back-off: no new connect attempt.
        assert!(matches!(
            links.get(&addr).await,
            Err(Error::Unreachable { .. })
        ));
    }
}
