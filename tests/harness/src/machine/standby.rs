//! The lan's machines' network cards while their OS sleeps (suspend to RAM). A real card in
//! Wake-on-LAN mode keeps its PHY up and filters frames in hardware for its magic packet; here a
//! suspended machine's `eth0` is down (so its address answers nothing, not even ARP), and its
//! machine-side listener (wake_on_lan.rs) hears nothing. So the filter listens at the switch side
//! of the cable instead: one UDP socket on port 9 in the lan's namespace, where the bridge's own
//! stack receives every broadcast to the lan's broadcast address (where Wake-on-LAN senders, the
//! operator's driver included, send), that hands a magic packet to the card whose MAC it names.
//! A magic packet unicast to a sleeping machine's address is not heard (no ARP answers for it).
//!
//! One listener serves the whole lan, so any number of its machines may sleep at once. Each
//! machine's card is plugged in for the machine's life; the card decides whether its machine is
//! asleep (an awake or halted machine hears the packet on its own `eth0`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::Result;

use super::wake_on_lan::{WakeListener, is_magic_packet};

/// What a card does when its magic packet arrives.
type Press = Arc<dyn Fn() + Send + Sync>;

/// The cards of one lan's machines, by MAC. Cheap to clone (a handle).
#[derive(Clone, Default)]
pub(crate) struct Cards(Arc<Mutex<HashMap<[u8; 6], Press>>>);

impl Cards {
    /// `press` runs for every magic packet for `mac` the lan's standby listener hears.
    pub(crate) fn plug(&self, mac: [u8; 6], press: impl Fn() + Send + Sync + 'static) {
        if let Ok(mut cards) = self.0.lock() {
            cards.insert(mac, Arc::new(press));
        }
    }

    pub(crate) fn unplug(&self, mac: [u8; 6]) {
        if let Ok(mut cards) = self.0.lock() {
            cards.remove(&mac);
        }
    }

    /// Hands a magic packet to the card it names, if it is one of the lan's.
    fn dispatch(&self, payload: &[u8]) {
        let Some(mac) = payload.get(6..12).and_then(|m| <[u8; 6]>::try_from(m).ok()) else {
            return;
        };
        if !is_magic_packet(payload, mac) {
            return;
        }
        // Out of the lock: a press may drop the last handle of its machine, which unplugs it.
        let press = self.0.lock().ok().and_then(|cards| cards.get(&mac).cloned());
        if let Some(press) = press {
            press();
        }
    }
}

/// The lan's standby listener; dropping it stops it.
pub(crate) struct Standby {
    cards: Cards,
    _listener: WakeListener,
}

impl Standby {
    /// Listens on port 9 in the lan's namespace `netns`.
    pub(crate) fn start(netns: &str) -> Result<Self> {
        let cards = Cards::default();
        let heard = cards.clone();
        let listener = WakeListener::listen(netns, move |payload| heard.dispatch(payload))?;
        Ok(Self { cards, _listener: listener })
    }

    pub(crate) fn cards(&self) -> Cards {
        self.cards.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn a_magic_packet_presses_only_the_card_it_names() {
        let (mac, other) = ([0x52, 0x54, 0x00, 0xd5, 0x00, 11], [0x52, 0x54, 0x00, 0xd5, 0x00, 12]);
        let cards = Cards::default();
        let presses: [Arc<AtomicU32>; 2] = Default::default();
        for (card, count) in [mac, other].into_iter().zip(&presses) {
            let count = count.clone();
            cards.plug(card, move || {
                count.fetch_add(1, Ordering::SeqCst);
            });
        }
        let packet = |mac: [u8; 6]| {
            let mut p = vec![0xFF; 6];
            (0..16).for_each(|_| p.extend_from_slice(&mac));
            p
        };
        cards.dispatch(&packet(mac));
        cards.dispatch(&packet([1, 2, 3, 4, 5, 6]));
        cards.dispatch(&packet(mac)[..60]);
        cards.unplug(other);
        cards.dispatch(&packet(other));
        let counts = presses.each_ref().map(|c| c.load(Ordering::SeqCst));
        assert_eq!(counts, [1, 0]);
    }
}
