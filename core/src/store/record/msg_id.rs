//! RocketMQ's two message ids. The offset message id says where a message lives,
//! as 32 (IPv4) or 56 (IPv6) uppercase hex characters; it is part of the record
//! format because the store host and physical offset it encodes come from the
//! record. The unique id (`UNIQ_KEY`) is what a producer gives a message before
//! sending it (our Rust client, and the HTTP door for transactional messages).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use super::put_host;
use crate::error::{Error, Result};
use crate::hex;

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
    hex::push_upper(out, &raw);
}

/// A producer-side unique message id (`UNIQ_KEY`) in Java's 32-hex-digit shape:
/// ip, pid, the time `now_ms` (the caller reads the clock once per request) and a
/// counter, so ids from one process never repeat within a millisecond's 65,536.
pub fn unique_id_at(now_ms: u64) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    // getpid is a syscall per message otherwise.
    static PID: OnceLock<u32> = OnceLock::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = u64::from(*PID.get_or_init(std::process::id));
    let mut s = String::with_capacity(32);
    for (v, digits) in [
        (0x7F00_0001, 8),
        (pid & 0xFFFF, 4),
        ((pid >> 16) & 0xFFFF, 4),
        (now_ms & 0xFFFF_FFFF_FFFF, 12),
        (u64::from(n & 0xFFFF), 4),
    ] {
        hex::push_upper_digits(&mut s, v, digits);
    }
    s
}

/// [`unique_id_at`] the current time.
pub fn unique_id() -> String {
    unique_id_at(crate::clock::now_ms().max(0) as u64)
}

/// Inverse of [`encode_msg_id`]; accepts either case.
pub fn decode_msg_id(id: &str) -> Result<(SocketAddr, u64)> {
    let bad = || Error::InvalidArgument(format!("{id:?} is not an offset message id"));
    if !id.is_ascii() || (id.len() != 32 && id.len() != 56) {
        return Err(bad());
    }
    let raw = hex::decode(id).ok_or_else(bad)?;
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
