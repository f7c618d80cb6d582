//! Shared subscriptions (`$share/<g>/<filter>`): each message to one member of
//! the group, fed from the router's live batches.
//!
//! One task per (core group, core topic) on this node, a [`Group`] (`group.rs`): an actor fed
//! by one command channel (joins, settlements, leaves) and by the router like a
//! session. It keeps one cursor per core queue, matches each message against the
//! group's filter once (the router already worked out the MQTT name), and hands
//! the matching ones out round-robin to members that have credit, one `Vec` per
//! member per router batch. Every message handed out is kept (a `Bytes` of the
//! stored record) until its member settles it (PUBACK / PUBCOMP, sent at QoS 0,
//! or discarded); the lowest unsettled offset of each queue is committed as the
//! consumer offset of the core clustering group `mqtt%s%<g>/<filter>`, so a
//! restart resumes there (at-least-once for what was in flight). A member that
//! leaves (disconnect, unsubscribe, take-over) gives back what it had not
//! settled, and that goes to the other members. When the last member leaves,
//! the task commits and ends; the next member starts a new one at the committed
//! offsets.
//!
//! A group falls back to pulling from the log (like a session that lagged) when
//! it missed router batches or its members have no credit left, so a slow group
//! never holds more than a bounded number of messages and never holds up the
//! router's reader; while it reads back, the router sees its channel overflow
//! and pauses the publishers, unless its members' clients are the slow ones. A
//! group whose members all take QoS 0 does not read back what its overflowing
//! channel dropped: it rejoins the live stream, as a QoS 0 session does.
//! This file is a connection's side: joining, turning offers into PUBLISHes,
//! settling, leaving. Why this and not the core's POP is in docs/mqtt.md
//! ("Shared subscriptions").

mod group;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mqttbytes::QoS;
use rocketgate_core::broker::MessagingApi;
use rocketgate_core::store::RecordView;
use tokio::sync::{mpsc, oneshot};

use self::group::Group;
use crate::codec::Version;
use crate::conn::Conn;
use crate::deliver::{Ready, min_qos};
use crate::message::{self, empty_props};
use crate::server::{Shared, lock};
use crate::session::Source;
use crate::state::share_group;
use crate::topic::TopicFilter;

/// How long a member waits for its group to take a join or a leave.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// (core group, core topic).
type Key = (String, Arc<str>);

/// The group tasks of this node. One short std lock: a joiner looks up the task
/// and sends its `Join` under it, and a task removes itself under it only after
/// checking its channel is empty, so a join never reaches a task that ends.
#[derive(Default)]
pub(crate) struct Registry(Mutex<HashMap<Key, mpsc::UnboundedSender<Cmd>>>);

/// What a member tells its group. Unbounded: settlements are bounded by the
/// member's credit, joins and leaves by the subscriptions.
pub(crate) enum Cmd {
    Join {
        member: u64,
        offers: mpsc::Sender<Offer>,
        credit: usize,
        /// Set by the member's connection while its client does not read.
        client_slow: Arc<AtomicBool>,
        /// Set while the member's subscription is QoS 0 (kept up to date by its
        /// connection when the client subscribes again with another QoS).
        at_most_once: Arc<AtomicBool>,
        joined: oneshot::Sender<()>,
    },
    /// Done with these (queue, offset)s.
    Settled { member: u64, done: Vec<(u32, u64)> },
    /// Gone: what it has not settled goes to the other members.
    Leave {
        member: u64,
        left: oneshot::Sender<()>,
    },
}

/// Messages a group hands to one member (one membership of a connection).
pub(crate) struct Offer {
    pub member: u64,
    pub messages: Vec<Offered>,
}

pub(crate) struct Offered {
    pub queue: u32,
    pub offset: u64,
    pub record: Bytes,
    /// The MQTT topic name.
    pub name: Arc<str>,
}

/// A member's way back to its group; what a shared message's [`Source`] names.
#[derive(Debug)]
pub struct Link {
    pub member: u64,
    tx: mpsc::UnboundedSender<Cmd>,
}

/// One shared subscription of a connection on one core topic.
struct Membership {
    raw: Arc<str>,
    topic: String,
    link: Arc<Link>,
    /// Shared with the group (see [`Cmd::Join`]).
    at_most_once: Arc<AtomicBool>,
}

/// A connection's side of its shared subscriptions.
pub(crate) struct Members {
    /// Every group this connection is a member of sends here; made at the first
    /// join (most connections never join one, and a channel costs memory).
    offers: Option<mpsc::Sender<Offer>>,
    /// The receiving end, read by the connection's loop.
    pub rx: Option<mpsc::Receiver<Offer>>,
    joined: BTreeMap<u64, Membership>,
    /// Settled since the last loop turn, sent to the groups in one message each.
    settled: Vec<(Arc<Link>, u32, u64)>,
}

impl Members {
    pub fn new() -> Members {
        Members {
            offers: None,
            rx: None,
            joined: BTreeMap::new(),
            settled: Vec::new(),
        }
    }

    fn sender(&mut self) -> mpsc::Sender<Offer> {
        let rx = &mut self.rx;
        self.offers
            .get_or_insert_with(|| {
                let (tx, r) = mpsc::channel(64);
                *rx = Some(r);
                tx
            })
            .clone()
    }
}

/// Messages a member may hold unsettled: its client's window plus what waits
/// in its ready queue.
fn credit(window: usize) -> usize {
    window.saturating_add(256).min(2048)
}

impl<B: MessagingApi + 'static> Conn<B> {
    /// Joins the group of a shared subscription for one core topic (starting its
    /// task on this node if it has none). Returns once the group has its start
    /// positions, so a message published after the SUBACK is not missed.
    pub(crate) async fn start_share(&mut self, raw: Arc<str>, topic: String) {
        let Some(sub) = self.session.subs.iter().find(|s| *s.filter.raw == *raw) else {
            return;
        };
        let qos0 = sub.qos == QoS::AtMostOnce;
        if let Some(m) = self
            .shares
            .joined
            .values()
            .find(|m| *m.raw == *raw && m.topic == topic)
        {
            // Subscribed again: the group sees the QoS it now grants.
            m.at_most_once.store(qos0, Ordering::Release);
            return;
        }
        let share = sub.filter.share.clone().unwrap_or_default();
        let group = share_group(&share, &sub.filter.filter);
        let filter = sub.filter.clone();
        let member = self.shared.next_id();
        let (joined, answer) = oneshot::channel();
        let at_most_once = Arc::new(AtomicBool::new(qos0));
        let join = Cmd::Join {
            member,
            offers: self.shares.sender(),
            credit: credit(self.client_receive_max),
            client_slow: self.inbox.client_slow.clone(),
            at_most_once: at_most_once.clone(),
            joined,
        };
        let tx = join_group(
            &self.shared,
            (group, Arc::from(topic.as_str())),
            filter,
            join,
        );
        if tokio::time::timeout(ANSWER_WAIT, answer).await.is_err() {
            tracing::warn!(client = %self.session.client_id, filter = %raw, "a shared group did not answer a join in time");
        }
        let link = Arc::new(Link { member, tx });
        self.shares.joined.insert(
            member,
            Membership {
                raw,
                topic,
                link,
                at_most_once,
            },
        );
    }

    /// Messages a group handed to this connection become ready to send.
    pub(crate) fn on_offer(&mut self, offer: Offer) {
        let Some(m) = self.shares.joined.get(&offer.member) else {
            return; // left meanwhile: the group gave these to others
        };
        let link = m.link.clone();
        let Some(sub) = self.session.subs.iter().find(|s| *s.filter.raw == *m.raw) else {
            return;
        };
        let (sub_qos, sub_id) = (sub.qos, sub.id);
        let v5 = self.version == Version::V5;
        let now = message::now_ms();
        for o in offer.messages {
            let Ok(view) = RecordView::parse(&o.record) else {
                self.shares.settled.push((link.clone(), o.queue, o.offset));
                continue;
            };
            let mut props = empty_props();
            let meta = message::read_meta(view.properties(), v5.then_some(&mut props));
            let Ok(expiry) = message::remaining_expiry(meta.expiry_at, now) else {
                self.shares.settled.push((link.clone(), o.queue, o.offset));
                continue;
            };
            props.message_expiry_interval = expiry;
            props.subscription_identifiers = sub_id.into_iter().collect();
            let publish = crate::session::Outgoing {
                dup: false,
                qos: min_qos(sub_qos, meta.qos.unwrap_or(QoS::ExactlyOnce)),
                retain: false,
                topic: o.name,
                pkid: 0,
                payload: o.record.slice_ref(view.body()),
                properties: v5.then(|| Box::new(props)),
            };
            self.ready.push_back(Ready {
                publish,
                source: Source::Share {
                    link: link.clone(),
                    queue: o.queue,
                    offset: o.offset,
                },
            });
        }
    }

    /// A shared message is done with (acknowledged, sent at QoS 0, or discarded).
    pub(crate) fn settle_shared(&mut self, link: Arc<Link>, queue: u32, offset: u64) {
        self.shares.settled.push((link, queue, offset));
    }

    /// Tells each group what this connection settled since the last turn.
    pub(crate) fn settle_acks(&mut self) {
        let mut settled = std::mem::take(&mut self.shares.settled).into_iter();
        let Some((mut link, q, o)) = settled.next() else {
            return;
        };
        let mut done = vec![(q, o)];
        for (l, q, o) in settled {
            if !Arc::ptr_eq(&l, &link) {
                let batch = std::mem::take(&mut done);
                send_settled(&link, batch);
                link = l;
            }
            done.push((q, o));
        }
        send_settled(&link, done);
    }

    /// Leaves the groups of a shared subscription that was removed; its messages
    /// not yet sent go to the other members.
    pub(crate) async fn leave_shares_of(&mut self, raw: &str) {
        let ids: Vec<u64> = self
            .shares
            .joined
            .iter()
            .filter(|(_, m)| *m.raw == *raw)
            .map(|(id, _)| *id)
            .collect();
        self.ready.retain_ones(
            |r| !matches!(&r.source, Source::Share { link, .. } if ids.contains(&link.member)),
        );
        self.leave(ids).await;
    }

    /// Leaves every group (the connection ends). Messages in flight and ready
    /// go to the other members; the session does not keep them.
    pub(crate) async fn leave_all_shares(&mut self) {
        self.ready
            .retain_ones(|r| !matches!(r.source, Source::Share { .. }));
        self.session
            .inflight
            .retain(|_, f| !matches!(f.source, Source::Share { .. }));
        let ids: Vec<u64> = self.shares.joined.keys().copied().collect();
        self.leave(ids).await;
    }

    async fn leave(&mut self, ids: Vec<u64>) {
        // Settlements first (the channel keeps order), so nothing already
        // acknowledged is given to another member.
        self.settle_acks();
        let mut answers = Vec::new();
        for id in ids {
            if let Some(m) = self.shares.joined.remove(&id) {
                let (left, answer) = oneshot::channel();
                if m.link.tx.send(Cmd::Leave { member: id, left }).is_ok() {
                    answers.push(answer);
                }
            }
        }
        // Waited for so a clean stop commits the groups' positions before the
        // core writes its offsets.
        for a in answers {
            let _ = tokio::time::timeout(ANSWER_WAIT, a).await;
        }
    }
}

fn send_settled(link: &Link, done: Vec<(u32, u64)>) {
    let _ = link.tx.send(Cmd::Settled {
        member: link.member,
        done,
    });
}

/// Sends `join` to the group's task, starting one if the group has none here.
fn join_group<B: MessagingApi + 'static>(
    shared: &Arc<Shared<B>>,
    key: Key,
    filter: TopicFilter,
    join: Cmd,
) -> mpsc::UnboundedSender<Cmd> {
    let mut reg = lock(&shared.shares.0);
    let join = match reg.get(&key) {
        Some(tx) => match tx.send(join) {
            Ok(()) => return tx.clone(),
            Err(mpsc::error::SendError(join)) => join, // ended without unregistering
        },
        None => join,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let _ = tx.send(join);
    reg.insert(key.clone(), tx.clone());
    tokio::spawn(Group::run(shared.clone(), key, filter, rx));
    tx
}
