//! Outgoing messages of a connection: subscriptions, following core topics
//! through the router, catching up by pulling from the session's cursors, the
//! in-flight window and acknowledgements. Shared subscriptions are `share/`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mqttbytes::QoS;
use mqttbytes::v5::{
    Packet, PubRel, Publish, RetainForwardRule, SubAck, SubAckProperties, Subscribe,
    SubscribeReasonCode, UnsubAck, UnsubAckReason, Unsubscribe,
};
use rocketgate_core::broker::{MessagingApi, PullStatus};
use rocketgate_core::store::RecordView;

use crate::codec::Version;
use crate::conn::{Conn, End};
use crate::message::{self, empty_props};
use crate::router::{Batch, Feed, Interest, batch_of, mqtt_name, queue_end, read_log};
use crate::session::{Inflight, Outgoing, Source, Sub};
use crate::topic::TopicFilter;

/// Stop taking router batches above this many messages waiting for the window.
pub const READY_HIGH: usize = 1024;
/// Catch up by pulling while fewer than this many are waiting.
pub const READY_LOW: usize = 256;
/// A session catching up from further back than this does not hold the router
/// (and so the publishers) back while it does (see `conn.rs`).
const FAR_BEHIND: u64 = 16 * 1024;
const PULL_BATCH: usize = 128;

/// A message ready to go out once the window allows.
pub struct Ready {
    pub publish: Outgoing,
    pub source: Source,
}

/// How a topic's cursors start when it is followed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// At the end of the log (a new subscription).
    End,
    /// Where the session was (in memory, or the core's committed offset), else at 0
    /// (the topic appeared after the subscription).
    Resume,
}

impl<B: MessagingApi + 'static> Conn<B> {
    /// After CONNECT: follow the session's topics again, restart shared
    /// subscriptions, resend what is in flight.
    pub(crate) async fn resume(&mut self) {
        if self.session.expiry != 0 {
            // Offsets reset while the session was offline win over its own cursors.
            self.adopt_resets().await;
        }
        let topics = self.current_topics().await;
        self.sync_following(&topics, Start::Resume).await;
        self.session.restore_cursors = false;
        let inflight: Vec<(u16, Inflight)> = self
            .session
            .inflight
            .iter()
            .map(|(id, f)| (id, f.clone()))
            .collect();
        for (id, f) in inflight {
            if f.released {
                self.send(&Packet::PubRel(PubRel::new(id)));
                continue;
            }
            let p = match &f.publish {
                Some(p) => Ok(Some(p.to_publish())),
                None => self.read_back(id, &f).await,
            };
            match p {
                Ok(Some(mut p)) => {
                    p.dup = true;
                    self.send(&Packet::Publish(p));
                }
                Err(e @ rocketgate_core::Error::Io { .. }) => {
                    // The log still has it: kept, and resent at the next resume.
                    tracing::warn!(client = %self.session.client_id, pkid = id, error = %e,
                        "reading back a message in flight failed; kept for the next resume");
                }
                Ok(None) | Err(_) => {
                    // Gone from the log (retention, a deleted topic) or unreadable.
                    tracing::warn!(client = %self.session.client_id, pkid = id,
                        "a message in flight is no longer in the log; not resent");
                    self.session.inflight.remove(&id);
                }
            }
        }
    }

    /// A log message in flight kept without its copy (see [`Inflight::publish`]),
    /// read back from the log as it was sent (`Ok(None)`: not there any more).
    async fn read_back(&self, pkid: u16, f: &Inflight) -> rocketgate_core::Result<Option<Publish>> {
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
        let r = read_log(&*self.shared.api, topic, *queue, *offset, 1, Duration::ZERO).await?;
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

    async fn current_topics(&self) -> Vec<String> {
        match self
            .shared
            .api
            .topics(rocketgate_core::broker::TopicKind::User)
            .await
        {
            Ok(t) => t.into_iter().map(|t| t.name).collect(),
            Err(_) => self.shared.router.topic_list().borrow().to_vec(),
        }
    }

    /// Follows (and POPs for) every topic the subscriptions cover, starting
    /// not-yet-followed ones per `start`.
    async fn sync_following(&mut self, topics: &[String], start: Start) {
        let mut wanted: Vec<String> = Vec::new();
        let mut shares: Vec<(Arc<str>, String)> = Vec::new();
        for sub in &self.session.subs {
            let covered: Vec<String> = match sub.filter.core_topic() {
                Some(t) => vec![t.to_owned()],
                None => topics.to_vec(),
            };
            for t in covered {
                if sub.filter.share.is_some() {
                    shares.push((Arc::from(sub.filter.raw.as_str()), t));
                } else if !wanted.contains(&t) {
                    wanted.push(t);
                }
            }
        }
        for t in wanted {
            if !self.joined.contains(t.as_str()) {
                self.follow(&t, start).await;
            }
        }
        for (raw, t) in shares {
            self.start_share(raw, t).await;
        }
    }

    async fn follow(&mut self, topic: &str, start: Start) {
        let name: Arc<str> = Arc::from(topic);
        if let Ok(config) = self.shared.api.topic(topic).await {
            for q in 0..config.read_queues {
                let key = (name.clone(), q);
                // What the core holds now, so a later change is seen as a reset.
                let core = self
                    .shared
                    .api
                    .query_offset(&self.session.group, "", topic, q)
                    .await
                    .ok()
                    .flatten();
                let at = match start {
                    Start::End => {
                        self.session.committed.insert(key.clone(), core);
                        queue_end(&*self.shared.api, topic, q).await
                    }
                    Start::Resume if self.session.cursors.contains_key(&key) => {
                        self.session.committed.entry(key.clone()).or_insert(core);
                        None
                    }
                    Start::Resume => {
                        self.session.committed.insert(key.clone(), core);
                        Some(core.unwrap_or(0))
                    }
                };
                if let Some(at) = at {
                    self.session.cursors.insert(key.clone(), at);
                }
                self.pending.insert(key);
            }
        }
        let interest = Interest::of(&self.session.subs, topic);
        let inbox = self.router_inbox();
        self.shared.router.join(topic, inbox, interest);
        self.joined.insert(name);
    }

    /// The topic list changed: follow new topics wildcard subscriptions cover.
    pub(crate) async fn on_topics(&mut self, list: &[String]) {
        if self
            .session
            .subs
            .iter()
            .any(|s| s.filter.core_topic().is_none())
        {
            self.sync_following(list, Start::Resume).await;
        }
    }

    /// Told by the router that batches were missed (or a reader started): every
    /// followed queue catches up by pulling (a QoS 0 session that overflowed
    /// skips ahead instead); topics that had no queues yet get their cursors now.
    pub(crate) async fn recheck(&mut self) {
        let joined: Vec<Arc<str>> = self.joined.iter().cloned().collect();
        for t in joined {
            if !self.session.cursors.keys().any(|(ct, _)| *ct == t) {
                self.joined.remove(&t);
                self.follow(&t, Start::Resume).await;
            }
        }
        // A QoS 0 session whose channel overflowed does not read the backlog
        // back: each queue skips to the next live batch (or to the end of the
        // queue when it is already catching up).
        let skip = self.inbox.overflowed.swap(false, Ordering::AcqRel) && self.qos0_only();
        let keys: Vec<_> = self.session.cursors.keys().cloned().collect();
        for k in keys {
            if self.joined.contains(&k.0) {
                if skip {
                    self.skipping.insert(k);
                } else {
                    self.pending.insert(k);
                }
            }
        }
    }

    pub(crate) fn on_batch(&mut self, feed: Feed) {
        let b = &*feed.batch;
        let key = (b.topic.clone(), b.queue);
        if !self.joined.contains(&b.topic) {
            return;
        }
        if self.pending.contains(&key) {
            // Catching up: rejoin the shared stream as soon as a feed covers the
            // cursor (pulling alone may never overtake a busy queue).
            let covers = self
                .session
                .cursors
                .get(&key)
                .is_some_and(|&c| feed.from <= c && c < b.next);
            if !covers || self.ready.len() >= READY_HIGH {
                return;
            }
            self.pending.remove(&key);
        }
        let Some(&cur) = self.session.cursors.get(&key) else {
            // A queue first seen now: its messages are all new to the session.
            self.session.cursors.insert(key.clone(), 0);
            self.pending.insert(key);
            return;
        };
        if b.next <= cur {
            return;
        }
        let mut cur = cur;
        // The feed covers `feed.from..b.next`: the router handed the session
        // every message of that range it may match (only those).
        if feed.from > cur && self.skipping.remove(&key) && self.qos0_only() {
            // QoS 0 only and overflowed: rejoin the live stream, dropping the gap.
            self.skipped(feed.from - cur);
            cur = feed.from;
        }
        if feed.from > cur || self.ready.len() >= READY_HIGH {
            self.pending.insert(key);
            return;
        }
        let next = b.next;
        // Matched as the window takes them (see `ready.rs`).
        self.ready.push_run(feed.batch, feed.picks, cur);
        self.session.cursors.insert(key, next);
    }

    /// True when every subscription is QoS 0: such a session may drop messages
    /// when it cannot keep up (MQTT allows it for QoS 0) instead of catching up.
    pub(crate) fn qos0_only(&self) -> bool {
        !self.session.subs.is_empty() && self.session.subs.iter().all(|s| s.qos == QoS::AtMostOnce)
    }

    /// Counts log entries a QoS 0 session skipped because it could not keep up.
    fn skipped(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        metrics::counter!("rocketgate_mqtt_qos0_skipped_total").increment(n);
        tracing::debug!(client = %self.session.client_id, entries = n, "QoS 0 subscriber too slow: skipped ahead");
    }

    /// Catches lagging cursors up by pulling, while there is room.
    pub(crate) async fn fill_ready(&mut self) {
        while self.ready.len() < READY_LOW {
            let Some(key) = self.pending.iter().next().cloned() else {
                return;
            };
            let cur = self.session.cursors.get(&key).copied().unwrap_or(0);
            if !self.skipping.contains(&key)
                && let Some(b) = self.shared.router.recent(&key.0, key.1, cur)
            {
                // Near the end: what the router read lately, shared with every
                // session behind it, instead of a read of the log of our own.
                let next = b.next;
                self.ready.push_run(b, None, cur);
                self.session.cursors.insert(key.clone(), next);
                self.far_behind = false;
                continue;
            }
            let r = read_log(
                &*self.shared.api,
                &key.0,
                key.1,
                cur,
                PULL_BATCH,
                Duration::ZERO,
            )
            .await;
            match r {
                Ok(r) => {
                    if self.skipping.remove(&key) && self.qos0_only() && r.max_offset > cur {
                        // QoS 0 only and overflowed: drop the backlog, go on live.
                        self.skipped(r.max_offset - cur);
                        self.session.cursors.insert(key.clone(), r.max_offset);
                        self.pending.remove(&key);
                        continue;
                    }
                    if !r.messages.is_empty() {
                        let batch = batch_of(key.0.clone(), key.1, cur, r.next_offset, r.messages);
                        self.ready.push_run(Arc::new(batch), None, cur);
                    }
                    self.session.cursors.insert(key.clone(), r.next_offset);
                    self.far_behind = r.max_offset.saturating_sub(r.next_offset) > FAR_BEHIND;
                    let done =
                        r.status == PullStatus::NoNewMessage || r.next_offset >= r.max_offset;
                    if done || r.next_offset == cur && r.status != PullStatus::Found {
                        self.pending.remove(&key);
                    }
                }
                Err(e) => {
                    tracing::debug!(topic = %key.0, queue = key.1, error = %e, "catch-up pull failed");
                    self.pending.remove(&key);
                }
            }
        }
    }

    /// Writes ready messages while the client's window has room.
    pub(crate) fn pump(&mut self) {
        let window = self.client_receive_max;
        loop {
            let full = self.session.inflight.len() >= window;
            if full
                && self
                    .ready
                    .front_one()
                    .is_some_and(|r| r.publish.qos != QoS::AtMostOnce)
            {
                break;
            }
            let matcher = Matcher {
                subs: &self.session.subs,
                client_id: &self.session.client_id,
                v5: self.version == Version::V5,
            };
            let Some(mut r) = self.ready.pop_with(|b, i| matcher.matched(b, i)) else {
                break;
            };
            if r.publish.qos != QoS::AtMostOnce {
                if full {
                    // (A run's next message: known only now.)
                    self.ready.push_front(r);
                    break;
                }
                match self.session.alloc_pkid() {
                    Some(id) => r.publish.pkid = id,
                    None => {
                        self.ready.push_front(r);
                        break;
                    }
                }
            }
            if self.version == Version::V5
                && (r.publish.properties.is_some() || self.client_alias_max > 0)
            {
                // Properties or an alias: mqttbytes encodes it. The packet is made
                // once, for the size check, the alias and the write.
                let mut wire = r.publish.to_publish();
                if self.client_max_packet != usize::MAX && wire.len() + 5 > self.client_max_packet {
                    // Larger than the client accepts: discarded for this client (MQTT 5 §3.1.2.11.4).
                    self.settle(r.source);
                    continue;
                }
                if let Some((alias, known)) = self.outgoing_alias(&r.publish.topic) {
                    if known {
                        wire.topic.clear();
                    }
                    wire.properties.get_or_insert_with(empty_props).topic_alias = Some(alias);
                }
                self.send(&Packet::Publish(wire));
            } else {
                // 3.1.1, or v5 without properties: straight from its parts.
                let too_large = self.client_max_packet != usize::MAX
                    && crate::codec::outgoing_len(self.version, &r.publish)
                        > self.client_max_packet;
                if too_large {
                    // (Only v5 clients announce a maximum.)
                    self.settle(r.source);
                    continue;
                }
                if let Err(e) =
                    crate::codec::write_outgoing(self.version, &r.publish, &mut self.out)
                {
                    tracing::warn!(error = %e, "encoding a publish failed");
                }
            }
            if r.publish.qos == QoS::AtMostOnce {
                self.settle(r.source);
            } else {
                self.session
                    .inflight
                    .insert(r.publish.pkid, Inflight::of(r.publish, r.source));
            }
        }
    }

    /// The alias for a topic towards the client: `(alias, already known to it)`.
    fn outgoing_alias(&mut self, topic: &str) -> Option<(u16, bool)> {
        if self.client_alias_max == 0 || self.version != Version::V5 {
            return None;
        }
        let aliases = &mut self.aliases.get_or_insert_default().outgoing;
        if let Some(a) = aliases.get(topic) {
            return Some((*a, true));
        }
        let next = aliases.len() + 1;
        if next > usize::from(self.client_alias_max) {
            return None;
        }
        let a = next as u16;
        aliases.insert(topic.to_owned(), a);
        Some((a, false))
    }

    fn settle(&mut self, source: Source) {
        if let Source::Share {
            link,
            queue,
            offset,
        } = source
        {
            self.settle_shared(link, queue, offset);
        }
    }

    pub(crate) fn on_ack(&mut self, pkid: u16, comp: bool) {
        let matches = match self.session.inflight.get(&pkid) {
            Some(f) => f.released == comp || !comp,
            None => false,
        };
        if matches && let Some(f) = self.session.inflight.remove(&pkid) {
            self.settle(f.source);
        }
    }

    pub(crate) async fn on_subscribe(&mut self, s: Subscribe) -> Option<End> {
        let v5 = self.version == Version::V5;
        if s.filters.is_empty() {
            return Some(End::protocol("SUBSCRIBE without a topic filter"));
        }
        let id = s.properties.as_ref().and_then(|p| p.id);
        if id == Some(0) {
            return Some(End::protocol("subscription identifier 0"));
        }
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
                    self.session.subs.push(sub.clone());
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
            ack.properties = self.reason(reasons.join("; ")).map(|r| SubAckProperties {
                reason_string: Some(r),
                user_properties: Vec::new(),
            });
        }
        self.send(&Packet::SubAck(ack));
        if !added.is_empty() {
            let topics = self.current_topics().await;
            self.sync_following(&topics, Start::End).await;
            self.refresh_interest();
            for (sub, existed) in &added {
                let send = sub.filter.share.is_none()
                    && (sub.retain_handling == 0 || (sub.retain_handling == 1 && !*existed));
                if send {
                    self.queue_retained(sub);
                }
            }
            self.save_session();
        }
        None
    }

    fn queue_retained(&mut self, sub: &Sub) {
        let now = message::now_ms();
        let v5 = self.version == Version::V5;
        let matching: Vec<(String, crate::state::Retained)> = {
            let r = crate::server::lock(&self.shared.retained);
            r.iter()
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
            });
        }
    }

    pub(crate) async fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut ack = UnsubAck::new(u.pkid);
        for f in &u.filters {
            let before = self.session.subs.len();
            self.session.subs.retain(|s| s.filter.raw != *f);
            ack.reasons.push(if self.session.subs.len() < before {
                UnsubAckReason::Success
            } else {
                UnsubAckReason::NoSubscriptionExisted
            });
            self.leave_shares_of(f).await;
        }
        // Stop following topics no plain subscription covers any more.
        let joined: Vec<Arc<str>> = self.joined.iter().cloned().collect();
        for t in joined {
            if !self.session.follows(&t) {
                self.shared.router.leave(&t, self.inbox.id);
                self.joined.remove(&t);
                self.pending.retain(|(pt, _)| *pt != t);
                self.skipping.retain(|(pt, _)| *pt != t);
                self.session.cursors.retain(|(ct, _), _| *ct != t);
                self.session.committed.retain(|(ct, _), _| *ct != t);
            }
        }
        self.refresh_interest();
        self.send(&Packet::UnsubAck(ack));
        self.save_session();
    }

    fn save_session(&self) {
        self.shared.save_if_kept(&self.session);
    }

    /// Where each followed queue is settled up to: the cursor, or the oldest
    /// message of it still waiting or in flight.
    pub(crate) fn positions(&self) -> HashMap<(Arc<str>, u32), u64> {
        let mut pos = self.session.cursors.clone();
        let sources = self
            .session
            .inflight
            .values()
            .filter_map(|f| match &f.source {
                Source::Log {
                    topic,
                    queue,
                    offset,
                } => Some((topic, *queue, *offset)),
                _ => None,
            })
            .chain(self.ready.log_positions());
        for (topic, queue, offset) in sources {
            let e = pos.entry((topic.clone(), queue)).or_insert(offset);
            *e = (*e).min(offset);
        }
        pos
    }

    /// Commits the settled positions as the session group's core offsets.
    pub(crate) async fn commit(&mut self) {
        if self.session.expiry == 0 {
            return;
        }
        self.adopt_resets().await;
        for ((topic, q), offset) in self.positions() {
            if self.session.committed.get(&(topic.clone(), q)) == Some(&Some(offset)) {
                continue;
            }
            match self
                .shared
                .api
                .commit_offset(&self.session.group, "", &topic, q, offset)
                .await
            {
                Ok(()) => {
                    self.session.committed.insert((topic, q), Some(offset));
                }
                Err(e) => {
                    tracing::debug!(topic = %topic, queue = q, error = %e, "committing an offset failed")
                }
            }
        }
    }

    /// Leaves the router and stops shared-subscription POPs; messages not yet
    /// sent go back to the cursors (they are read again on resumption).
    pub(crate) async fn detach(&mut self) {
        self.commit().await;
        let ready = self.ready.take();
        for (topic, queue, offset) in ready.log_positions() {
            let c = self
                .session
                .cursors
                .entry((topic.clone(), queue))
                .or_insert(offset);
            *c = (*c).min(offset);
        }
        // In-flight log messages stay in the session (resent on resumption); the
        // cursors above already point past them, so they are not read twice.
        // Shared messages in flight go to the group's other members.
        for t in std::mem::take(&mut self.joined) {
            self.shared.router.leave(&t, self.inbox.id);
        }
        self.skipping.clear();
        self.leave_all_shares().await;
    }
}

pub(crate) fn min_qos(a: QoS, b: QoS) -> QoS {
    if (a as u8) <= (b as u8) { a } else { b }
}

/// What matching a log message for a session needs of it (borrowed apart from
/// its ready queue, which the messages are taken from).
struct Matcher<'a> {
    subs: &'a [Sub],
    client_id: &'a str,
    v5: bool,
}

impl Matcher<'_> {
    /// Message `i` of `b` for every plain subscription it matches: once, at the
    /// highest granted QoS, with every subscription identifier (`None`: none
    /// matches, or it expired).
    fn matched(&self, b: &Batch, i: usize) -> Option<Ready> {
        let d = b.messages.get(i)?;
        // (Batches made by `batch_of` have every name.)
        let name = match b.names.get(i) {
            Some(n) => n.clone()?,
            None => mqtt_name(d)?,
        };
        let head = b.heads.get(i).and_then(Option::as_ref);
        let mut grant = Grant::of(self.subs, &name, false);
        grant.qos?;
        let no_local = grant.no_local;
        let v5 = self.v5;
        let mut props = empty_props();
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
                    message::read_meta(view.properties(), v5.then_some(&mut props)),
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
        props.message_expiry_interval = expiry;
        props.subscription_identifiers = ids;
        let publish = Outgoing {
            dup: false,
            qos,
            retain: rap && meta.retain,
            topic: name,
            pkid: 0,
            payload,
            // (A v5 delivery without any is encoded without mqttbytes.)
            properties: (v5 && !message::no_properties(&props)).then(|| Box::new(props)),
        };
        Some(Ready {
            publish,
            source: Source::Log {
                topic: b.topic.clone(),
                queue: b.queue,
                offset: d.queue_offset,
            },
        })
    }
}

/// What a session's plain subscriptions matching a name grant a message: the
/// highest QoS, every subscription identifier, retain-as-published from any.
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
