//! The table of every consume queue of the store.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tracing::warn;

use super::queue::ConsumeQueue;
use super::validate_topic;
use crate::error::{Error, Result};
use crate::store::io::Files;

/// Looked up several times per message (dispatch, every pull): foldhash, not
/// SipHash, which was a tenth of a message's instructions at light load (keys
/// are topic names the broker validated, and the seed is random per process).
type Table = foldhash::HashMap<String, foldhash::HashMap<u32, Arc<ConsumeQueue>>>;

/// Every consume queue, by topic and queue id.
///
/// Opening skips junk with a warning: a directory entry under `consumequeue/`
/// that is not a valid topic name, or under a topic that is not a `u32` queue
/// id, is not ours and is left alone. A *queue* that fails to open (wrong file
/// size, missing file) is an error: skipping it would silently lose messages.
#[derive(Debug)]
pub struct ConsumeQueues {
    root: PathBuf,
    entries_per_file: u64,
    /// A std `RwLock` because lookups (every pull) vastly outnumber inserts
    /// (a new queue) and it is held only for a map operation, never across file
    /// I/O or an `.await`. Nested by topic so `get(&str, u32)` needs no allocation.
    queues: RwLock<Table>,
    /// File operations (production: the syscalls; tests inject faults).
    io: Files,
}

impl ConsumeQueues {
    /// Loads every `<root>/consumequeue/<topic>/<queue_id>/` directory.
    pub fn open(root: &Path, entries_per_file: u64) -> Result<Self> {
        Self::open_with(root, entries_per_file, Files::os())
    }

    /// [`ConsumeQueues::open`] with the given file operations.
    pub fn open_with(root: &Path, entries_per_file: u64, io: Files) -> Result<Self> {
        let base = root.join("consumequeue");
        let mut table = Table::default();
        for (topic, qid) in list_queue_dirs(&base)? {
            let queue = ConsumeQueue::open_with(root, &topic, qid, entries_per_file, &io)?;
            table.entry(topic).or_default().insert(qid, Arc::new(queue));
        }
        Ok(Self {
            root: root.to_path_buf(),
            entries_per_file,
            queues: RwLock::new(table),
            io,
        })
    }

    fn read_table(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        // The map is only ever changed by single inserts/removes, so it is
        // consistent even if a holder panicked.
        crate::sync::read(&self.queues)
    }

    fn write_table(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        crate::sync::write(&self.queues)
    }

    pub fn get(&self, topic: &str, queue_id: u32) -> Option<Arc<ConsumeQueue>> {
        self.read_table().get(topic)?.get(&queue_id).cloned()
    }

    /// The queue, created (empty, no files yet) if it does not exist.
    pub fn get_or_create(&self, topic: &str, queue_id: u32) -> Result<Arc<ConsumeQueue>> {
        if let Some(q) = self.get(topic, queue_id) {
            return Ok(q);
        }
        // Opened outside the lock; if another thread wins the race ours is
        // dropped, which is harmless because an unwritten queue has no files.
        let fresh = Arc::new(ConsumeQueue::open_with(
            &self.root,
            topic,
            queue_id,
            self.entries_per_file,
            &self.io,
        )?);
        let mut table = self.write_table();
        Ok(table
            .entry(topic.to_string())
            .or_default()
            .entry(queue_id)
            .or_insert(fresh)
            .clone())
    }

    /// Every queue, sorted by (topic, queue id).
    pub fn queues(&self) -> Vec<(String, u32, Arc<ConsumeQueue>)> {
        let mut all: Vec<_> = self
            .read_table()
            .iter()
            .flat_map(|(t, qs)| qs.iter().map(move |(id, q)| (t.clone(), *id, q.clone())))
            .collect();
        all.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        all
    }

    fn each(&self, mut f: impl FnMut(&ConsumeQueue) -> Result<()>) -> Result<()> {
        let mut first_err = None;
        for (_, _, q) in self.queues() {
            if let Err(e) = f(&q) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// [`ConsumeQueue::release_cold`] on every queue.
    pub fn release_cold_all(&self, keep: u64) {
        for (_, _, q) in self.queues() {
            q.release_cold(keep);
        }
    }

    /// Flushes every queue; all are attempted, the first error is returned.
    pub fn flush_all(&self) -> Result<()> {
        self.each(|q| q.flush())
    }

    /// [`ConsumeQueue::truncate_from_phys`] on every queue; returns the number
    /// of entries dropped.
    pub fn truncate_all_from_phys(&self, phys_end: u64) -> Result<u64> {
        let mut dropped = 0;
        self.each(|q| {
            dropped += q.truncate_from_phys(phys_end)?;
            Ok(())
        })?;
        Ok(dropped)
    }

    /// [`ConsumeQueue::delete_before_phys`] on every queue; returns the number
    /// of files deleted.
    pub fn delete_all_before_phys(&self, min_phys: u64) -> Result<usize> {
        let mut deleted = 0;
        self.each(|q| {
            deleted += q.delete_before_phys(min_phys)?;
            Ok(())
        })?;
        Ok(deleted)
    }

    /// Removes every queue of `topic` and deletes its files. The caller stops
    /// dispatching to the topic first; readers holding an `Arc` keep reading
    /// the (unlinked) mapping until they drop it.
    pub fn remove_topic(&self, topic: &str) -> Result<()> {
        validate_topic(topic)?;
        let removed = self.write_table().remove(topic);
        for queue in removed.into_iter().flat_map(|queues| queues.into_values()) {
            queue.destroy()?;
        }
        let dir = self.root.join("consumequeue").join(topic);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&dir, e)),
        }
    }

    /// Each queue's `max_offset`: the queue offset the next message of that
    /// queue gets. Seeds the commit log's per-queue counters after a restart.
    pub fn next_offsets(&self) -> HashMap<(String, u32), u64> {
        self.queues()
            .into_iter()
            .map(|(t, id, q)| ((t, id), q.max_offset()))
            .collect()
    }
}

/// `(topic, queue id)` of every queue directory, skipping junk with a warning.
fn list_queue_dirs(base: &Path) -> Result<Vec<(String, u32)>> {
    let topics = match fs::read_dir(base) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(base, e)),
    };
    let mut out = Vec::new();
    for dent in topics {
        let dent = dent.map_err(|e| Error::io(base, e))?;
        let path = dent.path();
        let topic = match dent.file_name().into_string() {
            Ok(t) if path.is_dir() && validate_topic(&t).is_ok() => t,
            _ => {
                warn!(path = %path.display(), "ignoring entry in consumequeue/ that is not a topic");
                continue;
            }
        };
        for q in fs::read_dir(&path).map_err(|e| Error::io(&path, e))? {
            let q = q.map_err(|e| Error::io(&path, e))?;
            let qpath = q.path();
            let id = q
                .file_name()
                .to_str()
                .filter(|s| !s.starts_with('+') && qpath.is_dir())
                .and_then(|s| s.parse::<u32>().ok());
            match id {
                Some(id) => out.push((topic.clone(), id)),
                None => {
                    warn!(path = %qpath.display(), "ignoring entry that is not a queue id directory")
                }
            }
        }
    }
    Ok(out)
}
