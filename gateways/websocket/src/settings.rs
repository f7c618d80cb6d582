//! Limits and timings of the WebSocket door.

use std::time::Duration;

/// Settings of the WebSocket door (the `[ws]` config section).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Largest WebSocket message (and frame) accepted; a bigger one closes the
    /// connection with 1009 "message too big".
    pub max_message_size: usize,
    /// Bytes of pushed messages a connection may have waiting for its socket.
    /// When a browser reads slowly, the subscriptions stop fetching from the
    /// broker once this is full: the backlog stays in the log.
    pub outbound_buffer: usize,
    /// Subscriptions one connection may hold at once.
    pub max_subscriptions: usize,
    /// Delivered but un-acked messages one subscription may hold; it stops
    /// fetching at this many whatever its credit.
    pub max_unacked: usize,
    /// Messages one fetch from the broker asks for at most.
    pub fetch_batch: usize,
    /// How long a clustering (POP) message stays invisible to the rest of its
    /// group without an ack, unless the subscription asks otherwise.
    pub invisible_time: Duration,
    /// How long one broker fetch waits for new messages before it asks again.
    pub long_poll: Duration,
    /// How often the server pings an idle client; a client silent for two
    /// intervals is disconnected.
    pub ping_interval: Duration,
    /// How long a client may take to send its HTTP upgrade request (and, when
    /// the authenticator asks for one, its `auth` frame).
    pub handshake_timeout: Duration,
    /// Browser origins whose pages may connect (see `rocketgate_tls::Origins`);
    /// an upgrade with another `Origin` is refused with 403.
    pub allowed_origins: Vec<String>,
    /// `/v1/ws` connections one client address may hold at once (0: no limit;
    /// `auth.max_connections_per_address`). One more is upgraded and closed at once
    /// with 1013 "try again later". `/mqtt` connections are counted by the MQTT door.
    pub max_connections_per_address: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_message_size: 8 << 20,
            outbound_buffer: 1 << 20,
            max_subscriptions: 64,
            max_unacked: 1000,
            fetch_batch: 32,
            invisible_time: Duration::from_secs(60),
            long_poll: Duration::from_secs(20),
            ping_interval: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            allowed_origins: Vec::new(),
            max_connections_per_address: 0,
        }
    }
}

impl Settings {
    pub(crate) fn check(&self) -> Result<(), crate::Error> {
        let bad = |m: &str| Err(crate::Error::Settings(m.to_owned()));
        if self.max_message_size < 1024 {
            return bad("max_message_size must be at least 1 KiB");
        }
        if self.outbound_buffer == 0 || self.outbound_buffer > u32::MAX as usize {
            return bad("outbound_buffer must be between 1 byte and 4 GiB");
        }
        if self.max_subscriptions == 0 || self.max_unacked == 0 || self.fetch_batch == 0 {
            return bad("max_subscriptions, max_unacked and fetch_batch must be at least 1");
        }
        if self.ping_interval.is_zero() || self.long_poll.is_zero() {
            return bad("ping_interval and long_poll must be above zero");
        }
        Ok(())
    }
}

impl From<&rocketgate_config::WsConfig> for Settings {
    fn from(c: &rocketgate_config::WsConfig) -> Self {
        Settings {
            max_message_size: usize::try_from(c.max_message_size.0).unwrap_or(usize::MAX),
            outbound_buffer: usize::try_from(c.outbound_buffer.0).unwrap_or(usize::MAX),
            max_subscriptions: c.max_subscriptions as usize,
            max_unacked: c.max_unacked as usize,
            invisible_time: c.invisible_time,
            ping_interval: c.ping_interval,
            allowed_origins: c.allowed_origins.clone(),
            ..Settings::default()
        }
    }
}
