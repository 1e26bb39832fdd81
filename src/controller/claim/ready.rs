//! A ready claim owns its machine. Its deadline is gone; what bounds it now is the machine
//! itself: observed off for a whole boot window (the clock on the object, so a restart does not
//! restart it) fails the claim `MachineGone`. A machine that comes back clears the mark. A pin
//! is woken at its `spec.until`, so it expires on time without polling (`expiry`).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use serde_json::json;

use super::chokepoint::{self, PhaseMove};
use super::expiry;
use crate::api::{NodeClaim, NodeClaimPhase};
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result};
use crate::field_manager::FieldManager;
use crate::machine;
use crate::phase::Writer;

pub async fn reconcile_ready(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Action> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if claim.spec.deadline_at.is_some() {
        // A crash between the ready write and this one left an inert deadline; finish the move.
        clear_deadline(ctx, &name).await?;
    }
    let Some(slot) = ctx.slot(&claim.spec.slot_ref.name) else {
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    };
    let wake = |at: Option<jiff::Timestamp>| expiry::wake(ctx, claim, at);
    let node = ctx.core_node(&slot.spec.kubernetes_node_name);
    let off_since =
        claim.status.as_ref().and_then(|s| s.machine_observed_off.as_ref()).map(|t| t.0);
    if machine::powered_on(node.as_deref()) {
        if off_since.is_some() {
            chokepoint::patch_status(
                ctx,
                claim,
                FieldManager::ClaimController,
                json!({ "machineObservedOff": null }),
            )
            .await?;
        }
        return Ok(wake(None));
    }
    let grace = ctx.timeouts.budget();
    let grace_signed = jiff::SignedDuration::try_from(grace).unwrap_or(jiff::SignedDuration::MAX);
    let Some(since) = off_since else {
        let now = ctx.now();
        chokepoint::patch_status(
            ctx,
            claim,
            FieldManager::ClaimController,
            json!({ "machineObservedOff": Time(now) }),
        )
        .await?;
        return Ok(wake(Some(now.checked_add(grace_signed).unwrap_or(jiff::Timestamp::MAX))));
    };
    let end = since.checked_add(grace_signed).unwrap_or(jiff::Timestamp::MAX);
    if ctx.now() >= end {
        let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ClaimController).because(
            "MachineGone",
            format!("node {} has been observed off since {since}", slot.spec.kubernetes_node_name),
        );
        chokepoint::move_phase(ctx, claim, fail).await?;
        return Ok(Action::await_change());
    }
    Ok(wake(Some(end)))
}

/// Clears `spec.deadlineAt`: the boot is over. Only the operator may do this (admission).
pub async fn clear_deadline(ctx: &Context, name: &str) -> Result<()> {
    Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch(
            name,
            &FieldManager::ClaimController.patch(),
            &Patch::Merge(&json!({ "spec": { "deadlineAt": null } })),
        )
        .await
        .during(|| format!("clearing the deadline of claim {name}"))?;
    Ok(())
}
