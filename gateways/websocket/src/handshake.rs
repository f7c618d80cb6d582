//! The HTTP/1.1 upgrade, done here rather than by tungstenite so every refusal
//! is a clear HTTP answer with a JSON body: an unknown path is `404`, a plain
//! HTTP request `426`, `/mqtt` without an MQTT handler `501`, a refused token
//! `401`. The `mqtt` subprotocol is echoed back (MQTT.js insists on it).

use std::net::SocketAddr;

use bytes::BytesMut;
use rocketgate_tls::{OriginCheck, Origins, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::auth::{AuthAttempt, AuthDecision, Authenticator, Door};

/// Longest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

/// A request that may become a WebSocket.
#[derive(Debug)]
pub(crate) struct Upgrade {
    pub door: Door,
    /// The subprotocol echoed in the 101 answer.
    pub protocol: Option<&'static str>,
    /// Bytes the client sent after the request head (the first frames, if it
    /// did not wait for the answer).
    pub rest: Vec<u8>,
    /// On `/v1/ws`: the first frame must be `auth`.
    pub token_required: bool,
    /// What the connection may do (`None`: everything).
    pub grant: Option<std::sync::Arc<rocketgate_auth::Grant>>,
    /// When its credential expires (a JWT's `exp`).
    pub expires_at: Option<std::time::SystemTime>,
}

/// A refusal: status line, JSON error code and message.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: &'static str,
    code: &'static str,
    message: String,
    extra_header: Option<&'static str>,
}

impl Refusal {
    fn new(status: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            status,
            code,
            message: message.into(),
            extra_header: None,
        }
    }

    pub fn timeout() -> Self {
        Refusal::new(
            "408 Request Timeout",
            "timeout",
            "no complete upgrade request in time",
        )
    }

    /// A browser page whose origin is not in `ws.allowed_origins`.
    pub fn forbidden_origin() -> Self {
        Refusal::new(
            "403 Forbidden",
            "forbidden_origin",
            "this page's origin may not open a WebSocket here (ws.allowed_origins)",
        )
    }

    fn bad(message: impl Into<String>) -> Self {
        Refusal::new("400 Bad Request", "bad_request", message)
    }

    /// The whole HTTP answer.
    pub fn to_http(&self) -> Vec<u8> {
        let body =
            serde_json::json!({"error": {"code": self.code, "message": self.message}}).to_string();
        let extra = self.extra_header.unwrap_or("");
        format!(
            "HTTP/1.1 {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
            self.status,
            body.len()
        )
        .into_bytes()
    }
}

/// Reads the request head (bounded in size; the caller bounds the time).
pub(crate) async fn read_head(stream: &mut Stream) -> Result<BytesMut, Refusal> {
    let mut buf = BytesMut::with_capacity(1024);
    loop {
        if find_head_end(&buf).is_some() {
            return Ok(buf);
        }
        if buf.len() >= MAX_HEAD {
            return Err(Refusal::new(
                "431 Request Header Fields Too Large",
                "bad_request",
                format!("the request head is longer than {MAX_HEAD} bytes"),
            ));
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => {
                return Err(Refusal::bad(
                    "the connection closed before the request head ended",
                ));
            }
            Ok(_) => {}
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Parses and checks the request head; on success returns the upgrade and the
/// 101 answer to write.
pub(crate) fn accept(
    head: &[u8],
    peer: SocketAddr,
    tls_identity: Option<&str>,
    auth: &dyn Authenticator,
    mqtt_enabled: bool,
) -> Result<(Upgrade, Vec<u8>), Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(head) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err(Refusal::bad("incomplete request head")),
        Err(e) => return Err(Refusal::bad(format!("malformed HTTP request: {e}"))),
    };
    let target = req.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let door = match path {
        "/v1/ws" => Door::Json,
        "/mqtt" => Door::Mqtt,
        _ => {
            return Err(Refusal::new(
                "404 Not Found",
                "not_found",
                format!("no WebSocket endpoint at {path:?}; use /v1/ws (JSON) or /mqtt (MQTT)"),
            ));
        }
    };
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    let upgrade_ws = header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let connection_upgrade = header("connection").is_some_and(|v| {
        v.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    });
    if req.method != Some("GET") || !upgrade_ws || !connection_upgrade {
        let mut r = Refusal::new(
            "426 Upgrade Required",
            "upgrade_required",
            format!("{path} speaks WebSocket: send a GET with Upgrade: websocket"),
        );
        r.extra_header = Some("Upgrade: websocket\r\n");
        return Err(r);
    }
    if header("sec-websocket-version") != Some("13") {
        let mut r = Refusal::bad("unsupported WebSocket version; this server speaks 13");
        r.extra_header = Some("Sec-WebSocket-Version: 13\r\n");
        return Err(r);
    }
    let key = header("sec-websocket-key")
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Refusal::bad("missing Sec-WebSocket-Key"))?;

    let offered: Vec<&str> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("sec-websocket-protocol"))
        .filter_map(|h| std::str::from_utf8(h.value).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let protocol = match door {
        Door::Json => None,
        Door::Mqtt => {
            if !mqtt_enabled {
                return Err(Refusal::new(
                    "501 Not Implemented",
                    "mqtt_disabled",
                    "MQTT over WebSocket is not enabled on this server",
                ));
            }
            // MQTT 5 §6: the client offers "mqtt"; MQTT 3.1 clients offered "mqttv3.1".
            let pick = ["mqtt", "mqttv3.1"]
                .into_iter()
                .find(|p| offered.iter().any(|o| o.eq_ignore_ascii_case(p)));
            if pick.is_none() && !offered.is_empty() {
                return Err(Refusal::bad(format!(
                    "/mqtt speaks the \"mqtt\" subprotocol; the client offered {offered:?}"
                )));
            }
            pick
        }
    };

    let token = query_param(query, "token");
    let decision = auth.authenticate(&AuthAttempt {
        door,
        peer,
        token: token.as_deref(),
        first_frame: false,
        tls_identity,
    });
    let (mut grant, mut expires_at) = (None, None);
    let token_required = match decision {
        AuthDecision::Allow => false,
        AuthDecision::AllowWith {
            grant: g,
            expires_at: e,
        } => {
            grant = Some(g);
            expires_at = e;
            false
        }
        AuthDecision::Deny(reason) => {
            return Err(Refusal::new("401 Unauthorized", "unauthorized", reason));
        }
        AuthDecision::TokenRequired => door == Door::Json,
    };

    let mut answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
        derive_accept_key(key.as_bytes())
    );
    if let Some(p) = protocol {
        answer.push_str(&format!("Sec-WebSocket-Protocol: {p}\r\n"));
    }
    answer.push_str("\r\n");
    Ok((
        Upgrade {
            door,
            protocol,
            rest: head[len..].to_vec(),
            token_required,
            grant,
            expires_at,
        },
        answer.into_bytes(),
    ))
}

/// The `Origin` of a request head (already parsed once by [`accept`]) against the
/// allow-list.
pub(crate) fn origin(head: &[u8], origins: &Origins) -> OriginCheck {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if req.parse(head).is_err() {
        return OriginCheck::Refused;
    }
    let origin = req
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("origin"))
        .map(|h| std::str::from_utf8(h.value).unwrap_or("\u{fffd}"));
    origins.check(origin)
}

/// The value of `name` in a query string, percent-decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes a refusal and closes.
pub(crate) async fn refuse(stream: &mut Stream, refusal: &Refusal) {
    let _ = stream.write_all(&refusal.to_http()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::AllowAll;

    fn peer() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    fn req(path: &str, extra: &str) -> String {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
        )
    }

    #[test]
    fn accepts_v1_ws_with_the_rfc_accept_key() {
        let (up, answer) =
            accept(req("/v1/ws", "").as_bytes(), peer(), None, &AllowAll, false).unwrap();
        assert_eq!(up.door, Door::Json);
        let answer = String::from_utf8(answer).unwrap();
        assert!(answer.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(!answer.contains("Sec-WebSocket-Protocol"));
    }

    #[test]
    fn mqtt_echoes_the_subprotocol_or_refuses_clearly() {
        let r = req("/mqtt", "Sec-WebSocket-Protocol: mqtt\r\n");
        let err = accept(r.as_bytes(), peer(), None, &AllowAll, false).unwrap_err();
        assert!(err.status.starts_with("501"));
        let (up, answer) = accept(r.as_bytes(), peer(), None, &AllowAll, true).unwrap();
        assert_eq!(up.protocol, Some("mqtt"));
        assert!(
            String::from_utf8(answer)
                .unwrap()
                .contains("Sec-WebSocket-Protocol: mqtt\r\n")
        );
        let other = req("/mqtt", "Sec-WebSocket-Protocol: chat\r\n");
        assert!(
            accept(other.as_bytes(), peer(), None, &AllowAll, true)
                .unwrap_err()
                .status
                .starts_with("400")
        );
    }

    #[test]
    fn unknown_paths_and_plain_http_are_refused() {
        let err = accept(req("/nope", "").as_bytes(), peer(), None, &AllowAll, true).unwrap_err();
        assert!(err.status.starts_with("404"));
        let plain = "GET /v1/ws HTTP/1.1\r\nHost: x\r\n\r\n";
        let err = accept(plain.as_bytes(), peer(), None, &AllowAll, true).unwrap_err();
        assert!(err.status.starts_with("426"));
        assert!(
            String::from_utf8(err.to_http())
                .unwrap()
                .contains("\"upgrade_required\"")
        );
    }

    #[test]
    fn query_tokens_reach_the_authenticator() {
        let auth = |a: &AuthAttempt<'_>| match a.token {
            Some("s3cret") => AuthDecision::Allow,
            Some(_) => AuthDecision::Deny("bad token".into()),
            None => AuthDecision::TokenRequired,
        };
        let ok = req("/v1/ws?x=1&token=s3cr%65t", "");
        assert!(
            !accept(ok.as_bytes(), peer(), None, &auth, true)
                .unwrap()
                .0
                .token_required
        );
        let bad = req("/v1/ws?token=nope", "");
        assert!(
            accept(bad.as_bytes(), peer(), None, &auth, true)
                .unwrap_err()
                .status
                .starts_with("401")
        );
        let none = req("/v1/ws", "");
        assert!(
            accept(none.as_bytes(), peer(), None, &auth, true)
                .unwrap()
                .0
                .token_required
        );
    }
}
