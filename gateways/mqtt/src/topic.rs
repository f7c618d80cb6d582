//! MQTT topic names and filters, and the one mapping onto core topics:
//! MQTT `T/rest/of/path` is core topic `T` with tag `rest/of/path` (no tag when
//! there is no `/`). A first level that is not a plain core topic name (empty,
//! `$`, `.`, spaces, any other UTF-8, too long, a RocketMQ system name) becomes an
//! escaped core topic ([`core_of`], reversed by [`level_of`]); docs/mqtt.md has
//! the scheme and its examples. Wildcards are matched here, on the whole MQTT
//! name, because core tag filters know no `+`/`#`.

use std::borrow::Cow;

/// Why a topic name or filter is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("empty topic")]
    Empty,
    #[error("topic name {0:?} contains a wildcard")]
    WildcardInName(String),
    #[error("topic {0:?} contains a NUL character")]
    Nul(String),
    #[error("topic filter {0:?} uses a wildcard inside a level or '#' before the last level")]
    BadWildcard(String),
    #[error("shared subscription {0:?} needs $share/<name>/<filter> with a name without wildcards")]
    BadShare(String),
}

/// Every core topic made by escaping a first level starts with this, and no
/// first level starting with it is taken as plain, so an escaped name can never
/// be a plain one. `%` delimits like RocketMQ's own made-up names (`%RETRY%`,
/// `%DLQ%`); unlike those it is a user topic, listed and readable by every door.
pub const ESCAPED_PREFIX: &str = "%MQTT%";

/// Separates a shortened escaped name from its hash. Never in an escaped body,
/// where `|` itself is written `%7C`.
const HASH_SEPARATOR: u8 = b'|';

/// The longest core topic name (RocketMQ's limit).
const MAX_CORE_LEN: usize = rocketgate_core::broker::schedule::MAX_TOPIC_LEN;

/// `|` and 16 hex digits.
const HASH_SUFFIX_LEN: usize = 17;

/// True when the first level `level` is its own core topic: a valid user topic
/// name (`[%|a-zA-Z0-9_-]`, at most 127 bytes, not a system name) that does not
/// start with [`ESCAPED_PREFIX`]. Every publish asks this; it allocates nothing.
pub fn is_plain(level: &str) -> bool {
    !level.starts_with(ESCAPED_PREFIX)
        && rocketgate_core::broker::schedule::validate_user_topic(level).is_ok()
}

/// The core topic of an MQTT first level: the level itself when
/// [plain](is_plain), else [`ESCAPED_PREFIX`] and the level's UTF-8 bytes with
/// every byte outside `[A-Za-z0-9_-]` written `%XX` (upper-case hex, as in
/// RFC 3986). When that is over 127 bytes, it is cut (never inside a `%XX`) and
/// ends in `|` and a 64-bit FNV-1a hash of the level in hex; the level itself is
/// then kept in each message (property `mqtt.first_level`), since the cut
/// name cannot be decoded. Same level, same core topic, on every node and version.
pub fn core_of(level: &str) -> Cow<'_, str> {
    if is_plain(level) {
        return Cow::Borrowed(level);
    }
    let mut out = String::with_capacity(ESCAPED_PREFIX.len() + level.len() * 3);
    out.push_str(ESCAPED_PREFIX);
    for b in level.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
    }
    if out.len() > MAX_CORE_LEN {
        let mut cut = MAX_CORE_LEN - HASH_SUFFIX_LEN;
        // Not inside a `%XX`: back up to the start of one cut in two.
        if let Some(pct) = out.as_bytes()[cut.saturating_sub(2)..cut]
            .iter()
            .position(|&b| b == b'%')
        {
            cut = cut - 2 + pct;
        }
        out.truncate(cut);
        out.push(char::from(HASH_SEPARATOR));
        for b in fnv1a(level.as_bytes()).to_be_bytes() {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
    }
    Cow::Owned(out)
}

/// True when `core` was escaped and shortened: only a kept copy of the first
/// level can say what it was.
pub fn is_shortened(core: &str) -> bool {
    core.starts_with(ESCAPED_PREFIX) && core.as_bytes().contains(&HASH_SEPARATOR)
}

/// The MQTT first level of core topic `core` ([`core_of`] reversed). `kept` is
/// the first level a message carries when its core topic was shortened. A name
/// that does not decode to exactly itself (a shortened one without the kept
/// level, or one written by hand with `%61` for `a`) is shown as it is, so every
/// message still has a name, and a `#` subscriber still sees it.
pub fn level_of<'a>(core: &'a str, kept: Option<&'a str>) -> Cow<'a, str> {
    let Some(body) = core.strip_prefix(ESCAPED_PREFIX) else {
        return Cow::Borrowed(core);
    };
    if let Some(level) = kept.filter(|l| core_of(l) == core) {
        return Cow::Borrowed(level);
    }
    match unescape(body) {
        Some(level) if core_of(&level) == core => Cow::Owned(level),
        _ => Cow::Borrowed(core),
    }
}

fn unescape(body: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(body.len());
    let mut it = body.bytes();
    while let Some(b) = it.next() {
        if b != b'%' {
            bytes.push(b);
            continue;
        }
        let hi = char::from(it.next()?).to_digit(16)?;
        let lo = char::from(it.next()?).to_digit(16)?;
        bytes.push(u8::try_from(hi * 16 + lo).ok()?);
    }
    String::from_utf8(bytes).ok()
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// FNV-1a, 64 bits: fixed by its definition, so the shortened name of a level
/// never changes (std's hasher may change between Rust versions). A collision
/// only puts two levels in one core topic; names stay exact (kept level).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// True for a name in the broker's own `$SYS` tree, which clients may read but
/// not publish to.
pub fn is_sys(name: &str) -> bool {
    name == "$SYS" || name.starts_with("$SYS/")
}

/// Checks a topic name of a PUBLISH.
pub fn check_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::Empty);
    }
    if name.contains(['+', '#']) {
        return Err(TopicError::WildcardInName(name.to_owned()));
    }
    if name.contains('\0') {
        return Err(TopicError::Nul(name.to_owned()));
    }
    Ok(())
}

/// The core topic and tag of an MQTT topic name.
pub fn split(name: &str) -> (&str, Option<&str>) {
    match name.split_once('/') {
        Some((topic, tag)) => (topic, Some(tag)),
        None => (name, None),
    }
}

/// The MQTT topic name of a core topic and tag (written into `out`).
pub fn join_into(out: &mut String, topic: &str, tag: Option<&str>) {
    out.clear();
    out.push_str(topic);
    if let Some(tag) = tag {
        out.push('/');
        out.push_str(tag);
    }
}

/// A parsed subscription filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFilter {
    /// The filter as subscribed (with `$share/<name>/` when shared).
    pub raw: String,
    /// The share name of a shared subscription.
    pub share: Option<String>,
    /// The filter part (without the share prefix).
    pub filter: String,
    /// The filter has no wildcard: matching is comparing names.
    exact: bool,
    /// The core topic of its first level ([`core_of`]), unless that is a wildcard.
    core: Option<String>,
}

impl TopicFilter {
    pub fn parse(raw: &str) -> Result<TopicFilter, TopicError> {
        let (share, filter) = match raw.strip_prefix("$share/") {
            Some(rest) => {
                let (name, filter) = rest
                    .split_once('/')
                    .ok_or_else(|| TopicError::BadShare(raw.to_owned()))?;
                if name.is_empty() || name.contains(['+', '#']) || filter.is_empty() {
                    return Err(TopicError::BadShare(raw.to_owned()));
                }
                (Some(name.to_owned()), filter)
            }
            None => (None, raw),
        };
        check_filter(filter)?;
        let first = split(filter).0;
        Ok(TopicFilter {
            raw: raw.to_owned(),
            share,
            filter: filter.to_owned(),
            exact: !filter.contains(['+', '#']),
            core: (first != "+" && first != "#").then(|| core_of(first).into_owned()),
        })
    }

    /// The one core topic this filter can match, or `None` when its first level is
    /// a wildcard (it may match any topic, including ones created later).
    pub fn core_topic(&self) -> Option<&str> {
        self.core.as_deref()
    }

    /// The one topic name this filter matches, when it has no wildcard.
    pub fn exact_name(&self) -> Option<&str> {
        self.exact.then_some(self.filter.as_str())
    }

    pub fn matches(&self, name: &str) -> bool {
        if self.exact {
            return self.filter == name;
        }
        matches(&self.filter, name)
    }
}

fn check_filter(filter: &str) -> Result<(), TopicError> {
    if filter.is_empty() {
        return Err(TopicError::Empty);
    }
    if filter.contains('\0') {
        return Err(TopicError::Nul(filter.to_owned()));
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        let bad_plus = level.contains('+') && *level != "+";
        let bad_hash = level.contains('#') && (*level != "#" || i + 1 != levels.len());
        if bad_plus || bad_hash {
            return Err(TopicError::BadWildcard(filter.to_owned()));
        }
    }
    Ok(())
}

/// MQTT matching: `+` one level, `#` this level and every one below (also the
/// parent: `a/#` matches `a`), and names starting with `$` are not matched by a
/// filter starting with a wildcard.
pub fn matches(filter: &str, name: &str) -> bool {
    if name.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut n = name.split('/');
    loop {
        match (f.next(), n.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping() {
        assert_eq!(split("sensors/room1/temp"), ("sensors", Some("room1/temp")));
        assert_eq!(split("sensors"), ("sensors", None));
        assert_eq!(split("sensors/"), ("sensors", Some("")));
        let mut s = String::new();
        join_into(&mut s, "sensors", Some("room1/temp"));
        assert_eq!(s, "sensors/room1/temp");
        join_into(&mut s, "sensors", None);
        assert_eq!(s, "sensors");
    }

    #[test]
    fn plain_first_levels_are_their_own_core_topic() {
        for level in ["sensors", "a-b_c", "%x|y", "TBW102x"] {
            assert!(
                matches!(core_of(level), Cow::Borrowed(l) if l == level),
                "{level}"
            );
            assert_eq!(level_of(level, None), level);
        }
    }

    #[test]
    fn other_first_levels_are_escaped_and_come_back_exactly() {
        for (level, core) in [
            ("", "%MQTT%"),
            ("home.assistant", "%MQTT%home%2Eassistant"),
            ("$TopicA", "%MQTT%%24TopicA"),
            ("my topic", "%MQTT%my%20topic"),
            ("café", "%MQTT%caf%C3%A9"),
            ("%MQTT%x", "%MQTT%%25MQTT%25x"),
            ("a.b|c", "%MQTT%a%2Eb%7Cc"),
            ("%RETRY%g", "%MQTT%%25RETRY%25g"),
            ("TBW102", "%MQTT%TBW102"),
        ] {
            assert_eq!(core_of(level), core, "{level:?}");
            assert!(!is_plain(core) && !is_shortened(core));
            assert_eq!(level_of(core, None), level);
            rocketgate_core::broker::schedule::validate_user_topic(core).unwrap();
        }
    }

    #[test]
    fn long_first_levels_are_cut_and_hashed_and_need_the_kept_level() {
        for level in [
            "x".repeat(128),
            "é".repeat(300),
            format!("{}.{}", "a".repeat(100), "b".repeat(100)),
            "\u{2615}".repeat(1000),
        ] {
            let core = core_of(&level);
            assert!(core.len() <= MAX_CORE_LEN && is_shortened(&core), "{core}");
            rocketgate_core::broker::schedule::validate_user_topic(&core).unwrap();
            assert_eq!(core_of(&level), core, "the same level, the same topic");
            assert_eq!(level_of(&core, Some(&level)), level.as_str());
            assert_eq!(level_of(&core, None), core, "without the kept level: as is");
            assert_eq!(level_of(&core, Some("other")), core);
        }
        let a = core_of(&"é".repeat(300)).into_owned();
        let b = core_of(&format!("{}è", "é".repeat(299))).into_owned();
        assert_ne!(a, b, "same cut, different hash");
        // Every cut leaves whole `%XX`s, whatever the phase of the escapes.
        for pad in 0..3 {
            let core = core_of(&format!("{}{}", "a".repeat(pad), "é".repeat(60))).into_owned();
            let body = core.strip_prefix(ESCAPED_PREFIX).unwrap();
            let body = &body[..body.find('|').unwrap()];
            assert!(unescape(body).is_some(), "{core}");
        }
    }

    #[test]
    fn names_not_made_by_the_escape_are_shown_as_they_are() {
        // `%61` is `a` but `a` is plain: not canonical, so not decoded.
        assert_eq!(level_of("%MQTT%%61", None), "%MQTT%%61");
        assert_eq!(level_of("%MQTT%%zz", None), "%MQTT%%zz");
        assert_eq!(level_of("%MQTT%%FF", None), "%MQTT%%FF", "not UTF-8");
    }

    #[test]
    fn filters_follow_the_escaped_core_topic() {
        let f = TopicFilter::parse("/devices/+/temp").unwrap();
        assert_eq!(f.core_topic(), Some("%MQTT%"));
        assert!(f.matches("/devices/42/temp"));
        let f = TopicFilter::parse("$share/g/home.assistant/#").unwrap();
        assert_eq!(f.core_topic(), Some("%MQTT%home%2Eassistant"));
        assert_eq!(
            TopicFilter::parse("+/devices/#").unwrap().core_topic(),
            None
        );
        assert!(
            TopicFilter::parse("+/devices/#")
                .unwrap()
                .matches("/devices/42/temp")
        );
        assert!(TopicFilter::parse("#").unwrap().matches("/devices/42/temp"));
        assert!(!TopicFilter::parse("#").unwrap().matches("$TopicA/B"));
        assert!(!TopicFilter::parse("+/B").unwrap().matches("$TopicA/B"));
        assert!(
            TopicFilter::parse("$TopicA/#")
                .unwrap()
                .matches("$TopicA/B")
        );
    }

    #[test]
    fn wildcards() {
        for (f, n, m) in [
            ("sensors/#", "sensors", true),
            ("sensors/#", "sensors/a/b", true),
            ("sensors/+/temp", "sensors/room1/temp", true),
            ("sensors/+/temp", "sensors/room1/hum", false),
            ("sensors/+", "sensors/a/b", false),
            ("+/+", "a/b", true),
            ("#", "$SYS/x", false),
            ("+/x", "$SYS/x", false),
            ("$SYS/#", "$SYS/x", true),
            ("a/b", "a/b", true),
            ("a/b", "a/b/c", false),
            ("+", "a", true),
            ("a/+", "a/", true),
        ] {
            assert_eq!(matches(f, n), m, "{f} vs {n}");
        }
    }

    #[test]
    fn exact_filters_compare_names() {
        let f = TopicFilter::parse("bench/run/p2p/1").unwrap();
        assert!(f.matches("bench/run/p2p/1"));
        assert!(!f.matches("bench/run/p2p/10"));
        assert!(!f.matches("bench/run/p2p"));
        let shared = TopicFilter::parse("$share/g/a/b").unwrap();
        assert!(shared.matches("a/b"));
        assert!(!shared.matches("$share/g/a/b"));
        let wild = TopicFilter::parse("bench/+/p2p/#").unwrap();
        assert!(wild.matches("bench/run/p2p/1"));
    }

    #[test]
    fn filters_parse() {
        let f = TopicFilter::parse("$share/g1/sensors/+/t").unwrap();
        assert_eq!(f.share.as_deref(), Some("g1"));
        assert_eq!(f.core_topic(), Some("sensors"));
        assert_eq!(TopicFilter::parse("#").unwrap().core_topic(), None);
        assert!(TopicFilter::parse("a/#/b").is_err());
        assert!(TopicFilter::parse("a/b+").is_err());
        assert!(TopicFilter::parse("$share/g").is_err());
        assert!(TopicFilter::parse("$share/g+/a").is_err());
        assert!(check_name("a/+").is_err());
        assert!(check_name("a/b").is_ok());
    }
}
