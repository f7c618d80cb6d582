//! # rocketgate-websocket
//!
//! WebSocket push to browsers and MQTT over WebSocket. Not built yet: tracked by issue #8.
