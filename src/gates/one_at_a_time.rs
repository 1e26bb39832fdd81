//! One data machine at a time: of a pool's machines that hold replicas, at most one is on its
//! way off, and the next goes only after the storage has had time to notice the last one gone
//! (the pool's settle), and then only if every gate holds again (read after that). Pure.

use jiff::{SignedDuration, Timestamp};

/// Another data machine of the pool, as the caches and this term's memory show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub slot: String,
    /// A shutdown Job of it is running.
    pub shutdown_running: bool,
    /// When its newest successful shutdown ended.
    pub last_shutdown_ended: Option<Timestamp>,
    /// Its machine is up, cordoned, and no claim wants it: it is being drained.
    pub draining: bool,
    /// Its machine is up and its claim is being released: its shutdown is about to start. Read
    /// by the provider, which answers before the slot's own pass has run; the slot controller's
    /// turns cover the same moment.
    pub released: bool,
    /// Its machine is up, no claim wants it, and the pool's maintenance step before its
    /// power-off has run or runs: it is committed to going off.
    pub preparing: bool,
    /// Its own power-off is held by the gates or waits its turn (`status.powerOffHeldBy`): a
    /// release of it is not under way.
    pub held: bool,
    /// When this term let it start its power-off, for the moments before the caches show its
    /// cordon or Job.
    pub turn_taken: Option<Timestamp>,
}

/// Whose turn it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Turn {
    /// No other data machine is on its way off: this one may go, if its gates hold.
    Mine,
    /// `peer` is on its way off; look again at `until` (None: when it changes).
    Wait { peer: String, why: String, until: Option<Timestamp> },
}

/// How long a turn this term gave counts without the caches confirming it: long enough for
/// the cordon or the Job to reach the cache.
pub const TURN_BRIDGE: SignedDuration = SignedDuration::from_secs(30);

/// Decides whether the data machine `me` may start its power-off now. Of two machines both
/// being drained (cordoned before the pool had gates), the one whose name sorts first goes. Pure.
pub fn decide(me: &Peer, peers: &[Peer], now: Timestamp, settle: SignedDuration) -> Turn {
    for peer in peers {
        let slot = peer.slot.clone();
        if peer.shutdown_running {
            return Turn::Wait {
                peer: slot,
                why: "its shutdown Job is running".into(),
                until: None,
            };
        }
        if peer.draining && !(me.draining && me.slot < peer.slot) {
            return Turn::Wait { peer: slot, why: "it is being drained".into(), until: None };
        }
        if peer.preparing {
            return Turn::Wait {
                peer: slot,
                why: "the maintenance step before its power-off runs".into(),
                until: None,
            };
        }
        if peer.released && !peer.held {
            return Turn::Wait { peer: slot, why: "its release is under way".into(), until: None };
        }
        if let Some(ended) = peer.last_shutdown_ended
            && let Ok(until) = ended.checked_add(settle)
            && now < until
        {
            return Turn::Wait {
                peer: slot,
                why: format!(
                    "it was powered off at {ended}, and the gates are trusted to have seen it go only from {until}"
                ),
                until: Some(until),
            };
        }
        if let Some(taken) = peer.turn_taken
            && let Ok(until) = taken.checked_add(TURN_BRIDGE)
            && now < until
        {
            return Turn::Wait {
                peer: slot,
                why: format!("its power-off started at {taken}"),
                until: Some(until),
            };
        }
    }
    Turn::Mine
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn one_data_machine_at_a_time() {
        let now = at("2026-03-04T10:00:00Z");
        let settle = SignedDuration::from_mins(2);
        let peer = |f: fn(&mut Peer)| {
            let mut p = Peer { slot: "m2".into(), ..Peer::default() };
            f(&mut p);
            vec![p]
        };
        let me = Peer { slot: "m1".into(), ..Peer::default() };
        let decide = |peers: &[Peer], now, settle| decide(&me, peers, now, settle);
        assert_eq!(decide(&[], now, settle), Turn::Mine, "no other data machine");
        assert_eq!(decide(&peer(|_| {}), now, settle), Turn::Mine, "a peer that stays on");
        let waits = |t: Turn| matches!(t, Turn::Wait { ref peer, .. } if peer == "m2");
        assert!(waits(decide(&peer(|p| p.shutdown_running = true), now, settle)));
        assert!(waits(decide(&peer(|p| p.draining = true), now, settle)));
        let both = |me: &str| {
            let me = Peer { slot: me.into(), draining: true, ..Peer::default() };
            super::decide(&me, &peer(|p| p.draining = true), now, settle)
        };
        assert_eq!(both("m1"), Turn::Mine, "both drained: the first name goes");
        assert!(waits(both("m3")), "both drained: the later name waits");
        assert!(waits(decide(&peer(|p| p.released = true), now, settle)));
        assert!(waits(decide(&peer(|p| p.preparing = true), now, settle)));
        let held = peer(|p| {
            p.released = true;
            p.held = true;
        });
        assert_eq!(decide(&held, now, settle), Turn::Mine, "a release the gates hold");
        let recent = decide(
            &peer(|p| p.last_shutdown_ended = Some("2026-03-04T09:59:00Z".parse().unwrap())),
            now,
            settle,
        );
        assert_eq!(
            recent,
            Turn::Wait {
                peer: "m2".into(),
                why: "it was powered off at 2026-03-04T09:59:00Z, and the gates are trusted to have seen it go only from 2026-03-04T10:01:00Z".into(),
                until: Some(at("2026-03-04T10:01:00Z")),
            }
        );
        let settled =
            peer(|p| p.last_shutdown_ended = Some("2026-03-04T09:58:00Z".parse().unwrap()));
        assert_eq!(decide(&settled, now, settle), Turn::Mine, "past the settle: the gates decide");
        let taken = peer(|p| p.turn_taken = Some("2026-03-04T09:59:45Z".parse().unwrap()));
        assert!(waits(decide(&taken, now, settle)), "a turn the caches do not show yet");
        let old = peer(|p| p.turn_taken = Some("2026-03-04T09:59:00Z".parse().unwrap()));
        assert_eq!(decide(&old, now, settle), Turn::Mine, "a turn the caches never confirmed");
    }
}
