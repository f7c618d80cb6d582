//! The admin API: topics, groups and lag, offset resets, dead letters, lookups,
//! broker and cluster info, health, metrics and the OpenAPI document.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rocketgate_core::broker::{BrokerSettings, TopicKind};
use rocketgate_namesrv::{NameServer, NamesrvSettings};
use rocketgate_remoting::protocol::WireTopicConfig as WireTopic;
use rocketgate_remoting::{BrokerIdentity, Registrar};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_listed_described_changed_and_deleted() {
    let node = start().await;
    let a = node.addr;
    let r = post_json(a, "/v1/topics", json!({ "name": "orders", "queues": 3 })).await;
    assert_eq!(r.status, 201, "{}", r.json());
    assert_eq!(
        r.json(),
        json!({ "name": "orders", "read_queues": 3, "write_queues": 3, "perm": "rw", "system": false })
    );
    post_json(a, "/v1/topics", json!({ "name": "orders" }))
        .await
        .expect_error(409, "topic_exists");
    post_json(a, "/v1/topics", json!({ "name": "bad name" }))
        .await
        .expect_error(400, "bad_request");
    post_json(a, "/v1/topics", json!({ "name": "zero", "queues": 0 }))
        .await
        .expect_error(400, "invalid_argument");
    publish(a, "orders", "?queue=2", "x").await;
    publish(a, "orders", "?queue=2", "y").await;
    // Queue stats count what the dispatcher indexed.
    assert!(node.store.wait_dispatched(Duration::from_secs(10)));
    let list = get(a, "/v1/topics").await.json();
    let names: Vec<&str> = list["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders"]);
    let d = get(a, "/v1/topics/orders").await.json();
    assert_eq!(d["queues"].as_array().unwrap().len(), 3);
    assert_eq!(d["queues"][2]["min_offset"], 0);
    assert_eq!(d["queues"][2]["max_offset"], 2);
    assert!(d["queues"][2]["last_store_ms"].as_i64().unwrap() > 0);
    assert_eq!(d["queues"][0]["max_offset"], 0);
    let r = patch_json(
        a,
        "/v1/topics/orders",
        json!({ "write_queues": 1, "perm": "r" }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["write_queues"], 1);
    assert_eq!(r.json()["perm"], "r");
    // Read-only now: publishing is refused.
    call(a, "POST", "/v1/topics/orders/messages", &[], "z")
        .await
        .expect_error(403, "no_permission");
    let r = call(a, "DELETE", "/v1/topics/orders", &[], "").await;
    assert_eq!(r.status, 204);
    get(a, "/v1/topics/orders")
        .await
        .expect_error(404, "topic_not_found");
    call(a, "DELETE", "/v1/topics/orders", &[], "")
        .await
        .expect_error(404, "topic_not_found");
    assert!(node.broker.topic_snapshot(TopicKind::User).is_empty());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_show_progress_and_lag() {
    let node = start().await;
    let a = node.addr;
    post_json(a, "/v1/topics", json!({ "name": "t", "queues": 1 })).await;
    for i in 0..3 {
        publish(a, "t", "", format!("m{i}")).await;
    }
    assert!(node.store.wait_dispatched(Duration::from_secs(10)));
    let got = receive(a, "g", "t", "?wait_ms=10000&max=1").await;
    assert_eq!(
        ack(a, "g", &[got[0]["receipt_handle"].as_str().unwrap()])
            .await
            .status,
        200
    );
    let groups = get(a, "/v1/groups").await.json();
    assert!(
        groups["groups"].as_array().unwrap().contains(&json!("g")),
        "{groups}"
    );
    let g = get(a, "/v1/groups/g").await.json();
    assert_eq!(g["group"], "g");
    let p = &g["progress"][0];
    assert_eq!(p["topic"], "t");
    assert_eq!(p["committed"], 1);
    assert_eq!(p["max_offset"], 3);
    assert_eq!(p["lag"], 2);
    assert_eq!(g["lag"], 2);
    get(a, "/v1/groups/nobody")
        .await
        .expect_error(404, "group_not_found");
    // Lag is in the metrics too.
    let m = String::from_utf8(get(a, "/metrics").await.body.to_vec()).unwrap();
    assert!(
        m.lines().any(|l| l.starts_with("rocketgate_consumer_lag{")
            && l.contains("group=\"g\"")
            && l.ends_with(" 2")),
        "{m}"
    );
    node.stop().await;
}

/// `DELETE /v1/groups/{group}`: refused while the group has consumers, then
/// forced; its settings, offsets, POP state and retry topic go (the DLQ only on
/// request), and a consumer of that name afterwards starts as a new group does:
/// at the earliest message, not at the old offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_group_is_gone_and_starts_again_by_the_start_rule() {
    use rocketgate_core::broker::{MessagingApi, QueueChoice};
    use rocketgate_core::store::Message;
    let node = start().await;
    let a = node.addr;
    post_json(a, "/v1/topics", json!({ "name": "t", "queues": 1 })).await;
    for i in 0..3 {
        publish(a, "t", "", format!("m{i}")).await;
    }
    assert!(node.store.wait_dispatched(Duration::from_secs(10)));
    let got = receive_n(a, "g", "t", 3).await;
    let handles: Vec<&str> = got
        .iter()
        .map(|m| m["receipt_handle"].as_str().unwrap())
        .collect();
    assert_eq!(ack(a, "g", &handles).await.status, 200);
    patch_json(a, "/v1/groups/g", json!({ "max_reconsume_times": 2 }))
        .await
        .json();
    // The group's retry and dead-letter topics (a native consumer's send-back
    // makes them; here the broker does directly).
    for t in ["%RETRY%g", "%DLQ%g"] {
        node.broker
            .send(Message::new(t, 0, "x"), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    // Nothing more to receive: the group is at the end.
    assert!(receive(a, "g", "t", "?wait_ms=0").await.is_empty());

    let del = |q: &'static str| async move {
        call(a, "DELETE", &format!("/v1/groups/g{q}"), &[], Bytes::new()).await
    };
    // The HTTP consumer was seen just now: in use.
    let e = del("").await.expect_error(409, "group_in_use");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("http"),
        "{e}"
    );
    call(a, "DELETE", "/v1/groups/nobody", &[], Bytes::new())
        .await
        .expect_error(404, "group_not_found");
    call(a, "DELETE", "/v1/groups/bad%20name", &[], Bytes::new())
        .await
        .expect_error(400, "invalid_name");
    let d = del("?force=true").await.json();
    assert_eq!(d["group"], "g");
    assert_eq!(d["offsets"], 1, "{d}");
    assert_eq!(d["topics"], json!(["%RETRY%g"]), "{d}");
    assert!(d["consumers"].as_u64().unwrap() >= 1, "{d}");
    get(a, "/v1/groups/g")
        .await
        .expect_error(404, "group_not_found");
    let groups = get(a, "/v1/groups").await.json();
    assert!(
        !groups["groups"].as_array().unwrap().contains(&json!("g")),
        "{groups}"
    );
    let topics: Vec<String> = node
        .broker
        .topic_snapshot(TopicKind::All)
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(!topics.contains(&"%RETRY%g".to_owned()), "{topics:?}");
    assert!(topics.contains(&"%DLQ%g".to_owned()), "kept: {topics:?}");
    // A new consumer of that name starts at the earliest message.
    let again = receive_n(a, "g", "t", 3).await;
    let bodies: BTreeSet<Vec<u8>> = again.iter().map(body_of).collect();
    assert_eq!(bodies.len(), 3, "{again:?}");
    let handles: Vec<&str> = again
        .iter()
        .map(|m| m["receipt_handle"].as_str().unwrap())
        .collect();
    assert_eq!(ack(a, "g", &handles).await.status, 200);
    // Its settings went too: the broker's default retry limit again.
    let g = get(a, "/v1/groups/g").await.json();
    assert_ne!(g["max_reconsume_times"], 2, "{g}");
    // The dead letters go only when asked.
    let d = del("?force=true&dlq=true").await.json();
    assert_eq!(d["topics"], json!(["%DLQ%g"]), "{d}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_reset_to_a_timestamp_redeliver_from_there() {
    let node = start().await;
    let a = node.addr;
    post_json(a, "/v1/topics", json!({ "name": "hist", "queues": 1 })).await;
    for i in 0..6 {
        publish(a, "hist", "", format!("m{i}")).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = receive_n(a, "g", "hist", 6).await;
    for m in &all {
        ack(a, "g", &[m["receipt_handle"].as_str().unwrap()]).await;
    }
    assert!(receive(a, "g", "hist", "").await.is_empty());
    let ts = all[3]["store_timestamp"].as_i64().unwrap();
    let expected: BTreeSet<Vec<u8>> = all
        .iter()
        .filter(|m| m["store_timestamp"].as_i64().unwrap() >= ts)
        .map(body_of)
        .collect();
    let r = post_json(
        a,
        "/v1/groups/g/offsets/reset",
        json!({ "topic": "hist", "to": "timestamp", "timestamp_ms": ts }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json());
    let first = expected.len() as u64;
    assert_eq!(
        r.json()["offsets"],
        json!([{ "queue_id": 0, "offset": 6 - first }])
    );
    let again = receive_n(a, "g", "hist", expected.len()).await;
    assert_eq!(again.iter().map(body_of).collect::<BTreeSet<_>>(), expected);
    // Earliest: everything again; latest: nothing.
    post_json(
        a,
        "/v1/groups/g/offsets/reset",
        json!({ "topic": "hist", "to": "earliest" }),
    )
    .await;
    assert_eq!(receive_n(a, "g", "hist", 6).await.len(), 6);
    post_json(
        a,
        "/v1/groups/g/offsets/reset",
        json!({ "topic": "hist", "to": "latest" }),
    )
    .await;
    assert!(receive(a, "g", "hist", "").await.is_empty());
    post_json(
        a,
        "/v1/groups/g/offsets/reset",
        json!({ "topic": "hist", "to": "timestamp" }),
    )
    .await
    .expect_error(400, "bad_request");
    post_json(
        a,
        "/v1/groups/g/offsets/reset",
        json!({ "topic": "nope", "to": "latest" }),
    )
    .await
    .expect_error(404, "topic_not_found");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_and_resent() {
    let opts = BrokerSettings {
        max_reconsume_times: 1,
        ..broker_options()
    };
    let node = start_with(settings(), opts).await;
    let a = node.addr;
    publish(a, "work", "?tag=job", "poison").await;
    // Delivered twice (max_reconsume_times 1), nacked each time: then dead-lettered.
    for attempt in 1..=2 {
        let got = receive_n(a, "g", "work", 1).await;
        assert_eq!(got[0]["delivery_attempt"], attempt);
        let r = post_json(
            a,
            "/v1/groups/g/nacks",
            json!({ "receipt_handle": got[0]["receipt_handle"] }),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    // The next receive moves it to the DLQ instead of delivering it.
    assert!(receive(a, "g", "work", "?wait_ms=500").await.is_empty());
    let dlq = get(a, "/v1/groups/g/dlq?wait_ms=10000").await.json();
    let letters = dlq["messages"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{dlq}");
    assert_eq!(body_of(&letters[0]), b"poison");
    assert_eq!(letters[0]["topic"], "%DLQ%g");
    let offset = letters[0]["queue_offset"].as_u64().unwrap();
    let r = post_json(a, "/v1/groups/g/dlq/resend", json!({ "offset": offset })).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["resent"][0]["topic"], "work");
    let back = receive_n(a, "g", "work", 1).await;
    assert_eq!(body_of(&back[0]), b"poison");
    assert_eq!(back[0]["tag"], "job");
    assert_eq!(back[0]["delivery_attempt"], 1);
    post_json(a, "/v1/groups/g/dlq/resend", json!({ "offset": 99 }))
        .await
        .expect_error(404, "message_not_found");
    post_json(a, "/v1/groups/other/dlq/resend", json!({ "all": true }))
        .await
        .expect_error(404, "message_not_found");
    let none = get(a, "/v1/groups/other/dlq").await.json();
    assert_eq!(none["messages"], json!([]));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_s_own_retry_limit_is_set_over_http_and_decides_the_dlq() {
    // The broker default is 16 retries; the group asks for 2 (three deliveries).
    let node = start().await;
    let a = node.addr;
    let r = patch_json(a, "/v1/groups/g3", json!({ "max_reconsume_times": 2 })).await;
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["max_reconsume_times"], 2);
    assert_eq!(
        get(a, "/v1/groups/g3").await.json()["max_reconsume_times"],
        2
    );
    publish(a, "work3", "", "poison").await;
    for attempt in 1..=3 {
        let got = receive_n(a, "g3", "work3", 1).await;
        assert_eq!(got[0]["delivery_attempt"], attempt);
        let nack = json!({ "receipt_handle": got[0]["receipt_handle"] });
        assert_eq!(post_json(a, "/v1/groups/g3/nacks", nack).await.status, 200);
    }
    assert!(receive(a, "g3", "work3", "?wait_ms=500").await.is_empty());
    let dlq = get(a, "/v1/groups/g3/dlq?wait_ms=10000").await.json();
    assert_eq!(dlq["messages"].as_array().unwrap().len(), 1, "{dlq}");
    // Back to the broker's default with null; bad values are 400s naming the field.
    let r = patch_json(a, "/v1/groups/g3", json!({ "max_reconsume_times": null })).await;
    assert_eq!(r.json()["max_reconsume_times"], 16);
    patch_json(a, "/v1/groups/g3", json!({ "max_reconsume_times": -1 }))
        .await
        .expect_error(400, "bad_request");
    patch_json(a, "/v1/groups/g3", json!({ "max_reconsume_times": 100000 }))
        .await
        .expect_error(400, "bad_request");
    patch_json(a, "/v1/groups/g3", json!({ "retries": 1 }))
        .await
        .expect_error(400, "bad_request");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_found_by_id_key_and_time() {
    let node = start().await;
    let a = node.addr;
    let p = publish(
        a,
        "shop",
        "?keys=order-7,cust-1&tag=paid",
        [1u8, 2, 3].to_vec(),
    )
    .await;
    publish(a, "shop", "?keys=order-8", "other").await;
    // Lookups read the index, which the dispatcher writes just after the append.
    assert!(node.store.wait_dispatched(Duration::from_secs(10)));
    let id = p["msg_id"].as_str().unwrap();
    let r = get(a, &format!("/v1/messages/{id}")).await;
    assert_eq!(r.status, 200, "{}", r.json());
    let m = r.json();
    assert_eq!(m["msg_id"], id);
    assert_eq!(body_of(&m), [1, 2, 3]);
    assert_eq!(m["tag"], "paid");
    let found = get(a, "/v1/topics/shop/messages?key=order-7").await.json();
    let found = found["messages"].as_array().unwrap().clone();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["msg_id"], id);
    let by_time = get(
        a,
        &format!("/v1/topics/shop/messages?begin_ms=0&end_ms={}", i64::MAX),
    )
    .await
    .json();
    assert_eq!(by_time["messages"].as_array().unwrap().len(), 2);
    let missing = format!("{}FF", &id[..id.len() - 2]);
    get(a, &format!("/v1/messages/{missing}"))
        .await
        .expect_error(404, "message_not_found");
    get(a, "/v1/messages/not-an-id")
        .await
        .expect_error(404, "message_not_found");
    get(a, "/v1/topics/shop/messages")
        .await
        .expect_error(400, "bad_request");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_and_cluster_info_come_from_the_broker_and_the_nameserver() {
    let (ns, ns_addr) =
        NameServer::bind("127.0.0.1:0".parse().unwrap(), NamesrvSettings::default())
            .await
            .unwrap();
    let ns = ns.spawn();
    let mut s = settings();
    s.namesrv_addrs = vec!["127.0.0.1:1".into(), ns_addr.to_string()];
    s.broker_name = "broker-x".into();
    s.cluster = "C1".into();
    let node = start_with(s, broker_options()).await;
    let a = node.addr;
    let registrar = Registrar::new(
        BrokerIdentity {
            cluster: "C1".into(),
            name: "broker-x".into(),
            id: 0,
            addr: "127.0.0.1:10911".into(),
            ha_addr: String::new(),
        },
        vec![ns_addr.to_string()],
        Duration::from_secs(30),
        Arc::new(|| vec![WireTopic::new("t".to_string(), 4)]),
    )
    .spawn();
    let b = get(a, "/v1/broker").await.json();
    assert_eq!(b["broker_name"], "broker-x");
    assert_eq!(b["cluster"], "C1");
    assert!(b["store"]["log_written"].is_u64());
    // The first NameServer is down; the second answers once the broker registered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let cluster = loop {
        let r = get(a, "/v1/cluster").await;
        assert_eq!(r.status, 200, "{}", r.json());
        let c = r.json();
        if c["brokers"].as_array().is_some_and(|b| !b.is_empty()) {
            break c;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never registered: {c}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(cluster["namesrv"], ns_addr.to_string());
    assert_eq!(cluster["clusters"]["C1"], json!(["broker-x"]));
    assert_eq!(cluster["brokers"][0]["addrs"]["0"], "127.0.0.1:10911");
    registrar.stop().await;
    ns.stop().await;
    // No NameServer answers: a 502 with the reasons.
    get(a, "/v1/cluster")
        .await
        .expect_error(502, "namesrv_unavailable");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_the_openapi_document() {
    let node = start().await;
    let a = node.addr;
    let h = get(a, "/health").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["ready"], true);
    assert_eq!(get(a, "/health/ready").await.status, 200);
    publish(a, "m", "", "hello").await;
    receive_n(a, "g", "m", 1).await;
    let r = get(a, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    for needle in [
        "rocketgate_http_requests_total{",
        "route=\"/v1/topics/{topic}/messages\"",
        "rocketgate_http_request_duration_seconds_bucket{",
        "rocketgate_messages_in_total{",
        "rocketgate_messages_out_total{",
        "rocketgate_bytes_in_total{",
        "rocketgate_publish_duration_seconds_bucket{",
        "rocketgate_receive_duration_seconds_bucket{",
        "rocketgate_store_written_offset ",
        "rocketgate_disk_usage_ratio ",
        "rocketgate_connections{protocol=\"http\"}",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    let doc = get(a, "/v1/openapi.json").await.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/topics/{topic}/messages", "post"),
        ("/v1/topics/{topic}/messages", "get"),
        ("/v1/groups/{group}/topics/{topic}/messages", "get"),
        ("/v1/groups/{group}/acks", "post"),
        ("/v1/groups/{group}/invisibility", "patch"),
        ("/v1/groups/{group}/topics/{topic}/stream", "get"),
        ("/v1/transactions/{id}/commit", "post"),
        ("/metrics", "get"),
    ] {
        assert!(
            paths[path][method]["summary"].is_string(),
            "{path} {method}"
        );
    }
    let publish_params = &paths["/v1/topics/{topic}/messages"]["post"]["parameters"];
    assert!(
        publish_params
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "sharding_key")
    );
    // Disk over the hard limit: not ready, and publishing is refused with 503.
    node.set_disk(95);
    let r = get(a, "/health/ready").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["disk"]["full"], true);
    assert_eq!(get(a, "/health").await.status, 200);
    call(a, "POST", "/v1/topics/m/messages", &[], "x")
        .await
        .expect_error(503, "disk_full");
    node.set_disk(10);
    publish(a, "m", "", "again").await;
    node.stop().await;
}
