//! Ports for tests that must name a port before the process that binds it starts
//! (a flag, a peer list).
//!
//! A port taken with `bind(0)` and released comes from the kernel's ephemeral range,
//! the same range every other test's `bind(0)` and outgoing connection draw from, so
//! between the check and the child's own bind another test can be handed it (a CI
//! run lost a standalone node's MQTT door that way). These ports come from below
//! that range, where the kernel hands out nothing on its own; each call starts at a
//! different place, so one test's ports (and two test processes') do not collide.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port this module hands out.
const LOW: u16 = 10_000;

/// How far apart consecutive calls start (a prime).
const STEP: u32 = 7_919;

/// A TCP port on 127.0.0.1 nobody listens on now, outside the ephemeral range.
pub fn free_port() -> u16 {
    free_port_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// As [`free_port`], on `host` (an address of a network namespace's veth, say).
pub fn free_port_on(host: IpAddr) -> u16 {
    static CALLS: AtomicU32 = AtomicU32::new(0);
    static BASE: OnceLock<u32> = OnceLock::new();
    let high = ephemeral_low().max(LOW + 1_000);
    let span = u32::from(high - LOW);
    // Where this process starts: spread by process id and start time, so two test
    // processes (and two runs) start far apart.
    let base = *BASE.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id()
            .wrapping_mul(2_654_435_761)
            .wrapping_add(nanos)
    });
    // Consecutive calls step by a prime that shares no factor with the span, so
    // one process's calls do not meet until it has asked for `span` ports.
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let start = ((u64::from(base) + u64::from(call) * u64::from(STEP)) % u64::from(span)) as u32;
    for i in 0..span {
        let port = LOW + ((start + i) % span) as u16;
        if TcpListener::bind((host, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on {host} in {LOW}..{high}");
}

/// The start of the kernel's ephemeral range (32768 by default).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for p in ports {
            assert!((LOW..ephemeral_low()).contains(&p), "{p}");
            // Free: it can be bound now.
            TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }
}
