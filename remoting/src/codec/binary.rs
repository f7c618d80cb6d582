//! The ROCKETMQ binary header (Java's `RocketMQSerializable`):
//!
//! ```text
//! code i16 | language u8 | version i16 | opaque i32 | flag i32
//! | remark_len i32 | remark bytes
//! | ext_len i32 | (key_len i16 | key | value_len i32 | value)*   (ext_len bytes in all)
//! ```

use bytes::{Buf, BufMut, Bytes};

use super::{CodecError, ExtFields, LanguageCode, RemotingCommand};

fn malformed(what: &'static str) -> CodecError {
    CodecError::BinaryHeader { what }
}

pub(super) fn decode_header(header: &Bytes) -> Result<RemotingCommand, CodecError> {
    let mut b = header.clone();
    if b.remaining() < 13 {
        return Err(malformed("fixed fields truncated"));
    }
    let code = i32::from(b.get_i16());
    let language = LanguageCode::from_code(b.get_u8());
    let version = i32::from(b.get_i16());
    let opaque = b.get_i32();
    let flag = b.get_i32();

    let remark_bytes = take_sized(&mut b, "remark")?;
    let remark = if remark_bytes.is_empty() {
        None
    } else {
        Some(utf8(remark_bytes, "remark is not UTF-8")?)
    };

    let ext = take_sized(&mut b, "extFields")?;
    let e = &ext[..];
    let mut ext_fields = ExtFields::decoding(ext.clone(), 16);
    let mut at = 0usize;
    while at < e.len() {
        let key_len = e
            .get(at..at + 2)
            .map(|l| i16::from_be_bytes([l[0], l[1]]))
            .ok_or_else(|| malformed("extFields key length truncated"))?;
        let key_len = usize::try_from(key_len).map_err(|_| malformed("negative key length"))?;
        let key = at + 2..at + 2 + key_len;
        if key.end > e.len() {
            return Err(malformed("extFields key truncated"));
        }
        let value_len = e
            .get(key.end..key.end + 4)
            .map(|l| i32::from_be_bytes([l[0], l[1], l[2], l[3]]))
            .ok_or_else(|| malformed("extFields value length truncated"))?;
        let value_len =
            usize::try_from(value_len).map_err(|_| malformed("negative value length"))?;
        let value = key.end + 4..key.end + 4 + value_len;
        if value.end > e.len() {
            return Err(malformed("extFields value truncated"));
        }
        at = value.end;
        ext_fields
            .push_span(key, value)
            .ok_or_else(|| malformed("extFields key or value is not UTF-8"))?;
    }
    // Like Java, bytes after the ext fields are ignored.

    Ok(RemotingCommand {
        code,
        language,
        version,
        opaque,
        flag,
        remark,
        ext_fields,
        ..Default::default()
    })
}

/// Reads an `i32` length and that many bytes.
fn take_sized(b: &mut Bytes, what: &'static str) -> Result<Bytes, CodecError> {
    if b.remaining() < 4 {
        return Err(malformed(what));
    }
    let len = b.get_i32();
    // Java treats a length <= 0 as "absent".
    let len = usize::try_from(len).unwrap_or(0);
    if b.remaining() < len {
        return Err(malformed(what));
    }
    Ok(b.split_to(len))
}

fn utf8(bytes: Bytes, what: &'static str) -> Result<String, CodecError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| malformed(what))
}

/// Caller guarantees `code` and `version` fit in an `i16`.
pub(super) fn encode_header(cmd: &RemotingCommand) -> Result<Vec<u8>, CodecError> {
    let remark = cmd.remark.as_deref().unwrap_or("").as_bytes();
    let fields = cmd.ext_fields.sorted();
    let ext_cap: usize = fields.iter().map(|(k, v)| 6 + k.len() + v.len()).sum();
    let mut ext = Vec::with_capacity(ext_cap);
    for (k, v) in fields {
        let key_len = i16::try_from(k.len()).map_err(|_| malformed("extFields key too long"))?;
        let value_len =
            i32::try_from(v.len()).map_err(|_| malformed("extFields value too long"))?;
        ext.put_i16(key_len);
        ext.put_slice(k.as_bytes());
        ext.put_i32(value_len);
        ext.put_slice(v.as_bytes());
    }
    let too_long = |_| CodecError::HeaderTooLarge {
        len: remark.len() + ext.len(),
    };
    let remark_len = i32::try_from(remark.len()).map_err(too_long)?;
    let ext_len = i32::try_from(ext.len()).map_err(too_long)?;

    let mut out = Vec::with_capacity(21 + remark.len() + ext.len());
    out.put_i16(cmd.code as i16);
    out.put_u8(cmd.language.code());
    out.put_i16(cmd.version as i16);
    out.put_i32(cmd.opaque);
    out.put_i32(cmd.flag);
    out.put_i32(remark_len);
    out.put_slice(remark);
    out.put_i32(ext_len);
    out.put_slice(&ext);
    Ok(out)
}
