//! Delayed messages still waiting: listed by their real topic, cancelled one by one.
//!
//! Both read the schedule as the delivery loop left it (its live progress): the
//! level queues from each level's next offset, the timer queue from its low-water
//! mark, skipping what is delivered or cancelled. A cancel takes the delivery
//! loop's lock, so it never races a tick that is re-appending the same entry, and
//! returns only once `delay.json` holds it.

use bytes::Bytes;

use super::{DelayState, Entry, deliver_at};
use crate::broker::schedule;
use crate::store::RecordView;
use crate::store::record::{encode_msg_id, property};
use crate::sync::lock;
use crate::{Error, Result};

/// Schedule entries read per call while scanning.
const SCAN_BATCH: usize = 1024;

/// A delayed message that has not been delivered yet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Delayed {
    /// The id the send answered (store host + commit-log offset of the waiting
    /// record); [`crate::broker::MessagingApi::cancel_delayed`] takes it.
    pub msg_id: String,
    /// The producer's `UNIQ_KEY`, when it set one; cancel takes it too.
    pub uniq_key: Option<String>,
    pub topic: String,
    pub queue_id: u32,
    /// When it is due (ms since the epoch, broker clock).
    pub deliver_at_ms: i64,
    pub store_timestamp: i64,
    pub tags: Option<String>,
    pub keys: Vec<String>,
    pub body_size: usize,
}

impl Delayed {
    fn of(view: &RecordView<'_>) -> Option<Delayed> {
        Some(Delayed {
            msg_id: encode_msg_id(view.store_host(), u64::try_from(view.phys_offset()).ok()?),
            uniq_key: view
                .property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
                .map(str::to_owned),
            topic: view.property(property::REAL_TOPIC)?.to_owned(),
            queue_id: view.property(property::REAL_QUEUE_ID)?.parse().ok()?,
            deliver_at_ms: deliver_at(view),
            store_timestamp: view.store_timestamp(),
            tags: view.tags().map(str::to_owned),
            keys: view.keys().map(str::to_owned).collect(),
            body_size: view.body().len(),
        })
    }
}

/// The schedule entry a stored record is, if it is one.
fn entry_of(view: &RecordView<'_>) -> Option<Entry> {
    let offset = u64::try_from(view.queue_offset()).ok()?;
    match view.topic() {
        schedule::SCHEDULE_TOPIC => Some(Entry::Level {
            level: u32::try_from(view.queue_id()).ok()? + 1,
            offset,
        }),
        schedule::TIMER_TOPIC => Some(Entry::Timer { offset }),
        _ => None,
    }
}

impl DelayState {
    /// The pending delayed messages of `topic`, soonest first, at most `max`.
    pub(in crate::broker) async fn pending(&self, topic: &str, max: usize) -> Result<Vec<Delayed>> {
        // A snapshot: the scan must not hold up delivery.
        let live = self.scheduler.lock().await.live.clone();
        let mut found = Vec::new();
        let mut queues: Vec<(&str, u32, u64)> = self
            .opts
            .levels
            .iter()
            .map(|(level, _)| {
                let from = live.levels.get(&level).copied().unwrap_or(0);
                (schedule::SCHEDULE_TOPIC, level - 1, from)
            })
            .collect();
        queues.push((schedule::TIMER_TOPIC, 0, live.timer_base));
        for (queue_topic, queue_id, mut from) in queues {
            loop {
                let read = self
                    .store
                    .read_queue(queue_topic, queue_id, from, SCAN_BATCH)?;
                if read.entries.is_empty() {
                    break;
                }
                for (_, cq) in read.entries {
                    let record = self.store.read_entry(&cq)?;
                    let view = record.view()?;
                    if entry_of(&view).is_some_and(|e| !live.done(e))
                        && view.property(property::REAL_TOPIC) == Some(topic)
                        && let Some(d) = Delayed::of(&view)
                    {
                        found.push(d);
                    }
                }
                from = read.next_offset;
            }
        }
        found.sort_by(|a, b| {
            (a.deliver_at_ms, a.store_timestamp, &a.msg_id).cmp(&(
                b.deliver_at_ms,
                b.store_timestamp,
                &b.msg_id,
            ))
        });
        found.truncate(max);
        Ok(found)
    }

    /// Cancels the pending delayed message `id` (its offset message id or its
    /// `UNIQ_KEY`): it will never be delivered, also after a restart.
    pub(in crate::broker) async fn cancel(&self, id: &str) -> Result<Delayed> {
        let not_pending = || Error::MessageNotFound {
            what: format!("pending delayed with id {id:?} (unknown, delivered or cancelled)"),
        };
        let record = self.find(id)?.ok_or_else(not_pending)?;
        let view = RecordView::parse(&record)?;
        let entry = entry_of(&view).ok_or_else(not_pending)?;
        let delayed = Delayed::of(&view).ok_or_else(not_pending)?;
        {
            let mut s = self.scheduler.lock().await;
            if s.live.done(entry) {
                return Err(not_pending());
            }
            s.live.cancel(entry);
            let mut m = lock(&self.marks);
            m.durable.cancel(entry);
            m.version += 1;
        }
        self.flush(self.store.positions().flushed)?;
        tracing::info!(id, topic = delayed.topic, "delayed message cancelled");
        Ok(delayed)
    }

    /// The waiting record `id` names: by offset id, else by `UNIQ_KEY` in the
    /// schedule topics' index.
    fn find(&self, id: &str) -> Result<Option<Bytes>> {
        if let Ok(r) = self.store.read_by_msg_id(id) {
            let record = r.into_bytes();
            let view = RecordView::parse(&record)?;
            if entry_of(&view).is_some()
                && crate::store::record::decode_msg_id(id).is_ok_and(|(host, phys)| {
                    view.store_host() == host && view.phys_offset() == phys as i64
                })
            {
                return Ok(Some(record));
            }
            return Ok(None);
        }
        for topic in [schedule::SCHEDULE_TOPIC, schedule::TIMER_TOPIC] {
            let hits = self.store.query_by_key(topic, id, i64::MIN, i64::MAX, 16)?;
            for hit in hits {
                let record = hit.into_bytes();
                let uniq = RecordView::parse(&record)?
                    .property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
                    .map(str::to_owned);
                if uniq.as_deref() == Some(id) {
                    return Ok(Some(record));
                }
            }
        }
        Ok(None)
    }
}
