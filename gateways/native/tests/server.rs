//! The broker server over TCP, driven with the crate's codec as a raw client.

mod common;

use std::sync::Arc;

use bytes::BytesMut;
use common::{Node, Options};
use rocketgate_core::broker::{MessagingApi, Perm, PullRequest, TopicConfig, filter::Filter};
use rocketgate_native::ServerSettings;
use rocketgate_native::message::{ReceivedMessage, encode_batch_entry, encode_properties};
use rocketgate_remoting::body::{
    ConsumerData, ConsumerList, HeartbeatData, LockBatchRequest, LockBatchResponse, MessageQueue,
    ProducerData, SubscriptionData, pull_flag,
};
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::protocol::{from_json, to_json};

fn send_v1(topic: &str, queue: i32, body: &[u8], props: &[(&str, &str)]) -> RemotingCommand {
    RemotingCommand::request(request::SEND_MESSAGE, 0)
        .with_field("producerGroup", "pg")
        .with_field("topic", topic)
        .with_field("defaultTopic", "TBW102")
        .with_field("defaultTopicQueueNums", 4)
        .with_field("queueId", queue)
        .with_field("sysFlag", 0)
        .with_field("bornTimestamp", 1_700_000_000_000i64)
        .with_field("flag", 0)
        .with_field("properties", encode_properties(props.iter().copied()))
        .with_field("reconsumeTimes", 0)
        .with_field("unitMode", false)
        .with_body(body.to_vec())
}

fn send_v2(topic: &str, queue: i32, body: &[u8], props: &[(&str, &str)]) -> RemotingCommand {
    RemotingCommand::request(request::SEND_MESSAGE_V2, 0)
        .with_field("a", "pg")
        .with_field("b", topic)
        .with_field("c", "TBW102")
        .with_field("d", 4)
        .with_field("e", queue)
        .with_field("f", 0)
        .with_field("g", 1_700_000_000_000i64)
        .with_field("h", 0)
        .with_field("i", encode_properties(props.iter().copied()))
        .with_field("j", 0)
        .with_field("k", false)
        .with_body(body.to_vec())
}

fn pull(
    group: &str,
    topic: &str,
    queue: u32,
    offset: u64,
    flags: i32,
    suspend_ms: u64,
) -> RemotingCommand {
    RemotingCommand::request(request::PULL_MESSAGE, 0)
        .with_field("consumerGroup", group)
        .with_field("topic", topic)
        .with_field("queueId", queue)
        .with_field("queueOffset", offset)
        .with_field("maxMsgNums", 32)
        .with_field("sysFlag", flags)
        .with_field("commitOffset", 0)
        .with_field("suspendTimeoutMillis", suspend_ms)
        .with_field("subscription", "*")
        .with_field("subVersion", 0)
        .with_field("expressionType", "TAG")
}

const SUB: i32 = pull_flag::SUBSCRIPTION;

fn field<T: std::str::FromStr>(c: &RemotingCommand, name: &str) -> T {
    c.field(name)
        .unwrap_or_else(|| panic!("field {name} in {c:?}"))
        .parse()
        .ok()
        .unwrap_or_else(|| panic!("field {name} parses"))
}

#[tokio::test]
async fn send_then_pull_returns_the_stored_bytes() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let r = c
        .ask(send_v1(
            "T",
            1,
            b"hello",
            &[("TAGS", "tagA"), ("KEYS", "k1 k2"), ("UNIQ_KEY", "U1")],
        ))
        .await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(field::<u32>(&r, "queueId"), 1);
    assert_eq!(field::<u64>(&r, "queueOffset"), 0);
    let r = c.ask(send_v2("T", 1, b"world", &[("TAGS", "tagB")])).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(field::<u64>(&r, "queueOffset"), 1);

    node.settle().await;
    let p = c.ask(pull("g", "T", 1, 0, SUB, 0)).await;
    assert_eq!(p.code, response::SUCCESS, "{p:?}");
    assert_eq!(field::<u64>(&p, "nextBeginOffset"), 2);
    assert_eq!(field::<u64>(&p, "minOffset"), 0);
    assert_eq!(field::<u64>(&p, "maxOffset"), 2);
    let msgs = ReceivedMessage::decode_all(&p.body).unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0].body.as_ref(), b"hello");
    assert_eq!(msgs[0].tag(), Some("tagA"));
    assert_eq!(msgs[0].keys(), vec!["k1", "k2"]);
    assert_eq!(msgs[0].msg_id, "U1");
    assert_eq!(msgs[0].born_timestamp, 1_700_000_000_000);
    assert_eq!(msgs[1].body.as_ref(), b"world");
    assert_eq!(msgs[1].queue_offset, 1);

    // The body is the commit log's bytes, not a re-encoding.
    let stored = node
        .broker
        .pull(PullRequest {
            group: "x".into(),
            member: String::new(),
            topic: "T".into(),
            queue_id: 1,
            offset: 0,
            max_messages: 2,
            filter: Filter::all(),
            wait: std::time::Duration::ZERO,
        })
        .await
        .unwrap();
    let mut expected = BytesMut::new();
    for m in &stored.messages {
        expected.extend_from_slice(&m.record);
    }
    assert_eq!(p.body.as_ref(), expected.as_ref());

    // A tag filter in the pull skips the other message.
    let p = c
        .ask(pull("g", "T", 1, 0, SUB, 0).with_field("subscription", "tagB"))
        .await;
    assert_eq!(p.code, response::SUCCESS);
    let msgs = ReceivedMessage::decode_all(&p.body).unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].tag(), Some("tagB"));
}

#[tokio::test]
async fn a_suspended_pull_wakes_when_a_message_arrives() {
    let node = Node::start().await;
    let mut consumer = node.conn().await;
    let mut producer = node.conn().await;
    assert_eq!(producer.ask(send_v1("LP", 0, b"first", &[])).await.code, 0);
    node.settle().await;
    // Caught up at offset 1: the pull is held (15 s) until the next send.
    let waiting = consumer
        .send(pull("g", "LP", 0, 1, SUB | pull_flag::SUSPEND, 15_000))
        .await;
    // The held pull does not block other requests on the same connection.
    let r = consumer.ask(send_v1("LP", 0, b"second", &[])).await;
    assert_eq!(r.code, response::SUCCESS);
    let p = consumer.response(waiting).await;
    assert_eq!(p.code, response::SUCCESS, "{p:?}");
    let msgs = ReceivedMessage::decode_all(&p.body).unwrap();
    assert_eq!(msgs[0].body.as_ref(), b"second");
}

#[tokio::test]
async fn pull_status_codes_follow_rocketmq() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    for i in 0..3 {
        let tags = if i == 2 { "b" } else { "a" };
        c.ask(send_v1("S", 0, b"x", &[("TAGS", tags)])).await;
    }
    node.settle().await;
    // At the end, no suspend: PULL_NOT_FOUND.
    let p = c.ask(pull("g", "S", 0, 3, SUB, 0)).await;
    assert_eq!(p.code, response::PULL_NOT_FOUND);
    assert_eq!(field::<u64>(&p, "nextBeginOffset"), 3);
    // Past the end: PULL_OFFSET_MOVED, told where to go.
    let p = c.ask(pull("g", "S", 0, 100, SUB, 0)).await;
    assert_eq!(p.code, response::PULL_OFFSET_MOVED);
    assert_eq!(field::<u64>(&p, "nextBeginOffset"), 3);
    // Only non-matching messages: PULL_RETRY_IMMEDIATELY with the offset moved on.
    let p = c
        .ask(pull("g", "S", 0, 0, SUB, 0).with_field("subscription", "zzz"))
        .await;
    assert_eq!(p.code, response::PULL_RETRY_IMMEDIATELY);
    assert_eq!(field::<u64>(&p, "nextBeginOffset"), 3);
    // A malformed SQL92 filter.
    let p = c
        .ask(
            pull("g", "S", 0, 0, SUB, 0)
                .with_field("subscription", "a >")
                .with_field("expressionType", "SQL92"),
        )
        .await;
    assert_eq!(p.code, response::SUBSCRIPTION_PARSE_FAILED, "{p:?}");
    // No subscription sent and none heart-beat.
    let p = c.ask(pull("nobody", "S", 0, 0, 0, 0)).await;
    assert_eq!(p.code, response::SUBSCRIPTION_NOT_EXIST);
}

#[tokio::test]
async fn batch_send_stores_every_message_in_order() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let mut body = BytesMut::new();
    for i in 0..3 {
        let props = encode_properties([
            ("KEYS", format!("k{i}").as_str()),
            ("UNIQ_KEY", format!("u{i}").as_str()),
        ]);
        encode_batch_entry(0, format!("m{i}").as_bytes(), &props, &mut body);
    }
    let mut req = send_v2("B", 2, b"", &[]);
    req.code = request::SEND_BATCH_MESSAGE;
    req = req.with_field("m", true).with_body(body.freeze());
    let r = c.ask(req).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(r.field("msgId").unwrap().split(',').count(), 3);
    node.settle().await;
    let p = c.ask(pull("g", "B", 2, 0, SUB, 0)).await;
    let msgs = ReceivedMessage::decode_all(&p.body).unwrap();
    let bodies: Vec<&[u8]> = msgs.iter().map(|m| m.body.as_ref()).collect();
    assert_eq!(bodies, vec![&b"m0"[..], b"m1", b"m2"]);
    assert_eq!(msgs[2].keys(), vec!["k2"]);
    assert_eq!(msgs[1].msg_id, "u1");

    // A truncated batch body is MESSAGE_ILLEGAL, and the connection lives on.
    let mut bad = send_v2("B", 2, b"\x00\x00\x00\x30garbage", &[]);
    bad.code = request::SEND_BATCH_MESSAGE;
    assert_eq!(c.ask(bad).await.code, response::MESSAGE_ILLEGAL);
    assert_eq!(
        c.ask(send_v1("B", 0, b"ok", &[])).await.code,
        response::SUCCESS
    );
}

#[tokio::test]
async fn consumer_offsets_round_trip_and_commit_with_pull() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    c.ask(send_v1("O", 0, b"x", &[])).await;
    node.settle().await;
    let q = |g: &str| {
        RemotingCommand::request(request::QUERY_CONSUMER_OFFSET, 0)
            .with_field("consumerGroup", g)
            .with_field("topic", "O")
            .with_field("queueId", 0)
    };
    assert_eq!(c.ask(q("g")).await.code, response::QUERY_NOT_FOUND);
    let u = RemotingCommand::request(request::UPDATE_CONSUMER_OFFSET, 0)
        .with_field("consumerGroup", "g")
        .with_field("topic", "O")
        .with_field("queueId", 0)
        .with_field("commitOffset", 1);
    assert_eq!(c.ask(u).await.code, response::SUCCESS);
    let r = c.ask(q("g")).await;
    assert_eq!(r.code, response::SUCCESS);
    assert_eq!(field::<u64>(&r, "offset"), 1);

    // A pull carrying the commit flag commits for its group.
    let p = pull("g2", "O", 0, 0, SUB | pull_flag::COMMIT_OFFSET, 0).with_field("commitOffset", 1);
    assert_eq!(c.ask(p).await.code, response::SUCCESS);
    assert_eq!(field::<u64>(&c.ask(q("g2")).await, "offset"), 1);
}

#[tokio::test]
async fn failures_get_rocketmq_codes_and_the_connection_stays() {
    let node = Node::start_with(Options {
        auto_create: false,
        ..Options::default()
    })
    .await;
    let mut c = node.conn().await;
    let r = c.ask(send_v1("Missing", 0, b"x", &[])).await;
    assert_eq!(r.code, response::TOPIC_NOT_EXIST, "{r:?}");
    assert!(r.remark.unwrap().contains("Missing"));

    node.broker
        .create_topic(TopicConfig::new("RO", 2).with_perm(Perm::READ))
        .await
        .unwrap();
    assert_eq!(
        c.ask(send_v1("RO", 0, b"x", &[])).await.code,
        response::NO_PERMISSION
    );

    let r = c.ask(RemotingCommand::request(9999, 0)).await;
    assert_eq!(r.code, response::REQUEST_CODE_NOT_SUPPORTED);

    // A header field that is not a number.
    let r = c
        .ask(send_v1("RO", 0, b"x", &[]).with_field("queueId", "abc"))
        .await;
    assert_eq!(r.code, response::SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("queueId"));

    let r = c
        .ask(
            RemotingCommand::request(request::UPDATE_AND_CREATE_TOPIC, 0)
                .with_field("topic", "Created")
                .with_field("readQueueNums", 3)
                .with_field("writeQueueNums", 3)
                .with_field("perm", 6),
        )
        .await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(node.broker.topic("Created").await.unwrap().write_queues, 3);
    assert_eq!(
        c.ask(send_v1("Created", 2, b"x", &[])).await.code,
        response::SUCCESS
    );
    let r = c.ask(send_v1("Created", 7, b"x", &[])).await;
    assert_ne!(r.code, response::SUCCESS);
}

struct FullDisk;
impl rocketgate_core::store::DiskSpace for FullDisk {
    fn usage_ratio(&self, _: &std::path::Path) -> std::io::Result<f64> {
        Ok(0.99)
    }
}

#[tokio::test]
async fn disk_full_is_service_not_available_and_overload_is_system_busy() {
    let node = Node::start_with(Options {
        disk: Some(Arc::new(FullDisk)),
        ..Options::default()
    })
    .await;
    let mut c = node.conn().await;
    let r = c.ask(send_v1("T", 0, b"x", &[])).await;
    assert_eq!(r.code, response::SERVICE_NOT_AVAILABLE, "{r:?}");

    // Sync flush that may not wait at all: FLUSH_DISK_TIMEOUT (the message is stored,
    // just not yet known durable).
    let slow = Node::start_with(Options {
        flush: Some(rocketgate_core::store::FlushMode::Sync {
            timeout: std::time::Duration::ZERO,
        }),
        ..Options::default()
    })
    .await;
    let mut c = slow.conn().await;
    // A sync can finish before the zero wait is checked, so one send may succeed;
    // every answer is SUCCESS or FLUSH_DISK_TIMEOUT, and the timeout does come.
    let mut timed_out = false;
    for _ in 0..200 {
        let r = c.ask(send_v1("T", 0, b"x", &[])).await;
        if r.code == response::FLUSH_DISK_TIMEOUT {
            timed_out = true;
            break;
        }
        assert_eq!(r.code, response::SUCCESS, "{r:?}");
    }
    assert!(
        timed_out,
        "a zero sync-flush wait answers FLUSH_DISK_TIMEOUT"
    );

    let busy = Node::start_with(Options {
        settings: ServerSettings {
            max_inflight_sends: 0,
            ..ServerSettings::default()
        },
        ..Options::default()
    })
    .await;
    let mut c = busy.conn().await;
    let r = c.ask(send_v1("T", 0, b"x", &[])).await;
    assert_eq!(r.code, response::SYSTEM_BUSY);
    // Pulls are not sends: still served.
    assert_eq!(
        c.ask(pull("g", "T", 0, 0, SUB, 0)).await.code,
        response::TOPIC_NOT_EXIST
    );
}

#[tokio::test]
async fn a_bad_frame_closes_only_that_connection() {
    let node = Node::start().await;
    let mut bad = node.conn().await;
    // Length 8, then a header-length word with serialization type 7.
    bad.raw(&[0, 0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0]).await;
    assert!(bad.frame().await.is_none(), "closed cleanly");
    let mut bad = node.conn().await;
    // A JSON header that is not JSON.
    bad.raw(&[0, 0, 0, 7, 0, 0, 0, 3, b'{', b'x', b'!']).await;
    assert!(bad.frame().await.is_none());
    let mut bad = node.conn().await;
    // A frame longer than the limit.
    bad.raw(&[0x7f, 0xff, 0xff, 0xff]).await;
    assert!(bad.frame().await.is_none());
    let mut good = node.conn().await;
    assert_eq!(
        good.ask(send_v1("T", 0, b"x", &[])).await.code,
        response::SUCCESS
    );
}

fn heartbeat(client: &str, group: &str, topic: &str, tags: &str) -> RemotingCommand {
    let hb = HeartbeatData {
        client_id: client.into(),
        consumer_data_set: vec![ConsumerData {
            consume_from_where: "CONSUME_FROM_FIRST_OFFSET".into(),
            consume_type: "CONSUME_PASSIVELY".into(),
            group_name: group.into(),
            message_model: "CLUSTERING".into(),
            subscription_data_set: vec![SubscriptionData {
                expression_type: "TAG".into(),
                sub_string: tags.into(),
                topic: topic.into(),
                ..Default::default()
            }],
            unit_mode: false,
        }],
        producer_data_set: vec![ProducerData {
            group_name: "pg".into(),
        }],
    };
    RemotingCommand::request(request::HEART_BEAT, 0).with_body(to_json(&hb))
}

#[tokio::test]
async fn membership_changes_are_pushed_and_listed() {
    let node = Node::start().await;
    let mut a = node.conn().await;
    let mut b = node.conn().await;
    a.ask(send_v1("M", 0, b"x", &[("TAGS", "keep")])).await;
    a.ask(send_v1("M", 0, b"y", &[("TAGS", "drop")])).await;
    node.settle().await;
    assert_eq!(a.ask(heartbeat("A@1", "G", "M", "keep")).await.code, 0);
    assert_eq!(b.ask(heartbeat("B@1", "G", "M", "keep")).await.code, 0);
    let n = a.pushed(request::NOTIFY_CONSUMER_IDS_CHANGED).await;
    assert_eq!(n.field("consumerGroup"), Some("G"));
    let list = a
        .ask(
            RemotingCommand::request(request::GET_CONSUMER_LIST_BY_GROUP, 0)
                .with_field("consumerGroup", "G"),
        )
        .await;
    let list: ConsumerList = from_json(&list.body).unwrap();
    assert_eq!(list.consumer_id_list, vec!["A@1", "B@1"]);

    // A pull without a subscription uses the heart-beat one (tag "keep").
    let p = a.ask(pull("G", "M", 0, 0, 0, 0)).await;
    let msgs = ReceivedMessage::decode_all(&p.body).unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].tag(), Some("keep"));

    // Orderly locks: A takes queue 0, B is refused it.
    let lock = |client: &str| {
        let body = LockBatchRequest {
            client_id: client.into(),
            consumer_group: "G".into(),
            mq_set: vec![MessageQueue::new("M", "broker-a", 0)],
            only_this_broker: false,
        };
        RemotingCommand::request(request::LOCK_BATCH_MQ, 0).with_body(to_json(&body))
    };
    let got: LockBatchResponse = from_json(&a.ask(lock("A@1")).await.body).unwrap();
    assert_eq!(got.lock_ok_mq_set.len(), 1);
    let got: LockBatchResponse = from_json(&b.ask(lock("B@1")).await.body).unwrap();
    assert!(got.lock_ok_mq_set.is_empty());

    // B leaves by closing its connection: A is told, and the list shrinks.
    a.pushed.clear();
    drop(b);
    a.pushed(request::NOTIFY_CONSUMER_IDS_CHANGED).await;
    let list = a
        .ask(
            RemotingCommand::request(request::GET_CONSUMER_LIST_BY_GROUP, 0)
                .with_field("consumerGroup", "G"),
        )
        .await;
    let list: ConsumerList = from_json(&list.body).unwrap();
    assert_eq!(list.consumer_id_list, vec!["A@1"]);

    // A unregisters explicitly.
    let r = a
        .ask(
            RemotingCommand::request(request::UNREGISTER_CLIENT, 0)
                .with_field("clientID", "A@1")
                .with_field("consumerGroup", "G"),
        )
        .await;
    assert_eq!(r.code, 0);
    let list = a
        .ask(
            RemotingCommand::request(request::GET_CONSUMER_LIST_BY_GROUP, 0)
                .with_field("consumerGroup", "G"),
        )
        .await;
    assert_eq!(list.code, response::SYSTEM_ERROR);
}

#[tokio::test]
async fn a_malformed_heartbeat_is_answered_not_dropped() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let r = c
        .ask(RemotingCommand::request(request::HEART_BEAT, 0).with_body(&b"{not json"[..]))
        .await;
    assert_eq!(r.code, response::SYSTEM_ERROR);
    let r = c.ask(heartbeat("C@1", "G", "T", "||")).await;
    assert_ne!(r.code, response::SUCCESS);
    let mut sql = heartbeat("C@1", "G2", "T", "x >");
    sql.body = {
        let mut hb: HeartbeatData = from_json(&sql.body).unwrap();
        hb.consumer_data_set[0].subscription_data_set[0].expression_type = "SQL92".into();
        to_json(&hb).into()
    };
    assert_eq!(c.ask(sql).await.code, response::SUBSCRIPTION_PARSE_FAILED);
}

#[tokio::test]
async fn offsets_lookups_and_stats() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let mut sent = Vec::new();
    for i in 0..3 {
        let r = c
            .ask(send_v1(
                "A",
                0,
                format!("b{i}").as_bytes(),
                &[
                    ("KEYS", &format!("key{i} common")),
                    ("UNIQ_KEY", &format!("UQ{i}")),
                ],
            ))
            .await;
        sent.push(r);
    }
    node.settle().await;
    let off = |code, topic: &str| {
        RemotingCommand::request(code, 0)
            .with_field("topic", topic)
            .with_field("queueId", 0)
    };
    let r = c.ask(off(request::GET_MAX_OFFSET, "A")).await;
    assert_eq!((r.code, field::<u64>(&r, "offset")), (0, 3));
    let r = c.ask(off(request::GET_MIN_OFFSET, "A")).await;
    assert_eq!((r.code, field::<u64>(&r, "offset")), (0, 0));
    let r = c.ask(off(request::GET_MAX_OFFSET, "NoSuch")).await;
    assert_eq!(r.code, response::TOPIC_NOT_EXIST);
    let r = c
        .ask(off(request::SEARCH_OFFSET_BY_TIMESTAMP, "A").with_field("timestamp", 0))
        .await;
    assert_eq!((r.code, field::<u64>(&r, "offset")), (0, 0));
    let r = c
        .ask(off(request::SEARCH_OFFSET_BY_TIMESTAMP, "A").with_field("timestamp", i64::MAX / 2))
        .await;
    assert_eq!(field::<u64>(&r, "offset"), 3);

    // By key, by unique key, by commit-log offset.
    let q = |key: &str| {
        RemotingCommand::request(request::QUERY_MESSAGE, 0)
            .with_field("topic", "A")
            .with_field("key", key)
            .with_field("maxNum", 32)
            .with_field("beginTimestamp", 0)
            .with_field("endTimestamp", i64::MAX)
    };
    let r = c.ask(q("common")).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(ReceivedMessage::decode_all(&r.body).unwrap().len(), 3);
    let r = c.ask(q("key1")).await;
    let found = ReceivedMessage::decode_all(&r.body).unwrap();
    assert_eq!(found[0].body.as_ref(), b"b1");
    let r = c
        .ask(q("UQ2").with_field("_UNIQUE_KEY_QUERY", "true"))
        .await;
    assert_eq!(
        ReceivedMessage::decode_all(&r.body).unwrap()[0]
            .body
            .as_ref(),
        b"b2"
    );
    assert_eq!(c.ask(q("nope")).await.code, response::QUERY_NOT_FOUND);

    let (_, phys) =
        rocketgate_core::store::record::decode_msg_id(sent[1].field("msgId").unwrap()).unwrap();
    let r = c
        .ask(RemotingCommand::request(request::VIEW_MESSAGE_BY_ID, 0).with_field("offset", phys))
        .await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(
        ReceivedMessage::decode_all(&r.body).unwrap()[0]
            .body
            .as_ref(),
        b"b1"
    );
    let r = c
        .ask(
            RemotingCommand::request(request::VIEW_MESSAGE_BY_ID, 0).with_field("offset", phys + 1),
        )
        .await;
    assert_eq!(r.code, response::SYSTEM_ERROR);

    let r = c
        .ask(RemotingCommand::request(request::GET_TOPIC_STATS_INFO, 0).with_field("topic", "A"))
        .await;
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(
        text.contains(
            r#"{"brokerName":"broker-a","queueId":0,"topic":"A"}:{"lastUpdateTimestamp":"#
        ),
        "{text}"
    );
    assert!(text.contains(r#""maxOffset":3,"minOffset":0"#), "{text}");

    let u = RemotingCommand::request(request::UPDATE_CONSUMER_OFFSET, 0)
        .with_field("consumerGroup", "stats")
        .with_field("topic", "A")
        .with_field("queueId", 0)
        .with_field("commitOffset", 2);
    assert_eq!(c.ask(u).await.code, 0);
    let r = c
        .ask(
            RemotingCommand::request(request::GET_CONSUME_STATS, 0)
                .with_field("consumerGroup", "stats")
                .with_field("topic", "A"),
        )
        .await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(
        text.contains(r#""brokerOffset":3,"consumerOffset":2"#),
        "{text}"
    );
}

#[tokio::test]
async fn send_back_stores_a_retry_copy() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let r = c
        .ask(send_v1("R", 0, b"fail me", &[("UNIQ_KEY", "RB1")]))
        .await;
    let (_, phys) =
        rocketgate_core::store::record::decode_msg_id(r.field("msgId").unwrap()).unwrap();
    node.settle().await;
    let back = RemotingCommand::request(request::CONSUMER_SEND_MSG_BACK, 0)
        .with_field("offset", phys)
        .with_field("group", "G")
        .with_field("delayLevel", 1)
        .with_field("originMsgId", "RB1")
        .with_field("originTopic", "R")
        .with_field("maxReconsumeTimes", 16);
    let r = c.ask(back.clone()).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    // Delivered to %RETRY%G after the 1 s level: a long poll waits for it.
    let p = c
        .ask(pull(
            "G",
            "%RETRY%G",
            0,
            0,
            SUB | pull_flag::SUSPEND,
            15_000,
        ))
        .await;
    let p = if p.code == response::SUCCESS {
        p
    } else {
        c.ask(pull(
            "G",
            "%RETRY%G",
            0,
            0,
            SUB | pull_flag::SUSPEND,
            15_000,
        ))
        .await
    };
    assert_eq!(p.code, response::SUCCESS, "{p:?}");
    let m = &ReceivedMessage::decode_all(&p.body).unwrap()[0];
    assert_eq!(m.body.as_ref(), b"fail me");
    assert_eq!(m.reconsume_times, 1);
    assert_eq!(m.origin_topic(), "R");
    // An offset where no message starts.
    let r = c.ask(back.with_field("offset", phys + 3)).await;
    assert_eq!(r.code, response::SYSTEM_ERROR);
}

#[tokio::test]
async fn half_messages_stay_invisible_until_committed() {
    let node = Node::start().await;
    let mut c = node.conn().await;
    let half = |body: &[u8]| {
        send_v1(
            "H",
            0,
            body,
            &[("TRAN_MSG", "true"), ("PGROUP", "tpg"), ("UNIQ_KEY", "TX1")],
        )
        .with_field("sysFlag", 4)
        .with_field("producerGroup", "tpg")
    };
    let r = c.ask(half(b"one")).await;
    assert_eq!(r.code, response::SUCCESS, "{r:?}");
    assert_eq!(r.field("transactionId"), Some("TX1"));
    let (_, phys) =
        rocketgate_core::store::record::decode_msg_id(r.field("msgId").unwrap()).unwrap();
    let half_offset: u64 = field(&r, "queueOffset");
    node.settle().await;
    let p = c.ask(pull("g", "H", 0, 0, SUB, 0)).await;
    assert_eq!(
        p.code,
        response::PULL_NOT_FOUND,
        "a half message is invisible"
    );

    let end = |decision: i32| {
        RemotingCommand::request(request::END_TRANSACTION, 0)
            .with_field("producerGroup", "tpg")
            .with_field("tranStateTableOffset", half_offset)
            .with_field("commitLogOffset", phys)
            .with_field("commitOrRollback", decision)
            .with_field("fromTransactionCheck", false)
            .with_field("msgId", "TX1")
            .with_field("transactionId", "TX1")
    };
    assert_eq!(c.ask(end(5)).await.code, response::SYSTEM_ERROR);
    assert_eq!(
        c.ask(end(0)).await.code,
        response::SUCCESS,
        "unknown: left for a check"
    );
    assert_eq!(c.ask(end(8)).await.code, response::SUCCESS);
    let again = c.ask(end(12)).await;
    assert_eq!(again.code, response::SYSTEM_ERROR, "ended twice: {again:?}");
    let p = c
        .ask(pull("g", "H", 0, 0, SUB | pull_flag::SUSPEND, 15_000))
        .await;
    assert_eq!(p.code, response::SUCCESS, "{p:?}");
    let m = &ReceivedMessage::decode_all(&p.body).unwrap()[0];
    assert_eq!(m.body.as_ref(), b"one");
    assert_eq!(m.msg_id, "TX1");
}
