//! TEMPORARY until the phase-1 core API is merged.
#![allow(dead_code)]
use rocketgate_core::broker::{Delivered, MessagingApi};
use rocketgate_core::{Error, Result};

pub struct QueueStats {
    pub queue_id: u32,
    pub min_offset: u64,
    pub max_offset: u64,
    pub last_store_ms: Option<i64>,
}
pub struct QueueProgress {
    pub topic: String,
    pub queue_id: u32,
    pub committed: Option<u64>,
    pub max_offset: u64,
}
pub struct GroupInfo {
    pub progress: Vec<QueueProgress>,
}
fn no<T>() -> Result<T> {
    Err(Error::InvalidArgument("phase 1 not merged".into()))
}
pub trait Shim {
    async fn queue_stats(&self, _t: &str) -> Result<Vec<QueueStats>> {
        no()
    }
    async fn offset_by_time(&self, _t: &str, _q: u32, _ts: i64) -> Result<u64> {
        no()
    }
    async fn message_by_id(&self, _id: &str) -> Result<Delivered> {
        no()
    }
    async fn messages_by_key(&self, _t: &str, _k: &str, _m: usize) -> Result<Vec<Delivered>> {
        no()
    }
    async fn group_info(&self, _g: &str) -> Result<GroupInfo> {
        no()
    }
}
impl<B: MessagingApi> Shim for B {}
