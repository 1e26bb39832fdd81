//! pending → booting: the boot is committed. Before it, the newest of two live claims on one slot
//! steps aside (read from the API, no older than what this process has seen or written); then
//! the finalizer lands on a metadata write, the status write records the attempt, and only then
//! is the startup Job created (docs/decisions.md, D35).

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::chokepoint::{self, PhaseMove};
use super::{has_finalizer, overdue, requeue_at};
use crate::api::{Node, NodeClaim, NodeClaimPhase};
use crate::claim::{FINALIZER, MAX_CONSECUTIVE_ATTEMPTS};
use crate::controller::Context;
use crate::controller::error::{Error, KubeContext, Result};
use crate::controller::jobs::{self, JobContext, Lifecycle};
use crate::field_manager::FieldManager;
use crate::phase::{self, Writer};

/// How often a pending claim looks again while its slot's shutdown Job runs (that Job belongs to
/// an earlier claim, so its end wakes that one, not this).
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn reconcile_pending(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Action> {
    if overdue(ctx, claim) {
        let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ClaimController)
            .because("DeadlineExceeded", "the claim was still pending at its deadline");
        chokepoint::move_phase(ctx, claim, fail).await?;
        return Ok(Action::await_change());
    }
    if claim.status.as_ref().is_some_and(|s| s.scale_down_requested_at.is_some()) {
        let by = claim
            .status
            .as_ref()
            .and_then(|s| s.scale_down_requested_by.clone())
            .unwrap_or_default();
        let cancel = PhaseMove::new(NodeClaimPhase::Completed, Writer::ScaleDown).because(
            "CancelledByScaleDown",
            format!("the scale-down ({by}) came before the boot started"),
        );
        chokepoint::move_phase(ctx, claim, cancel).await?;
        return Ok(Action::await_change());
    }
    // A shutdown still in flight may land after this boot's power-on (an SSH shutdown retries
    // until the machine answers, and a machine that is woken answers): the boot waits for it to
    // end. Its Job is bounded by the startup Job timeout, inside this claim's deadline check above.
    if ctx.shutdown_in_flight(&claim.spec.slot_ref.name) {
        tracing::info!(slot = %claim.spec.slot_ref.name, "waiting for the slot's shutdown Job to end before booting");
        return Ok(Action::requeue(SHUTDOWN_WAIT));
    }
    // From the check to the booting write, no other claim of this slot may pass the check.
    let _boot_lock = ctx.lock_slot_for_boot(&claim.spec.slot_ref.name).await;
    if let Some(older) = older_live_claim(ctx, claim).await? {
        let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ClaimController).because(
            "Superseded",
            format!(
                "slot {} already has live claim {older}; one live claim per slot",
                claim.spec.slot_ref.name
            ),
        );
        chokepoint::move_phase(ctx, claim, fail).await?;
        return Ok(Action::await_change());
    }
    let attempt = claim.spec.attempt.unwrap_or(1);
    if attempt > MAX_CONSECUTIVE_ATTEMPTS {
        let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ClaimController).because(
            "AttemptLimitReached",
            format!("attempt {attempt} is past the bound of {MAX_CONSECUTIVE_ATTEMPTS} failed boots in a row"),
        );
        chokepoint::move_phase(ctx, claim, fail).await?;
        return Ok(Action::await_change());
    }
    let Some(slot) = ctx.slot(&claim.spec.slot_ref.name) else {
        // Not in the cache yet; `release::slot_gone` already ruled out a deleted slot.
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    };

    // The finalizer lands before the booting write: a manager that dies between the two leaves
    // a committed boot that still carries its deadline.
    let name = claim.metadata.name.clone().unwrap_or_default();
    let claims: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let claim = if has_finalizer(claim) {
        claim.clone()
    } else {
        let mut finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
        finalizers.push(FINALIZER.into());
        let patch = json!({ "metadata": { "finalizers": finalizers, "resourceVersion": claim.metadata.resource_version } });
        let written = claims
            .patch(&name, &FieldManager::ClaimController.patch(), &Patch::Merge(&patch))
            .await
            .during(|| format!("adding the finalizer to claim {name}"))?;
        ctx.claim_read_floor.wrote(written.metadata.resource_version.as_deref());
        written
    };

    // Built before the commit, so a slot that cannot power its machine fails the pass with no
    // attempt spent.
    let job = startup_job(ctx, &slot, &claim)?;
    let job_name = job.metadata.name.clone().unwrap_or_default();
    // Nothing that starts the machine exists before the booting write commits: a cancel (the
    // claim deleted) that lands first makes this write lose with a 409, and the claim is
    // released with no Job (docs/decisions.md, D35).
    ctx.boot_hold.pass(&name).await;
    let boot = PhaseMove::new(NodeClaimPhase::Booting, Writer::Lifecycle)
        .with("attempt", json!(attempt))
        .with("bootCommittedAt", json!(Time(ctx.now())))
        .with("startupJob", json!(job_name));
    let moved = chokepoint::move_phase(ctx, &claim, boot).await?;
    start(ctx, &slot, &job).await?;
    if moved {
        ctx.publish(
            slot.as_ref(),
            EventType::Normal,
            "ScaleUpRequested",
            format!("claim {name} (attempt {attempt}) started startup Job {job_name}"),
        )
        .await;
    }
    Ok(claim.spec.deadline_at.as_ref().map_or_else(Action::await_change, |d| requeue_at(ctx, d.0)))
}

/// The startup Job of `claim` on `slot`.
fn startup_job(ctx: &Context, slot: &Node, claim: &NodeClaim) -> Result<Job> {
    jobs::build(&JobContext {
        slot,
        group: &claim.spec.request.group,
        claim: Some(claim),
        lifecycle: Lifecycle::Startup,
        name: jobs::startup_job_name(claim.metadata.name.as_deref().unwrap_or_default()),
        max_run_time: ctx.timeouts.job_timeout,
        power_image: &ctx.power_image,
        priority_class: ctx.power_priority_class.as_deref(),
        step: None,
        suspend: false,
        wake_first: false,
    })
    .map_err(|e| Error::Lifecycle(e.to_string()))
}

/// Starts a committed boot: the startup Job (created once: its name is the claim's), and the
/// machine's node freed of cluster-autoscaler's deletion taint. Returns whether this call
/// created the Job.
async fn start(ctx: &Context, slot: &Node, job: &Job) -> Result<bool> {
    let created = ctx.create_job(job, FieldManager::ClaimController).await?;
    ctx.clear_to_be_deleted_taint(&slot.spec.kubernetes_node_name, FieldManager::ClaimController)
        .await?;
    Ok(created)
}

/// How far the operator's clock may run behind the one that collects finished Jobs.
const CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(60);

/// Starts the boot of a booting claim whose startup Job is not in the cache: its boot pass
/// stopped between the booting write and the create (an API error, a crash). A Job finishes
/// after its create, itself after the commit, so until the Job's TTL has run from the commit
/// it cannot have been collected: a missing one was never created (or the cache is behind, and
/// the create finds it). Past that, a Job that ran is never created again.
pub(super) async fn resume(ctx: &Context, claim: &NodeClaim) -> Result<()> {
    let status = claim.status.as_ref();
    let Some(committed) = status.and_then(|s| s.boot_committed_at.as_ref()).map(|t| t.0) else {
        return Ok(());
    };
    let Some(slot) = ctx.slot(&claim.spec.slot_ref.name) else { return Ok(()) };
    let job = startup_job(ctx, &slot, claim)?;
    let ttl = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished).unwrap_or(0);
    let collectable = std::time::Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
    let Some(window) = collectable.checked_sub(CLOCK_SKEW) else { return Ok(()) };
    let since = ctx.now().duration_since(committed).unsigned_abs();
    if since >= window {
        return Ok(());
    }
    if start(ctx, &slot, &job).await? {
        tracing::info!(job = ?job.metadata.name, "created the startup Job of a committed boot");
    }
    Ok(())
}

/// The name of a live claim on the same slot that `claim` must give way to, read from the API:
/// one that has committed its boot (booting or ready), or a pending one that is older. The
/// first rule holds even when creation times tie at one-second resolution.
///
/// The list is served from the apiserver's watch cache, no older than this claim, the slot's
/// claims as this process's cache holds them, and every claim write of this term (a consistent
/// read waits for etcd's progress notification, most of a boot's start; see `read_floor`).
/// A claim admitted while an older one was live may still see that one live after it has
/// ended, and gives way: the two were live together, and the rule keeps the older.
async fn older_live_claim(ctx: &Context, claim: &NodeClaim) -> Result<Option<String>> {
    let slot = &claim.spec.slot_ref.name;
    let cached = ctx.claims_of_slot(slot);
    let params = ctx.claim_read_floor.list_params(
        claim.metadata.resource_version.as_deref(),
        cached.iter().map(|c| c.metadata.resource_version.as_deref()),
    );
    let list = Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .list(&params.fields(&format!("spec.slotRef.name={slot}")))
        .await
        .during(|| format!("listing the claims of slot {slot}"))?;
    let key = |c: &NodeClaim| {
        (c.metadata.creation_timestamp.as_ref().map(|t| t.0), c.metadata.name.clone())
    };
    Ok(list
        .items
        .iter()
        .filter(|c| c.metadata.uid != claim.metadata.uid)
        .filter(|c| phase::is_live(Some(phase::of(c))) && c.metadata.deletion_timestamp.is_none())
        .filter(|c| phase::of(c) != NodeClaimPhase::Pending || key(c) < key(claim))
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .next())
}
