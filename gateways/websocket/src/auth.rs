//! The authentication seam. The binary plugs `rocketgate-auth`'s user store in
//! here (API keys and JWTs as tokens, the user's ACL as the connection's grant);
//! the default lets everyone in.
//!
//! A client presents a token in the query string (`/v1/ws?token=…`, also for
//! `/mqtt`) or, on `/v1/ws`, in its first frame (`{"op":"auth","token":"…"}`),
//! for browsers that would rather not put it in a URL. The [`Authenticator`] is
//! asked at the upgrade with the query token (or `None`):
//! - [`AuthDecision::Allow`]: the connection is open for business;
//! - [`AuthDecision::AllowWith`]: open, with what it may publish and subscribe to
//!   (a denied publish or subscribe is answered with an error frame `forbidden`)
//!   and, for a credential that expires (a JWT's `exp`), until when: then the
//!   connection gets an error frame `token_expired` and is closed with code 4401;
//! - [`AuthDecision::Deny`]: the upgrade is refused with `401` and a JSON body;
//! - [`AuthDecision::TokenRequired`]: on `/v1/ws` the socket opens but the first
//!   frame must be `auth` (asked again with that token; anything else closes with
//!   1008 "policy violation"); on `/mqtt` the connection proceeds, since MQTT
//!   authenticates in its own CONNECT packet.
//!
//! Over WSS with a verified client certificate the attempt carries its name
//! ([`AuthAttempt::tls_identity`]), which the authenticator may take as the user
//! (mTLS) when no token is presented.
//!
//! It is called on the connection's task, so it must not block.

use std::net::SocketAddr;

/// Which door a client is knocking on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `/v1/ws`, the JSON protocol.
    Json,
    /// `/mqtt`, MQTT over WebSocket.
    Mqtt,
}

/// One authentication attempt.
#[derive(Debug, Clone, Copy)]
pub struct AuthAttempt<'a> {
    pub door: Door,
    pub peer: SocketAddr,
    /// The token presented, if any.
    pub token: Option<&'a str>,
    /// True when the token came in the first frame rather than the query string.
    pub first_frame: bool,
    /// The verified TLS client certificate's name (WSS with mTLS), `None` without one.
    pub tls_identity: Option<&'a str>,
}

/// What an [`Authenticator`] decided.
#[derive(Debug, Clone)]
pub enum AuthDecision {
    Allow,
    /// Allowed, limited to what the grant allows, until `expires_at` (a JWT's
    /// `exp`; `None`: for as long as the connection lasts).
    AllowWith {
        grant: std::sync::Arc<rocketgate_auth::Grant>,
        expires_at: Option<std::time::SystemTime>,
    },
    /// Refused, with a reason the client sees.
    Deny(String),
    /// No (valid) token yet: ask for one in the first frame.
    TokenRequired,
}

/// Decides who may connect. Any `Fn(&AuthAttempt) -> AuthDecision` closure is one.
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate(&self, attempt: &AuthAttempt<'_>) -> AuthDecision;
}

impl<F> Authenticator for F
where
    F: Fn(&AuthAttempt<'_>) -> AuthDecision + Send + Sync + 'static,
{
    fn authenticate(&self, attempt: &AuthAttempt<'_>) -> AuthDecision {
        self(attempt)
    }
}

/// The default: everyone is let in.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Authenticator for AllowAll {
    fn authenticate(&self, _: &AuthAttempt<'_>) -> AuthDecision {
        AuthDecision::Allow
    }
}
