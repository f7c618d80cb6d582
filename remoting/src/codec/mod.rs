//! The RocketMQ remoting frame codec: pure functions over byte buffers, no I/O.
//!
//! ```text
//! +------------+--------------------------+-------------+-----------+
//! | total: u32 | type: u8 | header_len:u24 | header      | body      |
//! +------------+--------------------------+-------------+-----------+
//!   not counted   serialization of header    header_len    the rest
//!   in `total`    (0 = JSON, 1 = ROCKETMQ)   bytes
//! ```
//!
//! All integers are big-endian. `total` counts everything after itself. The header is a
//! [`RemotingCommand`] without its body, in one of the two [`SerializeType`]s; see
//! `docs/remoting.md` for worked byte examples.
//!
//! [`FrameCodec::decode`] follows the mini-redis split of *check* then *parse*: a buffer
//! that does not yet hold a whole frame is `Ok(None)` and is left untouched; a frame whose
//! length prefix exceeds the limit is rejected before any of it is buffered.

mod binary;
pub mod fastjson;
mod fields;
mod json;
#[cfg(test)]
mod tests;

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use fields::{ExtFields, FieldName};

/// Default upper bound on `total` (the length prefix): 16 MiB, as RocketMQ's
/// `com.rocketmq.remoting.frameMaxLength`.
pub const DEFAULT_MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// The largest header the 24-bit length field can describe.
pub const MAX_HEADER_LEN: usize = 0x00FF_FFFF;

/// Bit 0 of [`RemotingCommand::flag`]: the command is a response.
pub const FLAG_RESPONSE: i32 = 1;
/// Bit 1 of [`RemotingCommand::flag`]: the request expects no response.
pub const FLAG_ONEWAY: i32 = 1 << 1;

/// Why a frame could not be decoded or encoded. Any decode error means the byte stream
/// can no longer be trusted: close that connection (and only that one).
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: usize },
    #[error("frame of {len} bytes is too short to hold a header-length word")]
    FrameTooShort { len: u32 },
    #[error("header length {header_len} does not fit in a frame of {frame_len} bytes")]
    HeaderOutOfBounds { header_len: usize, frame_len: usize },
    #[error("unknown header serialization type {0}")]
    UnknownSerializeType(u8),
    #[error("malformed JSON header")]
    JsonHeader(#[source] serde_json::Error),
    #[error("malformed ROCKETMQ header: {what}")]
    BinaryHeader { what: &'static str },
    #[error("header of {len} bytes does not fit the 24-bit length field")]
    HeaderTooLarge { len: usize },
}

/// How a command's header is serialized (the high byte of the header-length word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SerializeType {
    /// fastjson text, the default of the Java client and server.
    #[default]
    Json,
    /// RocketMQ's compact binary layout (`RocketMQSerializable`).
    RocketMq,
}

impl SerializeType {
    pub fn code(self) -> u8 {
        match self {
            SerializeType::Json => 0,
            SerializeType::RocketMq => 1,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(SerializeType::Json),
            1 => Some(SerializeType::RocketMq),
            _ => None,
        }
    }

    /// The name Java writes in `serializeTypeCurrentRPC`.
    pub fn name(self) -> &'static str {
        match self {
            SerializeType::Json => "JSON",
            SerializeType::RocketMq => "ROCKETMQ",
        }
    }
}

/// The client implementation language (`LanguageCode` in Java). The binary header carries
/// the number, the JSON header the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LanguageCode {
    #[default]
    Java,
    Cpp,
    DotNet,
    Python,
    Delphi,
    Erlang,
    Ruby,
    /// Also what an unknown number or name decodes to.
    Other,
    Http,
    Go,
    Php,
    Oms,
    Rust,
    NodeJs,
}

const LANGUAGES: [(LanguageCode, &str); 14] = [
    (LanguageCode::Java, "JAVA"),
    (LanguageCode::Cpp, "CPP"),
    (LanguageCode::DotNet, "DOTNET"),
    (LanguageCode::Python, "PYTHON"),
    (LanguageCode::Delphi, "DELPHI"),
    (LanguageCode::Erlang, "ERLANG"),
    (LanguageCode::Ruby, "RUBY"),
    (LanguageCode::Other, "OTHER"),
    (LanguageCode::Http, "HTTP"),
    (LanguageCode::Go, "GO"),
    (LanguageCode::Php, "PHP"),
    (LanguageCode::Oms, "OMS"),
    (LanguageCode::Rust, "RUST"),
    (LanguageCode::NodeJs, "NODE_JS"),
];

impl LanguageCode {
    pub fn code(self) -> u8 {
        LANGUAGES.iter().position(|(l, _)| *l == self).unwrap_or(7) as u8
    }

    pub fn from_code(code: u8) -> Self {
        LANGUAGES
            .get(usize::from(code))
            .map_or(LanguageCode::Other, |(l, _)| *l)
    }

    pub fn name(self) -> &'static str {
        LANGUAGES[usize::from(self.code())].1
    }

    pub fn from_name(name: &str) -> Self {
        LANGUAGES
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(name))
            .map_or(LanguageCode::Other, |(l, _)| *l)
    }
}

impl fmt::Display for LanguageCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One remoting request or response.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RemotingCommand {
    /// A request code ([`crate::code::request`]) or response code ([`crate::code::response`]).
    pub code: i32,
    pub language: LanguageCode,
    /// The sender's RocketMQ version ordinal (`MQVersion.Version`).
    pub version: i32,
    /// Request id; a response carries the opaque of its request.
    pub opaque: i32,
    /// [`FLAG_RESPONSE`] | [`FLAG_ONEWAY`].
    pub flag: i32,
    pub remark: Option<String>,
    /// The request/response "custom header", flattened to strings as Java does.
    pub ext_fields: ExtFields,
    /// Empty when the command has no body.
    pub body: Bytes,
    /// How the header was decoded, and how [`FrameCodec::encode`] will write it.
    pub serialize_type: SerializeType,
}

impl RemotingCommand {
    /// A request with the given code, no fields, no body.
    pub fn request(code: i32, opaque: i32) -> Self {
        RemotingCommand {
            code,
            opaque,
            ..Default::default()
        }
    }

    /// The response to `request`: same opaque and header serialization, response flag
    /// set, our own language and version.
    pub fn response_to(request: &RemotingCommand, code: i32) -> Self {
        RemotingCommand {
            code,
            language: LanguageCode::Rust,
            version: crate::code::version::CURRENT,
            opaque: request.opaque,
            flag: FLAG_RESPONSE,
            serialize_type: request.serialize_type,
            ..Default::default()
        }
    }

    pub fn with_field(mut self, key: impl Into<FieldName>, value: impl ToString) -> Self {
        // A builder: appended, not searched for (a later value of a key wins).
        self.ext_fields.append(key, value.to_string());
        self
    }

    /// [`RemotingCommand::with_field`] for a constant value, without allocating it.
    pub fn with_static_field(mut self, key: impl Into<FieldName>, value: &'static str) -> Self {
        self.ext_fields.append_static(key, value);
        self
    }

    pub fn with_remark(mut self, remark: impl Into<String>) -> Self {
        self.remark = Some(remark.into());
        self
    }

    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// An ext field by name.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.ext_fields.get(key)
    }

    /// [`RemotingCommand::field`] as `Bytes` shared with the received frame.
    pub fn field_bytes(&self, key: &str) -> Option<bytes::Bytes> {
        self.ext_fields.get_bytes(key)
    }
}

/// Frame codec with a configurable frame-size limit.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max_frame_len: usize,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec {
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
        }
    }
}

impl FrameCodec {
    /// `max_frame_len` bounds the length prefix (everything after the first 4 bytes).
    pub fn new(max_frame_len: usize) -> Self {
        FrameCodec { max_frame_len }
    }

    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    /// Takes one whole frame off the front of `buf`.
    ///
    /// `Ok(None)`: not enough bytes yet, `buf` is unchanged. `Err`: the stream is corrupt
    /// (or hostile); the caller should drop the connection.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<RemotingCommand>, CodecError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let total = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if total as u64 > self.max_frame_len as u64 {
            return Err(CodecError::FrameTooLarge {
                len: total.into(),
                max: self.max_frame_len,
            });
        }
        if total < 4 {
            return Err(CodecError::FrameTooShort { len: total });
        }
        let total = total as usize;
        if buf.len() < 4 + total {
            // No reserve here: a peer could make us allocate the limit with 4 bytes.
            return Ok(None);
        }
        buf.advance(4);
        let mut frame = buf.split_to(total).freeze();
        let word = frame.get_u32();
        let kind = (word >> 24) as u8;
        let header_len = (word & 0x00FF_FFFF) as usize;
        if header_len > frame.len() {
            return Err(CodecError::HeaderOutOfBounds {
                header_len,
                frame_len: total,
            });
        }
        let header = frame.split_to(header_len);
        let serialize_type =
            SerializeType::from_code(kind).ok_or(CodecError::UnknownSerializeType(kind))?;
        let mut cmd = match serialize_type {
            SerializeType::Json => json::decode_header(&header)?,
            SerializeType::RocketMq => binary::decode_header(&header)?,
        };
        cmd.serialize_type = serialize_type;
        cmd.body = frame;
        Ok(Some(cmd))
    }

    /// Appends `cmd` as one frame to `dst`.
    ///
    /// A ROCKETMQ-typed command whose code or version does not fit the binary header's
    /// 16-bit fields (e.g. POP codes like 200050) is written with a JSON header instead,
    /// rather than truncated as Java does.
    pub fn encode(&self, cmd: &RemotingCommand, dst: &mut BytesMut) -> Result<(), CodecError> {
        let binary_fits = i16::try_from(cmd.code).is_ok() && i16::try_from(cmd.version).is_ok();
        let kind = match cmd.serialize_type {
            SerializeType::RocketMq if binary_fits => SerializeType::RocketMq,
            _ => SerializeType::Json,
        };
        let header = match kind {
            SerializeType::Json => json::encode_header(cmd),
            SerializeType::RocketMq => binary::encode_header(cmd)?,
        };
        if header.len() > MAX_HEADER_LEN {
            return Err(CodecError::HeaderTooLarge { len: header.len() });
        }
        let total = 4 + header.len() + cmd.body.len();
        if total > self.max_frame_len {
            return Err(CodecError::FrameTooLarge {
                len: total as u64,
                max: self.max_frame_len,
            });
        }
        dst.reserve(4 + total);
        dst.put_u32(total as u32);
        dst.put_u32(u32::from(kind.code()) << 24 | header.len() as u32);
        dst.put_slice(&header);
        dst.put_slice(&cmd.body);
        Ok(())
    }
}

/// [`FrameCodec::decode`] with the default 16 MiB limit.
pub fn decode(buf: &mut BytesMut) -> Result<Option<RemotingCommand>, CodecError> {
    FrameCodec::default().decode(buf)
}

/// [`FrameCodec::encode`] with the default 16 MiB limit.
pub fn encode(cmd: &RemotingCommand, dst: &mut BytesMut) -> Result<(), CodecError> {
    FrameCodec::default().encode(cmd, dst)
}
