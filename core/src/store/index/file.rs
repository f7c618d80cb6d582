//! One index file: header, hash slots, entries (RocketMQ's IndexFile layout).

use std::path::Path;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::store::io::Files;
use crate::store::mapped::MappedFile;

pub(super) const HEADER_SIZE: usize = 40;
pub(super) const SLOT_SIZE: usize = 4;
pub(super) const ENTRY_SIZE: usize = 20;

// Header field positions.
const BEGIN_TS: usize = 0;
const END_TS: usize = 8;
const BEGIN_PHYS: usize = 16;
const END_PHYS: usize = 24;
const SLOTS_USED: usize = 32;
const COUNT: usize = 36;

/// The bytes of one file with `slots` slots and room for `max_entries` entries.
pub(super) fn file_size(slots: u32, max_entries: u32) -> Option<usize> {
    (slots as usize)
        .checked_mul(SLOT_SIZE)?
        .checked_add((max_entries as usize).checked_mul(ENTRY_SIZE)?)?
        .checked_add(HEADER_SIZE)
}

/// A decoded entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct IndexEntry {
    pub key_hash: i32,
    pub phys_offset: u64,
    /// Seconds since the file's begin timestamp.
    pub time_diff_s: i32,
    /// Number of the previous entry in the same slot's chain, 0 = end.
    pub prev: u32,
}

/// A snapshot of the header, read after the published entry count.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    pub begin_ts: i64,
    pub end_ts: i64,
    pub begin_phys: i64,
    pub end_phys: i64,
    pub count: u32,
}

#[derive(Debug)]
pub(super) struct IndexFile {
    /// The number in the file name (ms since the epoch); orders the files.
    pub name: u64,
    slots: u32,
    max_entries: u32,
    map: MappedFile,
}

impl IndexFile {
    pub(super) fn create(
        path: &Path,
        name: u64,
        slots: u32,
        max_entries: u32,
        io: &Files,
    ) -> Result<Self> {
        let len = file_size(slots, max_entries).ok_or_else(too_big)?;
        // Header and slots are written anywhere at any time: allocated now. The
        // entries grow from the front and are allocated as they come (`append`).
        let fixed = file_size(slots, 0).ok_or_else(too_big)?;
        Ok(Self {
            name,
            slots,
            max_entries,
            map: MappedFile::create(path, len, fixed, io)?,
        })
    }

    /// Maps an existing file; a wrong size or a header that does not parse is
    /// [`Error::Corrupt`].
    pub(super) fn open(
        path: &Path,
        name: u64,
        slots: u32,
        max_entries: u32,
        io: &Files,
    ) -> Result<Self> {
        let len = file_size(slots, max_entries).ok_or_else(too_big)?;
        let fixed = file_size(slots, 0).ok_or_else(too_big)?;
        let file = Self {
            name,
            slots,
            max_entries,
            map: MappedFile::open(path, len, fixed, io)?,
        };
        file.check_header()?;
        // The entries written so far (the count is checked to be in range above).
        let count = file.map.load_i32(COUNT, Ordering::Relaxed).max(0) as u32;
        file.map.allocate_to(fixed + count as usize * ENTRY_SIZE)?;
        Ok(file)
    }

    fn check_header(&self) -> Result<()> {
        let count = self.map.load_i32(COUNT, Ordering::Relaxed);
        let used = self.map.load_i32(SLOTS_USED, Ordering::Relaxed);
        let h = self.header_unchecked(count.max(0) as u32);
        let bad = if count < 0 || count as u32 > self.max_entries {
            Some(format!(
                "entry count {count} outside 0..={}",
                self.max_entries
            ))
        } else if used < 0 || used as u32 > self.slots || used > count {
            Some(format!(
                "used slot count {used} outside 0..={}",
                self.slots.min(count as u32)
            ))
        } else if count > 0
            && (h.begin_ts > h.end_ts || h.begin_phys < 0 || h.begin_phys > h.end_phys)
        {
            Some(format!(
                "inconsistent ranges: time {}..{}, phys {}..{}",
                h.begin_ts, h.end_ts, h.begin_phys, h.end_phys
            ))
        } else {
            None
        };
        match bad {
            None => Ok(()),
            Some(reason) => Err(Error::Corrupt {
                path: self.map.path().to_path_buf(),
                offset: 0,
                reason: format!("index header: {reason}"),
            }),
        }
    }

    pub(super) fn path(&self) -> &Path {
        self.map.path()
    }

    /// Published entry count (`Acquire`: entries up to it are fully written).
    pub(super) fn count(&self) -> u32 {
        self.map.load_i32(COUNT, Ordering::Acquire).max(0) as u32
    }

    pub(super) fn is_full(&self) -> bool {
        self.count() >= self.max_entries
    }

    /// The header as of the published count.
    pub(super) fn header(&self) -> Header {
        let count = self.count();
        self.header_unchecked(count)
    }

    fn header_unchecked(&self, count: u32) -> Header {
        Header {
            begin_ts: self.map.load_i64(BEGIN_TS, Ordering::Relaxed),
            end_ts: self.map.load_i64(END_TS, Ordering::Relaxed),
            begin_phys: self.map.load_i64(BEGIN_PHYS, Ordering::Relaxed),
            end_phys: self.map.load_i64(END_PHYS, Ordering::Relaxed),
            count,
        }
    }

    pub(super) fn slot_of(&self, key_hash: i32) -> u32 {
        key_hash.unsigned_abs() % self.slots
    }

    fn slot_pos(&self, slot: u32) -> usize {
        HEADER_SIZE + slot as usize * SLOT_SIZE
    }

    fn entry_pos(&self, n: u32) -> usize {
        HEADER_SIZE + self.slots as usize * SLOT_SIZE + (n as usize - 1) * ENTRY_SIZE
    }

    /// Head of a slot's chain (`Acquire`: the entry it names is fully written).
    /// 0 when empty, or when the stored value is out of range (torn file).
    pub(super) fn head(&self, slot: u32) -> u32 {
        let n = self.map.load_i32(self.slot_pos(slot), Ordering::Acquire);
        if n <= 0 || n as u32 > self.max_entries {
            0
        } else {
            n as u32
        }
    }

    /// Entry number `n` (1-based), which the caller reached through a chain.
    pub(super) fn entry(&self, n: u32) -> IndexEntry {
        let b: [u8; ENTRY_SIZE] = self.map.load(self.entry_pos(n), Ordering::Relaxed);
        let i32_at = |p: usize| i32::from_be_bytes([b[p], b[p + 1], b[p + 2], b[p + 3]]);
        let phys = i64::from_be_bytes(b[4..12].try_into().unwrap_or([0; 8]));
        IndexEntry {
            key_hash: i32_at(0),
            phys_offset: phys.max(0) as u64,
            time_diff_s: i32_at(12),
            prev: i32_at(16).max(0) as u32,
        }
    }

    /// Appends an entry (writer only; the file is not full). Writes the entry,
    /// then the header, then publishes the count and finally the slot head, all
    /// with `Release`, so a reader that sees either sees the entry.
    /// Fails (writing nothing) when the entry's blocks cannot be allocated.
    pub(super) fn append(&self, key_hash: i32, phys: u64, ts_ms: i64) -> Result<()> {
        let count = self.count();
        debug_assert!(count < self.max_entries);
        let n = count + 1;
        self.map.allocate_to(self.entry_pos(n) + ENTRY_SIZE)?;
        let slot = self.slot_of(key_hash);
        let prev = self.head(slot);
        let begin_ts = if n == 1 {
            ts_ms
        } else {
            self.map.load_i64(BEGIN_TS, Ordering::Relaxed)
        };
        let diff_s = (ts_ms.max(begin_ts) - begin_ts) / 1000;
        let diff_s = i32::try_from(diff_s).unwrap_or(i32::MAX);

        let mut b = [0u8; ENTRY_SIZE];
        b[0..4].copy_from_slice(&key_hash.to_be_bytes());
        b[4..12].copy_from_slice(&(phys as i64).to_be_bytes());
        b[12..16].copy_from_slice(&diff_s.to_be_bytes());
        b[16..20].copy_from_slice(&(prev as i32).to_be_bytes());
        self.map.store(self.entry_pos(n), &b, Ordering::Relaxed);

        let m = &self.map;
        if n == 1 {
            m.store_i64(BEGIN_TS, ts_ms, Ordering::Relaxed);
            m.store_i64(END_TS, ts_ms, Ordering::Relaxed);
            m.store_i64(BEGIN_PHYS, phys as i64, Ordering::Relaxed);
            m.store_i64(END_PHYS, phys as i64, Ordering::Relaxed);
        } else {
            let end_ts = m.load_i64(END_TS, Ordering::Relaxed).max(ts_ms);
            let end_phys = m.load_i64(END_PHYS, Ordering::Relaxed).max(phys as i64);
            m.store_i64(END_TS, end_ts, Ordering::Relaxed);
            m.store_i64(END_PHYS, end_phys, Ordering::Relaxed);
        }
        if prev == 0 {
            let used = m.load_i32(SLOTS_USED, Ordering::Relaxed);
            m.store_i32(SLOTS_USED, used + 1, Ordering::Relaxed);
        }
        m.store_i32(COUNT, n as i32, Ordering::Release);
        m.store_i32(self.slot_pos(slot), n as i32, Ordering::Release);
        Ok(())
    }

    pub(super) fn flush(&self) -> Result<()> {
        self.map.flush()
    }
}

fn too_big() -> Error {
    Error::InvalidArgument("index file size overflows usize".into())
}
