//! The message a producer builds, and what a send returns.

use std::collections::BTreeMap;

use bytes::Bytes;
use rocketgate_core::store::record::property;

use crate::message::{NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR};
use rocketgate_remoting::body::MessageQueue;

/// A message to send. Tag and keys travel as the `TAGS` and `KEYS` properties.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub body: Bytes,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    /// User properties (names must not contain the bytes 0x01/0x02).
    pub properties: BTreeMap<String, String>,
    /// RocketMQ's user flag, stored with the message.
    pub flag: i32,
}

impl Message {
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Message {
        Message {
            topic: topic.into(),
            body: body.into(),
            tag: None,
            keys: Vec::new(),
            properties: BTreeMap::new(),
            flag: 0,
        }
    }

    pub fn with_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    pub fn with_keys<I, S>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.keys = keys.into_iter().map(Into::into).collect();
        self
    }

    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// Delivered after RocketMQ delay level `level` (1 = 1 s, 2 = 5 s, 3 = 10 s, ...).
    pub fn with_delay_level(self, level: u8) -> Self {
        self.with_property(property::DELAY_TIME_LEVEL, level.to_string())
    }

    /// The `properties` header string, with the unique id `uniq`.
    pub(crate) fn properties_string(&self, uniq: &str) -> String {
        let mut s = String::with_capacity(64);
        self.write_properties(uniq, &mut s);
        s
    }

    /// Writes the properties (`name\x01value\x02…`: user properties, `TAGS`, `KEYS`,
    /// `UNIQ_KEY`, `WAIT`) straight into `out`, a header string or a batch body (no
    /// list of pairs and joined string per message).
    pub(crate) fn write_properties<W: std::fmt::Write>(&self, uniq: &str, out: &mut W) {
        // Writing to a `String` or `BytesMut` cannot fail.
        let mut put = |k: &str, v: &[&str]| {
            let _ = out.write_str(k);
            let _ = out.write_char(NAME_VALUE_SEPARATOR);
            for (i, part) in v.iter().enumerate() {
                if i > 0 {
                    let _ = out.write_str(property::KEY_SEPARATOR);
                }
                let _ = out.write_str(part);
            }
            let _ = out.write_char(PROPERTY_SEPARATOR);
        };
        for (k, v) in &self.properties {
            put(k, &[v]);
        }
        if let Some(tag) = &self.tag {
            put(property::TAGS, &[tag]);
        }
        if !self.keys.is_empty() {
            let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
            put(property::KEYS, &keys);
        }
        put(property::UNIQ_CLIENT_MESSAGE_ID_KEYIDX, &[uniq]);
        put(property::WAIT_STORE_MSG_OK, &["true"]);
    }
}

/// Where a sent message was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendResult {
    /// The producer-side unique id (`UNIQ_KEY`), what consumers see as `msg_id`.
    pub msg_id: String,
    /// The broker's id: store host + commit-log offset.
    pub offset_msg_id: String,
    pub queue: MessageQueue,
    pub queue_offset: u64,
    /// Set for a transactional half message.
    pub transaction_id: Option<String>,
}

pub(crate) use rocketgate_core::store::record::unique_id_at;

pub(crate) use rocketgate_core::clock::now_ms;
