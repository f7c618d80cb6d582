//! SCRAM-SHA-256 (RFC 5802 with RFC 7677's hash), the server side, without
//! channel binding: the Authentication Method MQTT 5 clients use for enhanced
//! authentication (EMQX and HiveMQ offer the same). The password never crosses the
//! wire and the server never holds it: a user's [`Keys`] (salt, iteration count,
//! StoredKey, ServerKey) are derived once when the password is set and kept beside
//! its argon2id hash, which cannot give them (docs/security.md "SCRAM-SHA-256").
//!
//! One exchange is two messages each way: client-first → server-first
//! ([`Exchange::start`]), client-final → server-final ([`Exchange::finish`]).
//! Pure: no I/O, no clock; [`crate::Auth::scram_start`] and
//! [`crate::Auth::scram_finish`] add the user store, the back-off and the metrics.
//! User names are compared as sent (no SASLprep), after undoing SCRAM's `=2C`/`=3D`
//! escapes.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The Authentication Method name (MQTT) / SASL mechanism name.
pub const METHOD: &str = "SCRAM-SHA-256";

/// The iteration count of new keys: RFC 7677's minimum, what EMQX and
/// PostgreSQL use. Older keys keep their own count.
pub const ITERATIONS: u32 = 4096;

/// Iteration counts accepted from the store (a hand-edited 10^9 would make every
/// client spin for minutes; fewer than 4096 is below RFC 7677's minimum).
const ITERATIONS_RANGE: std::ops::RangeInclusive<u32> = 4096..=10_000_000;

/// The longest SCRAM message taken (user name, nonce and proof fit many times).
const MAX_MESSAGE: usize = 1024;

/// Why an exchange failed. The messages name what was wrong with the message,
/// never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("SCRAM channel binding is not supported (use the gs2 header \"n,,\")")]
    ChannelBinding,
    #[error("SCRAM authorization identities (a=) are not supported")]
    AuthzId,
    #[error("a SCRAM mandatory extension (m=) is not supported")]
    Extension,
    #[error("the client-final nonce is not the server's")]
    Nonce,
    #[error("bad user name or password")]
    Proof,
}

/// A user's SCRAM-SHA-256 credentials, as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// RFC 5802's `Hi()`: PBKDF2-HMAC-SHA-256 with one output block.
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut u = hmac(password, &[salt, &1u32.to_be_bytes()]);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &[&u]);
        for (o, x) in out.iter_mut().zip(u.iter()) {
            *o ^= x;
        }
    }
    out
}

impl Keys {
    /// Keys for `password` with a new random salt (slow by design: `ITERATIONS`
    /// HMACs, a few milliseconds).
    pub fn new(password: &[u8]) -> Keys {
        Keys::derive(password, &rand::random::<[u8; 16]>(), ITERATIONS)
    }

    pub fn derive(password: &[u8], salt: &[u8], iterations: u32) -> Keys {
        let salted = hi(password, salt, iterations);
        let client_key = hmac(&salted, &[b"Client Key"]);
        Keys {
            iterations,
            salt: salt.to_vec(),
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, &[b"Server Key"]),
        }
    }

    /// The stored form, RFC 5803's (PostgreSQL writes the same):
    /// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`, base64.
    pub fn encode(&self) -> String {
        format!(
            "{METHOD}${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }

    /// Reads [`Keys::encode`]'s form; `None` for anything else.
    pub fn decode(s: &str) -> Option<Keys> {
        let rest = s.strip_prefix(METHOD)?.strip_prefix('$')?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let iterations: u32 = iterations.parse().ok()?;
        if !ITERATIONS_RANGE.contains(&iterations) {
            return None;
        }
        let salt = B64.decode(salt).ok().filter(|s| !s.is_empty())?;
        Some(Keys {
            iterations,
            salt,
            stored_key: B64.decode(stored).ok()?.try_into().ok()?,
            server_key: B64.decode(server).ok()?.try_into().ok()?,
        })
    }
}

/// The user name a client-first message names (`n=`), unescaped.
pub fn client_first_user(message: &[u8]) -> Result<String, ScramError> {
    parse_client_first(message).map(|c| c.user)
}

struct ClientFirst {
    /// The gs2 header (`n,,` or `y,,`), which `c=` of client-final must repeat.
    gs2: String,
    user: String,
    nonce: String,
    bare: String,
}

fn text(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > MAX_MESSAGE {
        return Err(ScramError::Malformed("longer than 1024 bytes"));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::Malformed("not UTF-8"))
}

/// A SCRAM `saslname`: `=2C` is `,`, `=3D` is `=`, any other `=` is an error.
fn unescape(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("a bad '=' escape in the user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A printable nonce: any of 0x21..0x7E but ','.
fn valid_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

fn parse_client_first(message: &[u8]) -> Result<ClientFirst, ScramError> {
    let m = text(message)?;
    let (cb, rest) = m
        .split_once(',')
        .ok_or(ScramError::Malformed("no gs2 header"))?;
    match cb {
        "n" | "y" => {}
        c if c.starts_with("p=") => return Err(ScramError::ChannelBinding),
        _ => return Err(ScramError::Malformed("a bad channel-binding flag")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or(ScramError::Malformed("no gs2 header"))?;
    if !authzid.is_empty() {
        return Err(ScramError::AuthzId);
    }
    let mut attrs = bare.split(',');
    let user = match attrs.next() {
        Some(a) if a.starts_with("m=") => return Err(ScramError::Extension),
        Some(a) => a
            .strip_prefix("n=")
            .ok_or(ScramError::Malformed("no user name (n=)"))?,
        None => return Err(ScramError::Malformed("no user name (n=)")),
    };
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or(ScramError::Malformed("no nonce (r=)"))?;
    if !valid_nonce(nonce) {
        return Err(ScramError::Malformed(
            "a nonce with other than printable characters",
        ));
    }
    let user = unescape(user)?;
    if user.is_empty() {
        return Err(ScramError::Malformed("an empty user name"));
    }
    Ok(ClientFirst {
        gs2: format!("{cb},,"),
        user,
        nonce: nonce.to_owned(),
        bare: bare.to_owned(),
    })
}

/// One exchange between its two steps: what the server said, and the keys it
/// checks the proof with.
pub struct Exchange {
    user: String,
    gs2: String,
    nonce: String,
    /// client-first-message-bare + "," + server-first-message
    said: String,
    keys: Keys,
    /// The keys are the user's (not made up for an unknown user or one without
    /// SCRAM keys, for whom every proof fails).
    real: bool,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Exchange {
    /// Answers a client-first message with the server-first one. `keys`: the
    /// user's, or `None` (unknown user, no SCRAM keys): then `stand_in` is used,
    /// made so that the answer looks as a real user's would (the same salt each
    /// time for the same name), and the proof is refused at the end.
    pub fn start(
        client_first: &[u8],
        keys: Option<Keys>,
        stand_in: impl FnOnce(&str) -> Keys,
    ) -> Result<(Exchange, Vec<u8>), ScramError> {
        let server_nonce = B64.encode(rand::random::<[u8; 18]>());
        Exchange::start_with(client_first, keys, stand_in, &server_nonce)
    }

    fn start_with(
        client_first: &[u8],
        keys: Option<Keys>,
        stand_in: impl FnOnce(&str) -> Keys,
        server_nonce: &str,
    ) -> Result<(Exchange, Vec<u8>), ScramError> {
        let cf = parse_client_first(client_first)?;
        let real = keys.is_some();
        let keys = keys.unwrap_or_else(|| stand_in(&cf.user));
        let nonce = format!("{}{server_nonce}", cf.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&keys.salt),
            keys.iterations
        );
        let said = format!("{},{server_first}", cf.bare);
        Ok((
            Exchange {
                user: cf.user,
                gs2: cf.gs2,
                nonce,
                said,
                keys,
                real,
            },
            server_first.into_bytes(),
        ))
    }

    /// The user the client claims to be.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Checks the client-final message's proof; the server-final message
    /// (`v=<ServerSignature>`) when it holds.
    pub fn finish(&self, client_final: &[u8]) -> Result<Vec<u8>, ScramError> {
        let m = text(client_final)?;
        let (without_proof, proof) = m
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof (p=)"))?;
        let mut attrs = without_proof.split(',');
        let cb = attrs
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .ok_or(ScramError::Malformed("no channel binding (c=)"))?;
        let nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or(ScramError::Malformed("no nonce (r=)"))?;
        if B64.decode(cb).ok().as_deref() != Some(self.gs2.as_bytes()) {
            return Err(ScramError::ChannelBinding);
        }
        if !bool::from(nonce.as_bytes().ct_eq(self.nonce.as_bytes())) {
            return Err(ScramError::Nonce);
        }
        let proof: [u8; 32] = B64
            .decode(proof)
            .ok()
            .and_then(|p| p.try_into().ok())
            .ok_or(ScramError::Malformed(
                "a proof that is not 32 bytes of base64",
            ))?;
        let auth_message = format!("{},{without_proof}", self.said);
        let client_signature = hmac(&self.keys.stored_key, &[auth_message.as_bytes()]);
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature.iter()) {
            *k ^= s;
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        let matches = bool::from(stored.ct_eq(&self.keys.stored_key));
        if !(matches && self.real) {
            return Err(ScramError::Proof);
        }
        let server_signature = hmac(&self.keys.server_key, &[auth_message.as_bytes()]);
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

/// The client side, for our tests and tools: the client-final message for
/// `server_first` and the ServerSignature to expect.
pub fn client_final(
    password: &[u8],
    client_first_bare: &str,
    server_first: &[u8],
) -> Option<(String, String)> {
    let sf = std::str::from_utf8(server_first).ok()?;
    let mut nonce = None;
    let mut salt = None;
    let mut iterations = None;
    for a in sf.split(',') {
        if let Some(v) = a.strip_prefix("r=") {
            nonce = Some(v);
        } else if let Some(v) = a.strip_prefix("s=") {
            salt = B64.decode(v).ok();
        } else if let Some(v) = a.strip_prefix("i=") {
            iterations = v.parse::<u32>().ok();
        }
    }
    let (nonce, salt, iterations) = (nonce?, salt?, iterations?);
    let keys_salted = hi(password, &salt, iterations);
    let client_key = hmac(&keys_salted, &[b"Client Key"]);
    let stored: [u8; 32] = Sha256::digest(client_key).into();
    let without_proof = format!("c=biws,r={nonce}");
    let auth_message = format!("{client_first_bare},{sf},{without_proof}");
    let signature = hmac(&stored, &[auth_message.as_bytes()]);
    let mut proof = client_key;
    for (p, s) in proof.iter_mut().zip(signature.iter()) {
        *p ^= s;
    }
    let server_key = hmac(&keys_salted, &[b"Server Key"]);
    let server_signature = hmac(&server_key, &[auth_message.as_bytes()]);
    Some((
        format!("{without_proof},p={}", B64.encode(proof)),
        format!("v={}", B64.encode(server_signature)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_stand_in(_: &str) -> Keys {
        panic!("a real user's keys were given")
    }

    /// RFC 7677 section 3's example exchange, byte for byte.
    #[test]
    fn the_rfc_7677_example() {
        let keys = Keys::derive(
            b"pencil",
            &B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap(),
            4096,
        );
        let (ex, server_first) = Exchange::start_with(
            b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            Some(keys.clone()),
            no_stand_in,
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        )
        .unwrap();
        assert_eq!(
            server_first,
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        assert_eq!(ex.user(), "user");
        let client_final = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        assert_eq!(
            ex.finish(client_final).unwrap(),
            b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        // Our client side computes the same.
        let (cf, v) =
            super::client_final(b"pencil", "n=user,r=rOprNGfwEbeRWgbNEkqO", &server_first).unwrap();
        assert_eq!(cf.as_bytes(), client_final);
        assert_eq!(v, "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        // A flipped proof bit, another nonce: refused.
        let mut bad = client_final.to_vec();
        let at = bad.len() - 5;
        bad[at] = b'A';
        assert_eq!(ex.finish(&bad), Err(ScramError::Proof));
        let other = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k1,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        assert_eq!(ex.finish(other), Err(ScramError::Nonce));
    }

    #[test]
    fn keys_round_trip_through_the_stored_form() {
        let k = Keys::new(b"pw");
        let s = k.encode();
        assert!(s.starts_with("SCRAM-SHA-256$4096:"), "{s}");
        assert_eq!(Keys::decode(&s), Some(k));
        for bad in [
            "",
            "SCRAM-SHA-1$4096:c2FsdA==$AA==:AA==",
            "SCRAM-SHA-256$10:c2FsdA==$AA==:AA==",
            "SCRAM-SHA-256$4096:c2FsdA==$AA==:AA==",
            "SCRAM-SHA-256$4096:$x:y",
        ] {
            assert_eq!(Keys::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_stand_in_never_succeeds_even_with_its_own_password() {
        let stand_in = Keys::derive(b"guess", b"salt-salt", 4096);
        let (ex, sf) = Exchange::start(b"n,,n=nobody,r=abc", None, |_| stand_in.clone()).unwrap();
        let (cf, _) = client_final(b"guess", "n=nobody,r=abc", &sf).unwrap();
        assert_eq!(ex.finish(cf.as_bytes()), Err(ScramError::Proof));
    }

    #[test]
    fn bad_client_first_messages_are_refused() {
        let k = || Keys::derive(b"pw", b"salt", 4096);
        for (m, want) in [
            (&b"p=tls-unique,,n=u,r=x"[..], ScramError::ChannelBinding),
            (b"n,a=admin,n=u,r=x", ScramError::AuthzId),
            (b"n,,m=ext,n=u,r=x", ScramError::Extension),
        ] {
            assert_eq!(
                Exchange::start(m, Some(k()), no_stand_in).unwrap_err(),
                want
            );
        }
        for m in [
            &b""[..],
            b"n",
            b"x,,n=u,r=x",
            b"n,,r=x",
            b"n,,n=u",
            b"n,,n=,r=x",
            b"n,,n=a=2Xb,r=x",
            b"n,,n=u,r=\xff",
        ] {
            assert!(
                matches!(
                    Exchange::start(m, Some(k()), no_stand_in),
                    Err(ScramError::Malformed(_))
                ),
                "{m:?}"
            );
        }
        assert!(Exchange::start(&[b'n'; 2000], Some(k()), no_stand_in).is_err());
        // Escapes in the user name.
        assert_eq!(client_first_user(b"n,,n=a=2Cb=3Dc,r=x").unwrap(), "a,b=c");
    }

    #[test]
    fn bad_client_final_messages_are_refused() {
        let (ex, _) = Exchange::start(
            b"n,,n=u,r=abc",
            Some(Keys::derive(b"pw", b"salt", 4096)),
            no_stand_in,
        )
        .unwrap();
        for m in [
            &b""[..],
            b"c=biws,r=abc",
            b"r=abc,p=AAAA",
            b"c=biws,p=AAAA",
            b"c=biws,r=abc,p=AAAA",
            b"c=biws,r=abc,p=not base64!",
        ] {
            assert!(ex.finish(m).is_err(), "{m:?}");
        }
        // `c=` must repeat the gs2 header ("n,," = "biws").
        assert_eq!(
            ex.finish(b"c=eSws,r=abc,p=AAAA"),
            Err(ScramError::ChannelBinding)
        );
    }
}
