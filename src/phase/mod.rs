//! The claim phase model, pure: which phases are live, which moves are legal and who may write
//! them (`table`), and the slot's derived report (`report`). No I/O, no Kubernetes client.
//!
//! An absent phase (a claim whose first status write has not landed: the status subresource
//! strips status from a create) reads as `pending` in every predicate here.

mod report;
mod table;

pub use report::{MachineObservation, SlotReportInput, derive_report};
pub use table::{GateReading, IllegalMove, Move, Writer, check_move, legal_next, owners};

use std::borrow::Borrow;

use crate::api::{NodeClaim, NodeClaimPhase};

/// The phase of a claim, reading an absent phase as pending.
pub fn effective(phase: Option<NodeClaimPhase>) -> NodeClaimPhase {
    phase.unwrap_or(NodeClaimPhase::Pending)
}

/// The phase of a claim object, reading an absent status or phase as pending.
pub fn of(claim: &NodeClaim) -> NodeClaimPhase {
    effective(claim.status.as_ref().and_then(|s| s.phase))
}

/// Live: the claim holds its slot (pending, booting or ready). A live claim is capacity.
pub fn is_live(phase: Option<NodeClaimPhase>) -> bool {
    matches!(
        effective(phase),
        NodeClaimPhase::Pending | NodeClaimPhase::Booting | NodeClaimPhase::Ready
    )
}

/// The newest of a slot's claims, by creation then name.
pub fn newest<C: Borrow<NodeClaim>>(claims: impl IntoIterator<Item = C>) -> Option<C> {
    claims.into_iter().max_by_key(|c| {
        let meta = &c.borrow().metadata;
        (meta.creation_timestamp.as_ref().map(|t| t.0), meta.name.clone())
    })
}

/// The slot's live claim among `claims`: the newest, should a race have left two.
pub fn newest_live<C: Borrow<NodeClaim>>(claims: impl IntoIterator<Item = C>) -> Option<C> {
    newest(claims.into_iter().filter(|c| is_live(Some(of(c.borrow())))))
}

/// Pending: nothing is in flight yet, so the claim can still be cancelled by deleting it.
pub fn is_pending(phase: Option<NodeClaimPhase>) -> bool {
    effective(phase) == NodeClaimPhase::Pending
}

/// Terminal: completed or failed.
pub fn is_terminal(phase: Option<NodeClaimPhase>) -> bool {
    !is_live(phase)
}

/// The boot window (pending or booting): the range the deadline and the attempt bound apply to.
/// A ready claim owns its machine and is never failed by its deadline.
pub fn in_boot_window(phase: Option<NodeClaimPhase>) -> bool {
    matches!(effective(phase), NodeClaimPhase::Pending | NodeClaimPhase::Booting)
}

/// Wanted: live and not marked for scale-down. A marked claim still owns its slot (its boot is
/// committed and its finalizer reverses it) but is no longer a boot target nor counted in the
/// target size.
pub fn wants_machine(phase: Option<NodeClaimPhase>, marked_for_scale_down: bool) -> bool {
    is_live(phase) && !marked_for_scale_down
}

/// Whether a claim object has been marked for scale-down: named by a DeleteNodes, or deleted.
pub fn is_marked(claim: &NodeClaim) -> bool {
    claim.metadata.deletion_timestamp.is_some()
        || claim.status.as_ref().is_some_and(|s| s.scale_down_requested_at.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeClaimPhase::*;

    #[test]
    fn predicates_over_every_phase() {
        // phase, live, pending, boot window, terminal
        let table = [
            (None, true, true, true, false),
            (Some(Pending), true, true, true, false),
            (Some(Booting), true, false, true, false),
            (Some(Ready), true, false, false, false),
            (Some(Completed), false, false, false, true),
            (Some(Failed), false, false, false, true),
        ];
        for (phase, live, pending, window, terminal) in table {
            assert_eq!(is_live(phase), live, "is_live({phase:?})");
            assert_eq!(is_pending(phase), pending, "is_pending({phase:?})");
            assert_eq!(in_boot_window(phase), window, "in_boot_window({phase:?})");
            assert_eq!(is_terminal(phase), terminal, "is_terminal({phase:?})");
        }
    }

    #[test]
    fn wanted_is_live_and_unmarked() {
        for phase in
            [None, Some(Pending), Some(Booting), Some(Ready), Some(Completed), Some(Failed)]
        {
            assert_eq!(wants_machine(phase, false), is_live(phase), "{phase:?} unmarked");
            assert!(!wants_machine(phase, true), "{phase:?} marked is never wanted");
        }
    }

    #[test]
    fn an_empty_phase_reads_as_pending() {
        assert_eq!(effective(None), Pending);
        let claim = crate::fixtures::claim("slot-a-1", "slot-a", "pool");
        assert_eq!(of(&claim), Pending);
        assert!(!is_marked(&claim));
    }
}
