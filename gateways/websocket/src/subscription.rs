//! One subscription: the task that fetches from the broker within the client's
//! credit, and the state the connection shares with it (credit, deliveries not
//! yet acked, read positions).
//!
//! - **Clustering** subscriptions POP: each message goes to one subscriber of the
//!   group, leased for the invisible time; the receipt is the core's POP receipt
//!   handle, so it acks from any connection. Un-acked messages reappear (attempt
//!   raised) when the lease runs out, and at once when their subscription ends.
//! - **Broadcasting** subscriptions pull every queue of the topic as the
//!   broadcasting member `<subscription id>` of the group, so the broker keeps
//!   their offsets under `<group>@<id>`. The committed offset of a queue is its
//!   lowest un-acked delivery (or the read position when nothing is in flight):
//!   a subscriber that comes back resumes there and gets un-acked messages again.
//!
//! Memory per subscription is bounded: at most `max_unacked` deliveries are
//! tracked, one fetch asks for at most `fetch_batch` messages, and a delivery
//! waits for room in the connection's byte budget ([`Outbox`]) before it is
//! queued, so a slow reader stops the fetching and the backlog stays in the log.

use rocketgate_core::clock::now_ms;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    ConsumeMode, Heartbeat, MessagingApi, PopRequest, PullRequest, PullStatus,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::protocol::{self, Subscribe};
use crate::settings::Settings;

/// One text frame on its way to the socket, holding its share of the byte budget.
pub(crate) struct Outgoing {
    pub text: String,
    /// The subscription a message frame belongs to (None: not a message).
    pub from: Option<Arc<Shared>>,
    _permit: OwnedSemaphorePermit,
}

impl Outgoing {
    /// False for a message of a subscription the client has ended meanwhile:
    /// nothing of it is sent after `unsubscribed` (it is still in flight, so it
    /// comes again: commits stay below it, POP leases are given back).
    pub fn wanted(&self) -> bool {
        self.from
            .as_ref()
            .is_none_or(|s| !s.unsubscribed.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// The sending side of a connection's bounded outbound buffer.
#[derive(Clone)]
pub(crate) struct Outbox {
    tx: mpsc::Sender<Outgoing>,
    budget: Arc<Semaphore>,
    cap: u32,
}

/// The connection is gone.
#[derive(Debug)]
pub(crate) struct Closed;

impl Outbox {
    /// A buffer of `bytes` (and at most `frames` frames).
    pub fn new(bytes: usize, frames: usize) -> (Outbox, mpsc::Receiver<Outgoing>, Arc<Semaphore>) {
        let cap = u32::try_from(bytes).unwrap_or(u32::MAX).max(1);
        let budget = Arc::new(Semaphore::new(cap as usize));
        let (tx, rx) = mpsc::channel(frames);
        (
            Outbox {
                tx,
                budget: budget.clone(),
                cap,
            },
            rx,
            budget,
        )
    }

    /// Waits for room, then queues the frame. A frame larger than the whole
    /// budget waits until the buffer is empty.
    pub async fn push(&self, text: String, from: Option<Arc<Shared>>) -> Result<(), Closed> {
        let n = u32::try_from(text.len())
            .unwrap_or(u32::MAX)
            .clamp(1, self.cap);
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(n)
            .await
            .map_err(|_| Closed)?;
        self.tx
            .send(Outgoing {
                text,
                from,
                _permit: permit,
            })
            .await
            .map_err(|_| Closed)
    }
}

/// A delivery not yet acked.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub receipt: String,
    pub attempt: u32,
    /// Clustering: when the POP lease runs out (broker clock, ms).
    pub deadline_ms: Option<i64>,
    /// Broadcasting: nacked, to be delivered again at this time.
    pub redeliver_at: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub credit: u64,
    /// (queue id, queue offset) -> the delivery.
    pub in_flight: BTreeMap<(u32, u64), Lease>,
    /// Broadcasting: the next offset to read, per queue.
    pub next: Vec<u64>,
    /// The task ended (an error was reported); the id can be subscribed again.
    pub ended: bool,
}

/// What the connection and the subscription task share; one short std lock,
/// never held across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Poked on credit, ack and nack so a waiting task looks again.
    pub wake: Notify,
    /// The client unsubscribed (or left): queued messages are not sent.
    pub unsubscribed: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub fn new(credit: u64, next: Vec<u64>) -> Self {
        Shared {
            state: Mutex::new(State {
                credit,
                next,
                ..State::default()
            }),
            wake: Notify::new(),
            unsubscribed: Default::default(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        rocketgate_core::sync::lock(&self.state)
    }

    pub fn add_credit(&self, n: u64) -> u64 {
        let credit = {
            let mut s = self.lock();
            s.credit = s.credit.saturating_add(n);
            s.credit
        };
        self.wake.notify_one();
        credit
    }
}

impl State {
    /// How many messages may be fetched now.
    fn want(&mut self, settings: &Settings, now_ms: i64) -> usize {
        // A POP lease that ran out is the broker's again (it may be redelivered elsewhere).
        self.in_flight
            .retain(|_, l| l.deadline_ms.is_none_or(|d| d > now_ms));
        let room = settings.max_unacked.saturating_sub(self.in_flight.len());
        let credit = usize::try_from(self.credit).unwrap_or(usize::MAX);
        credit.min(room).min(settings.fetch_batch)
    }

    /// Broadcasting: the offset to commit for `queue`.
    pub fn low_water(&self, queue: u32) -> Option<u64> {
        let next = *self.next.get(queue as usize)?;
        let lowest = self
            .in_flight
            .range((queue, 0)..=(queue, u64::MAX))
            .next()
            .map(|((_, o), _)| *o);
        Some(lowest.map_or(next, |o| o.min(next)))
    }
}

/// A broadcasting delivery's receipt: `b1:<subscription id>:<queue>:<offset>`.
pub(crate) fn broadcast_receipt(id: &str, queue: u32, offset: u64) -> String {
    format!("b1:{id}:{queue}:{offset}")
}

/// Parses a broadcasting receipt into (subscription id, queue, offset).
pub(crate) fn parse_broadcast_receipt(r: &str) -> Option<(&str, u32, u64)> {
    let mut it = r.strip_prefix("b1:")?.split(':');
    let (id, q, o) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() {
        return None;
    }
    Some((id, q.parse().ok()?, o.parse().ok()?))
}

/// Where the task runs and what it reads.
pub(crate) struct Feed<B> {
    pub broker: Arc<B>,
    pub spec: Subscribe,
    pub filter: Filter,
    pub shared: Arc<Shared>,
    pub outbox: Outbox,
    pub settings: Arc<Settings>,
    pub stop: watch::Receiver<bool>,
}

/// Why a feed stopped.
enum End {
    Stopped,
    ConnectionGone,
    Failed(rocketgate_core::Error),
}

/// How often a broadcasting member re-announces itself (members expire after 120 s).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(30);
/// How long a task with no room waits before it looks at lease deadlines again.
const RECHECK: Duration = Duration::from_secs(1);

impl<B: MessagingApi + 'static> Feed<B> {
    /// Runs until stopped, the connection goes, or the broker refuses.
    pub async fn run(self) {
        // Boxed apart: the task's own future stays small, and a broadcasting
        // subscription does not carry a POP's state (nor the other way round).
        // An idle subscription's memory is mostly these futures (issue #33).
        let end = match self.spec.mode {
            ConsumeMode::Clustering => Box::pin(self.pop_loop()).await,
            ConsumeMode::Broadcasting => Box::pin(self.pull_loop()).await,
        };
        let id = self.spec.id.clone();
        if let End::Failed(e) = &end {
            let (code, _) = protocol::error_code(e);
            let frame = protocol::error_frame(
                &None,
                code,
                &format!("subscription {id:?} ended: {e}"),
                Some(&id),
            );
            self.shared.lock().ended = true;
            let _ = Box::pin(self.push(frame, false)).await;
        }
        // Runs once, at the end: on the heap then, not in every idle task.
        Box::pin(self.finish()).await;
        tracing::debug!(subscription = %id, ended = matches!(end, End::ConnectionGone), "subscription done");
    }

    /// Clustering: un-acked messages go back to the group now; broadcasting:
    /// the offsets are committed and the member leaves the group.
    async fn finish(&self) {
        let s = &self.spec;
        match s.mode {
            ConsumeMode::Clustering => {
                let receipts: Vec<String> = std::mem::take(&mut self.shared.lock().in_flight)
                    .into_values()
                    .map(|l| l.receipt)
                    .collect();
                for r in receipts {
                    let _ = self.broker.nack(&r, Duration::ZERO).await;
                }
            }
            ConsumeMode::Broadcasting => {
                let commits: Vec<(u32, u64)> = {
                    let st = self.shared.lock();
                    (0..st.next.len() as u32)
                        .filter_map(|q| st.low_water(q).map(|o| (q, o)))
                        .collect()
                };
                for (q, o) in commits {
                    if let Err(e) = self
                        .broker
                        .commit_offset(&s.group, &s.id, &s.topic, q, o)
                        .await
                    {
                        tracing::warn!(error = %e, subscription = %s.id, "committing the offset at the end failed");
                    }
                }
                let _ = self.broker.unregister(&s.group, &s.id).await;
            }
        }
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    async fn wait_for_room(&self) -> Option<End> {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = self.shared.wake.notified() => None,
            _ = tokio::time::sleep(RECHECK) => None,
            _ = stopped(&mut stop) => Some(End::Stopped),
        }
    }

    async fn pop_loop(&self) -> End {
        let invisible = self
            .spec
            .invisible_ms
            .map_or(self.settings.invisible_time, Duration::from_millis);
        let mut stop = self.stop.clone();
        loop {
            if self.stopping() {
                return End::Stopped;
            }
            let want = self.shared.lock().want(&self.settings, now_ms());
            if want == 0 {
                if let Some(end) = self.wait_for_room().await {
                    return end;
                }
                continue;
            }
            let req = PopRequest {
                group: self.spec.group.clone(),
                topic: self.spec.topic.clone(),
                filter: self.filter.clone(),
                max_messages: want,
                invisible,
                wait: self.settings.long_poll,
            };
            let popped = tokio::select! {
                r = self.broker.pop(req) => r,
                _ = stopped(&mut stop) => return End::Stopped,
            };
            let popped = match popped {
                Ok(p) => p,
                Err(e) => return End::Failed(e),
            };
            for p in popped {
                let receipt = p.receipt.to_string();
                let frame =
                    match protocol::message_frame(&self.spec.id, &p.message, &receipt, p.attempt())
                    {
                        Ok(f) => f,
                        Err(why) => {
                            tracing::error!(%why, "skipping an unreadable record");
                            let _ = Box::pin(self.broker.ack(&receipt)).await;
                            continue;
                        }
                    };
                {
                    let mut st = self.shared.lock();
                    st.credit = st.credit.saturating_sub(1);
                    st.in_flight.insert(
                        (p.message.queue_id, p.message.queue_offset),
                        Lease {
                            receipt,
                            attempt: p.attempt(),
                            deadline_ms: Some(p.receipt.invisible_until_ms),
                            redeliver_at: None,
                        },
                    );
                }
                if let Err(end) = self.push(frame, true).await {
                    return end;
                }
                crate::meters::count_out(&self.spec.topic, &p.message);
            }
        }
    }

    fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            group: self.spec.group.clone(),
            member: self.spec.id.clone(),
            mode: ConsumeMode::Broadcasting,
            subscriptions: vec![rocketgate_core::broker::Subscription {
                topic: self.spec.topic.clone(),
                filter_type: self.spec.filter_type,
                expression: self.spec.filter.clone(),
            }],
        }
    }

    fn pull_request(&self, queue_id: u32, offset: u64, max: usize, wait: Duration) -> PullRequest {
        PullRequest {
            group: self.spec.group.clone(),
            member: self.spec.id.clone(),
            topic: self.spec.topic.clone(),
            queue_id,
            offset,
            max_messages: max,
            filter: self.filter.clone(),
            wait,
        }
    }

    /// Delivers one broadcasting message (credit was checked by the caller).
    async fn deliver(
        &self,
        m: &rocketgate_core::broker::Delivered,
        attempt: u32,
    ) -> Result<(), End> {
        let receipt = broadcast_receipt(&self.spec.id, m.queue_id, m.queue_offset);
        let frame = match protocol::message_frame(&self.spec.id, m, &receipt, attempt) {
            Ok(f) => f,
            Err(why) => {
                tracing::error!(%why, "skipping an unreadable record");
                return Ok(());
            }
        };
        {
            let mut st = self.shared.lock();
            st.credit = st.credit.saturating_sub(1);
            st.in_flight.insert(
                (m.queue_id, m.queue_offset),
                Lease {
                    receipt,
                    attempt,
                    deadline_ms: None,
                    redeliver_at: None,
                },
            );
        }
        self.push(frame, true).await?;
        crate::meters::count_out(&self.spec.topic, m);
        Ok(())
    }

    /// Queues a frame once the connection's buffer has room; gives up when the
    /// subscription is stopped meanwhile (the connection may be the one waiting).
    async fn push(&self, frame: String, message: bool) -> Result<(), End> {
        let mut stop = self.stop.clone();
        let from = message.then(|| self.shared.clone());
        tokio::select! {
            r = self.outbox.push(frame, from) => r.map_err(|_| End::ConnectionGone),
            _ = stopped(&mut stop) => Err(End::Stopped),
        }
    }

    /// Broadcasting: nacked deliveries whose time has come, within the credit.
    async fn redeliver_due(&self) -> Result<Option<Instant>, End> {
        let now = Instant::now();
        let (due, next_due) = {
            let mut st = self.shared.lock();
            let mut due = Vec::new();
            let mut next_due: Option<Instant> = None;
            let mut credit = st.credit;
            for (&(q, o), l) in st.in_flight.iter_mut() {
                match l.redeliver_at {
                    Some(at) if at <= now && credit > 0 => {
                        credit -= 1;
                        l.redeliver_at = None;
                        l.attempt += 1;
                        due.push((q, o, l.attempt));
                    }
                    Some(at) => next_due = Some(next_due.map_or(at, |n| n.min(at))),
                    None => {}
                }
            }
            (due, next_due)
        };
        for (q, o, attempt) in due {
            // Rare (nacked deliveries only): boxed, so the waiting task is not
            // the size of a pull.
            let r = Box::pin(self.broker.pull(self.pull_request(q, o, 1, Duration::ZERO)))
                .await
                .map_err(End::Failed)?;
            match r.messages.into_iter().next() {
                Some(m) if m.queue_offset == o => self.deliver(&m, attempt).await?,
                _ => {
                    // Gone (retention): nothing to deliver again.
                    self.shared.lock().in_flight.remove(&(q, o));
                }
            }
        }
        Ok(next_due)
    }

    /// Broadcasting: reads every queue of the topic. A queue with messages is
    /// pulled again at once; once every queue came back empty, the loop waits on
    /// the topic ([`MessagingApi::wait_for_arrivals`]: one waiter, where a long
    /// poll per queue kept ~1 KiB each per idle subscription, issue #33) and
    /// then pulls without waiting. A broker that cannot wait on a topic (a
    /// remote one) is long-polled per queue instead.
    async fn pull_loop(&self) -> End {
        let broker = self.broker.clone();
        let queues = self.shared.lock().next.len() as u32;
        let mut pulls = FuturesUnordered::new();
        let mut pending = vec![false; queues as usize];
        // The last pull of the queue found nothing new (it is not pulled again
        // until the topic says it has more).
        let mut quiet = vec![false; queues as usize];
        let mut long_polls = false;
        let mut stop = self.stop.clone();
        let mut beat = tokio::time::interval_at(Instant::now() + HEARTBEAT_EVERY, HEARTBEAT_EVERY);
        loop {
            if self.stopping() {
                return End::Stopped;
            }
            let next_due = match self.redeliver_due().await {
                Ok(n) => n,
                Err(end) => return end,
            };
            let wake_at = next_due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let want = self.shared.lock().want(&self.settings, now_ms());
            if want == 0 {
                // Nothing may be fetched: drop the waiting reads (they only read).
                pulls = FuturesUnordered::new();
                pending.iter_mut().for_each(|p| *p = false);
                tokio::select! {
                    _ = self.shared.wake.notified() => {}
                    _ = tokio::time::sleep_until(wake_at) => {}
                    _ = beat.tick() => { let _ = Box::pin(broker.heartbeat(self.heartbeat())).await; }
                    _ = stopped(&mut stop) => return End::Stopped,
                }
                continue;
            }
            if !long_polls && pulls.is_empty() && quiet.iter().all(|q| *q) {
                // Caught up everywhere: one wait on the topic, no pull in flight.
                let next = self.shared.lock().next.clone();
                tokio::select! {
                    r = broker.wait_for_arrivals(&self.spec.topic, next, self.settings.long_poll) => match r {
                        Ok(waited) => {
                            long_polls = !waited;
                            quiet.iter_mut().for_each(|q| *q = false);
                        }
                        Err(e) => return End::Failed(e),
                    },
                    _ = self.shared.wake.notified() => {}
                    _ = tokio::time::sleep_until(wake_at) => {}
                    _ = beat.tick() => {
                        if let Err(e) = Box::pin(broker.heartbeat(self.heartbeat())).await {
                            return End::Failed(e);
                        }
                    }
                    _ = stopped(&mut stop) => return End::Stopped,
                }
                continue;
            }
            let wait = if long_polls {
                self.settings.long_poll
            } else {
                Duration::ZERO
            };
            for q in 0..queues {
                let i = q as usize;
                if !pending[i] && (long_polls || !quiet[i]) {
                    pending[i] = true;
                    let offset = self.shared.lock().next[i];
                    let req = self.pull_request(q, offset, want, wait);
                    // `map`, not an async block: the block would keep its own copy
                    // of the request beside the pull's for as long as it waits.
                    pulls.push(broker.pull(req).map(move |r| (q, r)));
                }
            }
            tokio::select! {
                Some((q, result)) = pulls.next() => {
                    pending[q as usize] = false;
                    let r = match result {
                        Ok(r) => r,
                        Err(e) => return End::Failed(e),
                    };
                    let mut next = r.next_offset;
                    let before = self.shared.lock().next[q as usize];
                    quiet[q as usize] = r.status == PullStatus::NoNewMessage && next == before;
                    if r.status == PullStatus::Found {
                        for m in &r.messages {
                            let room = self.shared.lock().want(&self.settings, now_ms());
                            if room == 0 {
                                next = m.queue_offset;
                                break;
                            }
                            if let Err(end) = self.deliver(m, 1).await {
                                return end;
                            }
                        }
                    }
                    self.shared.lock().next[q as usize] = next;
                }
                _ = self.shared.wake.notified() => {}
                _ = tokio::time::sleep_until(wake_at) => {}
                _ = beat.tick() => {
                    if let Err(e) = Box::pin(broker.heartbeat(self.heartbeat())).await {
                        return End::Failed(e);
                    }
                }
                _ = stopped(&mut stop) => return End::Stopped,
            }
        }
    }
}

/// Completes when the flag turns true (or its sender is gone); returns nothing,
/// so no watch guard lives across an await in a `select!`.
pub(crate) async fn stopped(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|c| *c).await;
}

/// The sizes of what an idle subscription keeps allocated: its task, its read
/// loop (boxed apart), and one waiting pull per queue.
#[cfg(test)]
pub(crate) fn idle_future_sizes<B: MessagingApi + 'static>(
    b: &Arc<B>,
) -> [(&'static str, usize); 4] {
    fn future_size<A, Fut>(_: impl FnOnce(A) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }
    [
        ("subscription task", future_size(Feed::<B>::run)),
        (
            "broadcasting loop",
            future_size::<&Feed<B>, _>(Feed::<B>::pull_loop),
        ),
        (
            "clustering loop",
            future_size::<&Feed<B>, _>(Feed::<B>::pop_loop),
        ),
        ("waiting pull", future_size(|r: PullRequest| b.pull(r))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease {
            receipt: String::new(),
            attempt: 1,
            deadline_ms: None,
            redeliver_at: None,
        }
    }

    #[test]
    fn want_is_bounded_by_credit_room_and_batch() {
        let settings = Settings {
            max_unacked: 3,
            fetch_batch: 10,
            ..Settings::default()
        };
        let mut st = State {
            credit: 100,
            ..State::default()
        };
        assert_eq!(st.want(&settings, 0), 3);
        st.in_flight.insert((0, 1), lease());
        st.in_flight.insert(
            (0, 2),
            Lease {
                deadline_ms: Some(50),
                ..lease()
            },
        );
        assert_eq!(st.want(&settings, 10), 1);
        // The POP lease ran out: no longer ours to count.
        assert_eq!(st.want(&settings, 60), 2);
        st.credit = 0;
        assert_eq!(st.want(&settings, 60), 0);
    }

    #[test]
    fn low_water_is_the_lowest_unacked_or_the_read_position() {
        let mut st = State {
            next: vec![10, 4],
            ..State::default()
        };
        assert_eq!(st.low_water(0), Some(10));
        st.in_flight.insert((0, 7), lease());
        st.in_flight.insert((0, 9), lease());
        st.in_flight.insert((1, 2), lease());
        assert_eq!(
            (st.low_water(0), st.low_water(1), st.low_water(2)),
            (Some(7), Some(2), None)
        );
    }

    #[test]
    fn broadcast_receipts_round_trip() {
        let r = broadcast_receipt("sub-1", 3, 42);
        assert_eq!(parse_broadcast_receipt(&r), Some(("sub-1", 3, 42)));
        assert_eq!(parse_broadcast_receipt("b1:x:1"), None);
        assert_eq!(parse_broadcast_receipt("v1:g:t:0:0:0:1:0"), None);
    }
}
