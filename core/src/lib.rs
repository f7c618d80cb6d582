//! # rocketgate-core
//!
//! The storage engine and the broker semantics of rocketgate, RocketMQ-style.
//! This crate owns every byte on disk and every rule about who gets which message.
//! It must not know any wire protocol: no sockets, no HTTP/MQTT/remoting types.
//! Gateways decode their protocol, call into this crate, and encode the answer.
//!
//! Where to start reading:
//! - [`store::record`] — the on-disk message layout (RocketMQ's), shared with the
//!   native gateway so a pull response is the stored bytes.
//! - [`store::commit_log`] — the append-only, memory-mapped log of every message.
//! - [`store::consume_queue`] and [`store::index`] — the per-queue and per-key views.
//! - [`store::Store`] — ties them together: dispatch, flush, checkpoint, recovery,
//!   retention. Start here.
//! - [`broker`] — topics, groups, offsets, long polling behind the `MessagingApi` seam.
//!
//! Layers, each depending only on those above it (the workspace's
//! `tests/structure.rs` keeps it so): [`clock`] (the one wall clock) and [`sync`]
//! (the one poison-tolerant lock helper), both from `rocketgate-base` and
//! re-exported here, and [`error`] (the one error enum and the detailed errors it
//! wraps); then [`store`]; then [`broker`].

//!
//! Embedding the storage engine (what every door builds on):
//!
//! ```
//! use rocketgate_core::store::{Message, RecordView, Store, StoreDeps, StoreSettings};
//!
//! let dir = tempfile::tempdir()?;
//! // A service passes `StoreDeps::default()`: the real disk, whose fill level past
//! // `disk_hard_ratio` refuses appends. This example must run on any machine.
//! let deps = StoreDeps::fixed_usage(0.1);
//! let (store, _report) = Store::open(dir.path(), StoreSettings::default(), deps)?;
//! let sent = store.put(&Message::new("orders", 0, b"hello".to_vec()).with_tags("created"))?;
//! assert!(store.wait_dispatched(std::time::Duration::from_secs(5)));
//!
//! let read = store.read_queue("orders", 0, sent.queue_offset, 10)?;
//! let (_offset, entry) = &read.entries[0];
//! let record = store.read_entry(entry)?;
//! let view = RecordView::parse(&record)?;
//! assert_eq!(view.body(), b"hello");
//! assert_eq!(view.tags(), Some("created"));
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// core maps files, so it cannot forbid unsafe; every unsafe block says why it
// is sound, and clippy holds that.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod broker;
pub mod error;
pub mod store;

pub use rocketgate_base::{clock, hex, labels, meter, sync};

pub use error::{Error, Result};
