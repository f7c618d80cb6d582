//! Shared set-up for the broker tests: a small store and a broker over it in a
//! temp dir, with a manual broker clock.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rocketgate_core::broker::{
    Broker, BrokerSettings, Delivered, ManualClock, MessagingApi, PullRequest, PullResult,
    filter::Filter,
};
use rocketgate_core::store::{FlushMode, Store, StoreDeps, StoreSettings};

pub struct Env {
    pub store: Arc<Store>,
    pub broker: Arc<Broker>,
    pub clock: Arc<ManualClock>,
}

pub fn store_options() -> StoreSettings {
    StoreSettings {
        segment_size: 256 * 1024,
        max_message_size: 8 * 1024,
        flush: FlushMode::Async {
            interval: Duration::from_millis(10),
        },
        checkpoint_interval: Duration::from_millis(50),
        retention_check_interval: Duration::from_secs(3600),
        consume_queue_entries_per_file: 64,
        index_slots: 64,
        index_entries_per_file: 256,
        ..StoreSettings::default()
    }
}

pub fn options() -> BrokerSettings {
    BrokerSettings {
        member_timeout: Duration::from_secs(10),
        lock_lease: Duration::from_secs(5),
        ..BrokerSettings::default()
    }
}

pub fn open(dir: &Path, opts: BrokerSettings) -> Env {
    let store = Arc::new(
        Store::open(dir, store_options(), StoreDeps::fixed_usage(0.1))
            .unwrap()
            .0,
    );
    let clock = Arc::new(ManualClock::new(1_000_000));
    let broker = Arc::new(Broker::open(store.clone(), opts, clock.clone()).unwrap());
    Env {
        store,
        broker,
        clock,
    }
}

impl Env {
    /// Closes broker and store, as a clean shutdown does.
    pub fn close(self) {
        self.broker.close().unwrap();
        drop(self.broker);
        self.store.close().unwrap();
    }

    pub fn dispatched(&self) {
        assert!(self.store.wait_dispatched(Duration::from_secs(10)));
    }
}

pub fn pull_req(group: &str, member: &str, topic: &str, queue_id: u32, offset: u64) -> PullRequest {
    PullRequest {
        group: group.into(),
        member: member.into(),
        topic: topic.into(),
        queue_id,
        offset,
        max_messages: 32,
        filter: Filter::all(),
        wait: Duration::ZERO,
    }
}

pub fn body(d: &Delivered) -> String {
    String::from_utf8(d.view().unwrap().body().to_vec()).unwrap()
}

pub fn bodies(r: &PullResult) -> Vec<String> {
    r.messages.iter().map(body).collect()
}

/// Pulls a queue from `offset` to its end without waiting; returns the bodies
/// and the offset after the last one.
pub async fn drain(
    broker: &Broker,
    group: &str,
    member: &str,
    topic: &str,
    queue_id: u32,
    mut offset: u64,
) -> (Vec<String>, u64) {
    let mut out = Vec::new();
    loop {
        let r = broker
            .pull(pull_req(group, member, topic, queue_id, offset))
            .await
            .unwrap();
        out.extend(bodies(&r));
        if r.next_offset == offset {
            return (out, offset);
        }
        offset = r.next_offset;
    }
}
