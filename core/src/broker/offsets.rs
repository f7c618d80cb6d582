//! Consumer offsets kept by the broker: per (owner, topic, queue id), the next
//! queue offset the owner will consume. Persisted in
//! `<data_dir>/config/offsets.json`, rewritten atomically by the broker's
//! background flusher when something changed and once more on close (RocketMQ's
//! `ConsumerOffsetManager` does the same every 5 s).
//!
//! The owner is the consumer group for clustering groups and `group@member` for
//! broadcasting groups (see [`owner_key`]); this table does not care which.
//! An offset committed less than one flush interval before a crash is lost and
//! the owner re-consumes from the previous one: at-least-once, never a gap.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::persist;
use crate::Result;
use crate::sync::lock;

/// Separates group and member in a broadcasting owner key. Not a legal group
/// character, so `group@member` can never collide with a real group name.
pub const MEMBER_SEPARATOR: char = '@';

/// The offset owner of `member` in `group`: the group itself when clustering,
/// `group@member` when broadcasting (each member has its own offsets).
pub fn owner_key(group: &str, member: &str, broadcasting: bool) -> String {
    if broadcasting {
        format!("{group}{MEMBER_SEPARATOR}{member}")
    } else {
        group.to_owned()
    }
}

type Queues = BTreeMap<u32, u64>;

/// A set of queues: owner -> topic -> queue ids.
type QueueSet = BTreeMap<String, BTreeMap<String, Vec<u32>>>;

#[derive(Serialize, Deserialize, Default)]
struct OffsetsFile {
    version: u32,
    /// owner -> topic -> queue id -> next offset.
    offsets: BTreeMap<String, BTreeMap<String, Queues>>,
    /// On a slave: the queues whose offset was committed here and not yet confirmed
    /// by the master (see [`OffsetTable::local_changes`]). Absent on a master, so its
    /// file is what it always was.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    local: QueueSet,
}

/// The offset table. Not synchronized: the broker holds it under one short lock.
#[derive(Debug)]
pub struct OffsetTable {
    path: PathBuf,
    offsets: BTreeMap<String, BTreeMap<String, Queues>>,
    /// Bumped on every change, so a flush can tell whether the file is behind.
    version: u64,
    /// Queues whose offset was committed here (not applied from a master's log) and
    /// that a master has not confirmed yet: on a slave, what goes back to the master
    /// ([`OffsetTable::local_changes`]). Kept only while `replica` is set, and
    /// persisted with the offsets: a slave restarted before its master returns still
    /// sends them.
    local: std::collections::BTreeSet<(String, String, u32)>,
    /// Whether this table is a slave's (commits here are local changes). Off on a
    /// master: its positions need no return trip.
    replica: bool,
}

impl OffsetTable {
    pub fn open(config_dir: &Path) -> Result<OffsetTable> {
        let path = config_dir.join("offsets.json");
        let file: OffsetsFile = persist::read_json(&path)?.unwrap_or_default();
        let local = file
            .local
            .into_iter()
            .flat_map(|(owner, topics)| {
                topics.into_iter().flat_map(move |(topic, queues)| {
                    let owner = owner.clone();
                    queues
                        .into_iter()
                        .map(move |q| (owner.clone(), topic.clone(), q))
                })
            })
            .collect();
        Ok(OffsetTable {
            path,
            offsets: file.offsets,
            version: 0,
            local,
            replica: true,
        })
    }

    /// Says whether this is a slave's table (the broker does at open, from the
    /// store's role). A master forgets the local changes the file held (it was a
    /// slave before a promotion: its own positions are the group's now).
    pub fn set_replica(&mut self, replica: bool) {
        self.replica = replica;
        if !replica && !self.local.is_empty() {
            self.local.clear();
            self.version += 1;
        }
    }

    pub fn get(&self, owner: &str, topic: &str, queue_id: u32) -> Option<u64> {
        self.offsets.get(owner)?.get(topic)?.get(&queue_id).copied()
    }

    pub fn set(&mut self, owner: &str, topic: &str, queue_id: u32, offset: u64) {
        if self.replica {
            self.local
                .insert((owner.to_owned(), topic.to_owned(), queue_id));
        }
        self.store(owner, topic, queue_id, offset);
    }

    /// A master's offset from the replicated log, on a slave: taken unless a consumer
    /// here committed further than the master has seen (that goes back to the master,
    /// which keeps the higher of the two); once the master has it, the queue is no
    /// longer a local change. Returns whether the offset changed.
    pub fn set_from_master(
        &mut self,
        owner: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> bool {
        let key = (owner.to_owned(), topic.to_owned(), queue_id);
        let now = self.get(owner, topic, queue_id);
        if self.local.contains(&key) {
            if now.is_some_and(|n| n > offset) {
                return false;
            }
            self.local.remove(&key);
            // The file must lose the mark too, also when the offset stays.
            self.version += 1;
        }
        if now == Some(offset) {
            return false;
        }
        self.store(owner, topic, queue_id, offset);
        true
    }

    /// Offsets committed here that a master has not confirmed (see `local`).
    pub fn local_changes(&self) -> BTreeMap<String, BTreeMap<String, BTreeMap<u32, u64>>> {
        let mut out: BTreeMap<String, BTreeMap<String, BTreeMap<u32, u64>>> = BTreeMap::new();
        for (owner, topic, q) in &self.local {
            if let Some(off) = self.get(owner, topic, *q) {
                out.entry(owner.clone())
                    .or_default()
                    .entry(topic.clone())
                    .or_default()
                    .insert(*q, off);
            }
        }
        out
    }

    fn store(&mut self, owner: &str, topic: &str, queue_id: u32, offset: u64) {
        let slot = self
            .offsets
            .entry(owner.to_owned())
            .or_default()
            .entry(topic.to_owned())
            .or_default()
            .entry(queue_id)
            .or_insert(offset);
        *slot = offset;
        self.version += 1;
    }

    /// Every queue offset `owner` has for `topic`.
    pub fn of_topic(&self, owner: &str, topic: &str) -> Vec<(u32, u64)> {
        self.offsets
            .get(owner)
            .and_then(|t| t.get(topic))
            .map(|q| q.iter().map(|(q, o)| (*q, *o)).collect())
            .unwrap_or_default()
    }

    /// Every owner with offsets, sorted (groups, and `group@member` keys of
    /// broadcasting members).
    pub fn owners(&self) -> Vec<String> {
        self.offsets.keys().cloned().collect()
    }

    /// The topics `owner` has offsets for, sorted.
    pub fn topics_of(&self, owner: &str) -> Vec<String> {
        self.offsets
            .get(owner)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets every owner's offsets of a deleted topic.
    pub fn remove_topic(&mut self, topic: &str) {
        for topics in self.offsets.values_mut() {
            if topics.remove(topic).is_some() {
                self.version += 1;
            }
        }
        self.offsets.retain(|_, t| !t.is_empty());
    }

    /// Forgets every offset of a deleted group: the group's own and its
    /// broadcasting members' (`group@member`). Returns how many queue offsets went.
    pub fn remove_group(&mut self, group: &str) -> usize {
        let prefix = format!("{group}{MEMBER_SEPARATOR}");
        let owned = |o: &str| o == group || o.starts_with(&prefix);
        let gone: usize = self
            .offsets
            .iter()
            .filter(|(o, _)| owned(o))
            .flat_map(|(_, t)| t.values())
            .map(|q| q.len())
            .sum();
        self.offsets.retain(|o, _| !owned(o));
        self.local.retain(|(o, _, _)| !owned(o));
        if gone > 0 {
            self.version += 1;
        }
        gone
    }

    /// On a slave: forgets `owner`'s offsets of `topic` because the master did (a
    /// deleted group or topic), including a position committed here and not yet
    /// confirmed (it belongs to what was deleted). Returns whether any went.
    pub fn remove_from_master(&mut self, owner: &str, topic: &str) -> bool {
        self.local
            .retain(|(o, t, _)| !(o.as_str() == owner && t.as_str() == topic));
        let Some(topics) = self.offsets.get_mut(owner) else {
            return false;
        };
        let gone = topics.remove(topic).is_some();
        if topics.is_empty() {
            self.offsets.remove(owner);
        }
        if gone {
            self.version += 1;
        }
        gone
    }

    /// Every offset, as owner -> topic -> queue id -> next offset (a copy).
    pub fn all(&self) -> BTreeMap<String, BTreeMap<String, BTreeMap<u32, u64>>> {
        self.offsets.clone()
    }

    /// Moves every offset past its queue's end (`end(topic, queue)`) back to that
    /// end; returns how many moved. A committed offset is past the end only when the
    /// queue lost entries under it (a truncated log): left there, the group would skip
    /// the messages written next at those queue offsets.
    pub fn clamp_to_ends(&mut self, end: impl Fn(&str, u32) -> u64) -> usize {
        let mut moved = 0;
        for topics in self.offsets.values_mut() {
            for (topic, queues) in topics.iter_mut() {
                for (q, off) in queues.iter_mut() {
                    let e = end(topic, *q);
                    if *off > e {
                        *off = e;
                        moved += 1;
                    }
                }
            }
        }
        if moved > 0 {
            self.version += 1;
        }
        moved
    }

    /// Bumped on every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// A serialized snapshot and the version it reflects, so the file can be
    /// written without holding the table's lock.
    pub fn snapshot(&self) -> Result<(Vec<u8>, u64)> {
        let mut local = QueueSet::new();
        for (owner, topic, q) in &self.local {
            local
                .entry(owner.clone())
                .or_default()
                .entry(topic.clone())
                .or_default()
                .push(*q);
        }
        let file = OffsetsFile {
            version: 1,
            offsets: self.offsets.clone(),
            local,
        };
        let bytes = serde_json::to_vec_pretty(&file)
            .map_err(|e| crate::Error::InvalidArgument(format!("cannot encode offsets: {e}")))?;
        Ok((bytes, self.version))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The offset table shared by pullers, committers and the background flusher.
#[derive(Debug)]
pub struct Offsets {
    /// One short lock around the table; never held across an `.await` or a write.
    table: Mutex<OffsetTable>,
    /// The table version `offsets.json` holds. Held while the file is written, so
    /// two flushes never race and an older snapshot never replaces a newer one.
    file: Mutex<u64>,
}

impl Offsets {
    pub fn open(config_dir: &Path) -> Result<Offsets> {
        Ok(Offsets {
            table: Mutex::new(OffsetTable::open(config_dir)?),
            file: Mutex::new(0),
        })
    }

    /// The table, for a short read or update.
    pub fn table(&self) -> MutexGuard<'_, OffsetTable> {
        lock(&self.table)
    }

    /// Writes the file if the table changed since the last write.
    pub fn flush(&self) -> Result<()> {
        let mut written = lock(&self.file);
        let (bytes, version, path) = {
            let t = self.table();
            if t.version() == *written {
                return Ok(());
            }
            let (bytes, version) = t.snapshot()?;
            (bytes, version, t.path().to_path_buf())
        };
        persist::write_raw(&path, &bytes)?;
        *written = version;
        Ok(())
    }
}

/// Disk pressure's view of the offsets (`store.disk_full_policy = "refuse"`): a
/// message is read once every owner consuming its topic has committed past it.
/// An owner with offsets for the topic but none for a queue has read nothing of
/// that queue; a topic no owner has offsets for is `None` (all unread).
impl crate::store::ReadProgress for Offsets {
    fn consumed_below(&self, topic: &str, queue_id: u32) -> Option<u64> {
        let t = self.table();
        t.offsets
            .values()
            .filter_map(|topics| topics.get(topic))
            .map(|queues| queues.get(&queue_id).copied().unwrap_or(0))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_roundtrip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let offsets = Offsets::open(dir.path()).unwrap();
        offsets.flush().unwrap();
        assert!(
            !dir.path().join("offsets.json").exists(),
            "nothing to write"
        );
        {
            let mut t = offsets.table();
            t.set("g", "orders", 0, 5);
            t.set("g", "orders", 3, 9);
            t.set(&owner_key("b", "m1", true), "orders", 0, 2);
        }
        offsets.flush().unwrap();

        let t = OffsetTable::open(dir.path()).unwrap();
        assert_eq!(t.of_topic("g", "orders"), vec![(0, 5), (3, 9)]);
        assert_eq!(t.get("b@m1", "orders", 0), Some(2));
        assert_eq!(t.get("b", "orders", 0), None);
    }

    #[test]
    fn removing_a_topic_drops_its_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = OffsetTable::open(dir.path()).unwrap();
        t.set("g", "a", 0, 1);
        t.set("g", "b", 0, 1);
        t.remove_topic("a");
        assert_eq!(t.get("g", "a", 0), None);
        assert_eq!(t.get("g", "b", 0), Some(1));
    }
}
