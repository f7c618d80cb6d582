//! A connection's encoded output: packets are appended here by every part of
//! the connection and written by its task's loop whenever the socket takes
//! them (many packets per socket write, see `conn.rs`). Also what encoding
//! needs to know of the client: its protocol version and whether it wants
//! reason strings.

use bytes::BytesMut;
use mqttbytes::v5::Packet;

use crate::codec::{self, Version};
use crate::outgoing::Outgoing;

/// An output buffer larger than this is dropped once written out.
const KEEP: usize = 4096;

pub(crate) struct Output {
    /// Encoded packets not yet written to the socket.
    buf: BytesMut,
    version: Version,
    /// The client asked for reason strings (v5; the default).
    problem_info: bool,
    /// The v5 client's Maximum Packet Size (`u32::MAX`: none given). A `u32` fits
    /// the padding after the flags: the connection task stays in its allocation
    /// class (`server::tests`).
    client_max: u32,
}

impl Output {
    pub fn new(version: Version) -> Output {
        Output {
            buf: BytesMut::new(),
            version,
            problem_info: true,
            client_max: u32::MAX,
        }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn v5(&self) -> bool {
        self.version == Version::V5
    }

    /// The v5 client's Request Problem Information.
    pub fn set_problem_info(&mut self, wanted: bool) {
        self.problem_info = wanted;
    }

    /// The v5 client's Maximum Packet Size: no packet other than a PUBLISH (which
    /// the window handles) is written larger; see [`Output::send`].
    pub fn set_client_max_packet(&mut self, max: u32) {
        self.client_max = max;
    }

    /// Encodes `p`. A packet that would exceed the client's Maximum Packet Size is
    /// written without its reason string and user properties (MQTT 5 forbids sending
    /// them then: 3.2.2-19/20, 3.4.2-2/3 … 3.14.2-3/4) and is dropped if it is
    /// still too large (no such control packet exists at the smallest legal limit).
    pub fn send(&mut self, p: &Packet) {
        let start = self.buf.len();
        if let Err(e) = codec::write(self.version, p, &mut self.buf) {
            tracing::warn!(error = %e, "encoding a packet failed");
            self.buf.truncate(start);
            return;
        }
        let max = self.client_max as usize;
        if self.buf.len() - start <= max {
            return;
        }
        self.buf.truncate(start);
        let lean = codec::without_diagnostics(p);
        if codec::write(self.version, &lean, &mut self.buf).is_err() || self.buf.len() - start > max
        {
            self.buf.truncate(start);
            tracing::debug!(
                max = self.client_max,
                "a packet larger than the client accepts was not sent"
            );
        }
    }

    /// An AUTH packet (enhanced authentication), within the client's Maximum
    /// Packet Size as [`Output::send`] does it (MQTT-3.15.2-2/3).
    pub fn send_auth(&mut self, p: &codec::AuthPacket) {
        let start = self.buf.len();
        let mut lean = None;
        loop {
            let packet = lean.as_ref().unwrap_or(p);
            if let Err(e) = codec::write_auth(packet, &mut self.buf) {
                tracing::warn!(error = %e, "encoding an AUTH failed");
                self.buf.truncate(start);
                return;
            }
            if self.buf.len() - start <= self.client_max as usize {
                return;
            }
            self.buf.truncate(start);
            if lean.is_some() {
                tracing::debug!(
                    max = self.client_max,
                    "an AUTH larger than the client accepts was not sent"
                );
                return;
            }
            let mut l = p.clone();
            l.reason_string = None;
            l.user_properties.clear();
            lean = Some(l);
        }
    }

    /// One PUBLISH as a session holds it (the hot path, see [`codec::write_outgoing`]).
    pub fn publish(&mut self, p: &Outgoing) {
        if let Err(e) = codec::write_outgoing(self.version, p, &mut self.buf) {
            tracing::warn!(error = %e, "encoding a publish failed");
        }
    }

    /// A reason string, for a client that takes them.
    pub fn reason(&self, s: String) -> Option<String> {
        (self.version == Version::V5 && self.problem_info).then_some(s)
    }

    /// Bytes waiting for the socket.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The buffer, for the socket to take from.
    pub fn buf(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// All of it was written: a large buffer is not kept for an idle connection.
    pub fn written(&mut self) {
        if self.buf.capacity() > KEEP {
            self.buf = BytesMut::new();
        }
    }

    /// What is left, for the last write of a connection.
    pub fn take(&mut self) -> BytesMut {
        std::mem::take(&mut self.buf)
    }
}
