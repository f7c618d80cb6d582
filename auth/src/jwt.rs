//! JSON Web Tokens as credentials: HS256 with a shared secret or RS256 with an RSA
//! public key (PEM), `exp` required and checked; the user is the configured claim.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde_json::Value;

use crate::error::{Denied, Error};

/// The keys tokens are checked with.
pub struct Keys {
    hs256: Option<DecodingKey>,
    rs256: Option<DecodingKey>,
    claim: String,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("hs256", &self.hs256.is_some())
            .field("rs256", &self.rs256.is_some())
            .field("claim", &self.claim)
            .finish()
    }
}

/// A verified token: who, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub user: String,
    pub expires_at: SystemTime,
}

/// True for something shaped like a JWT (three base64url parts).
pub fn looks_like_jwt(s: &[u8]) -> bool {
    s.len() > 16
        && s.iter().filter(|&&b| b == b'.').count() == 2
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' || b == b'=')
}

impl Keys {
    /// `None` when neither key is configured.
    pub fn new(
        hs256_secret: Option<&[u8]>,
        rs256_pem: Option<&[u8]>,
        claim: &str,
    ) -> Result<Option<Keys>, Error> {
        let rs256 = match rs256_pem {
            Some(pem) => {
                Some(DecodingKey::from_rsa_pem(pem).map_err(|e| Error::JwtKey(e.to_string()))?)
            }
            None => None,
        };
        let hs256 = hs256_secret.map(DecodingKey::from_secret);
        if hs256.is_none() && rs256.is_none() {
            return Ok(None);
        }
        Ok(Some(Keys {
            hs256,
            rs256,
            claim: claim.to_owned(),
        }))
    }

    /// Checks the signature and `exp`; returns the user the token names.
    pub fn verify(&self, token: &str) -> Result<Verified, Denied> {
        let bad = |m: &str| Denied::BadJwt(m.to_owned());
        let header = decode_header(token).map_err(|_| bad("malformed"))?;
        let key = match header.alg {
            Algorithm::HS256 => self.hs256.as_ref(),
            Algorithm::RS256 => self.rs256.as_ref(),
            _ => None,
        }
        .ok_or_else(|| bad("algorithm not accepted"))?;
        let mut v = Validation::new(header.alg);
        v.leeway = 5;
        v.set_required_spec_claims(&["exp"]);
        v.validate_aud = false;
        let data = decode::<serde_json::Map<String, Value>>(token, key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::ExpiredSignature => bad("expired"),
                K::InvalidSignature => bad("bad signature"),
                K::MissingRequiredClaim(_) => bad("no exp claim"),
                _ => bad("invalid"),
            }
        })?;
        let user = data
            .claims
            .get(&self.claim)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Denied::BadJwt(format!("no {:?} claim", self.claim)))?
            .to_owned();
        let exp = data.claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
        Ok(Verified {
            user,
            expires_at: UNIX_EPOCH + Duration::from_secs(exp),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};

    fn token(secret: &[u8], claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn hs256_exp_and_claim() {
        let k = Keys::new(Some(b"s3cret"), None, "sub").unwrap().unwrap();
        let good = token(
            b"s3cret",
            serde_json::json!({"sub": "alice", "exp": now() + 60}),
        );
        assert!(looks_like_jwt(good.as_bytes()));
        assert_eq!(k.verify(&good).unwrap().user, "alice");
        let expired = token(
            b"s3cret",
            serde_json::json!({"sub": "alice", "exp": now() - 60}),
        );
        assert_eq!(k.verify(&expired), Err(Denied::BadJwt("expired".into())));
        let forged = token(
            b"other",
            serde_json::json!({"sub": "alice", "exp": now() + 60}),
        );
        assert_eq!(
            k.verify(&forged),
            Err(Denied::BadJwt("bad signature".into()))
        );
        let no_exp = token(b"s3cret", serde_json::json!({"sub": "alice"}));
        assert!(k.verify(&no_exp).is_err());
        for junk in ["", "a.b.c", "....", "eyJhbGciOiJub25lIn0.e30."] {
            assert!(k.verify(junk).is_err(), "{junk}");
        }
    }
}
