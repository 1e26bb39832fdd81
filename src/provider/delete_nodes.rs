//! NodeGroupDeleteNodes: release the machines of the named nodes. cluster-autoscaler has
//! drained them already. Each live claim of a named slot is marked (status.scaleDownRequestedAt
//! and By, through the status subresource) and then deleted: a pending claim goes at once, a
//! booting or ready one is held by its finalizer until the shutdown path has powered the
//! machine off. Both steps are skipped when already done, so a repeated call is harmless.
//!
//! A failed claim named here is cluster-autoscaler acknowledging the create error it was shown
//! (it calls DeleteNodes on such an instance every loop until it leaves the list): the claim is
//! stamped status.failureAcknowledgedAt and is no longer listed.
//!
//! A data machine that the pool's power-off gates would hold on is not released, and
//! cluster-autoscaler's call then fails naming it (`power_off_gates`, D40).
//!
//! A named node whose slot is held by a pin (a live `Manual` or `Schedule` claim not already
//! being released) refuses the whole call before anything is written: no scaler releases a
//! pinned machine (docs/decisions.md, D17), and releasing the other named nodes while refusing
//! one would leave the caller's picture half right.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, Preconditions};
use kube::runtime::reflector::ObjectRef;

use crate::api::{NodeClaim, NodeClaimPhase};
use crate::field_manager::FieldManager;
use crate::phase;

use super::error::ProviderError;
use super::groups::{GroupSnapshot, is_acknowledged, phase_of};
use super::node_lookup::{NodeRef, find_slot};
use super::{Caller, Provider};

/// What a DeleteNodes did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteOutcome {
    /// Live claims marked and deleted (or found already so).
    pub released: Vec<String>,
    /// Failed claims acknowledged.
    pub acknowledged: Vec<String>,
}

/// What to do for one named node.
#[derive(Clone, Debug)]
pub struct NodeRelease {
    pub slot: String,
    /// The slot's live claims: marked, then deleted.
    pub release: Vec<Arc<NodeClaim>>,
    /// The slot's failed claims not yet acknowledged.
    pub acknowledge: Vec<Arc<NodeClaim>>,
}

/// Resolves the named nodes to their slots' claims and checks the group's floor.
pub fn plan_delete(
    snapshot: &GroupSnapshot,
    nodes: &[NodeRef],
) -> Result<Vec<NodeRelease>, ProviderError> {
    let slots: Vec<_> = snapshot.slots.iter().map(|s| s.slot.clone()).collect();
    let mut plan: Vec<NodeRelease> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let Some(slot) = find_slot(&slots, node) else {
            return Err(ProviderError::NodeNotInGroup {
                node: node.display_name().to_owned(),
                group: snapshot.name().to_owned(),
            });
        };
        let name = super::groups::slot_name(slot);
        if plan.iter().any(|p| p.slot == name) {
            continue;
        }
        let Some(state) = snapshot.slot(name) else { continue };
        if let Some(pin) = state.claims.iter().find(|c| is_pinning(c)) {
            return Err(pinned(snapshot, node, name, pin));
        }
        let release =
            state.claims.iter().filter(|c| phase::is_live(phase_of(c))).cloned().collect();
        let acknowledge = state
            .claims
            .iter()
            .filter(|c| phase_of(c) == Some(NodeClaimPhase::Failed) && !is_acknowledged(c))
            .cloned()
            .collect();
        plan.push(NodeRelease { slot: name.to_owned(), release, acknowledge });
    }

    let newly_unwanted =
        plan.iter().filter(|p| snapshot.slot(&p.slot).is_some_and(|s| s.is_wanted())).count();
    let by = super::groups::saturating_i32(newly_unwanted);
    let (target, min_size) = (snapshot.wanted_count(), snapshot.group.spec.min_size);
    if by > 0 && target - by < min_size {
        return Err(ProviderError::BelowMinSize {
            group: snapshot.name().to_owned(),
            target,
            by,
            min_size,
        });
    }
    Ok(plan)
}

/// A pin that holds its slot: live, a pin, and not being released by its owner already.
pub fn is_pinning(claim: &NodeClaim) -> bool {
    claim.spec.request.call.is_pin() && phase::is_live(phase_of(claim)) && !phase::is_marked(claim)
}

/// A release that did not go through: the step, and the API server's answer.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct ReleaseFailed {
    pub action: String,
    #[source]
    pub source: kube::Error,
}

/// Releases a live claim as a scale-down does, whoever asks (DeleteNodes, shedding on
/// battery): marks it with `scaleDownRequestedAt` and `By` through the status subresource, then
/// deletes it, its uid as precondition; its finalizer keeps it until the machine is off. Each
/// step only if not done yet; a claim already gone counts as released.
pub async fn mark_and_delete(
    api: &Api<NodeClaim>,
    claim: &NodeClaim,
    by: &str,
    writer: FieldManager,
    now: Timestamp,
) -> Result<(), ReleaseFailed> {
    let Some(name) = claim.metadata.name.as_deref() else { return Ok(()) };
    let failed = |action: &str, source| ReleaseFailed {
        action: format!("{action} claim {name} for scale-down"),
        source,
    };
    let status = claim.status.as_ref();
    if status.and_then(|s| s.scale_down_requested_at.as_ref()).is_none() {
        let patch = serde_json::json!({ "status": {
            "scaleDownRequestedAt": Time(now),
            "scaleDownRequestedBy": by,
        }});
        match api.patch_status(name, &writer.patch(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(source) => return Err(failed("marking", source)),
        }
    }
    if claim.metadata.deletion_timestamp.is_none() {
        let params = DeleteParams::default().preconditions(Preconditions {
            uid: claim.metadata.uid.clone(),
            resource_version: None,
        });
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => return Err(failed("deleting", source)),
        }
    }
    Ok(())
}

fn pinned(snapshot: &GroupSnapshot, node: &NodeRef, slot: &str, pin: &NodeClaim) -> ProviderError {
    let call = match pin.spec.request.call {
        crate::api::ClaimCall::Schedule => "Schedule",
        _ => "Manual",
    };
    ProviderError::Pinned(Box::new(super::error::PinnedNode {
        node: node.display_name().to_owned(),
        group: snapshot.name().to_owned(),
        slot: slot.to_owned(),
        claim: pin.metadata.name.clone().unwrap_or_default(),
        call,
        by: pin.spec.requested_by.clone().unwrap_or_else(|| "an unknown user".to_owned()),
        namespace: pin.metadata.namespace.clone().unwrap_or_default(),
        until: pin.spec.until.as_ref().map(|t| t.0),
    }))
}

impl Provider {
    /// Releases the machines of the named nodes of a group.
    #[tracing::instrument(skip_all, fields(group = %group, caller = %caller.requested_by, nodes = nodes.len()))]
    pub async fn delete_nodes(
        &self,
        caller: &Caller,
        group: &str,
        nodes: &[NodeRef],
    ) -> Result<DeleteOutcome, ProviderError> {
        let _writes = self.lock_writes().await;
        let snapshot = self.snapshot_for_write(caller, group).await?;
        let mut plan = plan_delete(&snapshot, nodes)?;
        // cluster-autoscaler treats a deletion it was told succeeded as done; the built-in
        // scaler's releases are held where the machine's status shows it (the slot's shutdown).
        let held = match caller.driver {
            crate::api::ScalingDriver::ClusterAutoscaler => {
                let released: Vec<&str> = plan
                    .iter()
                    .filter(|p| !p.release.is_empty())
                    .map(|p| p.slot.as_str())
                    .collect();
                self.held_by_power_off_gates(&snapshot, &released).await
            }
            crate::api::ScalingDriver::Builtin => Vec::new(),
        };
        plan.retain(|p| !held.iter().any(|(slot, _)| *slot == p.slot));
        let api: Api<NodeClaim> = Api::namespaced(self.client().clone(), &self.config().namespace);
        let now = Timestamp::now();
        let mut outcome = DeleteOutcome::default();
        for node in &plan {
            for claim in &node.release {
                self.release(&api, claim, caller, now).await?;
                outcome.released.push(claim.metadata.name.clone().unwrap_or_default());
            }
            for claim in &node.acknowledge {
                self.acknowledge(&api, claim, now).await?;
                outcome.acknowledged.push(claim.metadata.name.clone().unwrap_or_default());
            }
            tracing::info!(slot = %node.slot, "machine released");
        }

        let namespace = &self.config().namespace;
        self.stores()
            .settle(self.config().settle_timeout, "claims released", |stores| {
                let shown = |name: &String, done: &dyn Fn(&NodeClaim) -> bool| {
                    stores
                        .claims
                        .get(&ObjectRef::new(name).within(namespace))
                        .is_none_or(|c| done(&c))
                };
                outcome.released.iter().all(|n| shown(n, &phase::is_marked))
                    && outcome.acknowledged.iter().all(|n| shown(n, &is_acknowledged))
            })
            .await;
        if let Some(refusal) = super::power_off_gates::refusal(snapshot.name(), &held) {
            return Err(refusal);
        }
        Ok(outcome)
    }

    /// Marks a live claim for scale-down and deletes it; each step only if not done yet.
    async fn release(
        &self,
        api: &Api<NodeClaim>,
        claim: &NodeClaim,
        caller: &Caller,
        now: Timestamp,
    ) -> Result<(), ProviderError> {
        let by = format!("{} (DeleteNodes)", caller.requested_by);
        mark_and_delete(api, claim, &by, FieldManager::Provider, now)
            .await
            .map_err(|failed| ProviderError::kube(failed.action, failed.source))
    }

    /// Records that cluster-autoscaler has seen a failed claim.
    async fn acknowledge(
        &self,
        api: &Api<NodeClaim>,
        claim: &NodeClaim,
        now: Timestamp,
    ) -> Result<(), ProviderError> {
        let Some(name) = claim.metadata.name.as_deref() else { return Ok(()) };
        let patch = serde_json::json!({ "status": { "failureAcknowledgedAt": Time(now) } });
        match api.patch_status(name, &FieldManager::Provider.patch(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => {
                Err(ProviderError::kube(format!("acknowledging failed claim {name}"), source))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::groups::tests::{claim, group, marked, slot};
    use super::*;
    use NodeClaimPhase::*;

    fn node(name: &str) -> NodeRef {
        NodeRef {
            provider_id: format!("homelab://{name}"),
            name: name.into(),
            ..NodeRef::default()
        }
    }

    fn snap(min_size: i32, claims: Vec<NodeClaim>) -> GroupSnapshot {
        let slots = vec![slot("a", "pool"), slot("b", "pool")];
        let claims: Vec<Arc<NodeClaim>> = claims.into_iter().map(Arc::new).collect();
        GroupSnapshot::build(group("pool", min_size), &slots, &claims, &HashSet::new())
    }

    fn claim_names(claims: &[Arc<NodeClaim>]) -> Vec<&str> {
        claims.iter().filter_map(|c| c.metadata.name.as_deref()).collect()
    }

    #[test]
    fn a_named_node_releases_its_live_claim_and_acknowledges_old_failures() {
        let s = snap(
            0,
            vec![
                claim("a-2", "a", Some(Ready), "2026-03-04T09:30:00Z"),
                claim("a-1", "a", Some(Failed), "2026-03-04T09:00:00Z"),
            ],
        );
        let plan = plan_delete(&s, &[node("a"), node("a")]).unwrap();
        assert_eq!(plan.len(), 1, "a node named twice is released once");
        assert_eq!(claim_names(&plan[0].release), ["a-2"]);
        assert_eq!(claim_names(&plan[0].acknowledge), ["a-1"]);
    }

    #[test]
    fn an_already_marked_claim_is_released_again_idempotently_and_spends_no_floor() {
        let s = snap(1, vec![marked(claim("a-1", "a", Some(Ready), "2026-03-04T09:00:00Z"))]);
        let plan = plan_delete(&s, &[node("a")]).unwrap();
        assert_eq!(claim_names(&plan[0].release), ["a-1"]);
    }

    #[test]
    fn refusals() {
        let s = snap(1, vec![claim("a-1", "a", Some(Ready), "2026-03-04T09:00:00Z")]);
        assert!(matches!(
            plan_delete(&s, &[node("a")]),
            Err(ProviderError::BelowMinSize { target: 1, by: 1, min_size: 1, .. })
        ));
        assert!(matches!(
            plan_delete(&s, &[node("elsewhere")]),
            Err(ProviderError::NodeNotInGroup { .. })
        ));
    }

    fn pin(mut c: NodeClaim, call: crate::api::ClaimCall) -> NodeClaim {
        c.spec.request.call = call;
        c.spec.request.delta = None;
        c.spec.requested_by = Some("alice".into());
        c
    }

    #[test]
    fn a_pinned_node_refuses_the_whole_call() {
        use crate::api::ClaimCall::{Manual, Schedule};
        let ready = |name: &str, slot: &str| claim(name, slot, Some(Ready), "2026-03-04T09:00:00Z");
        // (claims, refused with the pin's name)
        let table = [
            (vec![pin(ready("a-1", "a"), Manual), ready("b-1", "b")], Some("a-1")),
            (vec![ready("a-1", "a"), pin(ready("b-1", "b"), Schedule)], Some("b-1")),
            (
                vec![pin(claim("a-1", "a", Some(Pending), "2026-03-04T09:00:00Z"), Manual)],
                Some("a-1"),
            ),
            // Being released by its owner already: nothing to protect.
            (vec![marked(pin(ready("a-1", "a"), Manual))], None),
            // An ended pin holds nothing.
            (vec![pin(claim("a-1", "a", Some(Completed), "2026-03-04T09:00:00Z"), Manual)], None),
        ];
        for (claims, refused) in table {
            let got = plan_delete(&snap(0, claims), &[node("a"), node("b")]);
            match (refused, got) {
                (Some(want), Err(err @ ProviderError::Pinned(_))) => {
                    let text = err.to_string();
                    assert!(text.contains(&format!("claim {want:?}")), "{text}");
                    assert!(text.contains("of alice"), "{text}");
                    assert!(text.contains("homelab-autoscaler release --slot"), "{text}");
                    assert!(text.contains("nothing was released"), "{text}");
                    assert_eq!(err.kind(), super::super::error::ErrorKind::FailedPrecondition);
                }
                (None, Ok(_)) => {}
                (want, got) => panic!("expected refusal by {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn an_acknowledged_failure_is_not_acknowledged_again() {
        let mut failed = claim("b-1", "b", Some(Failed), "2026-03-04T09:00:00Z");
        if let Some(st) = failed.status.as_mut() {
            st.failure_acknowledged_at = Some(Time(Timestamp::UNIX_EPOCH));
        }
        let plan = plan_delete(&snap(0, vec![failed]), &[node("b")]).unwrap();
        assert!(plan[0].release.is_empty() && plan[0].acknowledge.is_empty());
    }
}
