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
}

impl Output {
    pub fn new(version: Version) -> Output {
        Output {
            buf: BytesMut::new(),
            version,
            problem_info: true,
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

    pub fn send(&mut self, p: &Packet) {
        if let Err(e) = codec::write(self.version, p, &mut self.buf) {
            tracing::warn!(error = %e, "encoding a packet failed");
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
