//! The start and the end of a connection: reading CONNECT, taking the session
//! over (from the registry or from the connection holding it), CONNACK and
//! resuming; and at the end, DISCONNECT where due, the session handed over or
//! put offline, the will published or scheduled.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mqttbytes::v5::{
    ConnAck, ConnAckProperties, Connect, ConnectReturnCode, Disconnect, DisconnectProperties,
    DisconnectReasonCode, Packet,
};
use rocketgate_auth::{Credentials, Denied};
use rocketgate_core::broker::MessagingApi;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::oneshot;

use super::Conn;
use super::enhanced::Authenticated;
use crate::codec::{self, CodecError, Version};
use crate::end::End;
use crate::message;
use crate::session::{Access, Card, Enhanced, Session};
use crate::shared::{Slot, Takeover};
use crate::state::WillRecord;
use crate::topic;
use rocketgate_core::sync::lock;

/// The keep-alive a connection runs with: a v5 client's is set by
/// `server_keep_alive` or capped by `max_keep_alive` (and told in CONNACK,
/// MQTT-3.2.2-21); a 3.1.1 client's is its own, as it cannot be told another
/// and would be closed for idling within its own interval (MQTT-3.1.2-24).
fn granted_keep_alive(v5: bool, asked: u16, s: &crate::settings::Settings) -> u16 {
    if !v5 {
        asked
    } else if s.server_keep_alive > 0 {
        s.server_keep_alive
    } else if s.max_keep_alive > 0 && (asked == 0 || asked > s.max_keep_alive) {
        s.max_keep_alive
    } else {
        asked
    }
}

/// The credentials a CONNECT presents: a verified client certificate's name when
/// the TLS listener has one, else user name and password (a JWT may be the
/// password), else none.
fn credentials<'a>(c: &'a Connect, certificate: Option<&'a str>) -> Credentials<'a> {
    match (certificate, &c.login) {
        (Some(name), None) => Credentials::Certificate(name),
        (_, Some(l)) => Credentials::Password {
            username: &l.username,
            password: l.password.as_bytes(),
        },
        (None, None) => Credentials::None,
    }
}

/// Reads the CONNECT. `Err(Some(bytes))`: refuse with this reply; `Err(None)`: just close.
pub(super) async fn read_connect<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    max: usize,
) -> Result<(Version, Connect), Option<Bytes>> {
    loop {
        match codec::peek_connect_level(buf) {
            Ok(Some(level)) => {
                let version = match level {
                    4 => Version::V4,
                    5 => Version::V5,
                    3 => {
                        let mut out = BytesMut::new();
                        let ack =
                            ConnAck::new(ConnectReturnCode::UnsupportedProtocolVersion, false);
                        let _ = codec::write(Version::V4, &Packet::ConnAck(ack), &mut out);
                        return Err(Some(out.freeze()));
                    }
                    _ => {
                        let mut out = BytesMut::new();
                        let ack =
                            ConnAck::new(ConnectReturnCode::UnsupportedProtocolVersion, false);
                        let _ = codec::write(Version::V5, &Packet::ConnAck(ack), &mut out);
                        return Err(Some(out.freeze()));
                    }
                };
                match codec::read(version, buf, max) {
                    Ok(Some(Packet::Connect(c))) => return Ok((version, c)),
                    Ok(None) => {}
                    Ok(Some(_)) => return Err(None),
                    Err(e) => {
                        tracing::debug!(error = %e, "bad CONNECT");
                        let code = match (&e, version) {
                            (_, Version::V4) => return Err(None),
                            (CodecError::TooLarge { .. }, _) => ConnectReturnCode::PacketTooLarge,
                            (CodecError::Malformed(_), _) => ConnectReturnCode::MalformedPacket,
                            (CodecError::Protocol(_), _) => ConnectReturnCode::ProtocolError,
                        };
                        let mut out = BytesMut::new();
                        let _ = codec::write(
                            version,
                            &Packet::ConnAck(ConnAck::new(code, false)),
                            &mut out,
                        );
                        return Err(Some(out.freeze()));
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "connection refused before CONNECT");
                return Err(None);
            }
        }
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(_) => {
                if buf.len() > max + 8 {
                    return Err(None);
                }
            }
        }
    }
}

impl<B: MessagingApi + 'static> Conn<B> {
    /// Handles CONNECT: session take-over or resumption, CONNACK. The keep-alive
    /// deadline span, or `None` when the connection is refused.
    ///
    /// `tls_identity`: the verified client certificate's name (mTLS), `None` for a
    /// connection without one; logged, and offered to the authentication layer as
    /// `Credentials::Certificate` (it counts when `auth.certificate_identity` is on).
    pub(super) async fn accept(
        &mut self,
        c: Box<Connect>,
        takeover: oneshot::Sender<Takeover>,
        tls_identity: Option<String>,
        enhanced: Option<Box<Authenticated>>,
    ) -> Option<Option<Duration>> {
        if let Some(id) = &tls_identity {
            tracing::info!(peer = %self.peer, client = %c.client_id, tls_identity = %id, "MQTT CONNECT with a client certificate");
        }
        let s = self.shared.settings.clone();
        let v5 = self.out.v5();
        let props = c.properties.as_ref();
        let refuse = |this: &mut Self, code: ConnectReturnCode, why: &str| {
            tracing::debug!(peer = %this.peer, why, "CONNECT refused");
            let mut ack = ConnAck::new(code, false);
            if v5 {
                let mut p = ConnAckProperties::new();
                p.reason_string = Some(why.to_owned());
                ack.properties = Some(p);
            }
            this.out.send(&Packet::ConnAck(ack));
            None
        };
        let mut client_id = c.client_id.clone();
        let mut assigned = None;
        if client_id.is_empty() {
            if !v5 && !c.clean_session {
                return refuse(
                    self,
                    ConnectReturnCode::ClientIdentifierNotValid,
                    "an empty client id needs a clean session",
                );
            }
            client_id = format!("rg-{:016x}", rand::random::<u64>());
            assigned = v5.then(|| client_id.clone());
        }
        if let Some(p) = props {
            // First, so even the refusals below respect it.
            if let Some(max) = p.max_packet_size.filter(|m| *m > 0) {
                self.out.set_client_max_packet(max);
            }
            if p.receive_maximum == Some(0) {
                return refuse(self, ConnectReturnCode::ProtocolError, "receive maximum 0");
            }
            if p.max_packet_size == Some(0) {
                return refuse(
                    self,
                    ConnectReturnCode::ProtocolError,
                    "maximum packet size 0",
                );
            }
            self.window.limit(p, s.max_inflight);
            self.out.set_problem_info(p.request_problem_info != Some(0));
        }
        // Who is connecting, and what it may do.
        let auth = s.auth.clone();
        // mTLS: the TLS listener's verified client-certificate name for this
        // connection (`auth.certificate_identity` decides whether it counts).
        let certificate: Option<&str> = tls_identity.as_deref();
        // Enhanced authentication has already logged the client in (`enhanced.rs`).
        let (pre, enhanced) = match enhanced.map(|a| *a) {
            Some(a) => (Some(a.login), Some((a.method, a.server_final))),
            None => (None, None),
        };
        let login = match pre {
            Some(l) => Ok(l),
            None => {
                auth.login(credentials(&c, certificate), self.peer.ip(), "mqtt")
                    .await
            }
        };
        let login = match login {
            Ok(l) => l,
            Err(Denied::Missing) => {
                return refuse(
                    self,
                    ConnectReturnCode::NotAuthorized,
                    "credentials required",
                );
            }
            Err(e) => {
                return refuse(self, ConnectReturnCode::BadUserNamePassword, &e.to_string());
            }
        };
        let Some(slot) = self.shared.conn_limit.admit(self.peer.ip()) else {
            return refuse(
                self,
                ConnectReturnCode::QuotaExceeded,
                "too many connections from this address",
            );
        };
        let grant = auth.grant(&login.identity, &client_id);
        if let Some(w) = &c.last_will
            && !grant.may_publish(&w.topic)
        {
            metrics::counter!("rocketgate_acl_denied_total", "door" => "mqtt", "action" => "will")
                .increment(1);
            return refuse(
                self,
                ConnectReturnCode::NotAuthorized,
                "not authorized to publish to the will topic",
            );
        }
        let access = Box::new(Access {
            user: login.identity.user,
            grant,
            expires_at: login.expires_at,
            _slot: slot,
            sys_seen: self.shared.sys.generation(),
            enhanced: enhanced.as_ref().map(|(method, _)| {
                Box::new(Enhanced {
                    method: method.clone(),
                    pending: None,
                })
            }),
        });
        let will = match &c.last_will {
            Some(w) => {
                if let Err(e) = topic::check_name(&w.topic) {
                    let code = if v5 {
                        ConnectReturnCode::TopicNameInvalid
                    } else {
                        ConnectReturnCode::ServerUnavailable
                    };
                    return refuse(self, code, &format!("will topic: {e}"));
                }
                Some(WillRecord::from_last_will(w))
            }
            None => None,
        };
        let asked_expiry = if v5 {
            props.and_then(|p| p.session_expiry_interval).unwrap_or(0)
        } else if c.clean_session {
            0
        } else {
            u32::MAX
        };
        let expiry = asked_expiry.min(s.max_session_expiry);
        let keep_alive = granted_keep_alive(v5, c.keep_alive, &s);
        let server_keep_alive = (keep_alive != c.keep_alive).then_some(keep_alive);

        // Claim the client id in the state log (every door agrees on the order);
        // a connection on another door is closed and releases the session first.
        let prior = self
            .shared
            .claim(&client_id, self.following.id(), c.clean_session)
            .await;
        // A session that outlives the connection needs its claim, subscriptions and
        // place in the log recorded; a door that cannot write the state log (a slave's,
        // or one whose broker is away) would hand out a fresh session whose positions
        // then overwrite the real ones. Refused; the client retries (and finds the
        // master's door after a failover). A clean, non-persistent session is served.
        if prior.unrecorded && (expiry > 0 || !c.clean_session) {
            if v5 && let Some(to) = &s.server_reference {
                // Where it can: the master's door (MQTT 5 section 4.11).
                let mut ack = ConnAck::new(ConnectReturnCode::UseAnotherServer, false);
                let mut p = ConnAckProperties::new();
                p.reason_string = Some(
                    "this door cannot record sessions (a read-only slave): use the server \
                     reference, or a clean session that does not persist"
                        .into(),
                );
                p.server_reference = Some(to.clone());
                ack.properties = Some(p);
                tracing::debug!(peer = %self.peer, client = %client_id, "CONNECT sent to another server");
                self.out.send(&Packet::ConnAck(ack));
                return None;
            }
            return refuse(
                self,
                ConnectReturnCode::ServerUnavailable,
                "this door cannot record sessions now (a read-only slave, or the broker is \
                 unreachable): connect to the master, or with a clean session that does not \
                 persist",
            );
        }
        // Take the session: from the registry, or from the connection holding it.
        let card = Arc::new(Card {
            peer: self.peer,
            since_ms: message::now_ms(),
            protocol_version: if v5 { 5 } else { 4 },
            clean_start: c.clean_session,
            user: access.user.clone(),
            live: Default::default(),
        });
        let previous = lock(&self.shared.sessions).insert(
            client_id.clone(),
            Slot::Online {
                conn_id: self.following.id(),
                takeover,
                card: card.clone(),
            },
        );
        let mut old = match previous {
            Some(Slot::Offline { session, .. }) => Some(session),
            Some(Slot::Online { takeover, .. }) => {
                let (tx, rx) = oneshot::channel();
                if takeover.send(Takeover::new(tx)).is_ok() {
                    let handed = tokio::time::timeout(Duration::from_secs(5), rx).await;
                    if handed.is_err() {
                        tracing::warn!(
                            client_id = %client_id,
                            "the connection holding this client id did not hand its session \
                             over within 5 s: going on without it"
                        );
                    }
                    handed.ok().and_then(Result::ok)
                } else {
                    None
                }
            }
            None => match prior.record {
                // Kept by another door (or by this one before a restart): the
                // log's record. Its will, when its connection died with its door,
                // is due now unless it waits for a delay this connection cut
                // short; else the door owning the session drops it (or, on a
                // clean start, publishes it).
                Some(record) => {
                    let mut s = Box::new(Session::from_record(&record));
                    if let Some(w) = s.will.take()
                        && prior.holder_died
                        && (c.clean_session || w.delay == 0)
                    {
                        self.shared.fire_will(&client_id, w.to_publish()).await;
                    }
                    Some(s)
                }
                None => None,
            },
        };
        if c.clean_session
            && let Some(mut o) = old.take()
        {
            // A clean start ends the old session; its pending will goes out now.
            if let Some(w) = o.will.take() {
                self.shared.fire_will(&o.client_id, w.to_publish()).await;
            }
        }
        let session_present = old.is_some();
        let mut session = old.unwrap_or_else(|| Box::new(Session::new(&client_id, expiry)));
        session.expiry = expiry;
        session.will = will.map(Box::new);
        // A resumed session keeps only the subscriptions this login may hold.
        session.subs.retain(|sub| {
            access
                .grant
                .may_subscribe(&sub.filter.filter, sub.filter.share.as_deref())
        });
        session.access = Some(access);
        session.card = Some(card);
        self.session = session;
        self.shared
            .save_if_kept(&self.session, self.following.id())
            .await;

        let mut ack = ConnAck::new(ConnectReturnCode::Success, session_present);
        if v5 {
            let mut p = ConnAckProperties::new();
            if expiry != asked_expiry {
                p.session_expiry_interval = Some(expiry);
            }
            p.receive_max = Some(s.receive_maximum);
            p.max_packet_size = Some(s.max_packet_size);
            p.assigned_client_identifier = assigned;
            p.topic_alias_max = Some(s.topic_alias_maximum);
            p.server_keep_alive = server_keep_alive;
            p.retain_available = Some(1);
            p.wildcard_subscription_available = Some(1);
            p.subscription_identifiers_available = Some(1);
            p.shared_subscription_available = Some(1);
            if let Some((method, server_final)) = enhanced {
                // MQTT-4.12.0-5: the method again, and SCRAM's server-final message.
                p.authentication_method = Some(method);
                p.authentication_data = Some(server_final.into());
            }
            ack.properties = Some(p);
        }
        self.out.send(&Packet::ConnAck(ack));
        let version = self.out.version();
        let user = self.session.access.as_ref().map_or("", |a| a.user.as_str());
        tracing::debug!(client = %client_id, user, peer = %self.peer, ?version, session_present, "connected");
        // Boxed: its futures (catch-up reads of the log) would otherwise make every
        // connection's task that much larger for all its life.
        Box::pin(self.resume()).await;
        Some((keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500)))
    }

    /// Ends the connection: DISCONNECT where due, offsets committed, session
    /// handed over or put offline, will published or scheduled.
    pub(super) async fn finish(
        &mut self,
        end: End,
        tk_rx: &mut Option<oneshot::Receiver<Takeover>>,
    ) {
        let client_id = self.session.client_id.clone();
        // The login ends with the connection (and frees its place in the limit).
        self.session.access = None;
        self.session.card = None;
        let disconnect = match &end {
            End::Server(code, why) => Some((*code, why.clone())),
            End::Takeover(t) if t.admin => Some((
                DisconnectReasonCode::AdministrativeAction,
                "disconnected by an administrator".to_string(),
            )),
            End::Takeover(_) => Some((
                DisconnectReasonCode::SessionTakenOver,
                "another connection took the session over".to_string(),
            )),
            End::Shutdown
                if self
                    .shared
                    .redirect_on_stop
                    .load(std::sync::atomic::Ordering::Acquire) =>
            {
                Some((
                    DisconnectReasonCode::UseAnotherServer,
                    "this broker is no longer its group's master".to_string(),
                ))
            }
            End::Shutdown => Some((
                DisconnectReasonCode::ServerShuttingDown,
                "the server is shutting down".to_string(),
            )),
            _ => None,
        };
        if let Some((code, why)) = disconnect {
            if self.out.v5() {
                tracing::debug!(client = %client_id, ?code, why, "server closes the connection");
            } else {
                // A 3.1.1 client is not told why: the log is the only place it shows.
                tracing::info!(client = %client_id, ?code, why, "server closes a 3.1.1 connection");
            }
            if self.out.v5() {
                let mut d = Disconnect::new();
                d.reason_code = code;
                // 0x9C / 0x9D: where to go instead (MQTT 5 section 4.11).
                let s = &self.shared.settings;
                let server_reference = match code {
                    DisconnectReasonCode::UseAnotherServer => s.server_reference.clone(),
                    DisconnectReasonCode::ServerMoved => s.moved_to.clone(),
                    _ => None,
                };
                let reason_string = self.out.reason(why);
                if reason_string.is_some() || server_reference.is_some() {
                    d.properties = Some(DisconnectProperties {
                        session_expiry_interval: None,
                        reason_string,
                        user_properties: Vec::new(),
                        server_reference,
                    });
                }
                self.out.send(&Packet::Disconnect(d));
            }
        }
        self.detach().await;
        let publish_will = !matches!(end, End::Client { will: false } | End::Shutdown);
        let session = std::mem::replace(&mut self.session, Box::new(Session::new("", 0)));
        match end {
            End::Takeover(t) => self.hand_over(session, t).await,
            End::Shutdown => {
                self.shared
                    .save_session(&session, self.following.id(), true)
                    .await;
                lock(&self.shared.sessions).remove(&client_id);
            }
            _ => {
                let Err(session) = self
                    .shared
                    .session_offline(session, publish_will, self.following.id())
                    .await
                else {
                    return;
                };
                if let Some(rx) = tk_rx.take()
                    && let Ok(Ok(t)) = tokio::time::timeout(Duration::from_secs(5), rx).await
                {
                    // Taken over while ending: the new connection waits for the session.
                    self.hand_over(session, t).await;
                }
            }
        }
    }

    async fn hand_over(&mut self, mut session: Box<Session>, t: Takeover) {
        if let Some(w) = session.will.take()
            && w.delay == 0
        {
            self.shared
                .fire_will(&session.client_id, w.to_publish())
                .await;
        }
        let _ = t.send(session);
    }
}
