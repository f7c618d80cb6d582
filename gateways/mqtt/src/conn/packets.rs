//! What a connection does with the packets it reads, routed to its parts:
//! PUBLISHes to the inbound part, acknowledgements to the window, SUBSCRIBE
//! and UNSUBSCRIBE to what it follows, its shared memberships and the session;
//! also resuming a session and following new topics.

use std::sync::Arc;

use bytes::BytesMut;
use mqttbytes::QoS;
use mqttbytes::v5::{
    DisconnectReasonCode, Packet, PubComp, PubCompReason, Publish, RetainForwardRule, SubAck,
    SubAckProperties, Subscribe, SubscribeReasonCode, UnsubAck, UnsubAckReason, Unsubscribe,
};
use rocketgate_core::broker::MessagingApi;

use super::Conn;
use crate::codec::{self, CodecError, Frame};
use crate::end::End;
use crate::follow::Start;
use crate::inbound::{self, Inbound};
use crate::message::{self, empty_props};
use crate::meters::Stored;
use crate::outgoing::{Outgoing, min_qos};
use crate::ready::Ready;
use crate::session::{Source, Sub};
use crate::topic::TopicFilter;
use rocketgate_core::sync::lock;

impl<B: MessagingApi + 'static> Conn<B> {
    /// Reads every whole packet in `buf`; `Some(end)` ends the connection.
    pub(super) async fn on_bytes(&mut self, buf: &mut BytesMut) -> Option<End> {
        let max = self.shared.settings.max_packet_size as usize;
        loop {
            self.take_acks(buf);
            let packet = match codec::read_frame(self.out.version(), buf, max) {
                Ok(Some(Frame::Packet(p))) => p,
                Ok(Some(Frame::Auth(a))) => {
                    let end = match self.flush_publishes().await {
                        Some(end) => Some(end),
                        None => Box::pin(self.on_auth(*a)).await,
                    };
                    if end.is_some() {
                        return end;
                    }
                    continue;
                }
                Ok(None) => break,
                Err(e) => {
                    self.flush_publishes().await;
                    let code = match e {
                        CodecError::TooLarge { .. } => DisconnectReasonCode::PacketTooLarge,
                        CodecError::Malformed(_) => DisconnectReasonCode::MalformedPacket,
                        CodecError::Protocol(_) => DisconnectReasonCode::ProtocolError,
                    };
                    return Some(End::Server(code, e.to_string()));
                }
            };
            let end = match packet {
                Packet::Publish(p) => self.on_publish(p).await,
                other => match self.flush_publishes().await {
                    Some(end) => Some(end),
                    None => self.on_packet(other).await,
                },
            };
            if end.is_some() {
                self.flush_publishes().await;
                return end;
            }
        }
        self.flush_publishes().await
    }

    /// The acknowledgements at the front of `buf` in their short form, each
    /// straight to the window (see [`codec::take_short_ack`]): synchronous, so
    /// a read of nothing but acknowledgements (a fan-out subscriber's) needs no
    /// `on_bytes` future. Stops at the first other packet, so packets are still
    /// handled in the order they came; and takes none while PUBLISHes read
    /// before them wait to be stored (`on_bytes` stores those first).
    pub(super) fn take_acks(&mut self, buf: &mut BytesMut) {
        if !self.inbound.is_idle() {
            return;
        }
        let max = self.shared.settings.max_packet_size as usize;
        while let Some((pkid, comp)) = codec::take_short_ack(buf, max) {
            self.window
                .on_ack(&mut self.session, &mut self.members, pkid, comp);
        }
    }

    async fn on_packet(&mut self, packet: Packet) -> Option<End> {
        match packet {
            Packet::PubRel(r) => {
                let mut c = PubComp::new(r.pkid);
                if !self.session.qos2_in.remove(r.pkid) {
                    c.reason = PubCompReason::PacketIdentifierNotFound;
                }
                self.out.send(&Packet::PubComp(c));
            }
            Packet::PubAck(a) => {
                self.window
                    .on_ack(&mut self.session, &mut self.members, a.pkid, false)
            }
            Packet::PubRec(r) => {
                self.window
                    .on_rec(&mut self.session, &mut self.members, &mut self.out, r)
            }
            Packet::PubComp(c) => {
                self.window
                    .on_ack(&mut self.session, &mut self.members, c.pkid, true)
            }
            Packet::Subscribe(s) => return self.on_subscribe(s).await,
            Packet::Unsubscribe(u) if u.filters.is_empty() => {
                return Some(End::protocol("UNSUBSCRIBE without a topic filter"));
            }
            Packet::Unsubscribe(u) => self.on_unsubscribe(u).await,
            Packet::PingReq => self.out.send(&Packet::PingResp),
            Packet::Disconnect(d) => {
                if let Some(e) = d
                    .properties
                    .as_ref()
                    .and_then(|p| p.session_expiry_interval)
                {
                    if self.session.expiry == 0 && e != 0 {
                        return Some(End::protocol(
                            "session expiry set on DISCONNECT after connecting with 0",
                        ));
                    }
                    self.session.expiry = e.min(self.shared.settings.max_session_expiry);
                }
                return Some(End::Client {
                    will: d.reason_code == DisconnectReasonCode::DisconnectWithWillMessage,
                });
            }
            Packet::Connect(_) => return Some(End::protocol("a second CONNECT")),
            other => return Some(End::protocol(format!("a client does not send {other:?}"))),
        }
        None
    }

    /// The inbound part and what it needs of the rest of the connection.
    fn publisher(&mut self) -> (&mut Inbound, inbound::Ctx<'_, B>) {
        let cx = inbound::Ctx {
            shared: &self.shared,
            session: &mut self.session,
            out: &mut self.out,
            peer: self.peer,
            client_slow: self.following.client_slow(),
        };
        (&mut self.inbound, cx)
    }

    async fn on_publish(&mut self, p: Publish) -> Option<End> {
        let (inbound, mut cx) = self.publisher();
        inbound.on_publish(&mut cx, p).await
    }

    /// Stores what was read of PUBLISHes and acknowledges them (see `inbound.rs`).
    async fn flush_publishes(&mut self) -> Option<End> {
        let (inbound, mut cx) = self.publisher();
        inbound.flush(&mut cx).await
    }

    /// After CONNECT: follow the session's topics again, restart shared
    /// subscriptions, resend what is in flight.
    pub(super) async fn resume(&mut self) {
        if self.session.expiry != 0 {
            // Offsets reset while the session was offline win over its own cursors.
            self.following
                .adopt_resets(&self.shared, &mut self.session, &mut self.ready)
                .await;
        }
        // A session without subscriptions (every clean start) follows nothing: the
        // topic list (a copy of the whole table, a round trip over `RemoteBroker`)
        // would be fetched for nothing on every CONNECT of a reconnect storm.
        let topics = if self.session.subs.is_empty() {
            Vec::new()
        } else {
            self.shared.topics().await
        };
        self.sync_following(&topics, Start::Resume).await;
        self.session.restore_cursors = false;
        self.window
            .resend(&self.shared, &mut self.session, &mut self.out)
            .await;
    }

    /// Follows every topic the plain subscriptions cover and joins the shared
    /// groups of every topic the shared ones cover, starting not-yet-followed
    /// topics per `start`.
    async fn sync_following(&mut self, topics: &[String], start: Start) {
        self.following
            .follow_all(&self.shared, &mut self.session, topics, start, |_| true)
            .await;
        let mut shares: Vec<(Arc<str>, String)> = Vec::new();
        for sub in self
            .session
            .subs
            .iter()
            .filter(|s| s.filter.share.is_some())
        {
            let raw: Arc<str> = Arc::from(sub.filter.raw.as_str());
            match sub.filter.core_topic() {
                Some(t) => shares.push((raw, t.to_owned())),
                None => shares.extend(topics.iter().map(|t| (raw.clone(), t.clone()))),
            }
        }
        for (raw, topic) in shares {
            self.members
                .join(
                    &self.shared,
                    &self.session,
                    self.window.size(),
                    self.following.client_slow(),
                    raw,
                    topic,
                )
                .await;
        }
    }

    /// The topic list changed: follow new topics wildcard subscriptions cover.
    pub(super) async fn on_topics(&mut self, list: &[String]) {
        if self
            .session
            .subs
            .iter()
            .any(|s| s.filter.core_topic().is_none())
        {
            self.sync_following(list, Start::Resume).await;
        }
    }

    /// Told by the router that batches were missed (see [`crate::follow::Following::recheck`]).
    pub(super) async fn recheck(&mut self) {
        self.following
            .recheck(&self.shared, &mut self.session)
            .await;
    }

    /// Catches lagging cursors up by pulling, while there is room.
    pub(super) async fn fill_ready(&mut self) {
        self.following
            .fill_ready(&self.shared, &mut self.session, &mut self.ready)
            .await;
    }

    /// Commits the settled positions as the session group's core offsets.
    pub(super) async fn commit(&mut self) {
        self.following
            .commit(&self.shared, &mut self.session, &mut self.ready)
            .await;
    }

    /// Leaves the router and the shared groups; messages not yet sent go back
    /// to the cursors (read again on resumption), shared ones in flight to the
    /// groups' other members.
    pub(super) async fn detach(&mut self) {
        self.following
            .detach(&self.shared, &mut self.session, &mut self.ready)
            .await;
        self.members
            .leave_all(&mut self.session, &mut self.ready)
            .await;
    }

    /// A shared group with no position on `topic` yet starts at `to`.
    async fn start_group(
        &self,
        group: &str,
        topic: &str,
        to: rocketgate_core::broker::OffsetReset,
    ) {
        let api = &self.shared.api;
        let Ok(config) = api.topic(topic).await else {
            return; // not created yet: every message of it will be new to the group
        };
        for q in 0..config.read_queues {
            if matches!(api.query_offset(group, "", topic, q).await, Ok(Some(_))) {
                return;
            }
        }
        if let Err(e) = api.reset_offset(group, "", topic, to).await {
            tracing::warn!(group, topic, error = %e, "placing a new shared group failed");
        }
    }

    async fn on_subscribe(&mut self, s: Subscribe) -> Option<End> {
        let v5 = self.out.v5();
        if s.filters.is_empty() {
            return Some(End::protocol("SUBSCRIBE without a topic filter"));
        }
        let id = s.properties.as_ref().and_then(|p| p.id);
        // The opt-in to an ordered (FIFO) shared group: user property `order` = `fifo`.
        let fifo = s.properties.as_ref().is_some_and(|p| {
            p.user_properties
                .iter()
                .any(|(k, v)| k == "order" && v.eq_ignore_ascii_case("fifo"))
        });
        if id == Some(0) {
            return Some(End::protocol("subscription identifier 0"));
        }
        // Where a new shared group starts (user property `start`: earliest, latest or
        // a time in ms; docs/broker.md "Where a new group starts").
        let start = match s.properties.as_ref().and_then(|p| {
            p.user_properties
                .iter()
                .find(|(k, _)| k == "start")
                .map(|(_, v)| v.parse::<rocketgate_core::broker::OffsetReset>())
        }) {
            Some(Err(why)) => {
                let mut ack = SubAck::new(
                    s.pkid,
                    vec![SubscribeReasonCode::ImplementationSpecific; s.filters.len()],
                );
                ack.properties = self
                    .out
                    .reason(format!("user property start: {why}"))
                    .map(|r| SubAckProperties {
                        reason_string: Some(r),
                        user_properties: Vec::new(),
                    });
                self.out.send(&Packet::SubAck(ack));
                return None;
            }
            Some(Ok(to)) => Some(to),
            None => None,
        };
        // The plain filters held before this SUBSCRIBE (a repeated one included).
        let before: Vec<String> = self
            .session
            .subs
            .iter()
            .filter(|s| s.filter.share.is_none())
            .map(|s| s.filter.raw.clone())
            .collect();
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut reasons = Vec::new();
        let mut added = Vec::new();
        for f in s.filters {
            let filter = match TopicFilter::parse(&f.path) {
                Ok(t) => t,
                Err(e) => {
                    codes.push(SubscribeReasonCode::TopicFilterInvalid);
                    reasons.push(e.to_string());
                    continue;
                }
            };
            if filter.share.is_some() && f.nolocal {
                return Some(End::protocol("no-local on a shared subscription"));
            }
            if !self
                .session
                .may_subscribe(&filter.filter, filter.share.as_deref())
            {
                tracing::info!(client = %self.session.client_id, filter = %filter.raw, "subscription denied by the ACL");
                metrics::counter!("rocketgate_acl_denied_total", "door" => "mqtt", "action" => "subscribe")
                    .increment(1);
                if self.shared.settings.auth.deny_disconnects() {
                    return Some(End::Server(
                        DisconnectReasonCode::NotAuthorized,
                        format!("not authorized to subscribe to {}", filter.raw),
                    ));
                }
                // 0x87 on v5; the codec writes 3.1.1's 0x80 (failure).
                codes.push(SubscribeReasonCode::NotAuthorized);
                reasons.push(format!("not authorized: {}", filter.raw));
                continue;
            }
            let retain_handling = match f.retain_forward_rule {
                RetainForwardRule::OnEverySubscribe => 0,
                RetainForwardRule::OnNewSubscribe => 1,
                RetainForwardRule::Never => 2,
            };
            let sub = Sub {
                filter,
                qos: f.qos,
                no_local: v5 && f.nolocal,
                retain_as_published: v5 && f.preserve_retain,
                retain_handling,
                id,
            };
            let existed = match self
                .session
                .subs
                .iter_mut()
                .find(|x| x.filter.raw == sub.filter.raw)
            {
                Some(x) => {
                    *x = sub.clone();
                    true
                }
                None => {
                    self.session.push_sub(sub.clone());
                    false
                }
            };
            codes.push(match f.qos {
                QoS::AtMostOnce => SubscribeReasonCode::QoS0,
                QoS::AtLeastOnce => SubscribeReasonCode::QoS1,
                QoS::ExactlyOnce => SubscribeReasonCode::QoS2,
            });
            added.push((sub, existed));
        }
        let mut ack = SubAck::new(s.pkid, codes);
        if !reasons.is_empty() {
            ack.properties = self
                .out
                .reason(reasons.join("; "))
                .map(|r| SubAckProperties {
                    reason_string: Some(r),
                    user_properties: Vec::new(),
                });
        }
        // Only for a filter naming its core topic, and only while the group has no
        // position on it.
        if let Some(to) = start {
            for (sub, existed) in &added {
                if let (Some(share), Some(topic), false) =
                    (&sub.filter.share, sub.filter.core_topic(), *existed)
                {
                    let group = crate::state::share_group(share, &sub.filter.filter);
                    self.start_group(&group, topic, to).await;
                }
            }
        }
        if fifo {
            for (sub, _) in &added {
                if let Some(share) = &sub.filter.share {
                    let group = crate::state::share_group(share, &sub.filter.filter);
                    if let Err(e) = self.shared.api.set_fifo(&group, true).await {
                        tracing::warn!(group = %group, error = %e, "making a shared group ordered failed");
                    }
                }
            }
        }
        self.out.send(&Packet::SubAck(ack));
        if !added.is_empty() {
            let topics = self.shared.topics().await;
            // A topic the earlier subscriptions cover that the session does not
            // follow yet (created since, and the topic list has not told it
            // yet) keeps their place: everything stored in it since they were
            // made is new to the session. Only topics no earlier subscription
            // covers start at the end.
            self.following
                .follow_all(
                    &self.shared,
                    &mut self.session,
                    &topics,
                    Start::Resume,
                    |s| before.contains(&s.filter.raw),
                )
                .await;
            self.sync_following(&topics, Start::End).await;
            self.following.refresh_interest(&self.shared, &self.session);
            if added.iter().any(|(sub, _)| sub.filter.share.is_none()) {
                // Retained messages another door set before this SUBSCRIBE count.
                self.shared.catch_up().await;
            }
            for (sub, existed) in &added {
                let send = sub.filter.share.is_none()
                    && (sub.retain_handling == 0 || (sub.retain_handling == 1 && !*existed));
                if send {
                    self.queue_retained(sub);
                }
            }
            self.shared
                .save_if_kept(&self.session, self.following.id())
                .await;
        }
        None
    }

    /// Values of `$SYS` that changed since this connection last looked, to its
    /// `$SYS` subscriptions (QoS 0, not retained: live updates). Runs on the
    /// connection's one-second tick; costs an atomic load when nothing changed.
    pub(super) fn sys_tick(&mut self) {
        let generation = self.shared.sys.generation();
        let Some(access) = self.session.access.as_mut() else {
            return;
        };
        if generation <= access.sys_seen {
            return;
        }
        let since = std::mem::replace(&mut access.sys_seen, generation);
        let subs: Vec<Sub> = self
            .session
            .subs
            .iter()
            .filter(|s| s.filter.share.is_none() && s.filter.filter.starts_with("$SYS"))
            .cloned()
            .collect();
        for sub in subs {
            self.queue_sys(&sub, since, false);
        }
    }

    /// `$SYS` values changed after generation `since` (0: all) matching `sub`.
    fn queue_sys(&mut self, sub: &Sub, since: u64, retain: bool) {
        if sub.filter.share.is_some() || !sub.filter.filter.starts_with("$SYS") {
            return;
        }
        let v5 = self.out.v5();
        for (name, payload) in self
            .shared
            .sys
            .changed_since(since, |t| sub.filter.matches(t))
        {
            let properties = (v5 && sub.id.is_some()).then(|| {
                let mut props = empty_props();
                props.subscription_identifiers = sub.id.into_iter().collect();
                Box::new(props)
            });
            self.ready.push_back(Ready {
                publish: Outgoing {
                    dup: false,
                    qos: QoS::AtMostOnce,
                    retain,
                    topic: name,
                    pkid: 0,
                    payload,
                    properties,
                },
                source: Source::Retained,
                stored: Stored::NONE,
            });
        }
    }

    fn queue_retained(&mut self, sub: &Sub) {
        self.queue_sys(sub, 0, true);
        let now = message::now_ms();
        let v5 = self.out.v5();
        let matching: Vec<(String, crate::state::Retained)> = {
            let view = lock(&self.shared.log.view);
            view.retained
                .iter()
                .filter(|(t, _)| sub.filter.matches(t))
                .map(|(t, m)| (t.clone(), m.clone()))
                .collect()
        };
        for (name, m) in matching {
            let mut props = empty_props();
            let meta = message::read_meta(
                m.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                v5.then_some(&mut props),
            );
            let Ok(expiry) = message::remaining_expiry(meta.expiry_at, now) else {
                continue;
            };
            props.message_expiry_interval = expiry;
            props.subscription_identifiers = sub.id.into_iter().collect();
            self.ready.push_back(Ready {
                publish: Outgoing {
                    dup: false,
                    qos: min_qos(sub.qos, m.qos),
                    retain: true,
                    topic: Arc::from(name),
                    pkid: 0,
                    payload: m.payload.clone(),
                    properties: v5.then(|| Box::new(props)),
                },
                source: Source::Retained,
                stored: Stored::NONE,
            });
        }
    }

    async fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut ack = UnsubAck::new(u.pkid);
        for f in &u.filters {
            let before = self.session.subs.len();
            self.session.subs.retain(|s| s.filter.raw != *f);
            ack.reasons.push(if self.session.subs.len() < before {
                UnsubAckReason::Success
            } else {
                UnsubAckReason::NoSubscriptionExisted
            });
            self.members.leave_filter(f, &mut self.ready).await;
        }
        self.following
            .drop_uncovered(&self.shared, &mut self.session);
        self.following.refresh_interest(&self.shared, &self.session);
        self.out.send(&Packet::UnsubAck(ack));
        self.shared
            .save_if_kept(&self.session, self.following.id())
            .await;
    }
}
