//! A session's messages waiting for its window, in order: single messages (a
//! retained message, a shared subscription's, one held back by a full window)
//! and **runs**, references into a batch the router or a catch-up read made.
//!
//! A run costs the same whatever its length (the batch, shared by every session
//! it went to, and where the session is in it); its messages are matched
//! against the subscriptions and made into `Outgoing`s one at a time, as the
//! window takes them. Before, every message of a feed became a ~100-byte
//! `Ready` on arrival: a thousand fan-out sessions with full queues held ~200
//! KiB each (the queue's doubling included) of copies of what the shared
//! batches already hold.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::meters::Stored;
use crate::outgoing::Outgoing;
use crate::router::Batch;
use crate::session::Source;

/// A message ready to go out once the window allows.
pub struct Ready {
    pub publish: Outgoing,
    pub source: Source,
    /// When its message was stored (delivery latency; none for retained ones).
    pub stored: Stored,
}

#[derive(Default)]
pub struct ReadyQueue {
    items: VecDeque<Item>,
    /// Messages waiting; for a run, those left to look at (some may turn out
    /// not to be for the session).
    len: usize,
}

enum Item {
    One(Ready),
    Run(Run),
}

struct Run {
    batch: Arc<Batch>,
    /// Indices in `batch.messages` (`None`: all of them).
    picks: Option<Box<[u32]>>,
    /// The next place in `picks` (or in `batch.messages`); what is before it
    /// was taken, or was below the session's cursor when the run was queued.
    next: usize,
}

impl Run {
    fn total(&self) -> usize {
        self.picks
            .as_ref()
            .map_or(self.batch.messages.len(), |p| p.len())
    }

    fn left(&self) -> usize {
        self.total().saturating_sub(self.next)
    }

    fn index(&self, at: usize) -> Option<usize> {
        match &self.picks {
            None => Some(at),
            Some(p) => p.get(at).map(|&i| i as usize),
        }
    }

    /// The queue offset of the next message it holds.
    fn position(&self) -> Option<u64> {
        Some(
            self.batch
                .messages
                .get(self.index(self.next)?)?
                .queue_offset,
        )
    }
}

impl ReadyQueue {
    /// Messages waiting (an upper bound for runs).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push_back(&mut self, r: Ready) {
        self.len += 1;
        self.items.push_back(Item::One(r));
    }

    /// Puts back a message taken out (the window was full after all).
    pub fn push_front(&mut self, r: Ready) {
        self.len += 1;
        self.items.push_front(Item::One(r));
    }

    /// Queues the messages of `batch` at `picks` (`None`: all), those at queue
    /// offset `from` or above.
    pub fn push_run(&mut self, batch: Arc<Batch>, picks: Option<Box<[u32]>>, from: u64) {
        // Skip what is below `from` (the batch's messages are in offset order).
        let below = |i: usize| batch.messages.get(i).is_some_and(|m| m.queue_offset < from);
        let next = match &picks {
            None => (0..batch.messages.len()).take_while(|&i| below(i)).count(),
            Some(p) => p.iter().take_while(|&&i| below(i as usize)).count(),
        };
        let run = Run { batch, picks, next };
        if run.left() == 0 || run.batch.next <= from {
            return;
        }
        self.len += run.left();
        self.items.push_back(Item::Run(run));
    }

    /// The first message waiting when it is a single one (a run's next message
    /// is not known until it is matched).
    pub fn front_one(&self) -> Option<&Ready> {
        match self.items.front() {
            Some(Item::One(r)) => Some(r),
            _ => None,
        }
    }

    /// Takes the next message; `expand` makes a run's message `i` of its batch
    /// into one for the session (`None`: it is not for it, the next is tried).
    pub fn pop_with(
        &mut self,
        mut expand: impl FnMut(&Batch, usize) -> Option<Ready>,
    ) -> Option<Ready> {
        loop {
            match self.items.front_mut()? {
                Item::One(_) => {
                    if let Some(Item::One(r)) = self.items.pop_front() {
                        self.len -= 1;
                        return Some(r);
                    }
                }
                Item::Run(run) => {
                    let at = run.next;
                    run.next += 1;
                    let done = run.next >= run.total();
                    let made = if at < run.total() {
                        self.len -= 1;
                        run.index(at).and_then(|i| expand(&run.batch, i))
                    } else {
                        None
                    };
                    if done {
                        self.items.pop_front();
                    }
                    if made.is_some() {
                        return made;
                    }
                }
            }
        }
    }

    /// Keeps the single messages `keep` says to keep (runs all stay).
    pub fn retain_ones(&mut self, mut keep: impl FnMut(&Ready) -> bool) {
        let mut dropped = 0;
        self.items.retain(|item| match item {
            Item::One(r) if !keep(r) => {
                dropped += 1;
                false
            }
            _ => true,
        });
        self.len -= dropped;
    }

    /// Drops everything waiting from queue `queue` of core topic `topic`.
    pub fn drop_queue(&mut self, topic: &str, queue: u32) {
        let mut dropped = 0;
        self.items.retain(|item| {
            let (of_it, n) = match item {
                Item::One(r) => (
                    matches!(&r.source, Source::Log { topic: t, queue: q, .. } if **t == *topic && *q == queue),
                    1,
                ),
                Item::Run(run) => (
                    *run.batch.topic == *topic && run.batch.queue == queue,
                    run.left(),
                ),
            };
            if of_it {
                dropped += n;
            }
            !of_it
        });
        self.len -= dropped;
    }

    /// For every log message waiting: its core topic, queue and offset (a run
    /// gives only its next one; the rest come after it).
    pub fn log_positions(&self) -> impl Iterator<Item = (&Arc<str>, u32, u64)> {
        self.items.iter().filter_map(|item| match item {
            Item::One(Ready {
                source:
                    Source::Log {
                        topic,
                        queue,
                        offset,
                    },
                ..
            }) => Some((topic, *queue, *offset)),
            Item::One(_) => None,
            Item::Run(run) => Some((&run.batch.topic, run.batch.queue, run.position()?)),
        })
    }

    /// Empties the queue.
    pub fn take(&mut self) -> ReadyQueue {
        std::mem::take(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use mqttbytes::QoS;
    use rocketgate_core::broker::Delivered;

    fn batch(offsets: std::ops::Range<u64>) -> Arc<Batch> {
        let messages: Vec<Delivered> = offsets
            .clone()
            .map(|o| Delivered {
                queue_id: 0,
                queue_offset: o,
                record: Bytes::from(o.to_string()),
            })
            .collect();
        Arc::new(Batch {
            topic: Arc::from("t"),
            queue: 0,
            from: offsets.start,
            next: offsets.end,
            messages,
            names: Vec::new(),
            heads: Vec::new(),
        })
    }

    fn one(offset: u64) -> Ready {
        Ready {
            publish: Outgoing {
                topic: Arc::from("t"),
                payload: Bytes::from(offset.to_string()),
                properties: None,
                pkid: 0,
                qos: QoS::AtLeastOnce,
                retain: false,
                dup: false,
            },
            source: Source::Log {
                topic: Arc::from("t"),
                queue: 0,
                offset,
            },
            stored: Stored::NONE,
        }
    }

    /// A run's messages made into `Ready`s; odd offsets are not for the session.
    fn evens(b: &Batch, i: usize) -> Option<Ready> {
        let o = b.messages[i].queue_offset;
        o.is_multiple_of(2).then(|| one(o))
    }

    fn offset(r: &Ready) -> u64 {
        match r.source {
            Source::Log { offset, .. } => offset,
            _ => u64::MAX,
        }
    }

    #[test]
    fn runs_and_single_messages_come_out_in_order_matched_one_at_a_time() {
        let mut q = ReadyQueue::default();
        q.push_back(one(100));
        q.push_run(batch(10..16), None, 12);
        q.push_run(batch(20..30), Some(vec![0, 4, 5].into()), 0);
        q.push_back(one(200));
        // 1 + 4 (offsets 12..16) + 3 picks + 1.
        assert_eq!(q.len(), 9);
        let mut got = Vec::new();
        while let Some(r) = q.pop_with(evens) {
            got.push(offset(&r));
        }
        assert_eq!(got, [100, 12, 14, 20, 24, 200]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn a_message_put_back_comes_out_first_and_is_counted() {
        let mut q = ReadyQueue::default();
        q.push_run(batch(0..4), None, 0);
        let r = q.pop_with(evens).unwrap();
        assert_eq!(q.len(), 3);
        q.push_front(r);
        assert_eq!(q.len(), 4);
        assert_eq!(q.front_one().map(offset), Some(0));
        assert_eq!(offset(&q.pop_with(evens).unwrap()), 0);
        assert_eq!(offset(&q.pop_with(evens).unwrap()), 2);
        assert!(q.pop_with(evens).is_none());
    }

    #[test]
    fn empty_runs_and_runs_behind_the_cursor_are_not_queued() {
        let mut q = ReadyQueue::default();
        q.push_run(batch(0..4), Some(Box::default()), 0);
        q.push_run(batch(0..4), None, 4);
        assert_eq!(q.len(), 0);
        assert!(q.pop_with(evens).is_none());
    }

    #[test]
    fn positions_say_where_each_queue_is_settled_up_to() {
        let mut q = ReadyQueue::default();
        q.push_run(batch(10..20), Some(vec![3, 4, 7].into()), 0);
        q.push_back(one(30));
        let pos: Vec<u64> = q.log_positions().map(|(_, _, o)| o).collect();
        assert_eq!(pos, [13, 30]);
        // 13 is not for the session, 14 is.
        assert_eq!(offset(&q.pop_with(evens).unwrap()), 14);
        let pos: Vec<u64> = q.log_positions().map(|(_, _, o)| o).collect();
        assert_eq!(pos, [17, 30]);
    }

    #[test]
    fn dropping_a_queue_drops_its_runs_and_messages() {
        let mut q = ReadyQueue::default();
        q.push_run(batch(0..8), None, 0);
        q.push_back(one(9));
        let mut other = one(5);
        other.source = Source::Retained;
        q.push_back(other);
        q.drop_queue("t", 0);
        assert_eq!(q.len(), 1);
        assert!(matches!(
            q.front_one().map(|r| &r.source),
            Some(Source::Retained)
        ));
        q.retain_ones(|r| !matches!(r.source, Source::Retained));
        assert_eq!(q.len(), 0);
        assert!(q.pop_with(evens).is_none());
    }
}
