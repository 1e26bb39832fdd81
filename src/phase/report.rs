//! The slot's derived report (`Node.status.phase`): computed from the claim and the
//! observation, written by the observation side, and never read to decide anything.

use crate::api::{NodeClaimPhase, SlotPhase};

/// What the operator observes of a slot's machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineObservation {
    /// The machine is up: its kubelet reports (Ready or NotReady).
    pub powered_on: bool,
    /// The node is Ready, schedulable and free of the pool's readiness taints.
    pub usable: bool,
    /// A shutdown Job for the slot has been created and has not finished.
    pub shutdown_job_in_flight: bool,
}

/// The inputs of the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotReportInput {
    /// The slot's live claim, if any: its phase (absent reads as pending).
    pub live_claim: Option<Option<NodeClaimPhase>>,
    /// The live claim is marked for scale-down.
    pub marked: bool,
    pub observed: MachineObservation,
}

/// Derives the report. Precedence: a shutdown in flight, then an unwanted machine that is up,
/// then the wanted claim's phase, with `ready` requiring a usable node.
pub fn derive_report(input: SlotReportInput) -> SlotPhase {
    let SlotReportInput { live_claim, marked, observed } = input;
    if observed.shutdown_job_in_flight {
        return SlotPhase::Draining;
    }
    let wanted = live_claim.filter(|_| !marked);
    match wanted.map(super::effective) {
        None if observed.powered_on => SlotPhase::Draining,
        None => SlotPhase::Off,
        Some(NodeClaimPhase::Pending) => SlotPhase::Pending,
        Some(NodeClaimPhase::Booting) => SlotPhase::Booting,
        Some(NodeClaimPhase::Ready) if observed.powered_on && observed.usable => SlotPhase::Ready,
        // A ready claim whose machine is off or unusable is a machine on its way (back).
        Some(NodeClaimPhase::Ready) => SlotPhase::Booting,
        // A terminal phase is not live; callers pass only live claims, but be total.
        Some(NodeClaimPhase::Completed | NodeClaimPhase::Failed) if observed.powered_on => {
            SlotPhase::Draining
        }
        Some(NodeClaimPhase::Completed | NodeClaimPhase::Failed) => SlotPhase::Off,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeClaimPhase::*;

    fn obs(on: bool, usable: bool, job: bool) -> MachineObservation {
        MachineObservation { powered_on: on, usable, shutdown_job_in_flight: job }
    }

    #[test]
    fn report_table() {
        // (live claim phase, marked, on, usable, shutdown job, report)
        type Row = (Option<Option<NodeClaimPhase>>, bool, bool, bool, bool, SlotPhase);
        let table: &[Row] = &[
            (None, false, false, false, false, SlotPhase::Off),
            (None, false, true, true, false, SlotPhase::Draining),
            (None, false, false, false, true, SlotPhase::Draining),
            (Some(None), false, false, false, false, SlotPhase::Pending),
            (Some(Some(Pending)), false, false, false, false, SlotPhase::Pending),
            (Some(Some(Booting)), false, false, false, false, SlotPhase::Booting),
            (Some(Some(Booting)), false, true, false, false, SlotPhase::Booting),
            (Some(Some(Ready)), false, true, true, false, SlotPhase::Ready),
            (Some(Some(Ready)), false, true, false, false, SlotPhase::Booting),
            (Some(Some(Ready)), false, false, false, false, SlotPhase::Booting),
            (Some(Some(Ready)), true, true, true, false, SlotPhase::Draining),
            (Some(Some(Ready)), true, false, false, false, SlotPhase::Off),
            (Some(Some(Ready)), false, true, true, true, SlotPhase::Draining),
            (Some(Some(Booting)), true, true, false, false, SlotPhase::Draining),
        ];
        for &(live_claim, marked, on, usable, job, want) in table {
            let input = SlotReportInput { live_claim, marked, observed: obs(on, usable, job) };
            assert_eq!(derive_report(input), want, "{input:?}");
        }
    }
}
