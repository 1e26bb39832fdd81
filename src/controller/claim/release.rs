//! How a claim lets go: a deleted or scaled-down claim keeps its finalizer until its machine is
//! observed off (the slot controller runs the shutdown); a terminal claim is collected after its
//! TTL; a claim whose slot is gone is released after a fresh read confirms the slot is gone.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch};
use kube::runtime::controller::Action;
use serde_json::json;

use super::chokepoint::{self, PhaseMove};
use super::{gate, has_finalizer, requeue_at};
use crate::api::{ANNOTATION_SUSPENDS, LABEL_NODECLAIM, Node, NodeClaim, NodeClaimPhase};
use crate::claim::{DEFAULT_CLAIM_TTL_SECONDS, FINALIZER};
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result, is_not_found};
use crate::controller::jobs::Lifecycle;
use crate::field_manager::FieldManager;
use crate::job_outcome::{JobOutcome, outcome};
use crate::machine;
use crate::phase::{self, Writer};

/// A belt for the wait on a shutdown: Job and node events normally wake the claim first.
const RELEASE_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// A failed claim that committed a boot, whose machine has not had its forced shutdown yet: an
/// overdue boot may still join the cluster, so it is powered off once whatever is observed.
pub fn awaits_forced_shutdown(claim: &NodeClaim) -> bool {
    let status = claim.status.as_ref();
    phase::of(claim) == NodeClaimPhase::Failed
        && status.is_some_and(|s| s.boot_committed_at.is_some())
        && status.and_then(|s| s.shutdown_attempts).unwrap_or(0) == 0
}

/// The slot's machine is released: not observed up, no shutdown Job running, and no forced
/// shutdown still owed.
pub fn machine_released(ctx: &Context, claim: &NodeClaim) -> bool {
    let slot_name = &claim.spec.slot_ref.name;
    let node_name = ctx
        .slot(slot_name)
        .map_or_else(|| slot_name.clone(), |s| s.spec.kubernetes_node_name.clone());
    let shutdown_running = ctx.shutdown_in_flight(slot_name);
    !machine::powered_on(ctx.core_node(&node_name).as_deref())
        && !shutdown_running
        && !awaits_forced_shutdown(claim)
}

/// The claim's shutdown Job that succeeded suspended the machine (a slot that sleeps when
/// idle) rather than powering it off.
fn put_to_sleep(ctx: &Context, claim: &NodeClaim) -> bool {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    ctx.lifecycle_jobs_of_slot(&claim.spec.slot_ref.name, Lifecycle::Shutdown).iter().any(|job| {
        let meta = &job.metadata;
        let serves = meta.labels.as_ref().and_then(|l| l.get(LABEL_NODECLAIM)).map(String::as_str);
        let suspends = meta.annotations.as_ref().and_then(|a| a.get(ANNOTATION_SUSPENDS));
        serves == Some(name)
            && suspends.is_some_and(|v| v == "true")
            && matches!(outcome(job), JobOutcome::Succeeded { .. })
    })
}

async fn remove_finalizer(ctx: &Context, claim: &NodeClaim) -> Result<()> {
    if !has_finalizer(claim) {
        return Ok(());
    }
    let name = claim.metadata.name.clone().unwrap_or_default();
    let kept: Vec<String> =
        claim.metadata.finalizers.iter().flatten().filter(|f| *f != FINALIZER).cloned().collect();
    let patch = json!({ "metadata": { "finalizers": kept, "resourceVersion": claim.metadata.resource_version } });
    Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch(&name, &FieldManager::ClaimController.patch(), &Patch::Merge(&patch))
        .await
        .during(|| format!("removing the finalizer of claim {name}"))?;
    tracing::info!(claim = %name, "finalizer released");
    Ok(())
}

/// Releases a claim whose slot is gone. `None` when the slot exists (the normal path runs).
pub async fn slot_gone(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Option<Action>> {
    let slot_name = &claim.spec.slot_ref.name;
    if ctx.slot(slot_name).is_some() {
        return Ok(None);
    }
    // Releasing a finalizer cannot be undone: a cached NotFound is not enough (the slot may be
    // recreated by a rollout, or the cache may lag), so ask the API server.
    match Api::<Node>::namespaced(ctx.client.clone(), &ctx.namespace).get(slot_name).await {
        Ok(_) => return Ok(Some(Action::requeue(std::time::Duration::from_secs(2)))),
        Err(error) if is_not_found(&error) => {}
        Err(error) => return Err(error).during(|| format!("reading slot {slot_name}")),
    }
    if phase::is_live(Some(phase::of(claim))) {
        let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ClaimController)
            .because("SlotDeleted", format!("slot {slot_name} was deleted"));
        chokepoint::move_phase(ctx, claim, fail).await?;
        return Ok(Some(Action::await_change()));
    }
    remove_finalizer(ctx, claim).await?;
    Ok(None)
}

/// A claim being deleted: a scale-down (the provider marked it first) or a person's delete.
pub async fn reconcile_deletion(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Action> {
    if !has_finalizer(claim) {
        return Ok(Action::await_change());
    }
    let marked_by = claim.status.as_ref().and_then(|s| s.scale_down_requested_at.as_ref());
    if marked_by.is_none() {
        // Nobody asked through the provider: a person deleted the claim.
        chokepoint::patch_status(
            ctx,
            claim,
            FieldManager::ClaimController,
            json!({ "scaleDownRequestedAt": Time(ctx.now()), "scaleDownRequestedBy": "DeletedByHand" }),
        )
        .await?;
        return Ok(Action::await_change());
    }
    match phase::of(claim) {
        // A pending claim has nothing in flight: its boot pass may have put the finalizer on,
        // but the startup Job is created only after the booting write, which the deletion
        // made lose (docs/decisions.md, D35).
        NodeClaimPhase::Pending => {
            remove_finalizer(ctx, claim).await?;
            Ok(Action::await_change())
        }
        // A committed boot is reversed, never interrupted: it runs to ready or failed first.
        NodeClaimPhase::Booting => gate::reconcile_booting(ctx, claim).await,
        NodeClaimPhase::Ready => {
            if !machine_released(ctx, claim) {
                return Ok(Action::requeue(RELEASE_RECHECK));
            }
            let by_hand = claim.status.as_ref().and_then(|s| s.scale_down_requested_by.as_deref())
                == Some("DeletedByHand");
            let state = if put_to_sleep(ctx, claim) { "asleep" } else { "off" };
            let (reason, message) = if by_hand {
                ("DeletedByHand", format!("the claim was deleted by hand; its machine is {state}"))
            } else {
                ("ScaledDown", format!("scaled down; the machine is {state}"))
            };
            let done = PhaseMove::new(NodeClaimPhase::Completed, Writer::ScaleDown)
                .because(reason, message);
            chokepoint::move_phase(ctx, claim, done).await?;
            Ok(Action::await_change())
        }
        NodeClaimPhase::Completed | NodeClaimPhase::Failed => {
            if machine_released(ctx, claim) {
                remove_finalizer(ctx, claim).await?;
                return Ok(Action::await_change());
            }
            Ok(Action::requeue(RELEASE_RECHECK))
        }
    }
}

/// A terminal claim: stamp its end if a writer forgot, release its finalizer once the machine is
/// off, and collect it after its TTL.
pub async fn reconcile_terminal(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Action> {
    let Some(finished) = claim.status.as_ref().and_then(|s| s.finished_at.as_ref()).map(|t| t.0)
    else {
        chokepoint::patch_status(
            ctx,
            claim,
            FieldManager::ClaimController,
            json!({ "finishedAt": Time(ctx.now()) }),
        )
        .await?;
        return Ok(Action::await_change());
    };
    if has_finalizer(claim) {
        if !machine_released(ctx, claim) {
            return Ok(Action::requeue(RELEASE_RECHECK));
        }
        remove_finalizer(ctx, claim).await?;
        return Ok(Action::await_change());
    }
    let ttl = claim.spec.ttl_seconds_after_finished.unwrap_or(DEFAULT_CLAIM_TTL_SECONDS).max(0);
    let expires = finished
        .checked_add(jiff::SignedDuration::from_secs(i64::from(ttl)))
        .unwrap_or(jiff::Timestamp::MAX);
    if ctx.now() < expires {
        return Ok(requeue_at(ctx, expires));
    }
    let name = claim.metadata.name.clone().unwrap_or_default();
    match Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .delete(&name, &DeleteParams::background())
        .await
    {
        Ok(_) => tracing::info!(claim = %name, "collected after its TTL"),
        Err(error) if is_not_found(&error) => {}
        Err(error) => return Err(error).during(|| format!("collecting claim {name}")),
    }
    Ok(Action::await_change())
}
