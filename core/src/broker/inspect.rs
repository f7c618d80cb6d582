//! Inspection and lookup for admin tools: queue bounds, consumer-group progress,
//! and finding messages by id, by key and by time.
//!
//! Nothing here keeps state: it reads the store (consume queues, the key index,
//! the commit log), the offset table and the live consumer groups.
//!
//! Ids. A message has two: the *offset message id* the store derives from its
//! store host and commit-log offset (what a send returns), and the producer's
//! `UNIQ_KEY` property (what RocketMQ clients call the message id). Both are 32
//! hex digits for IPv4, so [`Broker::lookup_id`] first decodes the id as an
//! offset id and keeps the record only if it really starts there with that
//! host; otherwise it asks the key index, where the dispatcher files every
//! `UNIQ_KEY` under `topic#uniqKey` (RocketMQ's scheme), topic by topic.
//!
//! Messages of transactions not yet committed are never found: they live in the
//! half topic, which is in no topic listing, and an offset id pointing into the
//! half or op topic is refused.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::group_config::GroupConfig;
use super::local::Broker;
use super::offsets::MEMBER_SEPARATOR;
use super::schedule;
use super::topics::TopicKind;
use super::values::{Delivered, GroupInfo, MemberInfo, QueueProgress, QueueStats};
use crate::store::RecordView;
use crate::store::record::{decode_msg_id, property};
use crate::sync::lock;
use crate::{Error, Result};

/// Consume-queue entries read per step of a time-range scan.
const TIME_SCAN_BATCH: usize = 256;
/// Index candidates examined per topic for one `UNIQ_KEY`.
const UNIQ_CANDIDATES: usize = 16;

/// Topics whose records lookups never return (uncommitted transactions and
/// their decisions).
fn hidden_topic(topic: &str) -> bool {
    topic == schedule::TRANS_HALF_TOPIC || topic == schedule::TRANS_OP_HALF_TOPIC
}

fn delivered(record: Bytes) -> Result<Delivered> {
    let view = RecordView::parse(&record)?;
    let queue_id = u32::try_from(view.queue_id()).unwrap_or(0);
    let queue_offset = u64::try_from(view.queue_offset()).unwrap_or(0);
    Ok(Delivered {
        queue_id,
        queue_offset,
        record,
    })
}

impl Broker {
    pub(super) fn queue_stats_of(&self, topic: &str) -> Result<Vec<QueueStats>> {
        let config = self.topic_config(topic)?;
        let queues = config.read_queues.max(config.write_queues);
        let mut out = Vec::with_capacity(queues as usize);
        for queue_id in 0..queues {
            let (min_offset, max_offset) = self.store.queue_bounds(topic, queue_id);
            let last_store_ms = if max_offset > min_offset {
                self.read_at(topic, queue_id, max_offset - 1)?
                    .and_then(|r| RecordView::parse(&r).ok().map(|v| v.store_timestamp()))
            } else {
                None
            };
            out.push(QueueStats {
                queue_id,
                min_offset,
                max_offset,
                last_store_ms,
            });
        }
        Ok(out)
    }

    pub(super) fn set_group_max_reconsume_times(
        &self,
        group: &str,
        max: Option<u32>,
    ) -> Result<()> {
        schedule::validate_group(group)?;
        self.group_configs
            .update(group, |c| c.max_reconsume_times = max)
    }

    pub(super) fn set_group_fifo(&self, group: &str, fifo: bool) -> Result<()> {
        schedule::validate_group(group)?;
        self.group_configs.update(group, |c| c.fifo = fifo)
    }

    pub(super) fn offset_at_time(&self, topic: &str, queue_id: u32, ts_ms: i64) -> Result<u64> {
        self.readable_queue(topic, queue_id)?;
        let (min, max) = self.store.queue_bounds(topic, queue_id);
        Ok(self
            .store
            .queue_offset_by_time(topic, queue_id, ts_ms)?
            .clamp(min, max))
    }

    pub(super) fn group_names(&self) -> Vec<String> {
        let mut names: BTreeSet<String> = {
            let mut groups = lock(&self.groups);
            groups.expire(self.clock.now_ms());
            groups.names().into_iter().collect()
        };
        names.extend(self.group_configs.names());
        for owner in self.offsets.table().owners() {
            let group = owner.split(MEMBER_SEPARATOR).next().unwrap_or(&owner);
            names.insert(group.to_owned());
        }
        names.into_iter().collect()
    }

    pub(super) fn describe_group(&self, group: &str) -> Result<GroupInfo> {
        schedule::validate_group(group)?;
        let (live_mode, members) = {
            let mut groups = lock(&self.groups);
            groups.expire(self.clock.now_ms());
            (groups.mode(group), groups.members(group))
        };
        let config = self.group_configs.get(group);
        let mode = live_mode.or(config.mode);
        // The offset owners of the group: itself, and one per broadcasting member.
        let member_prefix = format!("{group}{MEMBER_SEPARATOR}");
        let (owners, mut topics): (Vec<String>, BTreeSet<String>) = {
            let table = self.offsets.table();
            let owners: Vec<String> = table
                .owners()
                .into_iter()
                .filter(|o| o == group || o.starts_with(&member_prefix))
                .collect();
            let topics = owners.iter().flat_map(|o| table.topics_of(o)).collect();
            (owners, topics)
        };
        let remembered = config != GroupConfig::default();
        if members.is_empty() && owners.is_empty() && !remembered {
            return Err(Error::GroupNotFound {
                group: group.to_owned(),
            });
        }
        for (_, subs, _) in &members {
            topics.extend(subs.iter().map(|s| s.topic.clone()));
        }
        let mut progress = Vec::new();
        for topic in topics {
            let Ok(config) = self.topic_config(&topic) else {
                continue; // subscribed to a topic that does not exist (yet)
            };
            for queue_id in 0..config.read_queues {
                let (min, max_offset) = self.store.queue_bounds(&topic, queue_id);
                let committed = {
                    let table = self.offsets.table();
                    owners
                        .iter()
                        .filter_map(|o| table.get(o, &topic, queue_id))
                        .min()
                };
                progress.push(QueueProgress {
                    lag: max_offset.saturating_sub(committed.unwrap_or(min)),
                    topic: topic.clone(),
                    queue_id,
                    committed,
                    max_offset,
                });
            }
        }
        Ok(GroupInfo {
            group: group.to_owned(),
            mode,
            max_reconsume_times: config
                .max_reconsume_times
                .unwrap_or(self.opts.max_reconsume_times),
            fifo: config.fifo,
            members: members
                .into_iter()
                .map(|(member, subscriptions, last_seen_ms)| MemberInfo {
                    member,
                    subscriptions,
                    last_seen_ms,
                })
                .collect(),
            progress,
        })
    }

    /// See the module docs for how the two kinds of id are told apart.
    pub(super) fn lookup_id(&self, msg_id: &str) -> Result<Delivered> {
        let not_found = || Error::MessageNotFound {
            what: format!("with id {msg_id:?}"),
        };
        if let Some(record) = self.by_offset_id(msg_id) {
            let view = RecordView::parse(&record)?;
            if hidden_topic(view.topic()) {
                return Err(not_found());
            }
            return delivered(record);
        }
        // User topics first: the original message, not a retry or dead-letter
        // copy (which keep the UNIQ_KEY); delayed messages not yet delivered last.
        let mut topics: Vec<String> = self
            .topic_snapshot(TopicKind::User)
            .into_iter()
            .chain(self.topic_snapshot(TopicKind::System))
            .map(|c| c.name)
            .collect();
        topics.push(schedule::SCHEDULE_TOPIC.to_owned());
        topics.push(schedule::TIMER_TOPIC.to_owned());
        for topic in topics {
            let found =
                self.store
                    .query_by_key(&topic, msg_id, i64::MIN, i64::MAX, UNIQ_CANDIDATES)?;
            // The first stored copy in this topic (a DLQ re-send repeats the key).
            let oldest = found
                .into_iter()
                .map(|r| r.into_bytes())
                .filter(|r| {
                    RecordView::parse(r).is_ok_and(|v| {
                        v.property(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == Some(msg_id)
                    })
                })
                .min_by_key(|r| RecordView::parse(r).map_or(i64::MAX, |v| v.phys_offset()));
            if let Some(record) = oldest {
                return delivered(record);
            }
        }
        Err(not_found())
    }

    /// The record an offset message id names, if it is one: the record must
    /// start at the offset and carry the id's store host.
    fn by_offset_id(&self, msg_id: &str) -> Option<Bytes> {
        let (host, phys) = decode_msg_id(msg_id).ok()?;
        if phys >= self.store.positions().dispatched {
            return None;
        }
        let record = self.store.read_by_msg_id(msg_id).ok()?.into_bytes();
        let view = RecordView::parse(&record).ok()?;
        let genuine =
            u64::try_from(view.phys_offset()).ok() == Some(phys) && view.store_host() == host;
        genuine.then_some(record)
    }

    pub(super) fn lookup_key(&self, topic: &str, key: &str, max: usize) -> Result<Vec<Delivered>> {
        self.topic_config(topic)?;
        if max == 0 {
            return Ok(Vec::new());
        }
        self.store
            .query_by_key(topic, key, i64::MIN, i64::MAX, max)?
            .into_iter()
            .map(|r| delivered(r.into_bytes()))
            .collect()
    }

    pub(super) fn lookup_time(
        &self,
        topic: &str,
        begin_ms: i64,
        end_ms: i64,
        max: usize,
    ) -> Result<Vec<Delivered>> {
        let config = self.topic_config(topic)?;
        if begin_ms > end_ms {
            return Err(Error::InvalidArgument(format!(
                "the time range begins ({begin_ms}) after it ends ({end_ms})"
            )));
        }
        // (store time, queue, offset) of up to `max` messages per queue, then the
        // oldest `max` of all.
        let mut found: Vec<(i64, Delivered)> = Vec::new();
        for queue_id in 0..config.read_queues {
            let mut offset = self.offset_at_time(topic, queue_id, begin_ms)?;
            let mut taken = 0;
            'queue: while taken < max {
                let read = self
                    .store
                    .read_queue(topic, queue_id, offset, TIME_SCAN_BATCH)?;
                if read.entries.is_empty() {
                    break;
                }
                for (at, entry) in read.entries {
                    let record = self.store.read_entry(&entry)?.into_bytes();
                    let ts = RecordView::parse(&record)?.store_timestamp();
                    if ts > end_ms {
                        break 'queue;
                    }
                    if ts >= begin_ms {
                        found.push((
                            ts,
                            Delivered {
                                queue_id,
                                queue_offset: at,
                                record,
                            },
                        ));
                        taken += 1;
                        if taken >= max {
                            break 'queue;
                        }
                    }
                }
                offset = read.next_offset;
            }
        }
        found.sort_by_key(|(ts, d)| (*ts, d.queue_id, d.queue_offset));
        found.truncate(max);
        Ok(found.into_iter().map(|(_, d)| d).collect())
    }
}
