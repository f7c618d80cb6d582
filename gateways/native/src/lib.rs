//! # rocketgate-native
//!
//! RocketMQ's remoting protocol: a pure codec, the broker-side server and the Rust client.
//! Not built yet: the codec is tracked by issue #4, the server and client by issue #5.
