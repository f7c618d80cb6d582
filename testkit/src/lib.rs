//! # rocketgate-testkit
//!
//! Helpers that more than one crate's tests need, so they are written once: a
//! headless Chromium driven over the DevTools protocol ([`browser`]), used by the
//! WebSocket door's browser tests and by the interop tests' whole-node browser tests;
//! a counting allocator for the doors' memory-per-connection tests ([`heap`]); and
//! ports outside the kernel's ephemeral range for tests that name one ([`net`]).
//!
//! Test code only: no crate's normal dependencies may include it.

#![deny(unsafe_code)]

pub mod browser;
#[allow(unsafe_code)] // a `GlobalAlloc` implementation, passing every call to `System`
pub mod heap;
pub mod net;
