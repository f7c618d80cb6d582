//! ACL (issue #26): the published client with its ACL hook (`AclClientRPCHook`, the
//! port of Java's) against a `rocketgate standalone` with authentication on.
//!
//! The user `app` has a RocketMQ AccessKey pair and one rule: publish and subscribe on
//! `AclTopic` (and its tags), consuming as `acl_consumers`. With the right secret the
//! client produces and consumes `AclTopic`; with a wrong secret every request it signs
//! is refused (`NO_PERMISSION`, code 16); with the right secret, a send to
//! `AclOtherTopic` (which exists, created by the admin) is refused too.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use interop_tests::Node;
use rocketgate_native::client::{ClientSettings, Producer};
use rocketmq_client_rust::{
    AclClientRPCHook, ClientRuntime, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    DefaultMQProducer, DefaultMQPushConsumer, MQPushConsumer, MessageListenerConcurrently,
    SessionCredentials,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;

const TOPIC: &str = "AclTopic";
const OTHER: &str = "AclOtherTopic";
const GROUP: &str = "acl_consumers";
const AK: &str = "AK_app";
const SK: &str = "app-secret-0123456789";
const MESSAGES: usize = 100;

/// The user store: an admin (AccessKey pair only, to create the topics with our own
/// client) and `app`, allowed on `AclTopic` only.
fn users_toml() -> String {
    format!(
        r#"[[user]]
name = "admin"
roles = ["admin"]
access_keys = [{{ access_key = "AK_admin", secret_key = "admin-secret-0123456789" }}]

[[user]]
name = "app"
access_keys = [{{ access_key = "{AK}", secret_key = "{SK}" }}]
rules = [{{ effect = "allow", actions = ["publish", "subscribe"], topics = ["{TOPIC}/#"], groups = ["{GROUP}"] }}]
"#
    )
}

/// The client's ACL hook (HmacSHA1, its default, as Java's `AclClientRPCHook`).
fn hook(secret: &str) -> AclClientRPCHook {
    AclClientRPCHook::new(SessionCredentials::with_keys(AK, secret))
}

fn producer(
    rt: &Arc<ClientRuntime>,
    namesrv: &str,
    group: &str,
    secret: &str,
) -> DefaultMQProducer {
    DefaultMQProducer::builder(rt.clone())
        .producer_group(group.to_string())
        .name_server_addr(namesrv.to_string())
        .rpc_hook(Arc::new(hook(secret)))
        .build()
}

fn message(topic: &str, i: usize) -> Message {
    Message::builder()
        .topic(topic)
        .tags("TagA")
        .keys(vec![format!("acl-{i}")])
        .body_slice(format!("acl-body-{i}").as_bytes())
        .build_unchecked()
}

pub async fn run(rt: Arc<ClientRuntime>) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let users = dir.path().join("users.toml");
    std::fs::write(&users, users_toml())?;
    let users_s = users.to_string_lossy().to_string();
    let node = tokio::task::block_in_place(|| {
        Node::start_with_env(&[
            ("ROCKETGATE_AUTH__ENABLED", "true"),
            ("ROCKETGATE_AUTH__USERS_FILE", users_s.as_str()),
        ])
    })?;
    let namesrv = node.addr("namesrv").to_string();
    let admin = Producer::start(
        ClientSettings::from_list(&namesrv).with_credentials("AK_admin", "admin-secret-0123456789"),
        "acl_admin",
    )
    .await?;
    admin.create_topic(TOPIC, 4).await?;
    admin.create_topic(OTHER, 4).await?;

    // 1. The right secret: produce and consume AclTopic.
    let mut good = producer(&rt, &namesrv, "acl_producers", SK);
    good.start()
        .await
        .map_err(|e| anyhow::anyhow!("producer start: {e}"))?;
    for i in 0..MESSAGES {
        good.send_with_timeout(message(TOPIC, i), 5000)
            .await
            .map_err(|e| anyhow::anyhow!("send {i} with the right secret: {e}"))?;
    }
    println!("acl: {MESSAGES} sent to {TOPIC} with the right secret");
    let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut consumer = DefaultMQPushConsumer::builder(rt.clone())
        .consumer_group(GROUP.to_string())
        .name_server_addr(namesrv.clone())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        // `as _`: the builder takes `Option<Arc<dyn RPCHook>>`.
        .rpc_hook(Some(Arc::new(hook(SK)) as _))
        .build();
    consumer
        .subscribe(TOPIC, "*")
        .await
        .map_err(|e| anyhow::anyhow!("subscribe: {e}"))?;
    consumer.register_message_listener_concurrently(Collect(seen.clone()));
    consumer
        .start()
        .await
        .map_err(|e| anyhow::anyhow!("consumer start: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.len();
        if n >= MESSAGES {
            break;
        }
        if Instant::now() > deadline {
            consumer.shutdown().await;
            bail!(
                "only {n} of {MESSAGES} consumed with the right secret\nnode log:\n{}",
                node.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    consumer.shutdown().await;
    println!("acl: {MESSAGES} consumed from {TOPIC} as {GROUP} with the right secret");

    // 2. A topic outside the user's rules: refused.
    let other = good.send_with_timeout(message(OTHER, 0), 5000).await;
    let text = match other {
        Ok(r) => bail!("a send to {OTHER}, outside the ACL, was accepted: {r:?}"),
        Err(e) => causes(&e),
    };
    println!("acl: send to {OTHER} (not in the ACL) refused: {text}");
    refused(&text).with_context(|| format!("the refusal of {OTHER}"))?;
    good.shutdown().await;

    // 3. A wrong secret: refused.
    let mut bad = producer(&rt, &namesrv, "acl_bad_producers", "wrong-secret");
    bad.start()
        .await
        .map_err(|e| anyhow::anyhow!("producer start: {e}"))?;
    let wrong = bad.send_with_timeout(message(TOPIC, 0), 5000).await;
    let text = match wrong {
        Ok(r) => bail!("a send with a wrong secret was accepted: {r:?}"),
        Err(e) => causes(&e),
    };
    println!("acl: send with a wrong secret refused: {text}");
    refused(&text).context("the refusal of a wrong secret")?;
    bad.shutdown().await;
    let log = node.log_text();
    let denials = log.matches("signature").count();
    println!("acl: the node logged {denials} signature refusals");
    println!("ACL OK");
    Ok(())
}

/// The error and its sources: the client's own text is generic ("Argument is
/// invalid", its message redacted); the server's answer is further down the chain.
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(" <- ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// The client's error text says NO_PERMISSION (code 16) or the broker's remark.
fn refused(text: &str) -> anyhow::Result<()> {
    let t = text.to_ascii_lowercase();
    if t.contains("no_permission")
        || t.contains("nopermission")
        || t.contains("code: 16")
        || t.contains("code=16")
        || t.contains("(16)")
        || t.contains("not allowed")
        || t.contains("signature")
    {
        Ok(())
    } else {
        bail!("the error does not say NO_PERMISSION: {text}")
    }
}

struct Collect(Arc<Mutex<BTreeSet<String>>>);

impl MessageListenerConcurrently for Collect {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        if let Ok(mut seen) = self.0.lock() {
            for m in msgs {
                if let Some(b) = m.body() {
                    seen.insert(String::from_utf8_lossy(&b).to_string());
                }
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}
