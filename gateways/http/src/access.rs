//! Authentication and the ACL at the HTTP door: every endpoint of the table in
//! `routes.rs` says what it needs ([`Need`], from its tag and path),
//! and with auth on a layer in front of it asks for `Authorization: Bearer <API
//! key or JWT>` or `Basic <user:password>` (401 JSON without valid credentials)
//! and checks the grant (403 JSON when not allowed).
//!
//! - publish: publish on `topic/tag` (`tag` from the query; a batch: each message
//!   on `topic/tag`, checked by the handler before anything is stored, so one
//!   denied message refuses the whole batch with 403);
//! - consume with a group: subscribe on `topic` as that group, or consuming as the
//!   group when the path names no topic (acks, nacks); replay: subscribe on `topic`;
//! - admin endpoints and lookups by id or key: the admin permission; their `GET`s
//!   (users excepted) also the `monitor` permission (read-only: the web dashboard of
//!   a user who may look but not change);
//! - transactions and `GET /v1/session` (who am I, what may I do): any
//!   authenticated user; `/health*`, `/metrics` and the OpenAPI
//!   document: open (probes and scrapers).
//!
//! Grants are compiled once per user and store generation ([`Grants`]); a password
//! given with Basic is verified through the credential cache of `rocketgate-auth`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, RawPathParams, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use rocketgate_auth::{Credentials, Denied, Grant, Identity};
use rocketgate_core::broker::MessagingApi;
use rocketgate_core::sync::lock;

use crate::error::Error;
use crate::{Ctx, Peer};

/// What an endpoint needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: health, metrics, the OpenAPI document, the dashboard's files.
    Open,
    /// Any authenticated user.
    User,
    /// Publish on the path's topic (and the query's tag).
    Publish,
    /// Subscribe on the path's topic, as the path's group if it names one.
    Subscribe,
    /// The admin permission.
    Admin,
    /// Reading the admin API: the `monitor` permission (or admin).
    Monitor,
}

impl Need {
    /// What an endpoint tagged `tag` in the table needs (`admin`, `lookup`: admin).
    pub fn of(tag: &str) -> Need {
        match tag {
            // Probes, the scraper, the document and the dashboard's static files
            // (the page asks for credentials for the API calls it makes).
            "ops" | "dashboard" => Need::Open,
            "messages" => Need::Publish,
            "consume" => Need::Subscribe,
            "transactions" | "session" => Need::User,
            _ => Need::Admin,
        }
    }

    /// What an endpoint of the table needs: [`Need::of`] its tag, except that an
    /// admin `GET` (other than the user list) is open to the `monitor` permission.
    pub fn of_endpoint(tag: &str, method: &axum::http::Method, path: &str) -> Need {
        match Need::of(tag) {
            Need::Admin if method == axum::http::Method::GET && !path.starts_with("/v1/users") => {
                Need::Monitor
            }
            need => need,
        }
    }
}

/// Who made a request and what they may do, put into the request's extensions
/// by [`check`] (absent with auth off).
#[derive(Debug, Clone)]
pub struct Caller {
    pub user: String,
    pub admin: bool,
    pub monitor: bool,
    /// The caller's rules, for checks the layer cannot make from the path and
    /// query alone (each message of a batch publish on `topic/tag`).
    pub grant: Arc<Grant>,
}

/// The answer of `GET /v1/session`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Session {
    /// Whether authentication is on.
    pub auth: bool,
    /// The signed-in user (`null` with auth off).
    pub user: Option<String>,
    /// May change things (the admin permission; everything with auth off).
    pub admin: bool,
    /// May read the admin API (`monitor` or admin).
    pub monitor: bool,
}

/// `GET /v1/session`: who the caller is and whether they may change things (the
/// dashboard disables its buttons for read-only users; the server checks anyway).
pub async fn session<B: MessagingApi + 'static>(
    State(ctx): State<Arc<Ctx<B>>>,
    caller: Option<axum::Extension<Caller>>,
) -> axum::Json<Session> {
    let auth = ctx.settings.auth.enabled();
    axum::Json(match caller {
        Some(axum::Extension(c)) => Session {
            auth,
            user: Some(c.user),
            admin: c.admin,
            monitor: c.monitor,
        },
        None => Session {
            auth,
            user: None,
            admin: true,
            monitor: true,
        },
    })
}

/// Compiled grants per user, valid for one generation of the user store. A std
/// lock held for one map operation.
#[derive(Debug, Default)]
pub struct Grants(Mutex<HashMap<String, (u64, Arc<Grant>)>>);

impl Grants {
    fn of(&self, auth: &rocketgate_auth::Auth, who: &Identity) -> Arc<Grant> {
        let generation = auth.generation();
        if let Some((g, grant)) = lock(&self.0).get(&who.user)
            && *g == generation
        {
            return grant.clone();
        }
        let grant = Arc::new(auth.grant(who, ""));
        let mut map = lock(&self.0);
        if map.len() > 10_000 {
            map.clear();
        }
        map.insert(who.user.clone(), (generation, grant.clone()));
        grant
    }
}

/// What an `Authorization` header presents.
enum Presented {
    Nothing,
    Basic(String, Vec<u8>),
    Bearer(String),
}

/// The credentials of an `Authorization` header.
fn credentials(req: &Request) -> Result<Presented, Error> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Ok(Presented::Nothing);
    };
    let bad = |why: &str| Error::Unauthorized {
        reason: format!("Authorization header: {why}"),
    };
    let value = value.to_str().map_err(|_| bad("not text"))?;
    let (scheme, rest) = value
        .split_once(' ')
        .ok_or_else(|| bad("expected `Bearer <token>` or `Basic <base64>`"))?;
    if scheme.eq_ignore_ascii_case("bearer") {
        Ok(Presented::Bearer(rest.trim().to_owned()))
    } else if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest.trim())
            .map_err(|_| bad("Basic credentials are not base64"))?;
        let colon = raw
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| bad("Basic credentials without `:`"))?;
        let user =
            String::from_utf8(raw[..colon].to_vec()).map_err(|_| bad("user name is not UTF-8"))?;
        Ok(Presented::Basic(user, raw[colon + 1..].to_vec()))
    } else {
        Err(bad("expected `Bearer <token>` or `Basic <base64>`"))
    }
}

fn unauthorized(e: Error) -> Response {
    let mut resp = e.into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer, Basic realm=\"rocketgate\""),
    );
    resp
}

fn query_tag(req: &Request) -> Option<String> {
    let q = req.uri().query()?;
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "tag").then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                match (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) {
                    (Some(h), Some(l)) => {
                        out.push(h << 4 | l);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The layer in front of an endpoint needing `need` (installed only with auth on).
pub async fn check<B: MessagingApi + 'static>(
    State((ctx, need)): State<(Arc<Ctx<B>>, Need)>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    params: RawPathParams,
    req: Request,
    next: Next,
) -> Response {
    if need == Need::Open {
        return next.run(req).await;
    }
    let auth = &ctx.settings.auth;
    let presented = match credentials(&req) {
        Ok(c) => c,
        Err(e) => return unauthorized(e),
    };
    let creds = match &presented {
        Presented::Bearer(t) => Credentials::Bearer(t),
        Presented::Basic(u, p) => Credentials::Password {
            username: u,
            password: p,
        },
        // mTLS: a verified client certificate stands for its user when nothing else
        // is presented (and `auth.certificate_identity` is on).
        Presented::Nothing => match peer.tls_identity.as_deref() {
            Some(name) if auth.settings().certificate_identity => Credentials::Certificate(name),
            _ => Credentials::None,
        },
    };
    let login = match auth.login(creds, peer.addr.ip(), "http").await {
        Ok(l) => l,
        Err(e) => {
            let reason = match e {
                Denied::Missing => {
                    "credentials required: `Authorization: Bearer <token>` or Basic".to_owned()
                }
                other => other.to_string(),
            };
            return unauthorized(Error::Unauthorized { reason });
        }
    };
    let grant = ctx.grants.of(auth, &login.identity);
    let mut topic = None;
    let mut group = None;
    for (k, v) in &params {
        match k {
            "topic" => topic = Some(v.to_owned()),
            "group" => group = Some(v.to_owned()),
            _ => {}
        }
    }
    let (allowed, what) = match need {
        Need::Open | Need::User => (true, String::new()),
        Need::Admin => (grant.may_admin(), "the admin API".to_owned()),
        Need::Monitor => (grant.may_monitor(), "reading the admin API".to_owned()),
        // A batch names its tags in the body: the handler checks each message
        // (`publish::publish_batch`) before storing any.
        Need::Publish if req.uri().path().ends_with("/batch") => (true, String::new()),
        Need::Publish => {
            let topic = topic.unwrap_or_default();
            let name = match query_tag(&req) {
                Some(tag) => format!("{topic}/{tag}"),
                None => topic,
            };
            (grant.may_publish(&name), format!("publishing to {name}"))
        }
        Need::Subscribe => match (&topic, &group) {
            (Some(t), g) => (
                grant.may_subscribe(t, g.as_deref()),
                format!(
                    "reading {t}{}",
                    g.as_ref()
                        .map(|g| format!(" as group {g}"))
                        .unwrap_or_default()
                ),
            ),
            (None, Some(g)) => (grant.may_consume_as(g), format!("consuming as group {g}")),
            (None, None) => (false, "this endpoint".to_owned()),
        },
    };
    if !allowed {
        metrics::counter!("rocketgate_acl_denied_total", "door" => "http", "action" => format!("{need:?}").to_lowercase())
            .increment(1);
        tracing::info!(user = %login.identity.user, %what, "HTTP request denied by the ACL");
        return Error::Forbidden {
            reason: format!("user {:?} is not allowed {what}", login.identity.user),
        }
        .into_response();
    }
    let mut req = req;
    req.extensions_mut().insert(Caller {
        user: login.identity.user.clone(),
        admin: grant.may_admin(),
        monitor: grant.may_monitor(),
        grant: grant.clone(),
    });
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_percent_decoded() {
        assert_eq!(percent_decode("room%2F1+x"), "room/1 x");
        assert_eq!(percent_decode("a%zz"), "a%zz");
        assert_eq!(percent_decode("%"), "%");
    }
}
