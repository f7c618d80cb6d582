//! Three failures → dead-letter queue, visible and re-sendable through the HTTP admin
//! API (issue #9), on every consuming door with a failure signal:
//!
//! - HTTP: `POST /v1/groups/{g}/nacks` after each receive;
//! - WebSocket: `{"op":"nack"}` on a clustering subscription;
//! - native: the push consumer's listener answers `ConsumeResult::Retry` (the client
//!   sends the message back, `CONSUMER_SEND_MSG_BACK`, retry delay level 1 = 1 s).
//!
//! MQTT has no failure signal: a subscriber either acknowledges (PUBACK) or the
//! message is resent when it reconnects, without a count of failures; it is not here.
//!
//! The node runs with `broker.max_reconsume_times = 2` (env
//! `ROCKETGATE_BROKER__MAX_RECONSUME_TIMES`): a message is delivered 1 + 2 times, so
//! the third failure sends it to `%DLQ%<group>`. Each test checks that the message
//! came three times (the first two failures did not dead-letter it), that it is then
//! listed by `GET /v1/groups/{g}/dlq`, and that `POST /v1/groups/{g}/dlq/resend`
//! brings it back to the same consumer, which acks it.

use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use interop_tests::Node;
use interop_tests::doors::{self, Door, Outgoing, curl};
use rocketgate_native::client::{ConsumeFrom, ConsumeResult, PushConsumer, PushConsumerSettings};
use serde_json::{Value, json};

const FAILURES: u32 = 3;

fn node() -> anyhow::Result<Node> {
    Node::start_with_env(&[("ROCKETGATE_BROKER__MAX_RECONSUME_TIMES", "2")])
}

fn get_json(url: &str) -> anyhow::Result<Value> {
    let (status, text) = curl(&[url])?;
    ensure!(status == 200, "GET {url}: HTTP {status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

fn post_json(url: &str, body: &Value) -> anyhow::Result<Value> {
    let (status, text) = curl(&[
        "-H",
        "content-type: application/json",
        "--data-binary",
        &body.to_string(),
        url,
    ])?;
    ensure!(status == 200, "POST {url}: HTTP {status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

/// Waits until the group's DLQ listing shows the message with `body` (calling
/// `poke` between looks: a POP message out of attempts is dead-lettered by the
/// group's next receive); re-sends it through the admin API and returns the entry.
async fn dead_letter_listed_and_resent(
    node: &Node,
    group: &str,
    topic: &str,
    body: &str,
    mut poke: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Value> {
    let base = format!("http://{}", node.addr("http"));
    let url = format!("{base}/v1/groups/{group}/dlq?offset=0&max=10");
    let deadline = Instant::now() + Duration::from_secs(30);
    let entry = loop {
        let v = get_json(&url)?;
        let found = v["messages"]
            .as_array()
            .and_then(|a| a.iter().find(|m| m["body"].as_str() == Some(body)).cloned());
        if let Some(e) = found {
            break e;
        }
        ensure!(
            Instant::now() < deadline,
            "{body:?} not in the DLQ listing of {group} within 30 s: {v}"
        );
        poke()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("dlq {group}: listed {entry}");
    let offset = entry["queue_offset"].as_u64().context("queue_offset")?;
    let resent = post_json(
        &format!("{base}/v1/groups/{group}/dlq/resend"),
        &json!({"offset": offset}),
    )?;
    let back = resent["resent"]
        .as_array()
        .and_then(|a| a.first())
        .with_context(|| format!("nothing re-sent: {resent}"))?;
    ensure!(
        back["topic"].as_str() == Some(topic),
        "re-sent to {back}, not to {topic}"
    );
    Ok(entry)
}

async fn publish(node: &Node, topic: &str, body: &str) -> anyhow::Result<()> {
    doors::create_topic(node, topic, 1).await?;
    let mut m = Outgoing::sample(topic);
    m.body = body.as_bytes().to_vec();
    Door::Http.publish(node, &m).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_nacked_three_times_is_dead_lettered_and_resent() -> anyhow::Result<()> {
    let node = node()?;
    let (topic, group, body) = ("dlq_http", "dlq-http", "doomed via HTTP");
    publish(&node, topic, body).await?;
    let base = format!("http://{}", node.addr("http"));
    let receive = format!(
        "{base}/v1/groups/{group}/topics/{topic}/messages?max=1&wait_ms=10000&invisible_ms=30000"
    );
    let take = || -> anyhow::Result<Value> {
        let v = get_json(&receive)?;
        v["messages"]
            .as_array()
            .and_then(|a| a.first())
            .cloned()
            .context("no message within 10 s")
    };
    for attempt in 1..=FAILURES {
        let m = take()?;
        ensure!(m["body"].as_str() == Some(body), "got {m}");
        ensure!(
            m["delivery_attempt"].as_u64() == Some(u64::from(attempt)),
            "delivery {attempt} says {m}"
        );
        let handle = m["receipt_handle"].as_str().context("receipt_handle")?;
        post_json(
            &format!("{base}/v1/groups/{group}/nacks"),
            &json!({"receipt_handle": handle}),
        )?;
    }
    let poll = format!("{base}/v1/groups/{group}/topics/{topic}/messages?max=1&wait_ms=0");
    let no_fourth_delivery = || -> anyhow::Result<()> {
        let v = get_json(&poll)?;
        ensure!(
            v["messages"].as_array().is_some_and(|a| a.is_empty()),
            "a fourth delivery: {v}"
        );
        Ok(())
    };
    dead_letter_listed_and_resent(&node, group, topic, body, no_fourth_delivery).await?;
    let m = take()?;
    ensure!(m["body"].as_str() == Some(body), "got {m}");
    ensure!(
        m["reconsume_times"].as_u64() == Some(0),
        "the re-sent copy starts over: {m}"
    );
    let handle = m["receipt_handle"].as_str().context("receipt_handle")?;
    post_json(
        &format!("{base}/v1/groups/{group}/acks"),
        &json!({"receipt_handle": handle}),
    )?;
    Ok(())
}

/// The next `message` frame.
async fn ws_message(ws: &mut doors::WsStream) -> anyhow::Result<Value> {
    loop {
        let f = doors::ws_next(ws, Duration::from_secs(30)).await?;
        match f["type"].as_str() {
            Some("message") => return Ok(f),
            Some("error") => bail!("WebSocket error: {f}"),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_nacked_three_times_is_dead_lettered_and_resent() -> anyhow::Result<()> {
    let node = node()?;
    let (topic, group, body) = ("dlq_ws", "dlq-ws", "doomed via WebSocket");
    publish(&node, topic, body).await?;
    let mut ws = doors::ws_connect(&node).await?;
    doors::ws_send(
        &mut ws,
        json!({"op": "subscribe", "req": "s", "id": "d", "topic": topic, "group": group,
               "mode": "clustering", "start": "earliest", "credit": 10}),
    )
    .await?;
    for attempt in 1..=FAILURES {
        let m = ws_message(&mut ws).await?;
        ensure!(m["body"].as_str() == Some(body), "got {m}");
        ensure!(
            m["attempt"].as_u64() == Some(u64::from(attempt)),
            "delivery {attempt} says {m}"
        );
        let receipt = m["receipt"].as_str().context("receipt")?.to_string();
        doors::ws_send(&mut ws, json!({"op": "nack", "receipt": receipt})).await?;
    }
    let entry = dead_letter_listed_and_resent(&node, group, topic, body, || Ok(())).await;
    let m = ws_message(&mut ws).await?;
    entry?;
    ensure!(m["body"].as_str() == Some(body), "got {m}");
    let receipt = m["receipt"].as_str().context("receipt")?.to_string();
    doors::ws_send(&mut ws, json!({"op": "ack", "receipt": receipt})).await?;
    doors::ws_send(&mut ws, json!({"op": "ping"})).await?;
    loop {
        let f = doors::ws_next(&mut ws, Duration::from_secs(30)).await?;
        match f["type"].as_str() {
            Some("pong") => break,
            Some("error") => bail!("the ack of the re-sent copy failed: {f}"),
            _ => {}
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_consume_later_three_times_is_dead_lettered_and_resent() -> anyhow::Result<()> {
    let node = node()?;
    let (topic, group, body) = ("dlq_native", "dlq-native", "doomed via native");
    publish(&node, topic, body).await?;
    let failures = Arc::new(Mutex::new(0u32));
    let (tx, rx) = mpsc::channel();
    let mut options = PushConsumerSettings::new(group)
        .subscribe(topic, "*")
        .consume_from(ConsumeFrom::First);
    options.retry_delay_level = 1;
    let counted = failures.clone();
    let consumer =
        PushConsumer::start_concurrent(doors::native_config(&node), options, move |msgs| {
            let mut failed = counted.lock().unwrap_or_else(|p| p.into_inner());
            for m in msgs {
                let _ = tx.send((m.body.to_vec(), m.reconsume_times, m.topic.clone()));
            }
            if *failed < FAILURES {
                *failed += 1;
                ConsumeResult::Retry
            } else {
                ConsumeResult::Success
            }
        })
        .await?;
    let next = || {
        tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(30)))
            .context("no native delivery in time")
    };
    for attempt in 0..FAILURES {
        let (b, reconsume, t) = next()?;
        ensure!(
            b == body.as_bytes(),
            "got {:?}",
            String::from_utf8_lossy(&b)
        );
        ensure!(
            reconsume == attempt as i32 && t == topic,
            "delivery {} came as reconsume {reconsume} of {t}",
            attempt + 1
        );
    }
    dead_letter_listed_and_resent(&node, group, topic, body, || Ok(())).await?;
    let (b, reconsume, _) = next()?;
    ensure!(b == body.as_bytes() && reconsume == 0, "the re-sent copy");
    consumer.shutdown().await;
    Ok(())
}
