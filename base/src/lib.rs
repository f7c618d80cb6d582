//! # rocketgate-base
//!
//! The bottom layer: what every other crate of the workspace shares and nothing
//! else owns: the one wall clock and its test twin ([`clock`]: `Clock`,
//! `SystemClock`, `ManualClock`, `now_ms`), the one rule for taking a std lock
//! ([`sync`]: poison-tolerant, and why), hex digits written once ([`hex`]) and
//! bounded metric label values ([`labels`]) and lock-free latency histograms and
//! scrape-time gauges ([`meter`]).
//! Std only, no I/O; any crate may depend on it and it depends on none of them.
//!
//! Start reading at [`sync`] (the reason for the poison rule), then [`clock`].

#![forbid(unsafe_code)]

pub mod clock;
pub mod hex;
pub mod labels;
pub mod meter;
pub mod sync;
