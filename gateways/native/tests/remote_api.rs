//! `RemoteBroker`: the broker API over the native door, through the socket. A local
//! `Broker` behind a native `Server` on 127.0.0.1:0 and a `RemoteBroker` against it:
//! every method answers what the local broker answers, long polls wait and wake,
//! transaction checks reach the proxy's checker, errors keep their variant, a stopped
//! broker is "unavailable" quickly and a restarted one works again (checkers
//! re-registered), and with auth on only the internal credential may call.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rocketgate_auth::{AccessKey, Auth, UserEntry};
use rocketgate_core::Error as CoreError;
use rocketgate_core::broker::filter::{Filter, FilterType};
use rocketgate_core::broker::{
    Broker, BrokerSettings, ConsumeMode, DeadLetters, HalfMessage, Heartbeat, MessagingApi,
    OffsetReset, PopRequest, PullRequest, PullStatus, QueueChoice, Resolution, Subscription,
    SystemClock, TopicConfig, TopicKind, TransactionChecker,
};
use rocketgate_core::store::record::{EncodedBatch, EncodedEntry, property};
use rocketgate_core::store::{Message, RecordView, Store, StoreDeps, StoreSettings};
use rocketgate_native::client::{RemoteBroker, RemoteSettings};
use rocketgate_native::{Server, ServerHandle, ServerSettings};

const INTERNAL: (&str, &str) = ("rocketgate-internal", "internal-secret");

struct Node {
    addr: SocketAddr,
    broker: Arc<Broker>,
    settings: ServerSettings,
    server: Option<ServerHandle>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(auth: Arc<Auth>) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let store_opts = StoreSettings {
            segment_size: 16 << 20,
            store_host: addr,
            ..StoreSettings::default()
        };
        let (store, _) = Store::open(dir.path(), store_opts, StoreDeps::fixed_usage(0.1)).unwrap();
        let broker = Arc::new(
            Broker::open(
                Arc::new(store),
                BrokerSettings {
                    transaction_timeout: Duration::ZERO,
                    ..BrokerSettings::default()
                },
                Arc::new(SystemClock),
            )
            .unwrap(),
        );
        broker.spawn_delay_delivery();
        let settings = ServerSettings {
            store_host: addr,
            auth,
            ..ServerSettings::default()
        };
        let (server, _) =
            Server::from_listener(listener, broker.clone(), settings.clone()).unwrap();
        Node {
            addr,
            broker,
            settings,
            server: Some(server.spawn()),
            _dir: dir,
        }
    }

    async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop().await;
        }
    }

    async fn restart(&mut self) {
        let (server, _) = Server::bind(self.addr, self.broker.clone(), self.settings.clone())
            .await
            .unwrap();
        self.server = Some(server.spawn());
    }

    async fn remote(&self) -> RemoteBroker {
        RemoteBroker::connect(RemoteSettings::new(self.addr.to_string()))
            .await
            .unwrap()
    }
}

fn msg(topic: &str, body: &'static str, key: &str) -> Message {
    Message::new(topic, 0, Bytes::from_static(body.as_bytes()))
        .with_property(property::TAGS, "t")
        .with_property(property::KEYS, key)
}

fn body(record: &Bytes) -> Vec<u8> {
    RecordView::parse(record).unwrap().body().to_vec()
}

fn pull(topic: &str, queue_id: u32, offset: u64, wait: Duration) -> PullRequest {
    PullRequest {
        group: "g".into(),
        member: "m".into(),
        topic: topic.into(),
        queue_id,
        offset,
        max_messages: 32,
        filter: Filter::all(),
        wait,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_answers_as_the_local_broker() {
    let node = Node::start(Auth::disabled()).await;
    let remote = node.remote().await;
    let local = &*node.broker;
    assert_eq!(remote.delay_limits(), local.delay_limits());

    // Topics.
    let t = remote
        .create_topic(TopicConfig::new("orders", 2))
        .await
        .unwrap();
    assert_eq!(t, local.topic("orders").await.unwrap());
    let t = remote
        .update_topic(TopicConfig::new("orders", 4))
        .await
        .unwrap();
    assert_eq!(t.write_queues, 4);
    assert_eq!(
        remote.topic("orders").await.unwrap(),
        local.topic("orders").await.unwrap()
    );
    assert_eq!(
        remote.topics(TopicKind::All).await.unwrap(),
        local.topics(TopicKind::All).await.unwrap()
    );
    remote
        .create_topic(TopicConfig::new("gone", 1))
        .await
        .unwrap();
    remote.delete_topic("gone").await.unwrap();
    assert!(matches!(
        local.topic("gone").await,
        Err(CoreError::TopicNotFound { .. })
    ));

    // Sends of every kind, then the same bytes pulled back (remote and local agree).
    let one = remote
        .send(msg("orders", "one", "k1"), QueueChoice::Queue(1))
        .await
        .unwrap();
    assert_eq!((one.topic.as_str(), one.queue_id), ("orders", 1));
    let batch = remote
        .send_batch(
            vec![msg("orders", "two", "k2"), msg("orders", "three", "k3")],
            QueueChoice::Queue(1),
        )
        .await
        .unwrap();
    assert_eq!(batch.len(), 2);
    let encoded = remote
        .send_encoded(
            EncodedBatch {
                topic: "orders".into(),
                sys_flag: 0,
                born_timestamp: 1,
                born_host: "127.0.0.1:1".parse().unwrap(),
                reconsume_times: 0,
                entries: vec![
                    EncodedEntry {
                        flag: 0,
                        body: Bytes::from_static(b"four"),
                        properties: Bytes::from_static(b"KEYS\x01k4\x02"),
                    },
                    EncodedEntry {
                        flag: 0,
                        body: Bytes::from_static(b"five"),
                        properties: Bytes::new(),
                    },
                ],
            },
            QueueChoice::Queue(1),
        )
        .await
        .unwrap();
    assert_eq!(encoded.records.len(), 2);
    remote
        .create_topic(TopicConfig::new("keyed", 8))
        .await
        .unwrap();
    let keyed = remote
        .send(
            msg("keyed", "six", "k6"),
            QueueChoice::ShardingKey("user-9".into()),
        )
        .await
        .unwrap();
    let again = local
        .send(
            msg("keyed", "seven", "k7"),
            QueueChoice::ShardingKey("user-9".into()),
        )
        .await
        .unwrap();
    assert_eq!(keyed.queue_id, again.queue_id);
    assert_eq!(encoded.records[0].queue_offset, 3);
    remote.sync_visible().await;
    let r = remote
        .pull(pull("orders", 1, 0, Duration::ZERO))
        .await
        .unwrap();
    let l = local
        .pull(pull("orders", 1, 0, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(r.status, PullStatus::Found);
    assert_eq!(
        (r.next_offset, r.min_offset, r.max_offset),
        (l.next_offset, l.min_offset, l.max_offset)
    );
    let bodies: Vec<Vec<u8>> = r.messages.iter().map(|m| body(&m.record)).collect();
    assert_eq!(bodies, [&b"one"[..], b"two", b"three", b"four", b"five"]);
    for (a, b) in r.messages.iter().zip(&l.messages) {
        assert_eq!(
            (a.queue_id, a.queue_offset, &a.record),
            (b.queue_id, b.queue_offset, &b.record)
        );
    }
    assert_eq!(
        remote.queue_stats("orders").await.unwrap(),
        local.queue_stats("orders").await.unwrap()
    );
    assert_eq!(remote.offset_by_time("orders", 1, 0).await.unwrap(), 0);

    // Lookups.
    let by_id = remote.message_by_id(&one.append.msg_id).await.unwrap();
    assert_eq!(body(&by_id.record), b"one");
    let by_key = remote.messages_by_key("orders", "k2", 10).await.unwrap();
    assert_eq!(by_key.len(), 1);
    assert_eq!(body(&by_key[0].record), b"two");
    let by_time = remote
        .messages_by_time("orders", 0, i64::MAX, 10)
        .await
        .unwrap();
    assert_eq!(by_time.len(), 5);

    // Consumers: heartbeat, assignment, offsets, locks, groups.
    let hb = Heartbeat {
        group: "g".into(),
        member: "m".into(),
        mode: ConsumeMode::Clustering,
        subscriptions: vec![Subscription::tag("orders", "*")],
    };
    remote.heartbeat(hb.clone()).await.unwrap();
    local
        .heartbeat(Heartbeat {
            member: "other".into(),
            ..hb
        })
        .await
        .unwrap();
    assert_eq!(
        remote.assignment("g", "m", "orders").await.unwrap(),
        local.assignment("g", "m", "orders").await.unwrap()
    );
    assert_eq!(
        remote.query_offset("g", "m", "orders", 1).await.unwrap(),
        None
    );
    remote
        .commit_offset("g", "m", "orders", 1, 2)
        .await
        .unwrap();
    assert_eq!(
        local.query_offset("g", "m", "orders", 1).await.unwrap(),
        Some(2)
    );
    let reset = remote
        .reset_offset("g", "m", "orders", OffsetReset::Latest)
        .await
        .unwrap();
    assert!(reset.contains(&(1, 5)), "{reset:?}");
    remote.lock_queue("g", "m", "orders", 0).await.unwrap();
    assert!(matches!(
        remote.lock_queue("g", "other", "orders", 0).await,
        Err(CoreError::QueueLocked { .. })
    ));
    assert!(matches!(
        remote.lock_queue("g", "stranger", "orders", 0).await,
        Err(CoreError::MemberNotFound { .. })
    ));
    remote.unlock_queue("g", "m", "orders", 0).await.unwrap();
    assert_eq!(
        remote.groups().await.unwrap(),
        local.groups().await.unwrap()
    );
    assert_eq!(
        remote.group_info("g").await.unwrap(),
        local.group_info("g").await.unwrap()
    );
    remote.set_max_reconsume_times("g", Some(0)).await.unwrap();
    assert_eq!(local.group_info("g").await.unwrap().max_reconsume_times, 0);
    remote.unregister("g", "m").await.unwrap();
    let members = local.group_info("g").await.unwrap().members;
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].member, "other");

    // Retry and dead letters: with no retries left, a send-back goes to the DLQ.
    let back = remote.send_back("g", "orders", 1, 0, None).await.unwrap();
    assert_eq!(back.sent.topic, "%DLQ%g");
    remote.sync_visible().await;
    let resent = remote
        .resend_dead_letters("g", DeadLetters::All)
        .await
        .unwrap();
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].topic, "orders");

    // POP: receive, change invisibility, nack, ack; FIFO setting.
    remote.set_fifo("fifo", true).await.unwrap();
    assert!(local.group_info("fifo").await.unwrap().fifo);
    remote.set_fifo("pg", false).await.unwrap();
    remote
        .create_topic(TopicConfig::new("jobs", 1))
        .await
        .unwrap();
    remote
        .send(msg("jobs", "job", "j"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    remote.sync_visible().await;
    let pop = |wait| PopRequest {
        group: "pg".into(),
        topic: "jobs".into(),
        filter: Filter::all(),
        max_messages: 4,
        invisible: Duration::from_secs(30),
        wait,
    };
    let popped = remote.pop(pop(Duration::ZERO)).await.unwrap();
    assert_eq!(popped.len(), 1);
    assert_eq!(body(&popped[0].message.record), b"job");
    let first = popped[0].receipt.to_string();
    let changed = remote
        .change_invisibility(&first, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(
        remote.ack(&first).await,
        Err(CoreError::StaleReceiptHandle { .. })
    ));
    remote
        .nack(&changed.to_string(), Duration::ZERO)
        .await
        .unwrap();
    let again = remote.pop(pop(Duration::from_secs(5))).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt(), 2);
    remote.ack(&again[0].receipt.to_string()).await.unwrap();

    // Delayed messages: listed and cancelled.
    let delayed = remote
        .send(
            msg("orders", "later", "d").with_property(property::DELAY_TIME_LEVEL, "5"),
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap();
    let pending = remote.delayed("orders", 10).await.unwrap();
    assert_eq!(pending, local.delayed("orders", 10).await.unwrap());
    assert_eq!(pending.len(), 1);
    let cancelled = remote.cancel_delayed(&delayed.append.msg_id).await.unwrap();
    assert_eq!(cancelled.msg_id, pending[0].msg_id);
    assert!(remote.delayed("orders", 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_is_woken_by_a_send() {
    let node = Node::start(Auth::disabled()).await;
    let remote = node.remote().await;
    remote
        .create_topic(TopicConfig::new("lp", 1))
        .await
        .unwrap();
    let r2 = remote.clone();
    let started = Instant::now();
    let waiting =
        tokio::spawn(async move { r2.pull(pull("lp", 0, 0, Duration::from_secs(20))).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Other calls on the same connection are not held up by the waiting pull.
    assert!(remote.topic("lp").await.is_ok());
    assert!(started.elapsed() < Duration::from_secs(5));
    node.broker
        .send(msg("lp", "wake", "w"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.status, PullStatus::Found);
    assert_eq!(body(&r.messages[0].record), b"wake");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // A POP waits too, and gives up empty when its wait runs out.
    let t = Instant::now();
    let none = remote
        .pop(PopRequest {
            group: "pg".into(),
            topic: "lp".into(),
            filter: Filter::parse(FilterType::Tag, "nothing").unwrap(),
            max_messages: 1,
            invisible: Duration::from_secs(30),
            wait: Duration::from_millis(600),
        })
        .await
        .unwrap();
    assert!(none.is_empty());
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_keep_their_variant() {
    let node = Node::start(Auth::disabled()).await;
    let remote = node.remote().await;
    let local = &*node.broker;
    remote.create_topic(TopicConfig::new("e", 1)).await.unwrap();

    let r = remote.topic("nope").await.unwrap_err();
    let l = local.topic("nope").await.unwrap_err();
    assert!(matches!(r, CoreError::TopicNotFound { .. }), "{r:?}");
    assert_eq!(r.to_string(), l.to_string());
    let r = remote
        .create_topic(TopicConfig::new("e", 1))
        .await
        .unwrap_err();
    assert!(matches!(r, CoreError::TopicExists { .. }), "{r:?}");
    for bad in ["bad name", "", "TBW102"] {
        let r = remote
            .create_topic(TopicConfig::new(bad, 1))
            .await
            .unwrap_err();
        let l = local
            .create_topic(TopicConfig::new(bad, 1))
            .await
            .unwrap_err();
        assert_eq!(
            std::mem::discriminant(&r),
            std::mem::discriminant(&l),
            "{r:?} / {l:?}"
        );
        assert_eq!(r.to_string(), l.to_string());
    }
    let r = remote.group_info("nobody").await.unwrap_err();
    assert!(matches!(r, CoreError::GroupNotFound { .. }), "{r:?}");
    let r = remote
        .message_by_id("00000000000000000000000000000000")
        .await
        .unwrap_err();
    let l = local
        .message_by_id("00000000000000000000000000000000")
        .await
        .unwrap_err();
    assert_eq!(
        std::mem::discriminant(&r),
        std::mem::discriminant(&l),
        "{r:?} / {l:?}"
    );
    assert_eq!(r.to_string(), l.to_string());
    let r = remote.ack("garbage").await.unwrap_err();
    assert!(matches!(r, CoreError::InvalidReceiptHandle { .. }), "{r:?}");
    assert_eq!(
        r.to_string(),
        local.ack("garbage").await.unwrap_err().to_string()
    );
    let handle = "1-2".parse().unwrap();
    let r = remote
        .end_transaction(&handle, Resolution::Commit)
        .await
        .unwrap_err();
    assert!(matches!(r, CoreError::TransactionNotFound { .. }), "{r:?}");
    let bad = Heartbeat {
        group: "g".into(),
        member: "m".into(),
        mode: ConsumeMode::Clustering,
        subscriptions: vec![Subscription {
            topic: "e".into(),
            filter_type: FilterType::Sql92,
            expression: "a >".into(),
        }],
    };
    let r = remote.heartbeat(bad.clone()).await.unwrap_err();
    assert!(matches!(r, CoreError::InvalidFilter(_)), "{r:?}");
    assert_eq!(
        r.to_string(),
        local.heartbeat(bad).await.unwrap_err().to_string()
    );
    let r = remote
        .send(Message::new("e", 0, "x"), QueueChoice::Queue(7))
        .await
        .unwrap_err();
    let l = local
        .send(Message::new("e", 0, "x"), QueueChoice::Queue(7))
        .await
        .unwrap_err();
    assert_eq!(
        std::mem::discriminant(&r),
        std::mem::discriminant(&l),
        "{r:?} / {l:?}"
    );
    let big = Message::new("e", 0, vec![0u8; 5 << 20]);
    let r = remote.send(big, QueueChoice::RoundRobin).await.unwrap_err();
    assert!(matches!(r, CoreError::MessageTooLarge { .. }), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_does_not_fit_one_frame_is_split() {
    let node = Node::start(Auth::disabled()).await;
    let remote = node.remote().await;
    remote
        .create_topic(TopicConfig::new("big", 2))
        .await
        .unwrap();
    // Six 3 MiB messages: 18 MiB, more than a frame (16 MiB); stored in order in
    // one queue.
    let entries: Vec<EncodedEntry> = (0..6u8)
        .map(|i| EncodedEntry {
            flag: 0,
            body: Bytes::from(vec![i; 3 << 20]),
            properties: Bytes::new(),
        })
        .collect();
    let sent = remote
        .send_encoded(
            EncodedBatch {
                topic: "big".into(),
                sys_flag: 0,
                born_timestamp: 1,
                born_host: "127.0.0.1:1".parse().unwrap(),
                reconsume_times: 0,
                entries,
            },
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap();
    let offsets: Vec<u64> = sent.records.iter().map(|r| r.queue_offset).collect();
    assert_eq!(offsets, [0, 1, 2, 3, 4, 5]);
    let q = sent.queue_id;
    remote.sync_visible().await;
    // A pull of all six answers what fits a frame and continues from there.
    let first = remote
        .pull(pull("big", q, 0, Duration::ZERO))
        .await
        .unwrap();
    let n = first.messages.len();
    assert!((1..6).contains(&n), "{n}");
    assert_eq!(first.next_offset, n as u64);
    let rest = remote
        .pull(pull("big", q, first.next_offset, Duration::ZERO))
        .await
        .unwrap();
    let got: Vec<u8> = first
        .messages
        .iter()
        .chain(&rest.messages)
        .map(|m| body(&m.record)[0])
        .collect();
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    // A POP of all six: what does not fit is visible again at once.
    let pop = || PopRequest {
        group: "bigpop".into(),
        topic: "big".into(),
        filter: Filter::all(),
        max_messages: 8,
        invisible: Duration::from_secs(60),
        wait: Duration::ZERO,
    };
    let a = remote.pop(pop()).await.unwrap();
    assert!((1..6).contains(&a.len()), "{}", a.len());
    let mut seen = a.len();
    while seen < 6 {
        let more = remote.pop(pop()).await.unwrap();
        assert!(!more.is_empty(), "the rest is visible again");
        seen += more.len();
    }
    assert_eq!(seen, 6);
    // One message larger than any frame never leaves: too large, not unavailable.
    let e = remote
        .send(
            Message::new("big", 0, vec![0u8; 17 << 20]),
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, CoreError::MessageTooLarge { .. }), "{e:?}");
    // An empty batch gets the broker's own answer.
    let r = remote
        .send_batch(vec![], QueueChoice::RoundRobin)
        .await
        .unwrap_err();
    let l = node
        .broker
        .send_batch(vec![], QueueChoice::RoundRobin)
        .await
        .unwrap_err();
    assert_eq!(r.to_string(), l.to_string());
}

/// Records what the broker asks; answers nothing (the test ends the transaction).
#[derive(Default)]
struct Recorder(Mutex<Vec<HalfMessage>>);

impl TransactionChecker for Recorder {
    fn check(&self, half: HalfMessage) {
        self.0.lock().unwrap().push(half);
    }
}

async fn checked(broker: &Broker, rec: &Recorder) -> HalfMessage {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        broker.check_transactions().await.unwrap();
        for _ in 0..10 {
            if let Some(h) = rec.0.lock().unwrap().pop() {
                return h;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(Instant::now() < deadline, "no check reached the proxy");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_checks_reach_the_proxy_and_survive_a_restart() {
    let mut node = Node::start(Auth::disabled()).await;
    let remote = node.remote().await;
    remote
        .create_topic(TopicConfig::new("tx", 1))
        .await
        .unwrap();
    let rec = Arc::new(Recorder::default());
    let registration = remote
        .register_transaction_checker("payments", rec.clone())
        .await
        .unwrap();
    let half = remote
        .send_half(
            "payments",
            msg("tx", "charge", "order-7"),
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap();
    let asked = checked(&node.broker, &rec).await;
    assert_eq!(asked.producer_group, "payments");
    assert_eq!(asked.handle, half.transaction);
    assert_eq!(asked.view().unwrap().body(), b"charge");
    let sent = remote
        .end_transaction(&asked.handle, Resolution::Commit)
        .await
        .unwrap()
        .expect("committed");
    remote.sync_visible().await;
    let r = remote
        .pull(pull("tx", sent.queue_id, 0, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(body(&r.messages[0].record), b"charge");

    // The broker restarts (its port again): the checker is registered on the new
    // connection, and the next undecided half reaches it.
    node.stop().await;
    node.restart().await;
    let half = loop {
        match remote
            .send_half(
                "payments",
                msg("tx", "again", "order-8"),
                QueueChoice::RoundRobin,
            )
            .await
        {
            Ok(h) => break h,
            Err(CoreError::NotLeader { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    let asked = checked(&node.broker, &rec).await;
    assert_eq!(asked.handle, half.transaction);
    assert!(
        remote
            .end_transaction(&asked.handle, Resolution::Rollback)
            .await
            .unwrap()
            .is_none()
    );

    // Dropped: the broker asks it no more.
    drop(registration);
    remote
        .send_half(
            "payments",
            msg("tx", "third", "order-9"),
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        node.broker.check_transactions().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rec.0.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_broker_is_unavailable_quickly_and_works_after_a_restart() {
    let mut node = Node::start(Auth::disabled()).await;
    let remote = RemoteBroker::connect(
        RemoteSettings::new(node.addr.to_string()).with_request_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    remote.create_topic(TopicConfig::new("s", 1)).await.unwrap();
    // A long poll in flight when the broker goes away ends at once, unavailable.
    let r2 = remote.clone();
    let waiting =
        tokio::spawn(async move { r2.pull(pull("s", 0, 0, Duration::from_secs(20))).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.stop().await;
    let t = Instant::now();
    let e = waiting.await.unwrap().unwrap_err();
    assert!(matches!(e, CoreError::NotLeader { .. }), "{e:?}");
    assert!(e.to_string().contains(&node.addr.to_string()), "{e}");
    for _ in 0..3 {
        let e = remote
            .send(msg("s", "x", "k"), QueueChoice::RoundRobin)
            .await
            .unwrap_err();
        assert!(matches!(e, CoreError::NotLeader { .. }), "{e:?}");
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // A broker that never existed: refused at connect.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    assert!(
        RemoteBroker::connect(RemoteSettings::new(nobody.to_string()))
            .await
            .is_err()
    );

    node.restart().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let sent = loop {
        match remote
            .send(msg("s", "back", "k"), QueueChoice::RoundRobin)
            .await
        {
            Ok(s) => break s,
            Err(CoreError::NotLeader { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    remote.sync_visible().await;
    let r = remote
        .pull(pull("s", sent.queue_id, 0, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(body(&r.messages[0].record), b"back");
}

/// A broker that answers the connect (its delay limits) and then nothing: a call
/// gives up after the request timeout (plus the wait it asked for) as unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_broker_times_out_as_unavailable() {
    use rocketgate_remoting::codec::{FrameCodec, RemotingCommand};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = serde_json::to_string(&rocketgate_core::broker::DelayLimits {
        levels: rocketgate_core::broker::schedule::DelayLevels::default(),
        max_delay: Duration::from_secs(3600),
    })
    .unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = bytes::BytesMut::new();
        let mut answered = false;
        loop {
            while let Some(req) = FrameCodec::default().decode(&mut buf).unwrap() {
                if !answered {
                    answered = true;
                    let mut resp = RemotingCommand::response_to(&req, 0);
                    resp.ext_fields.insert("j", limits.clone());
                    let mut out = bytes::BytesMut::new();
                    FrameCodec::default().encode(&resp, &mut out).unwrap();
                    sock.write_all(&out).await.unwrap();
                }
            }
            if sock.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
        }
    });
    let remote = RemoteBroker::connect(
        RemoteSettings::new(addr.to_string()).with_request_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let e = remote.topic("t").await.unwrap_err();
    assert!(matches!(e, CoreError::NotLeader { .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let t = Instant::now();
    let e = remote
        .pull(pull("t", 0, 0, Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert!(matches!(e, CoreError::NotLeader { .. }), "{e:?}");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_internal_credential_may_call_the_broker_api() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = rocketgate_auth::Settings::disabled();
    s.enabled = true;
    s.users_file = dir.path().join("users.toml");
    s.internal = Some(AccessKey {
        access_key: INTERNAL.0.into(),
        secret_key: INTERNAL.1.into(),
    });
    let auth = Auth::open(s).unwrap();
    auth.update(|f| {
        f.upsert(UserEntry {
            name: "root".into(),
            access_keys: vec![AccessKey {
                access_key: "root-ak".into(),
                secret_key: "root-sk".into(),
            }],
            roles: vec!["admin".into()],
            ..UserEntry::default()
        });
    })
    .unwrap();
    let node = Node::start(auth).await;
    let key = |ak: &str, sk: &str| AccessKey {
        access_key: ak.into(),
        secret_key: sk.into(),
    };
    let internal = RemoteBroker::connect(
        RemoteSettings::new(node.addr.to_string()).with_credentials(key(INTERNAL.0, INTERNAL.1)),
    )
    .await
    .unwrap();
    internal
        .create_topic(TopicConfig::new("sec", 1))
        .await
        .unwrap();

    // Even an admin user is refused: only the internal credential may call.
    for settings in [
        RemoteSettings::new(node.addr.to_string()).with_credentials(key("root-ak", "root-sk")),
        RemoteSettings::new(node.addr.to_string()).with_credentials(key(INTERNAL.0, "wrong")),
        RemoteSettings::new(node.addr.to_string()),
    ] {
        let e = RemoteBroker::connect(settings).await.unwrap_err();
        assert_eq!(
            e.code(),
            Some(rocketgate_remoting::code::response::NO_PERMISSION),
            "{e}"
        );
    }
    // A raw request signed by the admin user, to a method past connect.
    let mut cmd = rocketgate_remoting::codec::RemotingCommand::request(
        rocketgate_remoting::code::api::TOPICS,
        0,
    );
    cmd.ext_fields.insert("j", "\"All\"".to_owned());
    cmd.ext_fields
        .insert(rocketgate_auth::sign::ACCESS_KEY, "root-ak".to_owned());
    let sig = rocketgate_auth::sign::signature(b"root-sk", cmd.ext_fields.iter(), &cmd.body);
    cmd.ext_fields.insert(rocketgate_auth::sign::SIGNATURE, sig);
    let mut conn = Conn::connect(node.addr).await;
    let resp = conn.ask(cmd).await;
    assert_eq!(
        resp.code,
        rocketgate_remoting::code::response::NO_PERMISSION
    );
    assert!(
        resp.remark
            .unwrap_or_default()
            .contains("internal credential")
    );
}

/// A CA and a certificate for 127.0.0.1 signed by it (openssl), in `dir`.
fn certificates(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &[
            "-keyout",
            "key.pem",
            "-out",
            "req.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    ]
    .concat());
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "req.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(dir.path());
    let node = Node::start(Auth::disabled()).await;
    let acceptor =
        rocketgate_tls::Acceptor::new(rocketgate_tls::TlsSettings::new(cert, key)).unwrap();
    let (server, addr) = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        node.broker.clone(),
        node.settings.clone(),
    )
    .await
    .unwrap();
    let _tls = server
        .with_tls(rocketgate_native::TlsMode::Enforcing(acceptor))
        .spawn();
    let remote = RemoteBroker::connect(
        RemoteSettings::new(addr.to_string())
            .with_tls_ca(&ca)
            .unwrap(),
    )
    .await
    .unwrap();
    remote
        .create_topic(TopicConfig::new("tls", 1))
        .await
        .unwrap();
    remote
        .send(msg("tls", "secret", "k"), QueueChoice::RoundRobin)
        .await
        .unwrap();
    remote.sync_visible().await;
    let r = remote
        .pull(pull("tls", 0, 0, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(body(&r.messages[0].record), b"secret");
    // Plain remoting to a TLS-only port is refused.
    assert!(
        RemoteBroker::connect(RemoteSettings::new(addr.to_string()))
            .await
            .is_err()
    );
}

/// A minimal raw connection (one request, its answer).
struct Conn(tokio::net::TcpStream);

impl Conn {
    async fn connect(addr: SocketAddr) -> Conn {
        Conn(tokio::net::TcpStream::connect(addr).await.unwrap())
    }

    async fn ask(
        &mut self,
        mut cmd: rocketgate_remoting::codec::RemotingCommand,
    ) -> rocketgate_remoting::codec::RemotingCommand {
        use rocketgate_remoting::codec::FrameCodec;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        cmd.opaque = 7;
        let mut out = bytes::BytesMut::new();
        FrameCodec::default().encode(&cmd, &mut out).unwrap();
        self.0.write_all(&out).await.unwrap();
        let mut buf = bytes::BytesMut::new();
        loop {
            if let Some(c) = FrameCodec::default().decode(&mut buf).unwrap() {
                return c;
            }
            let n = tokio::time::timeout(Duration::from_secs(10), self.0.read_buf(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed");
        }
    }
}
