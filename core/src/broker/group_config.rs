//! What the broker remembers about a consumer group while none of its members
//! is live: its consume mode (so a broadcasting group's per-member offsets are
//! found after a restart, before its members heartbeat again) and its own
//! `maxReconsumeTimes` when one was set. Persisted in `config/groups.json`,
//! rewritten atomically only when something changes (a new group, a mode
//! change after all members left, a setting), so heartbeats cost no I/O.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::groups::ConsumeMode;
use super::persist;
use crate::Result;
use crate::sync::lock;

/// The remembered settings of one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    /// The mode its members last consumed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ConsumeMode>,
    /// Overrides `BrokerSettings::max_reconsume_times` for this group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reconsume_times: Option<u32>,
    /// An ordered (FIFO) group: POP hands out a queue's next message only when
    /// nothing earlier of that queue is in flight for the group (docs/broker.md,
    /// "Ordered (FIFO) POP").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fifo: bool,
}

#[derive(Serialize, Deserialize, Default)]
struct GroupsFile {
    version: u32,
    groups: BTreeMap<String, GroupConfig>,
}

/// Every group's remembered settings. One short lock; a change is written
/// under it (changes are rare).
pub(super) struct GroupConfigs {
    path: PathBuf,
    groups: Mutex<BTreeMap<String, GroupConfig>>,
}

impl GroupConfigs {
    pub(super) fn open(config_dir: &Path) -> Result<GroupConfigs> {
        let path = config_dir.join("groups.json");
        let file: GroupsFile = persist::read_json(&path)?.unwrap_or_default();
        Ok(GroupConfigs {
            path,
            groups: Mutex::new(file.groups),
        })
    }

    /// Every remembered group, sorted.
    pub(super) fn names(&self) -> Vec<String> {
        lock(&self.groups).keys().cloned().collect()
    }

    /// Whether `group` is an ordered (FIFO) group (no clone: asked on every POP).
    pub(super) fn fifo(&self, group: &str) -> bool {
        lock(&self.groups).get(group).is_some_and(|c| c.fifo)
    }

    /// Every remembered group with its settings (what a master replicates).
    pub(super) fn all(&self) -> BTreeMap<String, GroupConfig> {
        lock(&self.groups).clone()
    }

    pub(super) fn get(&self, group: &str) -> GroupConfig {
        lock(&self.groups).get(group).cloned().unwrap_or_default()
    }

    /// Applies `change` to the group's settings and writes the file if that
    /// changed anything. On a failed write the change is undone.
    pub(super) fn update(&self, group: &str, change: impl FnOnce(&mut GroupConfig)) -> Result<()> {
        let mut groups = lock(&self.groups);
        let before = groups.get(group).cloned();
        let mut config = before.clone().unwrap_or_default();
        change(&mut config);
        if Some(&config) == before.as_ref()
            || (before.is_none() && config == GroupConfig::default())
        {
            return Ok(());
        }
        if config == GroupConfig::default() {
            groups.remove(group);
        } else {
            groups.insert(group.to_owned(), config);
        }
        let file = GroupsFile {
            version: 1,
            groups: groups.clone(),
        };
        let written = persist::write_json(&self.path, &file);
        if written.is_err() {
            match before {
                Some(b) => groups.insert(group.to_owned(), b),
                None => groups.remove(group),
            };
        }
        written
    }
}
