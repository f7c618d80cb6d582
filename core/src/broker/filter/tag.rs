//! Tag expressions (`*`, `TagA || TagB`) and the tag hash the consume queue stores.
//!
//! A tag filter is checked twice, as in RocketMQ: first on the 8-byte tag hash in
//! the consume-queue entry (cheap, no commit-log read, but hashes collide), then on
//! the real tag of the message that passed (exact). The hash is Java's
//! `String.hashCode()` widened to `i64`, because RocketMQ clients and stored
//! consume queues use exactly that value.

use super::FilterError;

/// The consume-queue tag hash (Java's `String.hashCode()` as RocketMQ stores it);
/// one definition, in the store, so filter and dispatcher can never disagree.
pub(crate) use crate::store::consume_queue::tag_hash as java_string_hash;

/// A parsed tag expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TagFilter {
    /// `*` or an empty expression: every message, with or without a tag.
    All,
    /// One or more tags joined by `||`. Both vectors are sorted and deduplicated
    /// so lookups are binary searches.
    Any { tags: Vec<String>, hashes: Vec<i64> },
}

impl TagFilter {
    /// Parses `*`, an empty string, or `Tag1 || Tag2 || ...`.
    ///
    /// Follows RocketMQ's `FilterAPI`: alternatives are split on `||` and trimmed,
    /// and empty alternatives (`TagA ||`) are skipped, because existing clients
    /// send such strings. An alternative that is `*` makes the whole filter match
    /// everything. An expression made only of separators (`||`) is an error: it
    /// would silently match nothing.
    pub(crate) fn parse(expression: &str) -> Result<Self, FilterError> {
        let trimmed = expression.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return Ok(TagFilter::All);
        }
        let mut tags = Vec::new();
        for alternative in trimmed.split("||") {
            let tag = alternative.trim();
            if tag == "*" {
                return Ok(TagFilter::All);
            }
            if !tag.is_empty() {
                tags.push(tag.to_owned());
            }
        }
        if tags.is_empty() {
            return Err(FilterError::syntax(
                expression,
                0,
                "tag expression has no tags (write `*` to receive everything)",
            ));
        }
        tags.sort();
        tags.dedup();
        let mut hashes: Vec<i64> = tags.iter().map(|t| java_string_hash(t)).collect();
        hashes.sort_unstable();
        hashes.dedup();
        Ok(TagFilter::Any { tags, hashes })
    }

    /// First step: could a consume-queue entry with this tag hash match?
    pub(crate) fn matches_hash(&self, hash: i64) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Any { hashes, .. } => hashes.binary_search(&hash).is_ok(),
        }
    }

    /// Second step: does the message's real tag match? A message without a tag
    /// (or with an empty one, which RocketMQ treats the same) matches only `*`.
    pub(crate) fn matches(&self, tag: Option<&str>) -> bool {
        match (self, tag) {
            (TagFilter::All, _) => true,
            (TagFilter::Any { .. }, None) => false,
            (TagFilter::Any { tags, .. }, Some(tag)) => {
                !tag.is_empty() && tags.binary_search_by(|t| t.as_str().cmp(tag)).is_ok()
            }
        }
    }

    /// The tags of this filter, sorted; empty for `*`.
    pub(crate) fn tags(&self) -> &[String] {
        match self {
            TagFilter::All => &[],
            TagFilter::Any { tags, .. } => tags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_matches_known_java_values() {
        // Values computed with Java semantics (UTF-16 units, i32 wrap).
        let cases: &[(&str, i64)] = &[
            ("", 0),
            ("a", 97),
            ("TagA", 2_598_919),
            ("TagB", 2_598_920),
            ("hello", 99_162_322),
            // 温 = U+6E29 (28201), 度 = U+5EA6 (24230): 28201 * 31 + 24230.
            ("温度", 898_461),
            // U+1F600 is the surrogate pair D83D DE00: 55357 * 31 + 56832.
            ("😀", 1_772_899),
            ("room1/temp", -109_823_091),
            // The classic Java example whose hash is Integer.MIN_VALUE.
            ("polygenelubricants", i64::from(i32::MIN)),
            ("aaaaaaaaaaaaaaaaaaaa", 1_542_361_408),
        ];
        for (s, want) in cases {
            assert_eq!(java_string_hash(s), *want, "hash of {s:?}");
        }
    }

    #[test]
    fn java_hash_collisions_exist() {
        assert_eq!(java_string_hash("Aa"), java_string_hash("BB"));
    }

    #[test]
    fn parse_forms() {
        assert_eq!(TagFilter::parse("").unwrap(), TagFilter::All);
        assert_eq!(TagFilter::parse("  *  ").unwrap(), TagFilter::All);
        assert_eq!(TagFilter::parse("A || *").unwrap(), TagFilter::All);
        let f = TagFilter::parse(" B||A ||  B || ").unwrap();
        assert_eq!(f.tags(), ["A".to_owned(), "B".to_owned()]);
        assert!(TagFilter::parse("||").is_err());
        assert!(TagFilter::parse(" || || ").is_err());
    }
}
