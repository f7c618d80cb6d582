//! [`FaultyFiles`]: the store's file operations with faults injected, for tests
//! (this crate's, the doors', the binary's). Not used in production.
//!
//! - **Errors**: [`FaultyFiles::fail`] makes the next calls of one operation
//!   (optionally only on paths containing a string) fail with an `errno`:
//!   `EIO` from `fdatasync`/`msync`, `ENOSPC` from `pwrite`, `fallocate` or a
//!   metadata write, `EIO` from a read.
//! - **Torn write**: [`FaultyFiles::tear_next_write`] lets the next `pwrite`
//!   write only its first `keep` bytes and then "crashes": every later
//!   operation fails with `EIO`, as a dead process writes nothing more.
//! - **Power loss**: with [`FaultyFiles::with_power_loss`], every sync records
//!   the bytes it made durable (the range the caller asked for, in whole
//!   pages); [`FaultyFiles::crash`] stops all I/O and
//!   [`FaultyFiles::lose_power`] then rewrites each file as the disk would have
//!   it after the power went: every page that is not known durable is either
//!   the new bytes (the kernel happened to write it back) or the durable ones,
//!   decided by writing the dirty pages back in a random order and cutting the
//!   power at a random point.
//!
//! Files are known to the power-loss model from their first allocation (every
//! data file of the store is allocated when created or opened); the durable
//! image of a file first seen when it already exists is its content then (the
//! state a previous "boot" left). Directory entries are not modelled: a created
//! or renamed file is assumed to survive (the store fsyncs the directory before
//! it relies on a new segment, which `sync_dir` still does for real).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::MmapRaw;

use super::FileOps;

const PAGE: u64 = 4096;

/// The operations faults can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `pwrite` (write-through appends, recovery's zeroing).
    Write,
    /// `fdatasync` or `msync` of data.
    Sync,
    /// Sizing and block allocation (segment roll, queue and index files).
    Allocate,
    /// `fsync` of a directory.
    SyncDir,
    /// Atomic replacement of a metadata file (the checkpoint).
    Metadata,
    /// A read of stored bytes.
    Read,
}

#[derive(Debug)]
struct Rule {
    op: Op,
    path_contains: Option<String>,
    errno: i32,
    /// Matching calls still to let through before failing.
    skip: u64,
    /// Failures still to inject (`u64::MAX`: until cleared).
    remaining: u64,
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Rule>,
    /// Calls per operation and file that reached the file system (including
    /// failed ones).
    calls: HashMap<(Op, PathBuf), u64>,
    /// Bytes the next `pwrite` keeps before the simulated crash.
    tear: Option<usize>,
    /// Bytes the next `pwrite` keeps before failing with the errno.
    short: Option<(usize, i32)>,
    /// After a crash nothing reaches the disk any more.
    crashed: bool,
    /// Durable image per file (power-loss mode only).
    durable: Option<HashMap<PathBuf, Vec<u8>>>,
    rng: u64,
}

/// File operations with injected faults (see the module docs).
#[derive(Debug, Default)]
pub struct FaultyFiles {
    state: Mutex<State>,
}

/// An injected error: the plain OS error, so callers classify it as they would
/// a real one (`ENOSPC` is disk full, and so on).
fn injected(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl FaultyFiles {
    /// No faults until told.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also models what a power loss keeps ([`Self::lose_power`]); `seed` makes
    /// the random write-back order reproducible.
    pub fn with_power_loss(seed: u64) -> Self {
        let f = Self::default();
        {
            let mut st = f.lock();
            st.durable = Some(HashMap::new());
            st.rng = seed | 1;
        }
        f
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        rocketgate_base::sync::lock(&self.state)
    }

    /// The next `times` calls of `op` (on paths containing `path_contains`, if
    /// given) fail with `errno`, after letting `skip` matching calls through.
    /// `u64::MAX` times: until [`Self::clear`].
    pub fn fail(&self, op: Op, path_contains: Option<&str>, errno: i32, skip: u64, times: u64) {
        self.lock().rules.push(Rule {
            op,
            path_contains: path_contains.map(str::to_owned),
            errno,
            skip,
            remaining: times,
        });
    }

    /// Removes every injected error (not a crash).
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// The next `pwrite` writes only its first `keep` bytes, then the process
    /// "dies": it and every later operation fail with `EIO`.
    pub fn tear_next_write(&self, keep: usize) {
        self.lock().tear = Some(keep);
    }

    /// The next `pwrite` writes only its first `keep` bytes and fails with
    /// `errno` (a write that ran out of space part way); the process goes on.
    pub fn short_write(&self, keep: usize, errno: i32) {
        self.lock().short = Some((keep, errno));
    }

    /// Stops all I/O: every later operation fails with `EIO` (a dead machine).
    pub fn crash(&self) {
        self.lock().crashed = true;
    }

    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Calls of `op` that reached the file system so far.
    pub fn calls(&self, op: Op) -> u64 {
        self.calls_on(op, "")
    }

    /// Calls of `op` on paths containing `path_contains` so far.
    pub fn calls_on(&self, op: Op, path_contains: &str) -> u64 {
        self.lock()
            .calls
            .iter()
            .filter(|((o, p), _)| *o == op && p.to_string_lossy().contains(path_contains))
            .map(|(_, n)| n)
            .sum()
    }

    /// Counts the call and decides whether it fails.
    fn enter(&self, op: Op, path: &Path) -> io::Result<()> {
        let mut st = self.lock();
        if st.crashed {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        *st.calls.entry((op, path.to_path_buf())).or_insert(0) += 1;
        let hit = st.rules.iter_mut().find(|r| {
            r.op == op
                && r.remaining > 0
                && r.path_contains
                    .as_deref()
                    .is_none_or(|s| path.to_string_lossy().contains(s))
        });
        if let Some(rule) = hit {
            if rule.skip > 0 {
                rule.skip -= 1;
                return Ok(());
            }
            if rule.remaining != u64::MAX {
                rule.remaining -= 1;
            }
            let errno = rule.errno;
            tracing::debug!(?op, path = %path.display(), errno, "injected I/O error");
            return Err(injected(errno));
        }
        Ok(())
    }

    fn power_loss_on(&self) -> bool {
        self.lock().durable.is_some()
    }

    /// Records the durable image of a file seen for the first time.
    fn know(&self, path: &Path, file: &File) {
        let mut st = self.lock();
        let Some(durable) = st.durable.as_mut() else {
            return;
        };
        if !durable.contains_key(path) {
            let len = file.metadata().map_or(0, |m| m.len());
            let mut buf = vec![0u8; len as usize];
            let _ = file.read_exact_at(&mut buf, 0);
            durable.insert(path.to_path_buf(), buf);
        }
    }

    /// Marks `[from, to)` (widened to whole pages) of `path` durable with the
    /// bytes the file holds now.
    fn made_durable(&self, path: &Path, file: &File, from: u64, to: u64) {
        let mut st = self.lock();
        let Some(durable) = st.durable.as_mut() else {
            return;
        };
        let len = file.metadata().map_or(0, |m| m.len());
        let from = (from / PAGE * PAGE).min(len);
        let to = to.next_multiple_of(PAGE).min(len);
        if to <= from {
            return;
        }
        let image = durable.entry(path.to_path_buf()).or_default();
        if (image.len() as u64) < len {
            image.resize(len as usize, 0);
        }
        let _ = file.read_exact_at(&mut image[from as usize..to as usize], from);
    }

    fn next_random(st: &mut State) -> u64 {
        // xorshift64*: reproducible from the seed, good enough for an order.
        let mut x = st.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        st.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// After [`Self::crash`] and once the store is gone: rewrites every known
    /// file as a power loss would leave it. Returns (pages not durable, pages of
    /// them lost).
    pub fn lose_power(&self) -> io::Result<(u64, u64)> {
        let mut st = self.lock();
        let Some(durable) = st.durable.take() else {
            return Ok((0, 0));
        };
        let mut dirty: Vec<(PathBuf, u64)> = Vec::new();
        let mut current: HashMap<PathBuf, Vec<u8>> = HashMap::new();
        for (path, image) in &durable {
            let Ok(now) = std::fs::read(path) else {
                continue; // renamed or deleted since
            };
            let pages = (now.len() as u64).div_ceil(PAGE);
            for p in 0..pages {
                let lo = (p * PAGE) as usize;
                let hi = ((p + 1) * PAGE).min(now.len() as u64) as usize;
                let old = image.get(lo..hi.min(image.len())).unwrap_or(&[]);
                let differs = now[lo..hi]
                    .iter()
                    .enumerate()
                    .any(|(i, b)| *b != old.get(i).copied().unwrap_or(0));
                if differs {
                    dirty.push((path.clone(), p));
                }
            }
            current.insert(path.clone(), now);
        }
        // Write-back in a random order, cut at a random point.
        for i in (1..dirty.len()).rev() {
            let j = (Self::next_random(&mut st) % (i as u64 + 1)) as usize;
            dirty.swap(i, j);
        }
        let kept = if dirty.is_empty() {
            0
        } else {
            (Self::next_random(&mut st) % (dirty.len() as u64 + 1)) as usize
        };
        let lost = &dirty[kept..];
        for (path, p) in lost {
            let now = &current[path];
            let image = &durable[path];
            let lo = (p * PAGE) as usize;
            let hi = ((p + 1) * PAGE).min(now.len() as u64) as usize;
            let mut page = vec![0u8; hi - lo];
            for (i, b) in page.iter_mut().enumerate() {
                *b = image.get(lo + i).copied().unwrap_or(0);
            }
            let f = std::fs::OpenOptions::new().write(true).open(path)?;
            f.write_all_at(&page, lo as u64)?;
        }
        Ok((dirty.len() as u64, lost.len() as u64))
    }
}

impl FileOps for FaultyFiles {
    fn write_at(&self, file: &File, path: &Path, offset: u64, data: &[u8]) -> io::Result<()> {
        self.enter(Op::Write, path)?;
        let (tear, short) = {
            let mut st = self.lock();
            (st.tear.take(), st.short.take())
        };
        if let Some((keep, errno)) = short {
            file.write_all_at(&data[..keep.min(data.len())], offset)?;
            return Err(injected(errno));
        }
        if let Some(keep) = tear {
            file.write_all_at(&data[..keep.min(data.len())], offset)?;
            self.crash();
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        file.write_all_at(data, offset)
    }

    fn sync_data(&self, file: &File, path: &Path, range: (u64, u64)) -> io::Result<()> {
        self.enter(Op::Sync, path)?;
        if self.power_loss_on() {
            // The model decides what is durable; the real sync only costs time.
            self.made_durable(path, file, range.0, range.1);
            return Ok(());
        }
        file.sync_data()
    }

    fn sync_mapped(&self, map: &MmapRaw, path: &Path, offset: usize, len: usize) -> io::Result<()> {
        self.enter(Op::Sync, path)?;
        if self.power_loss_on() {
            if let Ok(file) = File::open(path) {
                self.made_durable(path, &file, offset as u64, (offset + len) as u64);
            }
            return Ok(());
        }
        map.flush_range(offset, len)
    }

    fn allocate(
        &self,
        file: &File,
        path: &Path,
        set_len: Option<u64>,
        from: u64,
        to: u64,
        strict: bool,
    ) -> io::Result<()> {
        self.enter(Op::Allocate, path)?;
        self.know(path, file);
        if let Some(len) = set_len {
            file.set_len(len)?;
        }
        super::fallocate(file, from, to, strict)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.enter(Op::SyncDir, dir)?;
        if self.power_loss_on() {
            return Ok(());
        }
        File::open(dir).and_then(|d| d.sync_all())
    }

    fn replace_file(&self, path: &Path, tmp: &Path, data: &[u8]) -> io::Result<()> {
        self.enter(Op::Metadata, path)?;
        std::fs::write(tmp, data)?;
        std::fs::rename(tmp, path)?;
        if let Some(durable) = self.lock().durable.as_mut() {
            durable.insert(path.to_path_buf(), data.to_vec());
        }
        Ok(())
    }

    fn check_read(&self, path: &Path, _offset: u64, _len: usize) -> io::Result<()> {
        let st = self.lock();
        if st.rules.iter().all(|r| r.op != Op::Read) {
            return Ok(());
        }
        drop(st);
        self.enter(Op::Read, path)
    }
}
