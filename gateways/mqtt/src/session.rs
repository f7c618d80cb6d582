//! A session: what outlives a connection (subscriptions, cursors in the log,
//! in-flight messages, QoS 2 ids awaiting PUBREL, the will).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use mqttbytes::QoS;
use mqttbytes::v5::{Publish, PublishProperties};

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
        link: Arc<crate::share::Link>,
        queue: u32,
        offset: u64,
    },
    /// A retained message.
    Retained,
    /// A log message read before an offset reset moved its queue: delivering or
    /// acknowledging it no longer says anything about the session's position.
    Superseded,
}

/// An outgoing PUBLISH as a session holds it until it is written and
/// acknowledged. Not mqttbytes' `Publish`: that one carries its v5 properties
/// inline (144 of its 208 bytes, for 3.1.1 clients too) and owns its topic name,
/// and a session holds up to its window plus the ready queue of these — with a
/// thousand subscribers behind a fan-out, most of the broker's memory. The topic
/// name is shared with the batch it came in (one per message, not per session).
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub topic: Arc<str>,
    pub payload: Bytes,
    /// v5 only.
    pub properties: Option<Box<PublishProperties>>,
    pub pkid: u16,
    pub qos: QoS,
    pub retain: bool,
    pub dup: bool,
}

impl Outgoing {
    /// The packet in mqttbytes' form (for v5 encoding, aliases, resending).
    pub fn to_publish(&self) -> Publish {
        Publish {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: self.topic.to_string(),
            pkid: self.pkid,
            payload: self.payload.clone(),
            properties: self.properties.as_deref().cloned(),
        }
    }
}

/// An outgoing QoS 1/2 message not yet fully acknowledged.
#[derive(Debug, Clone)]
pub struct Inflight {
    pub publish: Outgoing,
    /// PUBREC received, PUBREL sent: waiting for PUBCOMP.
    pub released: bool,
    pub source: Source,
}

pub struct Session {
    pub client_id: String,
    /// The core group holding the session's offsets.
    pub group: String,
    /// Seconds the session outlives its connection (`u32::MAX`: forever).
    pub expiry: u32,
    pub subs: Vec<Sub>,
    /// Next offset to look at, per (core topic, queue), for plain subscriptions.
    pub cursors: HashMap<(Arc<str>, u32), u64>,
    /// Cursors loaded from the core must be read back for these topics (after a restart).
    pub restore_cursors: bool,
    /// The core offset of each followed queue as this session last wrote or read
    /// it (`None`: the core had none): a different value in the core means someone
    /// else (an admin reset) moved the session, and the session adopts it
    /// (`offsets.rs`).
    pub committed: HashMap<(Arc<str>, u32), Option<u64>>,
    pub inflight: BTreeMap<u16, Inflight>,
    pub qos2_in: HashSet<u16>,
    pub will: Option<WillRecord>,
    pub next_pkid: u16,
}

impl Session {
    pub fn new(client_id: &str, expiry: u32) -> Session {
        Session {
            client_id: client_id.to_owned(),
            group: session_group(client_id),
            expiry,
            subs: Vec::new(),
            cursors: HashMap::new(),
            restore_cursors: false,
            committed: HashMap::new(),
            inflight: BTreeMap::new(),
            qos2_in: HashSet::new(),
            will: None,
            next_pkid: 1,
        }
    }

    pub fn from_record(r: &SessionRecord) -> Session {
        let mut s = Session::new(&r.client_id, r.expiry);
        for sub in &r.subscriptions {
            match TopicFilter::parse(&sub.filter) {
                Ok(filter) => s.subs.push(Sub {
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
        s.qos2_in = r.qos2_incoming.iter().copied().collect();
        s.will = r.will.clone();
        s.restore_cursors = true;
        s
    }

    pub fn record(&self) -> SessionRecord {
        SessionRecord {
            client_id: self.client_id.clone(),
            expiry: self.expiry,
            subscriptions: self.subs.iter().map(Sub::record).collect(),
            will: self.will.clone(),
            qos2_incoming: self.qos2_in.iter().copied().collect(),
        }
    }

    /// A free packet id for an outgoing message.
    pub fn alloc_pkid(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            let id = self.next_pkid;
            self.next_pkid = if id == u16::MAX { 1 } else { id + 1 };
            if !self.inflight.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// True when a plain subscription may match messages of `topic`.
    pub fn follows(&self, topic: &str) -> bool {
        self.subs
            .iter()
            .any(|s| s.filter.share.is_none() && s.filter.core_topic().is_none_or(|t| t == topic))
    }
}
