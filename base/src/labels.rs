//! Bounded metric label values. A label taken from user input (a topic, a group)
//! would let one client create a time series per name it makes up; so each label
//! keeps at most `cap` distinct values per process and reports every later one as
//! `other` (docs/http.md, "Metrics").

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use crate::sync::lock;

/// The value every label past its cap is reported as.
pub const OTHER: &str = "other";

/// Up to `cap` distinct values of one label; later values become [`OTHER`].
#[derive(Debug)]
pub struct LabelCap {
    cap: usize,
    /// One short lock: looked up once per metric update of a new batch, never held
    /// across anything but the set lookup.
    seen: Mutex<HashSet<String>>,
}

impl LabelCap {
    pub fn new(cap: usize) -> LabelCap {
        LabelCap {
            cap,
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// `value` if it is one of the first `cap` distinct values seen, else `other`.
    pub fn get(&self, value: &str) -> String {
        let mut seen = lock(&self.seen);
        if seen.contains(value) {
            return value.to_owned();
        }
        if seen.len() < self.cap {
            seen.insert(value.to_owned());
            return value.to_owned();
        }
        OTHER.to_owned()
    }
}

/// Distinct `topic` label values per process.
pub const TOPIC_CAP: usize = 256;

/// The process-wide `topic` label: every door reports its topics through it, so the
/// cap holds across doors.
pub fn topic(value: &str) -> String {
    static TOPICS: OnceLock<LabelCap> = OnceLock::new();
    TOPICS.get_or_init(|| LabelCap::new(TOPIC_CAP)).get(value)
}

/// Distinct `group` label values per process.
pub const GROUP_CAP: usize = 256;

/// The process-wide `group` label (consumer groups are user-chosen names too).
pub fn group(value: &str) -> String {
    static GROUPS: OnceLock<LabelCap> = OnceLock::new();
    GROUPS.get_or_init(|| LabelCap::new(GROUP_CAP)).get(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_cap_are_other_and_known_ones_stay() {
        let cap = LabelCap::new(2);
        assert_eq!(cap.get("a"), "a");
        assert_eq!(cap.get("b"), "b");
        assert_eq!(cap.get("c"), OTHER);
        assert_eq!(cap.get("a"), "a");
        assert_eq!(cap.get("d"), OTHER);
    }
}
