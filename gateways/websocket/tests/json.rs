//! `/v1/ws` over a real socket against a real broker: subscribe, credits, acks,
//! resume, publish, and bad input.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;

use futures_util::SinkExt;
use rocketgate_core::broker::MessagingApi;
use rocketgate_core::broker::QueueChoice;
use rocketgate_core::store::Message as CoreMessage;
use rocketgate_websocket::{AuthAttempt, AuthDecision, Hooks, Settings};
use serde_json::json;
use support::{Client, Env, bodies};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn broadcasting_subscriber_gets_what_is_published_within_its_credit() {
    let env = Env::start().await;
    env.topic("orders", 1).await;
    let mut c = env.client().await;
    c.subscribe(
        json!({"id": "s1", "topic": "orders", "group": "web", "mode": "broadcasting", "credit": 2}),
    )
    .await;
    for i in 0..5 {
        let sent = c.publish("orders", &format!("m{i}")).await;
        assert_eq!(sent["topic"], "orders");
        assert_eq!(sent["queue_offset"], i);
    }
    let first = c.messages(2).await;
    assert_eq!(bodies(&first), ["m0", "m1"]);
    // Out of credit: the pong comes before any further message.
    let between = c.barrier().await;
    assert!(
        between.iter().all(|f| f["type"] != "message"),
        "{between:?}"
    );
    c.send(json!({"op": "credit", "id": "s1", "n": 3})).await;
    let rest = c.messages(3).await;
    assert_eq!(bodies(&rest), ["m2", "m3", "m4"]);
    let m = &rest[0];
    assert_eq!(
        (
            m["subscription"].as_str(),
            m["topic"].as_str(),
            m["attempt"].as_u64()
        ),
        (Some("s1"), Some("orders"), Some(1))
    );
    assert!(m["msg_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(m["receipt"].as_str().is_some());
}

#[tokio::test]
async fn broadcasting_resumes_at_the_first_unacked_message_after_a_reconnect() {
    let env = Env::start().await;
    env.topic("ledger", 1).await;
    let sub = json!({"id": "tab", "topic": "ledger", "group": "books", "mode": "broadcasting", "start": "earliest", "credit": 10});
    for i in 0..4 {
        let m = CoreMessage::new("ledger", 0, format!("e{i}").into_bytes());
        env.broker.send(m, QueueChoice::RoundRobin).await.unwrap();
    }
    let mut c = env.client().await;
    let answer = c.subscribe(sub.clone()).await;
    assert_eq!(answer["resumed"], false);
    let got = c.messages(4).await;
    assert_eq!(bodies(&got), ["e0", "e1", "e2", "e3"]);
    // e0 and e1 acked up to offset 1, e3 by receipt; e2 never.
    c.send(json!({"op": "ack", "id": "tab", "queue_id": 0, "offset": 1}))
        .await;
    c.send(json!({"op": "ack", "receipt": got[3]["receipt"]}))
        .await;
    assert!(c.barrier().await.is_empty());
    drop(c);

    // A fresh connection, same group and subscription id: resumes at e2.
    let mut again = env.client().await;
    let answer = again.subscribe(sub.clone()).await;
    assert_eq!(answer["resumed"], true);
    let redelivered = again.messages(2).await;
    assert_eq!(bodies(&redelivered), ["e2", "e3"]);
    assert_eq!(redelivered[0]["queue_offset"], 2);
    // And a new message follows.
    again.publish("ledger", "e4").await;
    let next = again.messages(1).await;
    assert_eq!(bodies(&next), ["e4"]);
}

#[tokio::test]
async fn clustering_shares_messages_and_receipts_ack_from_any_connection() {
    let env = Env::start().await;
    env.topic("jobs", 2).await;
    let mut a = env.client().await;
    let mut b = env.client().await;
    a.subscribe(json!({"id": "w", "topic": "jobs", "group": "workers", "credit": 3}))
        .await;
    b.subscribe(json!({"id": "w", "topic": "jobs", "group": "workers", "credit": 100}))
        .await;
    for i in 0..10 {
        a.publish("jobs", &format!("j{i}")).await;
    }
    // `a` holds at most its credit; `b` takes the rest; nothing twice.
    let mut seen = BTreeSet::new();
    let mut from_a = Vec::new();
    let mut from_b = Vec::new();
    while seen.len() < 10 {
        tokio::select! {
            f = a.recv() => { if f["type"] == "message" { assert!(seen.insert(f["body"].as_str().unwrap().to_owned())); from_a.push(f); } }
            f = b.recv() => { if f["type"] == "message" { assert!(seen.insert(f["body"].as_str().unwrap().to_owned())); from_b.push(f); } }
        }
    }
    assert!(from_a.len() <= 3, "a got {} with credit 3", from_a.len());
    // b acks its own, and one of a's receipts: receipts work from any connection.
    for f in &from_b {
        b.send(json!({"op": "ack", "receipt": f["receipt"]})).await;
    }
    for f in &from_a {
        b.send(json!({"op": "ack", "receipt": f["receipt"]})).await;
    }
    let errors: Vec<_> = b
        .barrier()
        .await
        .into_iter()
        .filter(|f| f["type"] == "error")
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test]
async fn clustering_redelivers_nacked_and_abandoned_messages() {
    let env = Env::start().await;
    env.topic("tasks", 1).await;
    let mut a = env.client().await;
    a.subscribe(json!({"id": "s", "topic": "tasks", "group": "g1", "credit": 1}))
        .await;
    a.publish("tasks", "t0").await;
    let first = a.messages(1).await.remove(0);
    assert_eq!(first["attempt"], 1);
    a.send(json!({"op": "nack", "receipt": first["receipt"]}))
        .await;
    a.send(json!({"op": "credit", "id": "s", "n": 1})).await;
    let again = a.messages(1).await.remove(0);
    assert_eq!(
        (again["body"].as_str(), again["attempt"].as_u64()),
        (Some("t0"), Some(2))
    );
    // The connection goes away without acking: the message goes back to the group.
    drop(a);
    let mut b = env.client().await;
    b.subscribe(json!({"id": "s", "topic": "tasks", "group": "g1", "credit": 1}))
        .await;
    let third = b.messages(1).await.remove(0);
    assert_eq!(
        (third["body"].as_str(), third["attempt"].as_u64()),
        (Some("t0"), Some(3))
    );
    b.send(json!({"op": "ack", "receipt": third["receipt"]}))
        .await;
    assert!(b.barrier().await.is_empty());
}

#[tokio::test]
async fn broadcasting_nack_redelivers_with_the_attempt_raised() {
    let env = Env::start().await;
    env.topic("news", 1).await;
    let mut c = env.client().await;
    c.subscribe(json!({"id": "n", "topic": "news", "group": "readers", "mode": "broadcasting", "credit": 5})).await;
    c.publish("news", "x").await;
    let m = c.messages(1).await.remove(0);
    c.send(json!({"op": "nack", "receipt": m["receipt"]})).await;
    let again = c.messages(1).await.remove(0);
    assert_eq!(
        (
            again["body"].as_str(),
            again["attempt"].as_u64(),
            again["queue_offset"].as_u64()
        ),
        (Some("x"), Some(2), Some(0))
    );
    // Acked now: a second ack of the same receipt is stale.
    c.send(json!({"op": "ack", "receipt": again["receipt"]}))
        .await;
    let (err, _) = c
        .call(json!({"op": "ack", "receipt": again["receipt"]}))
        .await;
    assert_eq!(
        (err["type"].as_str(), err["code"].as_str()),
        (Some("error"), Some("stale_receipt"))
    );
}

#[tokio::test]
async fn tag_keys_properties_and_binary_bodies_travel_both_ways() {
    let env = Env::start().await;
    env.topic("sensors", 1).await;
    let mut c = env.client().await;
    c.subscribe(json!({"id": "f", "topic": "sensors", "group": "ui", "mode": "broadcasting", "filter": "room1/temp || room2/temp", "credit": 10})).await;
    let (sent, _) = c
        .call(json!({"op": "publish", "topic": "sensors", "tag": "room9/temp", "body": "skip"}))
        .await;
    assert_eq!(sent["type"], "send_result");
    let (sent, _) = c
        .call(json!({"op": "publish", "topic": "sensors", "tag": "room1/temp", "keys": ["dev-1", "batch-7"],
            "properties": {"unit": "C", "region": "eu"}, "body": "AAEC/w==", "encoding": "base64"}))
        .await;
    assert_eq!(sent["type"], "send_result", "{sent}");
    let m = c.messages(1).await.remove(0);
    assert_eq!(m["tag"], "room1/temp");
    assert_eq!(m["keys"], json!(["dev-1", "batch-7"]));
    assert_eq!(m["properties"], json!({"unit": "C", "region": "eu"}));
    assert_eq!(
        (m["body"].as_str(), m["encoding"].as_str()),
        (Some("AAEC/w=="), Some("base64"))
    );
    assert_eq!(m["msg_id"], sent["msg_id"]);
    // Also in the core, as the mapping says.
    let stored = env
        .broker
        .pull(rocketgate_core::broker::PullRequest {
            group: "check".into(),
            member: String::new(),
            topic: "sensors".into(),
            queue_id: 0,
            offset: 1,
            max_messages: 1,
            filter: rocketgate_core::broker::filter::Filter::all(),
            wait: std::time::Duration::ZERO,
        })
        .await
        .unwrap();
    let view = stored.messages[0].view().unwrap();
    assert_eq!(
        (view.tags(), view.property("unit"), view.body()),
        (Some("room1/temp"), Some("C"), &[0u8, 1, 2, 255][..])
    );
    // Reserved names are refused.
    let (err, _) = c
        .call(
            json!({"op": "publish", "topic": "sensors", "body": "x", "properties": {"DELAY": "3"}}),
        )
        .await;
    assert_eq!(
        (err["type"].as_str(), err["code"].as_str()),
        (Some("error"), Some("bad_request"))
    );
    // SQL92 filters over properties.
    c.subscribe(json!({"id": "q", "topic": "sensors", "group": "ui2", "mode": "broadcasting", "filter_type": "sql92", "filter": "region = 'us'", "credit": 10})).await;
    c.call(
        json!({"op": "publish", "topic": "sensors", "body": "eu", "properties": {"region": "eu"}}),
    )
    .await;
    c.call(
        json!({"op": "publish", "topic": "sensors", "body": "us", "properties": {"region": "us"}}),
    )
    .await;
    let m = c.messages(1).await.remove(0);
    assert_eq!(
        (m["subscription"].as_str(), m["body"].as_str()),
        (Some("q"), Some("us"))
    );
}

#[tokio::test]
async fn bad_input_gets_an_error_frame_and_the_subscription_goes_on() {
    let env = Env::start().await;
    env.topic("t", 1).await;
    let mut c = env.client().await;
    c.subscribe(
        json!({"id": "s", "topic": "t", "group": "g", "mode": "broadcasting", "credit": 10}),
    )
    .await;

    c.ws.send(Message::text("this is not json")).await.unwrap();
    let e = c.recv().await;
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("error"), Some("invalid_json"))
    );
    let (e, _) = c.call(json!({"op": "teleport"})).await;
    assert_eq!(e["code"], "unknown_op");
    let (e, _) = c.call(json!({"op": "publish", "topic": "t"})).await;
    assert_eq!(e["code"], "missing_field");
    assert!(e["message"].as_str().unwrap().contains("body"), "{e}");
    let (e, _) = c.call(json!({"op": "credit", "id": "nope", "n": 1})).await;
    assert_eq!(e["code"], "unknown_subscription");
    let (e, _) = c
        .call(json!({"op": "subscribe", "id": "s2", "topic": "missing", "group": "g2"}))
        .await;
    assert_eq!(e["code"], "topic_not_found");
    let (e, _) = c.call(json!({"op": "subscribe", "id": "s3", "topic": "t", "group": "g3", "filter_type": "sql92", "filter": "a >"})).await;
    assert_eq!(e["code"], "invalid_filter");
    let (e, _) = c.call(json!({"op": "ack", "receipt": "garbage"})).await;
    assert_eq!(e["code"], "invalid_receipt");
    c.ws.send(Message::binary(vec![0xde, 0xad, 0xbe, 0xef]))
        .await
        .unwrap();
    let e = c.recv().await;
    assert_eq!(e["code"], "unsupported_data");
    // A delay is honoured exactly or refused: never delivered at once, never capped.
    let past = rocketgate_core::clock::now_ms() - 60_000;
    let (e, _) = c
        .call(json!({"op": "publish", "topic": "t", "body": "late", "deliver_at": past}))
        .await;
    assert_eq!(e["code"], "bad_request", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("in the past"),
        "{e}"
    );
    let four_days: u64 = 4 * 24 * 3600 * 1000;
    let (e, _) = c
        .call(json!({"op": "publish", "topic": "t", "body": "late", "delay_ms": four_days}))
        .await;
    assert_eq!(e["code"], "bad_request", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the maximum"),
        "{e}"
    );
    assert!(env.broker.delayed("t", 10).await.unwrap().is_empty());

    // The subscription still works (and got neither refused publish).
    c.publish("t", "still here").await;
    assert_eq!(bodies(&c.messages(1).await), ["still here"]);
}

#[tokio::test]
async fn an_oversize_frame_closes_only_that_connection_with_1009() {
    let env = Env::with(
        Settings {
            max_message_size: 1 << 20,
            ..Settings::default()
        },
        Hooks::default(),
    )
    .await;
    env.topic("t", 1).await;
    let mut other = env.client().await;
    other
        .subscribe(
            json!({"id": "s", "topic": "t", "group": "g", "mode": "broadcasting", "credit": 10}),
        )
        .await;

    let mut big = env.client().await;
    let body = "x".repeat(16 << 20);
    let _ = big
        .ws
        .send(Message::text(format!(
            r#"{{"op":"publish","topic":"t","body":"{body}"}}"#
        )))
        .await;
    let closed = big.closed().await;
    assert_eq!(closed.as_ref().map(|c| c.0), Some(1009), "{closed:?}");

    other.publish("t", "unaffected").await;
    assert_eq!(bodies(&other.messages(1).await), ["unaffected"]);
}

#[tokio::test]
async fn the_auth_seam_takes_a_query_or_first_frame_token() {
    let auth = |a: &AuthAttempt<'_>| match a.token {
        Some("s3cret") => AuthDecision::Allow,
        Some(_) => AuthDecision::Deny("wrong token".into()),
        None => AuthDecision::TokenRequired,
    };
    let env = Env::with(
        Settings::default(),
        Hooks {
            auth: Arc::new(auth),
            mqtt: None,
            tls: None,
        },
    )
    .await;
    env.topic("t", 1).await;

    let mut q = Client::connect(&format!("{}?token=s3cret", env.url())).await;
    q.publish("t", "via query").await;

    let mut first = env.client().await;
    let (ok, _) = first.call(json!({"op": "auth", "token": "s3cret"})).await;
    assert_eq!(ok["type"], "authenticated");
    first.publish("t", "via frame").await;

    let refused = tokio_tungstenite::connect_async(format!("{}?token=nope", env.url())).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("expected 401, got {other:?}"),
    }
    let mut skipper = env.client().await;
    skipper.send(json!({"op": "ping"})).await;
    assert_eq!(skipper.closed().await.map(|c| c.0), Some(1008));
}

#[tokio::test]
async fn plain_http_unknown_paths_and_mqtt_without_handler_get_clear_http_errors() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = Env::start().await;
    for (request, status) in [
        ("GET /v1/ws HTTP/1.1\r\nHost: x\r\n\r\n", "426"),
        (
            "GET /elsewhere HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            "404",
        ),
        (
            "GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            "501",
        ),
    ] {
        let mut s = tokio::net::TcpStream::connect(env.addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tokio::time::timeout(support::WAIT, s.read_to_string(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        assert!(answer.contains("\"error\""), "{answer}");
    }
}

#[tokio::test]
async fn stopping_the_server_closes_clients_with_going_away() {
    let mut env = Env::start().await;
    env.topic("t", 1).await;
    let mut c = env.client().await;
    c.subscribe(
        json!({"id": "s", "topic": "t", "group": "g", "mode": "broadcasting", "credit": 1}),
    )
    .await;
    env.stop().await;
    assert_eq!(c.closed().await.map(|c| c.0), Some(1001));
}

#[tokio::test]
async fn a_client_that_stops_reading_does_not_drain_the_backlog() {
    let settings = Settings {
        outbound_buffer: 64 << 10,
        max_unacked: 100_000,
        fetch_batch: 64,
        ..Settings::default()
    };
    let env = Env::with(settings, Hooks::default()).await;
    env.topic("bulk", 4).await;
    // `slow` asks for everything, then never reads its socket again.
    let mut slow = env.client().await;
    slow.subscribe(json!({"id": "s", "topic": "bulk", "group": "shared", "credit": 1_000_000}))
        .await;
    let total = 20_000usize;
    let body = "x".repeat(2048);
    for chunk in 0..(total / 100) {
        let batch: Vec<CoreMessage> = (0..100)
            .map(|i| {
                CoreMessage::new(
                    "bulk",
                    0,
                    format!("{:06}{body}", chunk * 100 + i).into_bytes(),
                )
            })
            .collect();
        env.broker
            .send_batch(batch, QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    // Whatever `slow` holds is bounded by its buffer (64 KiB) and the kernel's socket
    // buffers; the rest of the 40 MB backlog stayed in the log for `fast`.
    let mut fast = env.client().await;
    fast.subscribe(json!({"id": "f", "topic": "bulk", "group": "shared", "credit": 1_000_000}))
        .await;
    let mut seen = BTreeSet::new();
    while seen.len() < total / 2 {
        let f = fast.recv().await;
        assert_eq!(f["type"], "message", "{f}");
        seen.insert(f["body"].as_str().unwrap()[..6].to_owned());
        fast.send(json!({"op": "ack", "receipt": f["receipt"]}))
            .await;
    }
    drop(slow);
}

#[tokio::test]
async fn unsubscribing_while_the_outbound_buffer_is_full_does_not_hang() {
    let settings = Settings {
        outbound_buffer: 16 << 10,
        ..Settings::default()
    };
    let env = Env::with(settings, Hooks::default()).await;
    env.topic("full", 1).await;
    let body = "y".repeat(4096);
    for _ in 0..20 {
        let batch: Vec<CoreMessage> = (0..100)
            .map(|_| CoreMessage::new("full", 0, body.clone().into_bytes()))
            .collect();
        env.broker
            .send_batch(batch, QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    let mut c = env.client().await;
    c.subscribe(json!({"id": "s", "topic": "full", "group": "g", "mode": "broadcasting", "start": "earliest", "credit": 100_000})).await;
    // Unsubscribe while the subscription is (very likely) waiting for buffer room.
    c.send(json!({"op": "unsubscribe", "id": "s", "req": "u"}))
        .await;
    loop {
        let f = c.recv().await;
        if f["req"] == "u" {
            assert_eq!(f["type"], "unsubscribed");
            break;
        }
        assert_eq!(f["type"], "message", "{f}");
    }
    // The connection still answers.
    assert!(c.barrier().await.is_empty());
}

#[tokio::test]
async fn a_text_frame_that_is_not_utf8_closes_with_1007() {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let env = Env::start().await;
    let mut c = env.client().await;
    let frame = Frame::message(vec![0xff, 0xfe, 0x7b], OpCode::Data(Data::Text), true);
    c.ws.send(Message::Frame(frame)).await.unwrap();
    assert_eq!(c.closed().await.map(|c| c.0), Some(1007));
    // Others are unaffected.
    let mut other = env.client().await;
    assert!(other.barrier().await.is_empty());
}
