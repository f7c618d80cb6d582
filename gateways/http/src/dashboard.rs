//! The web dashboard at `/dashboard`: plain HTML, CSS and JavaScript files from
//! `gateways/http/dashboard/`, embedded in the binary with `include_bytes!` (no CDN,
//! no build step: `cargo build` is all it takes). The page is a client of the admin
//! API and `/metrics` like `curl` is; it holds no state and no secret, so the files
//! are open even with auth on (the API calls they make are checked as any other).
//!
//! Every file is answered with its content type, `Cache-Control: no-cache` and an
//! `ETag` (a browser revalidates and gets `304 Not Modified` until the binary
//! changes), `X-Content-Type-Options: nosniff`, and the page with a
//! `Content-Security-Policy` that allows only this origin. Any other name under
//! `/dashboard/` is a JSON `404 not_found`. The three routes are entries of the
//! table in `routes.rs` (documented in the OpenAPI document, open like `/health`).
//! User documentation: `docs/dashboard.md`.

use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::Error;
use crate::wire::Path;

/// One embedded file.
struct File {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const FILES: &[File] = &[
    File {
        name: "index.html",
        content_type: HTML,
        bytes: include_bytes!("../dashboard/index.html"),
    },
    File {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../dashboard/app.js"),
    },
    File {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../dashboard/app.css"),
    },
    File {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        bytes: include_bytes!("../dashboard/favicon.svg"),
    },
];

/// The content type of the page.
pub const HTML: &str = "text/html; charset=utf-8";

/// The names `/dashboard/{file}` serves.
pub const FILE_NAMES: &[&str] = &["index.html", "app.js", "app.css", "favicon.svg"];

/// The content types of those files.
pub const CONTENT_TYPES: &[&str] = &[
    HTML,
    "text/javascript; charset=utf-8",
    "text/css; charset=utf-8",
    "image/svg+xml",
];

/// Only this origin, no inline script or style, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /dashboard` and `GET /dashboard/`: the page.
pub async fn index(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

/// `GET /dashboard/{file}`: one of [`FILE_NAMES`], else `404 not_found`.
pub async fn file(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match FILES.iter().position(|f| f.name == name) {
        Some(i) => serve(i, &headers),
        None => Error::NotFound {
            what: format!("dashboard file {name:?}"),
        }
        .into_response(),
    }
}

/// A strong validator per file: FNV-1a of its bytes, computed once.
fn etag(i: usize) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    &TAGS.get_or_init(|| {
        FILES
            .iter()
            .map(|f| {
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in f.bytes {
                    h ^= u64::from(*b);
                    h = h.wrapping_mul(0x100_0000_01b3);
                }
                format!("\"{h:016x}\"")
            })
            .collect()
    })[i]
}

fn serve(i: usize, req: &HeaderMap) -> Response {
    let f = &FILES[i];
    let tag = etag(i);
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag || t.trim() == "*"));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(f.content_type),
            )],
            f.bytes,
        )
            .into_response()
    };
    let h = resp.headers_mut();
    h.insert(header::ETAG, HeaderValue::from_static(tag));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if f.content_type.starts_with("text/html") {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_names_and_types_are_the_files() {
        let names: Vec<_> = FILES.iter().map(|f| f.name).collect();
        assert_eq!(names, FILE_NAMES);
        assert!(
            FILES
                .iter()
                .all(|f| CONTENT_TYPES.contains(&f.content_type))
        );
        assert_eq!(FILES[0].content_type, HTML);
    }

    #[test]
    fn every_file_has_a_distinct_etag() {
        let tags: std::collections::HashSet<_> = (0..FILES.len()).map(etag).collect();
        assert_eq!(tags.len(), FILES.len());
        assert!(FILES.iter().all(|f| !f.bytes.is_empty()));
    }
}
