//! Small JSON state files of the broker (`<data_dir>/config/*.json`): read at
//! open, replaced atomically on change. A crash leaves either the old or the new
//! file, never a torn one: write a temp file, fsync it, rename it over the old
//! one, fsync the directory.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// Reads `path` as JSON; `None` when the file does not exist yet.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Corrupt {
            path: path.to_path_buf(),
            offset: e.column() as u64,
            reason: format!("not valid JSON for this file: {e}"),
        })
}

/// Replaces `path` with `value` as pretty JSON, atomically and durably.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::InvalidArgument(format!("cannot encode {}: {e}", path.display())))?;
    write_raw(path, &bytes)
}

/// Replaces `path` with `bytes`, atomically and durably.
pub(crate) fn write_raw(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::InvalidArgument(format!("{} has no parent", path.display())))?;
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = path.with_extension("json.tmp");
    let mut f = fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
    f.sync_all().map_err(|e| Error::io(&tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    // The rename is durable only once the directory entry is.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}
