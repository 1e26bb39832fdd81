//! A pin's end on a machine that holds a running pod's data (docs/decisions.md, D39). When a
//! pin or schedule window ends (`Expired`) while a pod runs on the machine whose volume no other
//! machine can serve, powering the machine off would evict the pod, whose controller makes a new
//! one that only this machine can run, which wakes it again: a power cycle at every window's
//! end. So the end hands the machine to the pod instead: the slot's shutdown waits, and the
//! scaler's pass claims the slot for the pod. Both read this one rule. Pure.

use jiff::{SignedDuration, Timestamp};

use crate::api::{NodeClaim, NodeClaimPhase};
use crate::phase;

/// The reason an expired pin ends with.
pub const EXPIRED: &str = "Expired";

/// When `newest` (a slot's newest claim) ended as a pin's end, if it did.
pub fn ended_at(newest: &NodeClaim) -> Option<Timestamp> {
    let status = newest.status.as_ref()?;
    (phase::of(newest) == NodeClaimPhase::Completed && status.reason.as_deref() == Some(EXPIRED))
        .then_some(())?;
    status.finished_at.as_ref().map(|t| t.0)
}

/// Until when the shutdown of a machine whose newest claim is a pin that ended waits for the
/// scaler to claim it for the pods whose data it holds (`holds_data`: the slot's
/// `status.localVolumes` is not empty). `None`: no wait.
pub fn handed_over_until(
    newest: Option<&NodeClaim>,
    holds_data: bool,
    grace: SignedDuration,
) -> Option<Timestamp> {
    holds_data.then_some(())?;
    ended_at(newest?)?.checked_add(grace).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, claim_in};

    fn ended(reason: &str) -> NodeClaim {
        let mut c =
            claim_in("pin-1", "mini-3", Some(NodeClaimPhase::Completed), "2026-03-04T08:00:00Z");
        if let Some(s) = c.status.as_mut() {
            s.reason = Some(reason.into());
            s.finished_at = Some(at("2026-03-04T18:00:00Z"));
        }
        c
    }

    #[test]
    fn only_a_pins_end_on_a_machine_holding_data_waits() {
        let grace = SignedDuration::from_mins(5);
        let until = "2026-03-04T18:05:00Z".parse().ok();
        let table = [
            ("a pin's end, data held", Some(ended(EXPIRED)), true, until),
            ("a pin's end, no data", Some(ended(EXPIRED)), false, None),
            ("a release by hand", Some(ended("Released")), true, None),
            ("no claim at all", None, true, None),
        ];
        for (case, newest, holds, want) in table {
            assert_eq!(handed_over_until(newest.as_ref(), holds, grace), want, "{case}");
        }
        let mut ready = ended(EXPIRED);
        ready.status.as_mut().unwrap().phase = Some(NodeClaimPhase::Ready);
        assert_eq!(ended_at(&ready), None, "a claim that has not ended");
    }
}
