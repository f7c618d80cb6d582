//! The topic table: every topic the broker knows, with its queue counts and
//! permission, persisted in `<data_dir>/config/topics.json`.
//!
//! As in RocketMQ's `TopicConfig`, a topic has separate numbers of read and write
//! queues (so queues can be drained before they are removed) and permission bits
//! (`2` write, `4` read, `6` both). User topics are created by an administrator or
//! on first send; system topics (`%RETRY%…`, `%DLQ%…`, schedule, timer and
//! transaction topics) are created only by the broker and kept apart in listings.
//! This module is the in-memory table and its file; it does not touch the store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::persist;
use super::schedule;
use crate::{Error, Result};

/// What the broker's parts that re-append messages (delayed delivery,
/// transaction commits) need of the topic table: a topic as it is now. The
/// `Broker` implements it over its table; the parts see nothing else of the
/// broker, so they depend on this module and the store only.
pub(crate) trait TopicLookup: Send + Sync {
    /// The topic's config; [`Error::TopicNotFound`] when it does not exist.
    fn topic_config(&self, topic: &str) -> Result<TopicConfig>;
}

/// The most queues a topic may have (read or write).
pub const MAX_QUEUES: u32 = 1024;

/// RocketMQ permission bits (`PermName`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Perm(pub u8);

impl Perm {
    pub const INHERIT: Perm = Perm(1);
    pub const WRITE: Perm = Perm(2);
    pub const READ: Perm = Perm(4);
    pub const READ_WRITE: Perm = Perm(6);

    pub fn is_readable(self) -> bool {
        self.0 & Self::READ.0 != 0
    }

    pub fn is_writable(self) -> bool {
        self.0 & Self::WRITE.0 != 0
    }
}

impl Default for Perm {
    fn default() -> Self {
        Perm::READ_WRITE
    }
}

/// One topic's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    pub name: String,
    pub read_queues: u32,
    pub write_queues: u32,
    pub perm: Perm,
}

impl TopicConfig {
    /// A read-write topic with `queues` read and write queues.
    pub fn new(name: impl Into<String>, queues: u32) -> Self {
        TopicConfig {
            name: name.into(),
            read_queues: queues,
            write_queues: queues,
            perm: Perm::READ_WRITE,
        }
    }

    pub fn with_perm(mut self, perm: Perm) -> Self {
        self.perm = perm;
        self
    }

    pub fn is_system(&self) -> bool {
        schedule::is_system_topic(&self.name)
    }

    fn validate(&self) -> Result<()> {
        schedule::validate_topic(&self.name)?;
        for (what, n) in [
            ("read_queues", self.read_queues),
            ("write_queues", self.write_queues),
        ] {
            if n == 0 || n > MAX_QUEUES {
                return Err(Error::InvalidArgument(format!(
                    "topic {:?}: {what} is {n}; it must be between 1 and {MAX_QUEUES}",
                    self.name
                )));
            }
        }
        if self.perm.0 & !(Perm::READ_WRITE.0 | Perm::INHERIT.0) != 0 {
            return Err(Error::InvalidArgument(format!(
                "topic {:?}: unknown permission bits {}",
                self.name, self.perm.0
            )));
        }
        Ok(())
    }
}

/// Which topics a listing returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum TopicKind {
    /// Topics users created (or that were auto-created by a send).
    #[default]
    User,
    /// Topics the broker owns (retry, dead-letter, schedule, transactions).
    System,
    All,
}

impl TopicKind {
    fn includes(self, t: &TopicConfig) -> bool {
        match self {
            TopicKind::User => !t.is_system(),
            TopicKind::System => t.is_system(),
            TopicKind::All => true,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct TopicsFile {
    version: u32,
    topics: Vec<TopicConfig>,
}

/// All topics, keyed by name; the file is rewritten on every change (topic
/// changes are rare, and each is then durable before the call returns).
#[derive(Debug)]
pub struct TopicTable {
    path: PathBuf,
    topics: BTreeMap<String, TopicConfig>,
}

impl TopicTable {
    /// Loads `<config_dir>/topics.json`, or starts empty.
    pub fn open(config_dir: &Path) -> Result<TopicTable> {
        let path = config_dir.join("topics.json");
        let file: Option<TopicsFile> = persist::read_json(&path)?;
        let mut topics = BTreeMap::new();
        for t in file.map(|f| f.topics).unwrap_or_default() {
            t.validate()?;
            topics.insert(t.name.clone(), t);
        }
        Ok(TopicTable { path, topics })
    }

    pub fn get(&self, name: &str) -> Option<&TopicConfig> {
        self.topics.get(name)
    }

    pub fn list(&self, kind: TopicKind) -> Vec<TopicConfig> {
        self.topics
            .values()
            .filter(|t| kind.includes(t))
            .cloned()
            .collect()
    }

    /// Adds a topic a user asked for; system names are refused.
    pub fn create(&mut self, config: TopicConfig) -> Result<TopicConfig> {
        schedule::validate_user_topic(&config.name)?;
        self.insert_new(config)
    }

    /// Adds a topic the broker itself needs (retry, DLQ, ...).
    pub fn create_system(&mut self, config: TopicConfig) -> Result<TopicConfig> {
        if !config.is_system() {
            return Err(Error::InvalidArgument(format!(
                "{:?} is not a system topic name",
                config.name
            )));
        }
        self.insert_new(config)
    }

    fn insert_new(&mut self, config: TopicConfig) -> Result<TopicConfig> {
        config.validate()?;
        if self.topics.contains_key(&config.name) {
            return Err(Error::TopicExists { topic: config.name });
        }
        self.topics.insert(config.name.clone(), config.clone());
        self.save_or_undo(|t| {
            t.topics.remove(&config.name);
        })?;
        Ok(config)
    }

    /// Replaces an existing topic's queue counts and permission.
    pub fn update(&mut self, config: TopicConfig) -> Result<TopicConfig> {
        config.validate()?;
        let Some(old) = self.topics.insert(config.name.clone(), config.clone()) else {
            self.topics.remove(&config.name);
            return Err(Error::TopicNotFound { topic: config.name });
        };
        self.save_or_undo(|t| {
            t.topics.insert(old.name.clone(), old);
        })?;
        Ok(config)
    }

    /// Removes a topic; returns what it was.
    pub fn delete(&mut self, name: &str) -> Result<TopicConfig> {
        let Some(old) = self.topics.remove(name) else {
            return Err(Error::TopicNotFound {
                topic: name.to_owned(),
            });
        };
        let kept = old.clone();
        self.save_or_undo(|t| {
            t.topics.insert(kept.name.clone(), kept);
        })?;
        Ok(old)
    }

    /// Writes the file; on failure rolls the in-memory change back so memory and
    /// disk never disagree.
    fn save_or_undo(&mut self, undo: impl FnOnce(&mut Self)) -> Result<()> {
        let file = TopicsFile {
            version: 1,
            topics: self.topics.values().cloned().collect(),
        };
        match persist::write_json(&self.path, &file) {
            Ok(()) => Ok(()),
            Err(e) => {
                undo(self);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_update_delete_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TopicTable::open(dir.path()).unwrap();
        t.create(TopicConfig::new("orders", 4)).unwrap();
        t.create(TopicConfig::new("gone", 1)).unwrap();
        assert!(matches!(
            t.create(TopicConfig::new("orders", 2)),
            Err(Error::TopicExists { .. })
        ));
        t.update(TopicConfig::new("orders", 8).with_perm(Perm::READ))
            .unwrap();
        t.delete("gone").unwrap();
        assert!(matches!(
            t.update(TopicConfig::new("nope", 1)),
            Err(Error::TopicNotFound { .. })
        ));
        assert!(t.get("nope").is_none());

        let t = TopicTable::open(dir.path()).unwrap();
        assert_eq!(
            t.list(TopicKind::All),
            vec![TopicConfig::new("orders", 8).with_perm(Perm::READ)]
        );
    }

    #[test]
    fn system_topics_are_kept_apart() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TopicTable::open(dir.path()).unwrap();
        assert!(matches!(
            t.create(TopicConfig::new("%RETRY%g", 1)),
            Err(Error::InvalidName(_))
        ));
        t.create_system(TopicConfig::new("%RETRY%g", 1)).unwrap();
        t.create(TopicConfig::new("user", 1)).unwrap();
        let names = |k| {
            t.list(k)
                .into_iter()
                .map(|c: TopicConfig| c.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(TopicKind::User), ["user"]);
        assert_eq!(names(TopicKind::System), ["%RETRY%g"]);
    }

    #[test]
    fn bad_configs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TopicTable::open(dir.path()).unwrap();
        assert!(t.create(TopicConfig::new("a b", 1)).is_err());
        assert!(t.create(TopicConfig::new("zero", 0)).is_err());
        assert!(
            t.create(TopicConfig::new("p", 1).with_perm(Perm(8)))
                .is_err()
        );
    }
}
