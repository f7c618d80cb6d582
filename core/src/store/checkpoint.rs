//! The checkpoint file and the abort marker: what recovery trusts after a restart.
//!
//! The checkpoint records two commit-log positions, each written only after the
//! thing it describes is durable:
//! - `log_flushed`: every byte of the commit log below it was synced;
//! - `dispatched`: every record below it has its consume-queue and index entries
//!   synced.
//!
//! It is replaced atomically (write a temporary file, sync it, rename, sync the
//! directory), so a crash leaves either the old or the new checkpoint, never half of one.
//! The abort marker exists while a store is open; finding it at start means the last
//! run did not close cleanly.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::store::io::Files;
use crate::{Error, Result};

const CHECKPOINT: &str = "checkpoint";
const ABORT: &str = "abort";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    /// Commit-log bytes below this are durable.
    pub log_flushed: u64,
    /// Records below this have durable consume-queue and index entries.
    pub dispatched: u64,
    /// Wall-clock time of writing, ms since the epoch (for operators).
    pub written_at_ms: i64,
}

impl Checkpoint {
    /// Reads the checkpoint in `dir`; `None` when there is none or it cannot be parsed
    /// (recovery then scans the whole log, which is slow but always correct).
    pub fn load(dir: &Path) -> Option<Checkpoint> {
        let path = dir.join(CHECKPOINT);
        let text = fs::read(&path).ok()?;
        match serde_json::from_slice::<Checkpoint>(&text) {
            Ok(c) if c.version == 1 => Some(c),
            Ok(c) => {
                tracing::warn!(
                    version = c.version,
                    "unknown checkpoint version; scanning the whole log"
                );
                None
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable checkpoint; scanning the whole log");
                None
            }
        }
    }

    /// Atomically replaces the checkpoint in `dir`.
    pub fn store(&self, dir: &Path) -> Result<()> {
        self.store_with(dir, &Files::os())
    }

    /// [`Checkpoint::store`] through the given file operations.
    pub fn store_with(&self, dir: &Path, files: &Files) -> Result<()> {
        let tmp = dir.join("checkpoint.tmp");
        let body = serde_json::to_vec(self).expect("checkpoint serializes");
        let path = dir.join(CHECKPOINT);
        files
            .replace_file(&path, &tmp, &body)
            .map_err(|e| Error::io(&path, e))
    }
}

/// Presence of this file means the store is open (or crashed while open).
pub struct AbortMarker {
    path: PathBuf,
}

impl AbortMarker {
    /// Creates the marker; returns it and whether one was already there (unclean stop).
    pub fn create(dir: &Path) -> Result<(AbortMarker, bool)> {
        let path = dir.join(ABORT);
        let existed = path.exists();
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        let _ = writeln!(f, "{}", std::process::id());
        f.sync_all().map_err(|e| Error::io(&path, e))?;
        sync_dir(dir)?;
        Ok((AbortMarker { path }, existed))
    }

    /// Removes the marker after a clean close.
    pub fn remove(self) -> Result<()> {
        fs::remove_file(&self.path).map_err(|e| Error::io(&self.path, e))
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Checkpoint::load(dir.path()), None);
        let c = Checkpoint {
            version: 1,
            log_flushed: 42,
            dispatched: 40,
            written_at_ms: 7,
        };
        c.store(dir.path()).unwrap();
        assert_eq!(Checkpoint::load(dir.path()), Some(c));
        fs::write(dir.path().join(CHECKPOINT), b"{not json").unwrap();
        assert_eq!(Checkpoint::load(dir.path()), None);
    }

    #[test]
    fn abort_marker_tells_an_unclean_stop() {
        let dir = tempfile::tempdir().unwrap();
        let (m, existed) = AbortMarker::create(dir.path()).unwrap();
        assert!(!existed);
        drop(m); // a crash: the file stays
        let (m, existed) = AbortMarker::create(dir.path()).unwrap();
        assert!(existed);
        m.remove().unwrap();
        let (_m, existed) = AbortMarker::create(dir.path()).unwrap();
        assert!(!existed);
    }
}
