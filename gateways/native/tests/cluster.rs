//! The broker API over several broker groups (`rocketgate_native::cluster`): two or
//! three in-process local brokers as the members, routes read from their own topic
//! tables (`MemberRoutes`), and one test of the NameServer route source over the
//! socket against a real NameServer with two registered brokers.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketgate_core::Error;
use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    Broker, BrokerSettings, ConsumeMode, HalfMessage, Heartbeat, MessagingApi, OffsetReset,
    PopRequest, Popped, PullRequest, PullStatus, QueueChoice, Resolution, Subscription,
    SystemClock, TopicConfig, TransactionChecker,
};
use rocketgate_core::store::record::property;
use rocketgate_core::store::{DiskSpace, Message, Store, StoreDeps, StoreSettings};
use rocketgate_native::cluster::{
    BrokerAddr, Cluster, ClusterSettings, MemberRoutes, NameServerRoutes, RouteSource,
};

const WAIT: Duration = Duration::from_secs(20);

/// A disk whose usage the test sets (percent): above 90 the store refuses appends.
struct Gauge(AtomicU64);

impl DiskSpace for Gauge {
    fn usage_ratio(&self, _: &Path) -> std::io::Result<f64> {
        Ok(self.0.load(Ordering::SeqCst) as f64 / 100.0)
    }
}

/// One broker group: a local broker whose store host is its "address".
struct Group {
    name: String,
    addr: String,
    broker: Arc<Broker>,
    disk: Arc<Gauge>,
    _dir: tempfile::TempDir,
}

impl Group {
    fn open(name: &str, port: u16) -> Group {
        let dir = tempfile::tempdir().unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let disk = Arc::new(Gauge(AtomicU64::new(10)));
        let deps = StoreDeps {
            disk: disk.clone(),
            ..StoreDeps::fixed_usage(0.1)
        };
        let settings = StoreSettings {
            segment_size: 16 << 20,
            store_host: addr,
            ..StoreSettings::default()
        };
        let (store, _) = Store::open(dir.path(), settings, deps).unwrap();
        let broker = Broker::open(
            Arc::new(store),
            BrokerSettings {
                // Undecided halves are checked back after 300 ms, not seconds.
                transaction_timeout: Duration::from_millis(300),
                ..BrokerSettings::default()
            },
            Arc::new(SystemClock),
        )
        .unwrap();
        Group {
            name: name.into(),
            addr: addr.to_string(),
            broker: Arc::new(broker),
            disk,
            _dir: dir,
        }
    }

    /// Sets the disk usage and lets the store notice (95: appends refused).
    fn set_disk(&self, percent: u64) {
        self.disk.0.store(percent, Ordering::SeqCst);
        self.broker.store().run_retention().unwrap();
    }

    /// Messages stored in the broker's queues of `topic` (max offsets summed).
    async fn stored(&self, topic: &str) -> u64 {
        self.broker.sync_visible().await;
        match self.broker.queue_stats(topic).await {
            Ok(s) => s.iter().map(|q| q.max_offset - q.min_offset).sum(),
            Err(_) => 0,
        }
    }
}

type Routes = Arc<MemberRoutes<Broker>>;

struct Setup {
    groups: Vec<Group>,
    routes: Routes,
    cluster: Cluster<Broker, Routes>,
    /// Addresses the factory was asked for, in order.
    made: Arc<Mutex<Vec<String>>>,
}

async fn setup(names: &[&str], settings: ClusterSettings) -> Setup {
    let groups: Vec<Group> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Group::open(n, 20001 + i as u16))
        .collect();
    let routes: Routes = Arc::new(MemberRoutes::new());
    for g in &groups {
        routes.add(&g.name, &g.addr, g.broker.clone());
    }
    let made = Arc::new(Mutex::new(Vec::new()));
    let cluster = {
        let routes = routes.clone();
        let made = made.clone();
        Cluster::start(routes.clone(), settings, move |b: &BrokerAddr| {
            made.lock().unwrap().push(b.addr.clone());
            let m = routes.member(&b.addr);
            let addr = b.addr.clone();
            async move { m.ok_or_else(|| Error::InvalidArgument(format!("no broker at {addr}"))) }
        })
        .await
    };
    Setup {
        groups,
        routes,
        cluster,
        made,
    }
}

fn fast() -> ClusterSettings {
    ClusterSettings {
        refresh: Duration::from_millis(100),
        pause: Duration::from_millis(300),
    }
}

fn msg(topic: &str, body: &str) -> Message {
    Message::new(topic, 0, body.as_bytes().to_vec())
}

fn pop_req(group: &str, topic: &str, max: usize, wait: Duration) -> PopRequest {
    PopRequest {
        group: group.into(),
        topic: topic.into(),
        filter: Filter::all(),
        max_messages: max,
        invisible: Duration::from_secs(30),
        wait,
    }
}

fn body(p: &Popped) -> String {
    String::from_utf8(p.message.view().unwrap().body().to_vec()).unwrap()
}

/// Two groups with `topic` of 4 queues each.
async fn two_groups(topic: &str) -> Setup {
    let s = setup(&["broker-a", "broker-b"], fast()).await;
    s.cluster
        .create_topic(TopicConfig::new(topic, 4))
        .await
        .unwrap();
    s
}

/// The HTTP door's PATCH reads the topic (the totals over the groups), changes the
/// permission and writes it back: each group must keep its own queue counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_change_through_the_cluster_keeps_each_groups_queues() {
    let s = two_groups("P").await;
    let mut t = s.cluster.topic("P").await.unwrap();
    assert_eq!((t.read_queues, t.write_queues), (8, 8));
    t.perm = rocketgate_core::broker::Perm::READ;
    s.cluster.update_topic(t).await.unwrap();
    for g in &s.groups {
        let own = g.broker.topic("P").await.unwrap();
        assert_eq!(
            (own.read_queues, own.write_queues, own.perm),
            (4, 4, rocketgate_core::broker::Perm::READ),
            "{}",
            g.name
        );
    }
    // A count that is not the total is each group's, as RocketMQ's `updateTopic -c`.
    let mut t = s.cluster.topic("P").await.unwrap();
    t.write_queues = 2;
    s.cluster.update_topic(t).await.unwrap();
    for g in &s.groups {
        let own = g.broker.topic("P").await.unwrap();
        assert_eq!((own.read_queues, own.write_queues), (4, 2), "{}", g.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_on_two_groups_is_one_range_of_queues() {
    let s = two_groups("T").await;
    for g in &s.groups {
        assert_eq!(
            g.broker.topic("T").await.unwrap().read_queues,
            4,
            "{}",
            g.name
        );
    }
    let t = s.cluster.topic("T").await.unwrap();
    assert_eq!((t.read_queues, t.write_queues), (8, 8));
    let route = s.cluster.route("T").await.unwrap();
    assert_eq!(route.base("broker-a"), Some(0));
    assert_eq!(route.base("broker-b"), Some(4));
    let names: Vec<String> = s
        .cluster
        .topics(Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|t| format!("{}:{}", t.name, t.read_queues))
        .collect();
    assert_eq!(names, vec!["T:8"]);
    // Created everywhere already: the refusal is the answer.
    let err = s
        .cluster
        .create_topic(TopicConfig::new("T", 4))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TopicExists { .. }), "{err}");
    // Unknown topics are unknown.
    let err = s.cluster.topic("nope").await.unwrap_err();
    assert!(matches!(err, Error::TopicNotFound { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_sends_spread_over_both_groups() {
    let s = two_groups("RR").await;
    let mut queues = BTreeMap::new();
    for i in 0..32 {
        let sent = s
            .cluster
            .send(msg("RR", &format!("m{i}")), QueueChoice::RoundRobin)
            .await
            .unwrap();
        *queues.entry(sent.queue_id).or_insert(0) += 1;
    }
    assert_eq!(
        queues.keys().copied().collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert!(queues.values().all(|n| *n == 4), "{queues:?}");
    assert_eq!(s.groups[0].stored("RR").await, 16);
    assert_eq!(s.groups[1].stored("RR").await, 16);
    // A batch lands contiguously in one queue, with the global id.
    let batch = (0..3).map(|i| msg("RR", &format!("b{i}"))).collect();
    let sent = s
        .cluster
        .send_batch(batch, QueueChoice::Queue(6))
        .await
        .unwrap();
    assert!(sent.iter().all(|r| r.queue_id == 6), "{sent:?}");
    assert_eq!(s.groups[1].stored("RR").await, 19);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharding_key_always_maps_to_the_same_queue() {
    let s = two_groups("SK").await;
    let mut by_key: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for round in 0..3 {
        for k in 0..16 {
            let key = format!("order-{k}");
            let sent = s
                .cluster
                .send(
                    msg("SK", &format!("{key}/{round}")),
                    QueueChoice::ShardingKey(key.clone()),
                )
                .await
                .unwrap();
            by_key.entry(key).or_default().insert(sent.queue_id);
        }
    }
    assert!(by_key.values().all(|q| q.len() == 1), "{by_key:?}");
    let used: BTreeSet<u32> = by_key.values().flatten().copied().collect();
    assert!(
        used.iter().any(|q| *q < 4) && used.iter().any(|q| *q >= 4),
        "{used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_offsets_and_stats_translate_queue_ids() {
    let s = two_groups("P").await;
    // Global queue 5 is broker-b's local queue 1.
    for i in 0..3 {
        let sent = s
            .cluster
            .send(msg("P", &format!("p{i}")), QueueChoice::Queue(5))
            .await
            .unwrap();
        assert_eq!((sent.queue_id, sent.append.queue_offset), (5, i));
    }
    s.cluster.sync_visible().await;
    let b = &s.groups[1].broker;
    let local = b.queue_stats("P").await.unwrap();
    assert_eq!(local[1].max_offset, 3);
    let pulled = s
        .cluster
        .pull(PullRequest {
            group: "g".into(),
            member: "m".into(),
            topic: "P".into(),
            queue_id: 5,
            offset: 1,
            max_messages: 10,
            filter: Filter::all(),
            wait: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(pulled.status, PullStatus::Found);
    assert_eq!(pulled.messages.len(), 2);
    assert!(pulled.messages.iter().all(|d| d.queue_id == 5));
    assert_eq!((pulled.next_offset, pulled.max_offset), (3, 3));

    s.cluster.commit_offset("g", "m", "P", 5, 2).await.unwrap();
    assert_eq!(b.query_offset("g", "m", "P", 1).await.unwrap(), Some(2));
    assert_eq!(
        s.cluster.query_offset("g", "m", "P", 5).await.unwrap(),
        Some(2)
    );
    assert_eq!(
        s.cluster.query_offset("g", "m", "P", 1).await.unwrap(),
        None
    );

    let stats = s.cluster.queue_stats("P").await.unwrap();
    let ids: Vec<u32> = stats.iter().map(|q| q.queue_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert_eq!(stats[5].max_offset, 3);
    assert_eq!(s.cluster.offset_by_time("P", 5, 0).await.unwrap(), 0);

    let moved = s
        .cluster
        .reset_offset("g", "m", "P", OffsetReset::Latest)
        .await
        .unwrap();
    assert_eq!(
        moved.iter().map(|(q, _)| *q).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert_eq!(moved[5], (5, 3));

    for member in ["m", "other"] {
        s.cluster
            .heartbeat(Heartbeat {
                group: "g".into(),
                member: member.into(),
                mode: ConsumeMode::Clustering,
                subscriptions: vec![Subscription::tag("P", "*")],
            })
            .await
            .unwrap();
    }
    s.cluster.lock_queue("g", "m", "P", 6).await.unwrap();
    let err = b.lock_queue("g", "other", "P", 2).await.unwrap_err();
    assert!(matches!(err, Error::QueueLocked { .. }), "{err}");
    s.cluster.unlock_queue("g", "m", "P", 6).await.unwrap();

    let err = s
        .cluster
        .send(msg("P", "x"), QueueChoice::Queue(8))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::QueueNotFound { queues: 8, .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pop_reaches_both_groups_and_acks_go_through_named_receipts() {
    let s = two_groups("Q").await;
    for i in 0..10 {
        s.cluster
            .send(msg("Q", &format!("q{i}")), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    s.cluster.sync_visible().await;
    let mut got: BTreeMap<String, Popped> = BTreeMap::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < 10 {
        assert!(Instant::now() < deadline, "only {} popped", got.len());
        for p in s
            .cluster
            .pop(pop_req("cg", "Q", 3, Duration::from_millis(200)))
            .await
            .unwrap()
        {
            assert!(got.insert(body(&p), p).is_none(), "popped twice");
        }
    }
    let brokers: BTreeSet<String> = got
        .values()
        .map(|p| p.receipt.broker.clone().unwrap())
        .collect();
    assert_eq!(
        brokers,
        BTreeSet::from(["broker-a".into(), "broker-b".into()])
    );
    for p in got.values() {
        let handle = p.receipt.to_string();
        assert!(handle.starts_with("v2:broker-"), "{handle}");
        assert!(
            handle
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ":-_%|".contains(c)),
            "{handle} is a plain token"
        );
        let owner = if p.receipt.broker.as_deref() == Some("broker-a") {
            0
        } else {
            4
        };
        assert!(
            (owner..owner + 4).contains(&p.message.queue_id),
            "global queue id"
        );
    }
    // One is given a new deadline (the old handle goes stale), one nacked, the rest acked.
    let mut handles: Vec<String> = got.values().map(|p| p.receipt.to_string()).collect();
    let renewed = s
        .cluster
        .change_invisibility(&handles[0], Duration::from_secs(60))
        .await
        .unwrap();
    assert!(renewed.broker.is_some());
    let err = s.cluster.ack(&handles[0]).await.unwrap_err();
    assert!(matches!(err, Error::StaleReceiptHandle { .. }), "{err}");
    handles[0] = renewed.to_string();
    let nacked = handles.pop().unwrap();
    s.cluster.nack(&nacked, Duration::ZERO).await.unwrap();
    for h in &handles {
        s.cluster.ack(h).await.unwrap();
    }
    // Only the nacked one comes back; then nothing.
    let again = s
        .cluster
        .pop(pop_req("cg", "Q", 10, Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].receipt.attempt, 2);
    s.cluster.ack(&again[0].receipt.to_string()).await.unwrap();
    let none = s
        .cluster
        .pop(pop_req("cg", "Q", 10, Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(none.is_empty());
    // A handle naming no broker, or a garbled one, is refused clearly.
    let plain = rocketgate_core::broker::ReceiptHandle {
        broker: None,
        ..again[0].receipt.clone()
    };
    let err = s.cluster.ack(&plain.to_string()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidReceiptHandle { .. }), "{err}");
    let err = s.cluster.ack("v2:broker-a:junk").await.unwrap_err();
    assert!(matches!(err, Error::InvalidReceiptHandle { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_wakes_for_either_group_and_loses_nothing() {
    let s = two_groups("L").await;
    for (queue, group) in [(1u32, 0usize), (6, 1)] {
        // A long poll while both groups are empty; the message lands in one of them.
        let cluster = s.cluster.clone();
        let poll = tokio::spawn(async move {
            let started = Instant::now();
            let p = cluster
                .pop(pop_req("lp", "L", 1, Duration::from_secs(10)))
                .await
                .unwrap();
            (p, started.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = s
            .cluster
            .send(msg("L", &format!("to {group}")), QueueChoice::Queue(queue))
            .await
            .unwrap();
        let (p, took) = poll.await.unwrap();
        assert_eq!(p.len(), 1, "group {group}");
        assert_eq!(p[0].message.queue_id, sent.queue_id);
        assert!(
            took < Duration::from_secs(8),
            "woken by the send ({took:?})"
        );
        s.cluster.ack(&p[0].receipt.to_string()).await.unwrap();
    }
    // Messages arriving in both groups during one long poll: the poll takes one,
    // the other is not lost (kept for the next POP, or still in its group).
    let cluster = s.cluster.clone();
    let poll = tokio::spawn(async move {
        cluster
            .pop(pop_req("lp", "L", 1, Duration::from_secs(10)))
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.cluster
        .send(msg("L", "x"), QueueChoice::Queue(0))
        .await
        .unwrap();
    s.cluster
        .send(msg("L", "y"), QueueChoice::Queue(7))
        .await
        .unwrap();
    let mut seen: Vec<String> = poll.await.unwrap().iter().map(body).collect();
    let deadline = Instant::now() + WAIT;
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "lost: got only {seen:?}");
        for p in s
            .cluster
            .pop(pop_req("lp", "L", 5, Duration::from_millis(500)))
            .await
            .unwrap()
        {
            seen.push(body(&p));
            s.cluster.ack(&p.receipt.to_string()).await.unwrap();
        }
    }
    seen.sort();
    assert_eq!(seen, vec!["x", "y"]);

    // A door that stops waiting (its POP future dropped) loses nothing: the
    // abandoned polls' catch is the next POP's.
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        s.cluster
            .pop(pop_req("lp", "L", 1, Duration::from_secs(10))),
    )
    .await;
    assert!(dropped.is_err(), "nothing to pop yet");
    s.cluster
        .send(msg("L", "z"), QueueChoice::Queue(3))
        .await
        .unwrap();
    let next = s
        .cluster
        .pop(pop_req("lp", "L", 5, Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(next.iter().map(body).collect::<Vec<_>>(), vec!["z"]);
    s.cluster.ack(&next[0].receipt.to_string()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_assignment_covers_every_queue_exactly_once() {
    let s = two_groups("A").await;
    for member in ["door-1", "door-2"] {
        s.cluster
            .heartbeat(Heartbeat {
                group: "shared".into(),
                member: member.into(),
                mode: ConsumeMode::Clustering,
                subscriptions: vec![Subscription::tag("A", "*")],
            })
            .await
            .unwrap();
    }
    for g in &s.groups {
        let info = g.broker.group_info("shared").await.unwrap();
        assert_eq!(info.members.len(), 2, "{} knows both members", g.name);
    }
    let one = s.cluster.assignment("shared", "door-1", "A").await.unwrap();
    let two = s.cluster.assignment("shared", "door-2", "A").await.unwrap();
    let mut all: Vec<u32> = one.iter().chain(&two).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..8).collect::<Vec<_>>(), "{one:?} + {two:?}");
    assert_eq!((one.len(), two.len()), (4, 4));

    let info = s.cluster.group_info("shared").await.unwrap();
    assert_eq!(info.members.len(), 2);
    assert!(
        s.cluster
            .groups()
            .await
            .unwrap()
            .contains(&"shared".to_string())
    );
    s.cluster.set_fifo("shared", true).await.unwrap();
    for g in &s.groups {
        assert!(g.broker.group_info("shared").await.unwrap().fifo);
    }
    s.cluster.unregister("shared", "door-2").await.unwrap();
    let one = s.cluster.assignment("shared", "door-1", "A").await.unwrap();
    assert_eq!(one, (0..8).collect::<Vec<_>>());
    let err = s.cluster.group_info("nobody").await.unwrap_err();
    assert!(matches!(err, Error::GroupNotFound { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_on_all_groups_or_on_chosen_ones() {
    let s = setup(&["broker-a", "broker-b", "broker-c"], fast()).await;
    let out = s
        .cluster
        .create_topic_on(
            &["broker-c", "broker-a", "broker-x"],
            TopicConfig::new("Some", 2),
        )
        .await;
    let summary: Vec<(String, bool)> = out.iter().map(|(b, r)| (b.clone(), r.is_ok())).collect();
    assert_eq!(
        summary,
        vec![
            ("broker-a".into(), true),
            ("broker-c".into(), true),
            ("broker-x".into(), false)
        ]
    );
    assert!(s.groups[1].broker.topic("Some").await.is_err());
    let route = s.cluster.route("Some").await.unwrap();
    assert_eq!(route.base("broker-c"), Some(2));
    assert_eq!(s.cluster.topic("Some").await.unwrap().read_queues, 4);

    // On every group: the ones that had it already are fine.
    let t = s
        .cluster
        .create_topic(TopicConfig::new("Some", 2))
        .await
        .unwrap();
    assert_eq!(t.read_queues, 6);
    let t = s
        .cluster
        .update_topic(TopicConfig::new("Some", 3))
        .await
        .unwrap();
    assert_eq!(t.read_queues, 9);
    s.cluster.delete_topic("Some").await.unwrap();
    for g in &s.groups {
        assert!(g.broker.topic("Some").await.is_err(), "{}", g.name);
    }
    let err = s.cluster.delete_topic("Some").await.unwrap_err();
    assert!(matches!(err, Error::TopicNotFound { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_move_off_a_group_that_cannot_write_and_nothing_acked_is_lost() {
    let s = two_groups("F").await;
    s.groups[0].set_disk(95);
    let mut acked = Vec::new();
    for i in 0..20 {
        // Every send succeeds in one call: a refused one is retried on broker-b.
        let sent = s
            .cluster
            .send(msg("F", &format!("f{i}")), QueueChoice::RoundRobin)
            .await
            .unwrap();
        assert!(sent.queue_id >= 4, "on broker-b: {sent:?}");
        acked.push(format!("f{i}"));
    }
    assert_eq!(s.groups[0].stored("F").await, 0);
    assert_eq!(s.groups[1].stored("F").await, 20);
    // An explicit queue on the refusing group is not moved (its order would break).
    let err = s
        .cluster
        .send(msg("F", "pinned"), QueueChoice::Queue(0))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err}");
    // Every acked message is there to consume.
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while seen.len() < acked.len() {
        assert!(Instant::now() < deadline, "only {} of 20", seen.len());
        for p in s
            .cluster
            .pop(pop_req("fc", "F", 16, Duration::from_millis(300)))
            .await
            .unwrap()
        {
            seen.insert(body(&p));
            s.cluster.ack(&p.receipt.to_string()).await.unwrap();
        }
    }
    assert_eq!(seen, acked.into_iter().collect());
    // Back to normal: after the pause both groups take sends again.
    s.groups[0].set_disk(10);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut on_a = 0;
    for i in 0..8 {
        let sent = s
            .cluster
            .send(msg("F", &format!("g{i}")), QueueChoice::RoundRobin)
            .await
            .unwrap();
        on_a += usize::from(sent.queue_id < 4);
    }
    assert_eq!(on_a, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_and_a_new_master_address_are_picked_up() {
    let mut s = two_groups("N").await;
    // Registered before the group joins: it reaches the new group too.
    let checks = Arc::new(Checks(Mutex::new(Vec::new())));
    let _reg = s
        .cluster
        .register_transaction_checker("pg", checks.clone())
        .await
        .unwrap();
    let c = Group::open("broker-c", 20013);
    c.broker
        .create_topic(TopicConfig::new("N", 4))
        .await
        .unwrap();
    s.routes.add(&c.name, &c.addr, c.broker.clone());
    let deadline = Instant::now() + WAIT;
    while s.cluster.topic("N").await.unwrap().read_queues != 12 {
        assert!(Instant::now() < deadline, "the new group never showed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut groups = BTreeSet::new();
    for i in 0..12 {
        let sent = s
            .cluster
            .send(msg("N", &format!("n{i}")), QueueChoice::RoundRobin)
            .await
            .unwrap();
        groups.insert(sent.queue_id / 4);
    }
    assert_eq!(groups, BTreeSet::from([0, 1, 2]));
    assert_eq!(c.stored("N").await, 4);
    let half = s
        .cluster
        .send_half("pg", msg("N", "undecided on c"), QueueChoice::Queue(9))
        .await
        .unwrap();
    assert_eq!(half.transaction.broker.as_deref(), Some("broker-c"));
    let deadline = Instant::now() + WAIT;
    loop {
        c.broker.check_transactions().await.unwrap();
        let heard = checks.0.lock().unwrap().iter().any(|h| {
            h.handle.broker.as_deref() == Some("broker-c")
                && h.handle.commit_log_offset == half.transaction.commit_log_offset
        });
        if heard {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new group's check never came"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // broker-b's master moves (failover): a new member is made for the new address.
    let b2 = Group::open("broker-b", 20022);
    b2.broker
        .create_topic(TopicConfig::new("N", 4))
        .await
        .unwrap();
    s.routes.add("broker-b", &b2.addr, b2.broker.clone());
    let deadline = Instant::now() + WAIT;
    loop {
        let sent = s
            .cluster
            .send(msg("N", "after failover"), QueueChoice::Queue(5))
            .await
            .unwrap();
        assert_eq!(sent.queue_id, 5);
        if b2.stored("N").await > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the new master never got a send");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(s.made.lock().unwrap().contains(&b2.addr));
    s.groups.push(c);
    s.groups.push(b2);
}

/// Records the check-backs it gets.
struct Checks(Mutex<Vec<HalfMessage>>);

impl TransactionChecker for Checks {
    fn check(&self, half: HalfMessage) {
        self.0.lock().unwrap().push(half);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_and_lookups_reach_the_group_that_holds_the_message() {
    let s = two_groups("X").await;
    // Half messages: the handle names its group; commit makes it visible there.
    let half = s
        .cluster
        .send_half("pg", msg("X", "half"), QueueChoice::Queue(6))
        .await
        .unwrap();
    assert_eq!(half.transaction.broker.as_deref(), Some("broker-b"));
    assert_eq!(half.sent.queue_id, 6);
    let handle: rocketgate_core::broker::TransactionHandle =
        half.transaction.to_string().parse().unwrap();
    let committed = s
        .cluster
        .end_transaction(&handle, Resolution::Commit)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(committed.queue_id, 6);
    let err = s
        .cluster
        .end_transaction(&handle, Resolution::Commit)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TransactionEnded { .. }), "{err}");

    // A checker registered through the cluster hears both groups, with named handles.
    let checks = Arc::new(Checks(Mutex::new(Vec::new())));
    let _reg = s
        .cluster
        .register_transaction_checker("pg", checks.clone())
        .await
        .unwrap();
    for q in [1, 5] {
        s.cluster
            .send_half(
                "pg",
                msg("X", &format!("undecided {q}")),
                QueueChoice::Queue(q),
            )
            .await
            .unwrap();
    }
    let deadline = Instant::now() + WAIT;
    loop {
        for g in &s.groups {
            g.broker.check_transactions().await.unwrap();
        }
        let named: BTreeSet<String> = checks
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|h| h.handle.broker.clone())
            .collect();
        if named.len() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "checks named {named:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first = checks.0.lock().unwrap()[0].handle.clone();
    assert!(
        s.cluster
            .end_transaction(&first, Resolution::Rollback)
            .await
            .unwrap()
            .is_none()
    );

    // Lookups: by offset id (its store host names the group), by key, by time.
    let sent = s
        .cluster
        .send(msg("X", "findme").with_keys(["k-1"]), QueueChoice::Queue(7))
        .await
        .unwrap();
    s.cluster
        .send(
            msg("X", "findme too").with_keys(["k-1"]),
            QueueChoice::Queue(2),
        )
        .await
        .unwrap();
    s.cluster.sync_visible().await;
    let found = s.cluster.message_by_id(&sent.append.msg_id).await.unwrap();
    assert_eq!((found.queue_id, found.queue_offset), (7, 0));
    let by_key = s.cluster.messages_by_key("X", "k-1", 10).await.unwrap();
    let mut qs: Vec<u32> = by_key.iter().map(|d| d.queue_id).collect();
    qs.sort_unstable();
    assert_eq!(qs, vec![2, 7]);
    let by_time = s
        .cluster
        .messages_by_time("X", 0, i64::MAX, 100)
        .await
        .unwrap();
    assert!(by_time.len() >= 3, "{}", by_time.len());
    let err = s.cluster.message_by_id("nope").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::MessageNotFound { .. } | Error::InvalidArgument(_)
        ),
        "{err}"
    );

    // Delayed messages: listed with global ids, cancelled on their group.
    let delayed = s
        .cluster
        .send(
            msg("X", "later").with_property(property::DELAY_TIME_LEVEL, "3"),
            QueueChoice::Queue(4),
        )
        .await
        .unwrap();
    let listed = s.cluster.delayed("X", 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].queue_id, 4);
    let cancelled = s
        .cluster
        .cancel_delayed(&delayed.append.msg_id)
        .await
        .unwrap();
    assert_eq!(cancelled.queue_id, 4);
    assert!(s.cluster.delayed("X", 10).await.unwrap().is_empty());
    assert_eq!(s.cluster.delay_limits(), s.groups[0].broker.delay_limits());
}

/// A broker group registered with a real NameServer: a local broker, no server
/// (the NameServer never calls a broker), its registrar sending its topics.
struct Registered {
    group: Group,
    registrar: rocketgate_remoting::RegistrarHandle,
}

fn register(group: Group, namesrv: &str) -> Registered {
    use rocketgate_remoting::protocol::WireTopicConfig as WireTopic;
    use rocketgate_remoting::{BrokerIdentity, Registrar};
    let b = group.broker.clone();
    let topics = move || {
        b.route_snapshot()
            .into_iter()
            .map(|t| {
                let mut w = WireTopic::new(t.name, t.write_queues);
                w.read_queue_nums = t.read_queues;
                w.perm = u32::from(t.perm.0);
                w
            })
            .collect::<Vec<_>>()
    };
    let registrar = Registrar::new(
        BrokerIdentity {
            cluster: "DefaultCluster".into(),
            name: group.name.clone(),
            id: 0,
            addr: group.addr.clone(),
            ha_addr: String::new(),
        },
        vec![namesrv.to_owned()],
        Duration::from_secs(30),
        Arc::new(topics),
    )
    .spawn();
    Registered { group, registrar }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_come_from_the_nameservers() {
    use rocketgate_namesrv::{NameServer, NamesrvSettings};
    let (ns, ns_addr) =
        NameServer::bind("127.0.0.1:0".parse().unwrap(), NamesrvSettings::default())
            .await
            .unwrap();
    let _ns = ns.spawn();
    let namesrv = ns_addr.to_string();
    let groups: Vec<Registered> = [("broker-a", 20031), ("broker-b", 20032)]
        .into_iter()
        .map(|(n, p)| register(Group::open(n, p), &namesrv))
        .collect();
    let source = NameServerRoutes::new(
        rocketgate_native::client::ClientSettings::new([namesrv.clone()])
            .with_request_timeout(Duration::from_secs(2)),
    );
    let deadline = Instant::now() + WAIT;
    loop {
        let brokers = source.brokers().await.unwrap();
        if brokers.len() == 2 {
            assert_eq!(brokers[0].name, "broker-a");
            assert_eq!(brokers[1].addr, groups[1].group.addr);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "brokers never registered: {brokers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let by_addr: BTreeMap<String, Arc<Broker>> = groups
        .iter()
        .map(|r| (r.group.addr.clone(), r.group.broker.clone()))
        .collect();
    let by_addr_late = Arc::new(Mutex::new(by_addr));
    let lookup = by_addr_late.clone();
    let cluster = Cluster::start(source, fast(), move |b: &BrokerAddr| {
        let m = lookup.lock().unwrap().get(&b.addr).cloned();
        async move { m.ok_or_else(|| Error::InvalidArgument("unknown broker".into())) }
    })
    .await;
    // The topic on both groups, then the registrars tell the NameServer.
    let created = cluster
        .create_topic(TopicConfig::new("NS", 2))
        .await
        .unwrap();
    assert_eq!(created.read_queues, 4);
    for r in &groups {
        (r.registrar.trigger())();
    }
    let deadline = Instant::now() + WAIT;
    loop {
        match cluster.refresh_route("NS").await.unwrap() {
            Some(r) if r.placements().len() == 2 => break,
            other => assert!(Instant::now() < deadline, "route never complete: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cluster.topic("NS").await.unwrap().read_queues, 4);
    let route = cluster.route("NS").await.unwrap();
    assert_eq!(route.placements()[1].addr, groups[1].group.addr);
    let mut sent_to = BTreeSet::new();
    for i in 0..4 {
        let sent = cluster
            .send(msg("NS", &format!("ns{i}")), QueueChoice::RoundRobin)
            .await
            .unwrap();
        sent_to.insert(sent.queue_id);
    }
    assert_eq!(sent_to, BTreeSet::from([0, 1, 2, 3]));
    for r in &groups {
        assert_eq!(r.group.stored("NS").await, 2, "{}", r.group.name);
    }
    // Failover: broker-b's master goes, a new one registers at another address; the
    // route names it within a refresh and its sends go to a member made for it.
    let mut groups = groups;
    let old_b = groups.remove(1);
    old_b.registrar.stop().await;
    let new_b = Group::open("broker-b", 20033);
    new_b
        .broker
        .create_topic(TopicConfig::new("NS", 2))
        .await
        .unwrap();
    let new_addr = new_b.addr.clone();
    by_addr_late
        .lock()
        .unwrap()
        .insert(new_addr.clone(), new_b.broker.clone());
    let new_b = register(new_b, &namesrv);
    (new_b.registrar.trigger())();
    let deadline = Instant::now() + WAIT;
    loop {
        let route = cluster.route("NS").await.unwrap();
        if route.placements().iter().any(|p| p.addr == new_addr) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new master never showed: {route:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = cluster
        .send(msg("NS", "after failover"), QueueChoice::Queue(3))
        .await
        .unwrap();
    assert_eq!(sent.queue_id, 3);
    assert_eq!(new_b.group.stored("NS").await, 1);
    assert_eq!(
        old_b.group.stored("NS").await,
        2,
        "nothing more on the old master"
    );

    // An unknown topic has no route; a dead NameServer is an "unavailable" error.
    assert!(cluster.refresh_route("none").await.unwrap().is_none());
    let dead = NameServerRoutes::new(
        rocketgate_native::client::ClientSettings::new(["127.0.0.1:1"])
            .with_request_timeout(Duration::from_secs(1)),
    );
    let err = dead.route("NS").await.unwrap_err();
    assert!(matches!(err, Error::NotLeader { .. }), "{err}");
}
