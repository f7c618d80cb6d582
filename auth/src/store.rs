//! The user store: one TOML file (`<data_dir>/users.toml` unless configured),
//! read whole into an immutable [`Users`] snapshot that lookups share; a change
//! (the CLI, the admin API, an edit) makes a new snapshot.
//!
//! ```toml
//! [[user]]
//! name = "alice"
//! password = "$argon2id$v=19$m=19456,t=2,p=1$..."   # PHC string, never the password
//! scram_sha256 = "SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>"  # for SCRAM logins
//! roles = ["devices"]
//! api_keys = ["sha256:9f86d0..."]                     # SHA-256 of each bearer key
//! access_keys = [{ access_key = "AK1", secret_key = "..." }]  # plain: keys an HMAC
//! rules = [{ effect = "allow", actions = ["publish"], topics = ["users/${username}/#"] }]
//!
//! [[role]]
//! name = "devices"
//! rules = [{ effect = "allow", actions = ["publish", "subscribe"], topics = ["a/#"] }]
//! ```
//!
//! The role `admin` is built in: every action on every (non-internal) topic; so is
//! `monitor`: reading the admin API (what the web dashboard shows), nothing else.
//! Passwords are argon2id hashes (19 MiB, t = 2, p = 1: OWASP's minimum), and
//! beside them SCRAM-SHA-256 keys of the same password (salted, 4096 iterations:
//! what a SCRAM login needs, which the argon2id hash cannot give); API keys
//! SHA-256 hashes (they are random 256-bit strings, a slow hash adds nothing).
//! RocketMQ secret keys are kept in plain because the signature is an HMAC keyed
//! with them; the file is written with mode 0600.

use std::collections::HashMap;
use std::path::Path;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::acl::{Action, Rule};
use crate::error::Error;

/// A RocketMQ AccessKey/SecretKey pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessKey {
    pub access_key: String,
    pub secret_key: String,
}

/// One user as written in the file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserEntry {
    pub name: String,
    /// argon2id PHC string; empty: no password login.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    /// SCRAM-SHA-256 keys of the same password (RFC 5803 form, see `scram.rs`):
    /// written with the argon2id hash by [`set_password`]; empty for a password
    /// set before SCRAM support (or no password): no SCRAM login.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scram_sha256: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// `sha256:<hex>` of each API key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_keys: Vec<AccessKey>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
}

/// A role: rules shared by the users naming it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleEntry {
    pub name: String,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserFile {
    #[serde(default, rename = "user", skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<UserEntry>,
    #[serde(default, rename = "role", skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleEntry>,
}

impl UserFile {
    /// Reads `path`; a missing file is an empty store.
    pub fn load(path: &Path) -> Result<UserFile, Error> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(UserFile::default()),
            Err(source) => {
                return Err(Error::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        toml::from_str(&text).map_err(|e| Error::BadFile {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    /// Writes the file atomically (temp file + rename), mode 0600.
    pub fn save(&self, path: &Path) -> Result<(), Error> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let text = toml::to_string_pretty(self).map_err(|e| Error::BadFile {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("toml.tmp");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io)?;
            f.write_all(text.as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Adds or replaces a user.
    pub fn upsert(&mut self, user: UserEntry) {
        match self.users.iter_mut().find(|u| u.name == user.name) {
            Some(u) => *u = user,
            None => self.users.push(user),
        }
    }

    /// Removes a user; true when there was one.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.users.len();
        self.users.retain(|u| u.name != name);
        self.users.len() < before
    }
}

/// The argon2id parameters: 19 MiB, 2 passes, 1 lane (OWASP's minimum for argon2id).
fn argon2() -> Argon2<'static> {
    let params = Params::new(19 * 1024, 2, 1, None).expect("valid argon2 parameters");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Hashes a password into a PHC string (slow: run it off the async runtime).
pub fn hash_password(password: &[u8]) -> String {
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>()).expect("16-byte salt");
    argon2()
        .hash_password(password, &salt)
        .expect("argon2 hashing of any input")
        .to_string()
}

/// Sets a user's password: the argon2id hash and the SCRAM-SHA-256 keys (slow:
/// run it off the async runtime).
pub fn set_password(user: &mut UserEntry, password: &[u8]) {
    (user.password, user.scram_sha256) = password_fields(password);
}

/// What [`set_password`] writes: the argon2id PHC string and the SCRAM-SHA-256
/// keys, computed before the store is locked for the change.
pub fn password_fields(password: &[u8]) -> (String, String) {
    (
        hash_password(password),
        crate::scram::Keys::new(password).encode(),
    )
}

/// Checks a password against a PHC string (slow: run it off the async runtime).
pub fn verify_password(phc: &str, password: &[u8]) -> bool {
    match PasswordHash::new(phc) {
        // The parameters come from the hash, so older hashes keep verifying.
        Ok(h) => Argon2::default().verify_password(password, &h).is_ok(),
        Err(_) => false,
    }
}

/// `sha256:<hex>` of an API key, as stored.
pub fn hash_api_key(key: &str) -> String {
    let mut out = String::from("sha256:");
    rocketgate_base::hex::push_lower(&mut out, &Sha256::digest(key.as_bytes()));
    out
}

/// A new random API key (256 bits, URL-safe).
pub fn new_api_key() -> String {
    let mut out = String::from("rg_");
    rocketgate_base::hex::push_lower(&mut out, &rand::random::<[u8; 32]>());
    out
}

/// The store indexed for lookups: an immutable snapshot.
#[derive(Debug, Default)]
pub struct Users {
    pub(crate) file: UserFile,
    by_name: HashMap<String, usize>,
    by_api_key: HashMap<String, usize>,
    by_access_key: HashMap<String, (usize, String)>,
    roles: HashMap<String, usize>,
}

/// The built-in `admin` role's rules.
fn admin_rules() -> Vec<Rule> {
    let mut all = Rule::allow(&[Action::All], &["#"]);
    all.groups = Vec::new();
    vec![all]
}

/// The built-in `monitor` role's rules: read the admin API, change nothing.
fn monitor_rules() -> Vec<Rule> {
    vec![Rule::allow(&[Action::Monitor], &[])]
}

impl Users {
    pub fn new(file: UserFile) -> Users {
        let mut u = Users::default();
        for (i, user) in file.users.iter().enumerate() {
            u.by_name.insert(user.name.clone(), i);
            for k in &user.api_keys {
                u.by_api_key.insert(k.clone(), i);
            }
            for ak in &user.access_keys {
                u.by_access_key
                    .insert(ak.access_key.clone(), (i, ak.secret_key.clone()));
            }
        }
        for (i, r) in file.roles.iter().enumerate() {
            u.roles.insert(r.name.clone(), i);
        }
        u.file = file;
        u
    }

    pub fn user(&self, name: &str) -> Option<&UserEntry> {
        self.by_name.get(name).map(|&i| &self.file.users[i])
    }

    pub fn by_api_key(&self, key: &str) -> Option<&UserEntry> {
        self.by_api_key
            .get(&hash_api_key(key))
            .map(|&i| &self.file.users[i])
    }

    /// The user and secret of an AccessKey.
    pub fn by_access_key(&self, ak: &str) -> Option<(&UserEntry, &str)> {
        self.by_access_key
            .get(ak)
            .map(|(i, s)| (&self.file.users[*i], s.as_str()))
    }

    /// A user's rules: its own, then each role's (the built-in `admin` included).
    pub fn rules_of(&self, user: &UserEntry) -> Vec<Rule> {
        let mut out = user.rules.clone();
        for r in &user.roles {
            if let Some(&i) = self.roles.get(r) {
                out.extend(self.file.roles[i].rules.iter().cloned());
            } else if r == "admin" {
                out.extend(admin_rules());
            } else if r == "monitor" {
                out.extend(monitor_rules());
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.file.users.is_empty()
    }

    pub fn file(&self) -> &UserFile {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_hashes_are_argon2id_at_the_documented_parameters() {
        let h = hash_password(b"pw");
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify_password(&h, b"pw"));
        assert!(!verify_password(&h, b"pW"));
        assert!(!verify_password("not a hash", b"pw"));
    }

    #[test]
    fn the_file_round_trips_and_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        let mut f = UserFile::load(&path).unwrap();
        assert!(f.users.is_empty());
        f.upsert(UserEntry {
            name: "alice".into(),
            api_keys: vec![hash_api_key("k1")],
            access_keys: vec![AccessKey {
                access_key: "AK".into(),
                secret_key: "SK".into(),
            }],
            roles: vec!["admin".into()],
            ..UserEntry::default()
        });
        f.save(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let users = Users::new(UserFile::load(&path).unwrap());
        assert_eq!(users.by_api_key("k1").unwrap().name, "alice");
        assert!(users.by_api_key("k2").is_none());
        assert_eq!(users.by_access_key("AK").unwrap().1, "SK");
        assert_eq!(users.rules_of(users.user("alice").unwrap()).len(), 1);
    }
}
