//! Issue #30: an MQTT topic whose first level is no core topic name is one topic
//! for every door. `/devices/42/temp` is core topic `%MQTT%` (the escaped empty
//! first level) with tag `devices/42/temp`: `curl` reads it at
//! `/v1/groups/{g}/topics/%25MQTT%25/messages`, a WebSocket subscriber of topic
//! `%MQTT%` gets it, and a `curl` publish there reaches `mosquitto_sub -t
//! /devices/42/temp` under that name (docs/mqtt.md, "Topic names").

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use interop_tests::Node;
use interop_tests::doors::{self, Door, MqttSub, Outgoing};

const WAIT: Duration = Duration::from_secs(30);

/// `mosquitto_pub` of one QoS 1 message in the given protocol version.
fn mosquitto_pub(node: &Node, version: &str, topic: &str, payload: &str) -> anyhow::Result<()> {
    let addr = node.addr("mqtt");
    let out = tokio::task::block_in_place(|| {
        Command::new("mosquitto_pub")
            .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
            .args(["-V", version, "-q", "1", "-t", topic, "-m", payload])
            .output()
    })
    .context("running mosquitto_pub (scripts/install-test-deps installs it)")?;
    if !out.status.success() {
        bail!(
            "mosquitto_pub failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_published_slash_topic_is_read_by_curl_and_websocket() {
    let node = Node::start().expect("start");
    doors::create_topic(&node, "%MQTT%", 4).await.unwrap();
    let mut ws = Door::Ws
        .receiver(&node, "%MQTT%", "names-ws")
        .await
        .unwrap();
    let mut http = Door::Http
        .receiver(&node, "%25MQTT%25", "names-http")
        .await
        .unwrap();
    for (version, body) in [("mqttv311", "21.5"), ("mqttv5", "22.5")] {
        mosquitto_pub(&node, version, "/devices/42/temp", body).unwrap();
        for (door, got) in [
            ("HTTP", http.next(WAIT).await.unwrap()),
            ("WebSocket", ws.next(WAIT).await.unwrap()),
        ] {
            assert_eq!(got.topic, "%MQTT%", "{door} {version}");
            assert_eq!(
                got.tag.as_deref(),
                Some("devices/42/temp"),
                "{door} {version}"
            );
            assert_eq!(got.body, body.as_bytes(), "{door} {version}");
        }
    }
    ws.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_publish_to_the_escaped_topic_reaches_mosquitto_sub_of_the_mqtt_name() {
    let node = Node::start().expect("start");
    // `MqttSub` checks the first level of each delivery: "" for `/devices/...`.
    let mut sub = MqttSub::start_filter(&node, "", "/devices/42/temp").unwrap();
    let mut dollar = MqttSub::start_filter(&node, "$TopicA", "$TopicA/#").unwrap();

    let mut m = Outgoing::sample("%25MQTT%25");
    m.tag = "devices/42/temp".into();
    m.body = b"from curl".to_vec();
    Door::Http.publish(&node, &m).await.unwrap();
    let got = sub.next(WAIT).unwrap();
    assert_eq!(got.topic, "");
    assert_eq!(got.tag.as_deref(), Some("devices/42/temp"));
    assert_eq!(got.body, b"from curl");
    assert_eq!(got.properties.get("color").map(String::as_str), Some("red"));

    // `$TopicA` is `%MQTT%%24TopicA`; in a URL every `%` is `%25`.
    let mut m = Outgoing::sample("%25MQTT%25%2524TopicA");
    m.tag = "B".into();
    m.body = b"dollar".to_vec();
    Door::Http.publish(&node, &m).await.unwrap();
    let got = dollar.next(WAIT).unwrap();
    assert_eq!(
        (got.topic.as_str(), got.tag.as_deref()),
        ("$TopicA", Some("B"))
    );
    assert_eq!(got.body, b"dollar");
}

/// `mosquitto_pub -d` of one QoS 1 message; returns the reason code of its PUBACK.
fn puback_code(node: &Node, version: &str, topic: &str) -> anyhow::Result<u8> {
    let addr = node.addr("mqtt");
    let out = tokio::task::block_in_place(|| {
        Command::new("mosquitto_pub")
            .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
            .args(["-V", version, "-q", "1", "-d", "-t", topic, "-m", "x"])
            .output()
    })
    .context("running mosquitto_pub")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let code = text
        .lines()
        .find_map(|l| l.split_once("received PUBACK (Mid: 1, RC:"))
        .and_then(|(_, rest)| rest.trim_end_matches(')').parse().ok())
        .with_context(|| format!("no PUBACK (exit {}): {}", out.status, text.len()))?;
    Ok(code)
}

/// A 65,535-byte name (the MQTT maximum) is more than the broker stores: MQTT 5
/// gets PUBACK 0x90, 3.1.1 an acknowledgement (dropped, not disconnected), and
/// both are counted in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_name_is_refused_with_0x90_or_acked_and_dropped() {
    let node = Node::start().expect("start");
    let name = format!("a/{}", "b".repeat(65_533));
    assert_eq!(puback_code(&node, "mqttv5", &name).unwrap(), 0x90);
    assert_eq!(puback_code(&node, "mqttv311", &name).unwrap(), 0);
    let (status, metrics) =
        doors::curl(&[&format!("http://{}/metrics", node.addr("http"))]).unwrap();
    assert_eq!(status, 200);
    for version in ["5", "3.1.1"] {
        let line = format!("rocketgate_mqtt_publish_refused_total{{version=\"{version}\"}} 1");
        assert!(metrics.contains(&line), "{line} in /metrics");
    }
}
