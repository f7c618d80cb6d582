//! An outgoing PUBLISH as the door holds it between matching and the socket.
//! Below the codec (which encodes it without building mqttbytes' packet) and
//! the session (which keeps it in flight); it imports nothing of the crate.

use std::sync::Arc;

use bytes::Bytes;
use mqttbytes::QoS;
use mqttbytes::v5::{Publish, PublishProperties};

/// An outgoing PUBLISH as a session holds it until it is written and
/// acknowledged. Not mqttbytes' `Publish`: that one carries its v5 properties
/// inline (144 of its 208 bytes, for 3.1.1 clients too) and owns its topic name,
/// and a session holds up to its window plus the ready queue of these — with a
/// thousand subscribers behind a fan-out, most of the broker's memory. The topic
/// name is shared with the batch it came in (one per message, not per session).
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub topic: Arc<str>,
    pub payload: Bytes,
    /// v5 only.
    pub properties: Option<Box<PublishProperties>>,
    pub pkid: u16,
    pub qos: QoS,
    pub retain: bool,
    pub dup: bool,
}

impl Outgoing {
    /// The packet in mqttbytes' form (for v5 encoding, aliases, resending).
    pub fn to_publish(&self) -> Publish {
        Publish {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: self.topic.to_string(),
            pkid: self.pkid,
            payload: self.payload.clone(),
            properties: self.properties.as_deref().cloned(),
        }
    }
}

/// The lower of two QoS levels (what a subscription grants a message).
pub fn min_qos(a: QoS, b: QoS) -> QoS {
    if (a as u8) <= (b as u8) { a } else { b }
}
