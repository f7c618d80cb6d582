//! Retry with back-off, then dead-letter: RocketMQ's `CONSUMER_SEND_MSG_BACK`.
//!
//! A consumer that failed a message sends it back (`Broker::send_back_message`).
//! The broker reads the stored record, and from its reconsume times decides
//! ([`schedule::DelayLevels::next_retry`]):
//! - a retry: a copy goes to `%RETRY%<group>` (queue 0) through the delay
//!   machinery at level `3 + reconsume times` (10s, 30s, 1m, ... 2h), with its
//!   reconsume times raised by one;
//! - out of attempts: a copy goes to `%DLQ%<group>` (queue 0) at once.
//!
//! Either copy keeps body, flag, tags, keys and user properties, and records its
//! origin in `RETRY_TOPIC` (the original topic, kept across retries) and
//! `ORIGIN_MESSAGE_ID` (the first message's id). A POP message whose
//! invisibility ran out once too often goes to the DLQ the same way
//! (see `pop.rs`). Dead letters are re-sent to their original topic with
//! `Broker::resend_dead_letters_from`, reconsume times reset.
//!
//! The retry and DLQ topics are system topics created on first use; nothing
//! here keeps state of its own: the copies are ordinary records, so they
//! survive a restart with the store (and the delay progress).

use bytes::Bytes;

use super::api::MessagingApi;
use super::delay;
use super::local::Broker;
use super::schedule::{self, RetryDecision};
use super::values::{DeadLetters, QueueChoice, SendBackResult, SendResult};
use crate::store::record::{encode_msg_id, property};
use crate::store::{Message, RecordView};
use crate::{Error, Result};

/// The message to store for a failed consumption of `view`, read from `topic`,
/// and where it goes (pure). `delay_level`: `None` or 0 for the back-off table,
/// else that level.
pub fn retry_message(
    view: &RecordView<'_>,
    group: &str,
    levels: &schedule::DelayLevels,
    max_reconsume_times: u32,
    delay_level: Option<u8>,
) -> (Message, RetryDecision) {
    let reconsume = u32::try_from(view.reconsume_times()).unwrap_or(0);
    let mut decision = levels.next_retry(reconsume, max_reconsume_times);
    if let (RetryDecision::Retry { .. }, Some(l)) = (decision, delay_level.filter(|l| *l > 0)) {
        let level = levels.effective_level(u32::from(l));
        decision = RetryDecision::Retry {
            delay_level: level,
            delay: levels.delay_of(level).unwrap_or_default(),
        };
    }
    let mut msg = origin_marked(view);
    msg.reconsume_times = i32::try_from(reconsume.saturating_add(1)).unwrap_or(i32::MAX);
    msg.queue_id = 0;
    match decision {
        RetryDecision::Retry { delay_level, .. } => {
            msg.topic = schedule::retry_topic(group);
            msg.insert_property(property::DELAY_TIME_LEVEL, delay_level.to_string());
        }
        RetryDecision::DeadLetter => msg.topic = schedule::dlq_topic(group),
    }
    (msg, decision)
}

/// A copy of the stored message with its origin in `RETRY_TOPIC` and
/// `ORIGIN_MESSAGE_ID` (the values already there, from an earlier retry, win)
/// and no delay properties.
fn origin_marked(view: &RecordView<'_>) -> Message {
    let mut msg = view.to_message();
    for p in delay::DELAY_PROPERTIES {
        msg.remove_property(p);
    }
    if msg.property(property::RETRY_TOPIC).is_none() {
        msg.insert_property(property::RETRY_TOPIC, view.topic());
    }
    if msg.property(property::ORIGIN_MESSAGE_ID).is_none() {
        let id = view
            .property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            .map(str::to_owned)
            .unwrap_or_else(|| encode_msg_id(view.store_host(), view.phys_offset().max(0) as u64));
        msg.insert_property(property::ORIGIN_MESSAGE_ID, id);
    }
    msg
}

impl Broker {
    /// Reads the record at one queue offset, or fails with
    /// [`Error::MessageNotFound`].
    fn stored(&self, topic: &str, queue_id: u32, offset: u64) -> Result<Bytes> {
        self.read_at(topic, queue_id, offset)?
            .ok_or_else(|| Error::MessageNotFound {
                what: format!("at offset {offset} of queue {queue_id} of topic {topic:?}"),
            })
    }

    pub(super) async fn send_back_message(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        delay_level: Option<u8>,
    ) -> Result<SendBackResult> {
        schedule::validate_group(group)?;
        let record = self.stored(topic, queue_id, offset)?;
        let view = RecordView::parse(&record)?;
        let (msg, decision) = retry_message(
            &view,
            group,
            &self.opts.delay.levels,
            self.max_reconsume_times(group),
            delay_level,
        );
        let reconsume_times = u32::try_from(msg.reconsume_times).unwrap_or(0);
        let sent = self.send(msg, QueueChoice::Queue(0)).await?;
        // A POP consumer's failure: the copy is the retry, so the popped message
        // must not also come back when its invisibility runs out.
        self.pop.table().forget(group, topic, queue_id, offset);
        self.sync_consume_offset(group, topic, queue_id);
        Ok(SendBackResult {
            decision,
            reconsume_times,
            sent,
        })
    }

    /// Dead-letters a POP message whose invisibility ran out after its last
    /// allowed delivery (`attempt` deliveries in all). The caller forgets the
    /// lease only after this returned, so a failure leaves it in flight.
    pub(super) async fn dead_letter_popped(
        &self,
        group: &str,
        record: &Bytes,
        attempt: u32,
    ) -> Result<SendResult> {
        let view = RecordView::parse(record)?;
        let mut msg = origin_marked(&view);
        msg.reconsume_times = view
            .reconsume_times()
            .saturating_add(i32::try_from(attempt).unwrap_or(i32::MAX));
        msg.topic = schedule::dlq_topic(group);
        msg.queue_id = 0;
        tracing::info!(group, attempt, "POP message out of attempts; dead-lettered");
        self.send(msg, QueueChoice::Queue(0)).await
    }

    pub(super) async fn resend_dead_letters_from(
        &self,
        group: &str,
        which: DeadLetters,
    ) -> Result<Vec<SendResult>> {
        schedule::validate_group(group)?;
        let dlq = schedule::dlq_topic(group);
        self.topic_config(&dlq)?;
        let (min, max) = self.store.queue_bounds(&dlq, 0);
        let (from, to) = match which {
            DeadLetters::One(offset) => (offset, offset.saturating_add(1)),
            DeadLetters::All => {
                let done = self.offsets.table().get(group, &dlq, 0).unwrap_or(min);
                (done.max(min), max)
            }
        };
        let mut sent = Vec::new();
        for offset in from..to {
            let record = self.stored(&dlq, 0, offset)?;
            let msg = back_to_origin(&RecordView::parse(&record)?)?;
            sent.push(self.send(msg, QueueChoice::RoundRobin).await?);
        }
        if which == DeadLetters::All {
            self.offsets.table().set(group, &dlq, 0, to);
        }
        Ok(sent)
    }
}

/// A dead letter as it is re-sent: to its original topic, reconsume times 0,
/// `RETRY_TOPIC` gone (it is home again), `ORIGIN_MESSAGE_ID` kept.
fn back_to_origin(view: &RecordView<'_>) -> Result<Message> {
    let mut msg = view.to_message();
    let Some(topic) = msg.remove_property(property::RETRY_TOPIC) else {
        return Err(Error::InvalidMessage(format!(
            "dead letter at {} of {:?} has no {} property",
            view.queue_offset(),
            view.topic(),
            property::RETRY_TOPIC
        )));
    };
    msg.topic = topic;
    msg.reconsume_times = 0;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::store::record::encode;

    fn stored(msg: &Message) -> Vec<u8> {
        let host: SocketAddr = "127.0.0.1:10911".parse().unwrap();
        let mut out = Vec::new();
        encode(msg, &host, &mut out).unwrap();
        out
    }

    #[test]
    fn back_off_grows_and_the_last_failure_dead_letters() {
        let levels = schedule::DelayLevels::default();
        let mut msg = Message::new("t", 2, "b").with_property("UNIQ_KEY", "id-1");
        for (times, secs) in [(0, 10), (1, 30), (2, 60)] {
            msg.reconsume_times = times;
            let bytes = stored(&msg);
            let view = RecordView::parse(&bytes).unwrap();
            let (out, decision) = retry_message(&view, "g", &levels, 3, None);
            assert_eq!(
                decision,
                RetryDecision::Retry {
                    delay_level: 3 + times as u32,
                    delay: std::time::Duration::from_secs(secs)
                }
            );
            assert_eq!((out.topic.as_str(), out.queue_id), ("%RETRY%g", 0));
            assert_eq!(out.reconsume_times, times + 1);
            assert_eq!(out.property(property::RETRY_TOPIC), Some("t"));
            assert_eq!(out.property(property::ORIGIN_MESSAGE_ID), Some("id-1"));
        }
        msg.reconsume_times = 3;
        let bytes = stored(&msg);
        let (out, decision) = retry_message(
            &RecordView::parse(&bytes).unwrap(),
            "g",
            &levels,
            3,
            Some(1),
        );
        assert_eq!(decision, RetryDecision::DeadLetter);
        assert_eq!(out.topic, "%DLQ%g");
        assert_eq!(out.property(property::DELAY_TIME_LEVEL), None);
    }
}
