//! # rocketgate-auth
//!
//! Who a client is and what it may do, the same at every door (MQTT, HTTP,
//! WebSocket, native) and on the NameServer's writes. It owns the user store
//! (`store.rs`: users with argon2id password hashes, API keys, RocketMQ
//! AccessKey/SecretKey pairs, roles), the ACL engine (`acl.rs`: a [`Grant`] per
//! connection answers publish / subscribe / admin with one cached lookup),
//! RocketMQ's request signature (`sign.rs`), JWTs (`jwt.rs`) and the abuse limits
//! (`limit.rs`). [`Auth`] puts them together: [`Auth::login`] turns presented
//! [`Credentials`] into an [`Identity`] (slow hashes run on idle-priority threads of
//! their own, fewer than the cores, `verify.rs`; a
//! keyed-HMAC cache remembers verified passwords for `cache_ttl`, failures slow
//! down per address and per user), [`Auth::grant`] compiles its rules,
//! [`Auth::verify_signed`] checks a signed remoting request.
//!
//! It must not know any protocol: doors turn [`Denied`] and a refused grant into
//! their own codes (CONNACK 0x86, HTTP 401/403, NO_PERMISSION, ...). Start reading
//! at [`Auth::login`], then `acl.rs`. `docs/security.md` is the user's guide.

// One system call (a thread's scheduling policy, `verify.rs`) needs unsafe; every
// other module stays without it.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod acl;
mod error;
pub mod jwt;
pub mod limit;
pub mod scram;
pub mod sign;
pub mod store;
mod verify;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use hmac::{Hmac, Mac};
use rocketgate_base::sync::{lock, read, write};
use rocketgate_config::{Config, DenyAction};
use sha2::Sha256;

pub use acl::{Action, Effect, Grant, Placeholders, Rule};
pub use error::{Denied, Error};
pub use limit::{ConnectionLimit, ConnectionSlot};
pub use store::{AccessKey, RoleEntry, UserEntry, UserFile, Users};

/// What [`Auth`] is built with (from the `[auth]` config section).
#[derive(Debug, Clone)]
pub struct Settings {
    pub enabled: bool,
    pub users_file: PathBuf,
    pub deny_action: DenyAction,
    pub certificate_identity: bool,
    /// The internal credential brokers sign NameServer writes with.
    pub internal: Option<AccessKey>,
    pub jwt_secret: Option<Vec<u8>>,
    pub jwt_public_key_pem: Option<Vec<u8>>,
    pub jwt_username_claim: String,
    pub cache_ttl: Duration,
    pub failed_login_burst: u32,
    pub failed_login_max_delay: Duration,
    pub max_connections_per_address: u32,
    /// The share of a core each verifying thread may use (`auth.verify_share`).
    pub verify_share: f64,
}

impl Settings {
    /// Authentication off (the loopback default).
    pub fn disabled() -> Settings {
        Settings {
            enabled: false,
            users_file: PathBuf::new(),
            deny_action: DenyAction::Ignore,
            certificate_identity: false,
            internal: None,
            jwt_secret: None,
            jwt_public_key_pem: None,
            jwt_username_claim: "sub".into(),
            cache_ttl: Duration::from_secs(60),
            failed_login_burst: 5,
            failed_login_max_delay: Duration::from_secs(5),
            max_connections_per_address: 0,
            verify_share: 1.0,
        }
    }

    /// From the config; reads the JWT public key file when one is named.
    pub fn from_config(config: &Config) -> Result<Settings, Error> {
        let a = &config.auth;
        let pem = if a.jwt_public_key_file.as_os_str().is_empty() {
            None
        } else {
            Some(
                std::fs::read(&a.jwt_public_key_file).map_err(|source| Error::Io {
                    path: a.jwt_public_key_file.clone(),
                    source,
                })?,
            )
        };
        Ok(Settings {
            enabled: a.enabled,
            users_file: config.users_file(),
            deny_action: a.deny_action,
            certificate_identity: a.certificate_identity,
            internal: (!a.internal_secret.is_empty()).then(|| AccessKey {
                access_key: a.internal_access_key.clone(),
                secret_key: a.internal_secret.clone(),
            }),
            jwt_secret: (!a.jwt_secret.is_empty()).then(|| a.jwt_secret.clone().into_bytes()),
            jwt_public_key_pem: pem,
            jwt_username_claim: a.jwt_username_claim.clone(),
            cache_ttl: a.cache_ttl,
            failed_login_burst: a.failed_login_burst,
            failed_login_max_delay: a.failed_login_max_delay,
            max_connections_per_address: a.max_connections_per_address,
            verify_share: a.verify_share,
        })
    }
}

/// What a client presents.
#[derive(Debug, Clone, Copy)]
pub enum Credentials<'a> {
    /// Nothing.
    None,
    /// MQTT CONNECT user name + password, HTTP Basic. A password shaped like a JWT
    /// is taken as one when JWTs are configured.
    Password {
        username: &'a str,
        password: &'a [u8],
    },
    /// `Authorization: Bearer`, the WebSocket token: an API key or a JWT.
    Bearer(&'a str),
    /// The name of a verified client certificate (mTLS; honoured with
    /// `auth.certificate_identity = true`).
    Certificate(&'a str),
}

/// Who a client is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    /// The internal credential (brokers, replication): everything is allowed.
    pub internal: bool,
}

impl Identity {
    pub fn anonymous() -> Identity {
        Identity {
            user: String::new(),
            internal: false,
        }
    }
}

/// A successful login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub identity: Identity,
    /// When the credential stops being valid (a JWT's `exp`): the door ends the
    /// connection then.
    pub expires_at: Option<SystemTime>,
}

/// A user's rules, compiled and shared by its connections' grants.
type CompiledRules = Arc<Vec<acl::Compiled>>;

struct Cached {
    user: String,
    generation: u64,
    until: Instant,
}

/// A verification in flight: its entry in `Auth::verifying` goes when it ends
/// (answered or abandoned).
struct Verifying<'a> {
    auth: &'a Auth,
    slot: [u8; 32],
}

impl Drop for Verifying<'_> {
    fn drop(&mut self) {
        lock(&self.auth.verifying).remove(&self.slot);
    }
}

/// Users, credentials and rules; one per process, shared by every door.
pub struct Auth {
    settings: Settings,
    /// The current snapshot; replaced whole on a change (readers clone the `Arc`).
    users: RwLock<Arc<Users>>,
    /// Bumped on every change of the store; cached credentials of an older one are void.
    generation: AtomicU64,
    /// Verified passwords: HMAC-SHA256(process key, user ‖ 0 ‖ password) -> user.
    /// A std lock held for one map operation.
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    cache_key: [u8; 32],
    limiter: limit::LoginLimiter,
    jwt: Option<jwt::Keys>,
    /// The file's modification time when last read (for the change watcher).
    stamp: Mutex<Option<SystemTime>>,
    /// Serializes read-modify-write changes of the file.
    editing: Mutex<()>,
    /// Compiled rules per user and store generation (users whose rules name no
    /// `${clientid}`), so a connection's grant costs no compilation. A std lock held
    /// for one map operation.
    compiled: Mutex<HashMap<String, (u64, CompiledRules)>>,
    /// The password-verifying threads, started on the first password login.
    verifier: std::sync::OnceLock<verify::Verifier>,
    /// Verifications in flight by cache slot, each with the channel its answer
    /// comes on (`ok && known`). A std lock held for one map operation.
    verifying: Mutex<HashMap<[u8; 32], tokio::sync::watch::Receiver<Option<bool>>>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("enabled", &self.settings.enabled)
            .field("users_file", &self.settings.users_file)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// Loads the user store (a missing file is an empty store).
    pub fn open(settings: Settings) -> Result<Arc<Auth>, Error> {
        let jwt = jwt::Keys::new(
            settings.jwt_secret.as_deref(),
            settings.jwt_public_key_pem.as_deref(),
            &settings.jwt_username_claim,
        )?;
        let (file, stamp) = if settings.enabled {
            (
                UserFile::load(&settings.users_file)?,
                modified(&settings.users_file),
            )
        } else {
            (UserFile::default(), None)
        };
        Ok(Arc::new(Auth {
            limiter: limit::LoginLimiter::new(
                settings.failed_login_burst,
                settings.failed_login_max_delay,
            ),
            settings,
            users: RwLock::new(Arc::new(Users::new(file))),
            generation: AtomicU64::new(0),
            cache: Mutex::default(),
            cache_key: rand::random(),
            jwt,
            stamp: Mutex::new(stamp),
            editing: Mutex::new(()),
            compiled: Mutex::default(),
            verifier: std::sync::OnceLock::new(),
            verifying: Mutex::default(),
        }))
    }

    /// Authentication off: every login is anonymous and every grant allows all.
    pub fn disabled() -> Arc<Auth> {
        Auth::open(Settings::disabled()).expect("no file is read when disabled")
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// A denied publish/subscribe closes the connection (`auth.deny_action = disconnect`).
    pub fn deny_disconnects(&self) -> bool {
        self.settings.deny_action == DenyAction::Disconnect
    }

    /// The connection limit per address for one door.
    pub fn connection_limit(&self) -> ConnectionLimit {
        ConnectionLimit::new(self.settings.max_connections_per_address)
    }

    /// Changes with every change of the user store (grants made before are stale).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current user store.
    pub fn users(&self) -> Arc<Users> {
        read(&self.users).clone()
    }

    /// The internal credential, for a broker to sign its NameServer writes with.
    pub fn internal_credential(&self) -> Option<&AccessKey> {
        self.settings.internal.as_ref()
    }

    fn install(&self, file: UserFile) {
        *write(&self.users) = Arc::new(Users::new(file));
        self.generation.fetch_add(1, Ordering::AcqRel);
        lock(&self.cache).clear();
    }

    /// Reads the user store file again.
    pub fn reload(&self) -> Result<(), Error> {
        let stamp = modified(&self.settings.users_file);
        let file = UserFile::load(&self.settings.users_file)?;
        *lock(&self.stamp) = stamp;
        self.install(file);
        tracing::info!(file = %self.settings.users_file.display(), users = self.users().file().users.len(), "user store loaded");
        Ok(())
    }

    /// Changes the store: reads the file, applies `change`, writes it back, installs it.
    pub fn update<T>(&self, change: impl FnOnce(&mut UserFile) -> T) -> Result<T, Error> {
        let _one = lock(&self.editing);
        let mut file = UserFile::load(&self.settings.users_file)?;
        let out = change(&mut file);
        file.save(&self.settings.users_file)?;
        *lock(&self.stamp) = modified(&self.settings.users_file);
        self.install(file);
        Ok(out)
    }

    /// Reloads the store when its file changed (the CLI or an editor wrote it);
    /// polled every second by the task this returns.
    pub fn spawn_watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(auth) = me.upgrade() else { return };
                if !auth.enabled() {
                    return;
                }
                let now = modified(&auth.settings.users_file);
                if now != *lock(&auth.stamp)
                    && let Err(e) = auth.reload()
                {
                    tracing::error!(error = %e, "user store changed but cannot be read; keeping the old one");
                    *lock(&auth.stamp) = now;
                }
            }
        })
    }

    fn cache_slot(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.cache_key).expect("any key length");
        mac.update(user.as_bytes());
        mac.update(&[0]);
        mac.update(password);
        mac.finalize().into_bytes().into()
    }

    /// Who presented `creds` from `peer` at `door` (for logs and metrics).
    pub async fn login(
        &self,
        creds: Credentials<'_>,
        peer: IpAddr,
        door: &'static str,
    ) -> Result<Login, Denied> {
        if !self.settings.enabled {
            return Ok(Login {
                identity: Identity::anonymous(),
                expires_at: None,
            });
        }
        let claimed = match creds {
            Credentials::Password { username, .. } if !username.is_empty() => Some(username),
            Credentials::Certificate(name) => Some(name),
            _ => None,
        };
        let delay = self.limiter.delay(peer, claimed);
        if !delay.is_zero() {
            metrics::counter!("rocketgate_auth_throttled_total", "door" => door).increment(1);
            tokio::time::sleep(delay).await;
        }
        let result = self.check(creds).await;
        match &result {
            Ok(login) => {
                self.limiter.succeeded(peer, &login.identity.user);
                metrics::counter!("rocketgate_auth_logins_total", "door" => door).increment(1);
            }
            Err(why) => {
                if *why != Denied::Missing {
                    self.limiter.failed(peer, claimed);
                }
                metrics::counter!("rocketgate_auth_failures_total", "door" => door).increment(1);
                // The user name is logged, never what was presented as a secret.
                tracing::warn!(door, %peer, user = claimed.unwrap_or(""), reason = %why, "login refused");
            }
        }
        result
    }

    /// [`Auth::login`] for a bearer token (API key or JWT) where waiting is not an
    /// option (the WebSocket door's upgrade seam must not block): no back-off delay,
    /// but failures are counted and logged the same.
    pub fn login_token_now(
        &self,
        token: Option<&str>,
        peer: IpAddr,
        door: &'static str,
    ) -> Result<Login, Denied> {
        match token {
            None | Some("") => self.login_now(Credentials::None, peer, door),
            Some(t) => self.login_now(Credentials::Bearer(t), peer, door),
        }
    }

    /// [`Auth::login`] without waiting, for the credentials that need no slow hash:
    /// a bearer token or a verified client certificate (the WebSocket upgrade, the
    /// native door's requests). A password cannot be checked this way: it is refused
    /// as [`Denied::BadCredentials`] (doors with passwords use [`Auth::login`]).
    /// Failures are counted and logged like [`Auth::login`]'s.
    pub fn login_now(
        &self,
        creds: Credentials<'_>,
        peer: IpAddr,
        door: &'static str,
    ) -> Result<Login, Denied> {
        if !self.settings.enabled {
            return Ok(Login {
                identity: Identity::anonymous(),
                expires_at: None,
            });
        }
        let claimed = match creds {
            Credentials::Certificate(name) => Some(name),
            _ => None,
        };
        let result = match creds {
            Credentials::None | Credentials::Bearer("") => Err(Denied::Missing),
            Credentials::Password { .. } => Err(Denied::BadCredentials),
            Credentials::Certificate(name) => self.certificate_login(name),
            Credentials::Bearer(t) => match &self.jwt {
                Some(keys) if jwt::looks_like_jwt(t.as_bytes()) => {
                    keys.verify(t).and_then(|v| self.jwt_login(v))
                }
                _ => self
                    .users()
                    .by_api_key(t)
                    .map(|u| Login {
                        identity: Identity {
                            user: u.name.clone(),
                            internal: false,
                        },
                        expires_at: None,
                    })
                    .ok_or(Denied::BadToken),
            },
        };
        match &result {
            Ok(_) => metrics::counter!("rocketgate_auth_logins_total", "door" => door).increment(1),
            Err(why) => {
                if *why != Denied::Missing {
                    self.limiter.failed(peer, claimed);
                }
                metrics::counter!("rocketgate_auth_failures_total", "door" => door).increment(1);
                tracing::warn!(door, %peer, user = claimed.unwrap_or(""), reason = %why, "login refused");
            }
        }
        result
    }

    /// A verified client certificate's name as a user (`auth.certificate_identity`).
    fn certificate_login(&self, name: &str) -> Result<Login, Denied> {
        if !self.settings.certificate_identity {
            return Err(Denied::CertificateNotAccepted);
        }
        match self.users().user(name) {
            Some(u) => Ok(Login {
                identity: Identity {
                    user: u.name.clone(),
                    internal: false,
                },
                expires_at: None,
            }),
            None => Err(Denied::BadCredentials),
        }
    }

    async fn check(&self, creds: Credentials<'_>) -> Result<Login, Denied> {
        let plain = |user: String| Login {
            identity: Identity {
                user,
                internal: false,
            },
            expires_at: None,
        };
        match creds {
            Credentials::None => Err(Denied::Missing),
            Credentials::Password { username, password } => {
                if let Some(keys) = &self.jwt
                    && jwt::looks_like_jwt(password)
                {
                    let token =
                        std::str::from_utf8(password).map_err(|_| Denied::BadCredentials)?;
                    let v = keys.verify(token)?;
                    if !username.is_empty() && username != v.user {
                        return Err(Denied::BadJwt("user name differs from the token's".into()));
                    }
                    return self.jwt_login(v);
                }
                if username.is_empty() {
                    return Err(Denied::Missing);
                }
                self.password_login(username, password).await.map(plain)
            }
            Credentials::Bearer(token) => {
                if let Some(keys) = &self.jwt
                    && jwt::looks_like_jwt(token.as_bytes())
                {
                    return self.jwt_login(keys.verify(token)?);
                }
                let users = self.users();
                users
                    .by_api_key(token)
                    .map(|u| plain(u.name.clone()))
                    .ok_or(Denied::BadToken)
            }
            Credentials::Certificate(name) => self.certificate_login(name),
        }
    }

    /// SCRAM-SHA-256, step one (docs/security.md "SCRAM-SHA-256"): the
    /// server-first message for a client-first one, after the login back-off of
    /// [`Auth::login`]. An unknown user, or one without SCRAM keys, gets a made-up
    /// salt (the same each time for the same name) and fails at
    /// [`Auth::scram_finish`] like a wrong password: the answer does not tell which
    /// users exist. Call only with authentication on.
    pub async fn scram_start(
        &self,
        client_first: &[u8],
        peer: IpAddr,
        door: &'static str,
    ) -> Result<(scram::Exchange, Vec<u8>), Denied> {
        let user = scram::client_first_user(client_first)
            .map_err(|e| self.scram_failed(peer, None, door, Denied::Scram(e)))?;
        let delay = self.limiter.delay(peer, Some(&user));
        if !delay.is_zero() {
            metrics::counter!("rocketgate_auth_throttled_total", "door" => door).increment(1);
            tokio::time::sleep(delay).await;
        }
        let keys = self
            .users()
            .user(&user)
            .and_then(|u| scram::Keys::decode(&u.scram_sha256));
        let key = self.cache_key;
        scram::Exchange::start(client_first, keys, |name| {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("any key length");
            mac.update(b"scram stand-in salt\0");
            mac.update(name.as_bytes());
            scram::Keys {
                iterations: scram::ITERATIONS,
                salt: mac.finalize().into_bytes()[..16].to_vec(),
                stored_key: rand::random(),
                server_key: rand::random(),
            }
        })
        .map_err(|e| self.scram_failed(peer, Some(&user), door, Denied::Scram(e)))
    }

    /// SCRAM-SHA-256, step two: checks the client-final message; the login and
    /// the server-final message when the proof holds. Failures count for the
    /// back-off and `rocketgate_auth_failures_total` like a bad password.
    pub fn scram_finish(
        &self,
        exchange: &scram::Exchange,
        client_final: &[u8],
        peer: IpAddr,
        door: &'static str,
    ) -> Result<(Login, Vec<u8>), Denied> {
        let user = exchange.user();
        match exchange.finish(client_final) {
            Ok(server_final) => {
                self.limiter.succeeded(peer, user);
                metrics::counter!("rocketgate_auth_logins_total", "door" => door).increment(1);
                let login = Login {
                    identity: Identity {
                        user: user.to_owned(),
                        internal: false,
                    },
                    expires_at: None,
                };
                Ok((login, server_final))
            }
            Err(scram::ScramError::Proof) => {
                if self
                    .users()
                    .user(user)
                    .is_some_and(|u| scram::Keys::decode(&u.scram_sha256).is_none())
                {
                    // Told to the operator only: the client gets what a wrong
                    // password gets.
                    tracing::warn!(door, %peer, user, "SCRAM login of a user without SCRAM keys \
                        (its password was set before SCRAM support): set the password again");
                }
                Err(self.scram_failed(peer, Some(user), door, Denied::BadCredentials))
            }
            Err(e) => Err(self.scram_failed(peer, Some(user), door, Denied::Scram(e))),
        }
    }

    fn scram_failed(
        &self,
        peer: IpAddr,
        user: Option<&str>,
        door: &'static str,
        why: Denied,
    ) -> Denied {
        self.limiter.failed(peer, user);
        metrics::counter!("rocketgate_auth_failures_total", "door" => door).increment(1);
        tracing::warn!(door, %peer, user = user.unwrap_or(""), method = scram::METHOD, reason = %why, "login refused");
        why
    }

    fn jwt_login(&self, v: jwt::Verified) -> Result<Login, Denied> {
        // A token names a user of the store: its rules are that user's.
        if self.users().user(&v.user).is_none() {
            return Err(Denied::BadJwt(format!("unknown user {:?}", v.user)));
        }
        Ok(Login {
            identity: Identity {
                user: v.user,
                internal: false,
            },
            expires_at: Some(v.expires_at),
        })
    }

    async fn password_login(&self, username: &str, password: &[u8]) -> Result<String, Denied> {
        let slot = self.cache_slot(username, password);
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(c) = lock(&self.cache).get(&slot)
            && c.generation == generation
            && c.until > Instant::now()
        {
            return Ok(c.user.clone());
        }
        // The same credentials being verified already (a fleet reconnecting with
        // one password after a restart emptied the cache): wait for that answer
        // instead of verifying again. A verification that was abandoned (its
        // connection went away) answers nothing: then verify here.
        let waiting = lock(&self.verifying).get(&slot).cloned();
        if let Some(mut rx) = waiting
            && let Ok(answer) = rx.wait_for(Option::is_some).await
        {
            return match *answer {
                Some(true) => Ok(username.to_owned()),
                _ => Err(Denied::BadCredentials),
            };
        }
        let (tx, rx) = tokio::sync::watch::channel(None);
        lock(&self.verifying).insert(slot, rx);
        let _done = Verifying { auth: self, slot };
        let users = self.users();
        let phc = users
            .user(username)
            .map(|u| u.password.clone())
            .filter(|p| !p.is_empty());
        let known = phc.is_some();
        let ok = self
            .verifier
            .get_or_init(|| {
                verify::Verifier::start(
                    verify::Verifier::default_threads(),
                    self.settings.verify_share,
                )
            })
            .verify(phc, password.to_vec())
            .await;
        let _ = tx.send(Some(ok && known));
        if !(ok && known) {
            return Err(Denied::BadCredentials);
        }
        let mut cache = lock(&self.cache);
        if cache.len() >= 100_000 {
            let now = Instant::now();
            cache.retain(|_, c| c.until > now);
        }
        cache.insert(
            slot,
            Cached {
                user: username.to_owned(),
                generation,
                until: Instant::now() + self.settings.cache_ttl,
            },
        );
        Ok(username.to_owned())
    }

    /// The rules of `identity` compiled for one connection (`client_id` fills
    /// `${clientid}`). A user deleted since login gets no rules: everything denied.
    pub fn grant(&self, identity: &Identity, client_id: &str) -> Grant {
        if !self.settings.enabled || identity.internal {
            return Grant::all();
        }
        let generation = self.generation();
        if let Some((g, rules)) = lock(&self.compiled).get(&identity.user)
            && *g == generation
        {
            return Grant::from_compiled(rules.clone());
        }
        let users = self.users();
        let rules = users
            .user(&identity.user)
            .map(|u| users.rules_of(u))
            .unwrap_or_default();
        let p = Placeholders {
            username: &identity.user,
            clientid: client_id,
        };
        if Grant::per_client(&rules) {
            return Grant::new(&rules, p);
        }
        let compiled = Grant::compile(&rules, p);
        let mut map = lock(&self.compiled);
        if map.len() >= 10_000 {
            map.clear();
        }
        map.insert(identity.user.clone(), (generation, compiled.clone()));
        Grant::from_compiled(compiled)
    }

    /// Checks a signed remoting request: its ext `fields` (with `AccessKey` and
    /// `Signature`) and `body`. The internal credential is an identity too.
    pub fn verify_signed<'a, I>(&self, fields: I, body: &[u8]) -> Result<Identity, Denied>
    where
        I: IntoIterator<Item = (&'a str, &'a str)> + Clone,
    {
        let mut ak = None;
        let mut given = None;
        for (k, v) in fields.clone() {
            if k == sign::ACCESS_KEY {
                ak = Some(v);
            } else if k == sign::SIGNATURE {
                given = Some(v);
            }
        }
        let (Some(ak), Some(given)) = (ak, given) else {
            return Err(Denied::Unsigned);
        };
        if let Some(internal) = &self.settings.internal
            && internal.access_key == ak
        {
            return if sign::verify(internal.secret_key.as_bytes(), fields, body, given) {
                Ok(Identity {
                    user: ak.to_owned(),
                    internal: true,
                })
            } else {
                Err(Denied::BadSignature(ak.to_owned()))
            };
        }
        let users = self.users();
        let (user, secret) = users
            .by_access_key(ak)
            .ok_or_else(|| Denied::UnknownAccessKey(ak.to_owned()))?;
        if sign::verify(secret.as_bytes(), fields, body, given) {
            Ok(Identity {
                user: user.name.clone(),
                internal: false,
            })
        } else {
            Err(Denied::BadSignature(ak.to_owned()))
        }
    }
}

fn modified(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[cfg(test)]
mod tests;
