//! Where a broadcasting consumer keeps its offsets: a local JSON file per client and
//! group, as RocketMQ's `LocalFileOffsetStore`
//! (`<dir>/<client id>/<group>/offsets.json`, `dir` defaulting to
//! `~/.rocketmq_offsets`). Written atomically (temporary file, fsync, rename) on every
//! commit interval that changed something and on shutdown; read once at start.
//!
//! The file is ours, not Java's (fastjson writes object keys that are not JSON):
//! `{"offsetTable":[{"topic":"T","brokerName":"broker-a","queueId":0,"offset":42}]}`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::warn;

use rocketgate_remoting::body::MessageQueue;

/// `~/.rocketmq_offsets` (the system temp dir when there is no `HOME`).
pub(crate) fn default_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(".rocketmq_offsets")
}

/// A path component from a client id or group name: no separators, no `..`.
fn component(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "@#%-_.:".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        format!("_{s}")
    } else {
        s
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    topic: String,
    broker_name: String,
    queue_id: u32,
    offset: u64,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct File {
    offset_table: Vec<Entry>,
}

/// The offsets file of one broadcasting consumer.
#[derive(Debug, Clone)]
pub(crate) struct LocalOffsets {
    path: PathBuf,
}

impl LocalOffsets {
    pub fn new(dir: &Path, client_id: &str, group: &str) -> LocalOffsets {
        LocalOffsets {
            path: dir
                .join(component(client_id))
                .join(component(group))
                .join("offsets.json"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored offsets; empty when there is no file. A file that cannot be read or
    /// parsed is logged and ignored (the queues start as `consume_from` says).
    pub fn load(&self) -> BTreeMap<MessageQueue, u64> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "cannot read local offsets");
                return BTreeMap::new();
            }
        };
        match serde_json::from_slice::<File>(&text) {
            Ok(f) => f
                .offset_table
                .into_iter()
                .map(|e| {
                    (
                        MessageQueue::new(e.topic, e.broker_name, e.queue_id),
                        e.offset,
                    )
                })
                .collect(),
            Err(e) => {
                warn!(path = %self.path.display(), error = %e, "local offsets file is corrupt; ignored");
                BTreeMap::new()
            }
        }
    }

    /// Replaces the file with `offsets`: write a temporary file, fsync it, rename it
    /// over the old one, so a crash leaves either the old or the new table.
    pub fn save(&self, offsets: &BTreeMap<MessageQueue, u64>) -> std::io::Result<()> {
        let file = File {
            offset_table: offsets
                .iter()
                .map(|(q, o)| Entry {
                    topic: q.topic.clone(),
                    broker_name: q.broker_name.clone(),
                    queue_id: q.queue_id,
                    offset: *o,
                })
                .collect(),
        };
        let json = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = self.path.with_extension("json.tmp");
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        // Make the rename itself durable.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// The in-memory table of a broadcasting consumer and what its file last held.
pub(crate) struct Persisted {
    store: LocalOffsets,
    saved: BTreeMap<MessageQueue, u64>,
}

impl Persisted {
    /// Opens the store and returns it with the offsets it holds.
    pub fn open(store: LocalOffsets) -> (Persisted, BTreeMap<MessageQueue, u64>) {
        let saved = store.load();
        let offsets = saved.clone();
        (Persisted { store, saved }, offsets)
    }

    /// Writes `offsets` if they changed since the last successful write (off the
    /// runtime threads). A failure is logged and retried on the next call.
    pub async fn sync(&mut self, offsets: &BTreeMap<MessageQueue, u64>) {
        if *offsets == self.saved {
            return;
        }
        let (store, table) = (self.store.clone(), offsets.clone());
        match tokio::task::spawn_blocking(move || store.save(&table)).await {
            Ok(Ok(())) => self.saved = offsets.clone(),
            Ok(Err(e)) => {
                warn!(path = %self.store.path().display(), error = %e, "cannot write local offsets")
            }
            Err(e) => warn!(error = %e, "local offsets writer failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalOffsets::new(dir.path(), "127.0.0.1@42#0", "bc");
        assert!(store.load().is_empty());
        let mut offsets = BTreeMap::new();
        offsets.insert(MessageQueue::new("News", "broker-a", 0), 7);
        offsets.insert(MessageQueue::new("News", "broker-a", 3), 12);
        store.save(&offsets).unwrap();
        assert_eq!(store.load(), offsets);
        offsets.insert(MessageQueue::new("News", "broker-a", 0), 9);
        store.save(&offsets).unwrap();
        assert_eq!(store.load(), offsets);
        assert!(!store.path().with_extension("json.tmp").exists());
    }

    #[test]
    fn a_corrupt_file_is_ignored_and_names_cannot_escape_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalOffsets::new(dir.path(), "../../etc", "a/b");
        assert!(store.path().starts_with(dir.path()));
        assert!(!store.path().components().any(|c| c.as_os_str() == ".."));
        std::fs::create_dir_all(store.path().parent().unwrap()).unwrap();
        std::fs::write(store.path(), b"{not json").unwrap();
        assert!(store.load().is_empty());
    }
}
