//! The cross-door matrix (issue #9): for every (publisher door, consumer door) pair among
//! MQTT, HTTP, WebSocket and native, one message with a topic, a tag (MQTT: the rest of
//! the topic path), two keys, two user properties and a binary body (zero bytes,
//! non-UTF-8) goes in through one door and must come out of the other intact — as far
//! as the consuming protocol can carry it (MQTT has no keys; see the table in README).
//!
//! Each door is driven by a client nobody on this project wrote where one exists:
//! `mosquitto_pub` / `mosquitto_sub` for MQTT, `curl` for HTTP, `tokio-tungstenite` for
//! WebSocket; native uses our own client (the published `rocketmq-client-rust` runs in
//! the opt-in `scripts/interop-rocketmq-client-rust`). All against the real binary
//! started by [`interop_tests::Node`].
//!
//! A custom harness (`harness = false`): it prints the 16-cell table at the end and
//! fails if any cell failed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use interop_tests::Node;
use interop_tests::doors::{self, Door, Expect, Got, Outgoing};

fn main() {
    let node = match Node::start() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("matrix: the node did not start: {e:#}");
            std::process::exit(1);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut cells: BTreeMap<(Door, Door), Result<(), String>> = BTreeMap::new();
    for publisher in Door::ALL {
        for consumer in Door::ALL {
            let outcome = rt
                .block_on(cell(&node, publisher, consumer))
                .map_err(|e| format!("{e:#}"));
            let mark = if outcome.is_ok() { "pass" } else { "FAIL" };
            eprintln!("matrix: {publisher} -> {consumer}: {mark}");
            cells.insert((publisher, consumer), outcome);
        }
    }
    print!("{}", Table(&cells));
    let failed: Vec<_> = cells.iter().filter(|(_, r)| r.is_err()).collect();
    for ((p, c), r) in &failed {
        if let Err(e) = r {
            println!("  {p} -> {c}: {e}");
        }
    }
    if !failed.is_empty() {
        eprintln!("{}", node.log_tail());
        std::process::exit(1);
    }
}

/// One cell: a fresh topic, the consumer ready first (MQTT subscriptions start at
/// "now"), one publish, one receive, every field compared.
async fn cell(node: &Node, publisher: Door, consumer: Door) -> anyhow::Result<()> {
    let topic = format!("mx_{}_{}", publisher.short(), consumer.short());
    doors::create_topic(node, &topic, 2).await?;
    let out = Outgoing::sample(&topic);
    let mut receiver = consumer
        .receiver(node, &topic, &format!("mx-{}", consumer.short()))
        .await
        .context("preparing the consumer")?;
    publisher.publish(node, &out).await.context("publishing")?;
    let got = receiver
        .next(Duration::from_secs(30))
        .await
        .context("receiving")?;
    receiver.close().await;
    check(&out, &got, Expect::between(publisher, consumer))
}

fn check(sent: &Outgoing, got: &Got, expect: Expect) -> anyhow::Result<()> {
    ensure!(
        got.body == sent.body,
        "body differs: sent {:02x?}, got {:02x?}",
        sent.body,
        got.body
    );
    ensure!(
        got.topic == sent.topic,
        "topic: sent {}, got {}",
        sent.topic,
        got.topic
    );
    ensure!(
        got.tag.as_deref() == Some(sent.tag.as_str()),
        "tag / topic path: sent {:?}, got {:?}",
        sent.tag,
        got.tag
    );
    if expect.keys {
        ensure!(
            got.keys == sent.keys,
            "keys: sent {:?}, got {:?}",
            sent.keys,
            got.keys
        );
    }
    for (k, v) in &sent.properties {
        match got.properties.get(k) {
            Some(g) if g == v => {}
            other => bail!(
                "property {k}: sent {v:?}, got {other:?} (all: {:?})",
                got.properties
            ),
        }
    }
    Ok(())
}

struct Table<'a>(&'a BTreeMap<(Door, Door), Result<(), String>>);

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f)?;
        writeln!(f, "cross-door matrix: rows publish, columns consume")?;
        write!(f, "| {:<17} |", "publish \\ consume")?;
        for c in Door::ALL {
            write!(f, " {c:<9} |")?;
        }
        writeln!(f)?;
        write!(f, "|{}|", "-".repeat(19))?;
        for _ in Door::ALL {
            write!(f, "{}|", "-".repeat(11))?;
        }
        writeln!(f)?;
        for p in Door::ALL {
            write!(f, "| {p:<17} |")?;
            for c in Door::ALL {
                let mark = match self.0.get(&(p, c)) {
                    Some(Ok(())) => "pass",
                    Some(Err(_)) => "FAIL",
                    None => "-",
                };
                write!(f, " {mark:<9} |")?;
            }
            writeln!(f)?;
        }
        let passed = self.0.values().filter(|r| r.is_ok()).count();
        writeln!(f, "{passed}/{} cells pass", self.0.len())
    }
}
