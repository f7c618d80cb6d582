//! The storage engine: one commit log for every message, a consume queue per
//! (topic, queue id) pointing into it, and a key index.

pub mod commit_log;
pub mod consume_queue;
pub mod flush;
pub mod index;
pub mod record;
