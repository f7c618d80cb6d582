//! RocketMQ's offset message id: where a message lives, as 32 (IPv4) or 56
//! (IPv6) uppercase hex characters. Part of the record format because the
//! store host and physical offset it encodes come from the record.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::put_host;
use crate::error::{Error, Result};

/// RocketMQ's offset message id: uppercase hex of the store host address
/// (4 or 16 bytes), its port (4 bytes) and the physical offset (8 bytes).
pub fn encode_msg_id(store_host: SocketAddr, phys_offset: u64) -> String {
    let mut s = String::with_capacity(56);
    push_msg_id(&mut s, store_host, phys_offset);
    s
}

/// [`encode_msg_id`] appended to `out` (a batch's ids go into one string).
pub fn push_msg_id(out: &mut String, store_host: SocketAddr, phys_offset: u64) {
    let mut raw = Vec::with_capacity(28);
    put_host(&mut raw, &store_host);
    raw.extend_from_slice(&phys_offset.to_be_bytes());
    out.reserve(raw.len() * 2);
    for b in raw {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
}

/// Inverse of [`encode_msg_id`]; accepts either case.
pub fn decode_msg_id(id: &str) -> Result<(SocketAddr, u64)> {
    let bad = || Error::InvalidArgument(format!("{id:?} is not an offset message id"));
    if !id.is_ascii() || (id.len() != 32 && id.len() != 56) {
        return Err(bad());
    }
    let raw = id
        .as_bytes()
        .chunks(2)
        .map(|p| {
            let s = std::str::from_utf8(p).map_err(|_| bad())?;
            u8::from_str_radix(s, 16).map_err(|_| bad())
        })
        .collect::<Result<Vec<u8>>>()?;
    let (ip, rest): (IpAddr, &[u8]) = if raw.len() == 16 {
        (
            Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]).into(),
            &raw[4..],
        )
    } else {
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&raw[..16]);
        (Ipv6Addr::from(ip).into(), &raw[16..])
    };
    let port = i32::from_be_bytes(rest[..4].try_into().map_err(|_| bad())?);
    let port = u16::try_from(port).map_err(|_| bad())?;
    let phys = u64::from_be_bytes(rest[4..12].try_into().map_err(|_| bad())?);
    Ok((SocketAddr::new(ip, port), phys))
}
