//! # rocketgate-config
//!
//! Typed configuration for every rocketgate process, loaded in layers and checked once:
//!
//! 1. built-in defaults ([`Config::default`]),
//! 2. a TOML file (`--config FILE`), see `rocketgate.example.toml` at the repo root,
//! 3. environment variables `ROCKETGATE_<SECTION>__<KEY>` (or `ROCKETGATE_<KEY>` for
//!    top-level keys), e.g. `ROCKETGATE_STORE__FLUSH=sync`, `ROCKETGATE_DATA_DIR=/srv/rg`,
//! 4. command-line flags, which the binary turns into [`Override`]s.
//!
//! Every layer goes through the same path (`section.key = value`), so an unknown key or a
//! badly typed value is reported the same way wherever it came from, and
//! [`Config::validate`] then checks the values against each other. A bad config is a
//! clear message at boot, never a panic.
//!
//! This crate only describes settings; it must not open files other than the config
//! file, nor start anything.

#![forbid(unsafe_code)]

mod units;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use units::ByteSize;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("bad setting {origin}: {message}")]
    Setting { origin: String, message: String },
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

/// The whole configuration of a rocketgate process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the commit log, consume queues, index and checkpoints live.
    pub data_dir: PathBuf,
    pub listen: Listen,
    pub store: StoreConfig,
    pub broker: BrokerConfig,
    pub namesrv: NamesrvConfig,
    pub native: NativeConfig,
    pub ws: WsConfig,
    pub http: HttpConfig,
    pub mqtt: MqttConfig,
    pub tls: TlsConfig,
    pub auth: AuthConfig,
    pub ha: HaConfig,
    pub controller: ControllerConfig,
    pub proxy: ProxyConfig,
}

/// Listen addresses of every door. Port 0 means "any free port" (logged at start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    pub namesrv: SocketAddr,
    pub native: SocketAddr,
    pub mqtt: SocketAddr,
    pub http: SocketAddr,
    pub ws: SocketAddr,
    /// MQTT over TLS (with `tls.mqtt = true`; the plain `mqtt` port stays open).
    pub mqtts: SocketAddr,
    /// The replication (HA) port a master serves its slaves on (RocketMQ's
    /// `haListenPort`). A slave does not listen on it.
    pub ha: SocketAddr,
}

/// Whether clients must present a certificate (`tls.client_auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificates asked for.
    #[default]
    None,
    /// Asked for; clients without one connect with no identity.
    Optional,
    /// A certificate signed by `tls.client_ca` is required.
    Required,
}

/// RocketMQ's TLS modes for the native door (`tls.native`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NativeTls {
    /// Plain remoting only.
    #[default]
    Disabled,
    /// One port for both: a connection opening with a TLS ClientHello (first byte
    /// 0x16) is TLS, anything else plain remoting.
    Permissive,
    /// TLS only.
    Enforcing,
}

/// TLS for the doors (`[tls]`); see docs/security.md. One certificate serves every door.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain (leaf first). Empty: not set.
    pub cert: PathBuf,
    /// PEM private key of the certificate.
    pub key: PathBuf,
    /// PEM CA bundle client certificates are verified against (mTLS). Empty: not set.
    pub client_ca: PathBuf,
    /// `none` | `optional` | `required`.
    pub client_auth: ClientAuth,
    /// How often `cert`, `key` and `client_ca` are checked for changes (new
    /// connections get the new certificate; `0s`: never).
    #[serde(with = "units::duration")]
    pub reload_interval: Duration,
    /// MQTT over TLS on `listen.mqtts` (default port 8883).
    pub mqtt: bool,
    /// HTTPS instead of HTTP on `listen.http`.
    pub http: bool,
    /// WSS instead of WS on `listen.ws` (`/v1/ws` and `/mqtt`).
    pub ws: bool,
    /// `disabled` | `permissive` | `enforcing` on `listen.native`.
    pub native: NativeTls,
    /// TLS on the replication port `listen.ha` (a master's slaves then connect with
    /// `ha.master_ca`).
    pub ha: bool,
    /// TLS on the controller's port (brokers, the other controllers and the CLI then
    /// connect with `controller.ca`).
    pub controller: bool,
    /// TLS on the NameServer's port `listen.namesrv` (brokers, clients, proxies and
    /// the HTTP cluster view then connect with `namesrv.ca`).
    pub namesrv: bool,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert: PathBuf::new(),
            key: PathBuf::new(),
            client_ca: PathBuf::new(),
            client_auth: ClientAuth::None,
            reload_interval: Duration::from_secs(5),
            mqtt: false,
            http: false,
            ws: false,
            native: NativeTls::Disabled,
            ha: false,
            controller: false,
            namesrv: false,
        }
    }
}

impl TlsConfig {
    /// Whether any door serves TLS.
    pub fn enabled(&self) -> bool {
        self.mqtt
            || self.http
            || self.ws
            || self.native != NativeTls::Disabled
            || self.ha
            || self.controller
            || self.namesrv
    }
}

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// Acknowledged once durable on disk; concurrent appends share one sync (group commit).
    Sync,
    /// Acknowledged after the append; flushed every `flush_interval`.
    Async,
}

/// What disk pressure may delete (`store.disk_full_policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskFullPolicy {
    /// Never delete a message some consumer group has not consumed; past
    /// `disk_hard_ratio` refuse new writes until space is back.
    #[default]
    Refuse,
    /// Delete the oldest segment above `disk_soft_ratio` whether read or not,
    /// logging and counting every unread message dropped (Kafka's and RocketMQ's way).
    DeleteOldest,
}

/// Storage engine settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Size of each commit-log segment file.
    pub segment_size: ByteSize,
    /// Largest single message (encoded record) accepted.
    pub max_message_size: ByteSize,
    pub flush: FlushMode,
    /// Async flush period.
    #[serde(with = "units::duration")]
    pub flush_interval: Duration,
    /// How long a sync-flush append waits for durability before it reports a timeout.
    #[serde(with = "units::duration")]
    pub sync_flush_timeout: Duration,
    /// How often consume queues and index are flushed and the checkpoint written.
    #[serde(with = "units::duration")]
    pub checkpoint_interval: Duration,
    /// Segments whose newest message is older than this are deleted.
    #[serde(with = "units::duration")]
    pub retention: Duration,
    /// How often retention and disk usage are checked.
    #[serde(with = "units::duration")]
    pub retention_check_interval: Duration,
    /// Above this share of the disk in use, the oldest segments are deleted early
    /// (only fully consumed ones under `disk_full_policy = "refuse"`).
    pub disk_soft_ratio: f64,
    /// Above this share of the disk in use, appends are refused ("disk full").
    pub disk_hard_ratio: f64,
    /// What disk pressure may delete: `refuse` (default) or `delete_oldest`.
    pub disk_full_policy: DiskFullPolicy,
    /// Entries (20 bytes each) per consume-queue file.
    pub consume_queue_entries_per_file: u32,
    /// Hash slots per index file.
    pub index_slots: u32,
    /// Entries per index file.
    pub index_entries_per_file: u32,
}

/// Broker identity and registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    pub name: String,
    pub cluster: String,
    /// 0 = master, > 0 = slave.
    pub id: u64,
    /// NameServers to register with, `host:port` each. In standalone mode the embedded
    /// NameServer is always added.
    #[serde(deserialize_with = "units::addr_list")]
    pub namesrv_addrs: Vec<String>,
    /// Create a topic on first send (standalone default).
    pub auto_create_topics: bool,
    /// Queues of an auto-created topic.
    pub default_queue_nums: u32,
    #[serde(with = "units::duration")]
    pub register_interval: Duration,
    /// How often undecided transactional half messages are checked back.
    #[serde(with = "units::duration")]
    pub transaction_check_interval: Duration,
    /// A half message younger than this is not checked back yet.
    #[serde(with = "units::duration")]
    pub transaction_timeout: Duration,
    /// Check-backs of one half message before it is rolled back.
    pub transaction_max_checks: u32,
    /// Deliveries of a failing message before it goes to the dead-letter queue are
    /// this + 1 (RocketMQ `maxReconsumeTimes`; a group can override it).
    pub max_reconsume_times: u32,
    /// What this broker tells the NameServers and the controllers clients and slaves
    /// reach it at, when that is not the listen address (a container or NAT: listening
    /// on `0.0.0.0`, reached as `broker-a.example` or the host's address). `HOST`
    /// keeps each door's port; `HOST:PORT` gives the native door's port too (a mapped
    /// port); the replication port is always `listen.ha`'s. Empty: the listen
    /// addresses (RocketMQ's `brokerIP1`).
    pub advertised_address: String,
}

/// NameServer liveness settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NamesrvConfig {
    /// How often silent brokers are looked for.
    #[serde(with = "units::duration")]
    pub scan_interval: Duration,
    /// A broker silent for this long is dropped from every route.
    #[serde(with = "units::duration")]
    pub broker_expiry: Duration,
    /// PEM CA the NameServers' certificates are verified against: set, every
    /// connection to a NameServer (a broker's registration, a proxy's and the HTTP
    /// cluster view's queries) is TLS (`tls.namesrv = true` on the NameServers).
    /// Empty: plain TCP.
    pub ca: PathBuf,
}

/// The native door (RocketMQ remoting clients on `listen.native`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NativeConfig {
    /// The longest a pull is held waiting for messages, whatever the client asks.
    #[serde(with = "units::duration")]
    pub max_suspend: Duration,
    /// Sends processed at once; beyond it a send is answered SYSTEM_BUSY.
    pub max_inflight_sends: usize,
    /// Largest remoting frame accepted.
    pub max_frame_len: ByteSize,
}

impl Default for NativeConfig {
    fn default() -> Self {
        NativeConfig {
            max_suspend: Duration::from_secs(30),
            max_inflight_sends: 10_000,
            max_frame_len: ByteSize(16 << 20),
        }
    }
}

/// WebSocket door limits (`[ws]`); see `docs/websocket.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WsConfig {
    /// Largest WebSocket message accepted; a bigger one closes the connection (1009).
    pub max_message_size: ByteSize,
    /// Bytes of pushed messages one connection may have waiting for a slow client.
    pub outbound_buffer: ByteSize,
    /// Subscriptions one connection may hold.
    pub max_subscriptions: u32,
    /// Delivered but un-acked messages one subscription may hold.
    pub max_unacked: u32,
    /// How long a clustering (POP) delivery stays invisible without an ack.
    #[serde(with = "units::duration")]
    pub invisible_time: Duration,
    /// Server pings an idle client this often; two silent intervals end the connection.
    #[serde(with = "units::duration")]
    pub ping_interval: Duration,
    /// Browser origins (`https://app.example.com`, `http://127.0.0.1:*`) whose pages
    /// may open a WebSocket; an upgrade with another `Origin` is refused with 403.
    /// Requests without `Origin` (native apps, curl) and same-origin pages always pass.
    pub allowed_origins: Vec<String>,
}

impl Default for WsConfig {
    fn default() -> Self {
        WsConfig {
            max_message_size: ByteSize(8 << 20),
            outbound_buffer: ByteSize(1 << 20),
            max_subscriptions: 64,
            max_unacked: 1000,
            invisible_time: Duration::from_secs(60),
            ping_interval: Duration::from_secs(30),
            allowed_origins: Vec::new(),
        }
    }
}

/// The HTTP gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Requests served at once; more are answered 429.
    pub max_inflight: u32,
    /// The longest long poll a receive may ask for (`wait_ms` is capped to it).
    #[serde(with = "units::duration")]
    pub max_wait: Duration,
    /// Invisibility of received messages when the request names none.
    #[serde(with = "units::duration")]
    pub default_invisible: Duration,
    /// The most messages one receive or replay returns.
    pub max_messages: u32,
    /// NameServers asked for `GET /v1/cluster`, `host:port` each (standalone adds
    /// its embedded one; a broker uses `broker.namesrv_addrs` when this is empty).
    #[serde(deserialize_with = "units::addr_list")]
    pub namesrv_addrs: Vec<String>,
    /// Browser origins whose pages may call the API; a request with another `Origin`
    /// gets 403. CORS headers (and preflight answers) only for these. Requests
    /// without `Origin` and same-origin ones always pass.
    pub allowed_origins: Vec<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_inflight: 1024,
            max_wait: Duration::from_secs(30),
            default_invisible: Duration::from_secs(30),
            max_messages: 32,
            namesrv_addrs: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// MQTT gateway settings (sessions and retained messages live in the broker's
/// state topics; an earlier version's `<data_dir>/mqtt` files are imported once).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// Largest MQTT packet accepted (announced to v5 clients as Maximum Packet Size).
    pub max_packet_size: ByteSize,
    /// Unfinished QoS 2 publishes a client may have (Receive Maximum announced to v5 clients).
    pub receive_maximum: u16,
    /// Outgoing QoS 1/2 messages in flight per client (also capped by the client's Receive Maximum).
    pub max_inflight: u16,
    /// Longest session expiry granted (also for 3.1.1 persistent sessions).
    #[serde(with = "units::duration")]
    pub max_session_expiry: Duration,
    /// Longest keep-alive granted to MQTT 5 clients; 0 accepts any (a client asking
    /// more, or 0, is told the server's value). 3.1.1 clients, which cannot be told,
    /// keep their own.
    #[serde(with = "units::duration")]
    pub max_keep_alive: Duration,
    /// The keep-alive every MQTT 5 client gets, told in CONNACK (Server Keep Alive)
    /// when it asked another; 0 = the client's own (capped by `max_keep_alive`).
    #[serde(with = "units::duration")]
    pub server_keep_alive: Duration,
    /// Topic aliases a v5 client may use towards the server.
    pub topic_alias_maximum: u16,
    /// How often `$SYS/#` (Mosquitto's broker statistics) is updated; 0 = no `$SYS`.
    #[serde(with = "units::duration")]
    pub sys_interval: Duration,
    /// How often the door writes that it is alive to the broker's MQTT state topic.
    #[serde(with = "units::duration")]
    pub door_liveness: Duration,
    /// A door silent this long is dead: another door over the same broker adopts its
    /// sessions and publishes their wills (docs/mqtt.md, "Where the state lives").
    #[serde(with = "units::duration")]
    pub door_timeout: Duration,
    /// The MQTT state is written whole (a snapshot) at least this often; keep it well
    /// below `store.retention`.
    #[serde(with = "units::duration")]
    pub snapshot_interval: Duration,
    /// Where MQTT 5 clients are sent when this door cannot serve them (MQTT 5
    /// Server Reference, e.g. `"master-host:1883"`, or several separated by spaces:
    /// the doors of the group's nodes): a publish to a read-only slave gets
    /// DISCONNECT 0x9C (Use another server) with it instead of PUBACK 0x80, a
    /// persistent session a slave cannot record CONNACK 0x9C, and a master demoted
    /// by the controller closes its v5 connections with 0x9C. Empty: no reference.
    pub server_reference: String,
    /// The MQTT service moved for good (operator-driven, docs/mqtt.md "Server
    /// redirection"): every CONNECT is refused, v5 with CONNACK 0x9D (Server moved)
    /// and this as Server Reference, 3.1.1 with CONNACK 3 (server unavailable).
    /// Empty: serve as usual.
    pub moved_to: String,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            max_packet_size: ByteSize(1024 * 1024),
            receive_maximum: 1024,
            max_inflight: 1024,
            max_session_expiry: Duration::from_secs(7 * 24 * 3600),
            max_keep_alive: Duration::ZERO,
            server_keep_alive: Duration::ZERO,
            topic_alias_maximum: 64,
            sys_interval: Duration::from_secs(10),
            door_liveness: Duration::from_secs(1),
            door_timeout: Duration::from_secs(4),
            snapshot_interval: Duration::from_secs(3600),
            server_reference: String::new(),
            moved_to: String::new(),
        }
    }
}

/// What a door does with a publish or subscription the ACL denies (`auth.deny_action`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenyAction {
    /// Answer with the protocol's "not authorized" (MQTT 3.1.1: acknowledge and drop).
    #[default]
    Ignore,
    /// Close the connection (MQTT: DISCONNECT 0x87 on 5).
    Disconnect,
}

/// Authentication and authorization (`[auth]`); see `docs/security.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Every door asks for credentials and checks the ACL.
    pub enabled: bool,
    /// The user store (TOML). Empty: `<data_dir>/users.toml`.
    pub users_file: PathBuf,
    /// Start on a non-loopback address with authentication off, deliberately.
    pub allow_anonymous: bool,
    /// A denied publish/subscribe: `ignore` (not-authorized answer) or `disconnect`.
    pub deny_action: DenyAction,
    /// A verified client certificate's name is an identity (mTLS).
    pub certificate_identity: bool,
    /// Internal credential: the AccessKey brokers sign NameServer writes with.
    pub internal_access_key: String,
    /// Its secret (plain: it keys an HMAC). Empty with auth on: NameServer writes are
    /// refused. Prefer `ROCKETGATE_AUTH__INTERNAL_SECRET` to writing it in a file.
    pub internal_secret: String,
    /// HS256 secret for JWTs given as a password or bearer token (empty: no HS256).
    pub jwt_secret: String,
    /// PEM RSA public key file for RS256 JWTs (empty: no RS256).
    pub jwt_public_key_file: PathBuf,
    /// The JWT claim holding the user name.
    pub jwt_username_claim: String,
    /// How long a verified password stays in the credential cache.
    #[serde(with = "units::duration")]
    pub cache_ttl: Duration,
    /// Failed logins from one address or for one user before attempts slow down.
    pub failed_login_burst: u32,
    /// The longest a failed-login back-off makes an attempt wait.
    #[serde(with = "units::duration")]
    pub failed_login_max_delay: Duration,
    /// Connections one address may hold on each door (0: no limit).
    pub max_connections_per_address: u32,
    /// The share of a core each password-verifying thread may use (0 < share ≤ 1):
    /// below 1 it rests after each argon2id verification, so a storm of new
    /// credentials verifies more slowly and leaves the CPU idle more often.
    pub verify_share: f64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            enabled: false,
            users_file: PathBuf::new(),
            allow_anonymous: false,
            deny_action: DenyAction::Ignore,
            certificate_identity: false,
            internal_access_key: "rocketgate-internal".into(),
            internal_secret: String::new(),
            jwt_secret: String::new(),
            jwt_public_key_file: PathBuf::new(),
            jwt_username_claim: "sub".into(),
            cache_ttl: Duration::from_secs(60),
            failed_login_burst: 5,
            failed_login_max_delay: Duration::from_secs(5),
            max_connections_per_address: 0,
            verify_share: 1.0,
        }
    }
}

/// How a master acknowledges a send (`ha.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HaMode {
    /// Acknowledged after the master's own store; slaves trail (lag in /metrics).
    #[default]
    Async,
    /// Acknowledged only once `ha.min_in_sync_replicas` copies (master included) hold it.
    Sync,
}

/// Replication of a broker group (`[ha]`, docs/replication.md). `broker.id` says the
/// role: 0 = master, > 0 = slave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    /// On a slave: the master's replication address (`host:port`, its `listen.ha`).
    pub master: String,
    /// On a master: `sync` or `async` acknowledgement.
    pub mode: HaMode,
    /// Copies (master included) a sync send needs before it is acknowledged; 0 = the
    /// mode's default (2 under `sync`, 1 under `async`).
    pub min_in_sync_replicas: u32,
    /// How long a sync send waits for its copies before it is answered "not replicated".
    #[serde(with = "units::duration")]
    pub sync_timeout: Duration,
    /// A slave further behind than this leaves the in-sync set (rejoins when caught up).
    pub max_lag_bytes: ByteSize,
    /// Shared secret both ends of the replication channel must present.
    pub secret: String,
    /// Heartbeat period of the replication stream; a peer silent for 4 of them is dropped.
    #[serde(with = "units::duration")]
    pub heartbeat_interval: Duration,
    /// On a slave: a PEM CA bundle the master's certificate is verified against; set,
    /// the slave connects with TLS (the master has `tls.ha = true`). Empty: plain TCP.
    pub master_ca: PathBuf,
    /// On a slave with `master_ca`: the name the master's certificate must carry
    /// (empty: the host part of `ha.master`).
    pub master_server_name: String,
    /// Native consumers far behind are moved to a slave (RocketMQ's
    /// `slaveReadEnable`): a master's pull answer suggests an in-sync slave
    /// (`suggestWhichBrokerId`) when the consumer is more than `slave_read_lag_bytes`
    /// of commit log behind; a slave's suggests the master again once it is within
    /// half of that. Off: every answer names the master.
    pub slave_read: bool,
    /// How far behind the end of the commit log (bytes after the last message a pull
    /// returns) a consumer is moved to a slave (RocketMQ measures it against 40 % of
    /// the RAM: the message is no longer in the page cache).
    pub slave_read_lag_bytes: ByteSize,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            master: String::new(),
            mode: HaMode::Async,
            min_in_sync_replicas: 0,
            sync_timeout: Duration::from_secs(3),
            max_lag_bytes: ByteSize(256 << 20),
            secret: String::new(),
            heartbeat_interval: Duration::from_secs(1),
            master_ca: PathBuf::new(),
            master_server_name: String::new(),
            slave_read: false,
            slave_read_lag_bytes: ByteSize(256 << 20),
        }
    }
}

impl HaConfig {
    /// Copies a send needs: the configured value, or the mode's default.
    pub fn required_copies(&self) -> u32 {
        match (self.min_in_sync_replicas, self.mode) {
            (0, HaMode::Sync) => 2,
            (0, HaMode::Async) => 1,
            (n, _) => n,
        }
    }
}

/// What `rocketgate proxy` reads besides the doors' sections and
/// `broker.namesrv_addrs` (`[proxy]`, docs/proxy.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// A PEM CA bundle the brokers' native certificates are verified against; set, the
    /// proxy talks TLS to every broker (for brokers with `tls.native = enforcing` or
    /// `permissive`). Empty: plain remoting.
    pub broker_ca: PathBuf,
    /// How long a call to a broker waits for its answer (plus what a long poll asked to
    /// wait); keep it above the brokers' own waits (`store.sync_flush_timeout`, sync
    /// replication) so their errors arrive as themselves.
    #[serde(with = "units::duration")]
    pub request_timeout: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            broker_ca: PathBuf::new(),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// The controller of automatic failover (`[controller]`, docs/controller.md): the Raft
/// group that decides each broker group's master. A controller process (`rocketgate
/// controller`, or a NameServer started with `--controller`) reads `id`, `peers`,
/// `listen`, `data_dir`, `broker_timeout`, `allow_unclean_election` and the Raft timings;
/// a broker reads `addresses` and `heartbeat_interval`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerConfig {
    /// This controller's id, a key of `peers`.
    pub id: u64,
    /// Every controller, this one included: `1=host:port,2=host:port,3=host:port`.
    pub peers: String,
    /// Where this controller listens; empty = its own address in `peers`.
    pub listen: String,
    /// Raft log, vote and snapshots; empty = `<data_dir>/controller`.
    pub data_dir: PathBuf,
    /// A master whose heartbeats stop for this long is replaced by a member of its in-sync
    /// set. A master's write lease must be shorter than this minus the clock-drift margin.
    #[serde(with = "units::duration")]
    pub broker_timeout: Duration,
    /// Elect a broker outside the in-sync set when no member can take over. Loses the
    /// acknowledged messages the new master does not hold: off unless availability matters
    /// more than them.
    pub allow_unclean_election: bool,
    /// Raft heartbeat between controllers.
    #[serde(with = "units::duration")]
    pub raft_heartbeat_interval: Duration,
    /// Raft election timeout (randomised between it and twice it).
    #[serde(with = "units::duration")]
    pub raft_election_timeout: Duration,
    /// On a broker: the controllers to register and heartbeat with, `host:port` separated
    /// by `;`. Empty: no controller (roles come from `broker.id`).
    pub addresses: String,
    /// On a broker: how often it heartbeats to the controller leader.
    #[serde(with = "units::duration")]
    pub heartbeat_interval: Duration,
    /// PEM CA the controllers' certificates are verified against: set, every
    /// connection to a controller (a broker's, another controller's, the CLI's) is
    /// TLS (`tls.controller = true` on the controllers). Empty: plain TCP.
    pub ca: PathBuf,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            id: 1,
            peers: String::new(),
            listen: String::new(),
            data_dir: PathBuf::new(),
            broker_timeout: Duration::from_secs(3),
            allow_unclean_election: false,
            raft_heartbeat_interval: Duration::from_millis(100),
            raft_election_timeout: Duration::from_millis(500),
            addresses: String::new(),
            heartbeat_interval: Duration::from_millis(500),
            ca: PathBuf::new(),
        }
    }
}

impl ControllerConfig {
    /// A master's write lease given the controllers' `broker_timeout`: two thirds of it,
    /// the last third being the margin for clock-rate drift and scheduling delays (3 s →
    /// a 2 s lease, 1 s margin; docs/controller.md, "The lease rule").
    pub fn lease_for(broker_timeout: Duration) -> Duration {
        broker_timeout * 2 / 3
    }

    /// The controller's data directory: `controller.data_dir`, or `<data_dir>/controller`.
    pub fn dir(&self, data_dir: &std::path::Path) -> PathBuf {
        if self.data_dir.as_os_str().is_empty() {
            data_dir.join("controller")
        } else {
            self.data_dir.clone()
        }
    }
}

impl Config {
    /// The user store's path: `auth.users_file`, or `<data_dir>/users.toml`.
    pub fn users_file(&self) -> PathBuf {
        if self.auth.users_file.as_os_str().is_empty() {
            self.data_dir.join("users.toml")
        } else {
            self.auth.users_file.clone()
        }
    }

    /// Whether a controller decides this broker's role (`controller.addresses` set):
    /// `broker.id` then only names the broker in its group, and the role-less config is
    /// turned into a master's or a slave's each time the controller assigns one.
    pub fn controlled(&self) -> bool {
        !self.controller.addresses.trim().is_empty()
    }

    /// A slave of a broker group (`broker.id > 0`).
    pub fn is_slave(&self) -> bool {
        self.broker.id > 0
    }

    /// Whether this node opens the replication port: a master with `ha.secret` set.
    /// Without a secret the port stays closed — an open one would hand the whole log
    /// to anyone who connects — and the node runs alone.
    pub fn serves_ha(&self) -> bool {
        !self.is_slave() && !self.ha.secret.is_empty()
    }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("data"),
            listen: Listen::default(),
            store: StoreConfig::default(),
            broker: BrokerConfig::default(),
            namesrv: NamesrvConfig::default(),
            native: NativeConfig::default(),
            ws: WsConfig::default(),
            http: HttpConfig::default(),
            mqtt: MqttConfig::default(),
            tls: TlsConfig::default(),
            auth: AuthConfig::default(),
            ha: HaConfig::default(),
            controller: ControllerConfig::default(),
            proxy: ProxyConfig::default(),
        }
    }
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            namesrv: local(9876),
            native: local(10911),
            mqtt: local(1883),
            http: local(8080),
            ws: local(8083),
            mqtts: local(8883),
            ha: local(10912),
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            segment_size: ByteSize(1 << 30),
            max_message_size: ByteSize(4 << 20),
            flush: FlushMode::Async,
            flush_interval: Duration::from_millis(500),
            sync_flush_timeout: Duration::from_secs(5),
            checkpoint_interval: Duration::from_secs(1),
            retention: Duration::from_secs(72 * 3600),
            retention_check_interval: Duration::from_secs(10),
            disk_soft_ratio: 0.75,
            disk_hard_ratio: 0.90,
            disk_full_policy: DiskFullPolicy::Refuse,
            consume_queue_entries_per_file: 300_000,
            index_slots: 5_000_000,
            index_entries_per_file: 20_000_000,
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            name: "broker-a".into(),
            cluster: "DefaultCluster".into(),
            id: 0,
            namesrv_addrs: Vec::new(),
            auto_create_topics: true,
            default_queue_nums: 4,
            register_interval: Duration::from_secs(30),
            transaction_check_interval: Duration::from_secs(60),
            transaction_timeout: Duration::from_secs(6),
            transaction_max_checks: 15,
            max_reconsume_times: 16,
            advertised_address: String::new(),
        }
    }
}

impl Default for NamesrvConfig {
    fn default() -> Self {
        NamesrvConfig {
            scan_interval: Duration::from_secs(10),
            broker_expiry: Duration::from_secs(120),
            ca: PathBuf::new(),
        }
    }
}

/// One `section.key = value` setting from the environment or a flag.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Dotted path, e.g. `store.flush` or `data_dir`.
    pub path: String,
    /// The raw value; parsed as a TOML scalar when it is one, else taken as a string.
    pub value: String,
    /// Where it came from, for error messages (`env ROCKETGATE_STORE__FLUSH`, `flag --mqtt`).
    pub origin: String,
}

impl Override {
    pub fn new(path: &str, value: impl Into<String>, origin: &str) -> Self {
        Override {
            path: path.to_string(),
            value: value.into(),
            origin: origin.to_string(),
        }
    }
}

/// Prefix of the environment variables read as settings.
pub const ENV_PREFIX: &str = "ROCKETGATE_";

/// Turns `ROCKETGATE_*` environment variables into overrides:
/// `ROCKETGATE_STORE__FLUSH=sync` becomes `store.flush = "sync"`.
pub fn env_overrides(vars: impl IntoIterator<Item = (String, String)>) -> Vec<Override> {
    let mut out: Vec<Override> = vars
        .into_iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix(ENV_PREFIX)?;
            // `rocketgate admin`'s own variables (server, credentials, the CA of an
            // https server), not settings.
            if rest.starts_with("ADMIN_") || rest == "CACERT" {
                return None;
            }
            let path = rest.to_ascii_lowercase().replace("__", ".");
            Some(Override {
                path,
                value: v,
                origin: format!("env {k}"),
            })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// `broker.advertised_address` split: `None` when empty, else the host (brackets
/// of an IPv6 address removed) and the port when one is given.
fn advertised(s: &str) -> Result<Option<(String, Option<u16>)>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if s.contains(char::is_whitespace) || s.contains('/') {
        return Err(format!("{s:?} is not HOST or HOST:PORT"));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Some((a.ip().to_string(), Some(a.port()))));
    }
    if s.parse::<std::net::IpAddr>().is_ok() {
        return Ok(Some((s.to_owned(), None)));
    }
    let v6 = s.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
    if let Some(ip) = v6 {
        return match ip.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(Some((ip.to_owned(), None))),
            Err(_) => Err(format!("{s:?} is not HOST or HOST:PORT")),
        };
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => {
            let port = p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{s:?}: {p:?} is not a port (1-65535)"))?;
            (h, Some(port))
        }
        None => (s, None),
    };
    let name_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
    if !name_ok {
        return Err(format!("{s:?} is not HOST or HOST:PORT"));
    }
    Ok(Some((host.to_owned(), port)))
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Parses a listen address given as a flag: `PORT`, `HOST:PORT` or `[V6]:PORT`.
/// A bare port binds 127.0.0.1.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(local(port));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| format!("`{s}` is not a port or a HOST:PORT address"))
}

impl Config {
    /// Loads defaults, then `file`, then `overrides` (environment first, flags last),
    /// and validates the result.
    pub fn load(file: Option<&Path>, overrides: &[Override]) -> Result<Config, Error> {
        let mut tree = toml::Value::try_from(Config::default()).map_err(|e| Error::Setting {
            origin: "defaults".into(),
            message: e.to_string(),
        })?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let from_file: toml::Value = toml::from_str(&text).map_err(|source| Error::Parse {
                path: path.to_path_buf(),
                source: Box::new(source),
            })?;
            merge(&mut tree, from_file);
            // Catch unknown keys and bad types here, naming the file.
            Config::deserialize(tree.clone()).map_err(|e| Error::Setting {
                origin: format!("in {}", path.display()),
                message: e.to_string(),
            })?;
        }
        for o in overrides {
            set_path(&mut tree, &o.path, scalar(&o.value)).map_err(|message| Error::Setting {
                origin: format!("from {}", o.origin),
                message,
            })?;
            Config::deserialize(tree.clone()).map_err(|e| Error::Setting {
                origin: format!("from {}", o.origin),
                message: e.to_string(),
            })?;
        }
        let config = Config::deserialize(tree).map_err(|e| Error::Setting {
            origin: "(merged)".into(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// The native door's address as the NameServers and controllers are told
    /// (`broker.advertised_address`, else `listen.native`).
    pub fn advertised_native(&self) -> String {
        match advertised(&self.broker.advertised_address) {
            Ok(Some((host, Some(port)))) => join_host_port(&host, port),
            Ok(Some((host, None))) => join_host_port(&host, self.listen.native.port()),
            _ => self.listen.native.to_string(),
        }
    }

    /// The replication port's address as the NameServers and controllers are told:
    /// the advertised host with `listen.ha`'s port, else `listen.ha`.
    pub fn advertised_ha(&self) -> String {
        match advertised(&self.broker.advertised_address) {
            Ok(Some((host, _))) => join_host_port(&host, self.listen.ha.port()),
            _ => self.listen.ha.to_string(),
        }
    }

    /// Checks values against each other; returns every problem at once.
    pub fn validate(&self) -> Result<(), Error> {
        let mut bad = Vec::new();
        if let Err(e) = advertised(&self.broker.advertised_address) {
            bad.push(format!("broker.advertised_address: {e}"));
        }
        let s = &self.store;
        if self.data_dir.as_os_str().is_empty() {
            bad.push("data_dir must not be empty".to_string());
        }
        if s.segment_size.0 < 64 * 1024 {
            bad.push(format!(
                "store.segment_size is {}; it must be at least 64KiB",
                s.segment_size
            ));
        }
        if s.segment_size.0 > i32::MAX as u64 {
            // A record's TOTALSIZE (and so a segment's end filler) is an i32.
            bad.push(format!(
                "store.segment_size is {}; it must be below 2GiB",
                s.segment_size
            ));
        }
        let share = self.auth.verify_share;
        if !(share > 0.0 && share <= 1.0) {
            bad.push(format!(
                "auth.verify_share is {share}; it must be above 0 and at most 1"
            ));
        }
        let w = &self.ws;
        if w.max_message_size.0 < 1024
            || w.outbound_buffer.0 == 0
            || w.outbound_buffer.0 > u32::MAX as u64
        {
            bad.push("ws.max_message_size must be at least 1KiB and ws.outbound_buffer between 1B and 4GiB".to_string());
        }
        if w.max_subscriptions == 0 || w.max_unacked == 0 {
            bad.push("ws.max_subscriptions and ws.max_unacked must be at least 1".to_string());
        }
        let c = &self.controller;
        if c.heartbeat_interval * 2 > c.broker_timeout {
            bad.push(format!(
                "controller.heartbeat_interval ({:?}) must be at most half of controller.broker_timeout ({:?}), or one late heartbeat replaces a live master",
                c.heartbeat_interval, c.broker_timeout
            ));
        }
        if c.raft_heartbeat_interval * 3 > c.raft_election_timeout {
            bad.push(format!(
                "controller.raft_heartbeat_interval ({:?}) must be at most a third of controller.raft_election_timeout ({:?})",
                c.raft_heartbeat_interval, c.raft_election_timeout
            ));
        }
        for part in c
            .peers
            .split([',', ';'])
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let ok = part
                .split_once('=')
                .is_some_and(|(id, addr)| id.trim().parse::<u64>().is_ok() && addr.contains(':'));
            if !ok {
                bad.push(format!(
                    "controller.peers: {part:?} is not ID=HOST:PORT (e.g. 1=127.0.0.1:9878)"
                ));
            }
        }
        if s.max_message_size.0 < 1024 {
            bad.push("store.max_message_size must be at least 1KiB".to_string());
        }
        if s.max_message_size.0 + 1024 > s.segment_size.0 {
            bad.push(format!(
                "store.max_message_size ({}) must be at least 1KiB smaller than store.segment_size ({})",
                s.max_message_size, s.segment_size
            ));
        }
        for (name, d) in [
            ("store.flush_interval", s.flush_interval),
            ("store.sync_flush_timeout", s.sync_flush_timeout),
            ("store.checkpoint_interval", s.checkpoint_interval),
            ("store.retention", s.retention),
            ("store.retention_check_interval", s.retention_check_interval),
            ("broker.register_interval", self.broker.register_interval),
            (
                "broker.transaction_check_interval",
                self.broker.transaction_check_interval,
            ),
            ("namesrv.scan_interval", self.namesrv.scan_interval),
            ("namesrv.broker_expiry", self.namesrv.broker_expiry),
            ("native.max_suspend", self.native.max_suspend),
            ("ws.invisible_time", self.ws.invisible_time),
            ("ws.ping_interval", self.ws.ping_interval),
            ("controller.broker_timeout", self.controller.broker_timeout),
            (
                "controller.raft_heartbeat_interval",
                self.controller.raft_heartbeat_interval,
            ),
            (
                "controller.raft_election_timeout",
                self.controller.raft_election_timeout,
            ),
            (
                "controller.heartbeat_interval",
                self.controller.heartbeat_interval,
            ),
        ] {
            if d.is_zero() {
                bad.push(format!("{name} must be greater than zero"));
            }
        }
        for (name, r) in [
            ("store.disk_soft_ratio", s.disk_soft_ratio),
            ("store.disk_hard_ratio", s.disk_hard_ratio),
        ] {
            if !(r > 0.0 && r <= 1.0) {
                bad.push(format!("{name} is {r}; it must be in (0, 1]"));
            }
        }
        if s.disk_soft_ratio >= s.disk_hard_ratio {
            bad.push(format!(
                "store.disk_soft_ratio ({}) must be below store.disk_hard_ratio ({})",
                s.disk_soft_ratio, s.disk_hard_ratio
            ));
        }
        if s.consume_queue_entries_per_file < 16 {
            bad.push("store.consume_queue_entries_per_file must be at least 16".to_string());
        }
        if s.index_slots < 16 || s.index_entries_per_file < 16 {
            bad.push(
                "store.index_slots and store.index_entries_per_file must be at least 16"
                    .to_string(),
            );
        }
        if self.broker.name.is_empty() || self.broker.name.contains(['/', '\\', ' ']) {
            bad.push(format!(
                "broker.name `{}` must be non-empty, without spaces or slashes",
                self.broker.name
            ));
        }
        if self.broker.default_queue_nums == 0 || self.broker.default_queue_nums > 1024 {
            bad.push("broker.default_queue_nums must be in 1..=1024".to_string());
        }
        let h = &self.http;
        if h.max_inflight == 0 {
            bad.push("http.max_inflight must be at least 1".to_string());
        }
        if h.max_messages == 0 || h.max_messages > 1024 {
            bad.push("http.max_messages must be in 1..=1024".to_string());
        }
        if h.default_invisible < Duration::from_millis(100) {
            bad.push("http.default_invisible must be at least 100ms".to_string());
        }
        let m = &self.mqtt;
        if m.max_packet_size.0 < 1024 || m.max_packet_size.0 > 256 * 1024 * 1024 {
            bad.push("mqtt.max_packet_size must be between 1KiB and 256MiB".to_string());
        }
        if m.receive_maximum == 0 || m.max_inflight == 0 {
            bad.push("mqtt.receive_maximum and mqtt.max_inflight must be at least 1".to_string());
        }
        if m.max_session_expiry.as_secs() > u64::from(u32::MAX) {
            bad.push("mqtt.max_session_expiry must be below 136 years".to_string());
        }
        if m.max_keep_alive.as_secs() > u64::from(u16::MAX) {
            bad.push("mqtt.max_keep_alive must be at most 65535s".to_string());
        }
        if m.server_keep_alive.as_secs() > u64::from(u16::MAX) {
            bad.push("mqtt.server_keep_alive must be at most 65535s".to_string());
        }
        if m.door_liveness.is_zero() || m.door_timeout < m.door_liveness * 2 {
            bad.push(
                "mqtt.door_liveness must be above 0s and mqtt.door_timeout at least twice it"
                    .to_string(),
            );
        }
        if m.snapshot_interval.is_zero() {
            bad.push("mqtt.snapshot_interval must be above 0s".to_string());
        }
        if self.namesrv.broker_expiry <= self.namesrv.scan_interval {
            bad.push("namesrv.broker_expiry must be longer than namesrv.scan_interval".into());
        }
        let t = &self.tls;
        if t.enabled() && (t.cert.as_os_str().is_empty() || t.key.as_os_str().is_empty()) {
            bad.push("TLS is enabled for a door (tls.mqtt/http/ws/native/ha) but tls.cert or tls.key is not set".into());
        }
        if t.client_auth != ClientAuth::None && t.client_ca.as_os_str().is_empty() {
            bad.push("tls.client_auth asks for client certificates; set tls.client_ca to the CA that signs them".into());
        }
        for (name, list) in [
            ("http.allowed_origins", &self.http.allowed_origins),
            ("ws.allowed_origins", &self.ws.allowed_origins),
        ] {
            for o in list {
                if !(o == "*" || o.starts_with("http://") || o.starts_with("https://"))
                    || o.ends_with('/')
                {
                    bad.push(format!(
                        "{name}: `{o}` is not an origin (scheme://host[:port], no path; `*` for any)"
                    ));
                }
            }
        }
        let ha = &self.ha;
        if self.controlled() {
            if self.broker.id == 0 {
                bad.push(
                    "with controller.addresses set, broker.id names the broker in its group and must be 1 or more (the controller decides who is master; the master registers with the NameServers as id 0)"
                        .into(),
                );
            }
            if !ha.master.trim().is_empty() {
                bad.push(
                    "with controller.addresses set the controller names the master: leave ha.master empty"
                        .into(),
                );
            }
            if ha.secret.is_empty() {
                bad.push(
                    "with controller.addresses set the brokers of a group replicate: set ha.secret (ROCKETGATE_HA__SECRET), the same on every broker of the group"
                        .into(),
                );
            }
        } else if self.is_slave() && ha.master.trim().is_empty() {
            bad.push(format!(
                "broker.id is {} (a slave): ha.master must name the master's replication address",
                self.broker.id
            ));
        }
        if ha.secret.is_empty()
            && !self.controlled()
            && (self.is_slave() || ha.required_copies() > 1)
        {
            bad.push(
                "replication needs ha.secret (the shared secret of the replication channel) on \
                 the master and its slaves: set it (ROCKETGATE_HA__SECRET) for a slave or a \
                 master that waits for copies"
                    .into(),
            );
        }
        if !ha.master.is_empty() && !ha.master.contains(':') {
            bad.push(format!("ha.master `{}` must be host:port", ha.master));
        }
        if ha.sync_timeout.is_zero() || ha.heartbeat_interval.is_zero() {
            bad.push("ha.sync_timeout and ha.heartbeat_interval must be greater than zero".into());
        }
        if ha.required_copies() > 16 {
            bad.push("ha.min_in_sync_replicas must be at most 16".into());
        }
        if ha.slave_read && ha.slave_read_lag_bytes.0 < 2 {
            bad.push("ha.slave_read_lag_bytes must be at least 2 bytes".into());
        }
        if ha.max_lag_bytes.0 == 0 {
            bad.push("ha.max_lag_bytes must be greater than zero".into());
        }
        let l = &self.listen;
        let mut doors = vec![
            ("listen.namesrv", l.namesrv),
            ("listen.native", l.native),
            ("listen.mqtt", l.mqtt),
            ("listen.http", l.http),
            ("listen.ws", l.ws),
            ("listen.ha", l.ha),
        ];
        if t.mqtt {
            doors.push(("listen.mqtts", l.mqtts));
        }
        for (i, (a, x)) in doors.iter().enumerate() {
            for (b, y) in &doors[i + 1..] {
                if x.port() != 0 && x == y {
                    bad.push(format!("{a} and {b} both listen on {x}"));
                }
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(bad))
        }
    }
}

/// Takes `s` as a TOML scalar (number, bool, array) when it is one, else as a string.
fn scalar(s: &str) -> toml::Value {
    let doc = format!("v = {s}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(s.into())),
        Err(_) => toml::Value::String(s.to_string()),
    }
}

fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

fn set_path(tree: &mut toml::Value, path: &str, value: toml::Value) -> Result<(), String> {
    let mut node = tree;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let table = node
            .as_table_mut()
            .ok_or_else(|| format!("`{}` is not a section", parts[..i].join(".")))?;
        if !table.contains_key(*part) {
            return Err(format!("unknown setting `{path}`"));
        }
        if i + 1 == parts.len() {
            let slot = table.get_mut(*part).expect("checked above");
            if slot.is_table() {
                return Err(format!("`{path}` is a section, not a setting"));
            }
            *slot = value;
            return Ok(());
        }
        node = table.get_mut(*part).expect("checked above");
    }
    Err(format!("empty setting path `{path}`"))
}

#[cfg(test)]
mod tests;
