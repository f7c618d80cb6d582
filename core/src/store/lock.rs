//! The data directory's lock: one process per data directory.
//!
//! Two brokers on one directory (other ports) both accepted writes into the same
//! commit log, and after a restart one of them had lost its acknowledged messages
//! (issue #25). [`DirLock`] takes an exclusive advisory `flock(2)` on
//! `<data_dir>/lock` for as long as the store is open. The kernel releases a
//! `flock` when its holder dies, even by `kill -9`, so a stale lock never blocks a
//! restart; the pid written into the file is only there to name the holder in the
//! error the second process prints.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// File name of the lock inside the data directory.
pub const LOCK_FILE: &str = "lock";

/// An exclusive lock on a data directory, released when dropped (or when the
/// process dies).
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    /// Holds the `flock`: closing the descriptor releases it.
    _file: File,
}

impl DirLock {
    /// Takes the lock on `dir`, or fails with [`Error::DataDirLocked`] naming the
    /// pid recorded by the process holding it.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        // SAFETY: a plain syscall on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut text = String::new();
                let holder = file
                    .read_to_string(&mut text)
                    .ok()
                    .and_then(|_| text.trim().parse::<u32>().ok());
                return Err(Error::DataDirLocked {
                    dir: dir.to_path_buf(),
                    holder,
                });
            }
            return Err(Error::io(&path, err));
        }
        // The pid is informational; failing to record it must not stop a start
        // that holds the lock (a full disk is reported by what needs space).
        let _ = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()));
        Ok(DirLock { path, _file: file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_names_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        match DirLock::acquire(dir.path()) {
            Err(Error::DataDirLocked { holder, .. }) => {
                assert_eq!(holder, Some(std::process::id()));
            }
            other => panic!("expected DataDirLocked, got {other:?}"),
        }
        drop(first);
        let again = DirLock::acquire(dir.path()).unwrap();
        assert!(again.path().ends_with(LOCK_FILE));
    }
}
