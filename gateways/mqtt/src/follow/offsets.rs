//! A persistent session's place in the log versus the core's consumer offsets of
//! its group `mqtt%c%<client id>`.
//!
//! The session reads with its own cursors and commits them as the group's offsets
//! (every second, and when the connection ends). Nothing else writes that group's
//! offsets except an operator: `POST /v1/groups/mqtt%25c%25<id>/offsets/reset`. So
//! before each commit, and when a session held in memory is resumed, the session
//! compares the core's offset of each queue with the one it last wrote or read
//! ([`Session::committed`](crate::session::Session)); a different value is a reset,
//! and the session moves there: its cursor takes the core's value, what it had
//! read of that queue but not sent is dropped, and what is in flight still goes
//! out and may be acknowledged but no longer holds the position back.
//!
//! A reset that lands between a check and the commit right after it is
//! overwritten by that commit: the window is one local call, and the operator
//! sees the group's offsets in the admin API to check.

use std::sync::Arc;

use rocketgate_core::broker::MessagingApi;

use super::Following;
use crate::ready::ReadyQueue;
use crate::session::{Session, Source};
use crate::shared::Shared;

impl Following {
    /// Moves every queue whose core offset someone else changed to that offset.
    pub(crate) async fn adopt_resets<B: MessagingApi + 'static>(
        &mut self,
        shared: &Shared<B>,
        session: &mut Session,
        ready: &mut ReadyQueue,
    ) {
        let known: Vec<_> = session
            .committed
            .iter()
            .map(|((t, q), v)| (t.clone(), *q, *v))
            .collect();
        for (topic, q, mine) in known {
            let core = match shared.api.query_offset(&session.group, "", &topic, q).await {
                Ok(Some(c)) => c,
                // No offset (the group was deleted) or an error: nothing to adopt.
                Ok(None) | Err(_) => continue,
            };
            if Some(core) != mine {
                tracing::info!(
                    client = %session.client_id, topic = %topic, queue = q,
                    from = ?mine, to = core, "adopting an offset reset"
                );
                self.move_queue(session, ready, topic, q, core);
            }
        }
    }

    fn move_queue(
        &mut self,
        session: &mut Session,
        ready: &mut ReadyQueue,
        topic: Arc<str>,
        queue: u32,
        to: u64,
    ) {
        let key = (topic, queue);
        ready.drop_queue(&key.0, key.1);
        for f in session.inflight.values_mut() {
            if let Source::Log {
                topic,
                queue,
                offset,
            } = &f.source
                && *topic == key.0
                && *queue == key.1
            {
                f.source = Source::Superseded {
                    topic: topic.clone(),
                    queue: *queue,
                    offset: *offset,
                };
            }
        }
        session.cursors.insert(key.clone(), to);
        session.committed.insert(key.clone(), Some(to));
        self.skipping.remove(&key);
        if self.joined.contains(&key.0) {
            // Read from the new place by pulling; live batches wait until then.
            self.pending.insert(key);
        }
    }
}
