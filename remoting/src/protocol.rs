//! Request bodies and ext-field names of the NameServer protocol, as Java RocketMQ writes
//! them with fastjson. Fields are declared in alphabetical order (fastjson's output order)
//! and every struct reads with defaults, so a field a peer leaves out or adds is no error.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::codec::fastjson;

/// Broker id of a master; slaves have ids > 0.
pub const MASTER_ID: u64 = 0;

/// Topic permission bits (`PermName`).
pub mod perm {
    pub const PRIORITY: u32 = 0x1 << 3;
    pub const READ: u32 = 0x1 << 2;
    pub const WRITE: u32 = 0x1 << 1;
    pub const INHERIT: u32 = 0x1;
}

/// Ext-field (custom header) names used by the NameServer requests and responses.
pub mod field {
    pub const BROKER_NAME: &str = "brokerName";
    pub const BROKER_ADDR: &str = "brokerAddr";
    pub const CLUSTER_NAME: &str = "clusterName";
    pub const HA_SERVER_ADDR: &str = "haServerAddr";
    pub const BROKER_ID: &str = "brokerId";
    pub const COMPRESSED: &str = "compressed";
    pub const BODY_CRC32: &str = "bodyCrc32";
    pub const MASTER_ADDR: &str = "masterAddr";
    pub const TOPIC: &str = "topic";
    pub const CLUSTER: &str = "cluster";
    pub const ACCEPT_STANDARD_JSON_ONLY: &str = "acceptStandardJsonOnly";
    pub const NAMESPACE: &str = "namespace";
    pub const KEY: &str = "key";
    pub const VALUE: &str = "value";
}

/// Version stamp of a broker's topic table (`DataVersion`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DataVersion {
    pub counter: i64,
    pub state_version: i64,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
}

/// One topic as a broker hosts it (Java's `TopicConfig`; named apart from the core's
/// `TopicConfig`, which holds the broker's own view of a topic).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WireTopicConfig {
    pub attributes: BTreeMap<String, String>,
    pub order: bool,
    pub perm: u32,
    pub read_queue_nums: u32,
    pub topic_filter_type: String,
    pub topic_name: String,
    pub topic_sys_flag: u32,
    pub write_queue_nums: u32,
}

impl Default for WireTopicConfig {
    /// Java's defaults: 16 queues, read + write.
    fn default() -> Self {
        WireTopicConfig {
            attributes: BTreeMap::new(),
            order: false,
            perm: perm::READ | perm::WRITE,
            read_queue_nums: 16,
            topic_filter_type: "SINGLE_TAG".into(),
            topic_name: String::new(),
            topic_sys_flag: 0,
            write_queue_nums: 16,
        }
    }
}

impl WireTopicConfig {
    /// A read-write topic with `queues` read and write queues.
    pub fn new(name: impl Into<String>, queues: u32) -> Self {
        WireTopicConfig {
            topic_name: name.into(),
            read_queue_nums: queues,
            write_queue_nums: queues,
            ..Default::default()
        }
    }
}

/// `TopicConfigSerializeWrapper`: a broker's whole topic table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TopicConfigWrapper {
    pub data_version: DataVersion,
    pub topic_config_table: BTreeMap<String, WireTopicConfig>,
}

/// The body of `REGISTER_BROKER` (`RegisterBrokerBody`, uncompressed form).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RegisterBrokerBody {
    pub filter_server_list: Vec<String>,
    pub topic_config_serialize_wrapper: TopicConfigWrapper,
}

/// The addresses of one broker group (master + slaves), by broker id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BrokerData {
    pub broker_addrs: BTreeMap<u64, String>,
    pub broker_name: String,
    pub cluster: String,
    /// Always written: RocketMQ 5 clients (e.g. rocketmq-client-rust) require it.
    pub enable_acting_master: bool,
}

/// One broker's queues of a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct QueueData {
    pub broker_name: String,
    pub perm: u32,
    pub read_queue_nums: u32,
    pub topic_sys_flag: u32,
    pub write_queue_nums: u32,
}

/// The body of a `GET_ROUTEINFO_BY_TOPIC` response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TopicRouteData {
    pub broker_datas: Vec<BrokerData>,
    pub filter_server_table: BTreeMap<String, Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_topic_conf: Option<String>,
    pub queue_datas: Vec<QueueData>,
}

/// The body of a `GET_BROKER_CLUSTER_INFO` response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterInfo {
    pub broker_addr_table: BTreeMap<String, BrokerData>,
    pub cluster_addr_table: BTreeMap<String, BTreeSet<String>>,
}

/// The body of the topic-list responses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TopicList {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker_addr: Option<String>,
    pub topic_list: BTreeSet<String>,
}

/// A namespace of KV config (`KVTable`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvTable {
    pub table: BTreeMap<String, String>,
}

/// The `bodyCrc32` of a request body, as Java's `UtilAll.crc32`: CRC-32 (IEEE) with the
/// sign bit cleared. 0 on the wire means "not checked".
pub fn body_crc32(body: &[u8]) -> i32 {
    (crc32fast::hash(body) & 0x7FFF_FFFF) as i32
}

/// Strict JSON of a wire struct. Our structs hold only strings, numbers and string-keyed
/// or integer-keyed maps, which always serialize.
pub fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// fastjson's own form: like [`to_json`] but integer map keys are bare (`{0:"addr"}`),
/// for clients older than 4.9.4 that asked for nothing else.
pub fn to_fastjson<T: Serialize>(value: &T) -> Vec<u8> {
    let strict = serde_json::to_string(value).unwrap_or_default();
    fastjson::unquote_numeric_keys(&strict).into_bytes()
}

/// Reads a body in fastjson's dialect.
pub fn from_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    fastjson::from_slice(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> TopicRouteData {
        TopicRouteData {
            broker_datas: vec![BrokerData {
                broker_addrs: BTreeMap::from([(0, "127.0.0.1:10911".to_string())]),
                broker_name: "broker-a".into(),
                cluster: "DefaultCluster".into(),
                enable_acting_master: false,
            }],
            queue_datas: vec![QueueData {
                broker_name: "broker-a".into(),
                perm: 6,
                read_queue_nums: 4,
                topic_sys_flag: 0,
                write_queue_nums: 4,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn route_is_written_as_java_writes_it() {
        let expected = r#"{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}"#;
        assert_eq!(String::from_utf8(to_fastjson(&route())).unwrap(), expected);
        let standard = String::from_utf8(to_json(&route())).unwrap();
        assert!(standard.contains(r#"{"0":"127.0.0.1:10911"}"#));
        assert_eq!(
            from_json::<TopicRouteData>(expected.as_bytes()).unwrap(),
            route()
        );
    }

    #[test]
    fn body_crc_matches_java() {
        // java.util.zip.CRC32 of "123456789" is 0xCBF43926; UtilAll.crc32 clears bit 31.
        assert_eq!(body_crc32(b"123456789"), 0x4BF4_3926);
    }

    #[test]
    fn java_register_body_is_read() {
        // As a Java 4.9 broker sends it (RegisterBrokerBody.encode(false)).
        let body = r#"{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":3,"timestamp":1700000000000},"topicConfigTable":{"TopicTest":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4},"SELF_TEST_TOPIC":{"order":false,"perm":6,"readQueueNums":1,"topicFilterType":"SINGLE_TAG","topicName":"SELF_TEST_TOPIC","topicSysFlag":0,"writeQueueNums":1}}}}"#;
        let b: RegisterBrokerBody = from_json(body.as_bytes()).unwrap();
        let t = &b.topic_config_serialize_wrapper.topic_config_table["TopicTest"];
        assert_eq!((t.read_queue_nums, t.write_queue_nums, t.perm), (4, 4, 6));
        assert_eq!(b.topic_config_serialize_wrapper.data_version.counter, 3);
    }
}
