//! The story (issue #9), written once and run through each consuming door by
//! `tests/crash_story.rs`:
//!
//! 1. publish 1,000 numbered messages (HTTP batches; the 700th and the 701st are
//!    stored on either side of a timestamp `reset_ms`);
//! 2. consume and ack 450, wait until the broker has *persisted* those acks (its
//!    state file says so — no sleeping for the flush interval), consume and ack 50
//!    more, and `kill -9` the broker at once;
//! 3. restart it on the same data directory and ports and consume until all 1,000
//!    were seen: nothing is lost, and a message acked before the crash comes again
//!    only if the state file at the crash did not yet count it as done — the
//!    at-least-once window (the acks of the last flush interval);
//! 4. reset the group to `reset_ms` and read again: exactly messages 701..=1000 come.
//!
//! What "persisted" means per door ([`Ledger`]): position-based consumers (native
//! pull consumer, MQTT persistent session) are done below their consumer offset in
//! `config/offsets.json`; POP consumers (HTTP receive, WebSocket clustering) are done
//! below the POP cursor of `config/pop.json` unless still in flight there.
//!
//! The consumer on each door ([`StoryConsumer`]) only acks what it hands to the test
//! (HTTP/WS: receipt handles; native: commits exactly up to what it handed out; MQTT:
//! Python paho-mqtt with manual acks, `py/story_mqtt.py`, prints before it PUBACKs).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use rocketgate_native::client::PullConsumer;
use rocketgate_remoting::body::MessageQueue;
use serde_json::{Value, json};

use crate::doors::{self, Door, WsStream, curl};
use crate::{Node, now_ms};

/// Messages published.
pub const TOTAL: u32 = 1000;
/// Messages `1..=SPLIT` are stored before the reset timestamp, the rest after it.
pub const SPLIT: u32 = 700;
/// Acked and then waited for until persisted.
pub const FIRST_ACKS: usize = 450;
/// Acked right before the crash (the at-least-once window holds at most these).
pub const WINDOW_ACKS: usize = 50;
/// The longest wait for one more message.
pub const NEXT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a message sits: queue id and queue offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub queue: u32,
    pub offset: u64,
}

/// Message numbers and where they went.
#[derive(Debug, Clone)]
pub struct Published {
    pub pos: BTreeMap<u32, Pos>,
    /// Every message `n <= SPLIT` was stored before it, every later one at or after.
    pub reset_ms: i64,
}

/// The number of a story message (`message <n>`).
pub fn number(body: &[u8]) -> anyhow::Result<u32> {
    let text = std::str::from_utf8(body).context("a story body is text")?;
    text.strip_prefix("message ")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("not a story message: {text:?}"))
}

/// Publishes messages `1..=TOTAL` with bodies `message <n>` through the HTTP batch
/// endpoint, 100 per request.
pub async fn publish(node: &Node, topic: &str) -> anyhow::Result<Published> {
    publish_range(node, topic, 1..=TOTAL, "").await
}

/// Publishes `range` (100 per request; `query` is appended to the URL); when the
/// range crosses [`SPLIT`], the messages after it are stored after `reset_ms`.
pub async fn publish_range(
    node: &Node,
    topic: &str,
    range: std::ops::RangeInclusive<u32>,
    query: &str,
) -> anyhow::Result<Published> {
    let url = format!(
        "http://{}/v1/topics/{topic}/messages/batch{query}",
        node.addr("http")
    );
    let mut pos = BTreeMap::new();
    let mut reset_ms = 0;
    let numbers: Vec<u32> = range.collect();
    for chunk in numbers.chunk_by(|a, b| (a - 1) / 100 == (b - 1) / 100) {
        if chunk[0] == SPLIT + 1 {
            // A clock boundary, not a synchronisation: everything before was stored
            // at or before `reset_ms - 1`, everything after is stored at or after it.
            reset_ms = now_ms() + 1;
            while now_ms() < reset_ms {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let entries: Vec<Value> = chunk
            .iter()
            .map(|n| json!({"body": format!("message {n}"), "tag": "seq", "keys": [format!("k{n}")]}))
            .collect();
        let body = Value::Array(entries).to_string();
        let (status, text) = curl(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
            &url,
        ])?;
        ensure!(status == 201, "batch publish: HTTP {status}: {text}");
        let v: Value = serde_json::from_str(&text)?;
        let sent = v["messages"].as_array().context("no messages in answer")?;
        ensure!(sent.len() == chunk.len(), "batch answer: {text}");
        for (n, s) in chunk.iter().zip(sent) {
            let p = Pos {
                queue: s["queue_id"].as_u64().context("queue_id")? as u32,
                offset: s["queue_offset"].as_u64().context("queue_offset")?,
            };
            pos.insert(*n, p);
        }
    }
    Ok(Published { pos, reset_ms })
}

/// Where a door's consumer keeps what it acked.
#[derive(Debug, Clone)]
pub enum Ledger {
    /// Consumer offsets of this owner in `config/offsets.json`.
    Offsets(String),
    /// POP state of this group in `config/pop.json`.
    Pop(String),
}

/// A state file as the broker last wrote it: per queue, the first offset not done
/// and the offsets still in flight below it.
#[derive(Debug, Clone, Default)]
pub struct Persisted {
    queues: BTreeMap<u32, (u64, BTreeSet<u64>)>,
}

impl Persisted {
    pub fn read(data_dir: &Path, ledger: &Ledger, topic: &str) -> anyhow::Result<Persisted> {
        let (file, owner) = match ledger {
            Ledger::Offsets(o) => ("offsets.json", o),
            Ledger::Pop(g) => ("pop.json", g),
        };
        let path: PathBuf = data_dir.join("config").join(file);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Persisted::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let mut queues = BTreeMap::new();
        let root = match ledger {
            Ledger::Offsets(_) => &v["offsets"],
            Ledger::Pop(_) => &v["queues"],
        };
        if let Some(qs) = root[owner.as_str()][topic].as_object() {
            for (q, state) in qs {
                let q: u32 = q.parse().context("queue id")?;
                let entry = match ledger {
                    Ledger::Offsets(_) => (state.as_u64().context("offset")?, BTreeSet::new()),
                    Ledger::Pop(_) => (
                        state["cursor"].as_u64().context("cursor")?,
                        state["in_flight"]
                            .as_object()
                            .map(|m| m.keys().filter_map(|k| k.parse().ok()).collect())
                            .unwrap_or_default(),
                    ),
                };
                queues.insert(q, entry);
            }
        }
        Ok(Persisted { queues })
    }

    /// The state files as they are now (for failure messages).
    pub fn dump(data_dir: &Path) -> String {
        ["offsets.json", "pop.json"]
            .iter()
            .map(|f| {
                let path = data_dir.join("config").join(f);
                format!(
                    "{f}: {}",
                    std::fs::read_to_string(&path).unwrap_or_else(|e| e.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// True when the file counts the message at `p` as consumed and acked.
    pub fn done(&self, p: Pos) -> bool {
        self.queues
            .get(&p.queue)
            .is_some_and(|(next, in_flight)| p.offset < *next && !in_flight.contains(&p.offset))
    }
}

/// One message a consumer handed to the test (and acked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub n: u32,
    /// Where the door said it was (MQTT does not say).
    pub pos: Option<Pos>,
}

/// A consumer of the story topic on one door, acking what it hands out.
pub enum StoryConsumer {
    Http {
        base: String,
        topic: String,
        group: String,
    },
    Ws {
        ws: Box<WsStream>,
        credit_left: usize,
    },
    Native {
        consumer: PullConsumer,
    },
    Mqtt {
        host: String,
        port: u16,
        client_id: String,
        filter: String,
    },
}

/// How long a POP delivery stays invisible without an ack: long enough for the ack
/// on a busy machine, short enough that a lease left by the crash runs out soon.
const INVISIBLE_MS: u64 = 10_000;
/// The WebSocket subscription id.
const WS_SUB: &str = "story";

impl StoryConsumer {
    /// The group (MQTT: client id) used on `door`.
    pub fn ledger(door: Door, group: &str) -> Ledger {
        match door {
            Door::Http | Door::Ws => Ledger::Pop(group.to_string()),
            Door::Native => Ledger::Offsets(group.to_string()),
            Door::Mqtt => Ledger::Offsets(format!("mqtt%c%{group}")),
        }
    }

    /// Opens the consumer (MQTT: the persistent session exists and is subscribed
    /// when this returns; the others start from the first message).
    pub async fn open(
        door: Door,
        node: &Node,
        topic: &str,
        group: &str,
    ) -> anyhow::Result<StoryConsumer> {
        Ok(match door {
            Door::Http => StoryConsumer::Http {
                base: format!("http://{}", node.addr("http")),
                topic: topic.to_string(),
                group: group.to_string(),
            },
            Door::Ws => {
                let mut ws = doors::ws_connect(node).await?;
                doors::ws_send(
                    &mut ws,
                    json!({"op": "subscribe", "req": "s", "id": WS_SUB, "topic": topic,
                           "group": group, "mode": "clustering", "start": "earliest",
                           "credit": 0, "invisible_ms": INVISIBLE_MS}),
                )
                .await?;
                loop {
                    let f = doors::ws_next(&mut ws, NEXT_TIMEOUT).await?;
                    match f["type"].as_str() {
                        Some("subscribed") => break,
                        Some("error") => bail!("WebSocket subscribe refused: {f}"),
                        _ => {}
                    }
                }
                StoryConsumer::Ws {
                    ws: Box::new(ws),
                    credit_left: 0,
                }
            }
            Door::Native => {
                let consumer = PullConsumer::start(doors::native_config(node), group)
                    .await?
                    .with_batch_size(16);
                // The broker registers a new topic (and, after a restart, all of them)
                // with the NameServer moments later: wait for the route.
                let deadline = Instant::now() + NEXT_TIMEOUT;
                let queues = loop {
                    match consumer.queues(topic).await {
                        Ok(q) if !q.is_empty() => break q,
                        Ok(_) | Err(_) if Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Ok(_) => bail!("no queues of {topic} in its route"),
                        Err(e) => return Err(e.into()),
                    }
                };
                consumer.assign(queues, "*").await?;
                StoryConsumer::Native { consumer }
            }
            Door::Mqtt => {
                let addr = node.addr("mqtt");
                let c = StoryConsumer::Mqtt {
                    host: addr.ip().to_string(),
                    port: addr.port(),
                    client_id: group.to_string(),
                    filter: format!("{topic}/#"),
                };
                // Creates the session and its subscription, then leaves (cleanly)
                // without taking anything: after the restart the session already
                // has messages for it, and whatever this run printed and acked
                // would be lost to the story.
                let mut p = c.paho_open()?;
                p.wait()?;
                c
            }
        })
    }

    /// Consumes and acks exactly `n` messages.
    pub async fn take_exact(&mut self, n: usize) -> anyhow::Result<Vec<Seen>> {
        if let StoryConsumer::Mqtt { .. } = self {
            let mut p = self.paho(n)?;
            let mut seen = Vec::with_capacity(n);
            while seen.len() < n {
                seen.push(p.next()?);
            }
            p.wait()?;
            return Ok(seen);
        }
        let mut seen = Vec::with_capacity(n);
        while seen.len() < n {
            seen.extend(self.next_batch(n - seen.len()).await?);
        }
        self.settle().await?;
        Ok(seen)
    }

    /// Consumes and acks until `enough` says so (it sees everything taken so far).
    pub async fn take_until(
        &mut self,
        mut enough: impl FnMut(&[Seen]) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Vec<Seen>> {
        let mut seen = Vec::new();
        if let StoryConsumer::Mqtt { .. } = self {
            let mut p = self.paho(0)?;
            while !enough(&seen)? {
                seen.push(p.next()?);
            }
            // Whatever it printed is acked; a stop acks nothing more.
            seen.extend(p.stop()?);
            return Ok(seen);
        }
        while !enough(&seen)? {
            seen.extend(self.next_batch(usize::MAX).await?);
        }
        self.settle().await?;
        Ok(seen)
    }

    /// At least one and at most `limit` messages, acked.
    async fn next_batch(&mut self, limit: usize) -> anyhow::Result<Vec<Seen>> {
        match self {
            StoryConsumer::Http { base, topic, group } => {
                http_batch(base, topic, group, limit.min(32))
            }
            StoryConsumer::Ws { ws, credit_left } => {
                if *credit_left == 0 {
                    let n = limit.min(100);
                    doors::ws_send(ws, json!({"op": "credit", "id": WS_SUB, "n": n})).await?;
                    *credit_left = n;
                }
                loop {
                    let f = doors::ws_next(ws, NEXT_TIMEOUT).await?;
                    match f["type"].as_str() {
                        Some("message") => {
                            *credit_left -= 1;
                            let receipt = f["receipt"].as_str().context("no receipt")?;
                            doors::ws_send(ws, json!({"op": "ack", "receipt": receipt})).await?;
                            return Ok(vec![seen_json(&f, "encoding")?]);
                        }
                        Some("error") => bail!("WebSocket error: {f}"),
                        _ => {}
                    }
                }
            }
            StoryConsumer::Native { consumer } => native_batch(consumer, limit).await,
            StoryConsumer::Mqtt { .. } => bail!("MQTT consumes through paho runs"),
        }
    }

    /// Returns once every ack sent so far was processed by the broker.
    async fn settle(&mut self) -> anyhow::Result<()> {
        if let StoryConsumer::Ws { ws, credit_left } = self {
            // Frames of a connection are handled in order: the pong follows the acks.
            doors::ws_send(ws, json!({"op": "ping", "req": "settle"})).await?;
            loop {
                let f = doors::ws_next(ws, NEXT_TIMEOUT).await?;
                match f["type"].as_str() {
                    Some("pong") => return Ok(()),
                    Some("error") => bail!("WebSocket error: {f}"),
                    // A delivery on leftover credit: not handed out, not acked; it
                    // comes again after its invisibility.
                    Some("message") => *credit_left = credit_left.saturating_sub(1),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Moves the group back to the first message stored at or after `ts_ms`: the HTTP
    /// admin API for POP groups and MQTT sessions, the native client's own seek.
    pub async fn reset_to(
        &mut self,
        node: &Node,
        topic: &str,
        group: &str,
        ts_ms: i64,
    ) -> anyhow::Result<()> {
        if let StoryConsumer::Native { consumer } = self {
            for q in consumer.assignment() {
                consumer.seek_to_timestamp(&q, ts_ms).await?;
            }
            return Ok(());
        }
        let group = match self {
            StoryConsumer::Mqtt { client_id, .. } => format!("mqtt%25c%25{client_id}"),
            _ => group.to_string(),
        };
        let body = json!({"topic": topic, "to": "timestamp", "timestamp_ms": ts_ms}).to_string();
        let (status, text) = curl(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
            &format!(
                "http://{}/v1/groups/{group}/offsets/reset",
                node.addr("http")
            ),
        ])?;
        ensure!(status == 200, "offset reset: HTTP {status}: {text}");
        Ok(())
    }

    pub async fn close(self) {
        match self {
            StoryConsumer::Ws { mut ws, .. } => {
                let _ = ws.close(None).await;
            }
            StoryConsumer::Native { consumer } => consumer.shutdown().await,
            StoryConsumer::Http { .. } | StoryConsumer::Mqtt { .. } => {}
        }
    }

    /// A run that only makes sure the session exists and is subscribed.
    fn paho_open(&self) -> anyhow::Result<Paho> {
        self.paho_run(-1)
    }

    fn paho(&self, count: usize) -> anyhow::Result<Paho> {
        self.paho_run(i64::try_from(count)?)
    }

    fn paho_run(&self, count: i64) -> anyhow::Result<Paho> {
        let StoryConsumer::Mqtt {
            host,
            port,
            client_id,
            filter,
        } = self
        else {
            bail!("not an MQTT consumer");
        };
        Paho::start(host, *port, client_id, filter, count)
    }
}

fn seen_json(m: &Value, encoding_field: &str) -> anyhow::Result<Seen> {
    let body = m["body"].as_str().context("no body")?;
    ensure!(
        m[encoding_field].as_str() != Some("base64"),
        "a story body is text: {m}"
    );
    Ok(Seen {
        n: number(body.as_bytes())?,
        pos: Some(Pos {
            queue: m["queue_id"].as_u64().context("queue_id")? as u32,
            offset: m["queue_offset"].as_u64().context("queue_offset")?,
        }),
    })
}

fn http_batch(base: &str, topic: &str, group: &str, max: usize) -> anyhow::Result<Vec<Seen>> {
    let deadline = Instant::now() + NEXT_TIMEOUT;
    loop {
        let url = format!(
            "{base}/v1/groups/{group}/topics/{topic}/messages?max={max}&wait_ms=5000&invisible_ms={INVISIBLE_MS}"
        );
        let (status, text) = curl(&[&url])?;
        ensure!(status == 200, "HTTP receive: {status}: {text}");
        let v: Value = serde_json::from_str(&text).with_context(|| format!("bad JSON: {text}"))?;
        let msgs = v["messages"].as_array().context("no messages array")?;
        if msgs.is_empty() {
            ensure!(
                Instant::now() < deadline,
                "no HTTP message within {NEXT_TIMEOUT:?}"
            );
            continue;
        }
        let mut seen = Vec::with_capacity(msgs.len());
        let mut handles = Vec::with_capacity(msgs.len());
        for m in msgs {
            seen.push(seen_json(m, "body_encoding")?);
            handles.push(m["receipt_handle"].as_str().context("no receipt_handle")?);
        }
        let ack = json!({"receipt_handles": handles}).to_string();
        let (status, text) = curl(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            &ack,
            &format!("{base}/v1/groups/{group}/acks"),
        ])?;
        ensure!(status == 200, "HTTP ack: {status}: {text}");
        return Ok(seen);
    }
}

/// Polls, hands out at most `limit` messages, puts the queue back to the first one
/// not handed out, and commits: the committed offsets cover exactly what was handed out.
async fn native_batch(consumer: &PullConsumer, limit: usize) -> anyhow::Result<Vec<Seen>> {
    let deadline = Instant::now() + NEXT_TIMEOUT;
    loop {
        let batch = consumer.poll(Duration::from_secs(5)).await?;
        if batch.is_empty() {
            ensure!(
                Instant::now() < deadline,
                "no native message within {NEXT_TIMEOUT:?}"
            );
            continue;
        }
        let mut seen = Vec::new();
        for m in &batch {
            if seen.len() == limit {
                let q = consumer
                    .assignment()
                    .into_iter()
                    .find(|q: &MessageQueue| q.queue_id == m.queue_id && q.topic == m.topic)
                    .context("a message of an unassigned queue")?;
                consumer.seek(&q, m.queue_offset)?;
                break;
            }
            seen.push(Seen {
                n: number(&m.body)?,
                pos: Some(Pos {
                    queue: m.queue_id,
                    offset: m.queue_offset,
                }),
            });
        }
        consumer.commit().await?;
        return Ok(seen);
    }
}

/// One run of `py/story_mqtt.py`.
struct Paho {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Paho {
    fn start(
        host: &str,
        port: u16,
        client_id: &str,
        filter: &str,
        count: i64,
    ) -> anyhow::Result<Paho> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/story_mqtt.py");
        let mut child = Command::new("python3")
            .arg("-u")
            .arg(&script)
            .args([
                host,
                &port.to_string(),
                client_id,
                filter,
                &count.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("running python3 with paho-mqtt (scripts/install-test-deps installs it)")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let stdin = child.stdin.take();
        let lines = crate::lines_of(stdout);
        let p = Paho {
            child,
            stdin,
            lines,
        };
        match p.line()?.as_str() {
            "READY" => Ok(p),
            other => bail!("paho: {other}"),
        }
    }

    fn line(&self) -> anyhow::Result<String> {
        tokio::task::block_in_place(|| self.lines.recv_timeout(NEXT_TIMEOUT))
            .context("paho printed nothing in time")
    }

    /// The next message it printed (and acked).
    fn next(&mut self) -> anyhow::Result<Seen> {
        let line = self.line()?;
        parse_msg(&line)
    }

    /// Waits for a counted run to end (it disconnects by itself).
    fn wait(&mut self) -> anyhow::Result<()> {
        let line = self.line()?;
        ensure!(line == "BYE", "paho printed {line:?} after its count");
        let status = tokio::task::block_in_place(|| self.child.wait())?;
        ensure!(status.success(), "paho exited with {status}");
        Ok(())
    }

    /// Asks an open-ended run to stop (closing its stdin); returns what it printed
    /// (and acked) on the way out.
    fn stop(&mut self) -> anyhow::Result<Vec<Seen>> {
        drop(self.stdin.take());
        let mut rest = Vec::new();
        loop {
            let line = self.line()?;
            if line == "BYE" {
                break;
            }
            rest.push(parse_msg(&line)?);
        }
        let status = tokio::task::block_in_place(|| self.child.wait())?;
        ensure!(status.success(), "paho exited with {status}");
        Ok(rest)
    }
}

impl Drop for Paho {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse_msg(line: &str) -> anyhow::Result<Seen> {
    let rest = line
        .strip_prefix("MSG ")
        .with_context(|| format!("paho: {line}"))?;
    let (_topic, payload) = rest.split_once(' ').context("MSG <topic> <payload>")?;
    Ok(Seen {
        n: number(payload.as_bytes())?,
        pos: None,
    })
}
