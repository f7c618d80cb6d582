//! `rocketgate admin topic create|update|delete --brokers a,b | --cluster NAME`:
//! a topic change on several broker groups at once (RocketMQ mqadmin's `-b` / `-c`).
//!
//! The node the CLI talks to answers `GET /v1/cluster` (the NameServer's view:
//! which groups a cluster has, and that NameServer's address); the change then goes
//! to each named group's master over the native protocol through the proxy's
//! cluster client (`rocketgate_native::cluster::Cluster::on_brokers`), the same path
//! a proxy's topic administration takes. Every group's outcome is printed (a table,
//! or `--json`), and the command exits 1 when any group failed.

use clap::Args;
use rocketgate_config::ProxyConfig;
use rocketgate_core::broker::{MessagingApi, Perm, TopicConfig};
use serde_json::{Value, json};

use super::client::{Client, Failure, exit};
use super::table;

/// Which broker groups a topic change goes to (none: the node the CLI talks to).
#[derive(Debug, Clone, Default, Args)]
pub struct Targets {
    /// Broker groups (names, comma-separated), each changed on its master.
    #[arg(long, short = 'b', value_delimiter = ',', conflicts_with = "cluster")]
    pub brokers: Vec<String>,
    /// Every broker group of this cluster (as the NameServer knows it).
    #[arg(long, short = 'c')]
    pub cluster: Option<String>,
    /// The NameServer to ask for the groups' masters (default: the one the node
    /// uses, from `GET /v1/cluster`).
    #[arg(long, env = "ROCKETGATE_ADMIN_NAMESRV", value_name = "HOST:PORT")]
    pub namesrv: Option<String>,
}

impl Targets {
    /// Whether the change goes to several groups rather than to the node itself.
    pub fn any(&self) -> bool {
        !self.brokers.is_empty() || self.cluster.is_some()
    }
}

/// What to do on each group.
pub enum Change {
    Create {
        queues: u32,
        perm: Option<String>,
    },
    Update {
        read_queues: Option<u32>,
        write_queues: Option<u32>,
        perm: Option<String>,
    },
    Delete,
}

/// Applies `change` to `topic` on every targeted group; prints one row per group.
pub async fn topic_change(
    client: &Client,
    json: bool,
    targets: &Targets,
    topic: &str,
    change: Change,
) -> Result<(), Failure> {
    let perm = match &change {
        Change::Create { perm, .. } | Change::Update { perm, .. } => {
            perm.as_deref().map(parse_perm).transpose()?
        }
        Change::Delete => None,
    };
    if let Change::Update {
        read_queues: None,
        write_queues: None,
        perm: None,
    } = change
    {
        return Err(Failure::usage(
            "nothing to change: give --read-queues, --write-queues or --perm",
        ));
    }
    let (names, namesrv) = resolve(client, targets).await?;
    let cluster = crate::cluster_client::connect(
        std::slice::from_ref(&namesrv),
        None,
        &ProxyConfig::default(),
        // A NameServer behind TLS (`tls.namesrv`) is not reachable from here yet.
        std::path::Path::new(""),
    )
    .await
    .map_err(|e| Failure::usage(format!("NameServer {namesrv}: {e}")))?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let results: Vec<(String, Result<Option<TopicConfig>, String>)> = match change {
        Change::Create { queues, .. } => {
            let mut config = TopicConfig::new(topic, queues);
            if let Some(p) = perm {
                config = config.with_perm(p);
            }
            let out = cluster.create_topic_on(&refs, config).await;
            out.into_iter()
                .map(|(b, r)| (b, r.map(Some).map_err(|e| e.to_string())))
                .collect()
        }
        Change::Update {
            read_queues,
            write_queues,
            ..
        } => {
            // Read-modify-write on each group: what is not named keeps that group's
            // own value (groups may hold different queue counts).
            let out = cluster
                .on_brokers(&refs, |m| async move {
                    let mut c = m.topic(topic).await?;
                    if let Some(n) = read_queues {
                        c.read_queues = n;
                    }
                    if let Some(n) = write_queues {
                        c.write_queues = n;
                    }
                    if let Some(p) = perm {
                        c.perm = p;
                    }
                    m.update_topic(c).await
                })
                .await;
            out.into_iter()
                .map(|(b, r)| (b, r.map(Some).map_err(|e| e.to_string())))
                .collect()
        }
        Change::Delete => {
            let out = cluster.delete_topic_on(&refs, topic).await;
            out.into_iter()
                .map(|(b, r)| (b, r.map(|()| None).map_err(|e| e.to_string())))
                .collect()
        }
    };
    let failed = results.iter().filter(|(_, r)| r.is_err()).count();
    let rows: Vec<Value> = results
        .iter()
        .map(|(broker, r)| match r {
            Ok(Some(c)) => json!({
                "broker": broker,
                "ok": true,
                "read_queues": c.read_queues,
                "write_queues": c.write_queues,
                "perm": perm_name(c.perm),
            }),
            Ok(None) => json!({ "broker": broker, "ok": true }),
            Err(e) => json!({ "broker": broker, "ok": false, "error": e }),
        })
        .collect();
    if json {
        let v = json!({ "topic": topic, "results": rows, "failed": failed });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string())
        );
    } else {
        let cell = |v: &Value| match v {
            Value::Null => "-".to_owned(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        table::print(
            &["BROKER", "RESULT", "READ QUEUES", "WRITE QUEUES", "PERM"],
            rows.iter()
                .map(|r| {
                    let result = if r["ok"] == true {
                        "ok".to_owned()
                    } else {
                        format!("failed: {}", cell(&r["error"]))
                    };
                    vec![
                        cell(&r["broker"]),
                        result,
                        cell(&r["read_queues"]),
                        cell(&r["write_queues"]),
                        cell(&r["perm"]),
                    ]
                })
                .collect(),
        );
    }
    if failed > 0 {
        return Err(Failure {
            code: exit::USAGE,
            message: format!(
                "topic {topic:?}: failed on {failed} of {} broker group(s)",
                results.len()
            ),
        });
    }
    Ok(())
}

/// The group names the targets stand for, and the NameServer to reach them through.
async fn resolve(client: &Client, targets: &Targets) -> Result<(Vec<String>, String), Failure> {
    let view = client.get("/v1/cluster").await?;
    let namesrv = match (&targets.namesrv, view["namesrv"].as_str()) {
        (Some(n), _) => n.clone(),
        (None, Some(n)) => n.to_owned(),
        (None, None) => {
            return Err(Failure::usage(
                "the node named no NameServer; give --namesrv HOST:PORT",
            ));
        }
    };
    let known: Vec<String> = view["brokers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["broker_name"].as_str().map(str::to_owned))
        .collect();
    let names: Vec<String> = match &targets.cluster {
        Some(c) => match view["clusters"][c].as_array() {
            Some(names) => names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect(),
            None => {
                let clusters: Vec<&String> = view["clusters"]
                    .as_object()
                    .map(|o| o.keys().collect())
                    .unwrap_or_default();
                return Err(Failure {
                    code: exit::NOT_FOUND,
                    message: format!("no cluster {c:?} (the NameServer knows {clusters:?})"),
                });
            }
        },
        None => targets
            .brokers
            .iter()
            .map(|b| b.trim().to_owned())
            .filter(|b| !b.is_empty())
            .collect(),
    };
    if names.is_empty() {
        return Err(Failure::usage("no broker group named (--brokers a,b)"));
    }
    // An unknown name is reported as that group's failure, with the others done:
    // said here too, so a typo is plain.
    for n in &names {
        if !known.contains(n) {
            eprintln!("rocketgate admin: broker group {n:?} is not in the cluster view {known:?}");
        }
    }
    Ok((names, namesrv))
}

fn parse_perm(s: &str) -> Result<Perm, Failure> {
    match s {
        "rw" => Ok(Perm::READ_WRITE),
        "r" => Ok(Perm::READ),
        "w" => Ok(Perm::WRITE),
        "-" => Ok(Perm(0)),
        other => Err(Failure::usage(format!(
            "--perm: {other:?} is not one of rw, r, w, -"
        ))),
    }
}

fn perm_name(p: Perm) -> &'static str {
    match (p.is_readable(), p.is_writable()) {
        (true, true) => "rw",
        (true, false) => "r",
        (false, true) => "w",
        (false, false) => "-",
    }
}
