//! The storage engine: one commit log for every message, a consume queue per
//! (topic, queue id) pointing into it, and a key index.

pub mod check;
pub mod checkpoint;
pub mod commit_log;
pub mod consume_queue;
pub mod disk;
mod engine;
pub mod epoch;
pub mod flush;
pub mod ha;
pub mod index;
pub mod io;
pub mod lock;
pub(crate) mod mapped;
pub mod meters;
pub mod record;
mod resident;
pub mod truncate;

pub use commit_log::{AppendResult, RecordRef};
pub use consume_queue::CqEntry;
pub use disk::{DiskSpace, FixedUsage, Statvfs};
pub use engine::{
    Clock, DiskFullPolicy, FlushMode, OpenReport, Positions, QueueRead, ReadProgress, Store,
    StoreDeps, StoreSettings, system_clock,
};
pub use record::{Message, RecordView};
