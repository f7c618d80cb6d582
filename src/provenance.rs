//! Where each effective setting came from (`GET /v1/config`): the defaults, the
//! TOML file, a `ROCKETGATE_*` variable or a flag, in the order `Config::load`
//! applies them (the last one wins). Recorded by `CommonArgs::load`, read by the
//! HTTP door's probe.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rocketgate_config::{Config, Override};
use rocketgate_http::inspect::SettingJson;

/// What `Config::load` was given.
#[derive(Debug, Clone)]
pub struct Sources {
    pub file: Option<PathBuf>,
    /// The file's own keys (dotted), when it could be read.
    pub file_keys: Vec<String>,
    pub overrides: Vec<Override>,
}

static SOURCES: OnceLock<Sources> = OnceLock::new();

/// Remembers the sources of this process's config (the first call wins).
pub fn record(file: Option<&Path>, overrides: &[Override]) {
    let file_keys = file
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| toml::from_str::<toml::Value>(&t).ok())
        .map(|v| {
            let mut keys = Vec::new();
            flatten_toml("", &v, &mut keys);
            keys
        })
        .unwrap_or_default();
    let _ = SOURCES.set(Sources {
        file: file.map(Path::to_path_buf),
        file_keys,
        overrides: overrides.to_vec(),
    });
}

fn flatten_toml(prefix: &str, v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_toml(&key, v, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

fn flatten_json(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, serde_json::Value)>) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_json(&key, v, out);
            }
        }
        _ => out.push((prefix.to_owned(), v.clone())),
    }
}

/// A key whose value is a secret: shown as `<redacted>` when set.
pub fn is_secret(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    last == "secret" || last.ends_with("_secret") || last.contains("password")
}

/// Every effective setting of `config`, with its source, secrets redacted.
pub fn settings(config: &Config) -> Vec<SettingJson> {
    let sources = SOURCES.get();
    let mut leaves = Vec::new();
    if let Ok(v) = serde_json::to_value(config) {
        flatten_json("", &v, &mut leaves);
    }
    leaves
        .into_iter()
        .map(|(key, value)| {
            let covers = |path: &str| path == key || key.starts_with(&format!("{path}."));
            let source = sources
                .and_then(|s| {
                    if let Some(o) = s.overrides.iter().rev().find(|o| covers(&o.path)) {
                        return Some(o.origin.clone());
                    }
                    s.file_keys
                        .iter()
                        .any(|k| covers(k) || k.starts_with(&format!("{key}.")))
                        .then(|| {
                            format!(
                                "file {}",
                                s.file.as_deref().unwrap_or(Path::new("?")).display()
                            )
                        })
                })
                .unwrap_or_else(|| "default".to_owned());
            let value = if is_secret(&key) && value.as_str().is_some_and(|s| !s.is_empty()) {
                serde_json::Value::String("<redacted>".into())
            } else {
                value
            };
            SettingJson { key, value, source }
        })
        .collect()
}
