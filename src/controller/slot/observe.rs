//! What the operator observes of a slot's machine, and the slot's status: observed power, the
//! derived report, the digest of the newest claim, and a capacity-drift condition. Written only
//! when it changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch};
use serde_json::json;

use crate::api::{
    GROUP_LABEL, LABEL_GROUP, LABEL_SLOT, Node, NodeClaim, NodeStatus, ObservedPower,
    SlotClaimDigest,
};
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result};
use crate::controller::params;
use crate::machine;
use crate::phase::{self, Observation, SlotReportInput};

/// The providerID a slot's node carries.
pub fn provider_id(slot: &Node) -> String {
    slot.spec.provider_id.clone().unwrap_or_else(|| {
        format!("homelab://{}", slot.metadata.name.as_deref().unwrap_or_default())
    })
}

/// What ties a node to its slot, as a merge patch (empty when the node already says it): the
/// providerID when the node has none, and the slot's group and name as labels, so
/// cluster-autoscaler matches instances to nodes and people can select a pool's nodes.
pub fn identity_patch(slot: &Node, node: &CoreNode) -> serde_json::Map<String, serde_json::Value> {
    let slot_name = slot.metadata.name.clone().unwrap_or_default();
    let group =
        slot.metadata.labels.as_ref().and_then(|l| l.get(GROUP_LABEL)).cloned().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let mut patch = serde_json::Map::new();
    let mut wanted_labels = serde_json::Map::new();
    for (key, value) in [(LABEL_GROUP, &group), (LABEL_SLOT, &slot_name)] {
        if labels.get(key) != Some(value) {
            wanted_labels.insert(key.into(), json!(value));
        }
    }
    if !wanted_labels.is_empty() {
        patch.insert("metadata".into(), json!({ "labels": wanted_labels }));
    }
    let current_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or("");
    if current_id.is_empty() {
        patch.insert("spec".into(), json!({ "providerID": provider_id(slot) }));
    }
    patch
}

/// Writes what the slot side wants of its node (identity and cluster-autoscaler marks) in one
/// merge patch, when there is anything to write.
pub async fn write_node(
    ctx: &Context,
    node: &CoreNode,
    patch: serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    if patch.is_empty() {
        return Ok(());
    }
    let node_name = node.metadata.name.clone().unwrap_or_default();
    Api::<CoreNode>::all(ctx.client.clone())
        .patch(&node_name, &params(), &Patch::Merge(&serde_json::Value::Object(patch)))
        .await
        .during(|| format!("updating node {node_name} for its slot"))?;
    Ok(())
}

/// Adds the merge patch `from` into `into`, object by object. Unlike applying one patch to the
/// other, a `null` (delete this key) in `from` is kept.
pub fn extend_patch(
    into: &mut serde_json::Map<String, serde_json::Value>,
    from: serde_json::Map<String, serde_json::Value>,
) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(serde_json::Value::Object(inner)), serde_json::Value::Object(more)) => {
                extend_patch(inner, more)
            }
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

/// The slot's live claim (the newest, should a race have left two).
pub fn live_claim(ctx: &Context, slot_name: &str) -> Option<std::sync::Arc<NodeClaim>> {
    ctx.claims_of_slot(slot_name)
        .into_iter()
        .filter(|c| phase::is_live(Some(phase::of(c))))
        .max_by_key(|c| age(c))
}

/// Claims order by creation, then name.
fn age(claim: &NodeClaim) -> (Option<jiff::Timestamp>, Option<String>) {
    (claim.metadata.creation_timestamp.as_ref().map(|t| t.0), claim.metadata.name.clone())
}

/// The newest claim of a slot.
pub fn newest<'a>(claims: impl IntoIterator<Item = &'a NodeClaim>) -> Option<&'a NodeClaim> {
    claims.into_iter().max_by_key(|c| age(c))
}

fn digest(claim: &NodeClaim) -> SlotClaimDigest {
    let status = claim.status.as_ref();
    SlotClaimDigest {
        name: claim.metadata.name.clone().unwrap_or_default(),
        phase: Some(phase::of(claim)),
        attempt: claim.spec.attempt.unwrap_or(1),
        boot_committed: status.is_some_and(|s| s.boot_committed_at.is_some()),
        reached_ready: status.is_some_and(|s| s.ready_at.is_some()),
        call: claim.spec.request.call,
        group: claim.spec.request.group.clone(),
        reason: status.and_then(|s| s.reason.clone()),
        deadline_at: claim.spec.deadline_at.clone(),
        finished_at: status.and_then(|s| s.finished_at.clone()),
    }
}

/// Declared capacity that the node's allocatable contradicts, as `name: declared vs seen`.
fn capacity_drift(slot: &Node, node: &CoreNode) -> Vec<String> {
    let allocatable: BTreeMap<String, _> =
        node.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
    slot.spec
        .node_capacity
        .iter()
        .filter_map(|(name, declared)| {
            let seen = allocatable.get(name)?;
            (seen.0 != declared.0)
                .then(|| format!("{name}: declared {} vs allocatable {}", declared.0, seen.0))
        })
        .collect()
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    previous: &[Condition],
    now: jiff::Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: None,
    }
}

/// Writes the slot's status when it changed; `live` is the slot's live claim.
pub async fn write_status(
    ctx: &Context,
    slot: &Node,
    node: Option<&CoreNode>,
    live: Option<&NodeClaim>,
) -> Result<()> {
    let slot_name = slot.metadata.name.clone().unwrap_or_default();
    let claims = ctx.claims_of_slot(&slot_name);
    let gate = ctx.group_of(slot).map(|g| g.spec.node_readiness_taints.clone()).unwrap_or_default();
    let shutdown_in_flight = ctx.shutdown_in_flight(&slot_name);
    let observed = Observation {
        powered_on: machine::powered_on(node),
        usable: machine::usable(node, &gate),
        shutdown_job_in_flight: shutdown_in_flight,
    };
    let report = phase::derive_report(SlotReportInput {
        live_claim: live.map(|c| Some(phase::of(c))),
        marked: live.is_some_and(phase::is_marked),
        observed,
    });
    let previous = slot.status.clone().unwrap_or_default();
    let last_claim =
        newest(claims.iter().map(AsRef::as_ref)).map(digest).or(previous.last_claim.clone());
    let mut conditions: Vec<Condition> =
        previous.conditions.iter().filter(|c| c.type_ != "CapacityMatches").cloned().collect();
    if let Some(node) = node.filter(|_| !slot.spec.node_capacity.is_empty()) {
        let drift = capacity_drift(slot, node);
        let (ok, reason, message) = if drift.is_empty() {
            (true, "Matches", "declared capacity matches the node's allocatable".to_string())
        } else {
            (
                false,
                "Drift",
                format!("declared nodeCapacity differs from the node: {}", drift.join(", ")),
            )
        };
        conditions.push(condition(
            "CapacityMatches",
            ok,
            reason,
            message,
            &previous.conditions,
            ctx.now(),
        ));
    } else if let Some(kept) = previous.conditions.iter().find(|c| c.type_ == "CapacityMatches") {
        conditions.push(kept.clone());
    }
    let status = NodeStatus {
        observed_generation: slot.metadata.generation,
        power_state: Some(if observed.powered_on { ObservedPower::On } else { ObservedPower::Off }),
        phase: Some(report),
        last_claim,
        conditions,
    };
    if slot.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let patch = json!({ "status": status });
    Api::<Node>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch_status(&slot_name, &params(), &Patch::Merge(&patch))
        .await
        .during(|| format!("writing the status of slot {slot_name}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_extend_object_by_object_and_keep_deletions() {
        let mut into =
            json!({ "metadata": { "labels": { "a": "1" } }, "spec": { "providerID": "x" } });
        let from = json!({
            "metadata": { "annotations": { "gone": null }, "resourceVersion": "7" },
            "spec": { "taints": [] },
        });
        let (Some(into_map), serde_json::Value::Object(from_map)) = (into.as_object_mut(), from)
        else {
            panic!("objects");
        };
        extend_patch(into_map, from_map);
        assert_eq!(
            into,
            json!({
                "metadata": { "labels": { "a": "1" }, "annotations": { "gone": null }, "resourceVersion": "7" },
                "spec": { "providerID": "x", "taints": [] },
            })
        );
    }
}
