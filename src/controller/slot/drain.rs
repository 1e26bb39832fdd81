//! Cordon and drain through the Eviction API, honouring PodDisruptionBudgets: a refused eviction
//! holds the machine on, and the budgets that refused it are named (decisions.md, D30).
//! DaemonSet and mirror pods stay (they die with the machine).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams, Patch};
use kube::core::{Selector, SelectorExt};
use serde_json::json;

use crate::controller::Context;
use crate::controller::error::{KubeContext, Result, is_not_found};
use crate::field_manager::FieldManager;
use crate::machine;

/// How long one eviction may take before it counts as refused.
const EVICTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How a drain pass ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drained {
    /// Nothing evictable is left on the node.
    Empty,
    /// A PodDisruptionBudget refused these pods' evictions (HTTP 429); try again soon.
    Blocked(Vec<HeldPod>),
}

/// A pod whose eviction was refused, and the PodDisruptionBudgets of its namespace that select it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPod {
    pub namespace: String,
    pub name: String,
    pub budgets: Vec<String>,
}

/// A drain held back by disruption budgets: which pods, and when the machine is powered off
/// anyway (`--drain-timeout`; never when it is not set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainHold {
    pub pods: Vec<HeldPod>,
    pub force_at: Option<Timestamp>,
}

impl DrainHold {
    /// What holds the machine and what a person can do about it. Pure.
    pub fn message(&self) -> String {
        let held: Vec<String> = self
            .pods
            .iter()
            .map(|p| {
                let by = match p.budgets.as_slice() {
                    [] => "a PodDisruptionBudget".to_string(),
                    [one] => format!("PodDisruptionBudget {}/{one}", p.namespace),
                    many => format!("PodDisruptionBudgets {}/{{{}}}", p.namespace, many.join(",")),
                };
                format!("pod {}/{} (refused by {by})", p.namespace, p.name)
            })
            .collect();
        let end = match self.force_at {
            Some(at) => format!(
                "; at {at} it is powered off anyway (--drain-timeout), and these pods die with it"
            ),
            None => String::new(),
        };
        format!(
            "eviction refused for {}: the machine stays on, cordoned, until the budget allows it. To let it go: run another replica elsewhere, relax the budget, or delete the pod{end}",
            held.join(", ")
        )
    }
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
    let mut blocked = Vec::new();
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
            Ok(Err(kube::Error::Api(status))) if status.code == 429 => blocked.push(pod),
            Ok(Err(error)) if is_not_found(&error) => {}
            Ok(Err(error)) => return Err(error).during(|| format!("evicting pod {ns}/{name}")),
            Err(_) => {
                tracing::info!(pod = name, namespace = ns, "eviction did not answer in time");
                blocked.push(pod);
            }
        }
    }
    if blocked.is_empty() {
        return Ok(Drained::Empty);
    }
    Ok(Drained::Blocked(name_budgets(ctx, &blocked).await))
}

/// The refused pods with the budgets that select them. The refusal's own cause names the budget,
/// but the client retries a 429 until the eviction's timeout, so the budgets are read instead; a
/// namespace whose budgets cannot be listed leaves its pods' budgets unnamed.
async fn name_budgets(ctx: &Context, pods: &[&Pod]) -> Vec<HeldPod> {
    let mut budgets: BTreeMap<String, Vec<PodDisruptionBudget>> = BTreeMap::new();
    for ns in pods.iter().filter_map(|p| p.metadata.namespace.as_deref()) {
        if budgets.contains_key(ns) {
            continue;
        }
        let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), ns);
        let listed = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(error) => {
                tracing::warn!(%error, namespace = ns, "listing PodDisruptionBudgets failed");
                Vec::new()
            }
        };
        budgets.insert(ns.to_owned(), listed);
    }
    pods.iter()
        .map(|pod| {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let of_ns = budgets.get(&namespace).map(Vec::as_slice).unwrap_or_default();
            HeldPod {
                name: pod.metadata.name.clone().unwrap_or_default(),
                budgets: selecting(pod, of_ns),
                namespace,
            }
        })
        .collect()
}

/// The names of the budgets whose selector selects `pod` (an empty selector selects every pod
/// of the namespace, a missing one none, as the disruption controller reads them). Pure.
pub fn selecting(pod: &Pod, budgets: &[PodDisruptionBudget]) -> Vec<String> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    budgets
        .iter()
        .filter(|b| {
            let selector = b.spec.as_ref().and_then(|s| s.selector.clone());
            selector.and_then(|s| Selector::try_from(s).ok()).is_some_and(|s| s.matches(labels))
        })
        .filter_map(|b| b.metadata.name.clone())
        .collect()
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

    fn budget(name: &str, selector: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "minAvailable": 1, "selector": selector },
        }))
        .expect("budget")
    }

    #[test]
    fn the_budgets_that_select_a_pod_are_named() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": "db-0", "namespace": "data", "labels": { "app": "db", "tier": "state" } },
        }))
        .expect("pod");
        let budgets = [
            budget("db", json!({ "matchLabels": { "app": "db" } })),
            budget("web", json!({ "matchLabels": { "app": "web" } })),
            budget(
                "stateful",
                json!({ "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["state"] }] }),
            ),
            budget("everything", json!({})),
        ];
        assert_eq!(selecting(&pod, &budgets), ["db", "stateful", "everything"]);
        let no_selector: PodDisruptionBudget =
            serde_json::from_value(json!({ "metadata": { "name": "none" }, "spec": {} }))
                .expect("budget");
        assert!(selecting(&pod, &[no_selector]).is_empty(), "a missing selector selects nothing");
    }

    #[test]
    fn a_hold_says_what_holds_the_machine_and_what_to_do() {
        let held = |budgets: &[&str]| HeldPod {
            namespace: "data".into(),
            name: "db-0".into(),
            budgets: budgets.iter().map(|b| b.to_string()).collect(),
        };
        let hold = DrainHold { pods: vec![held(&["db"])], force_at: None };
        let message = hold.message();
        assert!(
            message.contains("pod data/db-0 (refused by PodDisruptionBudget data/db)"),
            "{message}"
        );
        assert!(message.contains("stays on, cordoned"), "{message}");
        assert!(message.contains("relax the budget"), "{message}");
        assert!(!message.contains("--drain-timeout"), "no forced end without the flag: {message}");
        let at: Timestamp = "2026-12-03T18:00:00Z".parse().expect("time");
        let forced = DrainHold { pods: vec![held(&["a", "b"]), held(&[])], force_at: Some(at) };
        let message = forced.message();
        assert!(message.contains("PodDisruptionBudgets data/{a,b}"), "{message}");
        assert!(message.contains("(refused by a PodDisruptionBudget)"), "{message}");
        assert!(message.contains("at 2026-12-03T18:00:00Z it is powered off anyway"), "{message}");
    }
}
