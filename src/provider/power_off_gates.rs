//! cluster-autoscaler's DeleteNodes against the pool's power-off gates (docs/decisions.md,
//! D40). A deletion cluster-autoscaler is told succeeded while the machine stays on leaves its
//! ToBeDeleted taint on the node for good; a refused one makes it take the taint off, record
//! `ScaleDownFailed` and try again later. So a data machine whose power-off the gates would
//! hold is refused here, before anything is released, with what holds it.

use jiff::SignedDuration;

use crate::gates::one_at_a_time::{self, Turn};
use crate::gates::{self, Reading, Verdict};

use super::Provider;
use super::delete_nodes::NodeRelease;
use super::error::ProviderError;
use super::groups::GroupSnapshot;

impl Provider {
    /// Refuses the call when a named data machine may not go now: another data machine of the
    /// pool is on its way off (or named in the same call), or one of its gates holds.
    pub(super) async fn check_power_off_gates(
        &self,
        snapshot: &GroupSnapshot,
        plan: &[NodeRelease],
    ) -> Result<(), ProviderError> {
        let pool = &snapshot.group.spec;
        let settle = SignedDuration::try_from(gates::settle(pool)).unwrap_or(SignedDuration::MAX);
        let now = jiff::Timestamp::now();
        let mut named_data_machine: Option<&str> = None;
        for release in plan.iter().filter(|r| !r.release.is_empty()) {
            let Some(state) = snapshot.slot(&release.slot) else { continue };
            let slot = &state.slot;
            if !gates::is_data_machine(pool, &slot.spec) {
                continue;
            }
            let held = |why: String| ProviderError::PowerOffHeld {
                slot: release.slot.clone(),
                group: snapshot.name().to_owned(),
                why,
            };
            if let Some(first) = named_data_machine {
                return Err(held(format!(
                    "data machine {first} is named in the same call; one data machine goes off at a time"
                )));
            }
            named_data_machine = Some(&release.slot);
            let (me, peers) = gates::peers::around(self.stores(), pool, slot);
            if let Turn::Wait { peer, why, .. } = one_at_a_time::decide(&me, &peers, now, settle) {
                return Err(held(format!("data machine {peer} is on its way off ({why})")));
            }
            let (applying, mut readings) = gates::applying(pool, &slot.spec);
            for gate in applying {
                readings.push(self.gate_reader().read(gate).await);
            }
            let holding: Vec<String> = readings
                .iter()
                .filter(|r| !r.open())
                .map(|r: &Reading| {
                    let how = if r.verdict == Verdict::Unread {
                        "could not be read"
                    } else {
                        "is closed"
                    };
                    format!("gate {} {how}: {}", r.gate, r.said)
                })
                .collect();
            if !holding.is_empty() {
                return Err(held(holding.join("; ")));
            }
        }
        Ok(())
    }
}
