//! The cross-door matrix (issue #9), shared by `tests/matrix.rs` (one standalone node)
//! and `tests/matrix_proxy.rs` (publish through proxy 1, consume through proxy 2 of a
//! [`crate::cluster::Cluster`]): for every (publisher door, consumer door) pair, one
//! [`Outgoing::sample`] message goes in through one door and must come out of the other
//! intact, as far as the consuming protocol can carry it ([`Expect`]).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use anyhow::{Context, bail, ensure};

use crate::Node;
use crate::doors::{Door, Expect, Got, Outgoing};

/// Every cell's outcome, by (publisher, consumer).
pub type Cells = BTreeMap<(Door, Door), Result<(), String>>;

/// Runs `cell` for every pair (printing each outcome as `<name>: P -> C: pass`), then
/// prints the table titled `title` and each failure.
pub fn run<F, Fut>(rt: &tokio::runtime::Runtime, name: &str, title: &str, mut cell: F) -> Cells
where
    F: FnMut(Door, Door) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut cells = Cells::new();
    for publisher in Door::ALL {
        for consumer in Door::ALL {
            let outcome = rt
                .block_on(cell(publisher, consumer))
                .map_err(|e| format!("{e:#}"));
            let mark = if outcome.is_ok() { "pass" } else { "FAIL" };
            eprintln!("{name}: {publisher} -> {consumer}: {mark}");
            cells.insert((publisher, consumer), outcome);
        }
    }
    print!(
        "{}",
        Table {
            title,
            cells: &cells
        }
    );
    for ((p, c), r) in &cells {
        if let Err(e) = r {
            println!("  {p} -> {c}: {e}");
        }
    }
    cells
}

/// One cell on a topic that exists: the consumer on `consume_on` ready first (MQTT
/// subscriptions start at "now"), one publish on `publish_on`, one receive, every
/// field compared.
pub async fn cell(
    publish_on: &Node,
    consume_on: &Node,
    topic: &str,
    publisher: Door,
    consumer: Door,
) -> anyhow::Result<()> {
    let out = Outgoing::sample(topic);
    let mut receiver = consumer
        .receiver(consume_on, topic, &format!("mx-{}", consumer.short()))
        .await
        .context("preparing the consumer")?;
    publisher
        .publish(publish_on, &out)
        .await
        .context("publishing")?;
    let got = receiver
        .next(Duration::from_secs(30))
        .await
        .context("receiving")?;
    receiver.close().await;
    check(&out, &got, Expect::between(publisher, consumer))
}

/// The topic of a cell.
pub fn topic_of(publisher: Door, consumer: Door) -> String {
    format!("mx_{}_{}", publisher.short(), consumer.short())
}

/// Compares what came out with what went in.
pub fn check(sent: &Outgoing, got: &Got, expect: Expect) -> anyhow::Result<()> {
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

/// The 16-cell table.
pub struct Table<'a> {
    pub title: &'a str,
    pub cells: &'a Cells,
}

impl fmt::Display for Table<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f)?;
        writeln!(f, "{}: rows publish, columns consume", self.title)?;
        write!(f, "| {:<17} |", "publish \\ consume")?;
        for c in Door::ALL {
            write!(f, " {:<9} |", c.to_string())?;
        }
        writeln!(f)?;
        write!(f, "|{}|", "-".repeat(19))?;
        for _ in Door::ALL {
            write!(f, "{}|", "-".repeat(11))?;
        }
        writeln!(f)?;
        for p in Door::ALL {
            write!(f, "| {:<17} |", p.to_string())?;
            for c in Door::ALL {
                let mark = match self.cells.get(&(p, c)) {
                    Some(Ok(())) => "pass",
                    Some(Err(_)) => "FAIL",
                    None => "-",
                };
                write!(f, " {mark:<9} |")?;
            }
            writeln!(f)?;
        }
        let passed = self.cells.values().filter(|r| r.is_ok()).count();
        writeln!(f, "{passed}/{} cells pass", self.cells.len())
    }
}
