//! The slot controller: the machine side. It powers a machine off when no claim wants it
//! (`shutdown`), keeps the Kubernetes node tied to its slot (providerID, labels), and writes the
//! slot's observed status and derived report (`observe`).

mod drain;
mod observe;
mod shutdown;

use std::sync::Arc;

use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Context, Result};
use crate::api::{LABEL_SLOT, Node, NodeClaim};

/// Runs the slot controller until `shutdown`.
pub async fn controller(ctx: Arc<Context>, shutdown: CancellationToken) {
    let slots: Api<Node> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let claims: Api<NodeClaim> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let jobs =
        Api::<k8s_openapi::api::batch::v1::Job>::namespaced(ctx.client.clone(), &ctx.namespace);
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(ctx.client.clone());
    let namespace = ctx.namespace.clone();
    let ns_nodes = namespace.clone();
    let ns_jobs = namespace.clone();
    let managed = watcher::Config::default().labels(&format!(
        "{}={}",
        super::jobs::LABEL_MANAGED_BY.0,
        super::jobs::LABEL_MANAGED_BY.1
    ));
    let controller = Controller::new(slots, watcher::Config::default())
        .watches(claims, watcher::Config::default(), move |claim| {
            Some(ObjectRef::new(&claim.spec.slot_ref.name).within(&namespace))
        })
        // A slot is named after its node, so a node event names its slot (if it has one).
        .watches(nodes, watcher::Config::default(), move |node| {
            node.metadata.name.map(|name| ObjectRef::new(&name).within(&ns_nodes))
        })
        .watches(jobs, managed, move |job| {
            job.metadata
                .labels
                .and_then(|l| l.get(LABEL_SLOT).cloned())
                .map(|s| ObjectRef::new(&s).within(&ns_jobs))
        })
        .graceful_shutdown_on(async move { shutdown.cancelled().await });
    super::drive("slot", controller.run(reconcile, super::error_policy, ctx)).await;
}

async fn reconcile(slot: Arc<Node>, ctx: Arc<Context>) -> Result<Action> {
    let name = slot.metadata.name.clone().unwrap_or_default();
    async move {
        if slot.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let node = ctx.core_node(&slot.spec.kubernetes_node_name);
        if let Some(node) = &node {
            observe::tie_node_to_slot(&ctx, &slot, node).await?;
        }
        let action = shutdown::reconcile(&ctx, &slot, node.as_deref()).await?;
        observe::write_status(&ctx, &slot, node.as_deref()).await?;
        Ok(action)
    }
    .instrument(tracing::info_span!("reconcile_slot", slot = %name))
    .await
}
