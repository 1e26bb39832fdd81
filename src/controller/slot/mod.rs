//! The slot controller: the machine side. It powers a machine off when no claim wants it
//! (`shutdown`), keeps the Kubernetes node tied to its slot (providerID, labels), marks the node
//! for cluster-autoscaler while it boots or a person holds it (`autoscaler_marks`), and writes
//! the slot's observed status and derived report (`observe`).

mod autoscaler_marks;
mod drain;
mod observe;
mod shutdown;

use std::sync::Arc;

use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Context, Result, SlotInputs};
use crate::api::{LABEL_SLOT, Node};

/// Runs the slot controller until `shutdown`.
pub async fn controller(ctx: Arc<Context>, inputs: SlotInputs, shutdown: CancellationToken) {
    let ns_claims = ctx.namespace.clone();
    let ns_nodes = ctx.namespace.clone();
    let ns_jobs = ctx.namespace.clone();
    let controller = Controller::for_shared_stream(inputs.slots, ctx.stores.slots.clone())
        .watches_shared_stream(inputs.claims, move |claim| {
            Some(ObjectRef::new(&claim.spec.slot_ref.name).within(&ns_claims))
        })
        // A slot is named after its node, so a node event names its slot (if it has one).
        .watches_shared_stream(inputs.nodes, move |node| {
            node.metadata.name.as_ref().map(|name| ObjectRef::new(name).within(&ns_nodes))
        })
        .watches_shared_stream(inputs.jobs, move |job| {
            job.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SLOT))
                .map(|s| ObjectRef::new(s).within(&ns_jobs))
        })
        .with_config(super::config())
        .graceful_shutdown_on(async move { shutdown.cancelled().await });
    let reconcile = |object, ctx| crate::telemetry::reconcile("slot", reconcile(object, ctx));
    super::drive("slot", controller.run(reconcile, super::error_policy, ctx)).await;
}

async fn reconcile(slot: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    let name = slot.metadata.name.clone().unwrap_or_default();
    let group = slot.metadata.labels.as_ref().and_then(|l| l.get(crate::api::GROUP_LABEL));
    let span = tracing::info_span!("reconcile_slot", slot = %name, group = group.map_or("", String::as_str));
    async move {
        if slot.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let node = ctx.core_node(&slot.spec.kubernetes_node_name);
        let live = observe::live_claim(&ctx, &name);
        if let Some(node) = &node {
            // One write for everything the slot side wants of the node.
            let mut patch = observe::identity_patch(&slot, node);
            let marks = autoscaler_marks::wanted(live.as_deref());
            let remarked = match autoscaler_marks::patch(node, &marks) {
                Some(serde_json::Value::Object(more)) => {
                    observe::extend_patch(&mut patch, more);
                    true
                }
                _ => false,
            };
            observe::write_node(&ctx, node, patch).await?;
            if remarked {
                tracing::info!(startup_taint = marks.startup_taint, protected_for = ?marks.protected_for, "cluster-autoscaler marks updated");
            }
        }
        let action = shutdown::reconcile(&ctx, &slot, node.as_deref()).await?;
        observe::write_status(&ctx, &slot, node.as_deref(), live.as_deref()).await?;
        Ok(action)
    }
    .instrument(span)
    .await
}
