//! What outlives a connection besides the core's offsets, as records: session
//! records (client id, expiry, subscriptions, will, QoS 2 packet ids awaiting
//! PUBREL) and retained messages. They are kept in the broker's state topics
//! (`cluster.rs`); the files an earlier version wrote under `<data dir>/mqtt/`
//! are only read, once, to import them ([`Legacy`]).
//!
//! A plain subscription's place in the log is not here: it is the core's
//! consumer offset of the session's group (see [`session_group`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use mqttbytes::QoS;
use mqttbytes::v5::{LastWill, Publish};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::message::empty_props;

/// The core consumer group that holds a session's offsets. Group names allow
/// letters, digits, `%`, `|`, `_`, `-`; other client ids are hex-encoded.
pub fn session_group(client_id: &str) -> String {
    name_for("mqtt%c%", client_id)
}

/// The core clustering group of a shared subscription `$share/<share>/<filter>`.
pub fn share_group(share: &str, filter: &str) -> String {
    name_for("mqtt%s%", &format!("{share}/{filter}"))
}

fn name_for(prefix: &str, id: &str) -> String {
    let plain = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-'));
    let mut out = String::from(prefix);
    if plain && !id.contains('%') && prefix.len() + id.len() <= 200 {
        out.push_str(id);
    } else {
        out.push('x');
        let cut = &id.as_bytes()[..id.len().min(80)];
        rocketgate_core::hex::push_lower(&mut out, cut);
        out.push_str(&format!("-{:016x}", fnv64(id.as_bytes())));
    }
    out
}

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// One subscription as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubRecord {
    pub filter: String,
    pub qos: u8,
    #[serde(default)]
    pub no_local: bool,
    #[serde(default)]
    pub retain_as_published: bool,
    #[serde(default)]
    pub retain_handling: u8,
    #[serde(default)]
    pub id: Option<usize>,
}

/// A will message (or any publish kept aside) as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WillRecord {
    pub topic: String,
    pub qos: u8,
    pub retain: bool,
    pub payload: String,
    #[serde(default)]
    pub delay: u32,
    #[serde(default)]
    pub content_type: Option<String>,
    #[serde(default)]
    pub response_topic: Option<String>,
    #[serde(default)]
    pub correlation: Option<String>,
    #[serde(default)]
    pub payload_format: Option<u8>,
    #[serde(default)]
    pub expiry: Option<u32>,
    #[serde(default)]
    pub user_properties: Vec<(String, String)>,
}

pub fn qos_of(n: u8) -> QoS {
    match n {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

impl WillRecord {
    pub fn from_last_will(w: &LastWill) -> WillRecord {
        let p = w.properties.as_ref();
        WillRecord {
            topic: w.topic.clone(),
            qos: w.qos as u8,
            retain: w.retain,
            payload: B64.encode(&w.message),
            delay: p.and_then(|p| p.delay_interval).unwrap_or(0),
            content_type: p.and_then(|p| p.content_type.clone()),
            response_topic: p.and_then(|p| p.response_topic.clone()),
            correlation: p.and_then(|p| p.correlation_data.as_ref().map(|c| B64.encode(c))),
            payload_format: p.and_then(|p| p.payload_format_indicator),
            expiry: p.and_then(|p| p.message_expiry_interval),
            user_properties: p.map(|p| p.user_properties.clone()).unwrap_or_default(),
        }
    }

    /// The PUBLISH the will becomes.
    pub fn to_publish(&self) -> Publish {
        let payload = B64.decode(&self.payload).unwrap_or_default();
        let mut p = Publish::new(self.topic.clone(), qos_of(self.qos), payload);
        p.retain = self.retain;
        let mut props = empty_props();
        props.content_type = self.content_type.clone();
        props.response_topic = self.response_topic.clone();
        props.correlation_data = self
            .correlation
            .as_ref()
            .and_then(|c| B64.decode(c).ok())
            .map(Bytes::from);
        props.payload_format_indicator = self.payload_format;
        props.message_expiry_interval = self.expiry;
        props.user_properties = self.user_properties.clone();
        p.properties = Some(props);
        p
    }
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub client_id: String,
    /// Session expiry interval in seconds (`u32::MAX`: never).
    pub expiry: u32,
    pub subscriptions: Vec<SubRecord>,
    #[serde(default)]
    pub will: Option<WillRecord>,
    /// QoS 2 packet ids received and stored, awaiting PUBREL.
    #[serde(default)]
    pub qos2_incoming: Vec<u16>,
}

/// A retained message: the MQTT topic, the QoS and properties it was published
/// with (as core message properties) and the payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Retained {
    pub qos: QoS,
    pub payload: Bytes,
    pub properties: Vec<(String, String)>,
}

/// A retained message in the old `retained.json`.
#[derive(Serialize, Deserialize)]
struct RetainedRecord {
    topic: String,
    qos: u8,
    payload: String,
    properties: Vec<(String, String)>,
}

/// The files an earlier version kept under `<data dir>/mqtt/` (`sessions/*.json`,
/// `retained.json`): read once at start, imported into the state topics
/// (`cluster.rs`), then moved aside to `<data dir>/mqtt.imported-<unix ms>`.
#[derive(Debug, Clone)]
pub struct Legacy {
    dir: PathBuf,
}

/// What the files held.
#[derive(Debug, Default)]
pub struct Imported {
    pub sessions: Vec<SessionRecord>,
    pub retained: HashMap<String, Retained>,
}

impl Legacy {
    pub fn new(dir: &Path) -> Legacy {
        Legacy {
            dir: dir.to_owned(),
        }
    }

    /// Whether there is anything to import.
    pub fn present(&self) -> bool {
        self.dir.join("sessions").is_dir() || self.dir.join("retained.json").is_file()
    }

    /// Reads the files (unreadable session files are logged and skipped).
    pub fn read(&self) -> Result<Imported> {
        Ok(Imported {
            sessions: self.load_sessions()?,
            retained: self.load_retained()?,
        })
    }

    /// Moves the directory aside (after its content is in the state topics);
    /// returns where it went.
    pub fn move_aside(&self) -> Result<PathBuf> {
        let name = format!(
            "{}.imported-{}",
            self.dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("mqtt"),
            crate::message::now_ms()
        );
        let to = self.dir.with_file_name(name);
        std::fs::rename(&self.dir, &to).map_err(|source| Error::File {
            path: self.dir.clone(),
            source,
        })?;
        Ok(to)
    }

    fn load_sessions(&self) -> Result<Vec<SessionRecord>> {
        let dir = self.dir.join("sessions");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::File { path: dir, source }),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    serde_json::from_slice::<SessionRecord>(&b).map_err(|e| e.to_string())
                }) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "skipping an unreadable session file")
                }
            }
        }
        Ok(out)
    }

    fn load_retained(&self) -> Result<HashMap<String, Retained>> {
        let path = self.dir.join("retained.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
            Err(source) => return Err(Error::File { path, source }),
        };
        let records: Vec<RetainedRecord> =
            serde_json::from_slice(&bytes).map_err(|e| Error::CorruptState {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        Ok(records
            .into_iter()
            .map(|r| {
                (
                    r.topic,
                    Retained {
                        qos: qos_of(r.qos),
                        payload: Bytes::from(B64.decode(&r.payload).unwrap_or_default()),
                        properties: r.properties,
                    },
                )
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_are_valid_core_names() {
        for id in ["sensor-1", "with space", "ü", "a%b", &"x".repeat(300), ""] {
            let g = session_group(id);
            rocketgate_core::broker::schedule::validate_group(&g).unwrap();
        }
        assert_ne!(session_group("a b"), session_group("a_b"));
        rocketgate_core::broker::schedule::validate_group(&share_group("g", "a/+/#")).unwrap();
    }

    #[test]
    fn old_files_are_read_and_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let mqtt = dir.path().join("mqtt");
        std::fs::create_dir_all(mqtt.join("sessions")).unwrap();
        let rec = SessionRecord {
            client_id: "c/1".into(),
            expiry: 60,
            subscriptions: vec![SubRecord {
                filter: "a/#".into(),
                qos: 1,
                no_local: true,
                retain_as_published: false,
                retain_handling: 0,
                id: Some(3),
            }],
            will: None,
            qos2_incoming: vec![7],
        };
        std::fs::write(
            mqtt.join("sessions/632f31.json"),
            serde_json::to_vec(&rec).unwrap(),
        )
        .unwrap();
        std::fs::write(mqtt.join("sessions/bad.json"), b"{").unwrap();
        std::fs::write(
            mqtt.join("retained.json"),
            br#"[{"topic":"a/b","qos":1,"payload":"AHg=","properties":[["k","v"]]}]"#,
        )
        .unwrap();
        let legacy = Legacy::new(&mqtt);
        assert!(legacy.present());
        let got = legacy.read().unwrap();
        assert_eq!(got.sessions, vec![rec]);
        assert_eq!(
            got.retained["a/b"],
            Retained {
                qos: QoS::AtLeastOnce,
                payload: Bytes::from_static(b"\x00x"),
                properties: vec![("k".into(), "v".into())],
            }
        );
        let to = legacy.move_aside().unwrap();
        assert!(to.join("retained.json").is_file());
        assert!(!Legacy::new(&mqtt).present());
    }
}
