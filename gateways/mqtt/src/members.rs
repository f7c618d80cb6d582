//! A connection's shared subscriptions (`$share/<g>/<filter>`): its
//! memberships of the node's group tasks (`share/`), the offers they send it,
//! turned into PUBLISHes for its ready queue, and what it settles, sent back
//! once per loop turn. Owns only its memberships; the session, the ready queue
//! and the window are handed in by the connection task.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mqttbytes::QoS;
use rocketgate_core::broker::MessagingApi;
use rocketgate_core::store::RecordView;
use tokio::sync::{mpsc, oneshot};

use crate::message::{self, empty_props};
use crate::meters::Stored;
use crate::outgoing::{Outgoing, min_qos};
use crate::ready::{Ready, ReadyQueue};
use crate::session::{Session, Source};
use crate::share::{Cmd, Link, Offer};
use crate::shared::Shared;
use crate::state::share_group;

/// How long a member waits for its group to take a join or a leave.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

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
    rx: Option<mpsc::Receiver<Offer>>,
    joined: BTreeMap<u64, Membership>,
    /// Settled since the last loop turn, sent to the groups in one message each.
    settled: Vec<(Arc<Link>, u32, u64)>,
}

/// Messages a member may hold unsettled: its client's window plus what waits
/// in its ready queue.
fn credit(window: usize) -> usize {
    window.saturating_add(256).min(2048)
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

    /// The next offer of any group; pending forever while the connection is in
    /// none (the channel is made at the first join).
    pub async fn next_offer(&mut self) -> Option<Offer> {
        match &mut self.rx {
            Some(r) => r.recv().await,
            None => std::future::pending().await,
        }
    }

    /// An offer already waiting.
    pub fn try_offer(&mut self) -> Option<Offer> {
        self.rx.as_mut().and_then(|r| r.try_recv().ok())
    }

    /// Joins the group of shared subscription `raw` for one core topic (starting
    /// its task on this node if it has none). Returns once the group has its
    /// start positions, so a message published after the SUBACK is not missed.
    /// `window`: the client's; `client_slow`: set by the connection while its
    /// client does not read.
    pub async fn join<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &Session,
        window: usize,
        client_slow: &Arc<AtomicBool>,
        raw: Arc<str>,
        topic: String,
    ) {
        let Some(sub) = session.subs.iter().find(|s| *s.filter.raw == *raw) else {
            return;
        };
        let qos0 = sub.qos == QoS::AtMostOnce;
        if let Some(m) = self
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
        let member = shared.next_id();
        let (joined, answer) = oneshot::channel();
        let at_most_once = Arc::new(AtomicBool::new(qos0));
        let join = Cmd::Join {
            member,
            offers: self.sender(),
            credit: credit(window),
            client_slow: client_slow.clone(),
            at_most_once: at_most_once.clone(),
            joined,
        };
        let link = shared.shares.join(
            (group, Arc::from(topic.as_str())),
            filter,
            member,
            join,
            shared.next_id(),
        );
        if tokio::time::timeout(ANSWER_WAIT, answer).await.is_err() {
            tracing::warn!(client = %session.client_id, filter = %raw, "a shared group did not answer a join in time");
        }
        self.joined.insert(
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
    pub fn on_offer(&mut self, offer: Offer, session: &Session, v5: bool, ready: &mut ReadyQueue) {
        let Some(m) = self.joined.get(&offer.member) else {
            return; // left meanwhile: the group gave these to others
        };
        let link = m.link.clone();
        let Some(sub) = session.subs.iter().find(|s| *s.filter.raw == *m.raw) else {
            return;
        };
        let (sub_qos, sub_id) = (sub.qos, sub.id);
        let now = message::now_ms();
        for o in offer.messages {
            let stored = Stored::of(&o.record);
            let Ok(view) = RecordView::parse(&o.record) else {
                self.settled.push((link.clone(), o.queue, o.offset));
                continue;
            };
            let mut props = empty_props();
            let meta = message::read_meta(view.properties(), v5.then_some(&mut props));
            let Ok(expiry) = message::remaining_expiry(meta.expiry_at, now) else {
                self.settled.push((link.clone(), o.queue, o.offset));
                continue;
            };
            props.message_expiry_interval = expiry;
            props.subscription_identifiers = sub_id.into_iter().collect();
            let publish = Outgoing {
                dup: false,
                qos: min_qos(sub_qos, meta.qos.unwrap_or(QoS::ExactlyOnce)),
                retain: false,
                topic: o.name,
                pkid: 0,
                payload: o.record.slice_ref(view.body()),
                properties: v5.then(|| Box::new(props)),
            };
            ready.push_back(Ready {
                publish,
                source: Source::Share {
                    link: link.clone(),
                    queue: o.queue,
                    offset: o.offset,
                },
                stored,
            });
        }
    }

    /// A message is done with (acknowledged, sent at QoS 0, or discarded): a
    /// shared one is settled with its group at the end of the loop turn.
    pub fn settle(&mut self, source: Source) {
        if let Source::Share {
            link,
            queue,
            offset,
        } = source
        {
            self.settled.push((link, queue, offset));
        }
    }

    /// Tells each group what this connection settled since the last turn.
    pub fn send_settled(&mut self) {
        let mut settled = std::mem::take(&mut self.settled).into_iter();
        let Some((mut link, q, o)) = settled.next() else {
            return;
        };
        let mut done = vec![(q, o)];
        for (l, q, o) in settled {
            if !Arc::ptr_eq(&l, &link) {
                let batch = std::mem::take(&mut done);
                link.settled(batch);
                link = l;
            }
            done.push((q, o));
        }
        link.settled(done);
    }

    /// Leaves the groups of a shared subscription that was removed; its messages
    /// not yet sent go to the other members.
    pub async fn leave_filter(&mut self, raw: &str, ready: &mut ReadyQueue) {
        let ids: Vec<u64> = self
            .joined
            .iter()
            .filter(|(_, m)| *m.raw == *raw)
            .map(|(id, _)| *id)
            .collect();
        ready.retain_ones(
            |r| !matches!(&r.source, Source::Share { link, .. } if ids.contains(&link.member)),
        );
        self.leave(ids).await;
    }

    /// Leaves every group (the connection ends). Messages in flight and ready
    /// go to the other members; the session does not keep them.
    pub async fn leave_all(&mut self, session: &mut Session, ready: &mut ReadyQueue) {
        ready.retain_ones(|r| !matches!(r.source, Source::Share { .. }));
        session
            .inflight
            .retain(|_, f| !matches!(f.source, Source::Share { .. }));
        let ids: Vec<u64> = self.joined.keys().copied().collect();
        self.leave(ids).await;
    }

    async fn leave(&mut self, ids: Vec<u64>) {
        // Settlements first (the channel keeps order), so nothing already
        // acknowledged is given to another member.
        self.send_settled();
        let mut answers = Vec::new();
        for id in ids {
            if let Some(m) = self.joined.remove(&id)
                && let Some(answer) = m.link.leave()
            {
                answers.push(answer);
            }
        }
        // Waited for so a clean stop commits the groups' positions before the
        // core writes its offsets.
        for a in answers {
            let _ = tokio::time::timeout(ANSWER_WAIT, a).await;
        }
    }
}
