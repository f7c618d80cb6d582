//! A session: what outlives a connection (subscriptions, cursors in the log,
//! in-flight messages, QoS 2 ids awaiting PUBREL, the will).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use mqttbytes::QoS;

use crate::meters::Stored;
use crate::outgoing::Outgoing;
use crate::router::Interest;
use crate::share::Link;
use crate::state::{SessionRecord, SubRecord, WillRecord, qos_of, session_group};
use crate::topic::TopicFilter;

/// One subscription.
#[derive(Debug, Clone)]
pub struct Sub {
    pub filter: TopicFilter,
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: u8,
    pub id: Option<usize>,
}

impl Sub {
    pub fn record(&self) -> SubRecord {
        SubRecord {
            filter: self.filter.raw.clone(),
            qos: self.qos as u8,
            no_local: self.no_local,
            retain_as_published: self.retain_as_published,
            retain_handling: self.retain_handling,
            id: self.id,
        }
    }
}

/// Where an outgoing message came from (what its acknowledgement settles).
#[derive(Debug, Clone)]
pub enum Source {
    /// A plain subscription's read of the log.
    Log {
        topic: Arc<str>,
        queue: u32,
        offset: u64,
    },
    /// A shared subscription's group: settled through this link.
    Share {
        link: Arc<Link>,
        queue: u32,
        offset: u64,
    },
    /// A retained message.
    Retained,
    /// A log message read before an offset reset moved its queue: delivering or
    /// acknowledging it no longer says anything about the session's position
    /// (where it is in the log is kept, to read it back for a resend).
    Superseded {
        topic: Arc<str>,
        queue: u32,
        offset: u64,
    },
}

/// An outgoing QoS 1/2 message not yet fully acknowledged.
#[derive(Debug, Clone)]
pub struct Inflight {
    /// The message as sent; `None` for a 3.1.1 delivery of a log message, which
    /// is read back from the log should it have to go again (a resumed session).
    /// A full window of 1,024 copies was ~100 KiB per session (a thousand
    /// fan-out subscribers behind: 100 MiB); without them it is 48 KiB.
    pub publish: Option<Box<Outgoing>>,
    pub source: Source,
    pub qos: QoS,
    pub retain: bool,
    /// PUBREC received, PUBREL sent: waiting for PUBCOMP.
    pub released: bool,
    /// When the message was stored: a resend is a delivery-latency sample too.
    /// (4 bytes: in what was padding.)
    pub stored: Stored,
}

impl Inflight {
    /// `publish` as sent, from `source`: kept whole unless the log has all of
    /// it (a v5 delivery's properties, a retained or a shared message are kept).
    pub fn of(publish: Outgoing, source: Source, stored: Stored) -> Inflight {
        let from_log = matches!(source, Source::Log { .. }) && publish.properties.is_none();
        Inflight {
            qos: publish.qos,
            retain: publish.retain,
            released: false,
            stored,
            publish: (!from_log).then(|| Box::new(publish)),
            source,
        }
    }
}

/// The packet ids of QoS 2 messages received and not yet released: a set made on
/// the first one (8 bytes in every session instead of a 48-byte empty set; most
/// clients never publish at QoS 2, and the session's 280 bytes then fit the
/// allocator's 256-byte class instead of its 320, see `tests/idle_memory.rs`).
#[derive(Debug, Default)]
// The box is the point: 8 bytes while empty, the set's 48 once used.
#[allow(clippy::box_collection)]
pub struct Qos2In(Option<Box<HashSet<u16>>>);

impl Qos2In {
    pub fn insert(&mut self, id: u16) {
        self.0.get_or_insert_default().insert(id);
    }

    /// `false` when `id` was not there.
    pub fn remove(&mut self, id: u16) -> bool {
        self.0.as_mut().is_some_and(|s| s.remove(&id))
    }

    pub fn contains(&self, id: u16) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(&id))
    }

    pub fn count(&self) -> usize {
        self.0.as_ref().map_or(0, |s| s.len())
    }

    /// The ids, sorted (as saved in the session record).
    pub fn ids(&self) -> Vec<u16> {
        let mut ids: Vec<u16> = self.0.iter().flat_map(|s| s.iter().copied()).collect();
        ids.sort_unstable();
        ids
    }
}

pub struct Session {
    pub client_id: String,
    /// The core group holding the session's offsets.
    pub group: String,
    /// Seconds the session outlives its connection (`u32::MAX`: forever).
    pub expiry: u32,
    pub subs: Vec<Sub>,
    /// Next offset to look at, per (core topic, queue), for plain subscriptions.
    /// foldhash, as every map looked up per message (router.rs, `Members`).
    pub cursors: foldhash::HashMap<(Arc<str>, u32), u64>,
    /// Cursors loaded from the core must be read back for these topics (after a restart).
    pub restore_cursors: bool,
    /// The core offset of each followed queue as this session last wrote or read
    /// it (`None`: the core had none): a different value in the core means someone
    /// else (an admin reset) moved the session, and the session adopts it
    /// (`follow/offsets.rs`).
    pub committed: foldhash::HashMap<(Arc<str>, u32), Option<u64>>,
    pub inflight: InflightMap,
    /// QoS 2 messages received and stored, waiting for their PUBREL.
    pub qos2_in: Qos2In,
    /// Boxed: most sessions have none, and the record is ~170 bytes (memory per
    /// idle connection, `tests/idle_memory.rs`).
    pub will: Option<Box<WillRecord>>,
    /// The id after the last one handed out (see [`Session::alloc_pkid`]).
    next_pkid: u16,
    /// What the connection holding the session may do: set at each CONNECT,
    /// cleared when the connection ends, never saved (`None`: not connected).
    pub access: Option<Box<Access>>,
    /// While connected: what the admin API shows of it (see [`Card`]).
    pub card: Option<Arc<Card>>,
    /// A subscription with a wildcard was added (see [`Session::push_sub`]): the
    /// connection then watches the topic list for new topics it covers.
    patterns: bool,
}

/// A connected session as the admin API shows it (`GET /v1/mqtt/sessions`):
/// kept beside its registry entry, refreshed at CONNECT, at each
/// (UN)SUBSCRIBE and once a second (in-flight count), never on the message path.
#[derive(Debug)]
pub struct Card {
    pub peer: std::net::SocketAddr,
    /// Unix ms of the CONNECT.
    pub since_ms: i64,
    /// 4 (3.1.1) or 5.
    pub protocol_version: u8,
    pub clean_start: bool,
    pub user: String,
    pub live: std::sync::Mutex<CardLive>,
}

/// The parts of a [`Card`] that change while connected.
#[derive(Debug, Clone, Default)]
pub struct CardLive {
    /// (filter, QoS)
    pub subscriptions: Vec<(String, u8)>,
    /// At most 65,535 (one per packet id). 32 bits: the [`Card`] with its `Arc`
    /// then fits the allocator's 128-byte class (136 bytes took a 160-byte one).
    pub inflight: u32,
    pub expiry: u32,
}

/// A connection's identity and ACL decisions, and its place in the limit of
/// connections per address.
#[derive(Debug)]
pub struct Access {
    pub user: String,
    pub grant: rocketgate_auth::Grant,
    /// A JWT's expiry: the connection ends then.
    pub expires_at: Option<std::time::SystemTime>,
    pub _slot: rocketgate_auth::ConnectionSlot,
    /// The `$SYS` generation this connection has sent (see `sys.rs`).
    pub sys_seen: u64,
    /// Enhanced authentication (MQTT 5 section 4.12), when CONNECT named a method.
    pub enhanced: Option<Box<Enhanced>>,
}

/// A connection's enhanced authentication: its method (a re-authentication must
/// use the same, MQTT-4.12.1-1) and a re-authentication in progress.
#[derive(Debug)]
pub struct Enhanced {
    pub method: String,
    /// The exchange waiting for the client's next AUTH, and its deadline.
    pub pending: Option<(rocketgate_auth::scram::Exchange, std::time::Instant)>,
}

impl Session {
    /// May the connection publish to `name`? (Not connected: no.)
    pub fn may_publish(&self, name: &str) -> bool {
        self.access
            .as_ref()
            .is_some_and(|a| a.grant.may_publish(name))
    }

    /// May the connection subscribe to `filter` (as share group `group`)?
    pub fn may_subscribe(&self, filter: &str, group: Option<&str>) -> bool {
        self.access
            .as_ref()
            .is_some_and(|a| a.grant.may_subscribe(filter, group))
    }
}

impl Session {
    pub fn new(client_id: &str, expiry: u32) -> Session {
        Session {
            client_id: client_id.to_owned(),
            group: session_group(client_id),
            expiry,
            subs: Vec::new(),
            cursors: Default::default(),
            restore_cursors: false,
            committed: Default::default(),
            inflight: InflightMap::default(),
            qos2_in: Qos2In::default(),
            will: None,
            next_pkid: 1,
            access: None,
            card: None,
            patterns: false,
        }
    }

    /// Adds a subscription (the caller has checked that none has its filter).
    pub fn push_sub(&mut self, sub: Sub) {
        self.patterns |= sub.filter.core_topic().is_none();
        self.subs.push(sub);
    }

    /// Has a subscription with a wildcard ever been added? (Sticky: a session
    /// that had one keeps watching the topic list, which costs it nothing more.)
    pub fn follows_patterns(&self) -> bool {
        self.patterns
    }

    pub fn from_record(r: &SessionRecord) -> Session {
        let mut s = Session::new(&r.client_id, r.expiry);
        for sub in &r.subscriptions {
            match TopicFilter::parse(&sub.filter) {
                Ok(filter) => s.push_sub(Sub {
                    filter,
                    qos: qos_of(sub.qos),
                    no_local: sub.no_local,
                    retain_as_published: sub.retain_as_published,
                    retain_handling: sub.retain_handling,
                    id: sub.id,
                }),
                Err(e) => {
                    tracing::warn!(client = %r.client_id, error = %e, "dropping a stored subscription")
                }
            }
        }
        for &id in &r.qos2_incoming {
            s.qos2_in.insert(id);
        }
        s.will = r.will.clone().map(Box::new);
        s.restore_cursors = true;
        s
    }

    pub fn record(&self) -> SessionRecord {
        SessionRecord {
            client_id: self.client_id.clone(),
            expiry: self.expiry,
            subscriptions: self.subs.iter().map(Sub::record).collect(),
            will: self.will.as_deref().cloned(),
            qos2_incoming: self.qos2_in.ids(),
        }
    }

    /// Copies the subscriptions, in-flight count and expiry into the card.
    pub fn refresh_card(&self) {
        if let Some(card) = &self.card {
            let mut live = rocketgate_core::sync::lock(&card.live);
            live.subscriptions = self
                .subs
                .iter()
                .map(|s| (s.filter.raw.clone(), s.qos as u8))
                .collect();
            live.inflight = self.inflight.len() as u32;
            live.expiry = self.expiry;
        }
    }

    /// Only the in-flight count into the card (each second).
    pub fn refresh_inflight(&self) {
        if let Some(card) = &self.card {
            rocketgate_core::sync::lock(&card.live).inflight = self.inflight.len() as u32;
        }
    }

    /// A free packet id for an outgoing message: the one after the newest in
    /// flight (ids go out in order, so the in-flight ids stay one run).
    pub fn alloc_pkid(&mut self) -> Option<u16> {
        let id = self.inflight.next_free().unwrap_or(self.next_pkid);
        if self.inflight.contains_key(&id) {
            return None; // every id is in flight
        }
        self.next_pkid = pkid_after(id, 1);
        Some(id)
    }

    /// What the plain subscriptions want of core topic `topic` (told to the
    /// router, so the session is handed only what it may match).
    pub fn interest(&self, topic: &str) -> Interest {
        let mut names: Vec<Box<str>> = Vec::new();
        for s in &self.subs {
            if s.filter.share.is_some() || s.filter.core_topic().is_some_and(|t| t != topic) {
                continue;
            }
            match s.filter.exact_name() {
                Some(n) if !names.iter().any(|x| **x == *n) => names.push(n.into()),
                Some(_) => {}
                None => return Interest::All,
            }
        }
        Interest::Names(names)
    }

    /// True when every subscription is QoS 0: such a session may drop messages
    /// when it cannot keep up (MQTT allows it for QoS 0) instead of catching up.
    pub fn qos0_only(&self) -> bool {
        !self.subs.is_empty() && self.subs.iter().all(|s| s.qos == QoS::AtMostOnce)
    }

    /// True when a plain subscription may match messages of `topic`.
    pub fn follows(&self, topic: &str) -> bool {
        self.subs
            .iter()
            .any(|s| s.filter.share.is_none() && s.filter.core_topic().is_none_or(|t| t == topic))
    }
}

/// Packet ids run 1..=65535 and then wrap to 1 (0 is not an id).
const PKIDS: usize = u16::MAX as usize;

/// The id `n` places after `id` in the wrapping 1..=65535 sequence.
fn pkid_after(id: u16, n: usize) -> u16 {
    ((usize::from(id.max(1)) - 1 + n) % PKIDS + 1) as u16
}

/// The messages in flight to a client, by packet id, in the order they were
/// sent. Ids are allocated one after another ([`Session::alloc_pkid`]), so the
/// ids in flight form one run from the oldest unacknowledged one: a ring of
/// slots indexed by the distance from it, where an acknowledgement empties a
/// slot and the ring drops the empty slots at its ends. Look-up, insertion
/// and removal are O(1), and the order is the send order for a resume (a
/// `BTreeMap` cost ~4 % of the broker's CPU in point-to-point runs, in its
/// rebalancing on removal).
#[derive(Debug, Default, Clone)]
pub struct InflightMap {
    /// The packet id of `slots[0]`.
    first: u16,
    slots: VecDeque<Option<Inflight>>,
    len: usize,
}

impl InflightMap {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn index(&self, pkid: u16) -> Option<usize> {
        if pkid == 0 || self.slots.is_empty() {
            return None;
        }
        let d = (usize::from(pkid) + PKIDS - usize::from(self.first)) % PKIDS;
        (d < self.slots.len()).then_some(d)
    }

    /// The id after the newest slot (`None` when empty).
    fn next_free(&self) -> Option<u16> {
        (!self.is_empty()).then(|| pkid_after(self.first, self.slots.len()))
    }

    pub fn contains_key(&self, pkid: &u16) -> bool {
        self.get(pkid).is_some()
    }

    pub fn get(&self, pkid: &u16) -> Option<&Inflight> {
        self.slots.get(self.index(*pkid)?)?.as_ref()
    }

    pub fn get_mut(&mut self, pkid: &u16) -> Option<&mut Inflight> {
        let i = self.index(*pkid)?;
        self.slots.get_mut(i)?.as_mut()
    }

    /// Puts `f` under `pkid` (0 is ignored: not a packet id). An id past the
    /// newest extends the run with empty slots up to it.
    pub fn insert(&mut self, pkid: u16, f: Inflight) -> Option<Inflight> {
        if pkid == 0 {
            return None;
        }
        if self.slots.is_empty() {
            self.first = pkid;
        }
        let d = (usize::from(pkid) + PKIDS - usize::from(self.first)) % PKIDS;
        while self.slots.len() <= d {
            self.slots.push_back(None);
        }
        let old = self.slots[d].replace(f);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, pkid: &u16) -> Option<Inflight> {
        let i = self.index(*pkid)?;
        let f = self.slots[i].take()?;
        self.len -= 1;
        self.trim();
        Some(f)
    }

    /// Drops the empty slots at both ends.
    fn trim(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.first = pkid_after(self.first, 1);
        }
        while let Some(None) = self.slots.back() {
            self.slots.pop_back();
        }
        if self.slots.is_empty() && self.slots.capacity() > 64 {
            // A window that emptied gives its memory back (not one that only
            // shrank: a busy window swings between a few and a thousand
            // messages, and shrinking each time would copy it back and forth).
            self.slots = VecDeque::new();
        }
    }

    /// In send order.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &Inflight)> {
        let first = self.first;
        self.slots
            .iter()
            .enumerate()
            .filter_map(move |(i, s)| Some((pkid_after(first, i), s.as_ref()?)))
    }

    pub fn values(&self) -> impl Iterator<Item = &Inflight> {
        self.slots.iter().flatten()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Inflight> {
        self.slots.iter_mut().flatten()
    }

    pub fn retain(&mut self, mut keep: impl FnMut(u16, &mut Inflight) -> bool) {
        let first = self.first;
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(f) = slot
                && !keep(pkid_after(first, i), f)
            {
                *slot = None;
                self.len -= 1;
            }
        }
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn f(n: u8) -> Inflight {
        Inflight::of(
            Outgoing {
                topic: Arc::from("t"),
                payload: Bytes::from(vec![n]),
                properties: None,
                pkid: 0,
                qos: QoS::AtLeastOnce,
                retain: false,
                dup: false,
            },
            Source::Retained,
            Stored::NONE,
        )
    }

    #[test]
    fn the_store_stamp_costs_an_inflight_message_no_bytes() {
        // (A full window of a thousand sessions is this times 1,024 each.)
        assert!(
            std::mem::size_of::<Inflight>() <= 48,
            "{}",
            std::mem::size_of::<Inflight>()
        );
    }

    fn ids(m: &InflightMap) -> Vec<u16> {
        m.iter().map(|(id, _)| id).collect()
    }

    #[test]
    fn ids_go_out_in_order_and_acks_in_any_order_free_them() {
        let mut s = Session::new("c", 0);
        let a: Vec<u16> = (0..5).map(|_| s.alloc_pkid().unwrap()).collect();
        assert_eq!(a, [1, 2, 3, 4, 5]);
        for (i, id) in a.iter().enumerate() {
            s.inflight.insert(*id, f(i as u8));
        }
        assert_eq!(s.inflight.len(), 5);
        assert_eq!(
            s.inflight.remove(&3).unwrap().publish.unwrap().payload[..],
            [2]
        );
        assert!(s.inflight.remove(&3).is_none(), "acked twice");
        assert_eq!(ids(&s.inflight), [1, 2, 4, 5]);
        s.inflight.remove(&1);
        s.inflight.remove(&2);
        assert_eq!(ids(&s.inflight), [4, 5]);
        assert_eq!(s.alloc_pkid(), Some(6));
        assert!(s.inflight.get(&9).is_none() && s.inflight.get(&0).is_none());
        s.inflight.get_mut(&5).unwrap().released = true;
        assert!(s.inflight.get(&5).unwrap().released);
        s.inflight.remove(&4);
        s.inflight.remove(&5);
        assert!(s.inflight.is_empty());
        assert_eq!(
            s.alloc_pkid(),
            Some(7),
            "ids keep counting when nothing is in flight"
        );
    }

    #[test]
    fn ids_wrap_past_65535_to_1_keeping_the_send_order() {
        let mut s = Session::new("c", 0);
        s.next_pkid = 65534;
        let a: Vec<u16> = (0..4).map(|_| s.alloc_pkid().unwrap()).collect();
        assert_eq!(a, [65534, 65535, 1, 2]);
        for id in &a {
            s.inflight.insert(*id, f(0));
        }
        assert_eq!(ids(&s.inflight), [65534, 65535, 1, 2]);
        s.inflight.remove(&65535);
        assert_eq!(ids(&s.inflight), [65534, 1, 2]);
        s.inflight.retain(|id, _| id != 65534);
        assert_eq!(ids(&s.inflight), [1, 2]);
        assert_eq!(s.inflight.values().count(), 2);
        assert_eq!(s.alloc_pkid(), Some(3));
    }

    #[test]
    fn an_emptied_window_gives_its_memory_back() {
        let mut m = InflightMap::default();
        for id in 1..=1000 {
            m.insert(id, f(0));
        }
        for id in 1..=900 {
            m.remove(&id);
        }
        assert!(
            m.slots.capacity() >= 1000,
            "a window that only shrank keeps its room"
        );
        for id in 901..=1000 {
            m.remove(&id);
        }
        assert!(m.is_empty() && m.slots.capacity() == 0);
    }

    #[test]
    fn a_full_window_of_ids_allocates_none() {
        let mut s = Session::new("c", 0);
        for _ in 0..PKIDS {
            let id = s.alloc_pkid().unwrap();
            s.inflight.insert(id, f(0));
        }
        assert_eq!(s.inflight.len(), PKIDS);
        assert_eq!(s.alloc_pkid(), None);
        s.inflight.remove(&100);
        assert_eq!(
            s.alloc_pkid(),
            None,
            "only the id after the newest is handed out"
        );
        s.inflight.remove(&1);
        assert_eq!(s.alloc_pkid(), Some(1));
    }
}
