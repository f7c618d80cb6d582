//! # rocketgate-testkit
//!
//! Helpers that more than one crate's tests need, so they are written once: today a
//! headless Chromium driven over the DevTools protocol ([`browser`]), used by the
//! WebSocket door's browser tests and by the interop tests' whole-node browser tests.
//!
//! Test code only: no crate's normal dependencies may include it.

#![forbid(unsafe_code)]

pub mod browser;
