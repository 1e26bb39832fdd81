//! NodeGroupNodes: one instance per slot that has something to report, with the id the
//! machine's Kubernetes node carries in `spec.providerID`, so cluster-autoscaler matches the
//! two exactly.
//!
//! | the slot's claim                                  | instance                          |
//! |---------------------------------------------------|-----------------------------------|
//! | live, marked for scale-down                       | deleting                          |
//! | ready                                             | running                           |
//! | pending or booting, node registered               | running                           |
//! | pending or booting, no node yet                   | creating                          |
//! | newest is failed and not acknowledged             | creating + errorInfo (class 99)   |
//! | newest is terminal and being deleted              | deleting                          |
//! | none, or terminal and done with                   | not listed                        |
//!
//! Every wanted claim without a node is listed (else cluster-autoscaler "fixes" the size with
//! DecreaseTargetSize); a failed claim is shown with its reason so cluster-autoscaler backs the
//! group off, until its DeleteNodes acknowledges it.

use crate::api::{NodeClaim, NodeClaimPhase};
use crate::phase;

use super::error::ProviderError;
use super::groups::SlotState;
use super::{Caller, Provider};

/// cluster-autoscaler's `OtherErrorClass`: any failure that is not running out of resources.
pub const OTHER_ERROR_CLASS: i32 = 99;

/// The state of an instance, in cluster-autoscaler's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    Running,
    Creating,
    Deleting,
}

/// Why an instance failed to come up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceError {
    /// The claim's reason, for example DeadlineExceeded.
    pub code: String,
    pub message: String,
    pub class: i32,
}

/// One machine of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// The machine's providerID.
    pub id: String,
    pub state: InstanceState,
    pub error: Option<InstanceError>,
}

/// The instance a slot reports, if any.
pub fn instance_of(slot: &SlotState) -> Option<Instance> {
    let id = slot.instance_id();
    if let Some(live) = slot.live_claim() {
        let state = if phase::is_marked(live) {
            InstanceState::Deleting
        } else if phase::of(live) == NodeClaimPhase::Ready || slot.registered {
            InstanceState::Running
        } else {
            InstanceState::Creating
        };
        return Some(Instance { id, state, error: None });
    }
    if let Some(failed) = slot.unacknowledged_failure() {
        return Some(Instance {
            id,
            state: InstanceState::Creating,
            error: Some(failure_of(failed)),
        });
    }
    let newest = slot.newest_claim()?;
    if newest.metadata.deletion_timestamp.is_some() {
        return Some(Instance { id, state: InstanceState::Deleting, error: None });
    }
    None
}

fn failure_of(claim: &NodeClaim) -> InstanceError {
    let status = claim.status.clone().unwrap_or_default();
    let code = status.reason.filter(|r| !r.is_empty()).unwrap_or_else(|| "Failed".to_owned());
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let message = match status.message.filter(|m| !m.is_empty()) {
        Some(message) => format!("claim {name} failed ({code}): {message}"),
        None => format!("claim {name} failed ({code})"),
    };
    InstanceError { code, message, class: OTHER_ERROR_CLASS }
}

impl Provider {
    /// The group's instances, from the caches.
    #[tracing::instrument(skip(self, caller))]
    pub fn instances(&self, caller: &Caller, group: &str) -> Result<Vec<Instance>, ProviderError> {
        Ok(self.snapshot(caller, group)?.slots.iter().filter_map(instance_of).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::super::groups::tests::{claim, marked, slot};
    use super::*;
    use NodeClaimPhase::*;

    fn state(claims: Vec<NodeClaim>, registered: bool) -> SlotState {
        SlotState {
            slot: slot("nuc", "pool"),
            claims: claims.into_iter().map(Arc::new).collect(),
            registered,
            asleep: false,
        }
    }

    fn failed(reason: &str, acknowledged: bool) -> NodeClaim {
        let mut c = claim("nuc-1", "nuc", Some(Failed), "2026-03-04T09:00:00Z");
        if let Some(s) = c.status.as_mut() {
            s.reason = Some(reason.into());
            s.message = Some("the boot overran its deadline".into());
            s.failure_acknowledged_at =
                acknowledged.then(|| Time("2026-03-04T10:00:00Z".parse().unwrap()));
        }
        c
    }

    fn deleting(mut c: NodeClaim) -> NodeClaim {
        c.metadata.deletion_timestamp = Some(Time("2026-03-04T10:00:00Z".parse().unwrap()));
        c
    }

    #[test]
    fn instance_table() {
        use InstanceState::*;
        let at = "2026-03-04T09:00:00Z";
        let table: Vec<(&str, SlotState, Option<InstanceState>)> = vec![
            ("no claim", state(vec![], false), None),
            (
                "a brand-new claim (no phase)",
                state(vec![claim("c", "nuc", None, at)], false),
                Some(Creating),
            ),
            (
                "pending, no node",
                state(vec![claim("c", "nuc", Some(Pending), at)], false),
                Some(Creating),
            ),
            (
                "booting, no node",
                state(vec![claim("c", "nuc", Some(Booting), at)], false),
                Some(Creating),
            ),
            (
                "booting, node registered",
                state(vec![claim("c", "nuc", Some(Booting), at)], true),
                Some(Running),
            ),
            ("ready", state(vec![claim("c", "nuc", Some(Ready), at)], true), Some(Running)),
            (
                "ready, node gone",
                state(vec![claim("c", "nuc", Some(Ready), at)], false),
                Some(Running),
            ),
            (
                "marked",
                state(vec![marked(claim("c", "nuc", Some(Ready), at))], true),
                Some(Deleting),
            ),
            (
                "deleted, finalizer holding",
                state(vec![deleting(claim("c", "nuc", Some(Booting), at))], true),
                Some(Deleting),
            ),
            ("completed", state(vec![claim("c", "nuc", Some(Completed), at)], false), None),
            (
                "completed, finalizer holding",
                state(vec![deleting(claim("c", "nuc", Some(Completed), at))], true),
                Some(Deleting),
            ),
            ("failed", state(vec![failed("DeadlineExceeded", false)], false), Some(Creating)),
            ("failed and acknowledged", state(vec![failed("DeadlineExceeded", true)], false), None),
            (
                "a failure behind a newer live claim is not shown",
                state(
                    vec![
                        claim("c2", "nuc", Some(Pending), "2026-03-04T09:30:00Z"),
                        failed("X", false),
                    ],
                    false,
                ),
                Some(Creating),
            ),
        ];
        for (name, slot_state, want) in table {
            let got = instance_of(&slot_state);
            assert_eq!(got.as_ref().map(|i| i.state), want, "{name}");
            if let Some(instance) = got {
                assert_eq!(instance.id, "homelab://nuc", "{name}");
                let failed_shown = instance.error.is_some();
                assert_eq!(failed_shown, name == "failed", "{name}: error info");
            }
        }
    }

    #[test]
    fn a_failure_carries_the_claims_reason_as_code_with_class_99() {
        let got = instance_of(&state(vec![failed("StartupJobFailed", false)], false)).unwrap();
        let error = got.error.unwrap();
        assert_eq!(error.code, "StartupJobFailed");
        assert_eq!(error.class, OTHER_ERROR_CLASS);
        assert!(error.message.contains("nuc-1"), "{}", error.message);
    }
}
