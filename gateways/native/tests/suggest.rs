//! `suggestWhichBrokerId` in pull answers, over TCP with the crate's codec as a raw
//! client (docs/replication.md, "Native consumers on a slave"): a master names a
//! readable slave to a consumer far behind the end of its commit log and the master
//! otherwise; a slave keeps such a consumer until it is within half the threshold.

mod common;

use std::sync::{Arc, Mutex};

use common::{Node, Options};
use rocketgate_native::ServerSettings;
use rocketgate_native::message::encode_properties;
use rocketgate_native::server::SlaveRead;
use rocketgate_remoting::body::pull_flag;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;

const LAG: u64 = 8 * 1024;

fn send(topic: &str, body: &[u8]) -> RemotingCommand {
    RemotingCommand::request(request::SEND_MESSAGE, 0)
        .with_field("producerGroup", "pg")
        .with_field("topic", topic)
        .with_field("defaultTopic", "TBW102")
        .with_field("defaultTopicQueueNums", 1)
        .with_field("queueId", 0)
        .with_field("sysFlag", 0)
        .with_field("bornTimestamp", 1_700_000_000_000i64)
        .with_field("flag", 0)
        .with_field("properties", encode_properties([]))
        .with_field("reconsumeTimes", 0)
        .with_field("unitMode", false)
        .with_body(body.to_vec())
}

fn pull(offset: u64, max: u32) -> RemotingCommand {
    RemotingCommand::request(request::PULL_MESSAGE, 0)
        .with_field("consumerGroup", "g")
        .with_field("topic", "T")
        .with_field("queueId", 0)
        .with_field("queueOffset", offset)
        .with_field("maxMsgNums", max)
        .with_field("sysFlag", pull_flag::SUBSCRIPTION)
        .with_field("commitOffset", 0)
        .with_field("suspendTimeoutMillis", 0)
        .with_field("subscription", "*")
        .with_field("subVersion", 0)
        .with_field("expressionType", "TAG")
}

/// A door with `slave_read` over a broker holding 100 messages of 1 KiB in `T`.
async fn node(slave_read: SlaveRead) -> Node {
    let node = Node::start_with(Options {
        settings: ServerSettings {
            slave_read,
            ..ServerSettings::default()
        },
        ..Options::default()
    })
    .await;
    let mut c = node.conn().await;
    for _ in 0..100 {
        let r = c.ask(send("T", &[b'x'; 1024])).await;
        assert_eq!(r.code, response::SUCCESS, "{r:?}");
    }
    node.settle().await;
    node
}

/// The suggestion of a pull of `max` messages from `offset` (and its code).
async fn suggested(node: &Node, offset: u64, max: u32) -> (i32, u64) {
    let r = node.conn().await.ask(pull(offset, max)).await;
    let id = r
        .field("suggestWhichBrokerId")
        .unwrap_or_else(|| panic!("no suggestWhichBrokerId in {r:?}"))
        .parse()
        .expect("a broker id");
    (r.code, id)
}

#[tokio::test]
async fn a_master_moves_a_far_behind_consumer_to_an_in_sync_slave() {
    let slaves = Arc::new(Mutex::new(vec![2u64, 1]));
    let readable = slaves.clone();
    let node = node(SlaveRead {
        broker_id: 0,
        enabled: true,
        lag_bytes: LAG,
        readable_slaves: Arc::new(move || readable.lock().unwrap().clone()),
    })
    .await;
    // 32 of 100 read: ~68 KiB behind, more than 8 KiB: the lowest readable slave.
    assert_eq!(suggested(&node, 0, 32).await, (response::SUCCESS, 1));
    // The last 5 (~5 KiB behind after the first of them) and the tail: the master.
    assert_eq!(suggested(&node, 95, 1).await, (response::SUCCESS, 0));
    assert_eq!(suggested(&node, 90, 32).await, (response::SUCCESS, 0));
    assert_eq!(
        suggested(&node, 100, 32).await,
        (response::PULL_NOT_FOUND, 0)
    );
    // No slave in sync: nowhere to move to.
    slaves.lock().unwrap().clear();
    assert_eq!(suggested(&node, 0, 32).await, (response::SUCCESS, 0));
}

#[tokio::test]
async fn a_slave_sends_a_consumer_back_once_it_is_within_half_the_threshold() {
    let node = node(SlaveRead {
        broker_id: 1,
        enabled: true,
        lag_bytes: LAG,
        readable_slaves: Arc::new(Vec::new),
    })
    .await;
    assert_eq!(suggested(&node, 0, 32).await, (response::SUCCESS, 1));
    // 4 records (> 4 KiB) behind: between half the threshold and the threshold,
    // where a master would not have moved it: the slave keeps it.
    assert_eq!(suggested(&node, 95, 1).await, (response::SUCCESS, 1));
    // 2 records (< 4 KiB) behind: back to the master.
    assert_eq!(suggested(&node, 97, 1).await, (response::SUCCESS, 0));
    assert_eq!(
        suggested(&node, 100, 32).await,
        (response::PULL_NOT_FOUND, 0)
    );
}

#[tokio::test]
async fn without_slave_reads_every_answer_names_the_master() {
    let node = node(SlaveRead {
        broker_id: 0,
        enabled: false,
        lag_bytes: LAG,
        readable_slaves: Arc::new(|| vec![1]),
    })
    .await;
    assert_eq!(suggested(&node, 0, 32).await, (response::SUCCESS, 0));
    let slave = self::node(SlaveRead {
        broker_id: 1,
        enabled: false,
        ..SlaveRead::default()
    })
    .await;
    assert_eq!(suggested(&slave, 0, 32).await, (response::SUCCESS, 0));
}
