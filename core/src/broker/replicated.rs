//! Broker state that travels through the replicated log (docs/replication.md,
//! "What a failover needs"): one replication path for the log and its metadata.
//!
//! So far the topic table and the subscription groups' settings: a master appends a
//! snapshot of both (JSON) to the system topic [`TOPICS_TOPIC`] when a slave joins and
//! whenever they changed (checked every second, and at once on a topic change); a
//! slave applies the newest snapshot its log holds. A snapshot, not a change list, so a
//! slave needs only the last record (retention may delete the older ones) and applying
//! one twice is harmless.

use serde::{Deserialize, Serialize};

use super::group_config::GroupConfig;
use super::local::Broker;
use super::schedule;
use super::topics::{TopicConfig, TopicKind};
use crate::store::Message;
use crate::{Error, Result};

/// The system topic the topic-table snapshots go to (queue 0).
pub const TOPICS_TOPIC: &str = "rmq_sys_rg_topics";

#[derive(Serialize, Deserialize)]
struct TopicSnapshot {
    version: u32,
    topics: Vec<TopicConfig>,
    /// Subscription groups' remembered settings (mode, max reconsume times).
    #[serde(default)]
    groups: std::collections::BTreeMap<String, GroupConfig>,
}

impl Broker {
    /// The topic table as one record for [`TOPICS_TOPIC`].
    pub fn topic_snapshot_message(&self) -> Result<Message> {
        let topics = self
            .topic_snapshot(TopicKind::All)
            .into_iter()
            .filter(|t| t.name != TOPICS_TOPIC)
            .collect();
        let groups = self.group_configs.all();
        let body = serde_json::to_vec(&TopicSnapshot {
            version: 1,
            topics,
            groups,
        })
        .map_err(|e| Error::InvalidArgument(format!("topic snapshot: {e}")))?;
        Ok(Message::new(TOPICS_TOPIC, 0, body))
    }

    /// On a master: appends the metadata snapshot to the log unless it equals
    /// `last` (the body written before; `None` writes anyway). Returns the body now in
    /// the log. Under sync replication the record does not wait for its copies: it
    /// reaches slaves with the log whenever they follow.
    pub async fn publish_topic_snapshot(&self, last: Option<&[u8]>) -> Result<Vec<u8>> {
        let msg = self.topic_snapshot_message()?;
        if last == Some(&msg.body[..]) {
            return Ok(msg.body.to_vec());
        }
        match self.store.put_batch_async(std::slice::from_ref(&msg)).await {
            Ok(_) | Err(Error::ReplicationTimeout { .. }) | Err(Error::NoInSyncReplica { .. }) => {
                Ok(msg.body.to_vec())
            }
            Err(e) => Err(e),
        }
    }

    /// On a slave: applies the newest topic snapshot in the replicated log if it is
    /// past queue offset `applied` (`None`: none applied yet). Creates and updates
    /// topics to match, deletes user topics the master no longer has. Returns the
    /// queue offset of the snapshot now applied.
    pub fn apply_replicated_topics(&self, applied: Option<u64>) -> Result<Option<u64>> {
        let (min, max) = self.store.queue_bounds(TOPICS_TOPIC, 0);
        if max == min || applied.is_some_and(|a| a + 1 >= max) {
            return Ok(applied);
        }
        let last = max - 1;
        let read = self.store.read_queue(TOPICS_TOPIC, 0, last, 1)?;
        let Some((_, entry)) = read.entries.first() else {
            return Ok(applied);
        };
        let rec = self.store.read_entry(entry)?;
        let view = rec.view()?;
        let snap: TopicSnapshot = serde_json::from_slice(view.body())
            .map_err(|e| Error::InvalidMessage(format!("bad topic snapshot at {last}: {e}")))?;
        let mut changed = 0;
        {
            let mut table = self.topics_write();
            for t in &snap.topics {
                let r = match table.get(&t.name) {
                    Some(now) if now == t => continue,
                    Some(_) => table.update(t.clone()),
                    None if t.is_system() => table.create_system(t.clone()),
                    None => table.create(t.clone()),
                };
                match r {
                    Ok(_) => changed += 1,
                    Err(e) => {
                        tracing::warn!(topic = t.name, error = %e, "cannot apply a replicated topic")
                    }
                }
            }
            let keep: std::collections::HashSet<&str> =
                snap.topics.iter().map(|t| t.name.as_str()).collect();
            for t in table.list(TopicKind::User) {
                if !keep.contains(t.name.as_str()) && !schedule::is_system_topic(&t.name) {
                    if let Err(e) = table.delete(&t.name) {
                        tracing::warn!(topic = t.name, error = %e, "cannot drop a topic the master deleted");
                    } else {
                        changed += 1;
                    }
                }
            }
        }
        let mine = self.group_configs.all();
        for (group, config) in &snap.groups {
            if mine.get(group) != Some(config) {
                let c = config.clone();
                match self.group_configs.update(group, |g| *g = c) {
                    Ok(()) => changed += 1,
                    Err(e) => tracing::warn!(group, error = %e, "cannot apply a replicated group"),
                }
            }
        }
        for group in mine.keys().filter(|g| !snap.groups.contains_key(*g)) {
            match self
                .group_configs
                .update(group, |g| *g = GroupConfig::default())
            {
                Ok(()) => changed += 1,
                Err(e) => {
                    tracing::warn!(group, error = %e, "cannot drop a group the master forgot")
                }
            }
        }
        if changed > 0 {
            tracing::info!(
                changed,
                topics = snap.topics.len(),
                groups = snap.groups.len(),
                "applied the master's topic table and groups"
            );
            self.note_topics_changed();
        }
        Ok(Some(last))
    }
}
