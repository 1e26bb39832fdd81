//! Claims as the tests read and make them: one reading of a claim's phase, and a claim built by
//! the provider's own constructor, so a test's claim is the one IncreaseSize creates and follows
//! it when the provider changes what it stamps.

use anyhow::{Context, Result};
use homelab_autoscaler::api::ScalingDriver;
use homelab_autoscaler::api::{Group, Node, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::claim::Timeouts;
use homelab_autoscaler::provider::Caller;
use homelab_autoscaler::provider::claim_object::{ClaimIntent, new_claim};
use kube::Api;

/// The claim's phase as the operator reads it: a claim no controller has written yet is pending.
pub fn phase(claim: &NodeClaim) -> NodeClaimPhase {
    homelab_autoscaler::phase::of(claim)
}

/// The claim's `status.reason`, if it ended with one.
pub fn reason(claim: &NodeClaim) -> Option<String> {
    claim.status.as_ref().and_then(|s| s.reason.clone())
}

/// The IncreaseSize claim the provider creates for `slot` of `group` now, by `requested_by`:
/// stamped (attempt 1, deadline from `timeouts`), labelled and owned by its slot. It is named
/// `name` instead of the `<slot>-` generated name, so a test can read it back.
pub fn provider_claim(
    name: &str,
    slot: &Node,
    group: &Group,
    timeouts: Timeouts,
    requested_by: &str,
) -> NodeClaim {
    let caller = Caller {
        driver: ScalingDriver::ClusterAutoscaler,
        requested_by: requested_by.to_string(),
        reason: None,
        session: None,
    };
    let intent = ClaimIntent {
        slot,
        group,
        delta: 1,
        caller: &caller,
        attempt: 1,
        requested_at: jiff::Timestamp::now(),
        timeouts,
        choice: "chosen by the test",
    };
    let mut claim = new_claim(&intent);
    claim.metadata.generate_name = None;
    claim.metadata.name = Some(name.to_string());
    claim
}

/// [`provider_claim`] for the slot named `slot`, its group read through `slots` and `groups`.
pub async fn provider_claim_for(
    name: &str,
    slot: &str,
    slots: &Api<Node>,
    groups: &Api<Group>,
    timeouts: Timeouts,
    requested_by: &str,
) -> Result<NodeClaim> {
    let slot_obj = slots.get(slot).await.with_context(|| format!("reading slot {slot}"))?;
    let group_name = slot_obj.group().with_context(|| format!("slot {slot} names no group"))?;
    let group =
        groups.get(group_name).await.with_context(|| format!("reading group {group_name}"))?;
    Ok(provider_claim(name, &slot_obj, &group, timeouts, requested_by))
}
