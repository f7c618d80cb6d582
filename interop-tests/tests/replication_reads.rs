//! Native consumers on a slave (issue #27 item 6, docs/replication.md, "Native
//! consumers on a slave"), with a master and a slave as two OS processes and our Rust
//! client: a consumer far behind is moved to the slave by the master's
//! `suggestWhichBrokerId` and sent back by the slave once caught up; while the master
//! is down it reads and commits on the slave (the route still names the master); the
//! positions it committed there reach the master when it returns, also across a
//! restart of the slave in between. Nothing is lost, no message is delivered twice.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::bail;
use interop_tests::doors::{create_topic, curl, native_config};
use interop_tests::{Node, wait_for};
use rocketgate_native::client::{Message, Producer, PullConsumer};
use rocketgate_remoting::body::MessageQueue;
use serde_json::Value;

const SECRET: &str = "group-secret";
const TOPIC: &str = "slow";
const GROUP: &str = "slow-readers";
/// Far behind = more than this much commit log after what a pull read.
const LAG: &str = "256KiB";

fn start(env: &[(&'static str, String)]) -> anyhow::Result<Node> {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Node::start_with_env(&env)
}

fn reads() -> Vec<(&'static str, String)> {
    vec![
        ("ROCKETGATE_HA__SECRET", SECRET.into()),
        ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms".into()),
        ("ROCKETGATE_HA__SLAVE_READ", "true".into()),
        ("ROCKETGATE_HA__SLAVE_READ_LAG_BYTES", LAG.into()),
    ]
}

/// 1 KiB bodies that start with their id.
fn body(id: &str) -> String {
    format!("{id:<1024}")
}

fn id_of(body: &[u8]) -> String {
    String::from_utf8_lossy(body).trim_end().to_string()
}

async fn send_all(producer: &Producer, from: usize, to: usize) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for i in from..to {
        let id = format!("s-{i}");
        producer
            .send(Message::new(TOPIC, body(&id).into_bytes()))
            .await?;
        ids.push(id);
    }
    Ok(ids)
}

fn metrics(node: &Node) -> String {
    curl(&[&format!("http://{}/metrics", node.addr("http"))])
        .map(|r| r.1)
        .unwrap_or_default()
}

/// Messages the native door of `node` handed out for [`TOPIC`].
fn native_out(node: &Node) -> u64 {
    metrics(node)
        .lines()
        .filter(|l| l.starts_with("rocketgate_messages_out_total{"))
        .filter(|l| l.contains("protocol=\"native\"") && l.contains(&format!("topic=\"{TOPIC}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Waits until the slave holds everything the master wrote.
fn wait_replicated(master: &Node) -> anyhow::Result<()> {
    wait_for("the slave to catch up", Duration::from_secs(60), || {
        metrics(master)
            .contains("rocketgate_replication_lag_bytes{slave=\"1\"} 0")
            .then_some(())
    })
}

/// The broker ids `TOPIC`'s route lists for its group, as the NameServer of `node`
/// has them.
async fn routed_ids(node: &Node) -> Vec<u64> {
    use rocketgate_remoting::RemotingCommand;
    use rocketgate_remoting::client::Link;
    use rocketgate_remoting::code::request::GET_ROUTEINFO_BY_TOPIC;
    use rocketgate_remoting::protocol::{TopicRouteData, from_json};
    let ns = node.addr("namesrv").to_string();
    let Ok(link) = Link::connect(&ns, Duration::from_secs(1), None).await else {
        return Vec::new();
    };
    let Ok(r) = link
        .call(
            RemotingCommand::request(GET_ROUTEINFO_BY_TOPIC, 0).with_field("topic", TOPIC),
            Duration::from_secs(1),
        )
        .await
    else {
        return Vec::new();
    };
    from_json::<TopicRouteData>(&r.body)
        .map(|route| {
            route
                .broker_datas
                .iter()
                .flat_map(|b| b.broker_addrs.keys().copied())
                .collect()
        })
        .unwrap_or_default()
}

/// Polls until `n` messages arrived (or fails after a generous deadline); whether any
/// queue was reading from the slave at some point.
async fn poll_n(
    consumer: &PullConsumer,
    queues: &[MessageQueue],
    n: usize,
    got: &mut Vec<String>,
) -> anyhow::Result<bool> {
    let want = got.len() + n;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut on_slave = false;
    while got.len() < want {
        if Instant::now() > deadline {
            bail!("received {} of {want}", got.len());
        }
        let batch = consumer.poll(Duration::from_secs(2)).await?;
        got.extend(batch.iter().map(|m| id_of(&m.body)));
        on_slave |= queues.iter().any(|q| consumer.reading_from(q) != 0);
    }
    Ok(on_slave)
}

/// `GROUP`'s committed offsets over `TOPIC` summed, as `node` has them.
fn committed(node: &Node) -> Option<u64> {
    let url = format!("http://{}/v1/groups/{GROUP}", node.addr("http"));
    let (status, text) = curl(&[&url]).ok()?;
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(
        v["progress"]
            .as_array()?
            .iter()
            .filter(|p| p["topic"] == TOPIC)
            .filter_map(|p| p["committed"].as_u64())
            .sum(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_behind_native_consumer_reads_from_the_slave_and_comes_back() {
    let mut master = start(&reads()).expect("master");
    let mut slave_env = reads();
    slave_env.extend([
        ("ROCKETGATE_BROKER__ID", "1".to_string()),
        ("ROCKETGATE_HA__MASTER", master.addr("ha").to_string()),
        (
            "ROCKETGATE_BROKER__NAMESRV_ADDRS",
            master.addr("namesrv").to_string(),
        ),
    ]);
    let mut slave = start(&slave_env).expect("slave");
    create_topic(&master, TOPIC, 2).await.unwrap();
    let producer = Producer::start(native_config(&master), "slow-producers")
        .await
        .unwrap();
    // ~3 MiB of 1 KiB messages: a consumer from the start is far behind.
    let mut sent = send_all(&producer, 0, 3000).await.unwrap();
    tokio::task::block_in_place(|| wait_replicated(&master)).expect("replicated");
    let deadline = Instant::now() + Duration::from_secs(60);
    while routed_ids(&master).await != [0, 1] {
        assert!(
            Instant::now() < deadline,
            "the route never listed the slave"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let consumer = PullConsumer::start(native_config(&master), GROUP)
        .await
        .unwrap()
        .with_batch_size(32);
    let queues = consumer.queues(TOPIC).await.unwrap();
    consumer.assign(queues.clone(), "*").await.unwrap();
    let mut got = Vec::new();
    let moved = poll_n(&consumer, &queues, 3000, &mut got).await.unwrap();
    assert!(moved, "the master never suggested the slave");
    let slave_out = tokio::task::block_in_place(|| native_out(&slave));
    let master_out = tokio::task::block_in_place(|| native_out(&master));
    assert!(
        slave_out > 0 && master_out > 0,
        "read {slave_out} on the slave, {master_out} on the master"
    );
    // At least once each (a pull answered while another queue's answer was taken
    // is pulled again; the ids below show no message is delivered twice).
    assert!(slave_out + master_out >= 3000, "{slave_out} + {master_out}");
    // Caught up: every queue is back on the master, and new messages come from it.
    for q in &queues {
        assert_eq!(consumer.reading_from(q), 0, "{q:?} still on the slave");
    }
    sent.extend(send_all(&producer, 3000, 3050).await.unwrap());
    poll_n(&consumer, &queues, 50, &mut got).await.unwrap();
    assert_eq!(
        tokio::task::block_in_place(|| native_out(&slave)),
        slave_out,
        "a caught-up consumer reads from the master"
    );
    consumer.commit().await.unwrap();

    // The master goes down (its NameServer with it: the client keeps its route, which
    // still names the master): the consumer reads the rest from the slave and
    // commits there.
    sent.extend(send_all(&producer, 3050, 3350).await.unwrap());
    tokio::task::block_in_place(|| wait_replicated(&master)).expect("replicated");
    master.kill9().expect("kill -9 the master");
    poll_n(&consumer, &queues, 300, &mut got).await.unwrap();
    assert!(
        tokio::task::block_in_place(|| native_out(&slave)) >= slave_out + 300,
        "the rest came from the slave"
    );
    consumer.commit().await.unwrap();
    assert_eq!(
        tokio::task::block_in_place(|| committed(&slave)),
        Some(3350),
        "the positions committed on the slave"
    );

    // The slave restarts before the master is back: it still knows those positions
    // must go back (the marks are in its offsets file).
    slave.stop().expect("stop the slave");
    slave.restart().expect("restart the slave");

    // The master returns: the slave hands it the positions; the consumer goes on
    // there from them.
    master.restart().expect("restart the master");
    tokio::task::block_in_place(|| {
        wait_for(
            "the slave's positions on the master",
            Duration::from_secs(60),
            || (committed(&master) == Some(3350)).then_some(()),
        )
    })
    .unwrap();
    let producer = Producer::start(native_config(&master), "slow-producers-2")
        .await
        .unwrap();
    sent.extend(send_all(&producer, 3350, 3400).await.unwrap());
    poll_n(&consumer, &queues, 50, &mut got).await.unwrap();

    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!(distinct.len(), got.len(), "a message was delivered twice");
    let lost: Vec<&String> = sent.iter().filter(|id| !distinct.contains(id)).collect();
    assert!(lost.is_empty(), "lost {} messages: {lost:?}", lost.len());
    assert_eq!(got.len(), sent.len());
    consumer.shutdown().await;
    producer.shutdown().await;
}
