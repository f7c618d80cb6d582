//! Request and response codes, with the values of Java's `RequestCode` and `ResponseCode`
//! (`org.apache.rocketmq.remoting.protocol`). Plain `i32` constants rather than enums:
//! a peer may send any number, and an unknown one must still round-trip to
//! `REQUEST_CODE_NOT_SUPPORTED`.

/// Request codes (`RemotingCommand::code` of a request).
pub mod request {
    // Broker: messages and offsets.
    pub const SEND_MESSAGE: i32 = 10;
    pub const PULL_MESSAGE: i32 = 11;
    pub const QUERY_MESSAGE: i32 = 12;
    pub const QUERY_BROKER_OFFSET: i32 = 13;
    pub const QUERY_CONSUMER_OFFSET: i32 = 14;
    pub const UPDATE_CONSUMER_OFFSET: i32 = 15;
    pub const UPDATE_AND_CREATE_TOPIC: i32 = 17;
    pub const GET_ALL_TOPIC_CONFIG: i32 = 21;
    pub const GET_BROKER_CONFIG: i32 = 26;
    pub const GET_BROKER_RUNTIME_INFO: i32 = 28;
    pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
    pub const GET_MAX_OFFSET: i32 = 30;
    pub const GET_MIN_OFFSET: i32 = 31;
    pub const GET_EARLIEST_MSG_STORETIME: i32 = 32;
    pub const VIEW_MESSAGE_BY_ID: i32 = 33;
    pub const HEART_BEAT: i32 = 34;
    pub const UNREGISTER_CLIENT: i32 = 35;
    pub const CONSUMER_SEND_MSG_BACK: i32 = 36;
    pub const END_TRANSACTION: i32 = 37;
    pub const GET_CONSUMER_LIST_BY_GROUP: i32 = 38;
    pub const CHECK_TRANSACTION_STATE: i32 = 39;
    pub const NOTIFY_CONSUMER_IDS_CHANGED: i32 = 40;
    pub const LOCK_BATCH_MQ: i32 = 41;
    pub const UNLOCK_BATCH_MQ: i32 = 42;
    pub const GET_ALL_CONSUMER_OFFSET: i32 = 43;
    pub const GET_ALL_DELAY_OFFSET: i32 = 45;
    pub const CHECK_CLIENT_CONFIG: i32 = 46;

    // NameServer.
    pub const PUT_KV_CONFIG: i32 = 100;
    pub const GET_KV_CONFIG: i32 = 101;
    pub const DELETE_KV_CONFIG: i32 = 102;
    pub const REGISTER_BROKER: i32 = 103;
    pub const UNREGISTER_BROKER: i32 = 104;
    pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
    pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
    pub const WIPE_WRITE_PERM_OF_BROKER: i32 = 205;
    pub const GET_ALL_TOPIC_LIST_FROM_NAMESERVER: i32 = 206;
    pub const DELETE_TOPIC_IN_BROKER: i32 = 215;
    pub const DELETE_TOPIC_IN_NAMESRV: i32 = 216;
    pub const REGISTER_TOPIC_IN_NAMESRV: i32 = 217;
    pub const GET_KVLIST_BY_NAMESPACE: i32 = 219;
    pub const GET_TOPICS_BY_CLUSTER: i32 = 224;
    pub const QUERY_DATA_VERSION: i32 = 322;
    pub const ADD_WRITE_PERM_OF_BROKER: i32 = 327;
    pub const BROKER_HEARTBEAT: i32 = 904;

    // Broker: newer sends, consumer management, POP.
    pub const GET_TOPIC_STATS_INFO: i32 = 202;
    pub const GET_CONSUME_STATS: i32 = 208;
    pub const GET_CONSUMER_RUNNING_INFO: i32 = 307;
    pub const CONSUME_MESSAGE_DIRECTLY: i32 = 309;
    pub const SEND_MESSAGE_V2: i32 = 310;
    pub const SEND_BATCH_MESSAGE: i32 = 320;
    pub const SEND_REPLY_MESSAGE: i32 = 324;
    pub const SEND_REPLY_MESSAGE_V2: i32 = 325;
    pub const PUSH_REPLY_MESSAGE_TO_CLIENT: i32 = 326;
    pub const LITE_PULL_MESSAGE: i32 = 361;
    pub const QUERY_ASSIGNMENT: i32 = 400;
    pub const SET_MESSAGE_REQUEST_MODE: i32 = 401;
    pub const POP_MESSAGE: i32 = 200050;
    pub const ACK_MESSAGE: i32 = 200051;
    pub const PEEK_MESSAGE: i32 = 200052;
    pub const CHANGE_MESSAGE_INVISIBLETIME: i32 = 200053;
    pub const NOTIFICATION: i32 = 200054;
    pub const POLLING_INFO: i32 = 200055;
    pub const BATCH_ACK_MESSAGE: i32 = 200151;
}

/// rocketgate's own request codes: the broker API ([`rocketgate_core`'s
/// `MessagingApi`]) over the native door, for a proxy node whose doors run over
/// brokers in other processes (`docs/proxy-protocol.md`). One code per method.
///
/// They sit in 31000..31100: above every code Apache RocketMQ assigns in the 16-bit
/// range (its highest there are the 3xxx auth codes) and below `i16::MAX`, so these
/// requests keep the compact binary header (a code above it forces a JSON header,
/// see `FrameCodec::encode`). A broker that does not know them answers
/// `REQUEST_CODE_NOT_SUPPORTED`.
pub mod api {
    pub const FIRST: i32 = 31_000;
    pub const LAST: i32 = 31_099;

    pub const CREATE_TOPIC: i32 = 31_001;
    pub const UPDATE_TOPIC: i32 = 31_002;
    pub const DELETE_TOPIC: i32 = 31_003;
    pub const TOPIC: i32 = 31_004;
    pub const TOPICS: i32 = 31_005;

    pub const SEND: i32 = 31_010;
    pub const SEND_BATCH: i32 = 31_011;
    pub const SEND_ENCODED: i32 = 31_012;
    pub const SEND_BACK: i32 = 31_013;
    pub const RESEND_DEAD_LETTERS: i32 = 31_014;

    pub const PULL: i32 = 31_020;
    pub const POP: i32 = 31_021;
    pub const ACK: i32 = 31_022;
    pub const CHANGE_INVISIBILITY: i32 = 31_023;
    pub const NACK: i32 = 31_024;

    pub const HEARTBEAT: i32 = 31_030;
    pub const UNREGISTER: i32 = 31_031;
    pub const ASSIGNMENT: i32 = 31_032;
    pub const QUERY_OFFSET: i32 = 31_033;
    pub const COMMIT_OFFSET: i32 = 31_034;
    pub const RESET_OFFSET: i32 = 31_035;
    pub const LOCK_QUEUE: i32 = 31_036;
    pub const UNLOCK_QUEUE: i32 = 31_037;

    pub const SEND_HALF: i32 = 31_040;
    pub const END_TRANSACTION: i32 = 31_041;
    /// Registers the connection as a transaction checker of a producer group.
    pub const REGISTER_CHECKER: i32 = 31_042;
    pub const UNREGISTER_CHECKER: i32 = 31_043;
    /// Broker to proxy, one-way: an undecided half message for a registered checker.
    pub const CHECK_TRANSACTION: i32 = 31_044;

    pub const QUEUE_STATS: i32 = 31_050;
    pub const OFFSET_BY_TIME: i32 = 31_051;
    pub const SET_MAX_RECONSUME_TIMES: i32 = 31_052;
    pub const SET_FIFO: i32 = 31_053;
    pub const GROUPS: i32 = 31_054;
    pub const GROUP_INFO: i32 = 31_055;
    pub const MESSAGE_BY_ID: i32 = 31_056;
    pub const MESSAGES_BY_KEY: i32 = 31_057;
    pub const MESSAGES_BY_TIME: i32 = 31_058;

    pub const DELAY_LIMITS: i32 = 31_060;
    pub const DELAYED: i32 = 31_061;
    pub const CANCEL_DELAYED: i32 = 31_062;

    pub const SYNC_VISIBLE: i32 = 31_070;

    /// Whether `code` is one of the broker API's.
    pub const fn is_api(code: i32) -> bool {
        code >= FIRST && code <= LAST
    }
}

/// Response codes (`RemotingCommand::code` of a response).
pub mod response {
    pub const SUCCESS: i32 = 0;
    pub const SYSTEM_ERROR: i32 = 1;
    pub const SYSTEM_BUSY: i32 = 2;
    pub const REQUEST_CODE_NOT_SUPPORTED: i32 = 3;
    pub const TRANSACTION_FAILED: i32 = 4;
    pub const FLUSH_DISK_TIMEOUT: i32 = 10;
    pub const SLAVE_NOT_AVAILABLE: i32 = 11;
    pub const FLUSH_SLAVE_TIMEOUT: i32 = 12;
    pub const MESSAGE_ILLEGAL: i32 = 13;
    pub const SERVICE_NOT_AVAILABLE: i32 = 14;
    pub const VERSION_NOT_SUPPORTED: i32 = 15;
    pub const NO_PERMISSION: i32 = 16;
    pub const TOPIC_NOT_EXIST: i32 = 17;
    pub const TOPIC_EXIST_ALREADY: i32 = 18;
    pub const PULL_NOT_FOUND: i32 = 19;
    pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
    pub const PULL_OFFSET_MOVED: i32 = 21;
    pub const QUERY_NOT_FOUND: i32 = 22;
    pub const SUBSCRIPTION_PARSE_FAILED: i32 = 23;
    pub const SUBSCRIPTION_NOT_EXIST: i32 = 24;
    pub const SUBSCRIPTION_NOT_LATEST: i32 = 25;
    pub const SUBSCRIPTION_GROUP_NOT_EXIST: i32 = 26;
    pub const FILTER_DATA_NOT_EXIST: i32 = 27;
    pub const FILTER_DATA_NOT_LATEST: i32 = 28;
    pub const TRANSACTION_SHOULD_COMMIT: i32 = 200;
    pub const TRANSACTION_SHOULD_ROLLBACK: i32 = 201;
    pub const TRANSACTION_STATE_UNKNOW: i32 = 202;
    pub const TRANSACTION_STATE_GROUP_WRONG: i32 = 203;
    pub const NO_BUYER_ID: i32 = 204;
    pub const NOT_IN_CURRENT_UNIT: i32 = 205;
    pub const CONSUMER_NOT_ONLINE: i32 = 206;
    pub const CONSUME_MSG_TIMEOUT: i32 = 207;
    pub const NO_MESSAGE: i32 = 208;
    pub const POLLING_FULL: i32 = 209;
    pub const POLLING_TIMEOUT: i32 = 210;
    pub const BROKER_NOT_EXIST: i32 = 211;
    pub const BROKER_DISPATCH_NOT_COMPLETE: i32 = 212;
    pub const BROADCAST_CONSUMPTION: i32 = 213;
    pub const FLOW_CONTROL: i32 = 215;
    pub const NOT_LEADER_FOR_QUEUE: i32 = 501;
    pub const ILLEGAL_OPERATION: i32 = 604;
}

/// `MQVersion.Version` ordinals this crate compares against.
pub mod version {
    /// From this version on a broker sends `RegisterBrokerBody` (with `filterServerList`)
    /// rather than a bare `TopicConfigSerializeWrapper`.
    pub const V3_0_11: i32 = 37;
    /// From this version on a client reads standard JSON (quoted numeric keys) in routes.
    pub const V4_9_4: i32 = 401;
    /// What we announce: 5.3.1.
    pub const CURRENT: i32 = 475;
}
