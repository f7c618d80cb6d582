//! Consume queues: per (topic, queue id), a sequence of fixed 20-byte entries
//! (commit-log offset, size, tag hash) in memory-mapped files under
//! `<root>/consumequeue/<topic>/<queue_id>/`, so "entry N of queue Q" is one
//! seek and a tag filter never touches the message. This module owns those files
//! and nothing else: it knows no commit-log type (the store passes what it needs,
//! e.g. a closure for store timestamps) and does not decide retention or
//! recovery points, it only applies them. Start with [`ConsumeQueue`] and its
//! `# Invariants`; [`ConsumeQueues`] is the table of all queues. The layout is in
//! `docs/storage-queues.md`.

mod entry;
mod queue;
mod table;

pub use entry::{CqEntry, ENTRY_SIZE, java_string_hash, java_string_hash_from, tag_hash};
pub use queue::{ConsumeQueue, CqBatch};
pub use table::ConsumeQueues;

use crate::error::{Error, Result};

/// RocketMQ's default number of entries per consume-queue file (6 MB files).
pub const DEFAULT_ENTRIES_PER_FILE: u64 = 300_000;

/// Checks that `topic` is usable as one directory name.
pub fn validate_topic(topic: &str) -> Result<()> {
    // On bytes (every append checks its topic): '/', '\\', '.' and NUL are one
    // byte each and never part of another char.
    let bytes = topic.as_bytes();
    let reason = if topic.is_empty() {
        "is empty"
    } else if topic.len() > 255 {
        "is longer than 255 bytes"
    } else if bytes.iter().any(|&b| b == b'/' || b == b'\\') {
        "contains a path separator"
    } else if bytes.windows(2).any(|w| w == b"..") || topic == "." {
        "contains '..' or is '.'"
    } else if bytes.contains(&0) {
        "contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(Error::InvalidTopicName {
        topic: topic.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        for ok in ["TopicA", "%RETRY%group", "a.b", "t-1_x"] {
            assert!(validate_topic(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a\\b", "..", ".", "a..b", "x\0"] {
            assert!(
                matches!(validate_topic(bad), Err(Error::InvalidTopicName { .. })),
                "{bad:?}"
            );
        }
    }
}
