//! Feeds arbitrary bytes to the frame decoder, in arbitrary chunk sizes. Properties: no
//! panic, no unbounded buffering, and every decoded command re-encodes to a frame that
//! decodes to the same command.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rocketgate_remoting::FrameCodec;

fuzz_target!(|data: &[u8]| {
    let codec = FrameCodec::new(64 * 1024);
    // The first byte picks a chunk size, so partial-frame paths get exercised too.
    let (chunk, data) = match data.split_first() {
        Some((c, rest)) => (usize::from(*c).max(1), rest),
        None => return,
    };
    let mut buf = BytesMut::new();
    for piece in data.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(cmd)) => {
                    let mut again = BytesMut::new();
                    if codec.encode(&cmd, &mut again).is_ok() {
                        let back = codec.decode(&mut again).expect("re-decode").expect("whole frame");
                        assert_eq!(back, cmd);
                        assert!(again.is_empty());
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(buf.len() <= 4 + codec.max_frame_len() + chunk);
    }
});
