//! A machine's network card waiting for Wake-on-LAN: a UDP socket in the machine's network
//! namespace, on the port magic packets are sent to (9, the discard port), that recognises the
//! packet for the card's MAC address (6 bytes of 0xFF, then the MAC 16 times) and presses the
//! power button. A real card listens below IP, for any port; a packet that reaches the machine's
//! address or the lan's broadcast address on port 9 is what every WoL sender uses, ours included.
//! It listens whatever the power state, as a card on standby power does; pressing "on" on a
//! machine that is on does nothing.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

use super::netns;

/// The port Wake-on-LAN senders use by default.
pub const WAKE_ON_LAN_PORT: u16 = 9;

/// Whether `payload` is the magic packet for `mac`: 6 bytes of 0xFF, then the MAC 16 times (a
/// SecureOn password may follow; it is ignored, as most cards do).
pub fn is_magic_packet(payload: &[u8], mac: [u8; 6]) -> bool {
    payload.len() >= 102
        && payload[..6].iter().all(|b| *b == 0xFF)
        && payload[6..102].chunks(6).all(|chunk| chunk == mac)
}

/// The listener; dropping it stops it.
pub(crate) struct WakeListener {
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WakeListener {
    /// Listens in network namespace `netns`; `press` runs for every magic packet for `mac`.
    pub(crate) fn start(
        netns: &str,
        mac: [u8; 6],
        press: impl Fn() + Send + 'static,
    ) -> Result<Self> {
        Self::listen(netns, move |payload| {
            if is_magic_packet(payload, mac) {
                press();
            }
        })
    }

    /// Listens in network namespace `netns`; `datagram` runs for every datagram to port 9.
    pub(crate) fn listen(netns: &str, datagram: impl Fn(&[u8]) + Send + 'static) -> Result<Self> {
        let listen = SocketAddr::from(([0, 0, 0, 0], WAKE_ON_LAN_PORT));
        let socket = netns::open_in(netns, move || {
            let socket = UdpSocket::bind(listen)?;
            socket.set_broadcast(true)?;
            // Wakes the loop now and then to see whether it should stop.
            socket.set_read_timeout(Some(Duration::from_millis(200)))?;
            Ok(socket)
        })
        .with_context(|| format!("listening for Wake-on-LAN in {netns}"))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let thread = {
            let stopping = stopping.clone();
            std::thread::Builder::new()
                .name(format!("wol-{netns}"))
                .spawn(move || {
                    let mut buffer = [0u8; 1500];
                    while !stopping.load(Ordering::SeqCst) {
                        // A timeout: look again.
                        let Ok((len, _)) = socket.recv_from(&mut buffer) else { continue };
                        datagram(&buffer[..len]);
                    }
                })
                .context("starting the Wake-on-LAN listener")?
        };
        Ok(Self { stopping, thread: Some(thread) })
    }
}

impl Drop for WakeListener {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_packet_for_this_card_wakes_it() {
        let mac = [0x52, 0x54, 0x00, 0x0d, 0x00, 0x0b];
        let other = [0x52, 0x54, 0x00, 0x0d, 0x00, 0x0c];
        let packet = |mac: [u8; 6]| {
            let mut p = vec![0xFF; 6];
            (0..16).for_each(|_| p.extend_from_slice(&mac));
            p
        };
        let mut with_password = packet(mac);
        with_password.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
        let mut short = packet(mac);
        short.pop();
        let mut bad_sync = packet(mac);
        bad_sync[0] = 0;
        let table: [(&str, Vec<u8>, bool); 5] = [
            ("its own", packet(mac), true),
            ("with a SecureOn password", with_password, true),
            ("another card's", packet(other), false),
            ("one byte short", short, false),
            ("no sync stream", bad_sync, false),
        ];
        for (name, payload, wakes) in table {
            assert_eq!(is_magic_packet(&payload, mac), wakes, "{name}");
        }
    }
}
