//! booting → ready | failed: the startup Job's outcome, then the node's registration (90 s by
//! default) and the readiness gate (4 m from the node's appearance): Ready, free of the pool's
//! readiness taints and carrying everything its slot declares (the slot controller's write
//! landed), then uncordon, then `ready`. The deadline is cleared on the write after it.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::chokepoint::{self, PhaseMove};
use super::{boot, overdue, ready, requeue_at};
use crate::api::{Node, NodeClaim, NodeClaimPhase, TaintSelector};
use crate::clock::plus;
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result};
use crate::controller::jobs;
use crate::field_manager::FieldManager;
use crate::job_outcome::{JobOutcome, outcome};
use crate::machine;
use crate::phase::Writer;

/// What the startup Job's pod said when it failed (a power pod's error), if it said anything.
/// Best effort: a failed read leaves the message as it was.
async fn startup_failure_detail(ctx: &Context, job_name: &str) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let selector = format!("{}={job_name}", jobs::JOB_NAME_LABEL);
    match pods.list(&kube::api::ListParams::default().labels(&selector)).await {
        Ok(list) => jobs::failure_detail(&list.items),
        Err(error) => {
            tracing::debug!(%error, job = job_name, "reading the failed Job's pods");
            None
        }
    }
}

pub async fn reconcile_booting(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Action> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if overdue(ctx, claim) {
        let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ClaimController).because(
            "DeadlineExceeded",
            "the machine was not ready by the claim's deadline; powering it off",
        );
        chokepoint::move_phase(ctx, claim, fail).await?;
        return Ok(Action::await_change());
    }
    let deadline = claim.spec.deadline_at.as_ref().map(|d| d.0);
    let later = |at: Timestamp| requeue_at(ctx, deadline.map_or(at, |d| d.min(at)));
    let job_name = claim
        .status
        .as_ref()
        .and_then(|s| s.startup_job.clone())
        .unwrap_or_else(|| jobs::startup_job_name(&name));
    let Some(job) = ctx.job(&job_name) else {
        // Not cached yet, never created, or collected: the deadline bounds the wait.
        boot::resume(ctx, claim).await?;
        return Ok(deadline.map_or_else(Action::await_change, |d| requeue_at(ctx, d)));
    };
    let completed_at = match outcome(&job) {
        JobOutcome::Running => {
            return Ok(deadline.map_or_else(Action::await_change, |d| requeue_at(ctx, d)));
        }
        JobOutcome::Failed => {
            let detail = match startup_failure_detail(ctx, &job_name).await {
                Some(detail) => format!(": {detail}"),
                None => String::new(),
            };
            let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::Lifecycle).because(
                "StartupJobFailed",
                format!("startup Job {job_name} failed or timed out{detail}"),
            );
            chokepoint::move_phase(ctx, claim, fail).await?;
            return Ok(Action::await_change());
        }
        JobOutcome::Succeeded { at } => at.unwrap_or_else(|| ctx.now()),
    };

    let slot_name = &claim.spec.slot_ref.name;
    let Some(slot) = ctx.slot(slot_name) else {
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    };
    let gate = ctx
        .group_of(&slot)
        .map(|g| g.spec.node_readiness_taints.clone())
        .unwrap_or_else(crate::api::default_readiness_taints);
    let node_name = &slot.spec.kubernetes_node_name;
    let now = ctx.now();
    let Some(node) = ctx.core_node(node_name) else {
        let registration_end = plus(completed_at, ctx.timeouts.registration);
        if now >= registration_end {
            let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ReadinessGate).because(
                "NodeNotRegistered",
                format!("startup Job {job_name} completed but node {node_name} did not register within {}s", ctx.timeouts.registration.as_secs()),
            );
            chokepoint::move_phase(ctx, claim, fail).await?;
            return Ok(Action::await_change());
        }
        return Ok(later(registration_end));
    };

    let appeared =
        node.metadata.creation_timestamp.as_ref().map_or(completed_at, |t| t.0.max(completed_at));
    let gate_end = plus(appeared, ctx.timeouts.readiness_gate);
    if machine::gate_reading(&node, &slot, &gate).passes() {
        set_schedulable(ctx, node_name).await?;
        let ready = PhaseMove::new(NodeClaimPhase::Ready, Writer::ReadinessGate)
            .with("readyAt", json!(Time(now)));
        if chokepoint::move_phase(ctx, claim, ready).await? {
            let job_started = job.status.as_ref().and_then(|s| s.start_time.as_ref());
            let took = |from: Timestamp, to: Timestamp| to.duration_since(from).unsigned_abs();
            crate::telemetry::boot_stages(
                &claim.spec.request.group,
                job_started.map(|t| took(t.0, completed_at)),
                took(appeared, now),
            );
            ctx.publish(
                slot.as_ref(),
                EventType::Normal,
                "ScaleUpCompleted",
                format!("node {node_name} is ready for claim {name}"),
            )
            .await;
        }
        // The deadline leaves on the write after the ready one: a crash between the two leaves
        // an inert deadline on a ready claim, which its next pass clears (`ready.rs`).
        ready::clear_deadline(ctx, &name).await?;
        return Ok(Action::await_change());
    }
    if now >= gate_end {
        // A cordoned node is invisible to scale-down and paid for forever: uncordon on the way out.
        set_schedulable(ctx, node_name).await?;
        let why = gate_timeout_reason(&node, &slot, &gate);
        let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ReadinessGate).because(
            "ReadinessGateTimeout",
            format!("{why} after {}s; powering it off", ctx.timeouts.readiness_gate.as_secs()),
        );
        if chokepoint::move_phase(ctx, claim, fail).await? {
            ctx.publish(
                slot.as_ref(),
                EventType::Warning,
                "ReadinessGateTimeout",
                format!("claim {name}: {why}"),
            )
            .await;
        }
        return Ok(Action::await_change());
    }
    Ok(later(gate_end))
}

/// Why a node did not pass the gate in time, naming what it still lacks.
fn gate_timeout_reason(node: &CoreNode, slot: &Node, gate: &[TaintSelector]) -> String {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let pending = machine::pending_readiness_taints(node, gate);
    if !machine::is_ready(node) {
        format!("node {node_name} never became Ready")
    } else if !pending.is_empty() {
        format!("node {node_name} still carries readiness taints [{}]", pending.join(", "))
    } else {
        let missing = machine::undeclared(node, slot).join(", ");
        format!(
            "node {node_name} still lacks what slot {} declares [{missing}] (can the operator patch nodes?)",
            slot.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

/// Uncordons a node (the gate is the writer that lifts the cordon).
pub async fn set_schedulable(ctx: &Context, node_name: &str) -> Result<()> {
    let cordoned = ctx.core_node(node_name).is_some_and(|n| machine::is_cordoned(&n));
    if !cordoned {
        return Ok(());
    }
    Api::<CoreNode>::all(ctx.client.clone())
        .patch(
            node_name,
            &FieldManager::ClaimController.patch(),
            &Patch::Merge(&json!({ "spec": { "unschedulable": false } })),
        )
        .await
        .during(|| format!("uncordoning node {node_name}"))?;
    Ok(())
}
