//! The phase table: every legal move of a claim and which part of the operator may write it.
//! The claim controller's chokepoint asks [`check_move`] before every status write, so a move
//! the table forbids is refused before it reaches the API server.

use crate::api::NodeClaimPhase::{self, *};

/// The part of the operator that asks for a phase move. Each move has its owners; a move asked
/// for by anyone else is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The slot lifecycle: creating the startup Job commits the boot, and a failed or
    /// timed-out Job fails it.
    Lifecycle,
    /// The readiness gate: the node is Ready, free of the pool's readiness taints, and carries
    /// everything its slot declares ([`GateReading::passes`]).
    ReadinessGate,
    /// The claim controller's own rules: deadline, supersede, machine gone, slot deleted, and
    /// a pin's end (`spec.until`).
    ClaimController,
    /// A scale-down: a pending claim cancelled, or a machine released and observed off.
    ScaleDown,
}

/// What the readiness gate reads of a booting claim's node (`machine::gate_reading`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateReading {
    /// The node's Ready condition is True.
    pub ready: bool,
    /// The node still carries one of the Group's readiness taints.
    pub readiness_taints_left: bool,
    /// The node lacks part of what its slot declares: the group and slot labels, a providerID,
    /// `nodeLabels`, `nodeTaints`. The slot controller's write has not landed yet.
    pub undeclared: bool,
}

impl GateReading {
    /// booting → ready. A node that is Ready but not yet declared would be read by
    /// cluster-autoscaler as a started machine the pending pods cannot use, so the claim waits
    /// for the slot's write and the node keeps CA's startup taint meanwhile
    /// (docs/decisions.md, D13).
    pub fn passes(self) -> bool {
        self.ready && !self.readiness_taints_left && !self.undeclared
    }
}

/// A move the phase table forbids, or one asked for by a writer that does not own it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("claim phase move {from:?} -> {to:?} by {writer:?} is not in the phase table")]
pub struct IllegalMove {
    pub from: NodeClaimPhase,
    pub to: NodeClaimPhase,
    pub writer: Writer,
}

/// The outcome of a legal request: a real move, or a re-apply that changes nothing (and so
/// must publish nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    Changed,
    Unchanged,
}

/// The writers that own the move `from -> to`; empty when the move is not in the table.
pub fn owners(from: NodeClaimPhase, to: NodeClaimPhase) -> &'static [Writer] {
    use Writer::*;
    match (from, to) {
        (Pending, Booting) => &[Lifecycle],
        // A pin that reaches its `spec.until` ends as asked: completed, by the claim controller.
        (Pending, Completed) => &[ScaleDown, ClaimController],
        (Pending, Failed) => &[ClaimController],
        (Booting, Ready) => &[ReadinessGate],
        (Booting, Failed) => &[Lifecycle, ReadinessGate, ClaimController],
        (Ready, Completed) => &[ScaleDown, ClaimController],
        (Ready, Failed) => &[ClaimController],
        _ => &[],
    }
}

/// The legal next phases of a phase.
pub fn legal_next(from: NodeClaimPhase) -> Vec<NodeClaimPhase> {
    [Pending, Booting, Ready, Completed, Failed]
        .into_iter()
        .filter(|to| !owners(from, *to).is_empty())
        .collect()
}

/// Judges a requested move. `from` is the claim's current phase, absent reading as pending.
pub fn check_move(
    from: Option<NodeClaimPhase>,
    to: NodeClaimPhase,
    writer: Writer,
) -> Result<Move, IllegalMove> {
    let from = super::effective(from);
    if from == to {
        return Ok(Move::Unchanged);
    }
    if owners(from, to).contains(&writer) {
        Ok(Move::Changed)
    } else {
        Err(IllegalMove { from, to, writer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Writer::*;

    const ALL: [NodeClaimPhase; 5] = [Pending, Booting, Ready, Completed, Failed];
    const WRITERS: [Writer; 4] = [Lifecycle, ReadinessGate, ClaimController, ScaleDown];

    #[test]
    fn legal_next_phases_match_the_design() {
        let table = [
            (Pending, vec![Booting, Completed, Failed]),
            (Booting, vec![Ready, Failed]),
            (Ready, vec![Completed, Failed]),
            (Completed, vec![]),
            (Failed, vec![]),
        ];
        for (from, next) in table {
            assert_eq!(legal_next(from), next, "legal next of {from:?}");
        }
    }

    #[test]
    fn every_move_has_exactly_its_owners() {
        // (from, to, writers allowed)
        let table: [(NodeClaimPhase, NodeClaimPhase, &[Writer]); 7] = [
            (Pending, Booting, &[Lifecycle]),
            (Pending, Completed, &[ScaleDown, ClaimController]),
            (Pending, Failed, &[ClaimController]),
            (Booting, Ready, &[ReadinessGate]),
            (Booting, Failed, &[Lifecycle, ReadinessGate, ClaimController]),
            (Ready, Completed, &[ScaleDown, ClaimController]),
            (Ready, Failed, &[ClaimController]),
        ];
        for (from, to, allowed) in table {
            for writer in WRITERS {
                let got = check_move(Some(from), to, writer);
                if allowed.contains(&writer) {
                    assert_eq!(got, Ok(Move::Changed), "{from:?}->{to:?} by {writer:?}");
                } else {
                    assert!(got.is_err(), "{from:?}->{to:?} by {writer:?} must be refused");
                }
            }
        }
    }

    #[test]
    fn the_readiness_gate_waits_for_ready_the_readiness_taints_and_the_declaration() {
        // ready, readiness taints left, undeclared, passes
        let table = [
            (true, false, false, true),
            (false, false, false, false),
            (true, true, false, false),
            (true, false, true, false),
            (false, true, true, false),
        ];
        for (ready, readiness_taints_left, undeclared, passes) in table {
            let reading = GateReading { ready, readiness_taints_left, undeclared };
            assert_eq!(reading.passes(), passes, "{reading:?}");
        }
    }

    #[test]
    fn a_booting_claim_cannot_be_cancelled() {
        // A committed boot is reversed by the shutdown path, never interrupted: not by a
        // scale-down, nor by a pin's end.
        assert!(check_move(Some(Booting), Completed, ScaleDown).is_err());
        assert!(check_move(Some(Booting), Completed, ClaimController).is_err());
    }

    #[test]
    fn terminal_phases_have_no_way_out_and_nothing_goes_back() {
        for from in [Completed, Failed] {
            for to in ALL.into_iter().filter(|p| *p != from) {
                for writer in WRITERS {
                    assert!(check_move(Some(from), to, writer).is_err(), "{from:?}->{to:?}");
                }
            }
        }
        for writer in WRITERS {
            assert!(check_move(Some(Ready), Booting, writer).is_err());
            assert!(check_move(Some(Booting), Pending, writer).is_err());
        }
    }

    #[test]
    fn a_reapply_is_unchanged_and_an_absent_phase_is_pending() {
        for phase in ALL {
            assert_eq!(check_move(Some(phase), phase, ClaimController), Ok(Move::Unchanged));
        }
        assert_eq!(check_move(None, Pending, ClaimController), Ok(Move::Unchanged));
        assert_eq!(check_move(None, Booting, Lifecycle), Ok(Move::Changed));
        assert_eq!(check_move(None, Completed, ScaleDown), Ok(Move::Changed));
    }
}
