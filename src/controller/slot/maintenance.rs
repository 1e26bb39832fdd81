//! The pool's maintenance steps around a machine's power-off (`spec.maintenance`, D40): a Job
//! before the cordon, which the power-off waits for, and a Job once the machine is back and
//! Ready, or wanted again before it went. The succeeded step before a power-off is kept (no
//! TTL) as the record that its step after is due, and deleted once that one has succeeded.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::EventType;

use super::power_off_gates::{CONDITION_REASON_STEP, GateHold, hold_since};
use crate::api::{LifecyclePodSpec, Node};
use crate::controller::Context;
use crate::controller::error::{Error, KubeContext, Result, is_not_found};
use crate::controller::jobs::{self, JobContext, Lifecycle};
use crate::field_manager::FieldManager;
use crate::job_outcome::{JobOutcome, outcome};
use crate::machine;

/// How often a running step is looked at again.
const RECHECK: Duration = Duration::from_secs(5);

/// Whether the step before a power-off has started this time up: the power-off is committed,
/// and the gates were read before it (a step may itself turn them: Ceph reports `noout` as a
/// warning).
pub fn under_way(ctx: &Context, slot: &Node, node: Option<&CoreNode>) -> bool {
    let name = slot.metadata.name.as_deref().unwrap_or_default();
    this_time_up(ctx, name, node).is_some()
}

/// The slot's newest step before a power-off made since the machine last came up.
fn this_time_up(ctx: &Context, slot: &str, node: Option<&CoreNode>) -> Option<std::sync::Arc<Job>> {
    let up_since = machine::ready_since(node);
    newest(ctx, slot, Lifecycle::BeforePowerOff)
        .filter(|j| up_since.is_none_or(|since| created(j).is_some_and(|c| c >= since)))
}

/// What the step before a power-off says: `None`, it succeeded for this time up (or the pool
/// has none) and the power-off may go on; else the hold it keeps the machine on with.
pub async fn before_power_off(
    ctx: &Context,
    slot: &Node,
    node: Option<&CoreNode>,
) -> Result<Option<GateHold>> {
    let Some(group) = slot.group().and_then(|g| ctx.stores.group(g)) else { return Ok(None) };
    let Some(step) = group.spec.maintenance.as_ref().and_then(|m| m.before_power_off.as_ref())
    else {
        return Ok(None);
    };
    let name = slot.metadata.name.as_deref().unwrap_or_default();
    let now = ctx.now();
    let current = this_time_up(ctx, name, node);
    // A step just made runs, as one found running does.
    let (job_name, ran) = match current {
        Some(job) => (job.metadata.name.clone().unwrap_or_default(), outcome(&job)),
        None => {
            let job_name = jobs::bounded_name(&format!("{name}-before-off-{}", now.as_second()));
            start(ctx, slot, Lifecycle::BeforePowerOff, &job_name, step).await?;
            (job_name, JobOutcome::Running)
        }
    };
    let message = match ran {
        JobOutcome::Succeeded { .. } => return Ok(None),
        JobOutcome::Running => format!(
            "held on, serving: the pool's maintenance step before a power-off runs first (Job {job_name})"
        ),
        JobOutcome::Failed => format!(
            "held on, serving: the pool's maintenance step before a power-off failed (Job {job_name}); see kubectl logs -n {} job/{job_name}, and delete the Job to run the step again",
            ctx.namespace
        ),
    };
    Ok(Some(GateHold {
        since: hold_since(ctx, slot, CONDITION_REASON_STEP, now),
        held_by: format!("step {job_name}"),
        reason: CONDITION_REASON_STEP,
        message,
        retry: RECHECK,
    }))
}

/// Runs the step after, for each step before a power-off that succeeded, once the machine is
/// Ready and either came up since that step or is `wanted` again (a claim that is not being
/// released); removes the record of each once its step after succeeded.
pub async fn after_ready(
    ctx: &Context,
    slot: &Node,
    node: Option<&CoreNode>,
    wanted: bool,
) -> Result<()> {
    let name = slot.metadata.name.as_deref().unwrap_or_default();
    let Some(ready_since) = machine::ready_since(node) else { return Ok(()) };
    let befores: Vec<_> = ctx
        .lifecycle_jobs_of_slot(name, Lifecycle::BeforePowerOff)
        .into_iter()
        .filter(|j| matches!(outcome(j), JobOutcome::Succeeded { .. }))
        .filter(|j| wanted || created(j).is_some_and(|c| c < ready_since))
        .collect();
    if befores.is_empty() {
        return Ok(());
    }
    let step = slot
        .group()
        .and_then(|g| ctx.stores.group(g))
        .and_then(|g| g.spec.maintenance.clone())
        .and_then(|m| m.after_ready);
    for before in befores {
        let before_name = before.metadata.name.clone().unwrap_or_default();
        let done = match &step {
            None => true,
            Some(step) => {
                let job_name = jobs::bounded_name(&format!("{before_name}-after"));
                match ctx.job(&job_name).as_deref().map(outcome) {
                    Some(JobOutcome::Succeeded { .. }) => true,
                    Some(JobOutcome::Running) => false,
                    Some(JobOutcome::Failed) => {
                        let message = format!(
                            "the pool's maintenance step after the machine came back failed (Job {job_name}); see kubectl logs -n {} job/{job_name}, and delete Job {job_name} to run it again",
                            ctx.namespace
                        );
                        ctx.publish(slot, EventType::Warning, "MaintenanceStepFailed", message)
                            .await;
                        false
                    }
                    None => {
                        start(ctx, slot, Lifecycle::AfterReady, &job_name, step).await?;
                        false
                    }
                }
            }
        };
        if done {
            delete(ctx, &before_name).await?;
        }
    }
    Ok(())
}

/// Makes the Job of a maintenance step (nothing when it exists already).
async fn start(
    ctx: &Context,
    slot: &Node,
    lifecycle: Lifecycle,
    name: &str,
    step: &LifecyclePodSpec,
) -> Result<()> {
    let job = jobs::build(&JobContext {
        slot,
        group: slot.group().unwrap_or_default(),
        claim: None,
        lifecycle,
        name: name.to_owned(),
        max_run_time: ctx.timeouts.job_timeout,
        power_image: &ctx.power_image,
        priority_class: ctx.power_priority_class.as_deref(),
        step: Some(step),
        suspend: false,
        wake_first: false,
    })
    .map_err(|e| Error::Lifecycle(e.to_string()))?;
    if ctx.create_job(&job, FieldManager::SlotController).await? {
        tracing::info!(job = %name, step = lifecycle.as_str(), "maintenance step started");
    }
    Ok(())
}

/// The slot's newest Job of a maintenance step.
fn newest(ctx: &Context, slot: &str, lifecycle: Lifecycle) -> Option<std::sync::Arc<Job>> {
    ctx.lifecycle_jobs_of_slot(slot, lifecycle).into_iter().max_by_key(|j| created(j))
}

fn created(job: &Job) -> Option<Timestamp> {
    job.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

async fn delete(ctx: &Context, name: &str) -> Result<()> {
    let params = DeleteParams::background();
    match Api::<Job>::namespaced(ctx.client.clone(), &ctx.namespace).delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(error) if is_not_found(&error) => Ok(()),
        Err(error) => Err(error).during(|| format!("deleting Job {name}")),
    }
}
