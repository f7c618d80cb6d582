//! The gateway's settings (the `[mqtt]` config section), read by every layer
//! of the door; it imports nothing of the crate.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Gateway settings (the `[mqtt]` config section).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where an earlier version kept sessions and retained messages
    /// (`<data dir>/mqtt`): imported into the broker's state topics once at
    /// start, then moved aside. The state itself lives in the broker. Empty: nothing
    /// to import (a proxy, which never had a store).
    pub state_dir: PathBuf,
    /// Largest packet accepted (and announced as Maximum Packet Size in v5).
    pub max_packet_size: u32,
    /// QoS 2 publishes a client may have unfinished (Receive Maximum announced in v5).
    pub receive_maximum: u16,
    /// Outgoing QoS 1/2 messages in flight per client (further capped by the
    /// client's own Receive Maximum).
    pub max_inflight: u16,
    /// Longest session expiry granted, in seconds (also for 3.1.1 persistent sessions).
    pub max_session_expiry: u32,
    /// Longest keep-alive granted to v5 clients, in seconds (0: any; they are
    /// told). 3.1.1 clients keep their own: they cannot be told another.
    pub max_keep_alive: u16,
    /// The keep-alive every v5 client gets, in seconds, told as Server Keep
    /// Alive when it asked another (0: the client's own, capped as above).
    pub server_keep_alive: u16,
    /// Topic aliases a client may use towards the server (v5).
    pub topic_alias_maximum: u16,
    /// How often the topic list is re-read for wildcard subscriptions.
    pub topic_poll: Duration,
    /// How long a CONNECT may take to arrive after the socket opens.
    pub connect_timeout: Duration,
    /// Who may connect and what they may do (off: everyone, everything).
    pub auth: Arc<rocketgate_auth::Auth>,
    /// How often the `$SYS/#` values are updated (zero: no `$SYS` at all).
    pub sys_interval: Duration,
    /// How often the door writes that it is alive to the state topic.
    pub door_liveness: Duration,
    /// A door silent this long is dead: the first other door to say so in the
    /// log adopts its sessions and publishes their wills.
    pub door_timeout: Duration,
    /// The state is written whole (a snapshot) at least this often, and after
    /// [`Settings::snapshot_entries`] entries; keep it well below the store's
    /// retention.
    pub snapshot_interval: Duration,
    pub snapshot_entries: u64,
    /// Largest part of a snapshot, in bytes (below the store's largest message).
    pub snapshot_chunk: usize,
    /// The MQTT 5 Server Reference for clients this door cannot serve (a read-only
    /// slave's publishers, persistent sessions it cannot record, everyone when a
    /// demoted master stops): they get reason 0x9C (Use another server) with it.
    pub server_reference: Option<String>,
    /// The service moved for good: every CONNECT is refused (v5: CONNACK 0x9D
    /// Server moved with this as Server Reference).
    pub moved_to: Option<String>,
}

impl Settings {
    pub fn new(state_dir: PathBuf) -> Settings {
        Settings {
            state_dir,
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            max_inflight: 1024,
            max_session_expiry: 7 * 24 * 3600,
            max_keep_alive: 0,
            server_keep_alive: 0,
            topic_alias_maximum: 64,
            topic_poll: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(10),
            auth: rocketgate_auth::Auth::disabled(),
            sys_interval: Duration::from_secs(10),
            door_liveness: Duration::from_secs(1),
            door_timeout: Duration::from_secs(4),
            snapshot_interval: Duration::from_secs(3600),
            snapshot_entries: 10_000,
            snapshot_chunk: 1 << 20,
            server_reference: None,
            moved_to: None,
        }
    }
}
