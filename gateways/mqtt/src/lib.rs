//! # rocketgate-mqtt
//!
//! MQTT 3.1.1 and 5.0 over the core. Not built yet: tracked by issue #6.
