//! The store in a broker group, without sockets: a sync master's sends wait for the
//! confirmed offset and its consumers never read past it; a slave refuses writes and
//! builds its own queues from shipped runs (docs/replication.md).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocketgate_core::Error;
use rocketgate_core::clock::SystemClock;
use rocketgate_core::store::ha::{Gate, Replicas};
use rocketgate_core::store::{FlushMode, Message, Store, StoreDeps, StoreSettings};

fn open(dir: &Path, flush: FlushMode) -> Arc<Store> {
    let opts = StoreSettings {
        segment_size: 64 * 1024,
        max_message_size: 8 * 1024,
        flush,
        consume_queue_entries_per_file: 64,
        index_slots: 16,
        index_entries_per_file: 64,
        ..StoreSettings::default()
    };
    Arc::new(
        Store::open(dir, opts, StoreDeps::fixed_usage(0.1))
            .unwrap()
            .0,
    )
}

fn asynchronous() -> FlushMode {
    FlushMode::Async {
        interval: Duration::from_millis(10),
    }
}

fn readable(store: &Store, topic: &str) -> u64 {
    (0..4).map(|q| store.queue_bounds(topic, q).1).sum()
}

#[tokio::test]
async fn a_sync_master_acks_and_serves_only_what_a_slave_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), asynchronous());
    let gate = Arc::new(Gate::master(2, Duration::from_millis(300), 0));
    store.attach_replication(gate.clone()).unwrap();
    let replicas = Replicas::new(store.clone(), gate.clone(), 1 << 20, Arc::new(SystemClock));

    // No slave: refused at once, but the message is in the log ("maybe") and unread.
    let m = Message::new("t", 0, b"first".to_vec());
    let e = store
        .put_batch_async(std::slice::from_ref(&m))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NoInSyncReplica {
                needed: 2,
                in_sync: 0
            }
        ),
        "{e}"
    );
    let end = store.positions().written;
    assert!(end > 0);
    store.wait_dispatched(Duration::from_millis(200));
    assert_eq!(
        readable(&store, "t"),
        0,
        "nobody reads past the confirmed offset"
    );

    // A slave joins and confirms: the first message becomes readable.
    replicas.joined(1, 1, "slave".into(), 0);
    replicas.acked(1, end).unwrap();
    assert_eq!(gate.confirmed(), end);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(readable(&store, "t"), 1);

    // In sync, no ack in time: ReplicationTimeout (and still unread).
    let e = store
        .put_batch_async(&[Message::new("t", 0, b"second".to_vec())])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ReplicationTimeout { .. }), "{e}");
    assert_eq!(readable(&store, "t"), 1);

    // An ack beyond the end changes nothing.
    let now = store.positions().written;
    assert!(replicas.acked(1, now + 1).is_err());
    assert_eq!(gate.confirmed(), end);

    // A send whose copy arrives while it waits is acknowledged.
    let s = store.clone();
    let send = tokio::spawn(async move {
        s.put_batch_async(&[Message::new("t", 0, b"third".to_vec())])
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    replicas.acked(1, store.positions().written).unwrap();
    send.await.unwrap().expect("acknowledged once confirmed");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(readable(&store, "t"), 3);
}

#[tokio::test]
async fn a_slave_refuses_writes_and_dispatches_what_it_is_shipped() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let master = open(a.path(), asynchronous());
    let slave = open(b.path(), asynchronous());
    slave
        .attach_replication(Arc::new(Gate::slave("10.0.0.1:10912")))
        .unwrap();
    let e = slave
        .put_batch_async(&[Message::new("t", 0, b"x".to_vec())])
        .await
        .unwrap_err();
    match e {
        Error::ReadOnlyReplica { master } => assert_eq!(master, "10.0.0.1:10912"),
        other => panic!("{other}"),
    }

    for i in 0..300u32 {
        master
            .put(&Message::new("t", i % 4, vec![b'a'; 500 + i as usize]))
            .unwrap();
    }
    let mut from = slave.positions().written;
    while let Some(run) = master.ship(from, 8 * 1024).unwrap() {
        let acked = slave
            .append_replicated(run.offset, &run.bytes)
            .await
            .unwrap();
        assert_eq!(acked, run.next);
        from = run.next;
    }
    assert_eq!(slave.positions().written, master.positions().written);
    slave.wait_dispatched(Duration::from_secs(5));
    master.wait_dispatched(Duration::from_secs(5));
    for q in 0..4 {
        assert_eq!(slave.queue_bounds("t", q), master.queue_bounds("t", q));
    }
    assert_eq!(readable(&slave, "t"), 300);
}

/// The topic table and group settings travel through the log: a master's snapshot,
/// shipped like any record, is applied by the slave's broker.
#[tokio::test]
async fn topics_and_groups_reach_the_slave_through_the_log() {
    use rocketgate_core::broker::{
        Broker, BrokerSettings, ConsumeMode, Heartbeat, MessagingApi, Subscription, TopicConfig,
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, ss) = (
        open(a.path(), asynchronous()),
        open(b.path(), asynchronous()),
    );
    let clock = Arc::new(SystemClock);
    let master = Broker::open(ms.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    let slave = Broker::open(ss.clone(), BrokerSettings::default(), clock).unwrap();
    ss.attach_replication(Arc::new(Gate::slave("m:10912")))
        .unwrap();

    master
        .create_topic(TopicConfig::new("orders", 6))
        .await
        .unwrap();
    master
        .heartbeat(Heartbeat {
            group: "billing".into(),
            member: "m1".into(),
            mode: ConsumeMode::Broadcasting,
            subscriptions: vec![Subscription::tag("orders", "*")],
        })
        .await
        .unwrap();
    let body = master.publish_topic_snapshot(None).await.unwrap();
    // Unchanged: not written again.
    let end = ms.positions().written;
    master.publish_topic_snapshot(Some(&body)).await.unwrap();
    assert_eq!(ms.positions().written, end);

    let mut from = 0;
    while let Some(run) = ms.ship(from, 1 << 20).unwrap() {
        ss.append_replicated(run.offset, &run.bytes).await.unwrap();
        from = run.next;
    }
    ss.wait_dispatched(Duration::from_secs(5));
    let applied = slave.apply_replicated_topics(None).unwrap();
    assert!(applied.is_some());
    let topics = slave
        .topics(rocketgate_core::broker::TopicKind::User)
        .await
        .unwrap();
    let orders = topics
        .iter()
        .find(|t| t.name == "orders")
        .expect("orders on the slave");
    assert_eq!(orders.read_queues, 6);
    let info = slave.group_info("billing").await.unwrap();
    assert_eq!(info.mode, Some(ConsumeMode::Broadcasting));
    // Applying the same snapshot again changes nothing.
    assert_eq!(slave.apply_replicated_topics(applied).unwrap(), applied);
}

/// Consumer offsets travel through the log: a full record first, then only what
/// moved; nothing is written when nothing moved; the slave applies them in order.
#[tokio::test]
async fn consumer_offsets_reach_the_slave_through_the_log() {
    use rocketgate_core::broker::{
        Broker, BrokerSettings, MessagingApi, OFFSETS_TOPIC, OffsetPublisher, TopicConfig,
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, ss) = (
        open(a.path(), asynchronous()),
        open(b.path(), asynchronous()),
    );
    let clock = Arc::new(SystemClock);
    let master = Broker::open(ms.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    // The gate first, as the node does: the broker learns its role at open.
    ss.attach_replication(Arc::new(Gate::slave("m:10912")))
        .unwrap();
    let slave = Broker::open(ss.clone(), BrokerSettings::default(), clock).unwrap();
    master
        .create_topic(TopicConfig::new("orders", 4))
        .await
        .unwrap();
    for q in 0..4 {
        master
            .commit_offset("billing", "m1", "orders", q, 10 + u64::from(q))
            .await
            .unwrap();
    }
    master.publish_topic_snapshot(None).await.unwrap();
    let mut publisher = OffsetPublisher::default();
    assert_eq!(master.publish_offsets(&mut publisher).await.unwrap(), 4);
    // Nothing moved: nothing written.
    let end = ms.positions().written;
    assert_eq!(master.publish_offsets(&mut publisher).await.unwrap(), 0);
    assert_eq!(ms.positions().written, end);
    // One moved: a change record with that one only.
    master
        .commit_offset("billing", "m1", "orders", 2, 50)
        .await
        .unwrap();
    assert_eq!(master.publish_offsets(&mut publisher).await.unwrap(), 1);
    assert_eq!(ms.queue_bounds(OFFSETS_TOPIC, 0), (0, 2));

    let ship = |from: u64| {
        let (ms, ss) = (ms.clone(), ss.clone());
        async move {
            let mut from = from;
            while let Some(run) = ms.ship(from, 1 << 20).unwrap() {
                ss.append_replicated(run.offset, &run.bytes).await.unwrap();
                from = run.next;
            }
            ss.wait_dispatched(Duration::from_secs(5));
            from
        }
    };
    let shipped = ship(0).await;
    slave.apply_replicated_topics(None).unwrap();
    let applied = slave.apply_replicated_offsets(None).unwrap();
    assert_eq!(applied, Some(1));
    for (q, want) in [(0, 10), (1, 11), (2, 50), (3, 13)] {
        let got = slave
            .query_offset("billing", "m1", "orders", q)
            .await
            .unwrap();
        assert_eq!(got, Some(want), "queue {q}");
    }
    // A consumer on the slave moves on while the master is quiet: kept.
    slave
        .commit_offset("billing", "m1", "orders", 0, 30)
        .await
        .unwrap();
    assert_eq!(slave.apply_replicated_offsets(applied).unwrap(), applied);
    assert_eq!(
        slave
            .query_offset("billing", "m1", "orders", 0)
            .await
            .unwrap(),
        Some(30)
    );
    // That position goes back to the master (the higher one wins there).
    let body = slave
        .local_offset_changes()
        .expect("a position committed on the slave");
    assert_eq!(master.merge_slave_offsets(&body).unwrap(), 1);
    assert_eq!(master.merge_slave_offsets(&body).unwrap(), 0);
    assert_eq!(
        master
            .query_offset("billing", "m1", "orders", 0)
            .await
            .unwrap(),
        Some(30)
    );
    // The master moves queue 3 (and a slave that joins later gets a full record).
    master
        .commit_offset("billing", "m1", "orders", 3, 99)
        .await
        .unwrap();
    publisher.want_full();
    assert_eq!(master.publish_offsets(&mut publisher).await.unwrap(), 4);
    ship(shipped).await;
    assert_eq!(slave.apply_replicated_offsets(applied).unwrap(), Some(2));
    assert_eq!(
        slave
            .query_offset("billing", "m1", "orders", 3)
            .await
            .unwrap(),
        Some(99)
    );
    // The master's record confirmed the slave's position: nothing left to send back.
    assert_eq!(
        slave
            .query_offset("billing", "m1", "orders", 0)
            .await
            .unwrap(),
        Some(30)
    );
    assert!(slave.local_offset_changes().is_none());
}

fn not_leader(e: &Error) -> &str {
    match e {
        Error::NotLeader { reason } => reason,
        other => panic!("expected NotLeader, got {other}"),
    }
}

#[tokio::test]
async fn a_master_writes_only_under_its_lease_and_an_ack_across_the_expiry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), asynchronous());
    let gate = Arc::new(Gate::master(2, Duration::from_secs(2), 0).with_lease());
    store.attach_replication(gate.clone()).unwrap();
    let replicas = Replicas::new(store.clone(), gate.clone(), 1 << 20, Arc::new(SystemClock));
    replicas.joined(1, 1, "slave".into(), 0);
    let send = |body: &'static [u8]| {
        let s = store.clone();
        tokio::spawn(async move {
            s.put_batch_async(&[Message::new("t", 0, body.to_vec())])
                .await
        })
    };

    // Lease mode starts expired: refused before anything is written, at both APIs.
    let e = send(b"early").await.unwrap().unwrap_err();
    assert!(not_leader(&e).contains("no master lease yet"), "{e}");
    let e = store
        .put(&Message::new("t", 0, b"early".to_vec()))
        .unwrap_err();
    not_leader(&e);
    assert_eq!(store.positions().written, 0, "nothing appended");

    // Renewed: a send is acknowledged once its copy arrives.
    gate.set_lease_deadline(Some(Instant::now() + Duration::from_secs(30)));
    let s = send(b"one");
    tokio::time::sleep(Duration::from_millis(50)).await;
    replicas.acked(1, store.positions().written).unwrap();
    s.await.unwrap().expect("acknowledged under the lease");

    // The lease ends while a send waits for its copy: the copy arrives, the send is
    // refused anyway (another master may be acking by now) — in the log, outcome unknown.
    gate.set_lease_deadline(Some(Instant::now() + Duration::from_millis(100)));
    let before = store.positions().written;
    let s = send(b"two");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = store.positions().written;
    assert!(after > before, "appended while the lease held");
    replicas.acked(1, after).unwrap();
    assert_eq!(gate.confirmed(), after);
    let e = s.await.unwrap().unwrap_err();
    let why = not_leader(&e);
    assert!(
        why.contains("lease expired") && why.contains("outcome is unknown"),
        "{why}"
    );
    // And a new one is refused at once, unwritten.
    let e = send(b"three").await.unwrap().unwrap_err();
    assert!(not_leader(&e).contains("not taking writes"), "{e}");
    assert_eq!(store.positions().written, after);

    // The blocking API checks after its wait too.
    gate.set_lease_deadline(Some(Instant::now() + Duration::from_millis(100)));
    let s = {
        let s = store.clone();
        tokio::task::spawn_blocking(move || s.put(&Message::new("t", 0, b"four".to_vec())))
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    replicas.acked(1, store.positions().written).unwrap();
    not_leader(&s.await.unwrap().unwrap_err());

    // Fenced: for good, whatever the lease says.
    gate.set_lease_deadline(Some(Instant::now() + Duration::from_secs(30)));
    gate.fence("broker 1 is master at epoch 3");
    let e = send(b"five").await.unwrap().unwrap_err();
    assert!(not_leader(&e).contains("epoch 3"), "{e}");
    gate.set_lease_deadline(None);
    not_leader(&send(b"six").await.unwrap().unwrap_err());
}

#[tokio::test]
async fn an_async_master_checks_its_lease_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), asynchronous());
    let gate = Arc::new(Gate::master(1, Duration::from_secs(2), 0).with_lease());
    store.attach_replication(gate.clone()).unwrap();
    let m = [Message::new("t", 0, b"x".to_vec())];
    not_leader(&store.put_batch_async(&m).await.unwrap_err());
    gate.set_lease_deadline(Some(Instant::now() + Duration::from_secs(30)));
    store.put_batch_async(&m).await.expect("under the lease");
    // A deadline already past: refused; the lease turned off (no controller): taken.
    gate.set_lease_deadline(Some(Instant::now() - Duration::from_millis(1)));
    not_leader(&store.put_batch_async(&m).await.unwrap_err());
    gate.set_lease_deadline(None);
    store.put_batch_async(&m).await.expect("lease off");
}

#[tokio::test]
async fn under_a_controller_every_member_confirms_and_an_absent_one_holds_sends_until_the_set_shrinks()
 {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), asynchronous());
    let gate = Arc::new(Gate::master(2, Duration::from_secs(5), 0));
    store.attach_replication(gate.clone()).unwrap();
    let replicas = Replicas::new(store.clone(), gate.clone(), 1 << 20, Arc::new(SystemClock));
    replicas.joined(1, 1, "a".into(), 0);
    replicas.joined(2, 2, "b".into(), 0);
    assert!(replicas.set_members(Some((BTreeSet::from([1, 2]), 1))));
    assert_eq!(replicas.proposal(), None);

    // Slave 1 confirms, slave 2 is gone: under the count rule one copy would do; a
    // member of the controller's set holds the send.
    replicas.left(2);
    let s = {
        let s = store.clone();
        tokio::spawn(async move {
            s.put_batch_async(&[Message::new("t", 0, b"a".to_vec())])
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    replicas.acked(1, store.positions().written).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!s.is_finished(), "waits for member 2");
    assert_eq!(gate.confirmed(), 0);

    // The master asks the controller for {1}; once it holds that, the send is acked.
    assert_eq!(replicas.proposal(), Some(BTreeSet::from([1])));
    assert!(replicas.set_members(Some((BTreeSet::from([1]), 2))));
    s.await.unwrap().expect("acknowledged once the set shrank");
    assert_eq!(gate.confirmed(), store.positions().written);

    // A set too small for min_in_sync_replicas = 2: sends fail at once.
    assert!(replicas.set_members(Some((BTreeSet::new(), 3))));
    let e = store
        .put_batch_async(&[Message::new("t", 0, b"b".to_vec())])
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NoInSyncReplica {
                needed: 2,
                in_sync: 0
            }
        ),
        "{e}"
    );
}

/// POP state travels through the log: the master's cursor, acks and in-flight leases
/// (with their invisible times) reach the slave as a full record and then change
/// records; opened as a master on its own data dir, the slave serves the group from
/// there: acked messages never again, in-flight ones only after their invisible time
/// (the master's receipt handles still ack them), the rest at once, nothing skipped.
/// The slave's commit log stays byte-identical to the master's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pop_state_reaches_the_slave_and_a_promoted_slave_continues_the_group() {
    use rocketgate_core::broker::filter::Filter;
    use rocketgate_core::broker::{
        Broker, BrokerSettings, MessagingApi, POP_TOPIC, PopPublisher, PopRequest, QueueChoice,
        TopicConfig,
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, ss) = (
        open(a.path(), asynchronous()),
        open(b.path(), asynchronous()),
    );
    let clock = Arc::new(SystemClock);
    let master = Broker::open(ms.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    let slave = Broker::open(ss.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    ss.attach_replication(Arc::new(Gate::slave("m:10912")))
        .unwrap();
    master
        .create_topic(TopicConfig::new("jobs", 1))
        .await
        .unwrap();
    for i in 0..10 {
        master
            .send(
                Message::new("jobs", 0, format!("m{i}").into_bytes()),
                QueueChoice::RoundRobin,
            )
            .await
            .unwrap();
    }
    let req = |max: usize, invisible: Duration| PopRequest {
        group: "workers".into(),
        topic: "jobs".into(),
        filter: Filter::all(),
        max_messages: max,
        invisible,
        wait: Duration::ZERO,
    };
    let offsets = |p: &[rocketgate_core::broker::Popped]| -> Vec<u64> {
        p.iter().map(|p| p.message.queue_offset).collect()
    };
    let popped = master.pop(req(6, Duration::from_secs(60))).await.unwrap();
    assert_eq!(offsets(&popped), [0, 1, 2, 3, 4, 5]);
    master.publish_topic_snapshot(None).await.unwrap();
    let mut publisher = PopPublisher::default();
    assert_eq!(master.publish_pop(&mut publisher).await.unwrap(), 1, "full");
    assert_eq!(master.publish_pop(&mut publisher).await.unwrap(), 0);
    // Acks of 0..4, message 5 due again in 1 s: a change record.
    for p in &popped[..4] {
        master.ack(&p.receipt.to_string()).await.unwrap();
    }
    let renewed = master
        .change_invisibility(&popped[5].receipt.to_string(), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(master.publish_pop(&mut publisher).await.unwrap(), 1);
    assert_eq!(ms.queue_bounds(POP_TOPIC, 0), (0, 2));

    let mut from = 0;
    while let Some(run) = ms.ship(from, 1 << 20).unwrap() {
        ss.append_replicated(run.offset, &run.bytes).await.unwrap();
        from = run.next;
    }
    ss.wait_dispatched(Duration::from_secs(5));
    slave.apply_replicated_topics(None).unwrap();
    assert_eq!(slave.apply_replicated_pop(None).unwrap(), Some(1));
    assert_eq!(slave.apply_replicated_pop(Some(1)).unwrap(), Some(1));
    slave.close().unwrap();
    drop(slave);
    let end = ms.positions().written;
    assert_eq!(ss.positions().written, end);
    let log = |s: &Store| s.ship(0, 1 << 24).unwrap().unwrap().bytes;
    assert_eq!(log(&ms), log(&ss), "the slave's commit log is the master's");
    drop(ss);

    // The master is gone; the slave's data dir opens as a master.
    master.close().unwrap();
    let promoted_store = open(b.path(), asynchronous());
    let promoted = Broker::open(promoted_store, BrokerSettings::default(), clock).unwrap();
    let at_once = promoted
        .pop(req(10, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        offsets(&at_once),
        [6, 7, 8, 9],
        "never-delivered ones at once; acked and invisible ones not"
    );
    // The master's handle for message 4 (in flight, 60 s) still acks it there.
    promoted.ack(&popped[4].receipt.to_string()).await.unwrap();
    // Message 5 reappears after its (changed) invisible time, as a second attempt.
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        let p = promoted
            .pop(req(10, Duration::from_secs(60)))
            .await
            .unwrap();
        if !p.is_empty() || Instant::now() > deadline {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(offsets(&again), [5]);
    assert_eq!(again[0].attempt(), 2);
    assert!(promoted.ack(&renewed.to_string()).await.is_err(), "stale");
    for p in at_once.iter().chain(&again) {
        promoted.ack(&p.receipt.to_string()).await.unwrap();
    }
    assert!(
        promoted
            .pop(req(10, Duration::from_secs(60)))
            .await
            .unwrap()
            .is_empty()
    );
    promoted.close().unwrap();
}

/// Ships everything `from` has to `to` (the in-memory HA path) and waits until it is
/// dispatched.
async fn ship_all(from: &Store, to: &Store) {
    let mut at = to.positions().written;
    while let Some(run) = from.ship(at, 1 << 20).unwrap() {
        to.append_replicated(run.offset, &run.bytes).await.unwrap();
        at = run.next;
    }
    to.wait_dispatched(Duration::from_secs(5));
}

/// The bodies in queue 0 of `topic`, in order.
fn bodies_of(store: &Store, topic: &str) -> Vec<String> {
    let (min, max) = store.queue_bounds(topic, 0);
    if max == min {
        return Vec::new();
    }
    let read = store
        .read_queue(topic, 0, min, (max - min) as usize)
        .unwrap();
    read.entries
        .iter()
        .map(|(_, e)| {
            let r = store.read_entry(e).unwrap();
            String::from_utf8(r.view().unwrap().body().to_vec()).unwrap()
        })
        .collect()
}

/// Delay progress travels through the log: a slave that takes the master's snapshot
/// and is then opened as a master delivers none of what the master delivered again,
/// and every delayed message still due, once, when it is due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_progress_reaches_the_slave_and_a_promoted_slave_delivers_only_the_rest() {
    use rocketgate_core::broker::{
        Broker, BrokerSettings, DELAY_TOPIC, ManualClock, MessagingApi, QueueChoice, TopicConfig,
    };
    use rocketgate_core::store::record::property;
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, ss) = (
        open(a.path(), asynchronous()),
        open(b.path(), asynchronous()),
    );
    let clock = Arc::new(ManualClock::new(1_000_000));
    let master = Broker::open(ms.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    let slave = Broker::open(ss.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    ss.attach_replication(Arc::new(Gate::slave("m:10912")))
        .unwrap();
    master.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    for (body, key, value) in [
        ("a", property::DELAY_TIME_LEVEL, "1"),
        ("x", property::TIMER_DELAY_MS, "2000"),
        ("b", property::DELAY_TIME_LEVEL, "1"),
        ("y", property::TIMER_DELAY_MS, "5000"),
        ("z", property::DELAY_TIME_LEVEL, "3"),
    ] {
        master
            .send(
                Message::new("t", 0, body.as_bytes().to_vec()).with_property(key, value),
                QueueChoice::Queue(0),
            )
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(2));
    ms.wait_dispatched(Duration::from_secs(5));
    assert_eq!(master.deliver_due().await.unwrap(), 3);
    master.publish_topic_snapshot(None).await.unwrap();
    let body = master.publish_delay_progress(None).await.unwrap();
    // Unchanged: nothing written.
    let end = ms.positions().written;
    master.publish_delay_progress(Some(&body)).await.unwrap();
    assert_eq!(ms.positions().written, end);
    assert_eq!(ms.queue_bounds(DELAY_TOPIC, 0), (0, 1));

    ship_all(&ms, &ss).await;
    slave.apply_replicated_topics(None).unwrap();
    assert_eq!(slave.apply_replicated_delay(None).unwrap(), Some(0));
    assert_eq!(slave.apply_replicated_delay(Some(0)).unwrap(), Some(0));
    slave.close().unwrap();
    drop(slave);
    drop(ss);
    master.close().unwrap();

    // The slave's data dir opens as a master: the three delivered stay delivered.
    let promoted_store = open(b.path(), asynchronous());
    let promoted = Broker::open(
        promoted_store.clone(),
        BrokerSettings::default(),
        clock.clone(),
    )
    .unwrap();
    assert_eq!(promoted.deliver_due().await.unwrap(), 0, "nothing again");
    clock.advance(Duration::from_secs(3));
    assert_eq!(promoted.deliver_due().await.unwrap(), 1, "y at 5 s");

    clock.advance(Duration::from_secs(5));
    assert_eq!(promoted.deliver_due().await.unwrap(), 1, "z at 10 s");
    clock.advance(Duration::from_secs(60));
    assert_eq!(promoted.deliver_due().await.unwrap(), 0);
    promoted_store.wait_dispatched(Duration::from_secs(5));
    let mut got = bodies_of(&promoted_store, "t");
    got.sort();
    assert_eq!(got, ["a", "b", "x", "y", "z"], "each delayed message once");
    promoted.close().unwrap();
}

/// Transaction decisions travel as the op records they already are: a slave opened
/// as a master checks back only the undecided half, refuses to commit the rolled-back
/// one, and holds the committed one once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_slave_checks_back_only_undecided_halves() {
    use rocketgate_core::broker::{
        Broker, BrokerSettings, CheckRound, HalfMessage, ManualClock, MessagingApi, QueueChoice,
        Resolution, TopicConfig, TransactionChecker,
    };
    struct Chan(tokio::sync::mpsc::UnboundedSender<HalfMessage>);
    impl TransactionChecker for Chan {
        fn check(&self, half: HalfMessage) {
            let _ = self.0.send(half);
        }
    }
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, ss) = (
        open(a.path(), asynchronous()),
        open(b.path(), asynchronous()),
    );
    let clock = Arc::new(ManualClock::new(1_000_000));
    let master = Broker::open(ms.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    let slave = Broker::open(ss.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    ss.attach_replication(Arc::new(Gate::slave("m:10912")))
        .unwrap();
    master.create_topic(TopicConfig::new("t", 1)).await.unwrap();
    let mut handles = Vec::new();
    for body in ["committed", "rolled-back", "undecided"] {
        let sent = master
            .send_half(
                "pg",
                Message::new("t", 0, body.as_bytes().to_vec()),
                QueueChoice::Queue(0),
            )
            .await
            .unwrap();
        handles.push(sent.transaction);
    }
    master
        .end_transaction(&handles[0], Resolution::Commit)
        .await
        .unwrap();
    master
        .end_transaction(&handles[1], Resolution::Rollback)
        .await
        .unwrap();
    master.publish_topic_snapshot(None).await.unwrap();
    ship_all(&ms, &ss).await;
    slave.apply_replicated_topics(None).unwrap();
    slave.close().unwrap();
    drop(slave);
    drop(ss);
    master.close().unwrap();

    let promoted_store = open(b.path(), asynchronous());
    let promoted = Broker::open(
        promoted_store.clone(),
        BrokerSettings::default(),
        clock.clone(),
    )
    .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _reg = promoted
        .register_transaction_checker("pg", Arc::new(Chan(tx)))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        promoted.check_transactions().await.unwrap(),
        CheckRound {
            checked: 1,
            unchecked: 0,
            rolled_back: 0
        }
    );
    let checked = rx.try_recv().unwrap();
    assert_eq!(checked.handle, handles[2]);
    assert!(rx.try_recv().is_err());
    assert!(
        promoted
            .end_transaction(&handles[1], Resolution::Commit)
            .await
            .is_err(),
        "a rolled-back half is never committed"
    );
    promoted
        .end_transaction(&handles[2], Resolution::Commit)
        .await
        .unwrap();
    promoted_store.wait_dispatched(Duration::from_secs(5));
    assert_eq!(bodies_of(&promoted_store, "t"), ["committed", "undecided"]);
    promoted.close().unwrap();
}

/// A group deleted on the master is deleted on the slave through the log: its
/// settings (topic snapshot), offsets (a tombstone in the offset record), POP state
/// (`null` queue states) and retry topic (the snapshot, with its consume queues). A
/// slave refuses a deletion itself (its master's records would undo it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_deleted_on_the_master_is_deleted_on_the_slave() {
    use rocketgate_core::broker::filter::Filter;
    use rocketgate_core::broker::{
        Broker, BrokerSettings, GroupDeletion, MessagingApi, OffsetPublisher, PopPublisher,
        PopRequest, QueueChoice, TopicConfig, TopicKind,
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, ss) = (
        open(a.path(), asynchronous()),
        open(b.path(), asynchronous()),
    );
    let clock = Arc::new(SystemClock);
    let master = Broker::open(ms.clone(), BrokerSettings::default(), clock.clone()).unwrap();
    let slave = Broker::open(ss.clone(), BrokerSettings::default(), clock).unwrap();
    ss.attach_replication(Arc::new(Gate::slave("m:10912")))
        .unwrap();
    master
        .create_topic(TopicConfig::new("orders", 1))
        .await
        .unwrap();
    for t in ["orders", "%RETRY%billing"] {
        master
            .send(Message::new(t, 0, b"m".to_vec()), QueueChoice::RoundRobin)
            .await
            .unwrap();
    }
    master
        .commit_offset("billing", "", "orders", 0, 1)
        .await
        .unwrap();
    master
        .commit_offset("audit", "", "orders", 0, 1)
        .await
        .unwrap();
    master.set_fifo("billing", true).await.unwrap();
    let popped = master
        .pop(PopRequest {
            group: "billing".into(),
            topic: "%RETRY%billing".into(),
            filter: Filter::all(),
            max_messages: 1,
            invisible: Duration::from_secs(60),
            wait: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(popped.len(), 1);
    let (mut offsets, mut pop) = (OffsetPublisher::default(), PopPublisher::default());
    publish_all(&master, &mut offsets, &mut pop).await;
    ship_all(&ms, &ss).await;
    let (mut t, mut o, mut p) = (None, None, None);
    let apply = |t: &mut Option<u64>, o: &mut Option<u64>, p: &mut Option<u64>| {
        *t = slave.apply_replicated_topics(*t).unwrap();
        *o = slave.apply_replicated_offsets(*o).unwrap();
        *p = slave.apply_replicated_pop(*p).unwrap();
    };
    apply(&mut t, &mut o, &mut p);
    let info = slave.group_info("billing").await.unwrap();
    assert!(info.fifo);
    assert_eq!(
        slave
            .query_offset("billing", "", "orders", 0)
            .await
            .unwrap(),
        Some(1)
    );
    let has_retry = |b: &Broker| {
        b.topic_snapshot(TopicKind::All)
            .iter()
            .any(|t| t.name == "%RETRY%billing")
    };
    assert!(has_retry(&slave));

    // A slave refuses to delete: 503-like, naming its master.
    let refused = slave
        .delete_group("billing", GroupDeletion::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::ReadOnlyReplica { .. }),
        "{refused}"
    );

    let deleted = master
        .delete_group("billing", GroupDeletion::default())
        .await
        .unwrap();
    // Its committed position on orders, and the one POP keeps on the retry topic.
    assert_eq!(deleted.offsets, 2);
    assert_eq!(deleted.pop_queues, 1);
    assert_eq!(deleted.topics, ["%RETRY%billing"]);
    assert!(matches!(
        master.group_info("billing").await,
        Err(Error::GroupNotFound { .. })
    ));
    assert!(matches!(
        master
            .delete_group("billing", GroupDeletion::default())
            .await,
        Err(Error::GroupNotFound { .. })
    ));
    publish_all(&master, &mut offsets, &mut pop).await;
    ship_all(&ms, &ss).await;
    apply(&mut t, &mut o, &mut p);
    assert!(
        matches!(
            slave.group_info("billing").await,
            Err(Error::GroupNotFound { .. })
        ),
        "the slave forgot the group: {:?}",
        slave.group_info("billing").await
    );
    assert_eq!(
        slave
            .query_offset("billing", "", "orders", 0)
            .await
            .unwrap(),
        None
    );
    assert!(!has_retry(&slave), "the retry topic went on the slave too");
    assert_eq!(ss.queue_bounds("%RETRY%billing", 0), (0, 0));
    // Another group is untouched.
    assert_eq!(
        slave.query_offset("audit", "", "orders", 0).await.unwrap(),
        Some(1)
    );
}

/// What a master's replication task writes each second: the topic snapshot, the
/// offset record, the POP record.
async fn publish_all(
    master: &rocketgate_core::broker::Broker,
    offsets: &mut rocketgate_core::broker::OffsetPublisher,
    pop: &mut rocketgate_core::broker::PopPublisher,
) {
    master.publish_topic_snapshot(None).await.unwrap();
    master.publish_offsets(offsets).await.unwrap();
    master.publish_pop(pop).await.unwrap();
}
