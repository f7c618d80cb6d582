//! RocketMQ's remoting request signature (the Java `AclClientRPCHook`,
//! rocketmq-client-rust's ACL hook): the client adds `AccessKey` (and
//! `SecurityToken` when it has one) to the request's ext fields, then
//!
//! ```text
//! Signature = Base64(HmacSHA1(secret, values of the ext fields sorted by key,
//!                                     except Signature, concatenated ‖ body))
//! ```
//!
//! Keys sort as Java's `TreeMap<String, _>` sorts them: by UTF-16 code unit, which for
//! the ASCII keys RocketMQ uses is byte order (upper case before lower case). Pure: no
//! I/O, no store; `Auth::verify_signed` looks the secret up.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use subtle::ConstantTimeEq;

/// The ext field naming the caller's AccessKey.
pub const ACCESS_KEY: &str = "AccessKey";
/// The ext field carrying the signature.
pub const SIGNATURE: &str = "Signature";
/// The optional ext field carrying a security token (signed like any other field).
pub const SECURITY_TOKEN: &str = "SecurityToken";

/// The signature of a request whose ext fields are `fields` (any order; a
/// `Signature` field among them is left out) and whose body is `body`.
pub fn signature<'a>(
    secret: &[u8],
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
) -> String {
    let mut sorted: Vec<(&str, &str)> = fields
        .into_iter()
        .filter(|(k, _)| *k != SIGNATURE)
        .collect();
    sorted.sort_by(|a, b| java_order(a.0, b.0));
    let mut mac = <Hmac<Sha1> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    for (_, v) in &sorted {
        mac.update(v.as_bytes());
    }
    mac.update(body);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// True when `given` is the signature of `fields` + `body` under `secret`, compared
/// in constant time.
pub fn verify<'a>(
    secret: &[u8],
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: &[u8],
    given: &str,
) -> bool {
    let expected = signature(secret, fields, body);
    expected.as_bytes().ct_eq(given.as_bytes()).into()
}

/// `String.compareTo`: UTF-16 code units in order.
fn java_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector of issue #26: ak `ak`, secret `secret`, token `token`, ext
    /// `{z: last, a: first}`, body `body`. The client adds `AccessKey` and
    /// `SecurityToken` before signing, so the signed text is
    /// `ak` `token` `first` `last` `body` (keys `AccessKey` < `SecurityToken` < `a` < `z`).
    #[test]
    fn the_issue_vector() {
        let fields = [
            ("z", "last"),
            ("a", "first"),
            (ACCESS_KEY, "ak"),
            (SECURITY_TOKEN, "token"),
        ];
        assert_eq!(
            signature(b"secret", fields, b"body"),
            "wuJkFDNRMKY6aFXTDwT/vg0UC8M="
        );
        let mut with_sig = fields.to_vec();
        with_sig.push((SIGNATURE, "ignored"));
        assert!(verify(
            b"secret",
            with_sig.clone(),
            b"body",
            "wuJkFDNRMKY6aFXTDwT/vg0UC8M="
        ));
        assert!(!verify(
            b"secreT",
            with_sig.clone(),
            b"body",
            "wuJkFDNRMKY6aFXTDwT/vg0UC8M="
        ));
        assert!(!verify(
            b"secret",
            with_sig,
            b"bodY",
            "wuJkFDNRMKY6aFXTDwT/vg0UC8M="
        ));
    }

    #[test]
    fn field_order_does_not_matter_and_values_do() {
        let a = signature(b"k", [("x", "1"), ("y", "2")], b"");
        let b = signature(b"k", [("y", "2"), ("x", "1")], b"");
        assert_eq!(a, b);
        assert_ne!(a, signature(b"k", [("x", "2"), ("y", "1")], b""));
    }
}
