//! Entry points for the fuzz targets in `fuzz/` (feature `fuzz`; not public API).

use bytes::BytesMut;

use crate::codec::{self, Version};

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
            match codec::read(version, &mut buf, max) {
                Ok(Some(packet)) => {
                    read += 1;
                    let mut out = BytesMut::new();
                    // (A 3.1.1 DISCONNECT is written as nothing: the server just closes.)
                    if codec::write(version, &packet, &mut out).is_ok() && !out.is_empty() {
                        let len = out.len();
                        match codec::read(version, &mut out, len.max(max)) {
                            Ok(Some(back)) => assert_eq!(
                                format!("{back:?}"),
                                format!("{packet:?}"),
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
