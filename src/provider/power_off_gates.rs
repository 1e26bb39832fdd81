//! cluster-autoscaler's DeleteNodes against the pool's power-off gates (docs/decisions.md,
//! D40). A deletion cluster-autoscaler is told succeeded while the machine stays on leaves its
//! ToBeDeleted taint on the node for good; a refused one makes it take the taint off, record
//! `ScaleDownFailed` and try again later. So a data machine whose power-off the gates would
//! hold is not released, and the call fails naming it and what holds it; the other named
//! machines (at most one data machine among them) are released, so that a call naming several
//! empty data machines at once still makes progress, one at a time.

use jiff::SignedDuration;

use crate::gates::one_at_a_time::{self, Turn};
use crate::gates::{self, Reading};

use super::Provider;
use super::error::ProviderError;
use super::groups::GroupSnapshot;

impl Provider {
    /// Of the slots a call would release (`released`), the data machines that may not go now,
    /// each with why: one whose turn has not come (another data machine of the pool is on its
    /// way off, or goes first in this same call) or whose gates hold. The first that may go is
    /// not among them.
    pub(super) async fn held_by_power_off_gates(
        &self,
        snapshot: &GroupSnapshot,
        released: &[&str],
    ) -> Vec<(String, String)> {
        let pool = &snapshot.group.spec;
        let settle = SignedDuration::try_from(gates::settle(pool)).unwrap_or(SignedDuration::MAX);
        let now = jiff::Timestamp::now();
        let mut going: Option<&str> = None;
        let mut held = Vec::new();
        for &name in released {
            let Some(state) = snapshot.slot(name) else { continue };
            let slot = &state.slot;
            if !gates::is_data_machine(pool, &slot.spec) {
                continue;
            }
            if let Some(first) = going {
                let why = format!("data machine {first} goes off first; one at a time");
                held.push((name.to_owned(), why));
                continue;
            }
            let (me, peers) = gates::peers::around(self.stores(), pool, slot);
            if let Turn::Wait { peer, why, .. } = one_at_a_time::decide(&me, &peers, now, settle) {
                let why = format!("data machine {peer} is on its way off ({why})");
                held.push((name.to_owned(), why));
                continue;
            }
            let (applying, mut readings) = gates::applying(pool, &slot.spec);
            for gate in applying {
                readings.push(self.gate_reader().read(gate).await);
            }
            let holding: Vec<String> =
                readings.iter().filter(|r| !r.open()).map(Reading::holding).collect();
            if holding.is_empty() {
                going = Some(name);
            } else {
                held.push((name.to_owned(), holding.join("; ")));
            }
        }
        held
    }
}

/// The refusal of the held machines, for the caller.
pub(super) fn refusal(group: &str, held: &[(String, String)]) -> Option<ProviderError> {
    let (slot, why) = held.first()?;
    let more: Vec<String> = held[1..].iter().map(|(s, w)| format!("slot {s:?}: {w}")).collect();
    let why = if more.is_empty() { why.clone() } else { format!("{why}; and {}", more.join("; ")) };
    Some(ProviderError::PowerOffHeld { slot: slot.clone(), group: group.to_owned(), why })
}
