//! MQTT topic names and filters, and the one mapping onto core topics:
//! MQTT `T/rest/of/path` is core topic `T` with tag `rest/of/path` (no tag when
//! there is no `/`). Wildcards are matched here, on the whole MQTT name, because
//! core tag filters know no `+`/`#`.

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
        Ok(TopicFilter {
            raw: raw.to_owned(),
            share,
            filter: filter.to_owned(),
            exact: !filter.contains(['+', '#']),
        })
    }

    /// The one core topic this filter can match, or `None` when its first level is
    /// a wildcard (it may match any topic, including ones created later).
    pub fn core_topic(&self) -> Option<&str> {
        let first = split(&self.filter).0;
        (first != "+" && first != "#").then_some(first)
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
