//! A connection's outgoing window: what the client lets it have in flight
//! (its Receive Maximum and Maximum Packet Size), the topic aliases towards it,
//! taking messages from the ready queue into the window as it has room
//! (matching a run's messages against the subscriptions one at a time, see
//! `ready.rs`), acknowledgements, and resending what was in flight when a
//! session resumes. The in-flight messages themselves are the session's (they
//! outlive the connection); shared ones are settled through `members.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mqttbytes::QoS;
use mqttbytes::v5::{ConnectProperties, Packet, PubRec, PubRel, PubRelReason, Publish};
use rocketgate_core::broker::MessagingApi;
use rocketgate_core::store::RecordView;

use crate::codec;
use crate::members::Members;
use crate::message::{self, empty_props};
use crate::meters::{SYS_TOPIC, Stored, Tally};
use crate::outgoing::{Outgoing, min_qos};
use crate::output::Output;
use crate::ready::{Ready, ReadyQueue};
use crate::router::{Batch, mqtt_name, read_log};
use crate::session::{Inflight, Session, Source, Sub};
use crate::shared::Shared;
use crate::topic;

/// Sizes are kept small: every byte of this is in every connection's task.
pub(crate) struct Window {
    /// Messages in flight at most: the client's Receive Maximum, capped by the
    /// server's `max_inflight` (so it fits a `u16`).
    size: u16,
    /// The client's Maximum Packet Size (`u32::MAX`: none announced; packets
    /// are never that large).
    max_packet: u32,
    /// The client's Topic Alias Maximum (0: it takes none).
    alias_max: u16,
    /// Topic name -> alias, made on first use (most connections never use one).
    // Boxed: 8 bytes in every connection's task where the map takes 24, for
    // what few connections use.
    #[allow(clippy::box_collection)]
    aliases: Option<Box<BTreeMap<String, u16>>>,
}

impl Window {
    /// `max_inflight`: the server's cap.
    pub fn new(max_inflight: u16) -> Window {
        Window {
            size: max_inflight.max(1),
            max_packet: u32::MAX,
            alias_max: 0,
            aliases: None,
        }
    }

    /// What a v5 client's CONNECT says of it.
    pub fn limit(&mut self, p: &ConnectProperties, max_inflight: u16) {
        self.size = p
            .receive_maximum
            .unwrap_or(u16::MAX)
            .min(max_inflight.max(1));
        self.max_packet = p.max_packet_size.unwrap_or(u32::MAX);
        self.alias_max = p.topic_alias_max.unwrap_or(0);
    }

    /// Messages in flight at most.
    pub fn size(&self) -> usize {
        usize::from(self.size)
    }

    /// Writes ready messages while the client's window has room.
    pub fn pump(
        &mut self,
        session: &mut Session,
        ready: &mut ReadyQueue,
        out: &mut Output,
        members: &mut Members,
    ) {
        let window = self.size();
        let v5 = out.v5();
        // Counted per run of one topic, not per message (docs/metrics.md).
        let mut tally = Tally::default();
        let now = rocketgate_core::clock::now_ms();
        let mut latency = rocketgate_core::meter::Batch::default();
        let mut last_grant = None;
        loop {
            let full = session.inflight.len() >= window;
            if full
                && ready
                    .front_one()
                    .is_some_and(|r| r.publish.qos != QoS::AtMostOnce)
            {
                break;
            }
            let mut matcher = Matcher {
                subs: &session.subs,
                client_id: &session.client_id,
                v5,
                last_grant: &mut last_grant,
            };
            let Some(mut r) = ready.pop_with(|b, i| matcher.matched(b, i)) else {
                break;
            };
            if r.publish.qos != QoS::AtMostOnce {
                if full {
                    // (A run's next message: known only now.)
                    ready.push_front(r);
                    break;
                }
                match session.alloc_pkid() {
                    Some(id) => r.publish.pkid = id,
                    None => {
                        ready.push_front(r);
                        break;
                    }
                }
            }
            if v5 && (r.publish.properties.is_some() || self.alias_max > 0) {
                // Properties or an alias: mqttbytes encodes it. The packet is made
                // once, for the size check, the alias and the write.
                let mut wire = r.publish.to_publish();
                if self.max_packet != u32::MAX && wire.len() + 5 > self.max_packet as usize {
                    // Larger than the client accepts: discarded for this client (MQTT 5 §3.1.2.11.4).
                    members.settle(r.source);
                    continue;
                }
                if let Some((alias, known)) = self.outgoing_alias(&r.publish.topic) {
                    if known {
                        wire.topic.clear();
                    }
                    wire.properties.get_or_insert_with(empty_props).topic_alias = Some(alias);
                }
                out.send(&Packet::Publish(wire));
            } else {
                // 3.1.1, or v5 without properties: straight from its parts.
                // (Only v5 clients announce a maximum.)
                let too_large = self.max_packet != u32::MAX
                    && codec::outgoing_len(out.version(), &r.publish) > self.max_packet as usize;
                if too_large {
                    members.settle(r.source);
                    continue;
                }
                out.publish(&r.publish);
            }
            // Written: counted under its core topic, its latency sampled (log and
            // shared messages; retained ones have no store time).
            count_sent(
                &mut tally,
                &r.source,
                &r.publish.topic,
                r.publish.payload.len(),
            );
            if let Some(ms) = r.stored.since(now) {
                latency.record_ns(ms.saturating_mul(1_000_000));
            }
            if r.publish.qos == QoS::AtMostOnce {
                members.settle(r.source);
            } else {
                session
                    .inflight
                    .insert(r.publish.pkid, Inflight::of(r.publish, r.source, r.stored));
            }
        }
        tally.flush();
        latency.add_to(&crate::meters::METERS.delivery);
    }

    /// The alias for a topic towards the client: `(alias, already known to it)`.
    fn outgoing_alias(&mut self, topic: &str) -> Option<(u16, bool)> {
        if self.alias_max == 0 {
            return None;
        }
        let aliases = self.aliases.get_or_insert_default();
        if let Some(a) = aliases.get(topic) {
            return Some((*a, true));
        }
        let next = aliases.len() + 1;
        if next > usize::from(self.alias_max) {
            return None;
        }
        let a = next as u16;
        aliases.insert(topic.to_owned(), a);
        Some((a, false))
    }

    /// PUBACK, or PUBCOMP (`comp`): the message leaves the window.
    pub fn on_ack(&mut self, session: &mut Session, members: &mut Members, pkid: u16, comp: bool) {
        let matches = match session.inflight.get(&pkid) {
            Some(f) => f.released == comp || !comp,
            None => false,
        };
        if matches && let Some(f) = session.inflight.remove(&pkid) {
            members.settle(f.source);
        }
    }

    /// PUBREC: released (PUBREL sent), or out of the window when it failed.
    pub fn on_rec(
        &mut self,
        session: &mut Session,
        members: &mut Members,
        out: &mut Output,
        r: PubRec,
    ) {
        let failed = (r.reason as u8) >= 0x80;
        if failed {
            self.on_ack(session, members, r.pkid, false);
        } else if let Some(f) = session.inflight.get_mut(&r.pkid) {
            f.released = true;
            out.send(&Packet::PubRel(PubRel::new(r.pkid)));
        } else {
            let mut rel = PubRel::new(r.pkid);
            rel.reason = PubRelReason::PacketIdentifierNotFound;
            out.send(&Packet::PubRel(rel));
        }
    }

    /// A resumed session: what was in flight goes again (PUBREL for what was
    /// released), in the order it was sent.
    pub async fn resend<B: MessagingApi + 'static>(
        &self,
        shared: &Shared<B>,
        session: &mut Session,
        out: &mut Output,
    ) {
        let inflight: Vec<(u16, Inflight)> = session
            .inflight
            .iter()
            .map(|(id, f)| (id, f.clone()))
            .collect();
        // A broker that cannot answer right now (a broker group restarting behind a
        // proxy, the proxy's link to it reconnecting) still has the messages: asked
        // again for a few seconds in all, then they are kept for the next resume (a
        // local disk error is kept at once, as before).
        let deadline = tokio::time::Instant::now() + READ_BACK_RETRY;
        // A resend hands the message to the client again: a latency sample
        // (from its store time, so it includes the time the client was away).
        let mut latency = rocketgate_core::meter::Batch::default();
        let mut tally = Tally::default();
        for (id, f) in inflight {
            if f.released {
                out.send(&Packet::PubRel(PubRel::new(id)));
                continue;
            }
            let mut p = match &f.publish {
                Some(p) => Ok(Some(p.to_publish())),
                None => read_back(shared, id, &f).await,
            };
            while matches!(&p, Err(e) if is_remote_not_now(e) || not_routed(e))
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
                p = read_back(shared, id, &f).await;
            }
            match p {
                Ok(Some(mut p)) => {
                    p.dup = true;
                    count_sent(&mut tally, &f.source, &p.topic, p.payload.len());
                    out.send(&Packet::Publish(p));
                    if let Some(ms) = f.stored.since(rocketgate_core::clock::now_ms()) {
                        latency.record_ns(ms.saturating_mul(1_000_000));
                    }
                }
                Err(e) if not_now(&e) => {
                    // The log still has it: kept, and resent at the next resume.
                    tracing::warn!(client = %session.client_id, pkid = id, error = %e,
                        "reading back a message in flight failed; kept for the next resume");
                }
                other => {
                    // Gone from the log (retention, a deleted topic) or unreadable.
                    let error = other.err().map(|e| e.to_string());
                    tracing::warn!(client = %session.client_id, pkid = id, error = ?error,
                        "a message in flight is no longer in the log; not resent");
                    session.inflight.remove(&id);
                }
            }
        }
        tally.flush();
        latency.add_to(&crate::meters::METERS.delivery);
    }
}

/// Counts a written PUBLISH (MQTT name `name`, `bytes` of payload) under its
/// core topic.
fn count_sent(tally: &mut Tally, source: &Source, name: &str, bytes: usize) {
    match source {
        Source::Log { topic, .. } | Source::Superseded { topic, .. } => tally.add(topic, bytes),
        Source::Share { link, .. } => tally.add(&link.topic, bytes),
        Source::Retained => tally.add(&retained_topic(name), bytes),
    }
}

/// The core topic a retained message is counted under: its MQTT name's (one
/// allocation; retained messages go out at SUBSCRIBE, not per published
/// message). `$SYS/…` has none: [`SYS_TOPIC`].
fn retained_topic(name: &str) -> Arc<str> {
    let first = name.split('/').next().unwrap_or(name);
    if first == SYS_TOPIC {
        Arc::from(SYS_TOPIC)
    } else {
        Arc::from(topic::core_of(first))
    }
}

/// How long a resume asks a broker that cannot answer now again for its messages
/// in flight (all of them together).
const READ_BACK_RETRY: Duration = Duration::from_secs(10);

/// Errors that say the broker cannot answer now, not that the message is gone: a
/// disk error, or (behind a proxy) a broker group that is unreachable or restarting.
fn not_now(e: &rocketgate_core::Error) -> bool {
    matches!(
        e,
        rocketgate_core::Error::Io { .. }
            | rocketgate_core::Error::NotLeader { .. }
            | rocketgate_core::Error::ShutDown
    )
}

/// [`not_now`] errors of a remote broker (a broker local to the door answers
/// at once or not at all).
fn is_remote_not_now(e: &rocketgate_core::Error) -> bool {
    matches!(
        e,
        rocketgate_core::Error::NotLeader { .. } | rocketgate_core::Error::ShutDown
    )
}

/// Errors that say the queue is not known now: behind a proxy, a broker group that
/// restarted is missing from the topic's route until it registered again and the
/// proxy re-read the route (within a second or two); asked again meanwhile.
fn not_routed(e: &rocketgate_core::Error) -> bool {
    matches!(
        e,
        rocketgate_core::Error::QueueNotFound { .. } | rocketgate_core::Error::TopicNotFound { .. }
    )
}

/// A log message in flight kept without its copy (see [`Inflight::publish`]),
/// read back from the log as it was sent (`Ok(None)`: not there any more).
async fn read_back<B: MessagingApi + 'static>(
    shared: &Shared<B>,
    pkid: u16,
    f: &Inflight,
) -> rocketgate_core::Result<Option<Publish>> {
    let (Source::Log {
        topic,
        queue,
        offset,
    }
    | Source::Superseded {
        topic,
        queue,
        offset,
    }) = &f.source
    else {
        return Ok(None);
    };
    let r = read_log(&*shared.api, topic, *queue, *offset, 1, Duration::ZERO).await?;
    let Some(d) = r.messages.first().filter(|d| d.queue_offset == *offset) else {
        return Ok(None);
    };
    let (Ok(view), Some(name)) = (RecordView::parse(&d.record), mqtt_name(d)) else {
        return Ok(None);
    };
    Ok(Some(Publish {
        dup: true,
        qos: f.qos,
        retain: f.retain,
        topic: name.to_string(),
        pkid,
        payload: d.record.slice_ref(view.body()),
        properties: None,
    }))
}

/// What matching a log message for a session needs of it (borrowed apart from
/// its ready queue, which the messages are taken from).
struct Matcher<'a> {
    subs: &'a [Sub],
    client_id: &'a str,
    v5: bool,
    /// The grant of the last name matched in this `pump`, with the name: the
    /// messages of a batch mostly share one name (the router makes one `Arc`
    /// for them), so the subscriptions are matched once per name, not once per
    /// message (with a thousand fan-out sessions, per delivery).
    last_grant: &'a mut Option<(Arc<str>, Grant)>,
}

impl Matcher<'_> {
    /// Message `i` of `b` for every plain subscription it matches: once, at the
    /// highest granted QoS, with every subscription identifier (`None`: none
    /// matches, or it expired).
    fn matched(&mut self, b: &Batch, i: usize) -> Option<Ready> {
        let d = b.messages.get(i)?;
        // (Batches made by `batch_of` have every name.)
        let name = match b.names.get(i) {
            Some(n) => n.clone()?,
            None => mqtt_name(d)?,
        };
        let head = b.heads.get(i).and_then(Option::as_ref);
        let mut grant = match &*self.last_grant {
            Some((n, g)) if Arc::ptr_eq(n, &name) || **n == *name => g.clone(),
            _ => {
                let g = Grant::of(self.subs, &name, false);
                *self.last_grant = Some((name.clone(), g.clone()));
                g
            }
        };
        grant.qos?;
        let no_local = grant.no_local;
        let v5 = self.v5;
        // (Made only for a v5 client: a 3.1.1 delivery has no properties.)
        let mut props = v5.then(empty_props);
        // A session takes what the router worked out once for everyone; a v5
        // one parses the record when it has properties a v5 client is given.
        let (meta, payload) = match head.filter(|h| !v5 || !h.v5_properties) {
            Some(h) => (
                message::Meta {
                    qos: h.qos,
                    // Only a no-local subscription asks who published it.
                    origin: no_local.then(|| h.origin(&d.record)).flatten(),
                    retain: h.retain,
                    expiry_at: h.expiry_at,
                    v5_properties: false,
                },
                h.body(&d.record),
            ),
            None => {
                let view = RecordView::parse(&d.record).ok()?;
                (
                    message::read_meta(view.properties(), props.as_mut()),
                    d.record.slice_ref(view.body()),
                )
            }
        };
        if no_local && meta.origin == Some(self.client_id) {
            // Its own message: only the other subscriptions count.
            grant = Grant::of(self.subs, &name, true);
        }
        let Grant {
            qos: granted,
            ids,
            rap,
            ..
        } = grant;
        let granted = granted?;
        // (The clock only for a message that expires.)
        let now = meta.expiry_at.map_or(0, |_| message::now_ms());
        let expiry = message::remaining_expiry(meta.expiry_at, now).ok()?;
        let qos = min_qos(granted, meta.qos.unwrap_or(QoS::ExactlyOnce));
        let properties = props.and_then(|mut props| {
            props.message_expiry_interval = expiry;
            props.subscription_identifiers = ids;
            (!message::no_properties(&props)).then(|| Box::new(props))
        });
        let publish = Outgoing {
            dup: false,
            qos,
            retain: rap && meta.retain,
            topic: name,
            pkid: 0,
            payload,
            // (A v5 delivery without any is encoded without mqttbytes.)
            properties,
        };
        Some(Ready {
            publish,
            source: Source::Log {
                topic: b.topic.clone(),
                queue: b.queue,
                offset: d.queue_offset,
            },
            stored: Stored::of(&d.record),
        })
    }
}

/// What a session's plain subscriptions matching a name grant a message: the
/// highest QoS, every subscription identifier, retain-as-published from any.
#[derive(Clone)]
struct Grant {
    qos: Option<QoS>,
    ids: Vec<usize>,
    rap: bool,
    /// A no-local subscription matched (decided once the origin is known).
    no_local: bool,
}

impl Grant {
    /// `without_no_local`: leave the no-local subscriptions out (the message is
    /// the session's own).
    fn of(subs: &[Sub], name: &str, without_no_local: bool) -> Grant {
        let mut g = Grant {
            qos: None,
            ids: Vec::new(),
            rap: false,
            no_local: false,
        };
        for s in subs {
            if s.filter.share.is_some()
                || (without_no_local && s.no_local)
                || !s.filter.matches(name)
            {
                continue;
            }
            g.no_local |= s.no_local;
            g.qos = Some(match g.qos {
                Some(q) if q >= s.qos => q,
                _ => s.qos,
            });
            if let Some(id) = s.id {
                g.ids.push(id);
            }
            g.rap |= s.retain_as_published;
        }
        g
    }
}
