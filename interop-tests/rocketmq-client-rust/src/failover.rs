//! Failover (issue #28 item 5): the published client keeps sending across a `kill -9`
//! of the master, and everything it was told was stored is on the new master.
//!
//! Real processes, as `interop-tests/tests/failover.rs` starts them: one NameServer
//! with an embedded controller (`rocketgate namesrv --controller`) and one broker group
//! of three brokers (`controller.addresses` set, sync replication, so every
//! acknowledged message is on the in-sync slaves). The published client's producer
//! sends continuously (keys = sequence numbers) and keeps a ledger of what was
//! acknowledged; the master is killed with SIGKILL mid-stream; the producer must go on
//! and its sends land on the new master once the controller elected it and the
//! NameServer route changed. Then a push consumer of a new group reads the topic from
//! its first offset: every acknowledged key must be there (duplicates are counted,
//! they are the client's own retries).

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use interop_tests::{Node, binary};
use rocketgate_controller::ControllerClient;
use rocketmq_client_rust::{
    ClientRuntime, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, DefaultMQProducer,
    DefaultMQPushConsumer, MQPushConsumer, MessageListenerConcurrently,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;

const GROUP: &str = "broker-a";
const TOPIC: &str = "FailoverTopic";
const SECRET: &str = "interop-failover";
/// Acknowledged sends before the kill, and after it (on the new master).
const BEFORE: usize = 300;
const AFTER: usize = 300;

/// A child process killed (SIGKILL) when dropped, also on a panic.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// What one send came to.
struct Attempt {
    seq: u64,
    started: Instant,
    ended: Instant,
    /// `Err(text)`: the client's error, verbatim.
    outcome: Result<(), String>,
}

pub async fn run(rt: Arc<ClientRuntime>) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ns_port = free_port()?;
    let ctl_port = free_port()?;
    let namesrv = format!("127.0.0.1:{ns_port}");
    let controllers = format!("127.0.0.1:{ctl_port}");
    let _plane = Killed(
        Command::new(binary()?)
            .args(["namesrv", "--listen", &ns_port.to_string(), "--controller"])
            .args([
                "--controller-id",
                "1",
                "--controller-peers",
                &format!("1={controllers}"),
            ])
            .arg("--data-dir")
            .arg(dir.path().join("ns"))
            .env("RUST_LOG", "warn")
            // The binary reads every ROCKETGATE_* variable as a setting: the one that
            // names the binary for this program is not one.
            .env_remove("ROCKETGATE_BIN")
            .stdout(Stdio::null())
            .spawn()
            .context("starting the NameServer with its controller")?,
    );
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        let id_s = id.to_string();
        let env = [
            ("ROCKETGATE_CONTROLLER__ADDRESSES", controllers.as_str()),
            ("ROCKETGATE_BROKER__ID", id_s.as_str()),
            ("ROCKETGATE_BROKER__NAMESRV_ADDRS", namesrv.as_str()),
            ("ROCKETGATE_HA__MODE", "sync"),
            ("ROCKETGATE_HA__SECRET", SECRET),
            ("ROCKETGATE_HA__SYNC_TIMEOUT", "2s"),
            ("ROCKETGATE_HA__HEARTBEAT_INTERVAL", "250ms"),
        ];
        let node = tokio::task::block_in_place(|| Node::start_with_env(&env))
            .with_context(|| format!("starting broker {id}"))?;
        nodes.insert(id, node);
    }
    let client = ControllerClient::parse(&controllers)?;
    let info = wait("all three brokers in the in-sync set", 90, async || {
        client
            .replica_info(GROUP)
            .await
            .ok()
            .filter(|i| i.sync_state_set.len() == 3 && i.master_id.is_some())
    })
    .await?;
    let old = info.master_id.context("no master")?;
    let epoch = info.master_epoch;
    interop_tests::doors::create_topic(&nodes[&old], TOPIC, 4).await?;
    println!(
        "failover: master is broker {old} ({}), epoch {epoch}",
        nodes[&old].addr("native")
    );

    // The client learns the new master from its periodic route poll
    // (`poll_name_server_interval`, 30 s by default, as RocketMQ's Java client):
    // RMQ_POLL_NAMESRV_MS (the client accepts 10,000 at least) shortens it, to show
    // that the gap after a kill follows that setting.
    let mut config = rocketmq_client_rust::ClientConfig::default();
    if let Some(ms) = std::env::var("RMQ_POLL_NAMESRV_MS")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        config.set_poll_name_server_interval(ms);
    }
    println!(
        "failover: the client polls routes every {} ms",
        config.get_poll_name_server_interval()
    );
    let mut producer = DefaultMQProducer::builder(rt.clone())
        .client_config(config)
        .producer_group("failover_producers".to_string())
        .name_server_addr(namesrv.clone())
        .build();
    producer
        .start()
        .await
        .map_err(|e| anyhow::anyhow!("producer start: {e}"))?;

    let mut attempts: Vec<Attempt> = Vec::new();
    let mut seq = 0u64;
    let mut killed_at = None;
    let mut acked_after = 0usize;
    let run_deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let acked = attempts.iter().filter(|a| a.outcome.is_ok()).count();
        if killed_at.is_none() && acked >= BEFORE {
            nodes.get_mut(&old).context("master")?.kill9()?;
            killed_at = Some(Instant::now());
            println!("failover: kill -9 of broker {old} after {acked} acknowledged sends");
        }
        if acked_after >= AFTER {
            break;
        }
        if Instant::now() > run_deadline {
            bail!(
                "the client did not recover: {acked_after} sends acknowledged in the {:?} since the kill",
                killed_at.map(|k| k.elapsed())
            );
        }
        let message = Message::builder()
            .topic(TOPIC)
            .keys(vec![format!("seq-{seq}")])
            .body_slice(format!("failover-{seq}").as_bytes())
            .build_unchecked();
        let started = Instant::now();
        let outcome = producer
            .send_with_timeout(message, 3000)
            .await
            .map(drop)
            .map_err(|e| e.to_string());
        let ended = Instant::now();
        if outcome.is_ok() && killed_at.is_some_and(|k| started > k) {
            acked_after += 1;
        }
        if let Err(e) = &outcome {
            // Every failed send is printed: they are the evidence of what the client does.
            println!(
                "failover: send seq-{seq} failed after {:?} ({:?} after the kill): {e}",
                ended - started,
                killed_at.map(|k| started.saturating_duration_since(k))
            );
            // A failing client is not hammered in a tight loop.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        attempts.push(Attempt {
            seq,
            started,
            ended,
            outcome,
        });
        seq += 1;
    }
    let killed_at = killed_at.context("never killed")?;
    let new = client
        .replica_info(GROUP)
        .await?
        .master_id
        .context("no master")?;
    let failed_in_gap = attempts
        .iter()
        .filter(|a| a.ended >= killed_at && a.outcome.is_err())
        .count();
    let first_ok = attempts
        .iter()
        .find(|a| a.started >= killed_at && a.outcome.is_ok())
        .context("no acknowledged send after the kill")?;
    let gap = first_ok.ended - killed_at;
    let acked: BTreeSet<u64> = attempts
        .iter()
        .filter(|a| a.outcome.is_ok())
        .map(|a| a.seq)
        .collect();
    println!(
        "failover: new master broker {new} ({}); {} sends, {} acknowledged, {failed_in_gap} failed after the kill; \
         kill -> first acknowledged send {:.2} s",
        nodes[&new].addr("native"),
        attempts.len(),
        acked.len(),
        gap.as_secs_f64()
    );
    producer.shutdown().await;

    // Read everything back from the new master (the old one is dead: it is the only
    // place left to read from besides the slave).
    let seen: Seen = Arc::default();
    let mut consumer = DefaultMQPushConsumer::builder(rt.clone())
        .consumer_group("failover_readers".to_string())
        .name_server_addr(namesrv.clone())
        .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
        .consume_message_batch_max_size(16)
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
    let read_deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let missing = {
            let seen = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            acked.iter().filter(|s| !seen.contains_key(s)).count()
        };
        if missing == 0 {
            break;
        }
        if Instant::now() > read_deadline {
            consumer.shutdown().await;
            let seen = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            let lost: Vec<_> = acked
                .iter()
                .filter(|s| !seen.contains_key(s))
                .take(20)
                .collect();
            bail!("ACKED LOSS: {missing} acknowledged keys never read back (first: {lost:?})");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A little longer, so late duplicates are counted too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    consumer.shutdown().await;
    let seen = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let deliveries: usize = seen.values().sum();
    let duplicates = seen.values().filter(|n| **n > 1).count();
    let maybe = seen.keys().filter(|s| !acked.contains(s)).count();
    println!(
        "failover: read back {} distinct keys ({deliveries} deliveries): all {} acknowledged present, \
         {duplicates} keys more than once, {maybe} from sends answered with an error",
        seen.len(),
        acked.len()
    );
    println!(
        "FAILOVER OK: gap {:.2} s, {failed_in_gap} failed sends, 0 acknowledged lost",
        gap.as_secs_f64()
    );
    Ok(())
}

/// Deliveries per sequence number.
type Seen = Arc<Mutex<BTreeMap<u64, usize>>>;

struct Collect(Seen);

impl MessageListenerConcurrently for Collect {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> rocketmq_client_rust::ClientResult<ConsumeConcurrentlyStatus> {
        if let Ok(mut seen) = self.0.lock() {
            for m in msgs {
                let seq = m
                    .properties()
                    .iter()
                    .find(|(k, _)| k.as_str() == "KEYS")
                    .and_then(|(_, v)| v.as_str().strip_prefix("seq-")?.parse::<u64>().ok());
                if let Some(seq) = seq {
                    *seen.entry(seq).or_default() += 1;
                }
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

/// Polls `f` until it gives a value or `secs` pass.
pub async fn wait<T>(
    what: &str,
    secs: u64,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > until {
            bail!("timed out after {secs} s waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
