//! Deleting a consumer group ([`MessagingApi::delete_group`]): everything the
//! broker keeps for it goes — its remembered settings (`groups.json`), the
//! committed offsets of every owner (the group, and `group@member` for
//! broadcasting members), its POP cursors and in-flight leases, its retry topic
//! and, when asked, its dead-letter topic. A consumer of the group that comes
//! afterwards starts as a new group does (docs/broker.md, "Where a new group
//! starts"), not at the old offsets.
//!
//! Replication: a deletion is a master's change. The settings go with the next
//! topic-table snapshot (the slave drops groups the master forgot), the offsets
//! as tombstones of the next offset record, the POP state as `null` queue states of
//! the next POP record, the topics with the snapshot (`replicated.rs`). A slave
//! refuses a deletion (its master's next records would undo it).

use super::api::MessagingApi;
use super::group_config::GroupConfig;
use super::local::Broker;
use super::offsets::MEMBER_SEPARATOR;
use super::schedule;
use super::values::{GroupDeleted, GroupDeletion};
use crate::sync::lock;
use crate::{Error, Result};

impl Broker {
    pub(super) async fn delete_group_now(
        &self,
        group: &str,
        how: GroupDeletion,
    ) -> Result<GroupDeleted> {
        schedule::validate_group(group)?;
        if let Some(refusal) = self.store.write_refusal() {
            return Err(refusal);
        }
        let members: Vec<String> = {
            let mut groups = lock(&self.groups);
            groups.expire(self.clock.now_ms());
            groups.members(group).into_iter().map(|m| m.0).collect()
        };
        if !members.is_empty() && !how.force {
            return Err(Error::GroupInUse {
                group: group.to_owned(),
                members: members.len(),
                names: members.join(", "),
            });
        }
        let retry = schedule::retry_topic(group);
        let dlq = schedule::dlq_topic(group);
        let mut topics: Vec<String> = Vec::new();
        for t in [Some(&retry), how.dead_letters.then_some(&dlq)]
            .into_iter()
            .flatten()
        {
            if self.topic_config(t).is_ok() {
                topics.push(t.clone());
            }
        }
        let prefix = format!("{group}{MEMBER_SEPARATOR}");
        let has_offsets = self
            .offsets
            .table()
            .owners()
            .iter()
            .any(|o| o == group || o.starts_with(&prefix));
        let known = !members.is_empty()
            || has_offsets
            || self.group_configs.get(group) != GroupConfig::default()
            || self.pop.table().has_group(group)
            || !topics.is_empty();
        if !known {
            return Err(Error::GroupNotFound {
                group: group.to_owned(),
            });
        }
        {
            let mut groups = lock(&self.groups);
            for m in &members {
                groups.unregister(group, m);
            }
        }
        // Settings first: the one part written to disk at once, so a failed write
        // leaves the group whole rather than half deleted.
        self.group_configs
            .update(group, |c| *c = GroupConfig::default())?;
        let offsets = self.offsets.table().remove_group(group);
        let pop_queues = self.pop.table().remove_group(group);
        for t in &topics {
            match self.delete_topic(t).await {
                Ok(()) | Err(Error::TopicNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // Written now rather than at the next periodic flush, so a crash right after
        // the answer cannot bring the old positions back.
        self.offsets.flush()?;
        self.pop.flush()?;
        // The node re-publishes the topic snapshot (with the groups) at once.
        self.note_topics_changed();
        tracing::info!(
            group,
            offsets,
            pop_queues,
            members = members.len(),
            topics = ?topics,
            "deleted consumer group"
        );
        Ok(GroupDeleted {
            group: group.to_owned(),
            offsets,
            pop_queues,
            members: members.len(),
            topics,
        })
    }
}
