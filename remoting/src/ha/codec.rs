//! The replication stream's frames (docs/replication.md has the byte layout). Pure:
//! no tokio, no sockets. A short buffer is `Ok(None)` (read more), never an error.
//!
//! Every frame is `kind: u8 | len: u32 BE | payload[len]`; integers are big-endian.
//!
//! | kind | name    | direction      | payload                                                        |
//! |------|---------|----------------|----------------------------------------------------------------|
//! | 1    | HELLO   | slave → master | version u16, broker_id u64, log_end u64, segment_size u64, group (u16 len + UTF-8), secret (u16 len + bytes); version 2 adds epoch u64, epochs |
//! | 2    | WELCOME | master → slave | version u16, start u64, master_end u64; version 2 adds epoch u64, epochs |
//! | 3    | REFUSE  | master → slave | code u16, reason UTF-8 (rest of the frame); then close          |
//! | 4    | DATA    | master → slave | offset u64, confirmed u64, log bytes (empty = heartbeat)       |
//! | 5    | ACK     | slave → master | log_end u64 (what it holds; also where the stream continues)   |
//! | 6    | OFFSETS | slave → master | consumer positions committed on the slave (JSON: owner → topic → queue → offset) |
//!
//! `epochs` is `count u32` then `count` × `(epoch u64, start u64)`: an epoch file
//! (core's `store::epoch`). A master answers a HELLO in the version it came in.

/// The newest protocol version: HELLO and WELCOME carry master epochs (controller
/// mode, docs/controller.md).
pub const VERSION: u16 = 2;
/// The first version, without epochs: what a slave sends while no epochs are in play
/// (byte for byte what slaves sent before version 2, so an older master admits it),
/// and what a master answers it with.
pub const VERSION_1: u16 = 1;
/// The largest frame accepted (a run is at most a few MiB; a record at most 2 GiB is
/// impossible here: records are bounded by `store.max_message_size`).
pub const MAX_FRAME: usize = 64 << 20;
/// Bytes before a frame's payload.
pub const HEADER: usize = 5;
/// Bytes of a DATA frame before its log bytes: the frame header, `offset`, `confirmed`.
pub const DATA_HEADER: usize = HEADER + 16;

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const REFUSE: u8 = 3;
const DATA: u8 = 4;
const ACK: u8 = 5;
const OFFSETS: u8 = 6;

/// A slave's opening frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub broker_id: u64,
    /// Where the slave's log ends: the stream starts here.
    pub log_end: u64,
    pub segment_size: u64,
    /// `broker.name`: master and slave must be one group.
    pub group: String,
    pub secret: Vec<u8>,
    /// Version 2: the master epoch the slave learned from the controller (0: not in
    /// controller mode). A master at a lower epoch refuses it (`StaleMaster`).
    pub epoch: u64,
    /// Version 2: the slave's epoch file, `(epoch, start)` oldest first.
    pub epochs: Vec<(u64, u64)>,
}

/// Why a master refuses a slave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum RefuseCode {
    Version = 1,
    Secret = 2,
    Group = 3,
    /// The slave's log ends beyond the master's (rocketmq#1155/#3015).
    BeyondEnd = 4,
    /// The slave's log ends before the master's oldest retained byte and is not empty.
    Gap = 5,
    SegmentSize = 6,
    /// The slave's id is 0 (a master's).
    BrokerId = 7,
    /// A frame the master did not expect.
    Protocol = 8,
    /// The slave knows a higher master epoch than this master's: a newer master
    /// exists, and this one must gather no copies (version 2).
    StaleMaster = 9,
}

impl RefuseCode {
    fn from_u16(v: u16) -> Option<RefuseCode> {
        use RefuseCode::*;
        [
            Version,
            Secret,
            Group,
            BeyondEnd,
            Gap,
            SegmentSize,
            BrokerId,
            Protocol,
            StaleMaster,
        ]
        .into_iter()
        .find(|c| *c as u16 == v)
    }
}

/// One frame of the replication stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Hello(Hello),
    /// `start`: where the stream begins. Below the slave's end (version 2 only) it is
    /// where the slave's log parts from the master's: the slave cuts its log there
    /// before it may follow.
    Welcome {
        version: u16,
        start: u64,
        master_end: u64,
        /// Version 2: the master's epoch (0: not in controller mode).
        epoch: u64,
        /// Version 2: the master's epoch file.
        epochs: Vec<(u64, u64)>,
    },
    Refuse {
        code: RefuseCode,
        reason: String,
    },
    /// Log bytes at `offset`; `confirmed` is the master's high watermark.
    Data {
        offset: u64,
        confirmed: u64,
        bytes: bytes::Bytes,
    },
    Ack {
        log_end: u64,
    },
    /// Consumer positions committed through the slave's doors (the master takes the
    /// higher of each with its own).
    Offsets {
        body: bytes::Bytes,
    },
}

/// A frame that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the maximum of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame kind {kind} of {len} bytes is malformed: {what}")]
    Malformed {
        kind: u8,
        len: usize,
        what: &'static str,
    },
}

impl Frame {
    /// The frame's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "HELLO",
            Frame::Welcome { .. } => "WELCOME",
            Frame::Refuse { .. } => "REFUSE",
            Frame::Data { .. } => "DATA",
            Frame::Ack { .. } => "ACK",
            Frame::Offsets { .. } => "OFFSETS",
        }
    }

    /// Appends the frame's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER]);
        let kind = match self {
            Frame::Hello(h) => {
                out.extend_from_slice(&h.version.to_be_bytes());
                out.extend_from_slice(&h.broker_id.to_be_bytes());
                out.extend_from_slice(&h.log_end.to_be_bytes());
                out.extend_from_slice(&h.segment_size.to_be_bytes());
                put_short(out, h.group.as_bytes());
                put_short(out, &h.secret);
                if h.version >= VERSION {
                    put_epochs(out, h.epoch, &h.epochs);
                }
                HELLO
            }
            Frame::Welcome {
                version,
                start,
                master_end,
                epoch,
                epochs,
            } => {
                out.extend_from_slice(&version.to_be_bytes());
                out.extend_from_slice(&start.to_be_bytes());
                out.extend_from_slice(&master_end.to_be_bytes());
                if *version >= VERSION {
                    put_epochs(out, *epoch, epochs);
                }
                WELCOME
            }
            Frame::Refuse { code, reason } => {
                out.extend_from_slice(&(*code as u16).to_be_bytes());
                out.extend_from_slice(reason.as_bytes());
                REFUSE
            }
            Frame::Data {
                offset,
                confirmed,
                bytes,
            } => {
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&confirmed.to_be_bytes());
                out.extend_from_slice(bytes);
                DATA
            }
            Frame::Ack { log_end } => {
                out.extend_from_slice(&log_end.to_be_bytes());
                ACK
            }
            Frame::Offsets { body } => {
                out.extend_from_slice(body);
                OFFSETS
            }
        };
        let len = (out.len() - start - HEADER) as u32;
        out[start] = kind;
        out[start + 1..start + HEADER].copy_from_slice(&len.to_be_bytes());
    }

    /// The head of a DATA frame carrying `len` log bytes, which follow it on the wire
    /// as they are: a master writes this and a slice of its mapped log in one vectored
    /// write instead of copying the run into a frame ([`Frame::encode`] gives the same
    /// bytes).
    pub fn data_header(offset: u64, confirmed: u64, len: usize) -> [u8; DATA_HEADER] {
        let mut h = [0u8; DATA_HEADER];
        h[0] = DATA;
        h[1..HEADER].copy_from_slice(&((len + 16) as u32).to_be_bytes());
        h[HEADER..HEADER + 8].copy_from_slice(&offset.to_be_bytes());
        h[HEADER + 8..].copy_from_slice(&confirmed.to_be_bytes());
        h
    }

    /// The length of the frame at the front of `buf` once its header is there
    /// (whether or not the rest is); `None` before.
    pub fn len_of(buf: &[u8]) -> Option<usize> {
        let h = buf.get(..HEADER)?;
        Some(HEADER + u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize)
    }

    /// Whether `buf` starts with a whole frame.
    pub fn is_complete(buf: &[u8]) -> bool {
        Frame::len_of(buf).is_some_and(|n| buf.len() >= n)
    }

    /// [`Frame::decode`] that takes the frame off the front of `buf`; the bytes of
    /// DATA and OFFSETS frames are shared with `buf`'s memory, not copied.
    pub fn decode_from(buf: &mut bytes::BytesMut) -> Result<Option<Frame>, FrameError> {
        if buf.first() != Some(&DATA) {
            let Some((frame, n)) = Frame::decode(buf)? else {
                return Ok(None);
            };
            let _ = buf.split_to(n);
            return Ok(Some(frame));
        }
        // DATA: check it as `decode` does (short buffers, size, short payload) but
        // without its copy of the log bytes.
        let n = match Frame::len_of(buf) {
            Some(n) if n - HEADER > MAX_FRAME => return Err(FrameError::TooLarge(n - HEADER)),
            Some(n) if buf.len() >= n => n,
            _ => return Ok(None),
        };
        if n < DATA_HEADER {
            return Err(FrameError::Malformed {
                kind: DATA,
                len: n - HEADER,
                what: "short data",
            });
        }
        let frame = buf.split_to(n).freeze();
        let word = |at: usize| u64::from_be_bytes(frame[at..at + 8].try_into().expect("8 bytes"));
        Ok(Some(Frame::Data {
            offset: word(HEADER),
            confirmed: word(HEADER + 8),
            bytes: frame.slice(DATA_HEADER..),
        }))
    }

    /// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are
    /// needed, else the frame and how many bytes it took.
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
        if buf.len() < HEADER {
            return Ok(None);
        }
        let kind = buf[0];
        if !(HELLO..=OFFSETS).contains(&kind) {
            return Err(FrameError::UnknownKind(kind));
        }
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if buf.len() < HEADER + len {
            return Ok(None);
        }
        let p = &buf[HEADER..HEADER + len];
        let bad = |what| FrameError::Malformed { kind, len, what };
        let mut r = Reader(p);
        let frame = match kind {
            HELLO => {
                let version = r.u16().ok_or(bad("short hello"))?;
                let broker_id = r.u64().ok_or(bad("short hello"))?;
                let log_end = r.u64().ok_or(bad("short hello"))?;
                let segment_size = r.u64().ok_or(bad("short hello"))?;
                let group = r.short().ok_or(bad("short group"))?;
                let group =
                    String::from_utf8(group.to_vec()).map_err(|_| bad("group not UTF-8"))?;
                let secret = r.short().ok_or(bad("short secret"))?.to_vec();
                let (epoch, epochs) = r.epochs(version).ok_or(bad("malformed hello epochs"))?;
                Frame::Hello(Hello {
                    version,
                    broker_id,
                    log_end,
                    segment_size,
                    group,
                    secret,
                    epoch,
                    epochs,
                })
            }
            WELCOME => {
                let version = r.u16().ok_or(bad("short welcome"))?;
                let start = r.u64().ok_or(bad("short welcome"))?;
                let master_end = r.u64().ok_or(bad("short welcome"))?;
                let (epoch, epochs) = r.epochs(version).ok_or(bad("malformed welcome epochs"))?;
                Frame::Welcome {
                    version,
                    start,
                    master_end,
                    epoch,
                    epochs,
                }
            }
            REFUSE => {
                let code = r.u16().ok_or(bad("short refuse"))?;
                let code = RefuseCode::from_u16(code).ok_or(bad("unknown refuse code"))?;
                let reason = String::from_utf8_lossy(r.0).into_owned();
                Frame::Refuse { code, reason }
            }
            DATA => {
                let offset = r.u64().ok_or(bad("short data"))?;
                let confirmed = r.u64().ok_or(bad("short data"))?;
                Frame::Data {
                    offset,
                    confirmed,
                    bytes: bytes::Bytes::copy_from_slice(r.0),
                }
            }
            ACK => {
                let log_end = r.u64().ok_or(bad("short ack"))?;
                r.end().ok_or(bad("bytes after the ack"))?;
                Frame::Ack { log_end }
            }
            _ => Frame::Offsets {
                body: bytes::Bytes::copy_from_slice(r.0),
            },
        };
        Ok(Some((frame, HEADER + len)))
    }
}

fn put_epochs(out: &mut Vec<u8>, epoch: u64, epochs: &[(u64, u64)]) {
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(&(epochs.len() as u32).to_be_bytes());
    for (e, start) in epochs {
        out.extend_from_slice(&e.to_be_bytes());
        out.extend_from_slice(&start.to_be_bytes());
    }
}

fn put_short(out: &mut Vec<u8>, b: &[u8]) {
    let n = b.len().min(u16::MAX as usize);
    out.extend_from_slice(&(n as u16).to_be_bytes());
    out.extend_from_slice(&b[..n]);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
    }
    fn short(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
    /// The rest of a HELLO or WELCOME after its version-1 fields: nothing in version
    /// 1, the epochs in version 2; in a version this build does not know, the rest is
    /// skipped (the master then refuses the version by name, not as garbage).
    fn epochs(&mut self, version: u16) -> Option<(u64, Vec<(u64, u64)>)> {
        match version {
            VERSION_1 => self.end().map(|_| (0, Vec::new())),
            VERSION => {
                let epoch = self.u64()?;
                let n = self
                    .take(4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))?;
                if self.0.len() != (n as usize).checked_mul(16)? {
                    return None;
                }
                let epochs = (0..n)
                    .map(|_| Some((self.u64()?, self.u64()?)))
                    .collect::<Option<Vec<_>>>()?;
                Some((epoch, epochs))
            }
            _ => {
                self.0 = &[];
                Some((0, Vec::new()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                version: VERSION_1,
                broker_id: 1,
                log_end: 12345,
                segment_size: 1 << 30,
                group: "broker-a".into(),
                secret: b"s3cret".to_vec(),
                epoch: 0,
                epochs: vec![],
            }),
            Frame::Hello(Hello {
                version: VERSION,
                broker_id: 2,
                log_end: 12345,
                segment_size: 1 << 30,
                group: "broker-a".into(),
                secret: b"s3cret".to_vec(),
                epoch: 7,
                epochs: vec![(1, 0), (4, 4096), (7, 1 << 40)],
            }),
            Frame::Hello(Hello {
                version: VERSION,
                broker_id: 2,
                log_end: 0,
                segment_size: 1 << 30,
                group: "g".into(),
                secret: vec![],
                epoch: 3,
                epochs: vec![],
            }),
            Frame::Welcome {
                version: VERSION_1,
                start: 0,
                master_end: 99,
                epoch: 0,
                epochs: vec![],
            },
            Frame::Welcome {
                version: VERSION,
                start: 40,
                master_end: 99,
                epoch: u64::MAX,
                epochs: vec![(2, 0), (u64::MAX, 50)],
            },
            Frame::Refuse {
                code: RefuseCode::StaleMaster,
                reason: "this master is at epoch 2, the slave knows 3".into(),
            },
            Frame::Refuse {
                code: RefuseCode::Secret,
                reason: "wrong secret".into(),
            },
            Frame::Data {
                offset: 7,
                confirmed: 3,
                bytes: bytes::Bytes::from_static(b"records"),
            },
            Frame::Data {
                offset: 7,
                confirmed: 3,
                bytes: bytes::Bytes::new(),
            },
            Frame::Ack { log_end: 42 },
        ]
    }

    #[test]
    fn every_frame_round_trips_and_a_short_buffer_asks_for_more() {
        let mut all = Vec::new();
        for f in frames() {
            f.encode(&mut all);
        }
        let mut at = 0;
        for f in frames() {
            // Every prefix of the frame is "incomplete", never an error.
            let (_, n) = Frame::decode(&all[at..]).unwrap().unwrap();
            for cut in 0..n {
                assert_eq!(Frame::decode(&all[at..at + cut]).unwrap(), None);
            }
            let (got, n) = Frame::decode(&all[at..]).unwrap().unwrap();
            assert_eq!(got, f);
            at += n;
        }
        assert_eq!(at, all.len());
    }

    #[test]
    fn frames_taken_off_a_buffer_equal_decoded_ones_and_share_its_memory() {
        let mut all = Vec::new();
        for f in frames() {
            f.encode(&mut all);
        }
        // Bytes arrive in pieces: a frame comes off only once whole, equal to `decode`'s.
        let mut buf = bytes::BytesMut::new();
        let mut got = Vec::new();
        for piece in all.chunks(7) {
            buf.extend_from_slice(piece);
            assert_eq!(
                Frame::is_complete(&buf),
                Frame::decode(&buf).unwrap().is_some()
            );
            while let Some(f) = Frame::decode_from(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames());
        assert!(buf.is_empty());

        // A DATA frame's bytes are a view of the buffer's memory, not a copy.
        let mut buf = bytes::BytesMut::new();
        buf.extend_from_slice(&Frame::data_header(7, 3, 4));
        buf.extend_from_slice(b"abcd");
        let start = buf.as_ptr() as usize;
        match Frame::decode_from(&mut buf).unwrap() {
            Some(Frame::Data {
                offset: 7,
                confirmed: 3,
                bytes,
            }) => {
                assert_eq!(&bytes[..], b"abcd");
                assert_eq!(bytes.as_ptr() as usize, start + DATA_HEADER);
            }
            other => panic!("{other:?}"),
        }
        // A DATA frame too short for its offsets is refused, as by `decode`.
        let mut short = bytes::BytesMut::from(&[DATA, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1][..]);
        assert!(matches!(
            Frame::decode_from(&mut short),
            Err(FrameError::Malformed { .. })
        ));
    }

    #[test]
    fn a_data_header_and_its_bytes_are_the_encoded_frame() {
        let mut framed = Vec::new();
        Frame::Data {
            offset: 1 << 40,
            confirmed: 77,
            bytes: bytes::Bytes::from_static(b"records"),
        }
        .encode(&mut framed);
        let mut vectored = Frame::data_header(1 << 40, 77, 7).to_vec();
        vectored.extend_from_slice(b"records");
        assert_eq!(vectored, framed);
    }

    #[test]
    fn version_1_frames_are_the_old_bytes_and_other_versions_are_read_for_their_number() {
        // Version 1 is what slaves sent before epochs existed: no field added.
        let mut v1 = Vec::new();
        Frame::Hello(Hello {
            version: VERSION_1,
            broker_id: 1,
            log_end: 5,
            segment_size: 64,
            group: "g".into(),
            secret: b"k".to_vec(),
            epoch: 0,
            epochs: vec![],
        })
        .encode(&mut v1);
        let mut want = vec![1u8, 0, 0, 0, 2 + 8 + 8 + 8 + 3 + 3, 0, 1];
        want.extend_from_slice(&1u64.to_be_bytes());
        want.extend_from_slice(&5u64.to_be_bytes());
        want.extend_from_slice(&64u64.to_be_bytes());
        want.extend_from_slice(&[0, 1, b'g', 0, 1, b'k']);
        assert_eq!(v1, want);
        let mut w = Vec::new();
        Frame::Welcome {
            version: VERSION_1,
            start: 1,
            master_end: 2,
            epoch: 0,
            epochs: vec![],
        }
        .encode(&mut w);
        assert_eq!(w.len(), HEADER + 2 + 8 + 8);
        // A version-1 HELLO with bytes after it is malformed (as it always was).
        let mut long = v1.clone();
        long.push(0);
        long[4] += 1;
        assert!(matches!(
            Frame::decode(&long),
            Err(FrameError::Malformed { .. })
        ));
        // A version from the future: its number is read, the rest skipped, so the
        // master can refuse it as a version (not as garbage).
        let mut v9 = v1.clone();
        v9[6] = 9;
        v9.extend_from_slice(b"future fields");
        v9[4] += 13;
        match Frame::decode(&v9).unwrap().unwrap().0 {
            Frame::Hello(h) => assert_eq!((h.version, h.epoch, h.epochs), (9, 0, vec![])),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_version_2_epoch_list_must_fill_the_frame_exactly() {
        let mut w = Vec::new();
        Frame::Welcome {
            version: VERSION,
            start: 1,
            master_end: 2,
            epoch: 3,
            epochs: vec![(1, 0), (3, 1)],
        }
        .encode(&mut w);
        // A count that claims more entries than there are bytes (no allocation of
        // 4 G entries, an error).
        let count_at = HEADER + 2 + 8 + 8 + 8;
        let mut big = w.clone();
        big[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Frame::decode(&big),
            Err(FrameError::Malformed { .. })
        ));
        // Fewer entries than bytes: trailing bytes are an error too.
        let mut less = w.clone();
        less[count_at..count_at + 4].copy_from_slice(&1u32.to_be_bytes());
        assert!(matches!(
            Frame::decode(&less),
            Err(FrameError::Malformed { .. })
        ));
        // A refusal code this build does not know is malformed, not a panic.
        let mut r = Vec::new();
        Frame::Refuse {
            code: RefuseCode::StaleMaster,
            reason: String::new(),
        }
        .encode(&mut r);
        r[HEADER + 1] = 99;
        assert!(matches!(
            Frame::decode(&r),
            Err(FrameError::Malformed { .. })
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_hang() {
        assert_eq!(
            Frame::decode(b"GET / HTTP/1.1\r\n"),
            Err(FrameError::UnknownKind(b'G'))
        );
        let huge = [4u8, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(Frame::decode(&huge), Err(FrameError::TooLarge(_))));
        let mut short_ack = Vec::new();
        Frame::Ack { log_end: 1 }.encode(&mut short_ack);
        short_ack[4] = 3;
        short_ack.truncate(8);
        assert!(matches!(
            Frame::decode(&short_ack),
            Err(FrameError::Malformed { .. })
        ));
    }
}
