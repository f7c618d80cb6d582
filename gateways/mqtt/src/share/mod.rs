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
//! This module is the node's side: the registry of group tasks, the group task
//! (`group.rs`) and what members and groups tell each other ([`Cmd`], [`Offer`],
//! [`Link`]). It knows no connection or session: a connection's memberships
//! (joining, turning offers into PUBLISHes, settling, leaving) are
//! `members.rs`, above it. Why this and not the core's POP is in docs/mqtt.md
//! ("Shared subscriptions").

mod group;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rocketgate_core::broker::MessagingApi;
use tokio::sync::{mpsc, oneshot};

use self::group::Group;
use crate::router::Router;
use crate::topic::TopicFilter;
use rocketgate_core::sync::lock;

/// (core group, core topic).
pub(crate) type Key = (String, Arc<str>);

/// The group tasks of this node, and what they need of it (the core, the
/// router).
pub(crate) struct Registry<B> {
    api: Arc<B>,
    router: Arc<Router<B>>,
    /// One short std lock: a joiner looks up the task and sends its `Join`
    /// under it, and a task removes itself under it only after checking its
    /// channel is empty, so a join never reaches a task that ends.
    groups: Mutex<HashMap<Key, mpsc::UnboundedSender<Cmd>>>,
    /// This door as a member of the core clustering groups (`door-<id>`): the
    /// core assigns each door's group task a share of the topic's queues, so
    /// with members on several doors over one broker each message still goes
    /// to one member.
    member: String,
}

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

/// The core group member name of a door.
fn door_member(door: u64) -> String {
    format!("door-{door:016x}")
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

/// A member's way back to its group; what a shared message's source names.
#[derive(Debug)]
pub struct Link {
    pub member: u64,
    /// The group's core topic (what its deliveries are counted under).
    pub topic: Arc<str>,
    tx: mpsc::UnboundedSender<Cmd>,
}

impl Link {
    /// Tells the group the member is done with these (queue, offset)s.
    pub fn settled(&self, done: Vec<(u32, u64)>) {
        let _ = self.tx.send(Cmd::Settled {
            member: self.member,
            done,
        });
    }

    /// Leaves the group; the answer comes once the group gave the member's
    /// unsettled messages to the others (`None`: the group is gone).
    pub fn leave(&self) -> Option<oneshot::Receiver<()>> {
        let (left, answer) = oneshot::channel();
        self.tx
            .send(Cmd::Leave {
                member: self.member,
                left,
            })
            .is_ok()
            .then_some(answer)
    }
}

impl<B: MessagingApi + 'static> Registry<B> {
    pub fn new(api: Arc<B>, router: Arc<Router<B>>, door: u64) -> Registry<B> {
        Registry {
            api,
            router,
            groups: Mutex::new(HashMap::new()),
            member: door_member(door),
        }
    }

    /// A door died: it leaves the core groups this door serves at once (the
    /// core would drop it only after its member timeout), so its queues move
    /// to the doors left.
    pub fn forget_door(&self, door: u64) {
        let groups: Vec<String> = lock(&self.groups).keys().map(|k| k.0.clone()).collect();
        let member = door_member(door);
        for g in groups {
            let api = self.api.clone();
            let member = member.clone();
            tokio::spawn(async move {
                let _ = api.unregister(&g, &member).await;
            });
        }
    }

    /// Sends `join` (a [`Cmd::Join`] for `member`) to the group's task, starting
    /// one if the group has none here (`inbox_id`: the new task's id at the
    /// router, unique on the node). The link back to the group.
    pub fn join(
        self: &Arc<Self>,
        key: Key,
        filter: TopicFilter,
        member: u64,
        join: Cmd,
        inbox_id: u64,
    ) -> Arc<Link> {
        let mut reg = lock(&self.groups);
        let join = match reg.get(&key) {
            Some(tx) => match tx.send(join) {
                Ok(()) => {
                    return Arc::new(Link {
                        member,
                        topic: key.1.clone(),
                        tx: tx.clone(),
                    });
                }
                Err(mpsc::error::SendError(join)) => join, // ended without unregistering
            },
            None => join,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(join);
        reg.insert(key.clone(), tx.clone());
        let topic = key.1.clone();
        tokio::spawn(Group::run(self.clone(), key, filter, rx, inbox_id));
        Arc::new(Link { member, topic, tx })
    }
}
