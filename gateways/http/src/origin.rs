//! Browser pages: the `Origin` allow-list (`http.allowed_origins`) and CORS.
//!
//! A request without `Origin` (curl, apps, devices) passes untouched. One from a
//! listed origin passes and gets `Access-Control-Allow-Origin` for it (a preflight
//! `OPTIONS` is answered here, 204). Any other origin is refused with 403
//! `forbidden_origin` before the request reaches a handler, so a cross-site page
//! cannot publish, consume or call the admin API with its visitor's network
//! position. With the default empty list no CORS header is ever sent.
//!
//! A page of the node itself (the dashboard at `/dashboard`) is same-origin: its
//! `Origin` names the `Host` it was loaded from, and browsers send it on every POST
//! and DELETE. That passes without being listed when the host is an IP address or
//! `localhost` ([`same_origin`]). Through a DNS name it must be listed: a page of a
//! hostile name that re-resolves to the node (DNS rebinding) also looks same-origin.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD,
    HeaderValue, ORIGIN, VARY,
};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rocketgate_tls::{OriginCheck, Origins};

use crate::Error;

const METHODS: &str = "GET, POST, PUT, DELETE, OPTIONS";
const DEFAULT_HEADERS: &str = "content-type, authorization";

/// The middleware (outermost layer of the router).
pub(crate) async fn guard(
    State(origins): State<Arc<Origins>>,
    req: Request,
    next: Next,
) -> Response {
    let origin = req
        .headers()
        .get(ORIGIN)
        .map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned());
    let host = req
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let check = match (origin.as_deref(), host) {
        (Some(o), Some(h)) if same_origin(o, h) => OriginCheck::None,
        (o, _) => origins.check(o),
    };
    match check {
        OriginCheck::None => next.run(req).await,
        OriginCheck::Refused => Error::ForbiddenOrigin {
            origin: origin.unwrap_or_default(),
        }
        .into_response(),
        OriginCheck::Allowed => {
            let Ok(allow) = HeaderValue::from_str(origin.as_deref().unwrap_or_default()) else {
                return Error::ForbiddenOrigin {
                    origin: origin.unwrap_or_default(),
                }
                .into_response();
            };
            let preflight = req.method() == Method::OPTIONS
                && req.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD);
            let mut resp = if preflight {
                let asked = req
                    .headers()
                    .get(ACCESS_CONTROL_REQUEST_HEADERS)
                    .cloned()
                    .unwrap_or(HeaderValue::from_static(DEFAULT_HEADERS));
                let mut r = StatusCode::NO_CONTENT.into_response();
                let h = r.headers_mut();
                h.insert(
                    ACCESS_CONTROL_ALLOW_METHODS,
                    HeaderValue::from_static(METHODS),
                );
                h.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked);
                h.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
                r
            } else {
                next.run(req).await
            };
            let h = resp.headers_mut();
            h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            h.append(VARY, HeaderValue::from_static("Origin"));
            resp
        }
    }
}

/// Is `origin` the node's own (`http(s)://` + the request's `Host`), reached by an
/// IP address or `localhost`? Names are left to the allow-list (DNS rebinding).
pub(crate) fn same_origin(origin: &str, host: &str) -> bool {
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    if !rest.eq_ignore_ascii_case(host) {
        return false;
    }
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::same_origin;

    #[test]
    fn a_page_of_the_node_itself_is_same_origin_by_address_only() {
        assert!(same_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(same_origin("https://[::1]:8443", "[::1]:8443"));
        assert!(same_origin("http://localhost:8080", "localhost:8080"));
        assert!(same_origin("http://10.0.0.7", "10.0.0.7"));
        // Another port or host is another origin.
        assert!(!same_origin("http://127.0.0.1:9999", "127.0.0.1:8080"));
        assert!(!same_origin("http://evil.example", "127.0.0.1:8080"));
        // A name, even matching, is left to the allow-list (DNS rebinding).
        assert!(!same_origin(
            "http://evil.example:8080",
            "evil.example:8080"
        ));
        assert!(!same_origin("null", "127.0.0.1:8080"));
    }
}
