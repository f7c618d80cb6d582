//! Transactions over HTTP: a half message is invisible until committed, and
//! dropped by a rollback.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_half_message_becomes_visible_with_its_msg_id() {
    let node = start().await;
    let a = node.addr;
    publish(a, "pay", "", "warm-up").await;
    let warm = receive_n(a, "g", "pay", 1).await;
    ack(a, "g", &[warm[0]["receipt_handle"].as_str().unwrap()]).await;

    let half = publish(
        a,
        "pay",
        "?transaction=begin&producer_group=pg&tag=t&keys=k1",
        [0u8, 1].to_vec(),
    )
    .await;
    let id = half["transaction_id"].as_str().unwrap().to_owned();
    assert_eq!(half["topic"], "pay");
    assert!(half.get("queue_offset").is_none(), "{half}");
    // Invisible: not received, not found by id.
    assert!(receive(a, "g", "pay", "?wait_ms=300").await.is_empty());
    get(
        a,
        &format!("/v1/messages/{}", half["msg_id"].as_str().unwrap()),
    )
    .await
    .expect_error(404, "message_not_found");

    let r = call(a, "POST", &format!("/v1/transactions/{id}/commit"), &[], "").await;
    assert_eq!(r.status, 200, "{}", r.json());
    let done = r.json();
    assert_eq!(done["status"], "committed");
    assert_eq!(done["topic"], "pay");
    assert_eq!(done["queue_id"], half["queue_id"]);
    let got = receive_n(a, "g", "pay", 1).await;
    assert_eq!(got[0]["msg_id"], half["msg_id"]);
    assert_eq!(body_of(&got[0]), [0, 1]);
    assert_eq!(got[0]["tag"], "t");
    assert_eq!(got[0]["queue_offset"], done["queue_offset"]);
    // Ending it again is a conflict.
    call(a, "POST", &format!("/v1/transactions/{id}/commit"), &[], "")
        .await
        .expect_error(409, "transaction_ended");
    call(
        a,
        "POST",
        &format!("/v1/transactions/{id}/rollback"),
        &[],
        "",
    )
    .await
    .expect_error(409, "transaction_ended");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_half_message_is_never_delivered() {
    let node = start().await;
    let a = node.addr;
    publish(a, "pay", "", "warm-up").await;
    let warm = receive_n(a, "g", "pay", 1).await;
    ack(a, "g", &[warm[0]["receipt_handle"].as_str().unwrap()]).await;
    let half = publish(a, "pay", "?transaction=begin&producer_group=pg", "no").await;
    let id = half["transaction_id"].as_str().unwrap();
    let r = call(
        a,
        "POST",
        &format!("/v1/transactions/{id}/rollback"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "rolled_back");
    // A later message arrives; the rolled-back one never does.
    publish(a, "pay", "", "yes").await;
    let got = receive_n(a, "g", "pay", 1).await;
    assert_eq!(body_of(&got[0]), b"yes");
    assert!(receive(a, "g", "pay", "?wait_ms=300").await.is_empty());
    // Errors.
    call(a, "POST", "/v1/transactions/abc/commit", &[], "")
        .await
        .expect_error(400, "invalid_argument");
    call(a, "POST", "/v1/transactions/0-999/commit", &[], "")
        .await
        .expect_error(404, "transaction_not_found");
    call(
        a,
        "POST",
        "/v1/topics/pay/messages?transaction=begin",
        &[],
        "x",
    )
    .await
    .expect_error(400, "bad_request");
    call(
        a,
        "POST",
        "/v1/topics/pay/messages?transaction=begin&producer_group=pg&delay=5s",
        &[],
        "x",
    )
    .await
    .expect_error(400, "invalid_message");
    node.stop().await;
}
