//! KV config (`PUT/GET/DELETE_KV_CONFIG`, `GET_KVLIST_BY_NAMESPACE`): namespaced string
//! settings that tools store on the NameServer, e.g. `ORDER_TOPIC_CONFIG`. In memory only.

use std::collections::BTreeMap;

/// namespace -> key -> value
#[derive(Debug, Default)]
pub struct KvConfig {
    table: BTreeMap<String, BTreeMap<String, String>>,
}

impl KvConfig {
    pub fn put(&mut self, namespace: &str, key: &str, value: &str) {
        self.table
            .entry(namespace.to_string())
            .or_default()
            .insert(key.to_string(), value.to_string());
    }

    pub fn get(&self, namespace: &str, key: &str) -> Option<&str> {
        self.table.get(namespace)?.get(key).map(String::as_str)
    }

    pub fn delete(&mut self, namespace: &str, key: &str) {
        if let Some(ns) = self.table.get_mut(namespace) {
            ns.remove(key);
            if ns.is_empty() {
                self.table.remove(namespace);
            }
        }
    }

    pub fn namespace(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.table.get(namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_delete() {
        let mut kv = KvConfig::default();
        kv.put("ns", "k", "v");
        assert_eq!(kv.get("ns", "k"), Some("v"));
        kv.delete("ns", "k");
        assert_eq!(kv.get("ns", "k"), None);
        assert!(kv.namespace("ns").is_none());
    }
}
