//! `rocketgate admin …`: the operator's CLI over a running node's HTTP admin API
//! (docs/operations.md). A table for people, `--json` (the server's JSON) for
//! scripts, and exit codes scripts can trust ([`client::exit`]): 0 ok, 1 usage
//! or a rejected request, 2 not found, 3 unreachable, 4 unauthorized/forbidden.

mod acl;
mod client;
mod multi;
mod switchover;
mod table;

use bytes::Bytes;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

pub use client::exit;
use client::{Client, Failure, enc};
use table::{cell, time};

/// Flags every `admin` command takes.
#[derive(Debug, Clone, Args)]
pub struct Conn {
    /// The node's HTTP door: `http://HOST:PORT` or `https://HOST:PORT` (with --cacert).
    #[arg(
        long,
        global = true,
        env = "ROCKETGATE_ADMIN_SERVER",
        default_value = "http://127.0.0.1:8080",
        value_name = "URL"
    )]
    pub server: String,
    /// An API key (`Authorization: Bearer`), when authentication is on.
    #[arg(
        long,
        global = true,
        env = "ROCKETGATE_ADMIN_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<String>,
    /// A user (HTTP Basic, with --password), when authentication is on.
    #[arg(long, global = true, env = "ROCKETGATE_ADMIN_USER")]
    pub user: Option<String>,
    /// The password of --user.
    #[arg(
        long,
        global = true,
        env = "ROCKETGATE_ADMIN_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// Print the server's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// For an `https://` server: the PEM CA file that issued its certificate
    /// (default: the system's CA bundle).
    #[arg(long, global = true, env = "ROCKETGATE_CACERT", value_name = "FILE")]
    pub cacert: Option<std::path::PathBuf>,
}

/// `rocketgate admin`
#[derive(Debug, Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub conn: Conn,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Clusters and brokers as the NameServer knows them.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// This broker: name, version, uptime, store positions, disk.
    #[command(subcommand)]
    Broker(BrokerCmd),
    /// Topics.
    #[command(subcommand)]
    Topic(TopicCmd),
    /// Consumer groups.
    #[command(subcommand)]
    Group(GroupCmd),
    /// Every connection of the node, by door (MQTT, WebSocket, HTTP, native).
    Connections,
    /// Find messages.
    #[command(subcommand)]
    Message(MessageCmd),
    /// Consumer offsets.
    #[command(subcommand)]
    Offset(OffsetCmd),
    /// Publish one message (smoke test).
    Send(SendArgs),
    /// Receive (and ack) messages as a group (smoke test).
    Consume(ConsumeArgs),
    /// Dead letters of a group.
    #[command(subcommand)]
    Dlq(DlqCmd),
    /// MQTT sessions.
    #[command(subcommand)]
    Mqtt(MqttCmd),
    /// This node's broker group (replication).
    #[command(subcommand)]
    Replica(ReplicaCmd),
    /// Users of a running node (the offline `rocketgate user` edits the file).
    #[command(subcommand)]
    User(UserCmd),
    /// ACL rules of a running node's users.
    #[command(subcommand)]
    Acl(acl::AclCmd),
    /// Makes another broker of a group its master (controller mode): prints the new
    /// master and epoch.
    Switchover(switchover::SwitchoverArgs),
    /// Liveness and readiness (`/healthz`, `/readyz`); exit 1 when not ready.
    Health,
    /// The node's effective settings and where each came from.
    Config,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Clusters, broker groups and their addresses.
    List,
}

#[derive(Debug, Subcommand)]
pub enum BrokerCmd {
    /// Name, version, uptime, store positions, disk, role.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum TopicCmd {
    /// Topics (user topics unless --kind).
    List {
        /// `user`, `system` or `all`.
        #[arg(long, default_value = "user")]
        kind: String,
    },
    /// Where the topic lives: broker, queue counts, permission.
    Route { topic: String },
    /// Per-queue min/max offset and last store time.
    Status { topic: String },
    /// Creates a topic (on several broker groups with --brokers / --cluster).
    Create {
        topic: String,
        /// Read and write queues (per broker group).
        #[arg(long, default_value_t = 4)]
        queues: u32,
        /// `rw`, `r`, `w` or `-`.
        #[arg(long)]
        perm: Option<String>,
        #[command(flatten)]
        targets: multi::Targets,
    },
    /// Changes queue counts or permission (on several broker groups with
    /// --brokers / --cluster).
    Update {
        topic: String,
        #[arg(long)]
        read_queues: Option<u32>,
        #[arg(long)]
        write_queues: Option<u32>,
        #[arg(long)]
        perm: Option<String>,
        #[command(flatten)]
        targets: multi::Targets,
    },
    /// Deletes a topic (on several broker groups with --brokers / --cluster).
    Delete {
        topic: String,
        #[command(flatten)]
        targets: multi::Targets,
    },
}

#[derive(Debug, Subcommand)]
pub enum GroupCmd {
    /// Consumer groups.
    List,
    /// Creates a group with its settings (remembered across restarts).
    Create(GroupSettings),
    /// Changes a group's settings.
    Update(GroupSettings),
    /// Deletes a group: its settings, offsets, POP state and retry topic.
    Delete {
        group: String,
        /// Delete it even while consumers are connected (exit 1 otherwise).
        #[arg(long)]
        force: bool,
        /// Delete its dead-letter topic `%DLQ%<group>` too.
        #[arg(long)]
        dlq: bool,
    },
    /// Lag per topic and queue, and the consumers.
    Progress { group: String },
    /// Who consumes as the group, through which door.
    Connections { group: String },
}

#[derive(Debug, Args)]
pub struct GroupSettings {
    pub group: String,
    /// Retries before a message goes to the group's dead-letter queue.
    #[arg(long)]
    pub max_reconsume_times: Option<u32>,
    /// An ordered (FIFO) group: `true` or `false`.
    #[arg(long)]
    pub fifo: Option<bool>,
}

#[derive(Debug, Subcommand)]
pub enum MessageCmd {
    /// A message by its id (the publish's msg_id or the producer's unique key).
    Get { id: String },
    /// Messages of a topic by key, by store-time range or from a queue offset.
    Query(QueryArgs),
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    #[arg(long)]
    pub topic: String,
    /// A business key (KEYS) or unique key.
    #[arg(long, conflicts_with_all = ["begin", "end", "queue"])]
    pub key: Option<String>,
    /// Stored at or after: unix ms or RFC 3339 (`2026-01-02T03:04:05Z`).
    #[arg(long, conflicts_with = "queue")]
    pub begin: Option<String>,
    /// Stored at or before: unix ms or RFC 3339.
    #[arg(long, conflicts_with = "queue")]
    pub end: Option<String>,
    /// A queue id (with --offset).
    #[arg(long, requires = "offset")]
    pub queue: Option<u32>,
    /// The first queue offset to show.
    #[arg(long, requires = "queue")]
    pub offset: Option<u64>,
    /// At most this many.
    #[arg(long, default_value_t = 32)]
    pub limit: usize,
}

#[derive(Debug, Subcommand)]
pub enum OffsetCmd {
    /// Moves a group's offsets on a topic to a time (or earliest/latest).
    Reset {
        #[arg(long)]
        group: String,
        #[arg(long)]
        topic: String,
        /// Unix ms or RFC 3339: the first message stored at or after it.
        #[arg(long, required_unless_present = "to")]
        to_time: Option<String>,
        /// `earliest` or `latest`.
        #[arg(long, conflicts_with = "to_time")]
        to: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct SendArgs {
    #[arg(long)]
    pub topic: String,
    #[arg(long)]
    pub tag: Option<String>,
    /// Business keys, comma-separated.
    #[arg(long)]
    pub keys: Option<String>,
    /// The body (text).
    pub body: String,
}

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    #[arg(long)]
    pub group: String,
    #[arg(long)]
    pub topic: String,
    /// At most this many.
    #[arg(long, default_value_t = 16)]
    pub max: usize,
    /// Wait up to this long for a message.
    #[arg(long, default_value_t = 1000)]
    pub wait_ms: u64,
    /// Leave the messages unacknowledged (they come back after 30 s).
    #[arg(long)]
    pub no_ack: bool,
}

#[derive(Debug, Subcommand)]
pub enum DlqCmd {
    /// A group's dead letters.
    List {
        group: String,
        /// From this offset of the dead-letter queue.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        #[arg(long, default_value_t = 32)]
        limit: usize,
    },
    /// Sends dead letters back to their topic: one (--offset) or all (--all),
    /// with a progress bar on a terminal.
    Resend {
        group: String,
        #[arg(long, required_unless_present = "all", conflicts_with = "all")]
        offset: Option<u64>,
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum MqttCmd {
    /// Sessions, connected or offline.
    Sessions,
    /// Disconnects a client (MQTT 5: reason 0x98 Administrative action).
    Kick {
        client_id: String,
        /// Drop the session too (subscriptions, pending will).
        #[arg(long)]
        discard: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReplicaCmd {
    /// Role, in-sync set, per-slave offset and lag.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum UserCmd {
    /// Users (no secrets).
    List,
    /// Creates or changes a user.
    Add {
        name: String,
        /// The user's password (`--password` is the caller's own).
        #[arg(long)]
        new_password: Option<String>,
        /// A role (`admin`: everything); repeatable.
        #[arg(long = "role")]
        roles: Vec<String>,
    },
    /// Deletes a user.
    Delete { name: String },
    /// Makes an API key for a user (shown once).
    ApiKey { name: String },
}

/// Runs one admin command; the process exit code.
pub fn run(args: AdminArgs) -> u8 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rocketgate admin: {e}");
            return exit::USAGE;
        }
    };
    match rt.block_on(dispatch(args)) {
        Ok(()) => exit::OK,
        Err(f) => {
            eprintln!("rocketgate admin: {}", f.message);
            f.code
        }
    }
}

async fn dispatch(args: AdminArgs) -> Result<(), Failure> {
    let c = &args.conn;
    let client = Client::new(
        &c.server,
        c.api_key.as_deref(),
        c.user.as_deref(),
        c.password.as_deref(),
        c.cacert.as_deref(),
    )?;
    let json = c.json;
    use AdminCommand as A;
    match args.command {
        A::Cluster(ClusterCmd::List) => {
            let v = client.get("/v1/cluster").await?;
            if json {
                return print_json(&v);
            }
            let mut rows = Vec::new();
            for b in v["brokers"].as_array().into_iter().flatten() {
                for (id, addr) in b["addrs"].as_object().into_iter().flatten() {
                    rows.push(vec![
                        cell(&b["cluster"]),
                        cell(&b["broker_name"]),
                        id.clone(),
                        if id == "0" { "master" } else { "slave" }.into(),
                        cell(addr),
                    ]);
                }
            }
            table::print(&["CLUSTER", "BROKER", "ID", "ROLE", "ADDRESS"], rows);
        }
        A::Broker(BrokerCmd::Status) => {
            let v = client.get("/v1/broker").await?;
            if json {
                return print_json(&v);
            }
            let s = &v["store"];
            let role = v["replication"]["role"].as_str().unwrap_or("standalone");
            table::pairs(vec![
                ("broker", cell(&v["broker_name"])),
                ("cluster", cell(&v["cluster"])),
                ("version", cell(&v["version"])),
                ("role", role.into()),
                (
                    "uptime",
                    humantime::format_duration(std::time::Duration::from_secs(
                        v["uptime_ms"].as_u64().unwrap_or(0) / 1000,
                    ))
                    .to_string(),
                ),
                ("user topics", cell(&v["user_topics"])),
                ("log written", cell(&s["log_written"])),
                ("log flushed", cell(&s["log_flushed"])),
                ("log dispatched", cell(&s["log_dispatched"])),
                (
                    "disk usage",
                    format!(
                        "{:.1}% (hard limit {:.1}%)",
                        s["disk_usage"].as_f64().unwrap_or(0.0) * 100.0,
                        s["disk_hard_ratio"].as_f64().unwrap_or(0.0) * 100.0
                    ),
                ),
                ("writes stopped", cell(&s["writes_stopped"])),
            ]);
        }
        A::Topic(cmd) => topic(&client, json, cmd).await?,
        A::Group(cmd) => group(&client, json, cmd).await?,
        A::Connections => {
            let v = client.get("/v1/connections").await?;
            if json {
                return print_json(&v);
            }
            connections_table(&v);
        }
        A::Message(cmd) => message(&client, json, cmd).await?,
        A::Offset(OffsetCmd::Reset {
            group,
            topic,
            to_time,
            to,
        }) => {
            let body = match (to_time, to) {
                (Some(t), _) => {
                    json!({ "topic": topic, "to": "timestamp", "timestamp_ms": parse_time("--to-time", &t)? })
                }
                (None, Some(to)) if to == "earliest" || to == "latest" => {
                    json!({ "topic": topic, "to": to })
                }
                (None, Some(to)) => {
                    return Err(Failure::usage(format!(
                        "--to: {to:?} is not earliest or latest"
                    )));
                }
                (None, None) => return Err(Failure::usage("give --to-time or --to")),
            };
            let v = client
                .post(&format!("/v1/groups/{}/offsets/reset", enc(&group)), body)
                .await?;
            if json {
                return print_json(&v);
            }
            let rows = v["offsets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| vec![cell(&v["topic"]), cell(&o["queue_id"]), cell(&o["offset"])])
                .collect();
            table::print(&["TOPIC", "QUEUE", "OFFSET"], rows);
        }
        A::Send(s) => {
            let mut path = format!("/v1/topics/{}/messages", enc(&s.topic));
            let mut q = Vec::new();
            if let Some(t) = &s.tag {
                q.push(format!("tag={}", enc(t)));
            }
            if let Some(k) = &s.keys {
                q.push(format!("keys={}", enc(k)));
            }
            if !q.is_empty() {
                path = format!("{path}?{}", q.join("&"));
            }
            let v = client.post_bytes(&path, Bytes::from(s.body)).await?;
            if json {
                return print_json(&v);
            }
            table::pairs(vec![
                ("msg_id", cell(&v["msg_id"])),
                ("topic", cell(&v["topic"])),
                ("queue", cell(&v["queue_id"])),
                ("offset", cell(&v["queue_offset"])),
            ]);
        }
        A::Consume(a) => {
            let v = client
                .get(&format!(
                    "/v1/groups/{}/topics/{}/messages?max={}&wait_ms={}",
                    enc(&a.group),
                    enc(&a.topic),
                    a.max,
                    a.wait_ms
                ))
                .await?;
            let msgs = v["messages"].as_array().cloned().unwrap_or_default();
            if !a.no_ack && !msgs.is_empty() {
                let handles: Vec<Value> =
                    msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
                client
                    .post(
                        &format!("/v1/groups/{}/acks", enc(&a.group)),
                        json!({ "receipt_handles": handles }),
                    )
                    .await?;
            }
            if json {
                return print_json(&v);
            }
            messages_table(&msgs);
        }
        A::Dlq(cmd) => dlq(&client, json, cmd).await?,
        A::Mqtt(MqttCmd::Sessions) => {
            let v = client.get("/v1/mqtt/sessions").await?;
            if json {
                return print_json(&v);
            }
            let rows = v["sessions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    let subs: Vec<String> = s["subscriptions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|x| format!("{}@{}", cell(&x["filter"]), cell(&x["qos"])))
                        .collect();
                    vec![
                        cell(&s["client_id"]),
                        if s["connected"].as_bool() == Some(true) {
                            "yes"
                        } else {
                            "no"
                        }
                        .into(),
                        cell(&s["remote"]),
                        match s["protocol_version"].as_u64() {
                            Some(4) => "3.1.1".into(),
                            Some(5) => "5".into(),
                            _ => "-".into(),
                        },
                        cell(&s["clean_start"]),
                        match s["expiry_secs"].as_u64() {
                            Some(n) => format!("{n}s"),
                            None => "never".into(),
                        },
                        cell(&s["inflight"]),
                        subs.join(" "),
                    ]
                })
                .collect();
            table::print(
                &[
                    "CLIENT ID",
                    "CONNECTED",
                    "REMOTE",
                    "MQTT",
                    "CLEAN",
                    "EXPIRY",
                    "INFLIGHT",
                    "SUBSCRIPTIONS",
                ],
                rows,
            );
        }
        A::Mqtt(MqttCmd::Kick { client_id, discard }) => {
            let v = client
                .delete(&format!(
                    "/v1/mqtt/sessions/{}?discard={discard}",
                    enc(&client_id)
                ))
                .await?;
            if json {
                return print_json(&v);
            }
            println!(
                "{}: {}{}",
                client_id,
                if v["disconnected"].as_bool() == Some(true) {
                    "disconnected"
                } else {
                    "not connected"
                },
                if v["discarded"].as_bool() == Some(true) {
                    ", session discarded"
                } else {
                    ""
                }
            );
        }
        A::Replica(ReplicaCmd::Status) => {
            let v = client.get("/v1/broker").await?;
            let r = v["replication"].clone();
            if json {
                return print_json(&r);
            }
            if r.is_null() {
                println!("this node does not replicate");
                return Ok(());
            }
            let mut pairs = vec![
                ("role", cell(&r["role"])),
                ("broker id", cell(&r["broker_id"])),
            ];
            if r["role"] == "master" {
                pairs.push(("mode", cell(&r["mode"])));
                pairs.push(("min in-sync replicas", cell(&r["min_in_sync_replicas"])));
                pairs.push(("confirmed offset", cell(&r["confirmed_offset"])));
            } else {
                pairs.push(("master", cell(&r["master"])));
                pairs.push(("connected", cell(&r["connected"])));
                pairs.push(("lag bytes", cell(&r["lag_bytes"])));
                pairs.push(("message lag p99 ms", cell(&r["message_lag_p99_ms"])));
            }
            table::pairs(pairs);
            if r["role"] == "master" {
                println!();
                let rows = r["slaves"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| {
                        vec![
                            cell(&s["broker_id"]),
                            cell(&s["addr"]),
                            cell(&s["offset"]),
                            cell(&s["lag_bytes"]),
                            cell(&s["lag_ms"]),
                            cell(&s["in_sync"]),
                        ]
                    })
                    .collect();
                table::print(
                    &[
                        "SLAVE",
                        "ADDRESS",
                        "OFFSET",
                        "LAG BYTES",
                        "LAG MS",
                        "IN SYNC",
                    ],
                    rows,
                );
            }
        }
        A::User(cmd) => user(&client, json, cmd).await?,
        A::Acl(cmd) => acl::run(&client, json, cmd).await?,
        A::Switchover(a) => switchover::run(&client, json, a).await?,
        A::Health => {
            let live = client.get("/healthz").await?;
            let (status, body) = client.raw("GET", "/readyz", None).await?;
            let ready: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if json {
                print_json(&json!({ "healthz": live, "readyz": ready }))?;
            } else {
                let rows = ready["checks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        vec![
                            cell(&c["name"]),
                            if c["ok"].as_bool() == Some(true) {
                                "ok"
                            } else {
                                "NOT READY"
                            }
                            .into(),
                            cell(&c["detail"]),
                        ]
                    })
                    .collect();
                table::print(&["CHECK", "STATE", "DETAIL"], rows);
            }
            match status {
                200 => {}
                401 | 403 => {
                    return Err(Failure {
                        code: exit::FORBIDDEN,
                        message: format!("/readyz: HTTP {status}"),
                    });
                }
                _ => {
                    return Err(Failure::usage(format!(
                        "not ready: {}",
                        cell(&ready["not_ready"])
                    )));
                }
            }
        }
        A::Config => {
            let v = client.get("/v1/config").await?;
            if json {
                return print_json(&v);
            }
            let rows = v["settings"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| vec![cell(&s["key"]), cell(&s["value"]), cell(&s["source"])])
                .collect();
            table::print(&["KEY", "VALUE", "SOURCE"], rows);
        }
    }
    Ok(())
}

async fn topic(client: &Client, json: bool, cmd: TopicCmd) -> Result<(), Failure> {
    let topic_row = |t: &Value| {
        vec![
            cell(&t["name"]),
            cell(&t["read_queues"]),
            cell(&t["write_queues"]),
            cell(&t["perm"]),
        ]
    };
    match cmd {
        TopicCmd::List { kind } => {
            let v = client
                .get(&format!("/v1/topics?kind={}", enc(&kind)))
                .await?;
            if json {
                return print_json(&v);
            }
            let rows = v["topics"]
                .as_array()
                .into_iter()
                .flatten()
                .map(topic_row)
                .collect();
            table::print(&["TOPIC", "READ QUEUES", "WRITE QUEUES", "PERM"], rows);
        }
        TopicCmd::Route { topic } => {
            let t = client.get(&format!("/v1/topics/{}", enc(&topic))).await?;
            let b = client.get("/v1/broker").await?;
            let route = json!({
                "topic": topic,
                "brokers": [{
                    "broker_name": b["broker_name"],
                    "cluster": b["cluster"],
                    "read_queues": t["read_queues"],
                    "write_queues": t["write_queues"],
                    "perm": t["perm"],
                }],
            });
            if json {
                return print_json(&route);
            }
            let rows = route["brokers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    vec![
                        cell(&r["cluster"]),
                        cell(&r["broker_name"]),
                        cell(&r["read_queues"]),
                        cell(&r["write_queues"]),
                        cell(&r["perm"]),
                    ]
                })
                .collect();
            table::print(
                &["CLUSTER", "BROKER", "READ QUEUES", "WRITE QUEUES", "PERM"],
                rows,
            );
        }
        TopicCmd::Status { topic } => {
            let v = client
                .get(&format!("/v1/topics/{}/status", enc(&topic)))
                .await?;
            if json {
                return print_json(&v);
            }
            let rows = v["queues"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|q| {
                    vec![
                        cell(&q["queue_id"]),
                        cell(&q["min_offset"]),
                        cell(&q["max_offset"]),
                        time(&q["last_store_ms"]),
                    ]
                })
                .collect();
            table::print(
                &["QUEUE", "MIN OFFSET", "MAX OFFSET", "LAST STORED (UTC)"],
                rows,
            );
        }
        TopicCmd::Create {
            topic,
            queues,
            perm,
            targets,
        } if targets.any() => {
            let change = multi::Change::Create { queues, perm };
            multi::topic_change(client, json, &targets, &topic, change).await?;
        }
        TopicCmd::Update {
            topic,
            read_queues,
            write_queues,
            perm,
            targets,
        } if targets.any() => {
            let change = multi::Change::Update {
                read_queues,
                write_queues,
                perm,
            };
            multi::topic_change(client, json, &targets, &topic, change).await?;
        }
        TopicCmd::Delete { topic, targets } if targets.any() => {
            multi::topic_change(client, json, &targets, &topic, multi::Change::Delete).await?;
        }
        TopicCmd::Create {
            topic,
            queues,
            perm,
            ..
        } => {
            let mut body = json!({ "name": topic, "queues": queues });
            if let Some(p) = perm {
                body["perm"] = json!(p);
            }
            let v = client.post("/v1/topics", body).await?;
            if json {
                return print_json(&v);
            }
            table::print(
                &["TOPIC", "READ QUEUES", "WRITE QUEUES", "PERM"],
                vec![topic_row(&v)],
            );
        }
        TopicCmd::Update {
            topic,
            read_queues,
            write_queues,
            perm,
            ..
        } => {
            let mut body = json!({});
            if let Some(n) = read_queues {
                body["read_queues"] = json!(n);
            }
            if let Some(n) = write_queues {
                body["write_queues"] = json!(n);
            }
            if let Some(p) = perm {
                body["perm"] = json!(p);
            }
            if body.as_object().is_some_and(|o| o.is_empty()) {
                return Err(Failure::usage(
                    "nothing to change: give --read-queues, --write-queues or --perm",
                ));
            }
            let v = client
                .patch(&format!("/v1/topics/{}", enc(&topic)), body)
                .await?;
            if json {
                return print_json(&v);
            }
            table::print(
                &["TOPIC", "READ QUEUES", "WRITE QUEUES", "PERM"],
                vec![topic_row(&v)],
            );
        }
        TopicCmd::Delete { topic, .. } => {
            client
                .delete(&format!("/v1/topics/{}", enc(&topic)))
                .await?;
            if json {
                return print_json(&json!({ "deleted": topic }));
            }
            println!("deleted topic {topic}");
        }
    }
    Ok(())
}

async fn group(client: &Client, json: bool, cmd: GroupCmd) -> Result<(), Failure> {
    match cmd {
        GroupCmd::List => {
            let v = client.get("/v1/groups").await?;
            if json {
                return print_json(&v);
            }
            let rows = v["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| vec![cell(g)])
                .collect();
            table::print(&["GROUP"], rows);
        }
        GroupCmd::Create(s) | GroupCmd::Update(s) => {
            let mut body = json!({});
            if let Some(n) = s.max_reconsume_times {
                body["max_reconsume_times"] = json!(n);
            }
            if let Some(f) = s.fifo {
                body["fifo"] = json!(f);
            }
            if body.as_object().is_some_and(|o| o.is_empty()) {
                // A group exists through its settings: give it the broker's defaults.
                body["fifo"] = json!(false);
            }
            let v = client
                .patch(&format!("/v1/groups/{}", enc(&s.group)), body)
                .await?;
            if json {
                return print_json(&v);
            }
            table::pairs(vec![
                ("group", cell(&v["group"])),
                ("mode", cell(&v["mode"])),
                ("fifo", cell(&v["fifo"])),
                ("max reconsume times", cell(&v["max_reconsume_times"])),
                ("lag", cell(&v["lag"])),
            ]);
        }
        GroupCmd::Delete { group, force, dlq } => {
            let v = client
                .delete(&format!(
                    "/v1/groups/{}?force={force}&dlq={dlq}",
                    enc(&group)
                ))
                .await?;
            if json {
                return print_json(&v);
            }
            let topics: Vec<String> = v["topics"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect();
            table::pairs(vec![
                ("deleted group", cell(&v["group"])),
                ("offsets", cell(&v["offsets"])),
                ("pop queues", cell(&v["pop_queues"])),
                ("consumers dropped", cell(&v["consumers"])),
                (
                    "topics deleted",
                    if topics.is_empty() {
                        "-".to_owned()
                    } else {
                        topics.join(", ")
                    },
                ),
            ]);
        }
        GroupCmd::Progress { group } => {
            let v = client
                .get(&format!("/v1/groups/{}/progress", enc(&group)))
                .await?;
            if json {
                return print_json(&v);
            }
            let rows = v["queues"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|q| {
                    vec![
                        cell(&q["topic"]),
                        cell(&q["queue_id"]),
                        cell(&q["broker_offset"]),
                        cell(&q["consumer_offset"]),
                        cell(&q["lag"]),
                        time(&q["last_store_ms"]),
                    ]
                })
                .collect();
            table::print(
                &[
                    "TOPIC",
                    "QUEUE",
                    "BROKER OFFSET",
                    "CONSUMER OFFSET",
                    "LAG",
                    "LAST STORED (UTC)",
                ],
                rows,
            );
            println!("total lag: {}", cell(&v["lag"]));
            if v["consumers"].as_array().is_some_and(|c| !c.is_empty()) {
                println!();
                connections_table(&json!({ "connections": v["consumers"] }));
            }
        }
        GroupCmd::Connections { group } => {
            let v = client
                .get(&format!("/v1/groups/{}/connections", enc(&group)))
                .await?;
            if json {
                return print_json(&v);
            }
            connections_table(&v);
        }
    }
    Ok(())
}

async fn message(client: &Client, json: bool, cmd: MessageCmd) -> Result<(), Failure> {
    match cmd {
        MessageCmd::Get { id } => {
            let v = client.get(&format!("/v1/messages/{}", enc(&id))).await?;
            if json {
                return print_json(&v);
            }
            let props: Vec<String> = v["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, x)| format!("{k}={}", cell(x)))
                .collect();
            table::pairs(vec![
                ("msg_id", cell(&v["msg_id"])),
                ("topic", cell(&v["topic"])),
                ("queue", cell(&v["queue_id"])),
                ("offset", cell(&v["queue_offset"])),
                ("tag", cell(&v["tag"])),
                ("keys", cell(&v["keys"])),
                ("stored (UTC)", time(&v["store_timestamp"])),
                ("born host", cell(&v["born_host"])),
                ("properties", props.join(" ")),
                (
                    "body",
                    format!("({}) {}", cell(&v["body_encoding"]), cell(&v["body"])),
                ),
            ]);
        }
        MessageCmd::Query(q) => {
            let v = if let (Some(queue), Some(offset)) = (q.queue, q.offset) {
                client
                    .get(&format!(
                        "/v1/topics/{}/queues/{queue}/messages?offset={offset}&max={}",
                        enc(&q.topic),
                        q.limit
                    ))
                    .await?
            } else {
                let mut path = format!("/v1/messages?topic={}&limit={}", enc(&q.topic), q.limit);
                match (&q.key, &q.begin, &q.end) {
                    (Some(k), _, _) => path.push_str(&format!("&key={}", enc(k))),
                    (None, None, None) => {
                        return Err(Failure::usage(
                            "give --key, --begin/--end or --queue with --offset",
                        ));
                    }
                    (None, b, e) => {
                        if let Some(b) = b {
                            path.push_str(&format!("&begin={}", parse_time("--begin", b)?));
                        }
                        if let Some(e) = e {
                            path.push_str(&format!("&end={}", parse_time("--end", e)?));
                        }
                    }
                }
                client.get(&path).await?
            };
            if json {
                return print_json(&v);
            }
            messages_table(v["messages"].as_array().map(Vec::as_slice).unwrap_or(&[]));
        }
    }
    Ok(())
}

async fn dlq(client: &Client, json: bool, cmd: DlqCmd) -> Result<(), Failure> {
    match cmd {
        DlqCmd::List {
            group,
            offset,
            limit,
        } => {
            let v = client
                .get(&format!(
                    "/v1/groups/{}/dlq?offset={offset}&max={limit}",
                    enc(&group)
                ))
                .await?;
            if json {
                return print_json(&v);
            }
            messages_table(v["messages"].as_array().map(Vec::as_slice).unwrap_or(&[]));
            println!(
                "dead letters at offsets {}..{} (next page: --offset {})",
                cell(&v["min_offset"]),
                cell(&v["max_offset"]),
                cell(&v["next_offset"])
            );
        }
        DlqCmd::Resend { group, offset, all } => {
            let path = format!("/v1/groups/{}/dlq/resend", enc(&group));
            let offsets: Vec<u64> = match (offset, all) {
                (Some(o), _) => vec![o],
                (None, true) => {
                    let v = client
                        .get(&format!("/v1/groups/{}/dlq?max=1", enc(&group)))
                        .await?;
                    let (min, max) = (
                        v["min_offset"].as_u64().unwrap_or(0),
                        v["max_offset"].as_u64().unwrap_or(0),
                    );
                    (min..max).collect()
                }
                (None, false) => return Err(Failure::usage("give --offset or --all")),
            };
            if offsets.is_empty() {
                return Err(Failure {
                    code: exit::NOT_FOUND,
                    message: format!("group {group:?} has no dead letters"),
                });
            }
            // One request per dead letter: a long resend shows its progress and
            // an interrupted one says how far it got.
            let mut bar = table::Progress::new("resending", offsets.len() as u64);
            let mut resent = Vec::with_capacity(offsets.len());
            for o in offsets {
                let v = client.post(&path, json!({ "offset": o })).await?;
                resent.extend(v["resent"].as_array().cloned().unwrap_or_default());
                bar.step();
            }
            bar.finish();
            if json {
                return print_json(&json!({ "resent": resent }));
            }
            let rows = resent
                .iter()
                .map(|r| {
                    vec![
                        cell(&r["msg_id"]),
                        cell(&r["topic"]),
                        cell(&r["queue_id"]),
                        cell(&r["queue_offset"]),
                    ]
                })
                .collect();
            table::print(&["NEW MSG ID", "TOPIC", "QUEUE", "OFFSET"], rows);
        }
    }
    Ok(())
}

async fn user(client: &Client, json: bool, cmd: UserCmd) -> Result<(), Failure> {
    let v = match cmd {
        UserCmd::List => client.get("/v1/users").await?,
        UserCmd::Add {
            name,
            new_password,
            roles,
        } => {
            let mut body = json!({});
            if let Some(p) = new_password {
                body["password"] = json!(p);
            }
            if !roles.is_empty() {
                body["roles"] = json!(roles);
            }
            client
                .put(&format!("/v1/users/{}", enc(&name)), body)
                .await?
        }
        UserCmd::Delete { name } => client.delete(&format!("/v1/users/{}", enc(&name))).await?,
        UserCmd::ApiKey { name } => {
            client
                .post(&format!("/v1/users/{}/api_keys", enc(&name)), json!({}))
                .await?
        }
    };
    let _ = json;
    print_json(&v)
}

/// `--json`: the server's answer, pretty.
fn print_json(v: &Value) -> Result<(), Failure> {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    Ok(())
}

fn connections_table(v: &Value) {
    let rows = v["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            vec![
                cell(&c["door"]),
                cell(&c["client_id"]),
                cell(&c["remote"]),
                cell(&c["groups"]),
                cell(&c["subscriptions"]),
                time(&c["since_ms"]),
                time(&c["last_seen_ms"]),
            ]
        })
        .collect();
    table::print(
        &[
            "DOOR",
            "CLIENT",
            "REMOTE",
            "GROUPS",
            "SUBSCRIPTIONS",
            "SINCE (UTC)",
            "LAST SEEN (UTC)",
        ],
        rows,
    );
}

fn messages_table(msgs: &[Value]) {
    let rows = msgs
        .iter()
        .map(|m| {
            let mut body = cell(&m["body"]);
            if body.chars().count() > 40 {
                body = body.chars().take(40).collect::<String>() + "…";
            }
            vec![
                cell(&m["msg_id"]),
                cell(&m["queue_id"]),
                cell(&m["queue_offset"]),
                time(&m["store_timestamp"]),
                cell(&m["tag"]),
                cell(&m["keys"]),
                body.replace('\n', "\\n"),
            ]
        })
        .collect();
    table::print(
        &[
            "MSG ID",
            "QUEUE",
            "OFFSET",
            "STORED (UTC)",
            "TAG",
            "KEYS",
            "BODY",
        ],
        rows,
    );
}

/// Unix ms, or an RFC 3339 time.
fn parse_time(flag: &str, s: &str) -> Result<i64, Failure> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(s)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .ok_or_else(|| {
            Failure::usage(format!(
                "{flag}: {s:?} is neither unix ms nor an RFC 3339 time (2026-01-02T03:04:05Z)"
            ))
        })
}
