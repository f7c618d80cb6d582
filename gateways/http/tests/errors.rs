//! Every error path answers its status with `{"error": {"code", "message"}}`,
//! and nothing a client sends produces a 500.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_that_names_the_problem() {
    let node = start().await;
    let a = node.addr;
    publish(a, "t", "", "exists").await;
    let post = |path: &'static str, headers: Vec<(&'static str, &'static str)>| async move {
        call(a, "POST", path, &headers, "body").await
    };
    post("/v1/topics/t/messages?max=1", vec![])
        .await
        .expect_error(400, "bad_request");
    post("/v1/topics/t/messages?queue=abc", vec![])
        .await
        .expect_error(400, "bad_request");
    post("/v1/topics/t/messages?delay=soon", vec![])
        .await
        .expect_error(400, "bad_request");
    post("/v1/topics/t/messages?delay=1s&deliver_at=5", vec![])
        .await
        .expect_error(400, "bad_request");
    post("/v1/topics/t/messages?keys=a%20b", vec![])
        .await
        .expect_error(400, "bad_request");
    post("/v1/topics/t/messages?tag=", vec![])
        .await
        .expect_error(400, "bad_request");
    post("/v1/topics/t/messages?transaction=maybe", vec![])
        .await
        .expect_error(400, "bad_request");
    post("/v1/topics/t/messages?queue=9", vec![])
        .await
        .expect_error(404, "queue_not_found");
    post("/v1/topics/bad%20topic/messages", vec![])
        .await
        .expect_error(400, "invalid_name");
    for reserved in [
        "x-rg-prop-TAGS",
        "x-rg-prop-uniq_key",
        "x-rg-prop-DELAY",
        "x-rg-prop-mqtt.qos",
        "x-rg-prop-__STARTDELIVERTIME",
    ] {
        let v = post("/v1/topics/t/messages", vec![(reserved, "1")])
            .await
            .expect_error(400, "reserved_property");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("reserved"),
            "{v}"
        );
    }
    let r = call(
        a,
        "POST",
        "/v1/topics/t/messages/batch",
        &[("content-type", "application/json")],
        "[{",
    )
    .await;
    r.expect_error(400, "bad_request");
    post_json(a, "/v1/topics/t/messages/batch", json!([]))
        .await
        .expect_error(400, "bad_request");
    post_json(
        a,
        "/v1/topics/t/messages/batch",
        json!([{ "body": "!!", "body_encoding": "base64" }]),
    )
    .await
    .expect_error(400, "bad_request");
    post_json(
        a,
        "/v1/topics/t/messages/batch",
        json!([{ "body": "x", "properties": { "KEYS": "k" } }]),
    )
    .await
    .expect_error(400, "reserved_property");
    post_json(a, "/v1/topics/t/messages/batch", json!([{ "bdy": "x" }]))
        .await
        .expect_error(400, "bad_request");
    // Receive parameters.
    for q in [
        "?max=0",
        "?max=100000",
        "?invisible_ms=1",
        "?filter_type=regex",
        "?filter=%28&filter_type=sql",
        "?wait_ms=-1",
    ] {
        get(a, &format!("/v1/groups/g/topics/t/messages{q}"))
            .await
            .expect_error(400, "bad_request");
    }
    get(a, "/v1/groups/bad%20group/topics/t/messages")
        .await
        .expect_error(400, "invalid_name");
    // Receipt handles.
    post_json(
        a,
        "/v1/groups/g/acks",
        json!({ "receipt_handles": ["garbage"] }),
    )
    .await
    .expect_error(400, "invalid_receipt_handle");
    post_json(a, "/v1/groups/g/acks", json!({ "receipt_handles": [] }))
        .await
        .expect_error(400, "bad_request");
    post_json(
        a,
        "/v1/groups/other/acks",
        json!({ "receipt_handle": "v1:g:t:0:0:0:1:0" }),
    )
    .await
    .expect_error(400, "bad_request");
    patch_json(
        a,
        "/v1/groups/g/invisibility",
        json!({ "receipt_handle": "v1:g:t:0:0:0:1:0" }),
    )
    .await
    .expect_error(400, "bad_request");
    call(
        a,
        "POST",
        "/v1/groups/g/acks",
        &[("content-type", "text/plain")],
        "x",
    )
    .await
    .expect_error(400, "bad_request");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_things_are_404_and_wrong_methods_405() {
    let node = start().await;
    let a = node.addr;
    get(a, "/v1/groups/g/topics/missing/messages")
        .await
        .expect_error(404, "topic_not_found");
    get(a, "/v1/topics/missing")
        .await
        .expect_error(404, "topic_not_found");
    get(a, "/v1/nothing/here")
        .await
        .expect_error(404, "no_route");
    get(a, "/").await.expect_error(404, "no_route");
    call(a, "DELETE", "/v1/groups/g/acks", &[], "")
        .await
        .expect_error(405, "method_not_allowed");
    call(a, "PUT", "/v1/topics/t/messages", &[], "")
        .await
        .expect_error(405, "method_not_allowed");
    // A well-formed handle of a delivery that never happened: stale (410).
    post_json(
        a,
        "/v1/groups/g/acks",
        json!({ "receipt_handle": "v1:g:t:0:0:0:1:0" }),
    )
    .await
    .expect_error(410, "stale_receipt_handle");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_are_413() {
    let node = start().await;
    let a = node.addr;
    let big = vec![b'x'; MAX_BODY + 1];
    call(a, "POST", "/v1/topics/t/messages", &[], big.clone())
        .await
        .expect_error(413, "too_large");
    // Under the HTTP limit but over the store's once encoded with its headers.
    call(
        a,
        "POST",
        "/v1/topics/t/messages",
        &[],
        vec![b'x'; MAX_BODY - 10],
    )
    .await
    .expect_error(413, "too_large");
    let batch = serde_json::to_vec(&json!([{ "body": String::from_utf8(big).unwrap() }])).unwrap();
    call(
        a,
        "POST",
        "/v1/topics/t/messages/batch",
        &[("content-type", "application/json")],
        batch,
    )
    .await
    .expect_error(413, "too_large");
    // The connection limit did not break the server.
    publish(a, "t", "", "small").await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_requests_in_flight_is_429_but_health_still_answers() {
    let mut s = settings();
    s.max_inflight = 1;
    let node = start_with(s, broker_options()).await;
    let a = node.addr;
    publish(a, "t", "", "x").await;
    let first = receive(a, "g", "t", "?wait_ms=10000").await;
    assert_eq!(first.len(), 1);
    // A long poll holds the only permit... (it races the requests below for it: when
    // one of them holds the permit, the poll itself is refused, so it tries again;
    // without that, a refused poll left nobody holding it and nothing was refused)
    let parked = tokio::spawn(async move {
        loop {
            let r = get(a, "/v1/groups/g/topics/t/messages?wait_ms=30000").await;
            if r.status != 429 {
                return r;
            }
        }
    });
    // ...so other requests are refused until it ends (retry until it is parked).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(a, "/v1/topics").await;
        if r.status == 429 {
            let v = r.expect_error(429, "overloaded");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("in flight")
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(a, "/health").await.status, 200);
    assert_eq!(get(a, "/metrics").await.status, 200);
    // The parked poll ends when its message comes (published through another gateway).
    let (other, b) = gateway(&node.broker, &node.store, settings()).await;
    publish(b, "t", "", "wake").await;
    let r = tokio::time::timeout(Duration::from_secs(20), parked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(get(a, "/v1/topics").await.status, 200);
    other.stop().await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_a_client_sends_is_a_500() {
    let node = start().await;
    let a = node.addr;
    publish(a, "t", "", "x").await;
    let paths = [
        "/v1/topics/%00/messages",
        "/v1/topics/%FF%FE/messages",
        "/v1/topics/t/queues/99999999999/messages",
        "/v1/topics/t/queues/-1/messages",
        "/v1/topics/t/queues/0/messages?offset=18446744073709551615&max=1",
        "/v1/messages/%00",
        "/v1/messages/0000000000000000FFFFFFFFFFFFFFFF",
        "/v1/groups/%RETRY%g/topics/t/messages",
        "/v1/groups/g/topics/%25DLQ%25g/messages",
        "/v1/groups/g/topics/t/messages?filter=",
        "/v1/groups/g/topics/t/messages?encoding=hex",
        "/v1/topics/t/messages?key=&max=0",
        "/v1/groups/g/dlq?offset=abc",
        "/v1/topics?kind=weird",
    ];
    for p in paths {
        for method in ["GET", "POST", "PATCH", "DELETE"] {
            let bodies: [&[u8]; 3] = [
                b"",
                b"{\"receipt_handles\":[\"v1:g:t:0:0:0:1:0\"]}",
                b"\xff\xfe",
            ];
            for body in bodies {
                let r = call(
                    a,
                    method,
                    p,
                    &[("content-type", "application/json")],
                    body.to_vec(),
                )
                .await;
                assert!(
                    r.status < 500,
                    "{method} {p}: {} {:?}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
                if r.status >= 400 {
                    assert!(r.json()["error"]["code"].is_string(), "{method} {p}");
                }
            }
        }
    }
    // Publishing to a broker-owned topic is refused, not a server error.
    call(a, "POST", "/v1/topics/%25DLQ%25g/messages", &[], "x")
        .await
        .expect_error(403, "no_permission");
    node.stop().await;
}

/// Found by the schemathesis run (interop-tests/tests/schemathesis.rs): a
/// `deliver_at` far in the past overflowed the "ms in the past" subtraction and
/// panicked the request task (the connection closed without an answer), and a
/// JSON array where an object belongs was read as the object's fields in order
/// (`[null, null]` on `PATCH /v1/groups/g` reset the group's retry limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_numbers_and_arrays_for_objects_are_400() {
    let node = start().await;
    let a = node.addr;
    publish(a, "t", "", "exists").await;
    for (q, code) in [
        ("deliver_at=-9223372036854775808", "bad_request"),
        ("deliver_at=9223372036854775807", "delay_too_long"),
    ] {
        call(a, "POST", &format!("/v1/topics/t/messages?{q}"), &[], "x")
            .await
            .expect_error(400, code);
    }
    let json = [("content-type", "application/json")];
    patch_json(a, "/v1/groups/g", json!({ "max_reconsume_times": 3 }))
        .await
        .json();
    for (method, path, body) in [
        ("PATCH", "/v1/groups/g", "[null, null]"),
        ("PATCH", "/v1/topics/t", "[null, null]"),
        ("POST", "/v1/topics", "[\"x\"]"),
        ("POST", "/v1/groups/g/acks", "[[\"h\"]]"),
        ("POST", "/v1/topics/t/messages/batch", "{\"body\":\"x\"}"),
    ] {
        call(a, method, path, &json, body)
            .await
            .expect_error(400, "bad_request");
    }
    let g = get(a, "/v1/groups/g").await.json();
    assert_eq!(g["max_reconsume_times"], 3, "{g}");
    node.stop().await;
}
