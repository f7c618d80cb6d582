//! The `docs/http.md` examples, run with the real `curl`.

mod support;

use serde_json::Value;
use support::*;

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_receive_ack_with_curl() {
    let node = start().await;
    let base = format!("http://{}", node.addr);
    let file = node.dir.path().join("payload.bin");
    let payload: Vec<u8> = (0..=255u8).chain([0, 0, 0]).collect();
    std::fs::write(&file, &payload).unwrap();

    // curl --data-binary @payload.bin "http://127.0.0.1:8080/v1/topics/orders/messages?tag=created&keys=order-1" -H 'x-rg-prop-region: eu'
    let (status, body) = curl_async(vec![
        "--data-binary".into(),
        format!("@{}", file.display()),
        "-H".into(),
        "x-rg-prop-region: eu".into(),
        format!("{base}/v1/topics/orders/messages?tag=created&keys=order-1"),
    ])
    .await;
    assert_eq!(status, 201);
    let published = json(&body);
    assert_eq!(published["topic"], "orders");

    // curl "http://127.0.0.1:8080/v1/groups/billing/topics/orders/messages?wait_ms=10000"
    let (status, body) = curl_async(vec![format!(
        "{base}/v1/groups/billing/topics/orders/messages?wait_ms=10000"
    )])
    .await;
    assert_eq!(status, 200);
    let got = json(&body)["messages"].as_array().unwrap().clone();
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m["msg_id"], published["msg_id"]);
    assert_eq!(m["body_encoding"], "base64");
    assert_eq!(body_of(m), payload);
    assert_eq!(m["properties"]["region"], "eu");
    assert_eq!(m["keys"], serde_json::json!(["order-1"]));

    // curl -H 'content-type: application/json' -d '{"receipt_handles":["…"]}' http://127.0.0.1:8080/v1/groups/billing/acks
    let ack_body = serde_json::json!({ "receipt_handles": [m["receipt_handle"]] }).to_string();
    let (status, body) = curl_async(vec![
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        ack_body.clone(),
        format!("{base}/v1/groups/billing/acks"),
    ])
    .await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["acked"], 1);
    // Acked twice: 410 with the JSON error.
    let (status, body) = curl_async(vec![
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        ack_body,
        format!("{base}/v1/groups/billing/acks"),
    ])
    .await;
    assert_eq!(status, 410);
    assert_eq!(json(&body)["error"]["code"], "stale_receipt_handle");
    let (status, body) = curl_async(vec![format!(
        "{base}/v1/groups/billing/topics/orders/messages"
    )])
    .await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["messages"], serde_json::json!([]));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_and_batch_with_curl() {
    let node = start().await;
    let base = format!("http://{}", node.addr);
    // curl -H 'content-type: application/json' -d '{"name":"sensors","queues":8}' http://127.0.0.1:8080/v1/topics
    let (status, body) = curl_async(vec![
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        r#"{"name":"sensors","queues":8}"#.into(),
        format!("{base}/v1/topics"),
    ])
    .await;
    assert_eq!(status, 201);
    assert_eq!(json(&body)["write_queues"], 8);
    // curl -H 'content-type: application/json' -d '[{"body":"21.5","tag":"room1/temp"},{"body":"AAE=","body_encoding":"base64"}]' \
    //   http://127.0.0.1:8080/v1/topics/sensors/messages/batch
    let (status, body) = curl_async(vec![
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        r#"[{"body":"21.5","tag":"room1/temp"},{"body":"AAE=","body_encoding":"base64"}]"#.into(),
        format!("{base}/v1/topics/sensors/messages/batch"),
    ])
    .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let sent = json(&body)["messages"].as_array().unwrap().clone();
    assert_eq!(sent.len(), 2);
    let q = sent[0]["queue_id"].as_u64().unwrap();
    // curl "http://127.0.0.1:8080/v1/topics/sensors/queues/0/messages?offset=0&max=10"
    let (status, body) = curl_async(vec![format!(
        "{base}/v1/topics/sensors/queues/{q}/messages?offset=0&max=10&wait_ms=5000"
    )])
    .await;
    assert_eq!(status, 200);
    let page = json(&body);
    assert_eq!(page["messages"][0]["body"], "21.5");
    assert_eq!(page["messages"][0]["tag"], "room1/temp");
    // curl http://127.0.0.1:8080/v1/topics/sensors
    let (status, body) = curl_async(vec![format!("{base}/v1/topics/sensors")]).await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["queues"].as_array().unwrap().len(), 8);
    // curl -i http://127.0.0.1:8080/health ; curl http://127.0.0.1:8080/metrics
    let (status, body) = curl_async(vec![format!("{base}/health")]).await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["ready"], true);
    let (status, body) = curl_async(vec![format!("{base}/metrics")]).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("rocketgate_messages_in_total"));
    // Errors are JSON too: curl -X DELETE http://127.0.0.1:8080/v1/topics/nope
    let (status, body) = curl_async(vec![
        "-X".into(),
        "DELETE".into(),
        format!("{base}/v1/topics/nope"),
    ])
    .await;
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["code"], "topic_not_found");
    node.stop().await;
}
