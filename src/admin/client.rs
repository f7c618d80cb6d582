//! The admin CLI's HTTP client: one request per connection over hyper (already
//! in the tree for the HTTP door), JSON in and out, and the failures mapped to
//! the exit codes scripts rely on (`Failure`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use rocketgate_tls::rustls::ClientConfig;
use rocketgate_tls::rustls::pki_types::ServerName;
use serde_json::Value;

/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take (a long poll asks for less).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Exit codes of `rocketgate admin` (docs/operations.md).
pub mod exit {
    /// Done.
    pub const OK: u8 = 0;
    /// Bad arguments, or the server refused the request as invalid (400, 409, …)
    /// or failed (5xx).
    pub const USAGE: u8 = 1;
    /// What the command names does not exist (404).
    pub const NOT_FOUND: u8 = 2;
    /// No answer: connection refused, DNS, timeout.
    pub const UNREACHABLE: u8 = 3;
    /// No valid credentials (401) or not allowed (403).
    pub const FORBIDDEN: u8 = 4;
}

/// Why a command failed, with the exit code it ends with.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::USAGE,
            message: message.into(),
        }
    }

    fn unreachable(server: &str, why: impl std::fmt::Display) -> Failure {
        Failure {
            code: exit::UNREACHABLE,
            message: format!("cannot reach {server}: {why}"),
        }
    }

    /// An HTTP error answer: `{"error": {"code", "message"}}`.
    fn from_answer(status: u16, body: &Value) -> Failure {
        let code = match status {
            404 => exit::NOT_FOUND,
            401 | 403 => exit::FORBIDDEN,
            _ => exit::USAGE,
        };
        let e = &body["error"];
        let message = match (e["code"].as_str(), e["message"].as_str()) {
            (Some(c), Some(m)) => format!("{m} (HTTP {status}, {c})"),
            _ => format!("HTTP {status}: {body}"),
        };
        Failure { code, message }
    }
}

/// Where and as whom to ask.
#[derive(Clone)]
pub struct Client {
    /// `host:port`
    authority: String,
    /// The host, for TLS server-name checks (`localhost`, `10.0.0.7`, `[::1]` → `::1`).
    host: String,
    /// Path prefix of the server URL (usually empty).
    base: String,
    /// As given, for messages.
    server: String,
    auth: Option<String>,
    /// Set for an `https://` server: whom to trust.
    tls: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Where a TLS client finds the system's CA bundle (Debian / Ubuntu / Alpine; the
/// Docker image's `ca-certificates`), used for `https://` without `--cacert`.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

impl Client {
    /// `server`: `http://host:port[/prefix]` or `https://…` (trusting the PEM CA file
    /// `cacert`, else the system's CA bundle).
    pub fn new(
        server: &str,
        api_key: Option<&str>,
        user: Option<&str>,
        password: Option<&str>,
        cacert: Option<&Path>,
    ) -> Result<Client, Failure> {
        let (rest, https) = if let Some(r) = server.strip_prefix("http://") {
            (r, false)
        } else if let Some(r) = server.strip_prefix("https://") {
            (r, true)
        } else {
            (server, false)
        };
        if cacert.is_some() && !https {
            return Err(Failure::usage(
                "--cacert is for an https:// server; this one is plain http",
            ));
        }
        let tls = if https {
            let ca = match cacert {
                Some(p) => p.to_path_buf(),
                None if Path::new(SYSTEM_CA_BUNDLE).is_file() => PathBuf::from(SYSTEM_CA_BUNDLE),
                None => {
                    return Err(Failure::usage(format!(
                        "--server {server}: name the CA that issued the node's certificate \
                         with --cacert FILE (or ROCKETGATE_CACERT); there is no system CA \
                         bundle at {SYSTEM_CA_BUNDLE}"
                    )));
                }
            };
            let config = rocketgate_tls::client_config(&ca)
                .map_err(|e| Failure::usage(format!("--cacert {}: {e}", ca.display())))?;
            Some(Arc::new(config))
        } else {
            None
        };
        let (authority, base) = match rest.split_once('/') {
            Some((a, p)) => (a, format!("/{}", p.trim_end_matches('/'))),
            None => (rest, String::new()),
        };
        if authority.is_empty() {
            return Err(Failure::usage(format!("--server: no host in {server:?}")));
        }
        let has_port = match authority.rfind(']') {
            Some(end) => authority[end..].contains(':'),
            None => authority.contains(':'),
        };
        let authority = if has_port {
            authority.to_owned()
        } else {
            format!("{authority}:{}", if https { 443 } else { 80 })
        };
        let host = match authority.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']').to_owned(),
            None => authority.clone(),
        };
        let base = if base == "/" { String::new() } else { base };
        let auth = match (api_key, user, password) {
            (Some(k), None, _) => Some(format!("Bearer {k}")),
            (None, Some(u), Some(p)) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )),
            (None, Some(_), None) => {
                return Err(Failure::usage("--user needs --password"));
            }
            (None, None, Some(_)) => return Err(Failure::usage("--password needs --user")),
            (Some(_), Some(_), _) => {
                return Err(Failure::usage("give --api-key or --user, not both"));
            }
            (None, None, None) => None,
        };
        Ok(Client {
            authority,
            host,
            base,
            server: server.to_owned(),
            auth,
            tls,
        })
    }

    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.call("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Result<Value, Failure> {
        self.call("POST", path, Some(Bytes::from(body.to_string())))
            .await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Result<Value, Failure> {
        self.call("PATCH", path, Some(Bytes::from(body.to_string())))
            .await
    }

    pub async fn put(&self, path: &str, body: Value) -> Result<Value, Failure> {
        self.call("PUT", path, Some(Bytes::from(body.to_string())))
            .await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, Failure> {
        self.call("DELETE", path, None).await
    }

    /// A raw body (a message to publish).
    pub async fn post_bytes(&self, path: &str, body: Bytes) -> Result<Value, Failure> {
        self.call("POST", path, Some(body)).await
    }

    /// One request; the JSON answer of a 2xx (`null` for an empty one).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Value, Failure> {
        let (status, bytes) = self.raw(method, path, body).await?;
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        if (200..300).contains(&status) {
            Ok(value)
        } else {
            Err(Failure::from_answer(status, &value))
        }
    }

    /// The status and body of one request, whatever the status.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(u16, Bytes), Failure> {
        let connect = tokio::net::TcpStream::connect(&self.authority);
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => return Err(Failure::unreachable(&self.server, "connect timed out")),
            Ok(Err(e)) => return Err(Failure::unreachable(&self.server, e)),
            Ok(Ok(s)) => s,
        };
        let req = self.request(method, path, body)?;
        match &self.tls {
            None => self.exchange(stream, req).await,
            Some(config) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|e| {
                    Failure::usage(format!("--server: {:?} is not a TLS name: {e}", self.host))
                })?;
                let connector = rocketgate_tls::tokio_rustls::TlsConnector::from(config.clone());
                let handshake = connector.connect(name, stream);
                let tls = match tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
                    Err(_) => {
                        return Err(Failure::unreachable(
                            &self.server,
                            "TLS handshake timed out",
                        ));
                    }
                    Ok(Err(e)) => {
                        return Err(Failure {
                            code: exit::UNREACHABLE,
                            message: format!(
                                "TLS with {}: {e} (is the node's certificate issued by the CA \
                                 given with --cacert / ROCKETGATE_CACERT, for this host name?)",
                                self.server
                            ),
                        });
                    }
                    Ok(Ok(s)) => s,
                };
                self.exchange(tls, req).await
            }
        }
    }

    /// The request for one call.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Request<Full<Bytes>>, Failure> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json");
        if body.is_some() && !path.contains("/messages") {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(a) = &self.auth {
            req = req.header(hyper::header::AUTHORIZATION, a);
        }
        req.body(Full::new(body.unwrap_or_default()))
            .map_err(|e| Failure::usage(format!("bad request: {e}")))
    }

    /// One request and its answer over an open connection (plain or TLS).
    async fn exchange<S>(
        &self,
        stream: S,
        req: Request<Full<Bytes>>,
    ) -> Result<(u16, Bytes), Failure>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failure::unreachable(&self.server, e))?;
        let driver = tokio::spawn(conn);
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let resp = sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, bytes))
        })
        .await;
        driver.abort();
        match answer {
            Err(_) => Err(Failure::unreachable(&self.server, "no answer in time")),
            Ok(Err(e)) => Err(Failure::unreachable(&self.server, e)),
            Ok(Ok(r)) => Ok(r),
        }
    }
}

/// Percent-encodes a path segment or query value.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
