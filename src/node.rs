//! Wiring a running node: opens the store and starts each door that exists.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use rocketgate_auth::{Auth, Credentials};
use rocketgate_config::NativeTls;
use rocketgate_config::{Config, DiskFullPolicy as ConfigDiskFull, FlushMode as ConfigFlush};
use rocketgate_core::broker::{Broker, BrokerSettings, MessagingApi, SystemClock};
use rocketgate_core::store::{DiskFullPolicy, FlushMode, Store, StoreDeps, StoreSettings};
use rocketgate_http as http;
use rocketgate_namesrv::{NameServer, NameServerHandle, NamesrvSettings};
use rocketgate_native::{Server as NativeServer, ServerHandle, ServerSettings, TlsMode};
use rocketgate_remoting::protocol::WireTopicConfig as WireTopic;
use rocketgate_remoting::{BrokerIdentity, Registrar, RegistrarHandle};
use rocketgate_tls::{Acceptor, ReloadHandle, TlsSettings};
use rocketgate_websocket as ws;

use crate::channel_tls::{channel_acceptor, namesrv_dialer};
use tokio::net::TcpListener;

/// Store options from the config.
pub fn store_options(config: &Config) -> StoreSettings {
    let s = &config.store;
    StoreSettings {
        segment_size: s.segment_size.0,
        max_message_size: s.max_message_size.0 as usize,
        flush: match s.flush {
            ConfigFlush::Sync => FlushMode::Sync {
                timeout: s.sync_flush_timeout,
            },
            ConfigFlush::Async => FlushMode::Async {
                interval: s.flush_interval,
            },
        },
        checkpoint_interval: s.checkpoint_interval,
        retention: s.retention,
        retention_check_interval: s.retention_check_interval,
        disk_soft_ratio: s.disk_soft_ratio,
        disk_hard_ratio: s.disk_hard_ratio,
        disk_full_policy: match s.disk_full_policy {
            ConfigDiskFull::Refuse => DiskFullPolicy::Refuse,
            ConfigDiskFull::DeleteOldest => DiskFullPolicy::DeleteOldest,
        },
        consume_queue_entries_per_file: s.consume_queue_entries_per_file,
        index_slots: s.index_slots,
        index_entries_per_file: s.index_entries_per_file,
        store_host: config.listen.native,
        prefault: true,
    }
}

fn open_store(config: &Config) -> anyhow::Result<Arc<Store>> {
    let (store, report) = Store::open(
        &config.data_dir,
        store_options(config),
        StoreDeps::default(),
    )
    .with_context(|| format!("opening the store in {}", config.data_dir.display()))?;
    let p = store.positions();
    tracing::info!(
        data_dir = %config.data_dir.display(),
        unclean_shutdown = report.unclean_shutdown,
        log_end = p.written,
        flush = ?config.store.flush,
        "store open"
    );
    Ok(Arc::new(store))
}

/// The message a node refuses to start with when a door listens beyond loopback with
/// authentication off (docs/security.md quotes it).
pub const EXPOSED_WITHOUT_AUTH: &str = "refusing to start: authentication is off and";

/// Secure default (Mosquitto 2.0's stance): no door listens on a non-loopback
/// address with authentication off, unless asked for deliberately.
pub(crate) fn check_exposure(config: &Config, doors: &[(&str, SocketAddr)]) -> anyhow::Result<()> {
    if config.auth.enabled || config.auth.allow_anonymous {
        return Ok(());
    }
    let exposed: Vec<String> = doors
        .iter()
        .filter(|(_, a)| !a.ip().is_loopback())
        .map(|(d, a)| format!("{d} = {a}"))
        .collect();
    if exposed.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{EXPOSED_WITHOUT_AUTH} {} listen(s) beyond loopback, where anyone who reaches the \
         port could publish, consume and administer. Either enable authentication \
         ([auth] enabled = true in the config, or ROCKETGATE_AUTH__ENABLED=true) and create \
         an admin with `rocketgate user add admin --role admin --password-stdin`, or pass \
         --allow-anonymous (auth.allow_anonymous = true) to run without authentication \
         deliberately.",
        exposed.join(", ")
    )
}

/// The user store and ACL engine shared by every door. In standalone mode, with auth
/// on and no internal secret configured, the broker and its embedded NameServer share
/// a random one made for this process.
pub(crate) fn open_auth(config: &Config, embedded_namesrv: bool) -> anyhow::Result<Arc<Auth>> {
    let mut settings =
        rocketgate_auth::Settings::from_config(config).context("reading the [auth] settings")?;
    if settings.enabled && settings.internal.is_none() && embedded_namesrv {
        settings.internal = Some(rocketgate_auth::AccessKey {
            access_key: config.auth.internal_access_key.clone(),
            // 256 random bits, never written anywhere.
            secret_key: rocketgate_auth::store::new_api_key(),
        });
    }
    let auth = Auth::open(settings).context("opening the user store")?;
    if auth.enabled() {
        auth.spawn_watch();
        let users = auth.users().file().users.len();
        tracing::info!(file = %config.users_file().display(), users, "authentication on");
        if users == 0 {
            tracing::warn!(
                "authentication is on but the user store is empty: nobody can connect; \
                 create an admin with `rocketgate user add admin --role admin --password-stdin`"
            );
        }
    }
    Ok(auth)
}

/// Signs the registrar's NameServer writes with the internal credential.
fn internal_signer(auth: &Auth) -> Option<rocketgate_remoting::Signer> {
    let c = auth.internal_credential()?.clone();
    Some(Arc::new(
        move |cmd: &mut rocketgate_remoting::RemotingCommand| {
            use rocketgate_auth::sign;
            cmd.ext_fields
                .insert(sign::ACCESS_KEY, c.access_key.clone());
            let sig = sign::signature(c.secret_key.as_bytes(), cmd.ext_fields.iter(), &cmd.body);
            cmd.ext_fields.insert(sign::SIGNATURE, sig);
        },
    ))
}

/// Prints one machine-readable line per listening door (harnesses parse these).
pub(crate) fn announce(door: &str, addr: SocketAddr) {
    {
        // A node restarted in another role announces its doors again: one entry each.
        let mut all = rocketgate_core::sync::lock(&ANNOUNCED);
        all.retain(|(d, _)| d != door);
        all.push((door.to_owned(), addr));
    }
    println!("rocketgate: {door} listening on {addr}");
    tracing::info!(%addr, "{door} listening");
}

/// The TLS acceptor every TLS door shares (one certificate), and the task that
/// reloads it when the files change; `None` when no door uses TLS.
pub(crate) fn start_tls(config: &Config) -> anyhow::Result<Option<(Acceptor, ReloadHandle)>> {
    let Some(settings) = TlsSettings::from_config(&config.tls) else {
        return Ok(None);
    };
    let acceptor = Acceptor::new(settings).context("loading the TLS certificate ([tls])")?;
    let reload = acceptor.spawn_reload();
    tracing::info!(
        cert = %config.tls.cert.display(),
        client_auth = ?config.tls.client_auth,
        "TLS ready"
    );
    Ok(Some((acceptor, reload)))
}

/// The acceptor for a door whose TLS switch is `on`.
pub(crate) fn tls_for(tls: &Option<(Acceptor, ReloadHandle)>, on: bool) -> Option<Acceptor> {
    tls.as_ref().filter(|_| on).map(|(a, _)| a.clone())
}

/// The MQTT door on `listen.mqtt` (and `listen.mqtts` with `tls.mqtt`); its sessions
/// and retained messages live in the broker's state topics (an earlier version's
/// `<data_dir>/mqtt` files are imported once).
///
/// `legacy_dir`: where an earlier version kept MQTT state files (empty: none).
pub(crate) async fn start_mqtt<B: MessagingApi + 'static>(
    config: &Config,
    broker: &Arc<B>,
    tls: Option<Acceptor>,
    auth: &Arc<Auth>,
    legacy_dir: std::path::PathBuf,
) -> anyhow::Result<rocketgate_mqtt::Handle<B>> {
    let m = &config.mqtt;
    let mut settings = rocketgate_mqtt::Settings::new(legacy_dir);
    settings.auth = auth.clone();
    // A packet must fit in one stored record (with room for the added properties),
    // so a publish batch never fails for one message's size.
    let record_room = config
        .store
        .max_message_size
        .0
        .saturating_sub(4096)
        .max(1024);
    settings.max_packet_size =
        u32::try_from(m.max_packet_size.0.min(record_room)).unwrap_or(u32::MAX);
    settings.receive_maximum = m.receive_maximum;
    settings.max_inflight = m.max_inflight;
    settings.max_session_expiry = u32::try_from(m.max_session_expiry.as_secs()).unwrap_or(u32::MAX);
    settings.max_keep_alive = u16::try_from(m.max_keep_alive.as_secs()).unwrap_or(u16::MAX);
    settings.server_keep_alive = u16::try_from(m.server_keep_alive.as_secs()).unwrap_or(u16::MAX);
    settings.topic_alias_maximum = m.topic_alias_maximum;
    settings.sys_interval = m.sys_interval;
    settings.door_liveness = m.door_liveness;
    settings.door_timeout = m.door_timeout;
    settings.snapshot_interval = m.snapshot_interval;
    settings.server_reference =
        (!m.server_reference.is_empty()).then(|| m.server_reference.clone());
    settings.moved_to = (!m.moved_to.is_empty()).then(|| m.moved_to.clone());
    // A snapshot part must fit in one stored record.
    settings.snapshot_chunk = usize::try_from(record_room)
        .unwrap_or(usize::MAX)
        .min(1 << 20);
    let (server, addr) =
        rocketgate_mqtt::Server::bind(config.listen.mqtt, broker.clone(), settings)
            .await
            .with_context(|| format!("starting MQTT on {}", config.listen.mqtt))?;
    announce("mqtt", addr);
    let server = match tls {
        Some(acceptor) => {
            let (server, addr) = server
                .with_tls(config.listen.mqtts, acceptor)
                .await
                .with_context(|| format!("starting MQTT over TLS on {}", config.listen.mqtts))?;
            announce("mqtts", addr);
            server
        }
        None => server,
    };
    Ok(server.spawn())
}

pub(crate) async fn start_namesrv(
    config: &Config,
    auth: &Arc<Auth>,
) -> anyhow::Result<(NameServerHandle, SocketAddr)> {
    let (ns, addr) = NameServer::bind(
        config.listen.namesrv,
        NamesrvSettings::from(&config.namesrv),
    )
    .await
    .with_context(|| format!("starting the NameServer on {}", config.listen.namesrv))?;
    announce("namesrv", addr);
    let ns = ns.with_auth(auth.clone());
    let ns = match channel_acceptor(config, config.tls.namesrv, "tls.namesrv")? {
        Some(acceptor) => ns.with_tls(acceptor),
        None => ns,
    };
    Ok((ns.spawn(), addr))
}

/// The topics this broker registers: its topic table (user topics and the retry and
/// dead-letter topics clients need routes for) and, with auto-create on, the default
/// topic route `TBW102`; read fresh at every registration.
fn broker_topics(broker: Arc<Broker>) -> impl Fn() -> Vec<WireTopic> + Send + Sync + 'static {
    move || {
        broker
            .route_snapshot()
            .into_iter()
            .map(|t| {
                let mut w = WireTopic::new(t.name, t.write_queues);
                w.read_queue_nums = t.read_queues;
                w.perm = u32::from(t.perm.0);
                w
            })
            .collect()
    }
}

/// The WebSocket door (`/v1/ws`; `/mqtt` once the MQTT door is glued in through
/// `Hooks::mqtt`).
/// The WebSocket door; its `/mqtt` path runs MQTT connections on the MQTT door's
/// shared state (sessions, retained messages, router), so MQTT.js in a browser and a
/// device on TCP see the same broker.
pub(crate) async fn start_ws<B: MessagingApi + 'static>(
    config: &Config,
    broker: &Arc<B>,
    mqtt: rocketgate_mqtt::Streams<B>,
    tls: Option<Acceptor>,
    auth: &Arc<Auth>,
) -> anyhow::Result<ws::Handle> {
    let mqtt_over_ws =
        move |io: ws::WsByteStream, peer: SocketAddr, tls_identity: Option<String>| {
            mqtt.spawn_stream(io, peer, tls_identity);
        };
    let hooks = ws::Hooks {
        mqtt: Some(Arc::new(mqtt_over_ws)),
        tls,
        auth: ws_authenticator(auth.clone()),
    };
    let (server, addr) = ws::Server::bind(
        config.listen.ws,
        broker.clone(),
        ws::Settings {
            max_connections_per_address: config.auth.max_connections_per_address,
            ..ws::Settings::from(&config.ws)
        },
        hooks,
    )
    .await
    .with_context(|| format!("starting the WebSocket door on {}", config.listen.ws))?;
    announce("ws", addr);
    Ok(server.spawn())
}

/// The WebSocket door's token seam backed by the user store: an API key or a JWT
/// (`?token=` or the `auth` frame) is the user, whose ACL the connection gets (until
/// a JWT's `exp`); without a token, a verified client certificate (WSS with mTLS and
/// `auth.certificate_identity`) is; `/mqtt` authenticates in its CONNECT instead.
fn ws_authenticator(auth: Arc<Auth>) -> Arc<dyn ws::Authenticator> {
    if !auth.enabled() {
        return Arc::new(ws::AllowAll);
    }
    Arc::new(move |a: &ws::AuthAttempt<'_>| {
        let creds = match (a.token, a.tls_identity) {
            (Some(t), _) => Credentials::Bearer(t),
            (None, Some(name))
                if a.door == ws::Door::Json && auth.settings().certificate_identity =>
            {
                Credentials::Certificate(name)
            }
            // `/v1/ws`: the first frame must be `auth`; `/mqtt`: CONNECT decides.
            (None, _) => return ws::AuthDecision::TokenRequired,
        };
        match auth.login_now(creds, a.peer.ip(), "ws") {
            Ok(login) => ws::AuthDecision::AllowWith {
                grant: Arc::new(auth.grant(&login.identity, "")),
                expires_at: login.expires_at,
            },
            Err(e) => ws::AuthDecision::Deny(e.to_string()),
        }
    })
}

fn start_registrar(
    config: &Config,
    broker: &Arc<Broker>,
    namesrvs: Vec<String>,
    auth: &Auth,
) -> anyhow::Result<RegistrarHandle> {
    let b = &config.broker;
    let identity = BrokerIdentity {
        cluster: b.cluster.clone(),
        name: b.name.clone(),
        id: b.id,
        // What clients and slaves dial: `broker.advertised_address` when the listen
        // address is not reachable as it is (0.0.0.0 in a container, NAT).
        addr: config.advertised_native(),
        ha_addr: if !config.serves_ha() {
            String::new()
        } else {
            config.advertised_ha()
        },
    };
    tracing::info!(namesrvs = ?namesrvs, broker = %b.name, broker_id = b.id, "registering with NameServers");
    let registrar = Registrar::new(
        identity,
        namesrvs,
        b.register_interval,
        Arc::new(broker_topics(broker.clone())),
    );
    let registrar = match namesrv_dialer(config)? {
        Some(dialer) => {
            use rocketgate_remoting::client::Link;
            type Connecting = std::pin::Pin<
                Box<dyn Future<Output = Result<Link, rocketgate_remoting::Error>> + Send>,
            >;
            registrar.with_connector(Arc::new(move |addr: String, timeout| {
                let dialer = dialer.clone();
                let connecting: Connecting = Box::pin(async move {
                    let tls = dialer.connect(&addr, timeout).await.map_err(|source| {
                        rocketgate_remoting::Error::Connect {
                            addr: addr.clone(),
                            source,
                        }
                    })?;
                    Ok(Link::over(&addr, tls, None))
                });
                connecting
            }))
        }
        None => registrar,
    };
    Ok(match internal_signer(auth) {
        Some(signer) => registrar.with_signer(signer).spawn(),
        None => registrar.spawn(),
    })
}

/// The broker's settings from the config.
pub fn broker_options(config: &Config) -> BrokerSettings {
    let b = &config.broker;
    BrokerSettings {
        broker_name: b.name.clone(),
        auto_create_topics: b.auto_create_topics,
        default_queues: b.default_queue_nums,
        transaction_check_interval: b.transaction_check_interval,
        transaction_timeout: b.transaction_timeout,
        transaction_max_checks: b.transaction_max_checks,
        max_reconsume_times: b.max_reconsume_times,
        ..BrokerSettings::default()
    }
}

fn open_broker(config: &Config, store: Arc<Store>) -> anyhow::Result<Arc<Broker>> {
    let opts = broker_options(config);
    let broker = Broker::open(store, opts, Arc::new(SystemClock)).context("opening the broker")?;
    let broker = Arc::new(broker);
    // Delivers delayed messages when due and checks back undecided transactions;
    // both stop by themselves when the broker closes. A slave does neither: it
    // writes nothing, its master does both.
    if !config.is_slave() {
        broker.spawn_delay_delivery();
        broker.spawn_transaction_checks();
    }
    Ok(broker)
}

/// The HTTP door's probe: the store's positions and the broker group's view, and
/// what the operations API asks of the other doors (`late`: filled in as they start).
///
/// A proxy (`rocketgate proxy`) uses it too, without a store or broker group, with its
/// view of the cluster as an extra readiness check.
pub(crate) struct NodeProbe<B: MessagingApi + 'static> {
    pub store: Option<http::StoreProbe>,
    pub group: Option<crate::ha::View>,
    pub late: Arc<Late<B>>,
    pub config: Config,
    /// More readiness checks (a proxy: the broker groups it reaches).
    pub extra_checks: Option<Box<dyn Fn() -> Vec<http::inspect::ReadyCheck> + Send + Sync>>,
}

/// What the HTTP door's probe learns after the HTTP door started.
pub struct Late<B: MessagingApi + 'static> {
    /// The MQTT door's sessions.
    pub mqtt: std::sync::OnceLock<rocketgate_mqtt::Streams<B>>,
    /// Whether each NameServer took the broker's last registration.
    pub registrations: std::sync::OnceLock<rocketgate_remoting::Registrations>,
    /// The WebSocket door's subscribers.
    pub ws: std::sync::OnceLock<ws::Subscribers>,
    /// Every door, once all of them listen.
    pub doors: std::sync::OnceLock<Vec<(String, SocketAddr)>>,
}

impl<B: MessagingApi + 'static> Default for Late<B> {
    fn default() -> Self {
        Late {
            mqtt: Default::default(),
            registrations: Default::default(),
            ws: Default::default(),
            doors: Default::default(),
        }
    }
}

impl<B: MessagingApi + 'static> http::Probe for NodeProbe<B> {
    fn status(&self) -> Option<http::NodeStatus> {
        self.store.as_ref().and_then(|s| s.status())
    }

    fn replication(&self) -> Option<http::ReplicationStatus> {
        self.group.as_ref().map(|g| g.status())
    }

    fn checks(&self) -> Vec<http::inspect::ReadyCheck> {
        use http::inspect::ReadyCheck;
        let mut out = Vec::new();
        if let Some(extra) = &self.extra_checks {
            out.extend(extra());
        }
        if let Some(r) = self.late.registrations.get() {
            let all = r.snapshot();
            let missing: Vec<&str> = all
                .iter()
                .filter(|(_, ok)| !ok)
                .map(|(a, _)| a.as_str())
                .collect();
            out.push(ReadyCheck {
                name: "namesrv".into(),
                // Registered with at least one: routes reach clients through it.
                ok: all.is_empty() || missing.len() < all.len(),
                detail: if missing.is_empty() {
                    format!("registered with {} NameServer(s)", all.len())
                } else {
                    format!("not (yet) registered with {}", missing.join(", "))
                },
            });
        }
        let doors = self.late.doors.get();
        out.push(ReadyCheck {
            name: "doors".into(),
            ok: doors.is_some(),
            detail: match doors {
                Some(d) => d
                    .iter()
                    .map(|(n, a)| format!("{n} {a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                None => "still starting".into(),
            },
        });
        out
    }

    fn connections(&self) -> Vec<http::inspect::ConnectionJson> {
        let mut out = Vec::new();
        if let Some(subs) = self.late.ws.get() {
            for s in subs.list() {
                let mut groups: Vec<String> = Vec::new();
                for (_, g, _) in &s.subscriptions {
                    if !groups.contains(g) {
                        groups.push(g.clone());
                    }
                }
                out.push(http::inspect::ConnectionJson {
                    door: "websocket".into(),
                    client_id: s.peer.to_string(),
                    remote: Some(s.peer.to_string()),
                    groups,
                    subscriptions: s.subscriptions.into_iter().map(|(_, _, t)| t).collect(),
                    since_ms: Some(s.since_ms),
                    last_seen_ms: None,
                    user: None,
                });
            }
        }
        let Some(mqtt) = self.late.mqtt.get() else {
            return out;
        };
        out.extend(
            mqtt.sessions()
                .into_iter()
                .filter(|s| s.connected)
                .map(|s| http::inspect::ConnectionJson {
                    door: "mqtt".into(),
                    groups: vec![rocketgate_mqtt::session_group(&s.client_id)],
                    client_id: s.client_id,
                    remote: s.peer.map(|p| p.to_string()),
                    subscriptions: s.subscriptions.into_iter().map(|(f, _)| f).collect(),
                    since_ms: s.since_ms,
                    last_seen_ms: None,
                    user: s.user.filter(|u| !u.is_empty()),
                }),
        );
        out
    }

    fn mqtt_sessions(&self) -> Option<Vec<http::inspect::MqttSessionJson>> {
        let mqtt = self.late.mqtt.get()?;
        Some(
            mqtt.sessions()
                .into_iter()
                .map(|s| http::inspect::MqttSessionJson {
                    client_id: s.client_id,
                    connected: s.connected,
                    clean_start: s.clean_start,
                    expiry_secs: (s.expiry != u32::MAX).then_some(s.expiry),
                    subscriptions: s
                        .subscriptions
                        .into_iter()
                        .map(|(filter, qos)| http::inspect::MqttSubscriptionJson { filter, qos })
                        .collect(),
                    inflight: s.inflight,
                    will_pending: s.will,
                    remote: s.peer.map(|p| p.to_string()),
                    since_ms: s.since_ms,
                    protocol_version: s.protocol_version,
                    user: s.user.filter(|u| !u.is_empty()),
                })
                .collect(),
        )
    }

    fn kick_mqtt(
        &self,
        client_id: &str,
        discard: bool,
    ) -> http::inspect::Answer<http::inspect::KickOutcome> {
        use http::inspect::{KickJson, KickOutcome};
        let mqtt = self.late.mqtt.get().cloned();
        let client_id = client_id.to_owned();
        Box::pin(async move {
            let Some(mqtt) = mqtt else {
                return KickOutcome::NoMqtt;
            };
            match mqtt.kick(&client_id, discard).await {
                None => KickOutcome::NotFound,
                Some(k) => KickOutcome::Done(KickJson {
                    client_id,
                    disconnected: k.disconnected,
                    discarded: k.discarded,
                }),
            }
        })
    }

    fn config(&self) -> Option<Vec<http::inspect::SettingJson>> {
        Some(crate::provenance::settings(&self.config))
    }
}

/// The HTTP door on `listen.http`; `namesrvs` answer its cluster view.
async fn start_http(
    config: &Config,
    broker: &Arc<Broker>,
    namesrvs: Vec<String>,
    tls: Option<Acceptor>,
    auth: &Arc<Auth>,
    group: crate::ha::View,
    late: Arc<Late<Broker>>,
) -> anyhow::Result<http::Handle> {
    let settings = http_settings(config, namesrvs, tls, auth);
    let probe = Arc::new(NodeProbe {
        store: Some(http::StoreProbe::new(
            broker.store().clone(),
            config.store.disk_hard_ratio,
        )),
        group: Some(group),
        late,
        config: config.clone(),
        extra_checks: None,
    });
    let (server, addr) = http::Server::bind(config.listen.http, broker.clone(), probe, settings)
        .await
        .with_context(|| format!("starting the HTTP gateway on {}", config.listen.http))?;
    announce("http", addr);
    Ok(server.spawn())
}

/// The HTTP door's settings from the config; `namesrvs` answer its cluster view unless
/// `http.namesrv_addrs` names others.
pub(crate) fn http_settings(
    config: &Config,
    namesrvs: Vec<String>,
    tls: Option<Acceptor>,
    auth: &Arc<Auth>,
) -> http::Settings {
    let h = &config.http;
    http::Settings {
        max_body: config.store.max_message_size.0 as usize,
        max_inflight: h.max_inflight as usize,
        max_wait: h.max_wait,
        default_invisible: h.default_invisible,
        max_messages: h.max_messages as usize,
        namesrv_addrs: if h.namesrv_addrs.is_empty() {
            namesrvs
        } else {
            h.namesrv_addrs.clone()
        },
        // A bad `namesrv.ca` stops the start where the registrar or the proxy loads
        // it; here it only leaves the cluster view without TLS.
        namesrv_tls: namesrv_dialer(config).ok().flatten(),
        broker_name: config.broker.name.clone(),
        cluster: config.broker.cluster.clone(),
        allowed_origins: h.allowed_origins.clone(),
        tls,
        auth: auth.clone(),
    }
}

/// Saves consumer offsets, then syncs and closes the store (off the async threads).
async fn close_broker(broker: Arc<Broker>) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        broker.close().context("closing the broker")?;
        broker.store().close().context("closing the store")?;
        Ok(())
    })
    .await
    .context("joining the close")?
}

/// Binds the native port before the store opens, so a port-0 address is known and
/// becomes the store host and the address the registrar advertises.
async fn bind_native(config: &mut Config) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(config.listen.native)
        .await
        .with_context(|| format!("starting the native door on {}", config.listen.native))?;
    config.listen.native = listener.local_addr().context("native listener address")?;
    Ok(listener)
}

/// Serves RocketMQ clients on the native port; routes are re-registered when a
/// request creates a topic.
fn start_native(
    config: &Config,
    listener: TcpListener,
    broker: &Arc<Broker>,
    around: (&RegistrarHandle, &crate::ha::Replication),
    tls: &Option<(Acceptor, ReloadHandle)>,
    auth: &Arc<Auth>,
) -> anyhow::Result<ServerHandle> {
    let n = &config.native;
    let (registrar, replication) = around;
    // A master suggests only its in-sync slaves: one that is far behind itself
    // would answer the moved consumer with less than the master has.
    let replicas = replication.replicas().cloned();
    let readable_slaves: rocketgate_native::server::ReadableSlaves = Arc::new(move || {
        replicas.as_ref().map_or_else(Vec::new, |r| {
            r.status()
                .into_iter()
                .filter(|s| s.in_sync)
                .map(|s| s.broker_id)
                .collect()
        })
    });
    let settings = ServerSettings {
        broker_name: config.broker.name.clone(),
        store_host: config.listen.native,
        max_frame_len: n.max_frame_len.0 as usize,
        max_suspend: n.max_suspend,
        max_inflight_sends: n.max_inflight_sends,
        auth: auth.clone(),
        slave_read: rocketgate_native::server::SlaveRead {
            broker_id: config.broker.id,
            enabled: config.ha.slave_read,
            lag_bytes: config.ha.slave_read_lag_bytes.0,
            readable_slaves,
        },
        ..ServerSettings::default()
    };
    let (server, addr) = NativeServer::from_listener(listener, broker.clone(), settings)
        .context("starting the native door")?;
    announce("native", addr);
    let mode = match (config.tls.native, tls_for(tls, true)) {
        (NativeTls::Permissive, Some(a)) => TlsMode::Permissive(a),
        (NativeTls::Enforcing, Some(a)) => TlsMode::Enforcing(a),
        _ => TlsMode::Disabled,
    };
    Ok(server
        .with_tls(mode)
        .on_topics_changed(Arc::new(registrar.trigger()))
        .spawn())
}

/// Re-registers with the NameServers as soon as the topic table changes, whichever door
/// changed it (HTTP admin, auto-create on a first MQTT/HTTP/WebSocket publish), so a
/// native client can route to a new topic at once instead of after the next periodic
/// registration (RocketMQ's broker does the same on topic creation).
fn watch_topics(broker: &Arc<Broker>, registrar: &RegistrarHandle) -> tokio::task::JoinHandle<()> {
    let mut changes = broker.watch_topics();
    let trigger = registrar.trigger();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            trigger();
        }
    })
}

/// Every door announced so far, as bound (for `/readyz`).
static ANNOUNCED: std::sync::Mutex<Vec<(String, SocketAddr)>> = std::sync::Mutex::new(Vec::new());

pub(crate) fn listening() -> Vec<(String, SocketAddr)> {
    rocketgate_core::sync::lock(&ANNOUNCED).clone()
}

/// The broker part of a node and its doors, as one unit that starts and stops: a
/// process runs it once, or — under a controller — once per role it is given
/// (a role supervisor restarts it in another role when its group's master changes).
pub struct BrokerNode {
    broker: Arc<Broker>,
    replication: crate::ha::Replication,
    registrar: RegistrarHandle,
    native: ServerHandle,
    http: http::Handle,
    mqtt: rocketgate_mqtt::Handle<Broker>,
    ws: ws::Handle,
    topic_watch: tokio::task::JoinHandle<()>,
    tls: Option<(Acceptor, ReloadHandle)>,
}

/// What a node's broker part starts with besides its config.
pub struct NodeParts {
    pub auth: Arc<Auth>,
    /// The NameServers it registers with.
    pub namesrvs: Vec<String>,
    /// What the HTTP door's cluster view asks (the same as `namesrvs` but for an
    /// embedded NameServer's own address first).
    pub http_namesrvs: Vec<String>,
    /// Under a controller: the epoch state and lease the role supervisor keeps.
    pub controlled: Option<crate::ha::Epochs>,
}

impl BrokerNode {
    /// Opens the store and broker and starts replication and every door. `config` comes
    /// back with the addresses actually bound (port 0 resolved).
    pub async fn start(config: &mut Config, parts: &NodeParts) -> anyhow::Result<BrokerNode> {
        let auth = &parts.auth;
        let native = bind_native(config).await?;
        let ha_listener = crate::ha::bind(config).await?;
        let store = open_store(config)?;
        let gate = crate::ha::attach(config, &store, parts.controlled.as_ref())?;
        let broker = open_broker(config, store)?;
        let replication =
            crate::ha::start(config, &broker, gate, ha_listener, parts.controlled.clone())?;
        if let Some(addr) = config.serves_ha().then_some(config.listen.ha) {
            announce("ha", addr);
        }
        let registrar = start_registrar(config, &broker, parts.namesrvs.clone(), auth)?;
        let late = Arc::new(Late::<Broker>::default());
        let _ = late.registrations.set(registrar.registrations());
        let tls = start_tls(config)?;
        let native = start_native(
            config,
            native,
            &broker,
            (&registrar, &replication),
            &tls,
            auth,
        )?;
        let topic_watch = watch_topics(&broker, &registrar);
        let http = start_http(
            config,
            &broker,
            parts.http_namesrvs.clone(),
            tls_for(&tls, config.tls.http),
            auth,
            replication.view(config),
            late.clone(),
        )
        .await?;
        let mqtt = start_mqtt(
            config,
            &broker,
            tls_for(&tls, config.tls.mqtt),
            auth,
            config.data_dir.join("mqtt"),
        )
        .await?;
        let _ = late.mqtt.set(mqtt.streams());
        let ws = start_ws(
            config,
            &broker,
            mqtt.streams(),
            tls_for(&tls, config.tls.ws),
            auth,
        )
        .await?;
        let _ = late.ws.set(ws.subscribers());
        let _ = late.doors.set(listening());
        // Port 0 asked: the next start of this node (a role change) binds the same ports.
        for (door, addr) in listening() {
            match door.as_str() {
                "http" => config.listen.http = addr,
                "mqtt" => config.listen.mqtt = addr,
                "mqtts" => config.listen.mqtts = addr,
                "ws" => config.listen.ws = addr,
                _ => {}
            }
        }
        Ok(BrokerNode {
            broker,
            replication,
            registrar,
            native,
            http,
            mqtt,
            ws,
            topic_watch,
            tls,
        })
    }

    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    pub fn replication(&self) -> &crate::ha::Replication {
        &self.replication
    }

    /// A master's replication gate (`None` on a slave).
    pub fn gate(&self) -> Option<&Arc<rocketgate_core::store::ha::Gate>> {
        self.replication.replicas().map(|r| r.gate())
    }

    /// The coming [`BrokerNode::stop`] is a master's demotion: the MQTT door tells
    /// its v5 clients 0x9C (Use another server, with `mqtt.server_reference`).
    pub fn redirect_mqtt_on_stop(&self) {
        self.mqtt.redirect_on_stop();
    }

    /// Stops every door, replication and the registrar, then closes the broker and store.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.native.stop().await;
        self.ws.stop().await;
        self.http.stop().await;
        self.mqtt.stop().await;
        self.topic_watch.abort();
        self.registrar.stop().await;
        drop(self.tls);
        self.replication.stop().await;
        close_broker(self.broker).await
    }
}

/// `rocketgate namesrv`: a NameServer alone.
pub async fn namesrv(config: Config, controller: bool) -> anyhow::Result<()> {
    check_exposure(&config, &[("listen.namesrv", config.listen.namesrv)])?;
    let auth = open_auth(&config, false)?;
    if auth.enabled() && auth.internal_credential().is_none() {
        tracing::warn!(
            "authentication is on but auth.internal_secret is empty: no broker can register \
             (set ROCKETGATE_AUTH__INTERNAL_SECRET on the NameServer and every broker)"
        );
    }
    let shutdown = crate::signal::shutdown_signal()?;
    let (ns, _) = start_namesrv(&config, &auth).await?;
    // The controller beside the NameServer (RocketMQ's `enableControllerInNamesrv`): the
    // binary embeds it; the namesrv crate knows nothing of it.
    let controller = match controller {
        true => Some(crate::controller::start(&config).await?),
        false => None,
    };
    println!("rocketgate namesrv ready");
    shutdown.await;
    if let Some(c) = controller {
        c.shutdown().await;
    }
    ns.stop().await;
    Ok(())
}
