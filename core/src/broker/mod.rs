//! Broker semantics that need no I/O: subscription filters, consumer-group queue
//! allocation and rebalance decisions, delay levels, retry back-off and the names of
//! system topics. Everything here is a pure function or an immutable value, so the
//! stateful broker (and its tests) can drive it without sockets, files or clocks.
//! Start with [`filter::Filter`], then [`allocate`] and [`schedule`].

pub mod allocate;
pub mod filter;
pub mod schedule;
