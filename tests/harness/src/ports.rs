//! Free loopback ports for the servers the tests start, chosen outside the kernel's ephemeral
//! range. A port that `bind(127.0.0.1:0)` hands out comes from that range, so between releasing
//! it and the server binding it, any outgoing connection of any process (a kubelet's, a relay's,
//! a client's) may take it as its local port: seen as "Address already in use" for the
//! operator's gRPC listener while three suites ran beside each other. Below the range only
//! servers bind, and each pick is random and checked.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};

/// Below Linux's default ephemeral range (32768–60999) and above the well-known and most
/// registered service ports.
const RANGE: std::ops::Range<u16> = 20000..32768;

/// A loopback port no listener holds, outside the ephemeral range.
pub fn free_port() -> Result<u16> {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
        ^ (u64::from(std::process::id()) << 32);
    let span = u64::from(RANGE.end - RANGE.start);
    for _ in 0..200 {
        // xorshift over a per-process state, so concurrent processes pick apart.
        let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ seed;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = RANGE.start + u16::try_from(x % span).unwrap_or_default();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port in {RANGE:?} after 200 tries")
}

/// `N` distinct free ports.
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let mut ports = [0; N];
    let mut i = 0;
    while i < N {
        let port = free_port()?;
        if !ports[..i].contains(&port) {
            ports[i] = port;
            i += 1;
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_outside_the_ephemeral_range_and_distinct() {
        let ports: [u16; 16] = free_ports().unwrap();
        for (i, port) in ports.iter().enumerate() {
            assert!(RANGE.contains(port), "{port}");
            assert!(!ports[..i].contains(port), "{port} twice");
        }
    }
}
