//! POP receipt handles: the string a POP consumer gets with each message and
//! hands back to ack it (or to change its invisibility time).
//!
//! Self-describing, so any broker process serving the group can act on it
//! without shared session state: it names the group, topic, queue and queue
//! offset of the message, the deadline until which it is invisible, which
//! delivery attempt this is, and which revision of that delivery's lease (raised
//! by each change of invisibility, so a handle replaced by a change stops
//! working even when the new deadline happens to equal an old one). The layout is
//! `v1:<group>:<topic>:<queue_id>:<queue_offset>:<invisible_until_ms>:<attempt>:<revision>`;
//! `:` is not a legal character in group or topic names, so splitting is exact,
//! and the string is URL- and header-safe apart from `%` and `|` in names.
//!
//! A handle handed out by a proxy over several broker groups (the native crate's
//! `Cluster`) also names the broker that holds the delivery, so an ack through any
//! proxy reaches it: `v2:<broker>:` followed by the v1 fields. The broker name keeps
//! to the same characters as a topic. A local broker ignores the name (the proxy
//! strips it before it passes the handle on).
//! A handle is not a credential: it carries no secret, and the broker checks it
//! against its own POP state (`pop_state.rs`) when acking.

use std::fmt;
use std::str::FromStr;

use super::schedule;
use crate::Error;

const VERSION: &str = "v1";
/// A v1 handle that names its broker first.
const VERSION_WITH_BROKER: &str = "v2";

/// The decoded content of a POP receipt handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptHandle {
    pub group: String,
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    /// Until when (ms since the epoch) the message is invisible to other POPs.
    pub invisible_until_ms: i64,
    /// 1 on the first delivery, raised each time the message reappears.
    pub attempt: u32,
    /// 0 when delivered, raised by each change of invisibility.
    pub revision: u32,
    /// The broker (group) that handed it out, when a proxy over several of them
    /// did; `None` from a broker itself.
    pub broker: Option<String>,
}

impl fmt::Display for ReceiptHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.broker {
            Some(broker) => write!(f, "{VERSION_WITH_BROKER}:{broker}:")?,
            None => write!(f, "{VERSION}:")?,
        }
        write!(
            f,
            "{}:{}:{}:{}:{}:{}:{}",
            self.group,
            self.topic,
            self.queue_id,
            self.queue_offset,
            self.invisible_until_ms,
            self.attempt,
            self.revision
        )
    }
}

impl FromStr for ReceiptHandle {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |reason: &'static str| Error::InvalidReceiptHandle {
            handle: s.to_owned(),
            reason,
        };
        let mut parts: Vec<&str> = s.split(':').collect();
        let broker = match parts.first() {
            Some(&VERSION_WITH_BROKER) if parts.len() > 1 => {
                let broker = parts.remove(1);
                schedule::validate_topic(broker).map_err(|_| bad("invalid broker name"))?;
                parts[0] = VERSION;
                Some(broker.to_owned())
            }
            _ => None,
        };
        let [
            version,
            group,
            topic,
            queue_id,
            offset,
            until,
            attempt,
            revision,
        ] = parts[..]
        else {
            return Err(bad("expected 8 ':'-separated fields"));
        };
        if version != VERSION {
            return Err(bad("unknown version"));
        }
        schedule::validate_group(group).map_err(|_| bad("invalid group name"))?;
        schedule::validate_topic(topic).map_err(|_| bad("invalid topic name"))?;
        let num = |field: &str, what: &'static str| -> Result<u64, Error> {
            field.parse().map_err(|_| bad(what))
        };
        Ok(ReceiptHandle {
            group: group.to_owned(),
            topic: topic.to_owned(),
            queue_id: u32::try_from(num(queue_id, "invalid queue id")?)
                .map_err(|_| bad("invalid queue id"))?,
            queue_offset: num(offset, "invalid queue offset")?,
            invisible_until_ms: until.parse().map_err(|_| bad("invalid deadline"))?,
            attempt: u32::try_from(num(attempt, "invalid attempt")?)
                .map_err(|_| bad("invalid attempt"))?,
            revision: u32::try_from(num(revision, "invalid revision")?)
                .map_err(|_| bad("invalid revision"))?,
            broker,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_roundtrip() {
        let h = ReceiptHandle {
            group: "%RETRY%g-1".into(),
            topic: "orders|eu".into(),
            queue_id: 3,
            queue_offset: 42,
            invisible_until_ms: 1_700_000_030_000,
            attempt: 2,
            revision: 1,
            broker: None,
        };
        let s = h.to_string();
        assert_eq!(s, "v1:%RETRY%g-1:orders|eu:3:42:1700000030000:2:1");
        assert_eq!(s.parse::<ReceiptHandle>().unwrap(), h);
    }

    #[test]
    fn handles_naming_their_broker_roundtrip() {
        let h = ReceiptHandle {
            group: "g".into(),
            topic: "t".into(),
            queue_id: 1,
            queue_offset: 7,
            invisible_until_ms: 5,
            attempt: 1,
            revision: 0,
            broker: Some("broker-a".into()),
        };
        let s = h.to_string();
        assert_eq!(s, "v2:broker-a:g:t:1:7:5:1:0");
        assert_eq!(s.parse::<ReceiptHandle>().unwrap(), h);
        let plain = ReceiptHandle {
            broker: None,
            ..h.clone()
        };
        assert_eq!(plain.to_string(), "v1:g:t:1:7:5:1:0");
    }

    #[test]
    fn malformed_handles_are_refused() {
        for bad in [
            "",
            "v1:g:t:0:0:0:1",
            "v2:g:t:0:0:0:1:0",
            "v1:g:t:x:0:0:1:0",
            "v1:g:t:0:-1:0:1:0",
            "v1:g:t:99999999999:0:0:1:0",
            "v1:g:t:0:0:0:1:0:extra",
            "v1:g g:t:0:0:0:1:0",
            "v1:g::0:0:0:1:0",
            "v1:g:t:0:0:0:1:-1",
            "v2:g:t:0:0:0:1:0",
            "v2:b a:g:t:0:0:0:1:0",
            "v2::g:t:0:0:0:1:0",
            "v1:b:g:t:0:0:0:1:0",
        ] {
            assert!(
                matches!(
                    bad.parse::<ReceiptHandle>(),
                    Err(Error::InvalidReceiptHandle { .. })
                ),
                "{bad:?} parsed"
            );
        }
    }
}
