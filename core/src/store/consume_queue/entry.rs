//! One consume-queue entry and the tag hash stored in it.

use crate::error::{Error, Result};

/// Bytes of one entry on disk.
pub const ENTRY_SIZE: usize = 20;

/// One consume-queue entry: where the message lives in the commit log and the
/// hash of its tag, so a tag filter can skip it without reading the message.
///
/// On disk (big-endian): phys offset `i64` | size `i32` | tag hash `i64`.
/// An all-zero slot is empty; a valid entry has `size > 0` (phys offset 0 is a
/// valid offset, the first message of the log).
///
/// RocketMQ's delay topic (`SCHEDULE_TOPIC_XXXX`) reuses the tag-hash field for
/// the delivery time in ms; we may do the same for our timer store, which is
/// why the field is a plain `i64` and not a newtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqEntry {
    /// Byte offset of the message in the commit log.
    pub phys_offset: u64,
    /// Size in bytes of the stored message record.
    pub size: u32,
    /// [`tag_hash`] of the message's tag (0 when it has none).
    pub tag_hash: i64,
}

impl CqEntry {
    pub fn new(phys_offset: u64, size: u32, tag_hash: i64) -> Self {
        Self {
            phys_offset,
            size,
            tag_hash,
        }
    }

    /// The commit-log offset one past the end of this message.
    pub fn phys_end(&self) -> u64 {
        self.phys_offset + u64::from(self.size)
    }

    /// Checks the entry fits the on-disk field widths.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.size == 0 || self.size > i32::MAX as u32 {
            return Err(Error::InvalidArgument(format!(
                "consume queue entry size {} must be in 1..=i32::MAX",
                self.size
            )));
        }
        if self.phys_offset > i64::MAX as u64 {
            return Err(Error::InvalidArgument(format!(
                "consume queue entry phys offset {} exceeds i64::MAX",
                self.phys_offset
            )));
        }
        Ok(())
    }

    /// Encodes the entry; callers have run [`CqEntry::validate`].
    pub(crate) fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut b = [0u8; ENTRY_SIZE];
        b[0..8].copy_from_slice(&(self.phys_offset as i64).to_be_bytes());
        b[8..12].copy_from_slice(&(self.size as i32).to_be_bytes());
        b[12..20].copy_from_slice(&self.tag_hash.to_be_bytes());
        b
    }

    /// Decodes a slot; `None` for an empty or torn slot (size <= 0, or a
    /// negative phys offset, which no writer produces).
    pub(crate) fn decode(b: &[u8; ENTRY_SIZE]) -> Option<Self> {
        let phys = i64::from_be_bytes(b[0..8].try_into().ok()?);
        let size = i32::from_be_bytes(b[8..12].try_into().ok()?);
        let tag_hash = i64::from_be_bytes(b[12..20].try_into().ok()?);
        if size <= 0 || phys < 0 {
            return None;
        }
        Some(Self {
            phys_offset: phys as u64,
            size: size as u32,
            tag_hash,
        })
    }
}

/// Java's `String.hashCode()`: `s[0]*31^(n-1) + ... + s[n-1]` over the UTF-16
/// code units of `s`, with 32-bit wrapping arithmetic. RocketMQ uses it for tag
/// hashes and index keys, so we use it too to keep the on-disk values the same.
pub fn java_string_hash(s: &str) -> i32 {
    java_string_hash_from(0, s)
}

/// Continues [`java_string_hash`] of a prefix `h` over `s`: the hash of the
/// concatenation, without building it (the index hashes `<topic>#<key>` per
/// message; a `format!` each time showed in batch profiles).
pub fn java_string_hash_from(h: i32, s: &str) -> i32 {
    let step = |h: i32, unit: i32| h.wrapping_mul(31).wrapping_add(unit);
    if s.is_ascii() {
        // An ASCII byte is its own UTF-16 unit.
        return s.bytes().fold(h, |h, b| step(h, i32::from(b)));
    }
    s.encode_utf16().fold(h, |h, unit| step(h, i32::from(unit)))
}

/// RocketMQ's `tagsCode` for a tag: `String.hashCode()` widened to `i64`
/// (so it is negative when the Java hash is negative).
pub fn tag_hash(tag: &str) -> i64 {
    i64::from(java_string_hash(tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_roundtrip_and_layout() {
        let e = CqEntry::new(0x0102_0304_0506_0708, 0x11, -2);
        let b = e.encode();
        assert_eq!(&b[0..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[8..12], &[0, 0, 0, 0x11]);
        assert_eq!(
            &b[12..20],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]
        );
        assert_eq!(CqEntry::decode(&b), Some(e));
        assert_eq!(CqEntry::decode(&[0; ENTRY_SIZE]), None);
        // phys offset 0 is a valid entry
        let first = CqEntry::new(0, 100, 0);
        assert_eq!(CqEntry::decode(&first.encode()), Some(first));
    }

    #[test]
    fn java_hash_matches_known_values() {
        assert_eq!(tag_hash(""), 0);
        assert_eq!(tag_hash("TagA"), 2_598_919);
        assert_eq!(tag_hash("a"), 97);
        assert_eq!(tag_hash("hello"), 99_162_322);
        // overflows and goes negative in Java: "hello world".hashCode()
        assert_eq!(tag_hash("hello world"), 1_794_106_052);
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        // non-BMP: hashed as the UTF-16 surrogate pair D83D DE00
        assert_eq!(java_string_hash("😀"), 0xD83D * 31 + 0xDE00);
        assert_eq!(java_string_hash("é"), 0xE9);
        assert_eq!(
            java_string_hash_from(java_string_hash_from(java_string_hash("top"), "#"), "ké😀"),
            java_string_hash("top#ké😀")
        );
    }
}
