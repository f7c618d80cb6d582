//! What survives a restart besides the core's offsets: session records (client
//! id, expiry, subscriptions, will, QoS 2 packet ids awaiting PUBREL) and the
//! retained messages, as JSON files under `<data dir>/mqtt/`, each written to a
//! temporary name, synced and renamed so a crash leaves the old or the new file.
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

#[derive(Serialize, Deserialize)]
struct RetainedRecord {
    topic: String,
    qos: u8,
    payload: String,
    properties: Vec<(String, String)>,
}

/// The files under the gateway's directory.
#[derive(Debug, Clone)]
pub struct Files {
    dir: PathBuf,
}

impl Files {
    pub fn open(dir: &Path) -> Result<Files> {
        let sessions = dir.join("sessions");
        std::fs::create_dir_all(&sessions).map_err(|source| Error::File {
            path: sessions.clone(),
            source,
        })?;
        Ok(Files {
            dir: dir.to_owned(),
        })
    }

    fn session_path(&self, client_id: &str) -> PathBuf {
        let mut name = String::new();
        rocketgate_core::hex::push_lower(&mut name, client_id.as_bytes());
        if name.len() > 200 {
            name = format!("{}-{:016x}", &name[..160], fnv64(client_id.as_bytes()));
        }
        self.dir.join("sessions").join(format!("{name}.json"))
    }

    pub fn save_session(&self, record: &SessionRecord) -> Result<()> {
        let json = serde_json::to_vec_pretty(record).map_err(|e| Error::CorruptState {
            path: self.session_path(&record.client_id),
            reason: e.to_string(),
        })?;
        write_atomic(&self.session_path(&record.client_id), &json)
    }

    pub fn remove_session(&self, client_id: &str) {
        let path = self.session_path(client_id);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "removing a session file failed");
        }
    }

    /// Every stored session; unreadable files are logged and skipped.
    pub fn load_sessions(&self) -> Result<Vec<SessionRecord>> {
        let dir = self.dir.join("sessions");
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::File {
            path: dir.clone(),
            source,
        })?;
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

    pub fn save_retained(&self, retained: &HashMap<String, Retained>) -> Result<()> {
        let records: Vec<RetainedRecord> = retained
            .iter()
            .map(|(topic, r)| RetainedRecord {
                topic: topic.clone(),
                qos: r.qos as u8,
                payload: B64.encode(&r.payload),
                properties: r.properties.clone(),
            })
            .collect();
        let path = self.dir.join("retained.json");
        let json = serde_json::to_vec(&records).map_err(|e| Error::CorruptState {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        write_atomic(&path, &json)
    }

    pub fn load_retained(&self) -> Result<HashMap<String, Retained>> {
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

/// Writes `bytes` to `path` through a synced temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let io = |source| Error::File {
        path: tmp.clone(),
        source,
    };
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|source| Error::File {
        path: path.to_owned(),
        source,
    })
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
    fn sessions_and_retained_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::open(dir.path()).unwrap();
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
        files.save_session(&rec).unwrap();
        assert_eq!(files.load_sessions().unwrap(), vec![rec]);
        files.remove_session("c/1");
        assert!(files.load_sessions().unwrap().is_empty());
        let mut r = HashMap::new();
        r.insert(
            "a/b".to_string(),
            Retained {
                qos: QoS::AtLeastOnce,
                payload: Bytes::from_static(b"\x00x"),
                properties: vec![("k".into(), "v".into())],
            },
        );
        files.save_retained(&r).unwrap();
        assert_eq!(files.load_retained().unwrap(), r);
    }
}
