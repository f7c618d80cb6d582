//! The replication (HA) stream of a broker group: a protocol of its own on its own
//! port (`listen.ha`), RocketMQ's HA channel with a handshake (docs/replication.md).
//!
//! - [`codec`]: the frames, pure.
//! - [`master::serve`]: the master's listener; per slave one task that checks the
//!   slave's HELLO (version, group, broker id, secret, segment size, and that its log
//!   does not end beyond the master's), then streams log runs from where the slave's
//!   log ends, with heartbeats, and reports the slave's acks to its [`master::Source`].
//! - [`slave::spawn`]: the slave's connect-and-follow loop, appending every run to its
//!   [`slave::Target`] and acknowledging what it holds; reconnects with back-off.
//!
//! In controller mode (protocol version 2) HELLO and WELCOME carry master epochs: a
//! master refuses a slave that knows a newer epoch (`StaleMaster`), tells a slave whose
//! log parts from its own where to cut it, and a slave refuses a master below the
//! epoch it knows. Both sides' epoch defaults (0, no list) keep version 1 and its rules
//! (docs/replication.md, "Epochs and truncation").
//!
//! What the log *is* stays the caller's: the binary implements [`master::Source`] and
//! [`slave::Target`] over the store.

pub mod codec;
pub mod master;
mod meters;
pub mod slave;

pub use codec::{Frame, FrameError, Hello, RefuseCode, VERSION, VERSION_1};

/// A byte stream the replication channel runs over: a `TcpStream`, or TLS over one
/// (the binary wraps it with `rocketgate-tls`; this crate knows no TLS).
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Io for T {}

/// A boxed [`Io`].
pub type BoxIo = Box<dyn Io>;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Reads the next frame from `io` into `buf`; `Ok(None)` at a clean end of stream.
/// Cancel-safe: bytes read stay in `buf`. A DATA frame's bytes are `buf`'s memory
/// (no copy); the buffer is grown to hold a whole run (up to 4 MiB ahead: a peer's
/// frame header alone does not reserve more), so a run is read in few calls.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
) -> std::io::Result<Option<Frame>> {
    loop {
        match Frame::decode_from(buf) {
            Ok(Some(frame)) => return Ok(Some(frame)),
            Ok(None) => {}
            Err(e) => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
            }
        }
        let want = Frame::len_of(buf)
            .unwrap_or(0)
            .saturating_sub(buf.len())
            .clamp(64 * 1024, 4 << 20);
        if buf.capacity() - buf.len() < want {
            buf.reserve(want.max(256 * 1024));
        }
        if io.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
    }
}

/// Compares secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}
