//! POP over several broker groups.
//!
//! A POP names a topic, not a queue, so every group hosting the topic may have
//! messages for it. The rules:
//! 1. Messages kept from an earlier long poll of the same group, topic and filter
//!    (see 3) are handed out first, while they are still invisible to others.
//! 2. Then each group is asked without waiting, in turn, starting from a group that
//!    rotates from call to call (so no group is always asked first and starves the
//!    others), until `max_messages` are collected.
//! 3. Only when none had anything and the request may wait: every group is
//!    long-polled at once, each in its own task (at most one per group and key: a
//!    group that has a poll running for the key is not asked again). Whatever a poll
//!    brings goes into the stash of its key, and every waiting POP is woken to take
//!    from it; a POP whose wait runs out returns empty. Polls are never cancelled (a
//!    remote broker would hand out messages the proxy then drops, invisible until
//!    their time ran out): a POP that got its answer, or was dropped by its door,
//!    leaves its polls running, and what they bring is the next POP's (1). So one
//!    group with nothing never delays messages of another, and nothing a group
//!    handed out is dropped; a kept message nobody asks for reappears on its broker
//!    when its invisible time ends, as any un-acked POP does.
//!
//! The whole POP runs in a task of its own, so a door that stops waiting (a
//! `select!` that dropped it) loses nothing either: the answer goes to the stash.
//!
//! Each returned message carries its global queue id and a receipt handle naming its
//! group; the handle's own queue id stays the group's local one (only the group reads
//! it).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rocketgate_core::Result;
use rocketgate_core::broker::{MessagingApi, PopRequest, Popped};
use rocketgate_core::sync::lock;
use tracing::debug;

use super::route::{RouteSource, TopicRoute};
use super::{Cluster, Inner, cannot_write, turn, unavailable};

/// A kept message is handed out only while this much of its invisible time is left.
const MARGIN: Duration = Duration::from_millis(500);

/// How long a group whose long poll failed is not polled again for the same key.
const FAILED_POLL_PAUSE: Duration = Duration::from_secs(1);

/// (consumer group, topic, filter).
type Key = (String, String, String);

/// What the POPs of a cluster share.
#[derive(Default)]
pub(super) struct Pops {
    /// Which group a POP asks first.
    turn: AtomicUsize,
    /// Messages long polls brought and the polls running. Std lock, never held
    /// across a call to a group.
    stash: Mutex<Stash>,
    /// Woken whenever a long poll ends.
    woken: tokio::sync::Notify,
}

/// Messages long polls brought, by key, and which groups have a long poll running
/// for which key.
#[derive(Default)]
struct Stash {
    kept: HashMap<Key, VecDeque<Popped>>,
    polling: HashSet<(String, Key)>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn key(req: &PopRequest) -> Key {
    (
        req.group.clone(),
        req.topic.clone(),
        format!("{}:{}", req.filter.filter_type(), req.filter.canonical()),
    )
}

/// A member's answer with global queue ids and handles naming `broker`.
fn named(route: &TopicRoute, broker: &str, popped: Vec<Popped>) -> Vec<Popped> {
    let base = route.base(broker).unwrap_or(0);
    popped
        .into_iter()
        .map(|mut p| {
            p.message.queue_id += base;
            p.receipt.broker = Some(broker.to_owned());
            p
        })
        .collect()
}

impl<M, R> Inner<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// Up to `max` kept messages of the request's key that are still invisible long
    /// enough to be worth handing out; the ones too close to reappearing go.
    fn unstash(&self, req: &PopRequest, max: usize) -> Vec<Popped> {
        let deadline = now_ms() + i64::try_from(MARGIN.as_millis()).unwrap_or(0);
        let mut stash = lock(&self.pops.stash);
        let k = key(req);
        let Some(kept) = stash.kept.get_mut(&k) else {
            return Vec::new();
        };
        kept.retain(|p| p.receipt.invisible_until_ms > deadline);
        let n = max.min(kept.len());
        let out: Vec<Popped> = kept.drain(..n).collect();
        if kept.is_empty() {
            stash.kept.remove(&k);
        }
        out
    }

    fn keep(&self, req: &PopRequest, popped: Vec<Popped>) {
        if popped.is_empty() {
            return;
        }
        debug!(
            group = req.group,
            topic = req.topic,
            n = popped.len(),
            "kept for the next POP"
        );
        let now = now_ms();
        let mut stash = lock(&self.pops.stash);
        // Whatever reappeared on its broker by now is of no use to anyone.
        stash.kept.retain(|_, kept| {
            kept.retain(|p| p.receipt.invisible_until_ms > now);
            !kept.is_empty()
        });
        stash.kept.entry(key(req)).or_default().extend(popped);
    }

    /// Notes a long poll of `broker` for the request's key; false when one runs.
    fn start_poll(&self, broker: &str, req: &PopRequest) -> bool {
        lock(&self.pops.stash)
            .polling
            .insert((broker.to_owned(), key(req)))
    }

    fn end_poll(&self, broker: &str, req: &PopRequest) {
        lock(&self.pops.stash)
            .polling
            .remove(&(broker.to_owned(), key(req)));
    }
}

impl<M, R> Cluster<M, R>
where
    M: MessagingApi + 'static,
    R: RouteSource,
{
    /// The POP, run in a task of its own: when the caller stops waiting (a door's
    /// `select!`), what the groups already handed out is kept for the next POP
    /// instead of being dropped with the future.
    pub(super) async fn pop_detached(&self, req: PopRequest) -> Result<Vec<Popped>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move {
            let answer = this.pop_all(req.clone()).await;
            if let Err(Ok(popped)) = tx.send(answer) {
                this.inner.keep(&req, popped);
                this.inner.pops.woken.notify_waiters();
            }
        });
        rx.await
            .unwrap_or_else(|_| Err(unavailable("the POP task ended without an answer".into())))
    }

    async fn pop_all(&self, req: PopRequest) -> Result<Vec<Popped>> {
        let route = self.route(&req.topic).await?;
        let max = req.max_messages.max(1);
        let mut out = self.inner.unstash(&req, max);
        if !out.is_empty() {
            return Ok(out);
        }
        let members = self.route_members(&route).await;
        let n = members.len();
        if n == 0 {
            return Ok(out);
        }
        let first = turn(&self.inner.pops.turn, n);
        let mut refusal = None;
        for k in 0..n {
            let (b, m) = &members[(first + k) % n];
            let Ok(m) = m else { continue };
            let quick = PopRequest {
                max_messages: max - out.len(),
                wait: Duration::ZERO,
                ..req.clone()
            };
            match m.pop(quick).await {
                Ok(p) => out.extend(named(&route, &b.name, p)),
                Err(e) if cannot_write(&e) => {
                    debug!(broker = b.name, error = %e, "POP skipped a group")
                }
                Err(e) => {
                    refusal.get_or_insert(e);
                }
            }
            if out.len() >= max {
                break;
            }
        }
        if !out.is_empty() {
            return Ok(out);
        }
        if let Some(e) = refusal {
            return Err(e);
        }
        if req.wait.is_zero() {
            return Ok(out);
        }
        self.long_poll(&req, &route, max).await
    }

    /// Step 3: long polls on every group that has none running for this request's
    /// key, every answer into the stash, this call taking from the stash whenever a
    /// poll ends, until the wait runs out.
    async fn long_poll(
        &self,
        req: &PopRequest,
        route: &Arc<TopicRoute>,
        max: usize,
    ) -> Result<Vec<Popped>> {
        let deadline = Instant::now() + req.wait;
        loop {
            let woken = self.inner.pops.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let kept = self.inner.unstash(req, max);
            if !kept.is_empty() {
                return Ok(kept);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(kept);
            }
            for (b, m) in self.route_members(route).await {
                let Ok(m) = m else { continue };
                if !self.inner.start_poll(&b.name, req) {
                    continue;
                }
                let inner = self.inner.clone();
                let req = PopRequest {
                    wait: deadline - now,
                    ..req.clone()
                };
                let route = route.clone();
                tokio::spawn(async move {
                    match m.pop(req.clone()).await {
                        Ok(p) => inner.keep(&req, named(&route, &b.name, p)),
                        Err(e) => {
                            // Not asked again at once: a group that fails fast would
                            // otherwise be polled in a loop until the wait ran out.
                            debug!(broker = b.name, error = %e, "a POP long poll failed");
                            tokio::time::sleep(req.wait.min(FAILED_POLL_PAUSE)).await;
                        }
                    }
                    inner.end_poll(&b.name, &req);
                    inner.pops.woken.notify_waiters();
                });
            }
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }
}
