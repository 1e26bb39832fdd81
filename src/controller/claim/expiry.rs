//! A pin's end: once `spec.until` has passed, the claim controller completes the pin with the
//! reason `Expired`, and the machine, no longer wanted, goes down the slot's shutdown path as on
//! any completion (the claim keeps its finalizer until the machine is observed off). Only pins
//! (`Manual`, `Schedule`) carry an end; admission and the CRD keep it off every other claim.
//!
//! A committed boot is never interrupted: a booting pin past its end runs to ready (or failed)
//! and expires on the pass after. A pending pin past its end has started nothing and ends
//! `completed`, the phase of a claim that ended as asked before its boot (the cancellation move);
//! `failed` would be listed to cluster-autoscaler as a create error and say something went wrong
//! when nothing did.

use std::sync::Arc;

use jiff::Timestamp;
use kube::runtime::controller::Action;

use super::chokepoint::{self, PhaseMove};
use super::requeue_at;
use crate::api::{NodeClaim, NodeClaimPhase};
use crate::controller::Context;
use crate::controller::error::Result;
use crate::phase::Writer;

pub use crate::claim::pin_end::EXPIRED;

/// The end of a pin, if it has one. Any other claim has none, whatever its spec says.
pub fn end_of(claim: &NodeClaim) -> Option<Timestamp> {
    claim.spec.request.call.is_pin().then_some(())?;
    claim.spec.until.as_ref().map(|t| t.0)
}

/// Whether the pin's end has come at `now`.
pub fn is_due(claim: &NodeClaim, now: Timestamp) -> bool {
    end_of(claim).is_some_and(|until| until <= now)
}

/// What a pin's end says, for the claim's status.message.
pub fn message(phase: NodeClaimPhase, until: Timestamp) -> String {
    match phase {
        NodeClaimPhase::Pending => {
            format!("the pin ended at {until} (spec.until) before its boot started")
        }
        _ => format!("kept on until {until} (spec.until); the machine is released"),
    }
}

/// Completes a pending or ready pin whose end has come. `None` when it has not, or when the claim
/// is booting (its boot runs to the end first).
pub async fn reconcile(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Option<Action>> {
    let Some(until) = end_of(claim).filter(|u| *u <= ctx.now()) else { return Ok(None) };
    let phase = crate::phase::of(claim);
    if !matches!(phase, NodeClaimPhase::Pending | NodeClaimPhase::Ready) {
        return Ok(None);
    }
    let done = PhaseMove::new(NodeClaimPhase::Completed, Writer::ClaimController)
        .because(EXPIRED, message(phase, until));
    chokepoint::move_phase(ctx, claim, done).await?;
    Ok(Some(Action::await_change()))
}

/// Wakes the claim at `at` or at the pin's end, whichever comes first; with neither, waits for a
/// change.
pub fn wake(ctx: &Context, claim: &NodeClaim, at: Option<Timestamp>) -> Action {
    match (at, end_of(claim)) {
        (Some(a), Some(u)) => requeue_at(ctx, a.min(u)),
        (Some(t), None) | (None, Some(t)) => requeue_at(ctx, t),
        (None, None) => Action::await_change(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ClaimCall;
    use crate::fixtures::{at, claim};

    #[test]
    fn only_a_pin_has_an_end() {
        let until = "2026-03-04T10:00:00Z";
        let before: Timestamp = "2026-03-04T09:59:59Z".parse().unwrap();
        let after: Timestamp = "2026-03-04T10:00:00Z".parse().unwrap();
        // (call, until set, due before, due at/after)
        let table = [
            (ClaimCall::Manual, true, false, true),
            (ClaimCall::Schedule, true, false, true),
            (ClaimCall::Manual, false, false, false),
            (ClaimCall::IncreaseSize, true, false, false),
        ];
        for (call, set, due_before, due_after) in table {
            let mut c = claim("c", "slot-a", "pool");
            c.spec.request.call = call;
            c.spec.until = set.then(|| at(until));
            assert_eq!(is_due(&c, before), due_before, "{call:?} until={set} before");
            assert_eq!(is_due(&c, after), due_after, "{call:?} until={set} at the end");
        }
    }

    #[test]
    fn the_message_says_until_when() {
        let until: Timestamp = "2026-03-04T10:00:00Z".parse().unwrap();
        let ready = message(NodeClaimPhase::Ready, until);
        assert!(ready.contains("kept on until 2026-03-04T10:00:00Z"), "{ready}");
        let pending = message(NodeClaimPhase::Pending, until);
        assert!(pending.contains("before its boot started"), "{pending}");
    }
}
