//! Human-friendly units in config files: sizes (`64MiB`), durations (`72h`, `500ms`),
//! address lists (`a:1;b:2` or `["a:1", "b:2"]`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes, written as an integer or with a unit: `4096`, `64KiB`, `1GiB`, `10MB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("TB", 1_000_000_000_000),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

impl ByteSize {
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let t = s.trim();
        for (suffix, mult) in UNITS {
            if let Some(num) = t.strip_suffix(suffix) {
                let n: u64 = num
                    .trim()
                    .parse()
                    .map_err(|_| format!("`{s}` is not a size like 4096, 64KiB or 1GiB"))?;
                return n
                    .checked_mul(mult)
                    .map(ByteSize)
                    .ok_or_else(|| format!("`{s}` is too large"));
            }
        }
        t.parse()
            .map(ByteSize)
            .map_err(|_| format!("`{s}` is not a size like 4096, 64KiB or 1GiB"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (suffix, mult) in &UNITS[..4] {
            if self.0 >= *mult && self.0.is_multiple_of(*mult) {
                return write!(f, "{}{}", self.0 / mult, suffix);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// Durations as humantime strings (`500ms`, `10s`, `72h`).
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "`{s}` is not a duration like 500ms, 10s or 72h ({e})"
            ))
        })
    }
}

/// A list of addresses, as a TOML array or one string separated by `;` (RocketMQ style).
pub fn addr_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        List(Vec<String>),
        Str(String),
    }
    let list = match Raw::deserialize(d)? {
        Raw::List(v) => v,
        Raw::Str(s) => s.split([';', ',']).map(str::to_string).collect(),
    };
    Ok(list
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}
