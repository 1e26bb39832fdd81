//! The group controller: counts a pool's slots and live claims into its status.

use std::sync::Arc;

use futures::StreamExt;

use kube::api::{Api, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::error::{KubeContext, Result};
use super::params;
use super::{Context, GroupInputs};
use crate::api::{GROUP_LABEL, Group, GroupClaimCounts, NodeClaim, NodeClaimPhase};
use crate::phase;

pub async fn controller(ctx: Arc<Context>, inputs: GroupInputs, shutdown: CancellationToken) {
    let ns_slots = ctx.namespace.clone();
    let ns_claims = ctx.namespace.clone();
    let controller = Controller::for_stream(inputs.groups.map(Ok), ctx.stores.groups.clone())
        .watches_stream(inputs.slots.map(Ok), move |slot| {
            slot.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(GROUP_LABEL))
                .map(|g| ObjectRef::new(g).within(&ns_slots))
        })
        .watches_stream(inputs.claims.map(Ok), move |claim| {
            Some(ObjectRef::new(&claim.spec.request.group).within(&ns_claims))
        })
        .graceful_shutdown_on(async move { shutdown.cancelled().await });
    super::drive("group", controller.run(reconcile, super::error_policy, ctx)).await;
}

/// Live claims by phase.
pub fn count<'a>(claims: impl IntoIterator<Item = &'a NodeClaim>) -> GroupClaimCounts {
    let mut counts = GroupClaimCounts::default();
    for claim in claims {
        match phase::of(claim) {
            NodeClaimPhase::Pending => counts.pending += 1,
            NodeClaimPhase::Booting => counts.booting += 1,
            NodeClaimPhase::Ready => counts.ready += 1,
            NodeClaimPhase::Completed | NodeClaimPhase::Failed => {}
        }
    }
    counts
}

async fn reconcile(group: Arc<Group>, ctx: Arc<Context>) -> Result<Action> {
    let name = group.metadata.name.clone().unwrap_or_default();
    let slots = ctx
        .stores
        .slots
        .state()
        .iter()
        .filter(|s| s.metadata.labels.as_ref().and_then(|l| l.get(GROUP_LABEL)) == Some(&name))
        .count();
    let claims = ctx.stores.claims.state();
    let counts = count(claims.iter().map(AsRef::as_ref).filter(|c| c.spec.request.group == name));
    let status = group.status.clone().unwrap_or_default();
    let slots = i32::try_from(slots).unwrap_or(i32::MAX);
    if status.slots == slots
        && status.claims == counts
        && status.observed_generation == group.metadata.generation
    {
        return Ok(Action::await_change());
    }
    let patch = json!({ "status": { "slots": slots, "claims": counts, "observedGeneration": group.metadata.generation } });
    Api::<Group>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch_status(&name, &params(), &Patch::Merge(&patch))
        .await
        .during(|| format!("writing the status of group {name}"))?;
    Ok(Action::await_change())
}
