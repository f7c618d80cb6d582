//! The rocketgate Rust client: an async RocketMQ client over the shared remoting link
//! (`rocketgate_remoting::client`).
//!
//! - [`Producer`]: sync (`send().await`), async ([`Producer::send_async`], a spawned
//!   future), one-way, batch, ordered by sharding key or queue selector, with a send
//!   timeout and retries on another queue/broker.
//! - [`PullConsumer`]: assign or subscribe, `poll`, `commit`, `seek` by offset or time.
//! - [`PushConsumer`]: long-poll pull under the hood; concurrent or orderly listener,
//!   clustering (average allocation, rebalance on membership change) or broadcasting,
//!   send-back on failure, periodic offset commits, flow control, graceful shutdown.
//! - [`RemoteBroker`]: one broker in another process as a `MessagingApi` (the broker
//!   API codes), for a proxy node's doors.
//! - [`TransactionProducer`]: half message, local transaction, commit/rollback, and a
//!   check-back listener for transactions whose outcome the broker never heard.
//!
//! Every one of them starts from a [`ClientSettings`] naming one or more NameServers;
//! routes are refreshed every [`ClientSettings::route_refresh`], brokers heart-beaten every
//! [`ClientSettings::heartbeat_interval`], and a broken connection is re-opened on next
//! use, with back-off after a failed connect. Nothing the network sends can panic the
//! client: every failure is an [`crate::Error`].
//!
//! ```no_run
//! use rocketgate_native::client::{ClientSettings, Message, Producer};
//!
//! # async fn demo() -> Result<(), rocketgate_native::Error> {
//! let config = ClientSettings::new(["127.0.0.1:9876"]);
//! let producer = Producer::start(config, "my-producers").await?;
//! let sent = producer
//!     .send(Message::new("orders", "hello").with_tag("created").with_keys(["order-1"]))
//!     .await?;
//! println!("stored as {} in queue {}", sent.msg_id, sent.queue.queue_id);
//! producer.shutdown().await;
//! # Ok(()) }
//! ```

mod consume;
mod link;
mod message;
mod offset_store;
mod producer;
mod progress;
mod pull_consumer;
mod push_consumer;
mod remote;
pub(crate) mod session;
mod transaction;

use std::sync::Arc;

use crate::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use crate::message::ReceivedMessage;
pub use consume::ConsumeFrom;
pub use message::{Message, SendResult};
pub use producer::Producer;
pub use pull_consumer::PullConsumer;
pub use push_consumer::{
    ConsumeMode, ConsumeResult, OrderlyResult, PushConsumer, PushConsumerSettings,
};
pub use remote::{RemoteBroker, RemoteSettings};
pub use session::Route;
pub use transaction::{TransactionProducer, TransactionState};

/// Where a client finds the cluster, and its timings.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// `host:port` of every NameServer; any one that answers will do.
    pub namesrv_addrs: Vec<String>,
    /// This client's identity in consumer groups; unique per producer/consumer.
    pub client_id: String,
    /// How often topic routes are re-read from the NameServers (RocketMQ: 30 s).
    pub route_refresh: Duration,
    /// How often every broker is heart-beaten (RocketMQ: 30 s).
    pub heartbeat_interval: Duration,
    /// How long one request waits for its response.
    pub request_timeout: Duration,
    /// TLS to the brokers, trusting the CA given to [`ClientSettings::with_tls_ca`].
    /// The broker's address (IP or host name) must be in its certificate.
    pub tls: Option<Arc<rocketgate_tls::rustls::ClientConfig>>,
    /// TLS to the NameServers (`tls.namesrv` on their side), trusting the CA given to
    /// [`ClientSettings::with_namesrv_tls_ca`]; `None`: plain remoting.
    pub namesrv_tls: Option<Arc<rocketgate_tls::rustls::ClientConfig>>,
    /// AccessKey/SecretKey every request is signed with (RocketMQ's ACL
    /// signature), for a broker with authentication on.
    pub credentials: Option<rocketgate_auth::AccessKey>,
}

impl ClientSettings {
    /// Defaults for the given NameServers, with a fresh client id.
    pub fn new<I, S>(namesrv_addrs: I) -> ClientSettings
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientSettings {
            namesrv_addrs: namesrv_addrs.into_iter().map(Into::into).collect(),
            client_id: new_client_id(),
            route_refresh: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(30),
            request_timeout: Duration::from_secs(3),
            tls: None,
            namesrv_tls: None,
            credentials: None,
        }
    }

    /// Talks TLS to the brokers, trusting the CA certificates in the PEM file `ca`
    /// (for a broker whose `tls.native` is `enforcing` or `permissive`).
    pub fn with_tls_ca(mut self, ca: &std::path::Path) -> Result<Self, Error> {
        self.tls = Some(Arc::new(rocketgate_tls::client_config(ca)?));
        Ok(self)
    }

    /// Talks TLS to the NameServers, trusting the CA certificates in the PEM file `ca`
    /// (for NameServers with `tls.namesrv = true`).
    pub fn with_namesrv_tls_ca(mut self, ca: &std::path::Path) -> Result<Self, Error> {
        self.namesrv_tls = Some(Arc::new(rocketgate_tls::client_config(ca)?));
        Ok(self)
    }

    /// A NameServer list as RocketMQ writes it: `host:port;host:port`.
    pub fn from_list(list: &str) -> ClientSettings {
        Self::new(list.split(';').map(str::trim).filter(|s| !s.is_empty()))
    }

    pub fn with_route_refresh(mut self, every: Duration) -> Self {
        self.route_refresh = every;
        self
    }

    pub fn with_heartbeat_interval(mut self, every: Duration) -> Self {
        self.heartbeat_interval = every;
        self
    }

    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Signs every request with this AccessKey/SecretKey pair.
    pub fn with_credentials(mut self, access_key: &str, secret_key: &str) -> Self {
        self.credentials = Some(rocketgate_auth::AccessKey {
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
        });
        self
    }

    pub fn with_client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }
}

/// `ip@pid#n`, as Java's `ClientSettings.buildMQClientId` (with a counter so several
/// clients of one process are distinct members).
fn new_client_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("127.0.0.1@{}#{n}", std::process::id())
}
