//! The claim controller: moves claims through their phases (docs/architecture.md). In code:
//! boot (`boot`), the Job outcome and readiness gate (`gate`), the machine-gone bound of a ready
//! claim (`ready`), a pin's end (`expiry`), and release, collection and finalizers (`release`).
//! Every phase write goes through `chokepoint`.

mod boot;
pub mod chokepoint;
pub mod expiry;
mod gate;
mod ready;
pub(crate) mod release;

use std::sync::Arc;

use std::time::Duration;

use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{ClaimInputs, Context, Result};
use crate::api::{NodeClaim, NodeClaimPhase};
use crate::claim::FINALIZER;
use crate::phase;

/// Runs the claim controller until `shutdown`.
pub async fn controller(ctx: Arc<Context>, inputs: ClaimInputs, shutdown: CancellationToken) {
    let by_node = ctx.clone();
    let by_slot = ctx.clone();
    let controller = Controller::for_shared_stream(inputs.claims, ctx.stores.claims.clone())
        .owns_shared_stream(inputs.jobs)
        // A machine's node changing wakes the claims of its slot (the gate, machine gone).
        .watches_shared_stream(inputs.nodes, move |node| {
            let slots = node.metadata.name.as_deref().map(|n| by_node.stores.slots_of_node(n));
            let slots = slots.into_iter().flatten();
            slots
                .flat_map(|slot| claims_of(&by_node, slot.metadata.name.as_deref()))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(inputs.slots, move |slot| {
            claims_of(&by_slot, slot.metadata.name.as_deref())
        })
        .with_config(super::config())
        .graceful_shutdown_on(async move { shutdown.cancelled().await });
    let reconcile = |object, ctx| crate::telemetry::reconcile("claim", reconcile(object, ctx));
    super::drive("claim", controller.run(reconcile, super::error_policy, ctx)).await;
}

fn claims_of(ctx: &Context, slot: Option<&str>) -> Vec<ObjectRef<NodeClaim>> {
    let Some(slot) = slot else { return Vec::new() };
    ctx.claims_of_slot(slot).iter().map(|c| ObjectRef::from_obj(c.as_ref())).collect()
}

/// When to look again if nothing happens: at `at`, but at least a second from now.
fn requeue_at(ctx: &Context, at: jiff::Timestamp) -> Action {
    let wait = at.duration_since(ctx.now()).as_secs_f64().max(1.0);
    Action::requeue(Duration::from_secs_f64(wait.min(3600.0)))
}

fn has_finalizer(claim: &NodeClaim) -> bool {
    claim.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// Whether the claim's boot window has run past its deadline.
fn overdue(ctx: &Context, claim: &NodeClaim) -> bool {
    phase::in_boot_window(Some(phase::of(claim)))
        && claim.spec.deadline_at.as_ref().is_some_and(|d| d.0 <= ctx.now())
}

async fn reconcile(claim: Arc<NodeClaim>, ctx: Arc<Context>) -> Result<Action> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let span = tracing::info_span!(
        "reconcile_claim",
        claim = %name,
        slot = %claim.spec.slot_ref.name,
        group = %claim.spec.request.group,
        phase = ?phase::of(&claim)
    );
    async move {
        let claim = claim.as_ref();
        if claim.metadata.deletion_timestamp.is_none()
            && claim.status.as_ref().and_then(|s| s.phase).is_none()
        {
            // The first sight of a claim: record pending so `kubectl get` shows it, and publish
            // ClaimCreated. The write wakes the next pass.
            let pending =
                chokepoint::PhaseMove::new(NodeClaimPhase::Pending, phase::Writer::ClaimController);
            chokepoint::move_phase(&ctx, claim, pending).await?;
            return Ok(Action::await_change());
        }
        if let Some(action) = release::slot_gone(&ctx, claim).await? {
            return Ok(action);
        }
        if claim.metadata.deletion_timestamp.is_some() {
            return release::reconcile_deletion(&ctx, claim).await;
        }
        if let Some(action) = expiry::reconcile(&ctx, claim).await? {
            return Ok(action);
        }
        match phase::of(claim) {
            NodeClaimPhase::Pending => boot::reconcile_pending(&ctx, claim).await,
            NodeClaimPhase::Booting => gate::reconcile_booting(&ctx, claim).await,
            NodeClaimPhase::Ready => ready::reconcile_ready(&ctx, claim).await,
            NodeClaimPhase::Completed | NodeClaimPhase::Failed => {
                release::reconcile_terminal(&ctx, claim).await
            }
        }
    }
    .instrument(span)
    .await
}
