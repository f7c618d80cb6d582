//! [`ExtFields`]: a command's custom header fields, kept as a short list.
//!
//! A remoting header has about a dozen fields, so a linear scan beats hashing, and a
//! decoded field borrows its bytes from the received frame (one shared buffer, no
//! `String` per key and value). Keys written by our own code are `&'static str`.

use std::fmt;
use std::ops::Range;

use bytes::Bytes;

/// A field name or value: a static name, an owned string, or a UTF-8 validated span
/// of the frame the fields were decoded from (held once by [`ExtFields`]: a `Bytes`
/// per key and value cost two reference-count updates each, ~5 % of a send).
#[derive(Clone)]
enum Text {
    Static(&'static str),
    Owned(String),
    /// `frame[start..end]`. Invariant: in bounds and valid UTF-8 (checked by
    /// [`ExtFields::push_span`]).
    Span(u32, u32),
}

impl Text {
    fn as_str<'a>(&'a self, frame: &'a [u8]) -> &'a str {
        match self {
            Text::Static(s) => s,
            Text::Owned(s) => s,
            Text::Span(start, end) => {
                let bytes = frame
                    .get(*start as usize..*end as usize)
                    .unwrap_or_default();
                #[allow(unsafe_code)]
                // SAFETY: `Span` is only built by `push_span`, which checked that these
                // bytes of the (immutable) frame are valid UTF-8.
                unsafe {
                    std::str::from_utf8_unchecked(bytes)
                }
            }
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
    /// The decoded header section the `Span`s point into (empty when built in code).
    frame: Bytes,
    entries: Vec<(Text, Text)>,
}

impl ExtFields {
    pub fn new() -> Self {
        ExtFields::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        ExtFields {
            frame: Bytes::new(),
            entries: Vec::with_capacity(n),
        }
    }

    /// Fields to be decoded from `frame` with [`ExtFields::push_span`].
    pub(super) fn decoding(frame: Bytes, n: usize) -> Self {
        ExtFields {
            frame,
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
        // Length and first byte before the bytes: most keys are one letter (v2 send
        // headers), and a `memcmp` call per compared key showed in send profiles.
        let key = key.as_bytes();
        self.entries.iter().rposition(|(k, _)| {
            let k = k.as_str(&self.frame).as_bytes();
            k.len() == key.len() && k.first() == key.first() && k == key
        })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key)
            .map(|i| self.entries[i].1.as_str(&self.frame))
    }

    /// The value of `key` as `Bytes`: shared with the frame it was decoded from (no
    /// copy), else copied.
    pub fn get_bytes(&self, key: &str) -> Option<Bytes> {
        self.position(key).map(|i| match &self.entries[i].1 {
            Text::Span(start, end) => self.frame.slice(*start as usize..*end as usize),
            other => Bytes::copy_from_slice(other.as_str(&self.frame).as_bytes()),
        })
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// Adds `key` = `value` without looking for an earlier value of `key` (a scan
    /// per field was ~5 % of a send): lookups and the encoders take the last value of
    /// a key, so this is [`ExtFields::insert`] except that [`ExtFields::len`] and
    /// [`ExtFields::iter`] still show the older one.
    pub fn append(&mut self, key: impl Into<FieldName>, value: impl Into<String>) {
        self.entries.push((key.into().0, Text::Owned(value.into())));
    }

    /// [`ExtFields::append`] of a `&'static str` value (no allocation).
    pub fn append_static(&mut self, key: impl Into<FieldName>, value: &'static str) {
        self.entries.push((key.into().0, Text::Static(value)));
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
        match self.position(key.as_str(&self.frame)) {
            Some(i) => self.entries[i].1 = value,
            None => self.entries.push((key, value)),
        }
    }

    /// Appends a decoded field: key and value are byte ranges of the frame given to
    /// [`ExtFields::decoding`]; `None` if either is out of bounds or not UTF-8. Does
    /// not look for an earlier value (lookups take the last).
    pub(super) fn push_span(&mut self, key: Range<usize>, value: Range<usize>) -> Option<()> {
        let span = |r: Range<usize>| -> Option<Text> {
            let bytes = self.frame.get(r.clone())?;
            if !bytes.is_ascii() {
                std::str::from_utf8(bytes).ok()?;
            }
            Some(Text::Span(
                u32::try_from(r.start).ok()?,
                u32::try_from(r.end).ok()?,
            ))
        };
        let (key, value) = (span(key)?, span(value)?);
        self.entries.push((key, value));
        Some(())
    }

    /// The fields in insertion order (a key set twice by decoding appears twice).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries
            .iter()
            .map(|(k, v)| (k.as_str(&self.frame), v.as_str(&self.frame)))
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
    fn decoded_fields_are_checked_and_last_duplicate_wins() {
        let mut f = ExtFields::decoding(Bytes::from_static(b"kv1kv2x\xff\xc3\xa9"), 4);
        assert!(f.push_span(0..1, 1..3).is_some());
        assert!(f.push_span(3..4, 4..6).is_some());
        assert!(f.push_span(6..7, 7..8).is_none(), "not UTF-8");
        assert!(f.push_span(6..7, 8..11).is_none(), "out of bounds");
        assert!(f.push_span(6..7, 8..10).is_some(), "UTF-8");
        assert_eq!(f.get("k"), Some("v2"));
        assert_eq!(f.get("x"), Some("é"));
        assert_eq!(f.get_bytes("k").as_deref(), Some(&b"v2"[..]));
        assert_eq!(f.sorted(), vec![("k", "v2"), ("x", "é")]);
        f.insert("k", "set");
        assert_eq!(f.get("k"), Some("set"));
        f.append("k", "appended");
        f.append_static("z", "static");
        assert_eq!(f.get("k"), Some("appended"));
        assert_eq!(
            f.sorted(),
            vec![("k", "appended"), ("x", "é"), ("z", "static")]
        );
    }
}
