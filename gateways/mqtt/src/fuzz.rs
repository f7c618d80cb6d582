//! Entry points for the fuzz targets in `fuzz/` (feature `fuzz`; not public API).

use bytes::BytesMut;

use crate::codec::{self, Frame, Version};

/// Reads packets off `data` as a `v5` (else 3.1.1) connection would, in chunks of
/// `chunk` bytes, with a `max`-byte packet limit. Every packet read is written back
/// and must read again as the same packet. Returns how many packets were read.
pub fn codec_roundtrip(v5: bool, chunk: usize, max: usize, data: &[u8]) -> usize {
    let version = if v5 { Version::V5 } else { Version::V4 };
    let mut buf = BytesMut::new();
    let mut read = 0;
    for piece in data.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match codec::read_frame(version, &mut buf, max) {
                Ok(Some(frame)) => {
                    read += 1;
                    let mut out = BytesMut::new();
                    // (A 3.1.1 DISCONNECT is written as nothing: the server just closes.)
                    let written = match &frame {
                        Frame::Packet(p) => codec::write(version, p, &mut out),
                        Frame::Auth(a) => codec::write_auth(a, &mut out),
                    };
                    if written.is_ok() && !out.is_empty() {
                        let len = out.len();
                        match codec::read_frame(version, &mut out, len.max(max)) {
                            Ok(Some(back)) => assert_eq!(
                                format!("{back:?}"),
                                format!("{frame:?}"),
                                "a packet written back reads differently"
                            ),
                            other => panic!("a packet written back does not read: {other:?}"),
                        }
                    }
                }
                Ok(None) => break,
                Err(_) => return read,
            }
        }
        assert!(
            buf.len() <= max + chunk,
            "{} bytes buffered with a {max}-byte limit",
            buf.len()
        );
    }
    read
}
