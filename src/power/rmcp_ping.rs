//! The RMCP presence ping, made optional. `ipmi-rs` opens every session with an ASF ping and
//! gives up unless a pong comes back, but IPMI 2.0 does not require a BMC to answer it (pyghmi's
//! BMC, and so virtualbmc, do not; ipmitool does not wait for one). `ipmi-rs` therefore talks to
//! this relay on loopback, which forwards every datagram to the BMC and back; a ping the BMC
//! leaves unanswered for [`PONG_WAIT`] gets a pong from the relay, so the session goes on to Get
//! Channel Authentication Capabilities, which a BMC must answer.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;

/// How long the BMC has to answer the ping before the relay answers it.
pub const PONG_WAIT: Duration = Duration::from_millis(500);

/// The ASF IANA enterprise number, which opens every ASF message.
const ASF_IANA: [u8; 4] = 4542u32.to_be_bytes();
const RMCP_CLASS_ASF: u8 = 0x06;
const ASF_PING: u8 = 0x80;
const ASF_PONG: u8 = 0x40;

/// What the BMC did while the relay ran.
#[derive(Default)]
pub struct Seen {
    /// The BMC sent something back.
    pub answered: AtomicBool,
    /// The BMC's host said the port is closed (ICMP port unreachable).
    pub refused: AtomicBool,
    /// The relay stood in for the BMC's pong.
    pub pong_stood_in: AtomicBool,
}

/// A relay between `ipmi-rs` and one BMC; it stops when dropped.
pub struct Relay {
    /// Where `ipmi-rs` sends to.
    pub local: SocketAddr,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    pub async fn start(bmc: SocketAddr) -> std::io::Result<Relay> {
        let local = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let unspecified: SocketAddr = if bmc.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let upstream = UdpSocket::bind(unspecified).await?;
        upstream.connect(bmc).await?;
        let seen = Arc::new(Seen::default());
        let local_addr = local.local_addr()?;
        let task = tokio::spawn(relay(local, upstream, seen.clone()));
        Ok(Relay { local: local_addr, seen, task })
    }
}

async fn relay(local: UdpSocket, upstream: UdpSocket, seen: Arc<Seen>) {
    let mut client: Option<SocketAddr> = None;
    // The pong to send, and when, for a ping the BMC has not answered yet.
    let mut pending: Option<(Instant, Vec<u8>)> = None;
    let (mut from_client, mut from_bmc) = ([0u8; 1024], [0u8; 1024]);
    loop {
        let deadline = pending.as_ref().map(|(at, _)| *at);
        tokio::select! {
            got = local.recv_from(&mut from_client) => {
                let Ok((len, from)) = got else { return };
                let datagram = &from_client[..len];
                client = Some(from);
                if let Some(pong) = pong_for(datagram) {
                    pending = Some((Instant::now() + PONG_WAIT, pong));
                }
                if let Err(error) = upstream.send(datagram).await {
                    tracing::debug!(%error, "forwarding to the BMC");
                }
            }
            got = upstream.recv(&mut from_bmc) => {
                let len = match got {
                    Ok(len) => len,
                    Err(error) => {
                        if error.kind() == std::io::ErrorKind::ConnectionRefused {
                            seen.refused.store(true, Ordering::Relaxed);
                        }
                        continue;
                    }
                };
                seen.answered.store(true, Ordering::Relaxed);
                let datagram = &from_bmc[..len];
                if is_pong(datagram) {
                    pending = None;
                }
                if let Some(client) = client {
                    let _ = local.send_to(datagram, client).await;
                }
            }
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                if let (Some((_, pong)), Some(client)) = (pending.take(), client) {
                    tracing::debug!("the BMC did not answer the RMCP ping: going on without it");
                    seen.pong_stood_in.store(true, Ordering::Relaxed);
                    let _ = local.send_to(&pong, client).await;
                }
            }
        }
    }
}

/// The ASF message type of an RMCP datagram, and its message tag, if it is ASF.
fn asf(datagram: &[u8]) -> Option<(u8, u8)> {
    match datagram {
        [_, _, _, RMCP_CLASS_ASF, i0, i1, i2, i3, kind, tag, ..]
            if [*i0, *i1, *i2, *i3] == ASF_IANA =>
        {
            Some((*kind, *tag))
        }
        _ => None,
    }
}

fn is_pong(datagram: &[u8]) -> bool {
    asf(datagram).is_some_and(|(kind, _)| kind == ASF_PONG)
}

/// The pong that answers `datagram`, if it is a ping: IPMI supported, nothing else claimed
/// (ASF 2.0 §3.2.4.3).
fn pong_for(datagram: &[u8]) -> Option<Vec<u8>> {
    let (kind, tag) = asf(datagram)?;
    if kind != ASF_PING {
        return None;
    }
    let sequence = datagram[2];
    let mut pong = vec![0x06, 0x00, sequence, RMCP_CLASS_ASF];
    pong.extend_from_slice(&ASF_IANA);
    pong.extend_from_slice(&[ASF_PONG, tag, 0x00, 0x10]);
    pong.extend_from_slice(&ASF_IANA);
    pong.extend_from_slice(&[0, 0, 0, 0]); // OEM-defined
    pong.extend_from_slice(&[0x81, 0x00]); // supported entities: IPMI, ASF 1.0; no interactions
    pong.extend_from_slice(&[0; 6]);
    Some(pong)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PING: [u8; 12] = [0x06, 0x00, 0xFF, 0x06, 0x00, 0x00, 0x11, 0xBE, 0x80, 0xC8, 0x00, 0x00];

    #[test]
    fn a_ping_gets_a_pong_with_its_tag_and_nothing_else_does() {
        let pong = pong_for(&PING).expect("a pong");
        assert_eq!(pong.len(), 4 + 8 + 16);
        assert_eq!(asf(&pong), Some((ASF_PONG, 0xC8)));
        assert!(is_pong(&pong));
        assert_eq!(pong[20], 0x81, "IPMI supported");
        assert_eq!(pong_for(&pong), None, "a pong is not a ping");
        // An IPMI session datagram (RMCP class 7).
        assert_eq!(pong_for(&[0x06, 0x00, 0xFF, 0x07, 0x06, 0x10, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(pong_for(&PING[..6]), None);
    }
}
