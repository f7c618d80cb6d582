//! # rocketgate-namesrv
//!
//! The NameServer: brokers register their topics here, clients ask it for routes.
//! Not built yet: tracked by issue #4 (NameServer and the RocketMQ remoting protocol).
