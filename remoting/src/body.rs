//! Request/response bodies and header field names of the broker protocol (what clients
//! send to a broker, as opposed to [`crate::protocol`], the NameServer's). Shared by the
//! server and the client. Fields are in fastjson's (alphabetical) order and every struct
//! reads with defaults, so a field a peer adds or leaves out is no error.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

/// Ext-field names of broker requests and responses (Java's `*RequestHeader` fields).
pub mod field {
    pub const PRODUCER_GROUP: &str = "producerGroup";
    pub const TOPIC: &str = "topic";
    pub const DEFAULT_TOPIC: &str = "defaultTopic";
    pub const DEFAULT_TOPIC_QUEUE_NUMS: &str = "defaultTopicQueueNums";
    pub const QUEUE_ID: &str = "queueId";
    pub const SYS_FLAG: &str = "sysFlag";
    pub const BORN_TIMESTAMP: &str = "bornTimestamp";
    pub const FLAG: &str = "flag";
    pub const PROPERTIES: &str = "properties";
    pub const RECONSUME_TIMES: &str = "reconsumeTimes";
    pub const UNIT_MODE: &str = "unitMode";
    pub const BATCH: &str = "batch";
    pub const MAX_RECONSUME_TIMES: &str = "maxReconsumeTimes";
    pub const BROKER_NAME: &str = "brokerName";
    pub const MSG_ID: &str = "msgId";
    pub const QUEUE_OFFSET: &str = "queueOffset";
    pub const TRANSACTION_ID: &str = "transactionId";
    pub const MSG_REGION: &str = "MSG_REGION";
    pub const TRACE_ON: &str = "TRACE_ON";
    pub const CONSUMER_GROUP: &str = "consumerGroup";
    pub const MAX_MSG_NUMS: &str = "maxMsgNums";
    pub const COMMIT_OFFSET: &str = "commitOffset";
    pub const SUSPEND_TIMEOUT_MILLIS: &str = "suspendTimeoutMillis";
    pub const SUBSCRIPTION: &str = "subscription";
    pub const SUB_VERSION: &str = "subVersion";
    pub const EXPRESSION_TYPE: &str = "expressionType";
    pub const NEXT_BEGIN_OFFSET: &str = "nextBeginOffset";
    pub const MIN_OFFSET: &str = "minOffset";
    pub const MAX_OFFSET: &str = "maxOffset";
    pub const SUGGEST_WHICH_BROKER_ID: &str = "suggestWhichBrokerId";
    pub const OFFSET: &str = "offset";
    pub const TIMESTAMP: &str = "timestamp";
    pub const GROUP: &str = "group";
    pub const DELAY_LEVEL: &str = "delayLevel";
    pub const ORIGIN_MSG_ID: &str = "originMsgId";
    pub const ORIGIN_TOPIC: &str = "originTopic";
    pub const CLIENT_ID: &str = "clientID";
    pub const KEY: &str = "key";
    pub const MAX_NUM: &str = "maxNum";
    pub const BEGIN_TIMESTAMP: &str = "beginTimestamp";
    pub const END_TIMESTAMP: &str = "endTimestamp";
    pub const UNIQUE_KEY_QUERY: &str = "_UNIQUE_KEY_QUERY";
    pub const INDEX_LAST_UPDATE_TIMESTAMP: &str = "indexLastUpdateTimestamp";
    pub const INDEX_LAST_UPDATE_PHYOFFSET: &str = "indexLastUpdatePhyoffset";
    pub const READ_QUEUE_NUMS: &str = "readQueueNums";
    pub const WRITE_QUEUE_NUMS: &str = "writeQueueNums";
    pub const PERM: &str = "perm";
    pub const TRAN_STATE_TABLE_OFFSET: &str = "tranStateTableOffset";
    pub const COMMIT_LOG_OFFSET: &str = "commitLogOffset";
    pub const COMMIT_OR_ROLLBACK: &str = "commitOrRollback";
    pub const FROM_TRANSACTION_CHECK: &str = "fromTransactionCheck";
    pub const OFFSET_MSG_ID: &str = "offsetMsgId";
}

/// `SendMessageRequestHeaderV2`'s one-letter names, in the order of the v1 names they
/// stand for.
pub const SEND_V2_NAMES: [(&str, &str); 14] = [
    ("a", field::PRODUCER_GROUP),
    ("b", field::TOPIC),
    ("c", field::DEFAULT_TOPIC),
    ("d", field::DEFAULT_TOPIC_QUEUE_NUMS),
    ("e", field::QUEUE_ID),
    ("f", field::SYS_FLAG),
    ("g", field::BORN_TIMESTAMP),
    ("h", field::FLAG),
    ("i", field::PROPERTIES),
    ("j", field::RECONSUME_TIMES),
    ("k", field::UNIT_MODE),
    ("l", field::MAX_RECONSUME_TIMES),
    ("m", field::BATCH),
    ("n", field::BROKER_NAME),
];

/// `PullSysFlag` bits of a pull request.
pub mod pull_flag {
    pub const COMMIT_OFFSET: i32 = 0x1;
    pub const SUSPEND: i32 = 0x1 << 1;
    pub const SUBSCRIPTION: i32 = 0x1 << 2;
    pub const CLASS_FILTER: i32 = 0x1 << 3;
    pub const LITE_PULL: i32 = 0x1 << 4;
}

/// `MessageSysFlag` transaction values in `END_TRANSACTION`'s `commitOrRollback`.
pub mod transaction {
    pub const NOT_TYPE: i32 = 0;
    pub const PREPARED: i32 = 1 << 2;
    pub const COMMIT: i32 = 2 << 2;
    pub const ROLLBACK: i32 = 3 << 2;
}

/// Java's `ExpressionType` names.
pub mod expression {
    pub const TAG: &str = "TAG";
    pub const SQL92: &str = "SQL92";
}

/// One topic a consumer subscribes to (`SubscriptionData`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SubscriptionData {
    pub class_filter_mode: bool,
    pub code_set: Vec<i32>,
    /// `TAG` or `SQL92`.
    pub expression_type: String,
    pub sub_string: String,
    pub sub_version: i64,
    pub tags_set: Vec<String>,
    pub topic: String,
}

/// One consumer group a client belongs to (`ConsumerData`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConsumerData {
    /// `CONSUME_FROM_LAST_OFFSET`, `CONSUME_FROM_FIRST_OFFSET`, `CONSUME_FROM_TIMESTAMP`.
    pub consume_from_where: String,
    /// `CONSUME_PASSIVELY` (push) or `CONSUME_ACTIVELY` (pull).
    pub consume_type: String,
    pub group_name: String,
    /// `CLUSTERING` or `BROADCASTING`.
    pub message_model: String,
    pub subscription_data_set: Vec<SubscriptionData>,
    pub unit_mode: bool,
}

/// One producer group a client belongs to (`ProducerData`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProducerData {
    pub group_name: String,
}

/// The body of `HEART_BEAT` (`HeartbeatData`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeartbeatData {
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "consumerDataSet")]
    pub consumer_data_set: Vec<ConsumerData>,
    #[serde(rename = "producerDataSet")]
    pub producer_data_set: Vec<ProducerData>,
}

/// The body of a `GET_CONSUMER_LIST_BY_GROUP` response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ConsumerList {
    pub consumer_id_list: Vec<String>,
}

/// A queue as clients name it (`MessageQueue`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MessageQueue {
    pub broker_name: String,
    pub queue_id: u32,
    pub topic: String,
}

impl MessageQueue {
    pub fn new(topic: impl Into<String>, broker_name: impl Into<String>, queue_id: u32) -> Self {
        MessageQueue {
            broker_name: broker_name.into(),
            queue_id,
            topic: topic.into(),
        }
    }

    /// fastjson's text of this queue, used as a map key in stats bodies.
    fn fastjson_key(&self) -> String {
        String::from_utf8(crate::protocol::to_json(self)).unwrap_or_default()
    }
}

/// The body of `LOCK_BATCH_MQ` and `UNLOCK_BATCH_MQ`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LockBatchRequest {
    pub client_id: String,
    pub consumer_group: String,
    pub mq_set: Vec<MessageQueue>,
    pub only_this_broker: bool,
}

/// The body of a `LOCK_BATCH_MQ` response: the queues now locked by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LockBatchResponse {
    #[serde(rename = "lockOKMQSet")]
    pub lock_ok_mq_set: Vec<MessageQueue>,
}

/// Offsets of one queue in a `GET_TOPIC_STATS_INFO` response (`TopicOffset`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicOffset {
    pub min_offset: u64,
    pub max_offset: u64,
    pub last_update_timestamp: i64,
}

/// Progress of one queue in a `GET_CONSUME_STATS` response (`OffsetWrapper`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OffsetWrapper {
    pub broker_offset: u64,
    pub consumer_offset: u64,
    pub pull_offset: u64,
    pub last_timestamp: i64,
}

/// `TopicStatsTable` as fastjson writes it: a map keyed by `MessageQueue` objects (not
/// standard JSON; it is what Java clients parse).
pub fn topic_stats_json(table: &[(MessageQueue, TopicOffset)]) -> Vec<u8> {
    let mut s = String::from("{\"offsetTable\":{");
    for (i, (mq, o)) in table.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{}:{{\"lastUpdateTimestamp\":{},\"maxOffset\":{},\"minOffset\":{}}}",
            mq.fastjson_key(),
            o.last_update_timestamp,
            o.max_offset,
            o.min_offset
        );
    }
    s.push_str("}}");
    s.into_bytes()
}

/// `ConsumeStats` as fastjson writes it (see [`topic_stats_json`]).
pub fn consume_stats_json(table: &[(MessageQueue, OffsetWrapper)], consume_tps: f64) -> Vec<u8> {
    let mut s = format!("{{\"consumeTps\":{consume_tps:.1},\"offsetTable\":{{");
    for (i, (mq, o)) in table.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{}:{{\"brokerOffset\":{},\"consumerOffset\":{},\"lastTimestamp\":{},\"pullOffset\":{}}}",
            mq.fastjson_key(),
            o.broker_offset,
            o.consumer_offset,
            o.last_timestamp,
            o.pull_offset
        );
    }
    s.push_str("}}");
    s.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::from_json;

    #[test]
    fn java_heartbeat_is_read() {
        let body = r#"{"clientID":"10.0.0.1@1234","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"g","messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1700000000000,"tagsSet":[],"topic":"T"}],"unitMode":false}],"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}]}"#;
        let hb: HeartbeatData = from_json(body.as_bytes()).unwrap();
        assert_eq!(hb.client_id, "10.0.0.1@1234");
        assert_eq!(hb.consumer_data_set[0].subscription_data_set[0].topic, "T");
        assert_eq!(hb.producer_data_set[0].group_name, "CLIENT_INNER_PRODUCER");
    }

    #[test]
    fn stats_use_object_keys_like_fastjson() {
        let mq = MessageQueue::new("T", "b", 1);
        let json = topic_stats_json(&[(
            mq,
            TopicOffset {
                min_offset: 0,
                max_offset: 5,
                last_update_timestamp: 9,
            },
        )]);
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:{"lastUpdateTimestamp":9,"maxOffset":5,"minOffset":0}}}"#
        );
    }
}
