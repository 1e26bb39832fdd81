//! What the slot side writes of what it observes: the node's declared labels and taints
//! (`write_node`), and the slot's status, gathered as facts for [`status_plan::plan`] and
//! written only when it changes.

use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, Patch};

use super::status_plan::{self, Seen, StatusFacts};
use crate::api::{Node, NodeClaim, NodeStatus};
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result, is_stale_write};
use crate::field_manager::{FieldManager, apply_status_of};
use crate::phase;

/// How many times one pass computes and sends the node write before it leaves the rest to the
/// controller's error backoff.
const NODE_WRITE_ATTEMPTS: u32 = 5;

/// Writes what the slot side wants of its node (`want` computes the guarded merge patch from a
/// node, see `crate::node_declaration`). A fresh node changes several times a second while it registers (the
/// kubelet's status, kube-controller-manager, a CNI), and the claim's readiness gate waits for
/// this write, so a write that lost to one of them is computed again at once on the node read
/// from the API server (the cache may not have seen the change yet), up to
/// [`NODE_WRITE_ATTEMPTS`] times. Returns whether anything was written.
pub async fn write_node(
    ctx: &Context,
    node: &CoreNode,
    want: impl Fn(&CoreNode) -> Option<serde_json::Value>,
) -> Result<bool> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let nodes = Api::<CoreNode>::all(ctx.client.clone());
    let mut current = std::borrow::Cow::Borrowed(node);
    let mut attempt = 1;
    loop {
        let Some(patch) = want(&current) else { return Ok(attempt > 1) };
        let written = nodes
            .patch(&node_name, &FieldManager::SlotController.patch(), &Patch::Merge(&patch))
            .await;
        match written {
            Ok(_) => return Ok(true),
            Err(error) if is_stale_write(&error) && attempt < NODE_WRITE_ATTEMPTS => {
                tracing::info!(
                    node = node_name,
                    attempt,
                    "node changed under its write; writing again on a fresh read"
                );
                let fresh = nodes.get(&node_name).await;
                current = std::borrow::Cow::Owned(
                    fresh.during(|| format!("reading node {node_name} again for its slot"))?,
                );
                attempt += 1;
            }
            Err(error) => {
                return Err(error).during(|| format!("updating node {node_name} for its slot"));
            }
        }
    }
}

/// Writes the slot's status when [`status_plan::plan`] changed it, and publishes the events it
/// calls for; `claims` are the slot's as the pass read them, `live` the live one among them.
pub async fn write_status(
    ctx: &Context,
    slot: &Node,
    node: Option<&CoreNode>,
    claims: &[&NodeClaim],
    live: Option<&NodeClaim>,
    seen: Seen<'_>,
) -> Result<()> {
    let slot_name = slot.metadata.name.clone().unwrap_or_default();
    let gate = ctx.group_of(slot).map(|g| g.spec.node_readiness_taints.clone()).unwrap_or_default();
    let published = ctx.published_hold(&slot_name);
    let published_gate = ctx.published_gate_hold(&slot_name);
    let held_for = ctx.gate_held_for(&slot_name, seen.gate_hold.is_some());
    crate::telemetry::slot_power_off_held(
        slot.group().unwrap_or_default(),
        &slot_name,
        held_for.as_secs_f64(),
    );
    let plan = status_plan::plan(&StatusFacts {
        slot,
        node,
        live,
        newest_claim: phase::newest(claims.iter().copied()),
        gate: &gate,
        shutdown_in_flight: ctx.shutdown_in_flight(&slot_name),
        seen,
        meter_reading_max_age: ctx.meter_reading_max_age(),
        published_hold: published.as_ref(),
        published_gate_hold: published_gate.as_ref(),
        now: ctx.now(),
    });
    for event in plan.events {
        ctx.publish(slot, event.kind, event.reason, event.message).await;
    }
    if let Some(hold) = plan.publish_hold {
        ctx.set_published_hold(&slot_name, hold);
    }
    if let Some(hold) = plan.publish_gate_hold {
        ctx.set_published_gate_hold(&slot_name, hold);
    }
    let Some(status) = plan.status else { return Ok(()) };
    let mine = slot.status.clone().map(|s| NodeStatus {
        local_volumes: Vec::new(),
        waiting_pods: Vec::new(),
        ..s
    });
    let serialize = |status: Option<&NodeStatus>| {
        serde_json::to_value(status)
            .map_err(|source| crate::controller::Error::Serialize { what: "a slot status", source })
    };
    let (previous, status) = (serialize(mine.as_ref())?, serialize(Some(&status))?);
    let slots = Api::<Node>::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_status_of(&slots, &slot_name, FieldManager::SlotController, Some(&previous), status)
        .await
        .during(|| format!("writing the status of slot {slot_name}"))?;
    Ok(())
}
