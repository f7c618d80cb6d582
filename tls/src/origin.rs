//! Which browser pages may use a door (`http.allowed_origins`, `ws.allowed_origins`).
//!
//! A browser names the page that makes a request in `Origin`; other clients (curl,
//! native apps, devices) send none and always pass. A page whose origin is not on
//! the list is refused, so a cross-site page cannot publish or subscribe with the
//! network position of the user who opened it. There is no same-origin pass by
//! `Host`: the doors serve no pages, and `Host` is what DNS rebinding controls.
//! Not TLS, but the same question one layer up ("who is on the other end"), shared
//! by the HTTP and WebSocket doors, which may not import each other.

/// An allow-list of origins: `https://app.example.com` (exact, case-insensitive),
/// `http://127.0.0.1:*` (any port of that scheme and host), `*` (any origin).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins {
    allowed: Vec<String>,
}

/// What [`Origins::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginCheck {
    /// No `Origin` header: not a browser page (or a same-origin GET); passes.
    None,
    /// A listed origin: passes, and gets CORS headers.
    Allowed,
    /// A browser page from elsewhere: refused with 403.
    Refused,
}

impl Origins {
    pub fn new(allowed: &[String]) -> Origins {
        Origins {
            allowed: allowed
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
        }
    }

    /// Whether a request with this `Origin` header value (if any) may go on.
    pub fn check(&self, origin: Option<&str>) -> OriginCheck {
        let Some(origin) = origin else {
            return OriginCheck::None;
        };
        let origin = origin.trim().to_ascii_lowercase();
        let hit = self.allowed.iter().any(|a| {
            if a == "*" || *a == origin {
                return true;
            }
            match a.strip_suffix(":*") {
                Some(host) => {
                    origin == host
                        || origin.strip_prefix(host).is_some_and(|rest| {
                            rest.strip_prefix(':').is_some_and(|port| {
                                !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
                            })
                        })
                }
                None => false,
            }
        });
        if hit {
            OriginCheck::Allowed
        } else {
            OriginCheck::Refused
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_origin_passes_listed_ones_pass_others_are_refused() {
        let o = Origins::new(&[
            "https://app.example.com".into(),
            "http://127.0.0.1:*".into(),
        ]);
        assert_eq!(o.check(None), OriginCheck::None);
        assert_eq!(
            o.check(Some("https://APP.example.com")),
            OriginCheck::Allowed
        );
        assert_eq!(o.check(Some("http://127.0.0.1:5173")), OriginCheck::Allowed);
        assert_eq!(o.check(Some("http://127.0.0.1")), OriginCheck::Allowed);
        for bad in [
            "https://evil.example",
            "http://app.example.com",
            "https://app.example.com.evil.example",
            "http://127.0.0.1:80.evil",
            "http://127.0.0.10:80",
            "null",
        ] {
            assert_eq!(o.check(Some(bad)), OriginCheck::Refused, "{bad}");
        }
        assert_eq!(
            Origins::default().check(Some("https://a.example")),
            OriginCheck::Refused
        );
        let any = Origins::new(&["*".into()]);
        assert_eq!(any.check(Some("https://a.example")), OriginCheck::Allowed);
    }
}
