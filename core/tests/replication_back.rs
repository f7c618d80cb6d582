//! Positions that travel from a slave back to its master (docs/replication.md, "What
//! a failover needs"): the local-change marks of a slave survive its restart, and a
//! master that takes a POP group's position from a slave moves the group's POP cursor
//! with it. Without sockets: the stream's OFFSETS frame is
//! `local_offset_changes` → `merge_slave_offsets`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::broker::filter::Filter;
use rocketgate_core::broker::{
    Broker, BrokerSettings, MessagingApi, OffsetPublisher, PopPublisher, PopRequest, Popped,
    QueueChoice, TopicConfig,
};
use rocketgate_core::clock::SystemClock;
use rocketgate_core::store::ha::Gate;
use rocketgate_core::store::{FlushMode, Message, Store, StoreDeps, StoreSettings};

fn open_store(dir: &Path) -> Arc<Store> {
    let opts = StoreSettings {
        segment_size: 64 * 1024,
        max_message_size: 8 * 1024,
        flush: FlushMode::Async {
            interval: Duration::from_millis(10),
        },
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

/// A slave's broker over `dir`: the gate attached before the broker opens, as the
/// node does.
fn open_slave(dir: &Path) -> (Arc<Store>, Broker) {
    let store = open_store(dir);
    store
        .attach_replication(Arc::new(Gate::slave("m:10912")))
        .unwrap();
    let broker = Broker::open(
        store.clone(),
        BrokerSettings::default(),
        Arc::new(SystemClock),
    )
    .unwrap();
    (store, broker)
}

fn open_master(dir: &Path) -> (Arc<Store>, Broker) {
    let store = open_store(dir);
    let broker = Broker::open(
        store.clone(),
        BrokerSettings::default(),
        Arc::new(SystemClock),
    )
    .unwrap();
    (store, broker)
}

/// Ships everything `from` has that `to` lacks and waits until it is dispatched.
async fn ship_all(from: &Store, to: &Store) {
    let mut at = to.positions().written;
    while let Some(run) = from.ship(at, 1 << 20).unwrap() {
        to.append_replicated(run.offset, &run.bytes).await.unwrap();
        at = run.next;
    }
    to.wait_dispatched(Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slaves_unconfirmed_positions_survive_its_restart_and_reach_the_master() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, master) = open_master(a.path());
    let (ss, slave) = open_slave(b.path());
    master
        .create_topic(TopicConfig::new("orders", 2))
        .await
        .unwrap();
    master
        .commit_offset("billing", "m1", "orders", 0, 5)
        .await
        .unwrap();
    master.publish_topic_snapshot(None).await.unwrap();
    let mut publisher = OffsetPublisher::default();
    master.publish_offsets(&mut publisher).await.unwrap();
    ship_all(&ms, &ss).await;
    slave.apply_replicated_topics(None).unwrap();
    let applied = slave.apply_replicated_offsets(None).unwrap();
    assert!(
        slave.local_offset_changes().is_none(),
        "the master's own positions are no local change"
    );

    // The master is away; a consumer commits on the slave, then the slave restarts.
    slave
        .commit_offset("billing", "m1", "orders", 0, 40)
        .await
        .unwrap();
    slave
        .commit_offset("billing", "m1", "orders", 1, 7)
        .await
        .unwrap();
    slave.close().unwrap();
    drop(slave);
    drop(ss);
    let (ss, slave) = open_slave(b.path());
    let body = slave
        .local_offset_changes()
        .expect("the marks survived the restart");

    // The master returns and takes them.
    assert_eq!(master.merge_slave_offsets(&body).unwrap(), 2);
    for (q, want) in [(0, 40), (1, 7)] {
        let got = master
            .query_offset("billing", "m1", "orders", q)
            .await
            .unwrap();
        assert_eq!(got, Some(want), "queue {q} on the master");
    }
    // The master's next record confirms them: the marks go, also from the file.
    master.publish_offsets(&mut publisher).await.unwrap();
    ship_all(&ms, &ss).await;
    slave.apply_replicated_offsets(applied).unwrap();
    assert!(slave.local_offset_changes().is_none());
    slave.close().unwrap();
    drop(slave);
    drop(ss);
    let (ss, slave) = open_slave(b.path());
    assert!(
        slave.local_offset_changes().is_none(),
        "confirmed marks come back after a restart"
    );
    slave
        .commit_offset("billing", "m1", "orders", 0, 45)
        .await
        .unwrap();
    slave.close().unwrap();
    drop(slave);
    drop(ss);

    // The same directory opened as a master (a promotion) has nothing to send back.
    let (_promoted_store, promoted) = open_master(b.path());
    assert!(promoted.local_offset_changes().is_none());
    assert_eq!(
        promoted
            .query_offset("billing", "m1", "orders", 0)
            .await
            .unwrap(),
        Some(45),
        "the position itself stays"
    );
    promoted.close().unwrap();
    master.close().unwrap();
}

fn pop_req(max: usize, invisible: Duration) -> PopRequest {
    PopRequest {
        group: "workers".into(),
        topic: "jobs".into(),
        filter: Filter::all(),
        max_messages: max,
        invisible,
        wait: Duration::ZERO,
    }
}

fn offsets_of(p: &[Popped]) -> Vec<u64> {
    p.iter().map(|p| p.message.queue_offset).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_taking_a_slaves_position_moves_the_pop_cursor_with_it() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ms, master) = open_master(a.path());
    let (ss, slave) = open_slave(b.path());
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
    // On the master: 0..6 handed out, 0..4 acked, 4 and 5 in flight for 2 s.
    let invisible = Duration::from_secs(2);
    let popped = master.pop(pop_req(6, invisible)).await.unwrap();
    assert_eq!(offsets_of(&popped), [0, 1, 2, 3, 4, 5]);
    for p in &popped[..4] {
        master.ack(&p.receipt.to_string()).await.unwrap();
    }
    master.publish_topic_snapshot(None).await.unwrap();
    master
        .publish_pop(&mut PopPublisher::default())
        .await
        .unwrap();
    master
        .publish_offsets(&mut OffsetPublisher::default())
        .await
        .unwrap();
    ship_all(&ms, &ss).await;
    slave.apply_replicated_topics(None).unwrap();
    slave.apply_replicated_pop(None).unwrap();
    slave.apply_replicated_offsets(None).unwrap();

    // The master is away: the group finishes the queue on the slave (the master's
    // handles ack 4 and 5 there).
    let rest = slave.pop(pop_req(10, invisible)).await.unwrap();
    assert_eq!(offsets_of(&rest), [6, 7, 8, 9]);
    for p in popped[4..].iter().chain(&rest) {
        slave.ack(&p.receipt.to_string()).await.unwrap();
    }
    let body = slave.local_offset_changes().expect("the slave's position");

    // The master takes it: nothing is handed out again, not at once and not after
    // the invisible time of 4 and 5.
    assert_eq!(master.merge_slave_offsets(&body).unwrap(), 1);
    assert_eq!(
        master
            .query_offset("workers", "m1", "jobs", 0)
            .await
            .unwrap(),
        Some(10)
    );
    let again = master.pop(pop_req(10, invisible)).await.unwrap();
    assert_eq!(offsets_of(&again), Vec::<u64>::new(), "handed out again");
    tokio::time::sleep(invisible + Duration::from_millis(500)).await;
    let again = master.pop(pop_req(10, invisible)).await.unwrap();
    assert_eq!(
        offsets_of(&again),
        Vec::<u64>::new(),
        "in flight on the master, acked on the slave: delivered again"
    );
    // New messages go out as usual.
    master
        .send(
            Message::new("jobs", 0, b"m10".to_vec()),
            QueueChoice::RoundRobin,
        )
        .await
        .unwrap();
    let new = master.pop(pop_req(10, invisible)).await.unwrap();
    assert_eq!(offsets_of(&new), [10]);
    slave.close().unwrap();
    master.close().unwrap();
}
