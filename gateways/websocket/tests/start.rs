//! Where a new group starts on `/v1/ws`: at the oldest stored message unless the
//! subscribe says `latest` or a time (ms since the epoch), as on every door.

mod support;

use serde_json::json;
use support::{Env, bodies};

#[tokio::test]
async fn a_new_group_starts_at_earliest_unless_the_subscribe_says_otherwise() {
    let env = Env::start().await;
    env.topic("log", 1).await;
    let mut p = env.client().await;
    p.publish("log", "old").await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let cut = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    p.publish("log", "mid").await;

    let mut plain = env.client().await;
    plain
        .subscribe(json!({"id": "s", "topic": "log", "group": "plain", "credit": 10}))
        .await;
    assert_eq!(bodies(&plain.messages(2).await), ["old", "mid"]);

    let mut since = env.client().await;
    since
        .subscribe(json!({"id": "s", "topic": "log", "group": "since", "credit": 10, "start": cut}))
        .await;
    assert_eq!(bodies(&since.messages(1).await), ["mid"]);

    let mut tail = env.client().await;
    tail.subscribe(
        json!({"id": "s", "topic": "log", "group": "tail", "credit": 10, "start": "latest"}),
    )
    .await;
    p.publish("log", "new").await;
    assert_eq!(bodies(&tail.messages(1).await), ["new"]);
    assert!(tail.barrier().await.is_empty(), "nothing older");
}
