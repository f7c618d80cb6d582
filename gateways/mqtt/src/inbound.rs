//! Incoming PUBLISHes: topic aliases, checks, the mapping to core messages, and
//! storing everything read in one go with one core `send_batch` per run of the
//! same core topic, acknowledged (PUBACK / PUBREC) only after it returns.
//! Owns the publishes read and not yet stored, and the client's topic aliases;
//! what else it needs of the connection comes in a [`Ctx`].

use std::time::Duration;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;

use bytes::{Bytes, BytesMut};
use mqttbytes::QoS;
use mqttbytes::v5::{
    DisconnectReasonCode, Packet, PubAck, PubAckProperties, PubAckReason, PubRec, PubRecProperties,
    PubRecReason, Publish,
};
use rocketgate_core::broker::{MessagingApi, QueueChoice};
use rocketgate_core::store::Message;
use rocketgate_core::store::record::{EncodedBatch, EncodedEntry};

use crate::end::End;
use crate::message::{self, Refused};
use crate::output::Output;
use crate::session::Session;
use crate::shared::Shared;
use crate::topic;

/// A connection's incoming publishes: read, not yet stored.
pub(crate) struct Inbound {
    pubs: Vec<PendingPub>,
    /// The client's topic aliases (v5): alias -> topic name, made on first use
    /// (most connections never use one, and every byte of this struct is in
    /// every connection's task).
    // Boxed: 8 bytes in every connection's task where the map takes 24, for
    // what few connections use.
    #[allow(clippy::box_collection)]
    aliases: Option<Box<BTreeMap<u16, String>>>,
}

/// What storing and acknowledging publishes needs of the rest of the connection.
pub(crate) struct Ctx<'a, B> {
    pub shared: &'a Shared<B>,
    pub session: &'a mut Session,
    pub out: &'a mut Output,
    pub peer: SocketAddr,
    /// The connection's flag at the router (see [`Inbound::throttle`]).
    pub client_slow: &'a AtomicBool,
}

/// What a publish is stored as.
enum Mapped {
    /// It has properties beyond the plain ones: a core `Message`.
    Message(Message),
    /// Only the plain ones ([`message::plain_core_len`]): encoded straight into
    /// the batch when it is stored, one buffer for all of its properties.
    Plain {
        /// The MQTT topic name; its first `core_len` bytes are the core topic.
        name: String,
        core_len: usize,
        body: Bytes,
    },
}

impl Mapped {
    fn core_topic(&self) -> &str {
        match self {
            Mapped::Message(m) => &m.topic,
            Mapped::Plain { name, core_len, .. } => &name[..*core_len],
        }
    }
}

/// A PUBLISH read and waiting for its core send (or for its ack only).
struct PendingPub {
    message: Option<Mapped>,
    /// Its message went into the core batch.
    stored: bool,
    qos: QoS,
    pkid: u16,
    retain: Option<(String, Bytes)>,
    refused: Option<Refused>,
}

const MAX_PUB_BATCH: usize = 128;
/// A publisher waits while more than this many entries of its queue are stored
/// but not yet handed to the sessions following the topic (the node stores
/// faster than it delivers: overload). Small enough that what is stored follows
/// delivery closely, large enough for a few router batches in flight.
const MAX_AHEAD: u64 = 1024;
/// ... but never longer than this per batch (a reader stuck for another reason
/// must not stop publishing).
const MAX_THROTTLE: Duration = Duration::from_secs(1);
fn refused_reason(code: u8) -> PubAckReason {
    match code {
        0x90 => PubAckReason::TopicNameInvalid,
        0x97 => PubAckReason::QuotaExceeded,
        0x99 => PubAckReason::PayloadFormatInvalid,
        0x87 => PubAckReason::NotAuthorized,
        _ => PubAckReason::UnspecifiedError,
    }
}

fn rec_reason(code: u8) -> PubRecReason {
    match code {
        0x90 => PubRecReason::TopicNameInvalid,
        0x97 => PubRecReason::QuotaExceeded,
        0x99 => PubRecReason::PayloadFormatInvalid,
        0x87 => PubRecReason::NotAuthorized,
        _ => PubRecReason::UnspecifiedError,
    }
}

impl Inbound {
    pub fn new() -> Inbound {
        Inbound {
            pubs: Vec::new(),
            aliases: None,
        }
    }

    pub async fn on_publish<B: MessagingApi + 'static>(
        &mut self,
        cx: &mut Ctx<'_, B>,
        mut p: Publish,
    ) -> Option<End> {
        let v5 = cx.out.v5();
        if p.properties
            .as_ref()
            .is_some_and(|pr| !pr.subscription_identifiers.is_empty())
        {
            // MQTT-3.3.4-6: only the server puts subscription identifiers on a PUBLISH.
            return Some(End::protocol(
                "a PUBLISH from a client with a subscription identifier",
            ));
        }
        // Topic alias (v5).
        if let Some(alias) = p.properties.as_mut().and_then(|pr| pr.topic_alias.take()) {
            if alias == 0 || alias > cx.shared.settings.topic_alias_maximum {
                return Some(End::Server(
                    DisconnectReasonCode::TopicAliasInvalid,
                    format!("topic alias {alias}"),
                ));
            }
            if p.topic.is_empty() {
                match self.aliases.as_ref().and_then(|a| a.get(&alias)) {
                    Some(t) => p.topic = t.clone(),
                    None => return Some(End::protocol(format!("unknown topic alias {alias}"))),
                }
            } else {
                self.aliases
                    .get_or_insert_default()
                    .insert(alias, p.topic.clone());
            }
        }
        if let Err(e) = topic::check_name(&p.topic) {
            return Some(End::Server(
                DisconnectReasonCode::TopicNameInvalid,
                e.to_string(),
            ));
        }
        if !cx.session.may_publish(&p.topic) {
            tracing::info!(
                client = %cx.session.client_id,
                topic = %p.topic.chars().take(200).collect::<String>(),
                "publish denied by the ACL"
            );
            metrics::counter!("rocketgate_acl_denied_total", "door" => "mqtt", "action" => "publish")
                .increment(1);
            if cx.shared.settings.auth.deny_disconnects() {
                return Some(End::Server(
                    DisconnectReasonCode::NotAuthorized,
                    format!("not authorized to publish to {}", p.topic),
                ));
            }
            // Acknowledged per its QoS (0x87 on v5) and dropped: 3.1.1 has no
            // negative acknowledgement ([MQTT-3.3.5-2], Mosquitto's behaviour).
            return self
                .push_pub(
                    cx,
                    PendingPub {
                        message: None,
                        stored: false,
                        qos: p.qos,
                        pkid: p.pkid,
                        retain: None,
                        refused: Some(Refused {
                            code: 0x87,
                            reason: "not authorized".into(),
                        }),
                    },
                )
                .await;
        }
        if p.qos == QoS::ExactlyOnce {
            if cx.session.qos2_in.contains(p.pkid) {
                // A retransmission of a message already stored: acknowledge only.
                return self
                    .push_pub(
                        cx,
                        PendingPub {
                            message: None,
                            stored: false,
                            qos: p.qos,
                            pkid: p.pkid,
                            retain: None,
                            refused: None,
                        },
                    )
                    .await;
            }
            let unfinished = cx.session.qos2_in.count()
                + self
                    .pubs
                    .iter()
                    .filter(|x| x.qos == QoS::ExactlyOnce)
                    .count();
            if unfinished >= usize::from(cx.shared.settings.receive_maximum) {
                return Some(End::Server(
                    DisconnectReasonCode::ReceiveMaximumExceeded,
                    "too many unfinished QoS 2 publishes".into(),
                ));
            }
        }
        let retain = p.retain.then(|| (p.topic.clone(), p.payload.clone()));
        let mapped = match message::plain_core_len(&p) {
            Some(Ok(core_len)) => Ok(Mapped::Plain {
                name: std::mem::take(&mut p.topic),
                core_len,
                body: p.payload.clone(),
            }),
            Some(Err(r)) => Err(r),
            None => message::to_core(
                &p.topic,
                &p,
                &cx.session.client_id,
                cx.peer,
                message::now_ms(),
            )
            .map(Mapped::Message),
        };
        let pending = match mapped {
            Ok(m) => PendingPub {
                retain,
                message: Some(m),
                stored: false,
                qos: p.qos,
                pkid: p.pkid,
                refused: None,
            },
            Err(r) => {
                // A well-formed publish this broker does not take ($SYS, a name
                // too long to store, ...). 3.1.1 has no negative acknowledgement
                // and requires closing only for malformed packets (those ended
                // above), so, as Mosquitto does, it is acknowledged and dropped:
                // closing would make the client send it again, forever.
                tracing::info!(
                    client = %cx.session.client_id,
                    // A name may be 64 KiB: the start says which it was.
                    topic = %p.topic.chars().take(200).collect::<String>(),
                    code = r.code,
                    reason = %r.reason,
                    "publish refused"
                );
                metrics::counter!("rocketgate_mqtt_publish_refused_total", "version" => if v5 { "5" } else { "3.1.1" })
                    .increment(1);
                PendingPub {
                    message: None,
                    stored: false,
                    qos: p.qos,
                    pkid: p.pkid,
                    retain: None,
                    refused: Some(r),
                }
            }
        };
        self.push_pub(cx, pending).await
    }

    /// Queues a publish for the next core batch; `Some` ends the connection (a
    /// 3.1.1 publish the core could not store).
    async fn push_pub<B: MessagingApi + 'static>(
        &mut self,
        cx: &mut Ctx<'_, B>,
        p: PendingPub,
    ) -> Option<End> {
        let same_topic = match (
            self.pubs.iter().rev().find_map(|x| x.message.as_ref()),
            &p.message,
        ) {
            // One core batch is one core topic, all plain or all messages.
            (Some(a), Some(b)) => {
                a.core_topic() == b.core_topic()
                    && matches!(a, Mapped::Plain { .. }) == matches!(b, Mapped::Plain { .. })
            }
            _ => true,
        };
        let end = if !same_topic || self.pubs.len() >= MAX_PUB_BATCH {
            self.flush(cx).await
        } else {
            None
        };
        if end.is_none() {
            self.pubs.push(p);
        }
        end
    }

    /// Backpressure from delivery: before acknowledging and reading on, wait
    /// until the router has handed what this publisher stored (all but
    /// [`MAX_AHEAD`] entries) to the sessions of the topic, which it does only as
    /// fast as they drain. So the publisher's TCP window fills up instead of the
    /// node storing what it cannot deliver (QoS 0 publishers have no other limit).
    async fn throttle<B: MessagingApi + 'static>(
        cx: &Ctx<'_, B>,
        topic: &str,
        stored: &[(u32, u64)],
    ) {
        let Some(&(queue_id, last)) = stored.last() else {
            return;
        };
        let upto = (last + 1).saturating_sub(MAX_AHEAD);
        // While this waits the connection takes no feeds: if it also subscribes
        // to the topic, the router must not wait for it in turn.
        cx.client_slow
            .store(true, std::sync::atomic::Ordering::Release);
        cx.shared
            .router
            .wait_handed(topic, queue_id, upto, MAX_THROTTLE)
            .await;
    }

    /// What the client is told when the core could not store its publishes.
    fn not_stored(client_id: &str, e: rocketgate_core::Error) -> Refused {
        if let rocketgate_core::Error::DiskFull { .. } = e {
            // Quota exceeded (0x97): the broker refuses writes until space returns;
            // a 3.1.1 client is disconnected without an ack (it cannot be told why).
            tracing::warn!(client = %client_id, error = %e, "publish refused: disk full");
            return Refused {
                code: 0x97,
                reason: format!("disk full: {e}"),
            };
        }
        use rocketgate_core::Error as E;
        if let E::ReadOnlyReplica { .. } = e {
            // 0x9C marks "use another server": with `server_reference` set a v5
            // client is sent there (DISCONNECT 0x9C, see `flush`); without, its
            // PUBACK / PUBREC says 0x80 (`refused_reason`).
            tracing::warn!(client = %client_id, error = %e, "publish refused: read-only slave");
            return Refused {
                code: 0x9C,
                reason: e.to_string(),
            };
        }
        if matches!(
            e,
            E::ReplicationTimeout { .. } | E::NoInSyncReplica { .. } | E::NotLeader { .. }
        ) {
            // Sync replication without its copies (the outcome is unknown: it is in the
            // master's log), or a master without its controller lease: 0x80 with the reason; a 3.1.1 client is disconnected without an ack.
            tracing::warn!(client = %client_id, error = %e, "publish not acknowledged: replication");
            return Refused {
                code: 0x80,
                reason: e.to_string(),
            };
        }
        tracing::warn!(client = %client_id, error = %e, "storing a publish failed");
        Refused {
            code: 0x80,
            reason: format!("not stored: {e}"),
        }
    }

    /// Nothing read waits to be stored.
    pub fn is_idle(&self) -> bool {
        self.pubs.is_empty()
    }

    /// Stores the pending publishes (one core batch), then acknowledges them in order.
    /// A 3.1.1 PUBACK / PUBREC cannot say "not stored", so when the core fails a
    /// 3.1.1 client gets no acknowledgement and the connection ends (`Some`): the
    /// client publishes again after reconnecting, instead of believing it stored.
    pub async fn flush<B: MessagingApi + 'static>(&mut self, cx: &mut Ctx<'_, B>) -> Option<End> {
        if self.pubs.is_empty() {
            return None;
        }
        let started = std::time::Instant::now();
        let mut body_bytes = 0usize;
        let mut pubs = std::mem::take(&mut self.pubs);
        // Retained publishes keep their mapped properties for the retained store.
        let mut retained_props: Vec<Vec<(String, String)>> = Vec::new();
        let mut messages: Vec<Message> = Vec::with_capacity(pubs.len());
        let mut plain: Option<EncodedBatch> = None;
        let mut props = BytesMut::new();
        let count = pubs.len();
        for p in &mut pubs {
            match p.message.take() {
                Some(Mapped::Message(m)) => {
                    body_bytes += m.body.len();
                    if p.retain.is_some() {
                        retained_props.push(m.properties.clone());
                    }
                    messages.push(m);
                }
                Some(Mapped::Plain {
                    name,
                    core_len,
                    body,
                }) => {
                    let batch = plain.get_or_insert_with(|| {
                        // One buffer for the batch's properties, about the right size.
                        props.reserve((name.len() + cx.session.client_id.len() + 32) * count);
                        EncodedBatch {
                            topic: name[..core_len].to_owned(),
                            sys_flag: 0,
                            born_timestamp: message::now_ms(),
                            born_host: cx.peer,
                            reconsume_times: 0,
                            entries: Vec::new(),
                        }
                    });
                    body_bytes += body.len();
                    message::write_plain_properties(
                        &name,
                        core_len,
                        p.qos,
                        &cx.session.client_id,
                        &mut props,
                    );
                    batch.entries.push(EncodedEntry {
                        flag: 0,
                        body,
                        properties: props.split().freeze(),
                    });
                }
                None => continue,
            }
            p.stored = true;
        }
        let mut failure = None;
        let topic = messages
            .first()
            .map(|m| m.topic.clone())
            .or_else(|| plain.as_ref().map(|b| b.topic.clone()));
        let mut results = Vec::new();
        if let Some(batch) = plain {
            let key = QueueChoice::ShardingKey(cx.session.client_id.clone());
            match cx.shared.api.send_encoded(batch, key).await {
                Ok(sent) => {
                    results = sent
                        .records
                        .iter()
                        .map(|r| (sent.queue_id, r.queue_offset))
                        .collect()
                }
                Err(e) => failure = Some(Self::not_stored(&cx.session.client_id, e)),
            }
        }
        if !messages.is_empty() {
            let key = QueueChoice::ShardingKey(cx.session.client_id.clone());
            let stored = if messages.iter().any(is_delayed) {
                // The core stores delayed messages one by one, never in a batch.
                let mut result = Ok(Vec::new());
                for m in messages {
                    if let Err(e) = cx.shared.api.send(m, key.clone()).await {
                        result = Err(e);
                        break;
                    }
                }
                result
            } else {
                cx.shared.api.send_batch(messages, key).await
            };
            match stored {
                Ok(r) => {
                    results = r
                        .iter()
                        .map(|s| (s.queue_id, s.append.queue_offset))
                        .collect();
                    // Retained state is in the state log before the acknowledgement.
                    let mut props = retained_props.into_iter();
                    for p in &pubs {
                        if let Some((name, payload)) = &p.retain {
                            let pr = props.next().unwrap_or_default();
                            if let Err(e) = cx
                                .shared
                                .store_retained(name, p.qos, payload.clone(), pr)
                                .await
                            {
                                failure = Some(e);
                                break;
                            }
                        }
                    }
                }
                Err(e) => failure = Some(Self::not_stored(&cx.session.client_id, e)),
            }
        }
        if cx.out.v5()
            && let Some(r) = &failure
            && r.code == 0x9C
            && cx.shared.settings.server_reference.is_some()
        {
            // A read-only slave's door sends the publisher to the master (#27 item 6):
            // DISCONNECT 0x9C with the Server Reference, no acknowledgement.
            return Some(End::Server(
                DisconnectReasonCode::UseAnotherServer,
                r.reason.clone(),
            ));
        }
        if !cx.out.v5()
            && let Some(r) = &failure
        {
            // Acks of publishes before the failed batch went out already; these
            // get none.
            return Some(End::Server(
                DisconnectReasonCode::UnspecifiedError,
                r.reason.clone(),
            ));
        }
        if let Some(topic) = topic {
            if !results.is_empty() {
                crate::meters::count_in(&topic, results.len(), body_bytes);
                crate::meters::METERS.publish.record_since(started);
            }
            Self::throttle(cx, &topic, &results).await;
        }
        for p in pubs {
            let refused = if p.stored { failure.clone() } else { p.refused };
            match (p.qos, refused) {
                (QoS::AtMostOnce, _) => {}
                (QoS::AtLeastOnce, None) => cx.out.send(&Packet::PubAck(PubAck::new(p.pkid))),
                (QoS::AtLeastOnce, Some(r)) => {
                    let mut a = PubAck::new(p.pkid);
                    a.reason = refused_reason(r.code);
                    a.properties = cx.out.reason(r.reason).map(|s| PubAckProperties {
                        reason_string: Some(s),
                        user_properties: Vec::new(),
                    });
                    cx.out.send(&Packet::PubAck(a));
                }
                (QoS::ExactlyOnce, None) => {
                    cx.session.qos2_in.insert(p.pkid);
                    cx.out.send(&Packet::PubRec(PubRec::new(p.pkid)));
                }
                (QoS::ExactlyOnce, Some(r)) => {
                    let mut a = PubRec::new(p.pkid);
                    a.reason = rec_reason(r.code);
                    a.properties = cx.out.reason(r.reason).map(|s| PubRecProperties {
                        reason_string: Some(s),
                        user_properties: Vec::new(),
                    });
                    cx.out.send(&Packet::PubRec(a));
                }
            }
        }
        None
    }
}

/// True for a message the core will hold back (`$delayed/...`, see [`message::delayed`]).
fn is_delayed(m: &Message) -> bool {
    m.property(rocketgate_core::store::record::property::TIMER_DELAY_MS)
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_without_its_lease_refuses_with_0x80_and_the_reason() {
        let reason = "this broker's master lease expired 1.2s ago; not taking writes";
        let r = Inbound::not_stored(
            "c1",
            rocketgate_core::Error::NotLeader {
                reason: reason.into(),
            },
        );
        assert_eq!((r.code, r.reason.as_str()), (0x80, reason));
        let r = Inbound::not_stored(
            "c1",
            rocketgate_core::Error::ReadOnlyReplica {
                master: "m:10912".into(),
            },
        );
        // 0x9C inside the door (a reference sends the client away); the wire says
        // 0x80 without one.
        assert_eq!(r.code, 0x9C);
        assert_eq!(refused_reason(r.code), PubAckReason::UnspecifiedError);
        assert_eq!(rec_reason(r.code), PubRecReason::UnspecifiedError);
        assert!(r.reason.contains("read-only slave"), "{}", r.reason);
    }
}
