//! A RocketMQ producer's first send to a topic nobody created (issue #31, item 2).
//!
//! A raw remoting client, on rocketgate-remoting's `Link`, does what the published
//! clients (Java's `DefaultMQProducer`, rocketmq-client-rust) do: ask the NameServer
//! for the topic's route, get `TOPIC_NOT_EXIST`, ask for the default topic route
//! `TBW102`, and send to one of its queues with the real topic in the header and
//! `defaultTopic=TBW102`. With `broker.auto_create_topics` on (the default), the route
//! is there, the send creates the topic and the message is read back over HTTP; with
//! it off, there is no `TBW102` route and a send anyway gets `TOPIC_NOT_EXIST` with
//! Java's remark.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use interop_tests::Node;
use interop_tests::doors::curl;
use rocketgate_remoting::client::Link;
use rocketgate_remoting::code::{request, response};
use rocketgate_remoting::codec::RemotingCommand;
use rocketgate_remoting::protocol::{TopicRouteData, field, from_json};
use serde_json::Value;

const CALL: Duration = Duration::from_secs(10);

/// `GET_ROUTEINFO_BY_TOPIC` as a RocketMQ 5 client asks it.
async fn route(namesrv: &Link, topic: &str) -> anyhow::Result<RemotingCommand> {
    let cmd = RemotingCommand::request(request::GET_ROUTEINFO_BY_TOPIC, 0)
        .with_field(field::TOPIC, topic)
        .with_field(field::ACCEPT_STANDARD_JSON_ONLY, true);
    Ok(namesrv.call(cmd, CALL).await?)
}

/// `SEND_MESSAGE_V2` with the one-letter header Java's producer writes.
fn send(topic: &str, queue: u32, body: &str) -> RemotingCommand {
    RemotingCommand::request(request::SEND_MESSAGE_V2, 0)
        .with_field("a", "first-send-pg")
        .with_field("b", topic)
        .with_field("c", "TBW102")
        .with_field("d", 4)
        .with_field("e", queue)
        .with_field("f", 0)
        .with_field("g", 1_700_000_000_000i64)
        .with_field("h", 0)
        .with_field(
            "i",
            "UNIQ_KEY\u{1}AC11000100002A9F0000000000000001\u{2}WAIT\u{1}true\u{2}",
        )
        .with_field("j", 0)
        .with_field("k", false)
        .with_body(body.as_bytes().to_vec())
}

/// What the producer does after `TOPIC_NOT_EXIST`: the route of `TBW102`, retried
/// while the broker's first registration may still be on its way.
async fn default_route(namesrv: &Link) -> anyhow::Result<TopicRouteData> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let r = route(namesrv, "TBW102").await?;
        if r.code == response::SUCCESS {
            return from_json(&r.body).context("TBW102 route body");
        }
        ensure!(
            Instant::now() < until,
            "no TBW102 route: {} {:?}",
            r.code,
            r.remark
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_send_to_a_new_topic_goes_through_the_default_route() -> anyhow::Result<()> {
    let node = Node::start()?;
    let namesrv = Link::connect(&node.addr("namesrv").to_string(), CALL, None).await?;
    let topic = "brand-new-topic";

    let missing = route(&namesrv, topic).await?;
    ensure!(
        missing.code == response::TOPIC_NOT_EXIST,
        "route of a new topic: {} {:?}",
        missing.code,
        missing.remark
    );

    let tbw = default_route(&namesrv).await?;
    let queues = tbw
        .queue_datas
        .first()
        .context("TBW102 has no queue data")?;
    // Writable and inheritable (Java's PERM_INHERIT), the broker's default queue count.
    ensure!(queues.perm == 7, "TBW102 perm {}", queues.perm);
    ensure!(queues.write_queue_nums == 4, "TBW102 queues {queues:?}");
    let broker = tbw
        .broker_datas
        .iter()
        .find(|b| b.broker_name == queues.broker_name)
        .and_then(|b| b.broker_addrs.get(&0))
        .context("TBW102 route names no master")?;

    // The client keeps min(defaultTopicQueueNums = 4, readQueueNums) queues and picks one.
    let link = Link::connect(broker, CALL, None).await?;
    let sent = link.call(send(topic, 1, "hello, new topic"), CALL).await?;
    ensure!(
        sent.code == response::SUCCESS,
        "send: {} {:?}",
        sent.code,
        sent.remark
    );
    ensure!(sent.field("queueId") == Some("1"), "{sent:?}");

    // The topic now has a route of its own, and the message reads back over HTTP.
    let until = Instant::now() + Duration::from_secs(30);
    while route(&namesrv, topic).await?.code != response::SUCCESS {
        ensure!(Instant::now() < until, "the new topic never got a route");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let url = format!(
        "http://{}/v1/groups/first-readers/topics/{topic}/messages?max=1&encoding=base64&wait_ms=10000",
        node.addr("http")
    );
    let (status, text) = curl(&[&url])?;
    ensure!(status == 200, "HTTP receive: {status} {text}");
    let v: Value = serde_json::from_str(&text).with_context(|| text.clone())?;
    let m = v["messages"]
        .get(0)
        .with_context(|| format!("nothing received: {text}"))?;
    let body = B64.decode(m["body"].as_str().context("no body")?)?;
    ensure!(body == b"hello, new topic", "body {body:?}");

    // TBW102 itself is only a route: a send naming it is refused.
    let direct = link.call(send("TBW102", 0, "x"), CALL).await?;
    ensure!(
        direct.code == response::NO_PERMISSION,
        "{} {:?}",
        direct.code,
        direct.remark
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auto_create_there_is_no_default_route_and_a_send_is_refused_clearly()
-> anyhow::Result<()> {
    let node = Node::start_with_env(&[("ROCKETGATE_BROKER__AUTO_CREATE_TOPICS", "false")])?;
    let namesrv = Link::connect(&node.addr("namesrv").to_string(), CALL, None).await?;
    let topic = "never-created";

    // The broker is registered (its cluster is known) before TBW102 is asked for, so
    // a missing route means "not offered", not "not registered yet".
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let info = RemotingCommand::request(request::GET_BROKER_CLUSTER_INFO, 0);
        let r = namesrv.call(info, CALL).await?;
        if r.code == response::SUCCESS && String::from_utf8_lossy(&r.body).contains("brokerAddrs") {
            break;
        }
        if Instant::now() > until {
            bail!("the broker never registered");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for t in [topic, "TBW102"] {
        let r = route(&namesrv, t).await?;
        ensure!(
            r.code == response::TOPIC_NOT_EXIST,
            "route of {t}: {} {:?}",
            r.code,
            r.remark
        );
    }

    // A client that sends anyway (the broker address it knows) is told why.
    let link = Link::connect(&node.addr("native").to_string(), CALL, None).await?;
    let r = link.call(send(topic, 0, "x"), CALL).await?;
    ensure!(
        r.code == response::TOPIC_NOT_EXIST,
        "send: {} {:?}",
        r.code,
        r.remark
    );
    let remark = r.remark.unwrap_or_default();
    ensure!(
        remark.contains("topic[never-created] not exist") && remark.contains("auto_create_topics"),
        "remark {remark:?}"
    );
    let url = format!("http://{}/v1/topics", node.addr("http"));
    let (status, text) = curl(&[&url])?;
    ensure!(status == 200 && !text.contains(topic), "{status} {text}");
    Ok(())
}
