//! # rocketgate-http
//!
//! The HTTP API (publish, stateless receive/ack, admin, metrics). Not built yet: tracked by issue #7.
