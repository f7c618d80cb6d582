//! [`ExtFields`]: a command's custom header fields, kept as a short list.
//!
//! A remoting header has about a dozen fields, so a linear scan beats hashing, and a
//! decoded field borrows its bytes from the received frame (one shared buffer, no
//! `String` per key and value). Keys written by our own code are `&'static str`.

use std::fmt;

use bytes::Bytes;

/// A field name or value: a static name, an owned string, or UTF-8 validated bytes
/// shared with the frame it was decoded from.
#[derive(Clone)]
enum Text {
    Static(&'static str),
    Owned(String),
    /// Invariant: valid UTF-8 (checked by [`Text::shared`]).
    Shared(Bytes),
}

impl Text {
    /// `None` if `bytes` is not UTF-8.
    fn shared(bytes: Bytes) -> Option<Text> {
        std::str::from_utf8(&bytes).ok()?;
        Some(Text::Shared(bytes))
    }

    fn as_str(&self) -> &str {
        match self {
            Text::Static(s) => s,
            Text::Owned(s) => s,
            // SAFETY: `Shared` is only built by `Text::shared`, which validated the bytes
            // as UTF-8, and `Bytes` is immutable.
            Text::Shared(b) => unsafe { std::str::from_utf8_unchecked(b) },
        }
    }
}

/// A field name: `&'static str` (no allocation) or an owned `String`.
pub struct FieldName(Text);

impl From<&'static str> for FieldName {
    fn from(s: &'static str) -> Self {
        FieldName(Text::Static(s))
    }
}

impl From<String> for FieldName {
    fn from(s: String) -> Self {
        FieldName(Text::Owned(s))
    }
}

/// The "custom header" of a [`super::RemotingCommand`]: string keys to string values.
/// Setting a key again replaces its value; on the wire the fields are written sorted by
/// key. Equality ignores order.
#[derive(Clone, Default)]
pub struct ExtFields {
    entries: Vec<(Text, Text)>,
}

impl ExtFields {
    pub fn new() -> Self {
        ExtFields::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        ExtFields {
            entries: Vec::with_capacity(n),
        }
    }

    pub fn reserve(&mut self, n: usize) {
        self.entries.reserve(n);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, key: &str) -> Option<usize> {
        // From the end: of duplicate keys on the wire, the last one wins (as a map would).
        self.entries.iter().rposition(|(k, _)| k.as_str() == key)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key).map(|i| self.entries[i].1.as_str())
    }

    /// The value of `key` as `Bytes`: shared with the frame it was decoded from (no
    /// copy), else copied.
    pub fn get_bytes(&self, key: &str) -> Option<Bytes> {
        self.position(key).map(|i| match &self.entries[i].1 {
            Text::Shared(b) => b.clone(),
            other => Bytes::copy_from_slice(other.as_str().as_bytes()),
        })
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// Sets `key` to `value`, replacing an earlier value.
    pub fn insert(&mut self, key: impl Into<FieldName>, value: impl Into<String>) {
        self.set(key.into().0, Text::Owned(value.into()));
    }

    /// Sets `key` to a `&'static str` value (no allocation).
    pub fn insert_static(&mut self, key: impl Into<FieldName>, value: &'static str) {
        self.set(key.into().0, Text::Static(value));
    }

    fn set(&mut self, key: Text, value: Text) {
        match self.position(key.as_str()) {
            Some(i) => self.entries[i].1 = value,
            None => self.entries.push((key, value)),
        }
    }

    /// Appends a decoded field whose key and value share the frame's buffer; `None` if
    /// either is not UTF-8. Does not look for an earlier value (lookups take the last).
    pub(super) fn push_shared(&mut self, key: Bytes, value: Bytes) -> Option<()> {
        let key = Text::shared(key)?;
        let value = Text::shared(value)?;
        self.entries.push((key, value));
        Some(())
    }

    /// The fields in insertion order (a key set twice by decoding appears twice).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The fields sorted by key, one per key (the last value), as they are encoded.
    pub fn sorted(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = self.iter().collect();
        // Stable: of equal keys, the last set stays last, and is the one kept.
        out.sort_by(|a, b| a.0.cmp(b.0));
        let mut i = 0;
        while i + 1 < out.len() {
            if out[i].0 == out[i + 1].0 {
                out.remove(i);
            } else {
                i += 1;
            }
        }
        out
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for ExtFields {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut fields = ExtFields::new();
        for (k, v) in iter {
            fields.set(Text::Owned(k.into()), Text::Owned(v.into()));
        }
        fields
    }
}

impl PartialEq for ExtFields {
    fn eq(&self, other: &Self) -> bool {
        self.sorted() == other.sorted()
    }
}

impl fmt::Debug for ExtFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_values_win_and_order_does_not_matter() {
        let mut a = ExtFields::new();
        a.insert("b", "1");
        a.insert("a", "2");
        a.insert("b", "3");
        assert_eq!(a.len(), 2);
        assert_eq!(a.get("b"), Some("3"));
        assert_eq!(a.sorted(), vec![("a", "2"), ("b", "3")]);
        let b: ExtFields = [("a", "2"), ("b", "3")].into_iter().collect();
        assert_eq!(a, b);
        assert_ne!(a, ExtFields::new());
    }

    #[test]
    fn shared_fields_are_checked_and_last_duplicate_wins() {
        let mut f = ExtFields::new();
        assert!(
            f.push_shared(Bytes::from_static(b"k"), Bytes::from_static(b"v1"))
                .is_some()
        );
        assert!(
            f.push_shared(Bytes::from_static(b"k"), Bytes::from_static(b"v2"))
                .is_some()
        );
        assert!(
            f.push_shared(Bytes::from_static(b"x"), Bytes::from_static(b"\xff"))
                .is_none()
        );
        assert_eq!(f.get("k"), Some("v2"));
        assert_eq!(f.sorted(), vec![("k", "v2")]);
        assert!(!f.contains_key("x"));
    }
}
