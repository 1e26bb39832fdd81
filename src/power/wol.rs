//! Wake-on-LAN: six 0xFF bytes and the MAC sixteen times, in one UDP datagram to the LAN's
//! broadcast address. The protocol has no answer, so nothing can confirm the wake here; the
//! claim's registration deadline does.

use std::net::{Ipv4Addr, SocketAddr};

use crate::api::WakeOnLan;

/// The length of a magic packet.
pub const MAGIC_PACKET_LEN: usize = 102;
const DEFAULT_BROADCAST: Ipv4Addr = Ipv4Addr::BROADCAST;
const DEFAULT_PORT: u16 = 9;

#[derive(Debug, thiserror::Error)]
pub enum WolError {
    #[error("{0:?} is not a MAC address such as aa:bb:cc:dd:ee:ff")]
    Mac(String),
    #[error("{0:?} is not an IPv4 broadcast address")]
    Address(String),
    #[error("sending the magic packet to {to}: {source}")]
    Send { to: SocketAddr, source: std::io::Error },
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with dashes).
pub fn parse_mac(mac: &str) -> Result<[u8; 6], WolError> {
    let parts: Vec<&str> = mac.split([':', '-']).collect();
    let mut out = [0u8; 6];
    if parts.len() != 6 {
        return Err(WolError::Mac(mac.into()));
    }
    for (byte, part) in out.iter_mut().zip(&parts) {
        if part.len() != 2 {
            return Err(WolError::Mac(mac.into()));
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| WolError::Mac(mac.into()))?;
    }
    Ok(out)
}

/// The magic packet for `mac`.
pub fn magic_packet(mac: [u8; 6]) -> [u8; MAGIC_PACKET_LEN] {
    let mut packet = [0xFFu8; MAGIC_PACKET_LEN];
    for chunk in packet[6..].chunks_exact_mut(6) {
        chunk.copy_from_slice(&mac);
    }
    packet
}

/// Sends the magic packet.
pub async fn wake(settings: &WakeOnLan) -> Result<String, WolError> {
    let mac = parse_mac(&settings.mac)?;
    let ip = match &settings.broadcast_address {
        Some(text) => text.parse::<Ipv4Addr>().map_err(|_| WolError::Address(text.clone()))?,
        None => DEFAULT_BROADCAST,
    };
    let to = SocketAddr::from((ip, settings.port.unwrap_or(DEFAULT_PORT)));
    let send = |source| WolError::Send { to, source };
    let socket = tokio::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).await.map_err(send)?;
    socket.set_broadcast(true).map_err(send)?;
    socket.send_to(&magic_packet(mac), to).await.map_err(send)?;
    Ok(format!("sent the magic packet for {} to {to}", settings.mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_or_say_why_not() {
        let table = [
            ("aa:bb:cc:dd:ee:ff", Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff])),
            ("AA-BB-CC-00-11-22", Some([0xaa, 0xbb, 0xcc, 0x00, 0x11, 0x22])),
            ("aa:bb:cc:dd:ee", None),
            ("aa:bb:cc:dd:ee:gg", None),
            ("aab:b:cc:dd:ee:ff", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(parse_mac(text).ok(), want, "{text}");
        }
    }

    #[test]
    fn the_magic_packet_is_sync_then_sixteen_macs() {
        let mac = [1, 2, 3, 4, 5, 6];
        let packet = magic_packet(mac);
        assert_eq!(&packet[..6], &[0xFF; 6]);
        assert!(packet[6..].chunks(6).all(|c| c == mac));
        assert_eq!(packet[6..].chunks(6).count(), 16);
    }
}
