//! Browser pages: the `Origin` allow-list (`http.allowed_origins`) and CORS.
//!
//! A request without `Origin` (curl, apps, devices) passes untouched. One from a
//! listed origin passes and gets `Access-Control-Allow-Origin` for it (a preflight
//! `OPTIONS` is answered here, 204). Any other origin is refused with 403
//! `forbidden_origin` before the request reaches a handler, so a cross-site page
//! cannot publish, consume or call the admin API with its visitor's network
//! position. With the default empty list no CORS header is ever sent.

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
    match origins.check(origin.as_deref()) {
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
