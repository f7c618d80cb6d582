//! Durable Raft storage in one directory: the log, the vote, the committed id and the last
//! snapshot.
//!
//! - `log`: append-only records `len: u32 LE | crc32(payload): u32 LE | payload` (the JSON
//!   of one Raft entry), `fdatasync`ed before openraft is told an append is flushed. On
//!   open, the first short or CRC-failing record and everything after it are cut off (a
//!   torn tail: an append that was never acknowledged). A conflict truncation cuts the
//!   file and syncs before returning. A purge rewrites the file without the purged
//!   entries (small: the controller's log holds a few hundred entries between snapshots).
//! - `vote`, `committed`, `purged`, `snapshot`: JSON, each replaced atomically (write a
//!   temporary file, sync it, rename, sync the directory).
//!
//! The state machine ([`StateStore`]) lives in memory and is rebuilt on open from the
//! snapshot file; openraft re-applies the committed log after it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Cursor, Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use rocketgate_base::sync::lock;
use serde::{Deserialize, Serialize};

use crate::TypeConfig;
use crate::state::{Groups, Outcome};

type NodeId = u64;
type Node = openraft::BasicNode;
type SErr = StorageError<NodeId>;

const LOG: &str = "log";
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const PURGED: &str = "purged";
const SNAPSHOT: &str = "snapshot";

fn write_err(e: impl std::error::Error + 'static) -> SErr {
    StorageIOError::write(&e).into()
}

fn read_err(e: impl std::error::Error + 'static) -> SErr {
    StorageIOError::read(&e).into()
}

/// Replaces `dir/name` with `bytes` atomically and durably.
fn replace(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// Reads `dir/name` as JSON; `None` when it does not exist.
fn load<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> std::io::Result<Option<T>> {
    match std::fs::read(dir.join(name)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn store<T: Serialize>(dir: &Path, name: &str, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    replace(dir, name, &bytes)
}

fn frame(entry: &Entry<TypeConfig>) -> std::io::Result<Vec<u8>> {
    let payload = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Whole records of `bytes` from the start: (entry, its file offset), and where the
/// valid part ends.
fn parse_log(bytes: &[u8]) -> (Vec<(Entry<TypeConfig>, u64)>, u64) {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap_or_default());
        let Some(payload) = bytes.get(pos + 8..pos + 8 + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Ok(entry) = serde_json::from_slice(payload) else {
            break;
        };
        out.push((entry, pos as u64));
        pos += 8 + len;
    }
    (out, pos as u64)
}

/// The log part of the storage. Cheap to clone (the reader openraft asks for is a clone).
#[derive(Clone)]
pub struct LogStore {
    /// Std lock, held for one file operation at a time, never across an `.await`.
    inner: Arc<Mutex<LogInner>>,
}

struct LogInner {
    dir: PathBuf,
    file: File,
    /// Where the next record goes.
    end: u64,
    /// Index -> (entry, offset of its record in `log`).
    entries: BTreeMap<u64, (Entry<TypeConfig>, u64)>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting a torn tail.
    pub fn open(dir: &Path) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOG);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (records, end) = parse_log(&bytes);
        if end < bytes.len() as u64 {
            tracing::warn!(
                cut = bytes.len() as u64 - end,
                "controller log: torn tail cut off"
            );
            file.set_len(end)?;
            file.sync_all()?;
        }
        let purged: Option<LogId<NodeId>> = load(dir, PURGED)?;
        let floor = purged.map(|p| p.index);
        let entries = records
            .into_iter()
            .filter(|(e, _)| floor.is_none_or(|f| e.log_id.index > f))
            .map(|(e, off)| (e.log_id.index, (e, off)))
            .collect();
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                dir: dir.to_owned(),
                file,
                end,
                entries,
                vote: load(dir, VOTE)?,
                committed: load(dir, COMMITTED)?,
                purged,
            })),
        })
    }
}

impl LogInner {
    fn append(&mut self, entries: Vec<Entry<TypeConfig>>) -> std::io::Result<()> {
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(entries.len());
        for e in entries {
            let off = self.end + buf.len() as u64;
            buf.extend_from_slice(&frame(&e)?);
            placed.push((e, off));
        }
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        self.end += buf.len() as u64;
        for (e, off) in placed {
            self.entries.insert(e.log_id.index, (e, off));
        }
        Ok(())
    }

    fn truncate(&mut self, index: u64) -> std::io::Result<()> {
        let Some((_, off)) = self.entries.get(&index) else {
            return Ok(());
        };
        let off = *off;
        self.file.set_len(off)?;
        self.file.sync_all()?;
        self.end = off;
        self.entries.split_off(&index);
        Ok(())
    }

    fn purge(&mut self, log_id: LogId<NodeId>) -> std::io::Result<()> {
        store(&self.dir, PURGED, &log_id)?;
        self.purged = Some(log_id);
        let keep = self.entries.split_off(&(log_id.index + 1));
        // Rewrite the file with what is kept; offsets change.
        let mut buf = Vec::new();
        let mut entries = BTreeMap::new();
        for (idx, (e, _)) in keep {
            let off = buf.len() as u64;
            buf.extend_from_slice(&frame(&e)?);
            entries.insert(idx, (e, off));
        }
        replace(&self.dir, LOG, &buf)?;
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(self.dir.join(LOG))?;
        self.end = buf.len() as u64;
        self.entries = entries;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let inner = lock(&self.inner);
        Ok(inner
            .entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let inner = lock(&self.inner);
        let last = inner
            .entries
            .last_key_value()
            .map(|(_, (e, _))| e.log_id)
            .or(inner.purged);
        Ok(LogState {
            last_purged_log_id: inner.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        let mut inner = lock(&self.inner);
        store(&inner.dir, VOTE, vote).map_err(|e| StorageIOError::write_vote(&e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        Ok(lock(&self.inner).vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SErr> {
        let mut inner = lock(&self.inner);
        store(&inner.dir, COMMITTED, &committed).map_err(write_err)?;
        inner.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SErr> {
        Ok(lock(&self.inner).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let result = lock(&self.inner).append(entries.into_iter().collect());
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let err = write_err(std::io::Error::new(e.kind(), e.to_string()));
                callback.log_io_completed(Err(e));
                Err(err)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        lock(&self.inner).truncate(log_id.index).map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        lock(&self.inner).purge(log_id).map_err(write_err)
    }
}

/// The state machine's content, shared with the request handler (which reads it).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    pub groups: Groups,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, Node>,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, Node>,
    data: Vec<u8>,
}

/// The state machine: [`Applied`] in memory, its last snapshot on disk.
#[derive(Clone)]
pub struct StateStore {
    dir: PathBuf,
    /// Std lock, held to apply a batch or copy the state, never across an `.await`.
    applied: Arc<Mutex<Applied>>,
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
}

impl StateStore {
    /// Opens the state machine in `dir`, starting from the stored snapshot if any.
    pub fn open(dir: &Path) -> std::io::Result<StateStore> {
        std::fs::create_dir_all(dir)?;
        let snap: Option<StoredSnapshot> = load(dir, SNAPSHOT)?;
        let applied = match &snap {
            Some(s) => serde_json::from_slice(&s.data)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?,
            None => Applied::default(),
        };
        Ok(StateStore {
            dir: dir.to_owned(),
            applied: Arc::new(Mutex::new(applied)),
            snapshot: Arc::new(Mutex::new(snap)),
        })
    }

    /// The state as applied so far, shared with readers.
    pub fn shared(&self) -> Arc<Mutex<Applied>> {
        self.applied.clone()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let applied = lock(&self.applied).clone();
        let data = serde_json::to_vec(&applied).map_err(read_err)?;
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id: format!(
                "{}-{}",
                applied.last_applied.map(|l| l.index).unwrap_or(0),
                crate::now_ms()
            ),
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        store(&self.dir, SNAPSHOT, &stored)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        *lock(&self.snapshot) = Some(stored);
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateStore {
    type SnapshotBuilder = StateStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>), SErr> {
        let a = lock(&self.applied);
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut a = lock(&self.applied);
        let mut out = Vec::new();
        for e in entries {
            a.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => out.push(Outcome::Applied(Default::default())),
                EntryPayload::Normal(cmd) => out.push(a.groups.apply(&cmd)),
                EntryPayload::Membership(m) => {
                    a.membership = StoredMembership::new(Some(e.log_id), m);
                    out.push(Outcome::Applied(Default::default()));
                }
            }
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let data = snapshot.into_inner();
        let mut applied: Applied = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        store(&self.dir, SNAPSHOT, &stored)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        *lock(&self.applied) = applied;
        *lock(&self.snapshot) = Some(stored);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        Ok(lock(&self.snapshot).as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::state::Command;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Command::Register {
                group: "g".into(),
                id: index,
                addr: format!("a{index}"),
                ha_addr: String::new(),
            }),
        }
    }

    fn indexes(s: &LogStore) -> Vec<u64> {
        lock(&s.inner).entries.keys().copied().collect()
    }

    #[test]
    fn the_log_survives_a_reopen_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(dir.path()).unwrap();
        lock(&s.inner)
            .append((1..=5).map(|i| entry(1, i)).collect())
            .unwrap();
        drop(s);
        // A torn append: half a record at the end.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(LOG))
            .unwrap();
        let half = frame(&entry(1, 6)).unwrap();
        f.write_all(&half[..half.len() / 2]).unwrap();
        drop(f);
        let s = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&s), vec![1, 2, 3, 4, 5]);
        // The cut tail is gone from the file: the next append lands where it belongs.
        lock(&s.inner).append(vec![entry(2, 6)]).unwrap();
        drop(s);
        let s = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&s), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(lock(&s.inner).entries[&6].0.log_id.leader_id.term, 2);
    }

    #[test]
    fn a_corrupt_record_ends_the_log_there() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(dir.path()).unwrap();
        lock(&s.inner)
            .append((1..=3).map(|i| entry(1, i)).collect())
            .unwrap();
        let off = lock(&s.inner).entries[&2].1 as usize;
        drop(s);
        let mut bytes = std::fs::read(dir.path().join(LOG)).unwrap();
        bytes[off + 12] ^= 0xff;
        std::fs::write(dir.path().join(LOG), bytes).unwrap();
        let s = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&s), vec![1]);
    }

    #[test]
    fn truncate_and_purge_are_durable() {
        let dir = tempfile::tempdir().unwrap();
        let s = LogStore::open(dir.path()).unwrap();
        lock(&s.inner)
            .append((1..=6).map(|i| entry(1, i)).collect())
            .unwrap();
        lock(&s.inner).truncate(5).unwrap();
        lock(&s.inner)
            .purge(LogId::new(CommittedLeaderId::new(1, 1), 2))
            .unwrap();
        lock(&s.inner).append(vec![entry(3, 5)]).unwrap();
        drop(s);
        let s = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&s), vec![3, 4, 5]);
        assert_eq!(lock(&s.inner).entries[&5].0.log_id.leader_id.term, 3);
        assert_eq!(lock(&s.inner).purged.map(|p| p.index), Some(2));
    }

    #[tokio::test]
    async fn vote_committed_and_snapshot_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = LogStore::open(dir.path()).unwrap();
        let vote = Vote::new_committed(4, 2);
        s.save_vote(&vote).await.unwrap();
        let committed = Some(LogId::new(CommittedLeaderId::new(4, 2), 9));
        s.save_committed(committed).await.unwrap();
        drop(s);
        let mut s = LogStore::open(dir.path()).unwrap();
        assert_eq!(s.read_vote().await.unwrap(), Some(vote));
        assert_eq!(s.read_committed().await.unwrap(), committed);

        let mut sm = StateStore::open(dir.path()).unwrap();
        sm.apply(vec![entry(1, 1), entry(1, 2)]).await.unwrap();
        let snap = sm.build_snapshot().await.unwrap();
        drop(sm);
        let mut sm = StateStore::open(dir.path()).unwrap();
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied, snap.meta.last_log_id);
        let g = lock(&sm.applied).groups.group("g").cloned().unwrap();
        assert_eq!(
            (g.master, g.master_epoch, g.replicas.len()),
            (Some(1), 1, 2)
        );
    }
}
