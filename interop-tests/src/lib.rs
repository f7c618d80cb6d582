//! # interop-tests
//!
//! The harness that starts the built `rocketgate` binary on free ports with a fresh data
//! directory and drives it from outside, as a user would.
