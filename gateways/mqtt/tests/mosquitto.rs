//! The gateway driven by Eclipse Mosquitto's command-line clients
//! (`mosquitto_pub` / `mosquitto_sub`, installed by `scripts/install-test-deps`).

mod support;

use std::process::Stdio;

use support::{Node, WAIT};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// A running `mosquitto_sub -d`: waits for its SUBACK, then yields message lines.
struct Sub {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Sub {
    async fn start(node: &Node, args: &[&str]) -> Sub {
        // Line-buffered, so the debug line about the SUBACK arrives when it happens.
        let mut child = Command::new("stdbuf")
            .args([
                "-oL",
                "mosquitto_sub",
                "-h",
                "127.0.0.1",
                "-p",
                &node.port().to_string(),
                "-d",
                "-W",
                "20",
            ])
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto_sub is installed (scripts/install-test-deps)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::time::timeout(WAIT, async {
            while let Some(l) = lines.next_line().await.unwrap() {
                if l.contains("received SUBACK") {
                    return;
                }
            }
            panic!("mosquitto_sub ended before its SUBACK");
        })
        .await
        .expect("no SUBACK in time");
        Sub { child, lines }
    }

    /// The next output line that is not debug chatter.
    async fn message(&mut self) -> String {
        tokio::time::timeout(WAIT, async {
            while let Some(l) = self.lines.next_line().await.unwrap() {
                if !l.starts_with("Client ") && !l.starts_with("Subscribed") {
                    return l;
                }
            }
            panic!("mosquitto_sub ended");
        })
        .await
        .expect("no message in time")
    }

    async fn finish(mut self) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "mosquitto_sub exited with {status}");
    }
}

async fn publish(node: &Node, args: &[&str]) {
    let out = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &node.port().to_string()])
        .args(args)
        .output()
        .await
        .expect("mosquitto_pub is installed");
    assert!(
        out.status.success(),
        "mosquitto_pub failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v311_and_v5_at_every_qos() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    for version in ["mqttv311", "mqttv5"] {
        let mut sub = Sub::start(
            &node,
            &[
                "-V",
                version,
                "-t",
                "plant/+/temp",
                "-q",
                "2",
                "-C",
                "3",
                "-v",
            ],
        )
        .await;
        for qos in ["0", "1", "2"] {
            let payload = format!("{version}-q{qos}");
            publish(
                &node,
                &[
                    "-V",
                    version,
                    "-t",
                    "plant/line1/temp",
                    "-q",
                    qos,
                    "-m",
                    &payload,
                ],
            )
            .await;
            assert_eq!(sub.message().await, format!("plant/line1/temp {payload}"));
        }
        sub.finish().await;
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_properties_reach_mosquitto_sub() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let mut sub = Sub::start(
        &node,
        &[
            "-V", "mqttv5", "-t", "dev/#", "-q", "1", "-C", "1", "-F", "%j",
        ],
    )
    .await;
    publish(
        &node,
        &[
            "-V",
            "mqttv5",
            "-t",
            "dev/a/b",
            "-q",
            "1",
            "-m",
            "{\"t\":1}",
            "-D",
            "publish",
            "user-property",
            "site",
            "berlin",
            "-D",
            "publish",
            "content-type",
            "application/json",
            "-D",
            "publish",
            "response-topic",
            "dev/replies",
            "-D",
            "publish",
            "correlation-data",
            "req-7",
        ],
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&sub.message().await).unwrap();
    assert_eq!(json["topic"], "dev/a/b");
    assert_eq!(json["payload"], "{\"t\":1}");
    let props = &json["properties"];
    assert_eq!(props["user-properties"]["site"], "berlin");
    assert_eq!(props["content-type"], "application/json");
    assert_eq!(props["response-topic"], "dev/replies");
    assert_eq!(props["correlation-data"], "req-7");
    sub.finish().await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_and_persistent_sessions_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    publish(&node, &["-t", "lamp/1/state", "-m", "on", "-r", "-q", "1"]).await;
    publish(&node, &["-t", "lamp/2/state", "-m", "off", "-r", "-q", "1"]).await;
    publish(&node, &["-t", "lamp/2/state", "-m", "", "-r", "-q", "1"]).await; // cleared
    // A persistent 3.1.1 session (-c) subscribes, then goes away.
    let sub = Sub::start(
        &node,
        &[
            "-i",
            "lamp-watcher",
            "-c",
            "-q",
            "1",
            "-t",
            "lamp/+/cmd",
            "-E",
        ],
    )
    .await;
    sub.finish().await;
    publish(&node, &["-t", "lamp/1/cmd", "-m", "blink", "-q", "1"]).await;
    let node = node.restart().await;
    // The retained state survived the restart.
    let mut sub = Sub::start(&node, &["-t", "lamp/#", "-C", "1", "-v"]).await;
    assert_eq!(sub.message().await, "lamp/1/state on");
    sub.finish().await;
    // The offline message is delivered when the session comes back (it may
    // arrive before the SUBACK of the repeated subscription, so read everything).
    let out = Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &node.port().to_string(),
            "-W",
            "20",
        ])
        .args([
            "-i",
            "lamp-watcher",
            "-c",
            "-q",
            "1",
            "-t",
            "lamp/+/cmd",
            "-C",
            "1",
            "-v",
        ])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "lamp/1/cmd blink"
    );
    node.stop().await;
}

/// Issue #30: topic names whose first level is no core topic name make the round
/// trip with their exact name, in both versions; `#` does not see `$TopicA/B`
/// (MQTT-4.7.2-1) and `+/devices/#` sees `/devices/42/temp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_topic_name_round_trips_v311_and_v5() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let names = [
        "/devices/42/temp",
        "home.assistant/x",
        "$TopicA/B",
        "café/☕",
        "a//b",
    ];
    for version in ["mqttv311", "mqttv5"] {
        let mut all = Sub::start(&node, &["-V", version, "-t", "#", "-q", "1", "-v"]).await;
        let mut plus = Sub::start(
            &node,
            &["-V", version, "-t", "+/devices/#", "-q", "1", "-v"],
        )
        .await;
        for name in names {
            let mut exact = Sub::start(
                &node,
                &["-V", version, "-t", name, "-q", "1", "-C", "1", "-v"],
            )
            .await;
            let payload = format!("{version}-{name}");
            publish(
                &node,
                &["-V", version, "-t", name, "-q", "1", "-m", &payload],
            )
            .await;
            assert_eq!(exact.message().await, format!("{name} {payload}"));
            exact.finish().await;
        }
        // A plain marker last: `#` has seen everything it will see before it.
        publish(
            &node,
            &["-V", version, "-t", "names/done", "-q", "1", "-m", "end"],
        )
        .await;
        let mut want: Vec<String> = names
            .iter()
            .filter(|n| !n.starts_with('$'))
            .map(|n| format!("{n} {version}-{n}"))
            .collect();
        want.sort();
        // Core topics are followed apart, so the marker may overtake the others.
        let (mut seen, mut done) = (Vec::new(), false);
        while !done || seen.len() < want.len() {
            match all.message().await {
                line if line == "names/done end" => done = true,
                line => seen.push(line),
            }
        }
        seen.sort();
        assert_eq!(seen, want, "'#' sees every name but the $ one");
        assert_eq!(
            plus.message().await,
            format!("/devices/42/temp {version}-/devices/42/temp")
        );
    }
    node.stop().await;
}

/// Retained messages and shared subscriptions on names with an escaped first
/// level: the retained one comes back under its name (`#` still skips the `$`
/// one), and a `$share` group on `/devices/#` gets what is published there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_and_shared_on_escaped_names() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    for (name, payload) in [("/lamp/1", "on"), ("$TopicA/B", "dollar")] {
        publish(&node, &["-t", name, "-r", "-q", "1", "-m", payload]).await;
    }
    let mut exact = Sub::start(&node, &["-t", "$TopicA/B", "-C", "1", "-v"]).await;
    assert_eq!(exact.message().await, "$TopicA/B dollar");
    exact.finish().await;
    let mut all = Sub::start(&node, &["-t", "#", "-C", "1", "-v"]).await;
    assert_eq!(all.message().await, "/lamp/1 on");
    all.finish().await;

    let mut member = Sub::start(
        &node,
        &[
            "-V",
            "mqttv5",
            "-t",
            "$share/g//devices/#",
            "-q",
            "1",
            "-C",
            "1",
            "-v",
        ],
    )
    .await;
    publish(&node, &["-t", "/devices/42/temp", "-q", "1", "-m", "21.5"]).await;
    assert_eq!(member.message().await, "/devices/42/temp 21.5");
    member.finish().await;
    node.stop().await;
}
