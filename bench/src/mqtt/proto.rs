//! The generator's two MQTT versions: the few packets it sends and reads, in 3.1.1
//! or 5 (`--mqtt-version`), through `mqttbytes` either way. A v5 PUBLISH carries
//! no properties (a device's usual publish), so what differs on the wire is the
//! properties-length byte of each packet and the reason codes.

use bytes::{Bytes, BytesMut};
use mqttbytes::QoS;
use mqttbytes::{v4, v5};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Version {
    #[default]
    #[value(name = "3.1.1")]
    V4,
    #[value(name = "5")]
    V5,
}

/// What the generator looks at in a packet from the broker.
#[derive(Debug)]
pub enum Pkt {
    /// `refused`: the reason the broker gave, when it did not accept.
    ConnAck {
        refused: Option<String>,
    },
    SubAck {
        failed: bool,
    },
    Publish {
        pkid: u16,
        qos: QoS,
        payload: Bytes,
    },
    PubAck,
    Other,
}

pub type Result<T> = std::result::Result<T, mqttbytes::Error>;

impl Version {
    /// The next whole packet in `buf` (`InsufficientBytes` until there is one).
    pub fn read(self, buf: &mut BytesMut, max: usize) -> Result<Pkt> {
        Ok(match self {
            Version::V4 => match v4::read(buf, max)? {
                v4::Packet::ConnAck(a) => Pkt::ConnAck {
                    refused: (a.code != v4::ConnectReturnCode::Success)
                        .then(|| format!("{:?}", a.code)),
                },
                v4::Packet::SubAck(a) => Pkt::SubAck {
                    failed: a
                        .return_codes
                        .iter()
                        .any(|c| matches!(c, v4::SubscribeReasonCode::Failure)),
                },
                v4::Packet::Publish(p) => Pkt::Publish {
                    pkid: p.pkid,
                    qos: p.qos,
                    payload: p.payload,
                },
                v4::Packet::PubAck(_) => Pkt::PubAck,
                _ => Pkt::Other,
            },
            Version::V5 => match v5::read(buf, max)? {
                v5::Packet::ConnAck(a) => Pkt::ConnAck {
                    refused: (a.code != v5::ConnectReturnCode::Success)
                        .then(|| format!("{:?}", a.code)),
                },
                v5::Packet::SubAck(a) => Pkt::SubAck {
                    failed: a.return_codes.iter().any(|c| (*c as u8) >= 0x80),
                },
                v5::Packet::Publish(p) => Pkt::Publish {
                    pkid: p.pkid,
                    qos: p.qos,
                    payload: p.payload,
                },
                v5::Packet::PubAck(_) => Pkt::PubAck,
                _ => Pkt::Other,
            },
        })
    }

    pub fn connect(self, client_id: &str, keep_alive: u16, out: &mut BytesMut) -> Result<()> {
        match self {
            Version::V4 => {
                let mut c = v4::Connect::new(client_id);
                c.keep_alive = keep_alive;
                c.clean_session = true;
                c.write(out)?;
            }
            Version::V5 => {
                let mut c = v5::Connect::new(client_id);
                c.keep_alive = keep_alive;
                c.clean_session = true;
                c.write(out)?;
            }
        }
        Ok(())
    }

    pub fn subscribe(self, filter: &str, qos: QoS, pkid: u16, out: &mut BytesMut) -> Result<()> {
        match self {
            Version::V4 => {
                let mut s = v4::Subscribe::new(filter, qos);
                s.pkid = pkid;
                s.write(out)?;
            }
            Version::V5 => {
                let mut s = v5::Subscribe::new(filter, qos);
                s.pkid = pkid;
                s.write(out)?;
            }
        }
        Ok(())
    }

    pub fn publish(
        self,
        topic: &str,
        qos: QoS,
        pkid: u16,
        payload: Vec<u8>,
        out: &mut BytesMut,
    ) -> Result<()> {
        match self {
            Version::V4 => {
                let mut p = v4::Publish::new(topic, qos, payload);
                p.pkid = pkid;
                p.write(out)?;
            }
            Version::V5 => {
                let mut p = v5::Publish::new(topic, qos, payload);
                p.pkid = pkid;
                p.write(out)?;
            }
        }
        Ok(())
    }

    /// Bytes between a PUBLISH's packet id and its payload (v5: the properties
    /// length, 0).
    pub fn after_pkid(self) -> usize {
        match self {
            Version::V4 => 0,
            Version::V5 => 1,
        }
    }

    pub fn puback(self, pkid: u16, out: &mut BytesMut) -> Result<()> {
        match self {
            Version::V4 => v4::PubAck::new(pkid).write(out)?,
            // Success and no properties: the short form, as 3.1.1.
            Version::V5 => v5::PubAck::new(pkid).write(out)?,
        };
        Ok(())
    }

    pub fn pingreq(self, out: &mut BytesMut) -> Result<()> {
        match self {
            Version::V4 => v4::PingReq.write(out)?,
            Version::V5 => v5::PingReq.write(out)?,
        };
        Ok(())
    }

    pub fn disconnect(self, out: &mut BytesMut) -> Result<()> {
        match self {
            Version::V4 => v4::Disconnect.write(out)?,
            Version::V5 => v5::Disconnect::new().write(out)?,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_reads_what_it_writes() {
        for v in [Version::V4, Version::V5] {
            let mut out = BytesMut::new();
            v.publish("a/b", QoS::AtLeastOnce, 7, b"payload".to_vec(), &mut out)
                .unwrap();
            // The packet id sits `after_pkid` bytes before the payload.
            let at = out.len() - b"payload".len() - v.after_pkid() - 2;
            assert_eq!(out[at..at + 2], 7u16.to_be_bytes());
            v.puback(7, &mut out).unwrap();
            match v.read(&mut out, 1 << 20).unwrap() {
                Pkt::Publish { pkid, qos, payload } => {
                    assert_eq!(
                        (pkid, qos, &payload[..]),
                        (7, QoS::AtLeastOnce, &b"payload"[..])
                    )
                }
                other => panic!("{v:?}: {other:?}"),
            }
            assert!(matches!(v.read(&mut out, 1 << 20).unwrap(), Pkt::PubAck));
        }
    }
}
