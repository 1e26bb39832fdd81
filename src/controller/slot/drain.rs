//! Cordon and drain through the Eviction API, honouring PodDisruptionBudgets for a bounded
//! time. DaemonSet and mirror pods stay (they die with the machine).

use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch};
use serde_json::json;

use crate::controller::Context;
use crate::controller::error::{KubeContext, Result, is_not_found};
use crate::field_manager::FieldManager;
use crate::machine;

/// How long one eviction may take before it counts as refused.
const EVICTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How a drain pass ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drained {
    /// Nothing evictable is left on the node.
    Empty,
    /// A PodDisruptionBudget refused an eviction (HTTP 429); try again soon.
    Blocked { pods: usize },
}

/// Marks the node unschedulable.
pub async fn cordon(ctx: &Context, node: &CoreNode) -> Result<()> {
    if machine::is_cordoned(node) {
        return Ok(());
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    Api::<CoreNode>::all(ctx.client.clone())
        .patch(
            &name,
            &FieldManager::SlotController.patch(),
            &Patch::Merge(&json!({ "spec": { "unschedulable": true } })),
        )
        .await
        .during(|| format!("cordoning node {name}"))?;
    Ok(())
}

fn evictable(pod: &Pod) -> bool {
    let owned_by_daemonset =
        pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet");
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !owned_by_daemonset && !mirror && !finished && pod.metadata.deletion_timestamp.is_none()
}

/// Evicts every evictable pod on the node once.
pub async fn evict_all(ctx: &Context, node_name: &str) -> Result<Drained> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await
        .during(|| format!("listing the pods on node {node_name}"))?;
    let mut blocked = 0;
    for pod in list.items.iter().filter(|p| evictable(p)) {
        let (Some(name), Some(ns)) =
            (pod.metadata.name.as_deref(), pod.metadata.namespace.as_deref())
        else {
            continue;
        };
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        // A PodDisruptionBudget refuses with 429, which the client itself retries with backoff
        // rather than returning: an eviction that has not answered in time counts as refused,
        // so the drain's own timeout stays the bound and the slot's reconcile is never held.
        let evicted =
            tokio::time::timeout(EVICTION_TIMEOUT, pods.evict(name, &EvictParams::default())).await;
        match evicted {
            Ok(Ok(_)) => {}
            // A PodDisruptionBudget refuses with 429 TooManyRequests.
            Ok(Err(kube::Error::Api(status))) if status.code == 429 => blocked += 1,
            Ok(Err(error)) if is_not_found(&error) => {}
            Ok(Err(error)) => return Err(error).during(|| format!("evicting pod {ns}/{name}")),
            Err(_) => {
                tracing::info!(pod = name, namespace = ns, "eviction did not answer in time");
                blocked += 1;
            }
        }
    }
    Ok(if blocked == 0 { Drained::Empty } else { Drained::Blocked { pods: blocked } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn daemonset_mirror_and_finished_pods_stay() {
        let mut pod = Pod::default();
        assert!(evictable(&pod));
        pod.metadata.owner_references =
            Some(vec![OwnerReference { kind: "DaemonSet".into(), ..OwnerReference::default() }]);
        assert!(!evictable(&pod));
        let mut mirror = Pod::default();
        mirror.metadata.annotations =
            Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
        assert!(!evictable(&mirror));
        let done = Pod {
            status: Some(k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Succeeded".into()),
                ..Default::default()
            }),
            ..Pod::default()
        };
        assert!(!evictable(&done));
    }
}
