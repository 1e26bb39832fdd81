//! The other data machines of a pool, as the turn rule ([`super::one_at_a_time`]) reads them
//! from the caches: the slot controller before a power-off, the provider before it accepts
//! cluster-autoscaler's DeleteNodes.

use crate::api::{GroupSpec, LABEL_LIFECYCLE, Node, NodeClaimPhase};
use crate::cache::Stores;
use crate::job_outcome::{JobOutcome, outcome};
use crate::{machine, phase};

use super::one_at_a_time::Peer;

/// The label values of a shutdown Job and of the maintenance step before a power-off.
const SHUTDOWN: &str = "shutdown";
const BEFORE_POWER_OFF: &str = "before-power-off";

/// `slot` as a peer reads it: its shutdown Jobs, whether it is being drained, and whether a
/// release of it is under way (a marked claim while the machine is up).
pub fn of(stores: &Stores, slot: &Node) -> Peer {
    let name = slot.metadata.name.clone().unwrap_or_default();
    let slot_jobs = stores.jobs_of_slot(&name);
    let of_kind = |kind: &'static str| {
        slot_jobs.iter().filter(move |j| {
            j.metadata.labels.as_ref().and_then(|l| l.get(LABEL_LIFECYCLE)).map(String::as_str)
                == Some(kind)
        })
    };
    let jobs: Vec<JobOutcome> = of_kind(SHUTDOWN)
        .map(|j| match outcome(j) {
            JobOutcome::Succeeded { at } => JobOutcome::Succeeded {
                at: at.or(j.metadata.creation_timestamp.as_ref().map(|t| t.0)),
            },
            other => other,
        })
        .collect();
    let last_shutdown_ended = jobs
        .iter()
        .filter_map(|j| match j {
            JobOutcome::Succeeded { at } => *at,
            _ => None,
        })
        .max();
    let node = stores.core_node(&slot.spec.kubernetes_node_name);
    let claims = stores.claims_of_slot(&name);
    let live = || claims.iter().filter(|c| phase::is_live(Some(phase::of(c))));
    // Wanted: a live claim not being released, or a boot that runs to its end first.
    let wanted = live().any(|c| !phase::is_marked(c) || phase::of(c) == NodeClaimPhase::Booting);
    let up = machine::powered_on(node.as_deref());
    let up_since = machine::ready_since(node.as_deref());
    let step_this_time_up = of_kind(BEFORE_POWER_OFF).any(|j| {
        let made = j.metadata.creation_timestamp.as_ref().map(|t| t.0);
        outcome(j) != JobOutcome::Failed
            && up_since.is_none_or(|since| made.is_some_and(|m| m >= since))
    });
    let cordoned = node.as_deref().is_some_and(machine::is_cordoned);
    Peer {
        slot: name,
        shutdown_running: jobs.contains(&JobOutcome::Running),
        last_shutdown_ended,
        draining: up && cordoned && !wanted,
        preparing: up && !wanted && step_this_time_up,
        released: up && !wanted && live().any(|c| phase::is_marked(c)),
        held: slot.status.as_ref().is_some_and(|s| s.power_off_held_by.is_some()),
        turn_taken: None,
    }
}

/// `me` and the pool's other data machines.
pub fn around(stores: &Stores, pool: &GroupSpec, me: &Node) -> (Peer, Vec<Peer>) {
    let group = me.group().unwrap_or_default();
    let others = stores
        .slots_of_group(group)
        .iter()
        .filter(|s| s.metadata.name != me.metadata.name)
        .filter(|s| super::is_data_machine(pool, &s.spec))
        .map(|s| of(stores, s))
        .collect();
    (of(stores, me), others)
}
