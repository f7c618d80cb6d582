//! Enhanced authentication (MQTT 5 section 4.12; docs/mqtt.md "Enhanced
//! authentication"): the AUTH exchange between CONNECT and CONNACK, and
//! re-authentication on an established connection. The one method offered is
//! SCRAM-SHA-256 (`rocketgate_auth::scram`): the client-first message is CONNECT's
//! Authentication Data, the server-first goes out in AUTH 0x18, the client-final
//! comes back in AUTH 0x18, and the server-final is CONNACK's Authentication Data
//! (after a re-authentication, AUTH 0x00's). One round trip, so the exchange is
//! bounded by construction; waiting for the client's step is bounded by
//! `mqtt.connect_timeout`.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use mqttbytes::v5::{
    ConnAck, ConnAckProperties, Connect, ConnectReturnCode, DisconnectReasonCode, Packet,
};
use rocketgate_auth::{Denied, Login, scram};
use rocketgate_core::broker::MessagingApi;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::Conn;
use crate::codec::{
    self, AuthPacket, CONTINUE, CodecError, Frame, REAUTHENTICATE, SUCCESS, Version,
};
use crate::end::End;
use crate::output::Output;
use crate::settings::Settings;

/// A CONNECT authenticated by an exchange: who, with which method, and the data
/// CONNACK carries (SCRAM's server-final message).
pub(super) struct Authenticated {
    pub login: Login,
    pub method: String,
    pub server_final: Vec<u8>,
}

/// What comes between CONNECT and taking the session: a moved service's refusal
/// (`mqtt.moved_to`, nothing else is checked), then the exchange a v5 CONNECT with
/// an Authentication Method starts. `Err`: the connection is over (the reply, if
/// any, written).
pub(super) async fn before_accept<R, W>(
    s: &Settings,
    rd: &mut R,
    wr: &mut W,
    inbuf: &mut BytesMut,
    c: Box<Connect>,
    version: Version,
    peer: SocketAddr,
) -> Result<(Box<Connect>, Option<Box<Authenticated>>), ()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let reply = if let Some(to) = &s.moved_to {
        moved(version, &c, to, peer)
    } else if c
        .properties
        .as_ref()
        .is_some_and(|p| p.authentication_method.is_some())
    {
        match at_connect(s, rd, wr, inbuf, &c, peer).await {
            Ok(a) => return Ok((c, Some(Box::new(a)))),
            Err(reply) => reply,
        }
    } else {
        return Ok((c, None));
    };
    let _ = wr.write_all(&reply).await;
    let _ = wr.shutdown().await;
    Err(())
}

/// What a refused login is told: a wrong proof is a bad password (0x86), a broken
/// exchange is not authorized (0x87).
fn connack_code(e: &Denied) -> ConnectReturnCode {
    match e {
        Denied::BadCredentials => ConnectReturnCode::BadUserNamePassword,
        _ => ConnectReturnCode::NotAuthorized,
    }
}

/// Runs the exchange a v5 CONNECT with an Authentication Method starts, up to the
/// point where CONNACK is due. `Err`: the bytes to write before closing (a CONNACK
/// refusal; empty when the client went away).
async fn at_connect<R, W>(
    s: &Settings,
    rd: &mut R,
    wr: &mut W,
    inbuf: &mut BytesMut,
    c: &Connect,
    peer: SocketAddr,
) -> Result<Authenticated, Bytes>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let props = c.properties.as_ref();
    let method = props
        .and_then(|p| p.authentication_method.clone())
        .unwrap_or_default();
    let mut out = Output::new(Version::V5);
    if let Some(max) = props.and_then(|p| p.max_packet_size).filter(|m| *m > 0) {
        out.set_client_max_packet(max);
    }
    let refuse = |out: &mut Output, code: ConnectReturnCode, why: String| -> Bytes {
        tracing::debug!(%peer, client = %c.client_id, why, "CONNECT refused (enhanced authentication)");
        let mut ack = ConnAck::new(code, false);
        let mut p = ConnAckProperties::new();
        p.reason_string = Some(why);
        ack.properties = Some(p);
        out.send(&Packet::ConnAck(ack));
        out.take().freeze()
    };
    if method != scram::METHOD {
        // MQTT-4.12.0-1: a method the server does not offer.
        return Err(refuse(
            &mut out,
            ConnectReturnCode::BadAuthenticationMethod,
            format!(
                "authentication method {method:?} is not offered; this broker offers {}",
                scram::METHOD
            ),
        ));
    }
    let auth = &s.auth;
    if !auth.enabled() {
        return Err(refuse(
            &mut out,
            ConnectReturnCode::BadAuthenticationMethod,
            "enhanced authentication needs authentication on (auth.enabled = true)".into(),
        ));
    }
    let Some(first) = props.and_then(|p| p.authentication_data.clone()) else {
        return Err(refuse(
            &mut out,
            ConnectReturnCode::NotAuthorized,
            "SCRAM-SHA-256 needs the client-first message as CONNECT's Authentication Data".into(),
        ));
    };
    let (exchange, server_first) = match auth.scram_start(&first, peer.ip(), "mqtt").await {
        Ok(x) => x,
        Err(e) => return Err(refuse(&mut out, connack_code(&e), e.to_string())),
    };
    if let Some(l) = &c.login
        && !l.username.is_empty()
        && l.username != exchange.user()
    {
        return Err(refuse(
            &mut out,
            ConnectReturnCode::BadUserNamePassword,
            "CONNECT's user name is not the SCRAM user name".into(),
        ));
    }
    // MQTT-4.12.0-2, 4.12.0-5: AUTH 0x18 with the same method.
    out.send_auth(&AuthPacket::new(CONTINUE, &method, server_first));
    if wr.write_all(&out.take()).await.is_err() || wr.flush().await.is_err() {
        return Err(Bytes::new());
    }
    let max = s.max_packet_size as usize;
    let next = tokio::time::timeout(s.connect_timeout, next_frame(rd, inbuf, max)).await;
    let reply = match next {
        Err(_) => {
            return Err(refuse(
                &mut out,
                ConnectReturnCode::NotAuthorized,
                format!(
                    "the authentication exchange did not finish within {:?}",
                    s.connect_timeout
                ),
            ));
        }
        Ok(Err(None)) => return Err(Bytes::new()),
        Ok(Err(Some(e))) => {
            let code = match e {
                CodecError::TooLarge { .. } => ConnectReturnCode::PacketTooLarge,
                CodecError::Malformed(_) => ConnectReturnCode::MalformedPacket,
                CodecError::Protocol(_) => ConnectReturnCode::ProtocolError,
            };
            return Err(refuse(&mut out, code, e.to_string()));
        }
        Ok(Ok(Frame::Auth(a))) => *a,
        Ok(Ok(Frame::Packet(Packet::Disconnect(_)))) => return Err(Bytes::new()),
        Ok(Ok(Frame::Packet(p))) => {
            return Err(refuse(
                &mut out,
                ConnectReturnCode::ProtocolError,
                format!(
                    "only AUTH or DISCONNECT may follow a CONNECT with an Authentication \
                     Method before CONNACK (MQTT-3.1.2-30); got {}",
                    packet_name(&p)
                ),
            ));
        }
    };
    if reply.reason != CONTINUE {
        return Err(refuse(
            &mut out,
            ConnectReturnCode::ProtocolError,
            format!(
                "AUTH reason {:#04x} where 0x18 (continue authentication) was due",
                reply.reason
            ),
        ));
    }
    if reply.method.as_deref() != Some(method.as_str()) {
        return Err(refuse(
            &mut out,
            ConnectReturnCode::ProtocolError,
            "AUTH with another Authentication Method than CONNECT's (MQTT-4.12.0-5)".into(),
        ));
    }
    let data = reply.data.unwrap_or_default();
    match auth.scram_finish(&exchange, &data, peer.ip(), "mqtt") {
        Ok((login, server_final)) => Ok(Authenticated {
            login,
            method,
            server_final,
        }),
        Err(e) => Err(refuse(&mut out, connack_code(&e), e.to_string())),
    }
}

fn packet_name(p: &Packet) -> &'static str {
    match p {
        Packet::Connect(_) => "CONNECT",
        Packet::Publish(_) => "PUBLISH",
        Packet::Subscribe(_) => "SUBSCRIBE",
        Packet::Unsubscribe(_) => "UNSUBSCRIBE",
        Packet::PingReq => "PINGREQ",
        _ => "another packet",
    }
}

/// The next frame off the socket; `Err(None)`: the client closed.
async fn next_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    inbuf: &mut BytesMut,
    max: usize,
) -> Result<Frame, Option<CodecError>> {
    loop {
        match codec::read_frame(Version::V5, inbuf, max) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(Some(e)),
        }
        match rd.read_buf(inbuf).await {
            Ok(0) | Err(_) => return Err(None),
            Ok(_) => {}
        }
    }
}

impl<B: MessagingApi + 'static> Conn<B> {
    /// An AUTH on an established connection: a re-authentication (MQTT 5 section
    /// 4.12.1) starting (0x19) or going on (0x18). A failed one ends the connection
    /// with DISCONNECT 0x87 (MQTT-4.12.1-2); AUTH where none may come, or with
    /// another method, is a protocol error.
    pub(super) async fn on_auth(&mut self, a: AuthPacket) -> Option<End> {
        let auth = self.shared.settings.auth.clone();
        let timeout = self.shared.settings.connect_timeout;
        let peer = self.peer.ip();
        let client_id = self.session.client_id.clone();
        let Some(access) = self.session.access.as_mut() else {
            return Some(End::protocol("AUTH before CONNACK"));
        };
        let Some(enhanced) = access.enhanced.as_mut() else {
            return Some(End::protocol(
                "AUTH on a connection that did not use enhanced authentication (MQTT-4.12.0-7)",
            ));
        };
        if a.method.as_deref() != Some(enhanced.method.as_str()) {
            return Some(End::protocol(
                "AUTH with another Authentication Method than CONNECT's (MQTT-4.12.1-1)",
            ));
        }
        let failed = |why: String| {
            Some(End::Server(
                DisconnectReasonCode::NotAuthorized,
                format!("re-authentication failed: {why}"),
            ))
        };
        let data = a.data.unwrap_or_default();
        match (a.reason, enhanced.pending.take()) {
            (REAUTHENTICATE, None) => match auth.scram_start(&data, peer, "mqtt").await {
                Ok((exchange, server_first)) => {
                    if exchange.user() != access.user {
                        return failed("a connection re-authenticates as its own user".into());
                    }
                    enhanced.pending = Some((exchange, Instant::now() + timeout));
                    let reply = AuthPacket::new(CONTINUE, &enhanced.method, server_first);
                    self.out.send_auth(&reply);
                    None
                }
                Err(e) => failed(e.to_string()),
            },
            (CONTINUE, Some((exchange, _))) => {
                match auth.scram_finish(&exchange, &data, peer, "mqtt") {
                    Ok((login, server_final)) => {
                        // The user's rules as they are now apply from here on.
                        access.grant = auth.grant(&login.identity, &client_id);
                        let reply = AuthPacket::new(SUCCESS, &enhanced.method, server_final);
                        self.out.send_auth(&reply);
                        tracing::debug!(client = %client_id, user = %login.identity.user, "re-authenticated");
                        None
                    }
                    Err(e) => failed(e.to_string()),
                }
            }
            (REAUTHENTICATE, Some(_)) => Some(End::protocol(
                "AUTH 0x19 while a re-authentication is in progress",
            )),
            (CONTINUE, None) => Some(End::protocol(
                "AUTH 0x18 without an authentication exchange in progress",
            )),
            (r, _) => Some(End::protocol(format!(
                "AUTH reason {r:#04x} from a client (0x18 or 0x19 expected)"
            ))),
        }
    }

    /// A re-authentication the client did not finish in time ends the connection.
    pub(super) fn reauth_overdue(&self) -> bool {
        self.session
            .access
            .as_ref()
            .and_then(|a| a.enhanced.as_ref())
            .and_then(|e| e.pending.as_ref())
            .is_some_and(|(_, deadline)| Instant::now() >= *deadline)
    }
}

/// The answer of a door whose service moved (`mqtt.moved_to`): v5 CONNACK 0x9D
/// (Server moved) with the new address as Server Reference (MQTT 5 section 4.11);
/// 3.1.1, which has no such code, CONNACK 3 (server unavailable), logged.
pub(super) fn moved(version: Version, c: &Connect, to: &str, peer: std::net::SocketAddr) -> Bytes {
    let mut out = BytesMut::new();
    let ack = if version == Version::V5 {
        tracing::debug!(%peer, client = %c.client_id, to, "CONNECT refused: the service moved");
        let mut ack = ConnAck::new(ConnectReturnCode::ServerMoved, false);
        let mut p = ConnAckProperties::new();
        p.server_reference = Some(to.to_owned());
        p.reason_string = Some(format!("this MQTT service moved to {to}"));
        ack.properties = Some(p);
        ack
    } else {
        tracing::info!(%peer, client = %c.client_id, to, "3.1.1 CONNECT refused: the service moved (mqtt.moved_to)");
        ConnAck::new(ConnectReturnCode::ServerUnavailable, false)
    };
    let _ = codec::write(version, &Packet::ConnAck(ack), &mut out);
    out.freeze()
}
