//! Subscription filters: what a consumer asks for when it subscribes to a topic.
//!
//! A [`Filter`] is parsed once, at subscribe time, so a bad expression is rejected
//! there with a position (`expected ')', found end of expression at column 17`)
//! and never while messages flow. Two kinds exist, as in RocketMQ:
//!
//! - **Tag** (`*`, `TagA || TagB`): checked first on the tag hash stored in each
//!   consume-queue entry ([`Filter::matches_tag_hash`]) and then on the message's
//!   real tag ([`Filter::matches_tag`]) to rule out hash collisions.
//! - **SQL92** (JMS-selector syntax over message properties, e.g.
//!   `region = 'eu' AND price > 10`): needs the properties, so the hash step lets
//!   everything through and [`Filter::matches`] decides.
//!
//! Grammar, semantics (NULL, numbers vs strings) and why the parser is hand-written
//! are in `docs/filters.md`. This module does no I/O and allocates nothing while
//! matching.

mod sql;
mod tag;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::str::FromStr;

pub use crate::error::{FilterError, Position};
use sql::Selector;
use tag::TagFilter;

/// The longest expression accepted, in bytes. Subscriptions travel in every
/// heartbeat and are kept per consumer; a bound keeps parsing cheap and memory
/// predictable.
pub const MAX_EXPRESSION_LEN: usize = 4096;

/// The deepest nesting of parentheses and `NOT`s accepted in an SQL92 expression.
/// Parsing recurses per level, so the bound is what keeps adversarial input from
/// overflowing the stack.
pub const MAX_NESTING_DEPTH: usize = 64;

/// The property name under which SQL92 expressions see the message tag (RocketMQ
/// stores the tag in the `TAGS` property, so `TAGS IN ('a', 'b')` is common).
pub const TAGS_PROPERTY: &str = "TAGS";

/// Which language an expression is written in.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum FilterType {
    /// `*` or `TagA || TagB`, RocketMQ's `TAG` expression type.
    Tag,
    /// A JMS-selector over message properties, RocketMQ's `SQL92` expression type.
    Sql92,
}

impl FilterType {
    /// RocketMQ's wire name for the type (`TAG`, `SQL92`).
    pub fn as_str(self) -> &'static str {
        match self {
            FilterType::Tag => "TAG",
            FilterType::Sql92 => "SQL92",
        }
    }
}

impl fmt::Display for FilterType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FilterType {
    type Err = FilterError;

    /// Accepts `TAG` and `SQL92` in any case; an empty string means `TAG`, as in
    /// RocketMQ's `ExpressionType.isTagType`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("TAG") {
            Ok(FilterType::Tag)
        } else if s.eq_ignore_ascii_case("SQL92") {
            Ok(FilterType::Sql92)
        } else {
            Err(FilterError::UnknownType(s.to_owned()))
        }
    }
}

/// Read access to a message's properties, for SQL92 filters.
///
/// Implemented for the usual maps; the store's message view implements it over
/// the encoded property block so matching needs no copy.
pub trait MessageProperties {
    /// The value of property `name`, or `None` when the message lacks it.
    fn property(&self, name: &str) -> Option<&str>;
}

impl<S: BuildHasher> MessageProperties for HashMap<String, String, S> {
    fn property(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

impl MessageProperties for BTreeMap<String, String> {
    fn property(&self, name: &str) -> Option<&str> {
        self.get(name).map(String::as_str)
    }
}

impl MessageProperties for [(&str, &str)] {
    fn property(&self, name: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }
}

impl<T: MessageProperties + ?Sized> MessageProperties for &T {
    fn property(&self, name: &str) -> Option<&str> {
        (**self).property(name)
    }
}

/// A message with no properties.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProperties;

impl MessageProperties for NoProperties {
    fn property(&self, _name: &str) -> Option<&str> {
        None
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Rule {
    Tag(TagFilter),
    Sql(Selector),
}

/// A parsed subscription filter. Cheap to clone, immutable, `Send + Sync`.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    filter_type: FilterType,
    expression: String,
    rule: Rule,
}

impl Default for Filter {
    /// The filter that lets everything through (`*`).
    fn default() -> Self {
        Filter::all()
    }
}

impl Filter {
    /// Parses `expression` as `filter_type`. Errors carry a position where there is
    /// one; see [`FilterError`].
    pub fn parse(filter_type: FilterType, expression: &str) -> Result<Filter, FilterError> {
        if expression.len() > MAX_EXPRESSION_LEN {
            return Err(FilterError::TooLong {
                len: expression.len(),
                max: MAX_EXPRESSION_LEN,
            });
        }
        let rule = match filter_type {
            FilterType::Tag => Rule::Tag(TagFilter::parse(expression)?),
            FilterType::Sql92 => Rule::Sql(Selector::parse(expression)?),
        };
        Ok(Filter {
            filter_type,
            expression: expression.trim().to_owned(),
            rule,
        })
    }

    /// Shorthand for a tag filter.
    pub fn tag(expression: &str) -> Result<Filter, FilterError> {
        Filter::parse(FilterType::Tag, expression)
    }

    /// Shorthand for an SQL92 filter.
    pub fn sql92(expression: &str) -> Result<Filter, FilterError> {
        Filter::parse(FilterType::Sql92, expression)
    }

    /// The tag filter `*`: every message.
    pub fn all() -> Filter {
        Filter {
            filter_type: FilterType::Tag,
            expression: "*".to_owned(),
            rule: Rule::Tag(TagFilter::All),
        }
    }

    pub fn filter_type(&self) -> FilterType {
        self.filter_type
    }

    /// The expression as the subscriber wrote it (surrounding whitespace trimmed).
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// True for the tag filter `*` (or an empty tag expression).
    pub fn is_all(&self) -> bool {
        matches!(self.rule, Rule::Tag(TagFilter::All))
    }

    /// The tags of a tag filter, sorted and deduplicated; empty for `*` and for
    /// SQL92 filters. RocketMQ heartbeats carry this set.
    pub fn tags(&self) -> &[String] {
        match &self.rule {
            Rule::Tag(t) => t.tags(),
            Rule::Sql(_) => &[],
        }
    }

    /// The expression in a canonical, fully parenthesised form: for SQL92 it shows
    /// how the parser grouped operators (`((a = 1) OR ((b = 2) AND (c = 3)))`); for
    /// tags it is the sorted `A || B`. Meant for logs, admin output and tests.
    pub fn canonical(&self) -> String {
        match &self.rule {
            Rule::Tag(TagFilter::All) => "*".to_owned(),
            Rule::Tag(t) => t.tags().join(" || "),
            Rule::Sql(s) => s.to_string(),
        }
    }

    /// Step one, on the consume-queue entry: may a message whose tag hashes to
    /// `tag_hash` match? False positives are possible (hash collisions), false
    /// negatives are not. SQL92 filters answer `true`: they need the properties.
    pub fn matches_tag_hash(&self, tag_hash: i64) -> bool {
        match &self.rule {
            Rule::Tag(t) => t.matches_hash(tag_hash),
            Rule::Sql(_) => true,
        }
    }

    /// Step two for tag filters: does the message's real tag match? SQL92 filters
    /// answer `true` (use [`Filter::matches`]).
    pub fn matches_tag(&self, tag: Option<&str>) -> bool {
        match &self.rule {
            Rule::Tag(t) => t.matches(tag),
            Rule::Sql(_) => true,
        }
    }

    /// The full decision on a message: its tag for tag filters, its properties for
    /// SQL92 filters (where the tag is also visible as the `TAGS` property when the
    /// properties do not carry one).
    pub fn matches<P: MessageProperties + ?Sized>(
        &self,
        tag: Option<&str>,
        properties: &P,
    ) -> bool {
        self.matches_with(tag, |name| properties.property(name))
    }

    /// Like [`Filter::matches`], with properties looked up through a closure.
    pub fn matches_with<'p>(
        &self,
        tag: Option<&'p str>,
        lookup: impl Fn(&str) -> Option<&'p str>,
    ) -> bool {
        match &self.rule {
            Rule::Tag(t) => t.matches(tag),
            Rule::Sql(s) => s.matches(&|name: &str| {
                let value = lookup(name);
                if value.is_none() && name == TAGS_PROPERTY {
                    tag.filter(|t| !t.is_empty())
                } else {
                    value
                }
            }),
        }
    }
}

impl fmt::Display for Filter {
    /// `TAG(TagA || TagB)` / `SQL92(a > 1)`: the type and the expression as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.filter_type, self.expression)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_counts_chars_and_lines() {
        let p = Position::locate("温度 = 1", 7);
        assert_eq!((p.line, p.column), (1, 4));
        let p = Position::locate("a = 1\nAND (", 11);
        assert_eq!((p.line, p.column), (2, 6));
        assert_eq!(p.to_string(), "line 2, column 6");
        // Out-of-range and mid-char offsets are clamped, never panic.
        let p = Position::locate("é", 1);
        assert_eq!(p.column, 1);
        let p = Position::locate("ab", 99);
        assert_eq!(p.column, 3);
    }

    #[test]
    fn filter_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Filter>();
        assert_send_sync::<FilterError>();
    }

    #[test]
    fn filter_type_names() {
        assert_eq!("sql92".parse::<FilterType>().unwrap(), FilterType::Sql92);
        assert_eq!("".parse::<FilterType>().unwrap(), FilterType::Tag);
        assert!("xpath".parse::<FilterType>().is_err());
    }

    #[test]
    fn tags_property_falls_back_to_the_tag() {
        let f = Filter::sql92("TAGS IN ('a', 'b')").unwrap();
        assert!(f.matches(Some("a"), &NoProperties));
        assert!(!f.matches(Some("c"), &NoProperties));
        assert!(!f.matches(None, &NoProperties));
    }
}
