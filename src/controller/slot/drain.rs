//! Cordon and drain through the Eviction API, honouring PodDisruptionBudgets (decisions.md, D30).
//! A drain asks first: a dry-run eviction of every pod, and while a budget refuses any of them
//! nothing is evicted, so the machine stays on serving every pod and the hold names the refused
//! pods and their budgets. DaemonSet and mirror pods stay (they die with the machine).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, EvictParams, ListParams, Patch, PostParams};
use kube::core::{Selector, SelectorExt};
use serde_json::json;

use crate::controller::Context;
use crate::controller::error::{KubeContext, Result, is_not_found};
use crate::field_manager::FieldManager;
use crate::machine;

/// The slot condition a hold is reported in, and its reason while a budget holds the drain.
pub const CONDITION: &str = "Drained";
pub const HELD_BY_BUDGET: &str = "DisruptionBudget";

/// How a drain pass ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drained {
    /// Nothing evictable is left on the node.
    Empty,
    /// A PodDisruptionBudget refused these pods' evictions (HTTP 429); try again soon.
    Blocked(Vec<HeldPod>),
}

/// Whether a drain asks the budgets before it evicts anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Dry-run every eviction first and evict nothing while any is refused.
    AskFirst,
    /// Evict every pod a budget lets go (the hold is past `--drain-timeout`: the machine goes
    /// off anyway, and the pods that can move should not go down with it).
    EvictWhatMoves,
}

/// A pod whose eviction was refused, and the PodDisruptionBudgets of its namespace that select it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPod {
    pub namespace: String,
    pub name: String,
    pub budgets: Vec<String>,
}

/// A drain held back by disruption budgets: which pods, since when, and when the machine is
/// powered off anyway (`--drain-timeout`; never when it is not set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainHold {
    pub pods: Vec<HeldPod>,
    pub since: Timestamp,
    pub force_at: Option<Timestamp>,
}

/// When the slot's hold began: the transition of its `Drained` condition, which the slot's
/// status keeps across passes and restarts, else `remembered` (this term's own record, for a
/// pass that runs before the cache has the status the previous one wrote), else now, to the
/// second as the status keeps it: a hold read back must end at the time it was published with.
/// Pure.
pub fn hold_since(
    conditions: &[Condition],
    remembered: Option<Timestamp>,
    now: Timestamp,
) -> Timestamp {
    conditions
        .iter()
        .find(|c| c.type_ == CONDITION && c.status == "False" && c.reason == HELD_BY_BUDGET)
        .map(|c| c.last_transition_time.0)
        .or(remembered)
        .unwrap_or_else(|| Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// When a hold that began at `since` ends in a shutdown anyway: `--drain-timeout` after it;
/// never without one. Pure.
pub fn force_at(since: Timestamp, timeout: Option<Duration>) -> Option<Timestamp> {
    timeout.map(|timeout| crate::clock::plus(since, timeout))
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

/// Whether the pod's Ready condition is True.
fn pod_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether the drain evicts `pod` and waits on its budgets. On a node whose kubelet is silent,
/// a pod that is not Ready is already down (kube-controller-manager marks every pod of an
/// unreachable node not Ready): its budget counts it unhealthy, and under the default
/// `unhealthyPodEvictionPolicy` refuses its eviction for as long as the budget is short, which
/// is for as long as the machine is silent. Such a pod goes with the machine, and with its Node
/// once the shutdown confirms it off (the pod garbage collector deletes the pods of a deleted
/// Node), so the drain neither evicts it nor waits on it. Pure.
fn drains(pod: &Pod, node_silent: bool) -> bool {
    evictable(pod) && (!node_silent || pod_ready(pod))
}

/// How the API server answered one eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Evicted (or, asked as a dry run, would be).
    Allowed,
    /// A PodDisruptionBudget refuses it: 429 TooManyRequests.
    Refused,
    /// The pod is gone already.
    Gone,
}

/// Reads an eviction's result; any other failure is the pass's error. Pure.
fn answer<T>(result: kube::Result<T>) -> kube::Result<Answer> {
    match result {
        Ok(_) => Ok(Answer::Allowed),
        Err(kube::Error::Api(status)) if status.code == 429 => Ok(Answer::Refused),
        Err(error) if is_not_found(&error) => Ok(Answer::Gone),
        Err(error) => Err(error),
    }
}

/// Drains the node once. `AskFirst` dry-runs every eviction (the API server judges a dry run
/// against the budgets as it would the eviction, and changes nothing) and evicts only when none
/// is refused; a real eviction can still be refused (another pod's eviction used the budget's
/// allowance, or a race), and that pod is held like the others.
pub async fn drain(ctx: &Context, node: &CoreNode, mode: Mode) -> Result<Drained> {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let silent = matches!(machine::Kubelet::of(Some(node)), machine::Kubelet::Silent { .. });
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await
        .during(|| format!("listing the pods on node {node_name}"))?;
    let evictable: Vec<&Pod> = list.items.iter().filter(|p| drains(p, silent)).collect();
    let mut refused = Vec::new();
    if mode == Mode::AskFirst {
        for pod in &evictable {
            if evict(ctx, pod, true).await? == Answer::Refused {
                refused.push(*pod);
            }
        }
    }
    if refused.is_empty() {
        for pod in &evictable {
            if evict(ctx, pod, false).await? == Answer::Refused {
                refused.push(*pod);
            }
        }
    }
    if refused.is_empty() {
        return Ok(Drained::Empty);
    }
    tracing::info!(
        node = node_name,
        refused = refused.len(),
        pods = evictable.len(),
        ?mode,
        "a PodDisruptionBudget refuses evictions"
    );
    Ok(Drained::Blocked(name_budgets(ctx, &refused).await))
}

/// Evicts `pod`, or only asks whether it may be evicted (`dry_run`). The eviction client returns
/// a budget's 429 at once (the default client retries it for minutes): a refusal costs the pass
/// one request, and the slot is requeued instead.
async fn evict(ctx: &Context, pod: &Pod, dry_run: bool) -> Result<Answer> {
    let (Some(name), Some(ns)) = (pod.metadata.name.as_deref(), pod.metadata.namespace.as_deref())
    else {
        return Ok(Answer::Gone);
    };
    let api: Api<Pod> = Api::namespaced(ctx.evictions.clone(), ns);
    let params = EvictParams {
        post_options: PostParams { dry_run, ..PostParams::default() },
        ..EvictParams::default()
    };
    let what = if dry_run { "asking to evict" } else { "evicting" };
    answer(api.evict(name, &params).await).during(|| format!("{what} pod {ns}/{name}"))
}

/// The refused pods with the budgets that select them, read from the budgets themselves (a
/// refusal names its budget only in the prose of its cause); a namespace whose budgets cannot be
/// listed leaves its pods' budgets unnamed.
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

    #[test]
    fn a_silent_nodes_drain_does_not_wait_on_pods_already_down() {
        let pod = |ready: Option<&str>| -> Pod {
            let conditions = ready.map(|status| json!([{ "type": "Ready", "status": status }]));
            serde_json::from_value(json!({
                "metadata": { "name": "db-0", "namespace": "data" },
                "status": { "phase": "Running", "conditions": conditions },
            }))
            .expect("pod")
        };
        // (case, the pod's Ready, the node silent, drained)
        let table = [
            ("a Ready pod on a reporting node", Some("True"), false, true),
            ("a pod not Ready on a reporting node", Some("False"), false, true),
            ("a Ready pod on a silent node (just cut off)", Some("True"), true, true),
            ("a pod marked not Ready on a silent node", Some("False"), true, false),
            ("a pod with no Ready condition on a silent node", None, true, false),
        ];
        for (case, ready, silent, want) in table {
            assert_eq!(drains(&pod(ready), silent), want, "{case}");
        }
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
        let since: Timestamp = "2026-12-03T17:00:00Z".parse().expect("time");
        let hold = DrainHold { pods: vec![held(&["db"])], since, force_at: None };
        let message = hold.message();
        assert!(
            message.contains("pod data/db-0 (refused by PodDisruptionBudget data/db)"),
            "{message}"
        );
        assert!(message.contains("stays on, cordoned"), "{message}");
        assert!(message.contains("relax the budget"), "{message}");
        assert!(!message.contains("--drain-timeout"), "no forced end without the flag: {message}");
        let at: Timestamp = "2026-12-03T18:00:00Z".parse().expect("time");
        let forced =
            DrainHold { pods: vec![held(&["a", "b"]), held(&[])], since, force_at: Some(at) };
        let message = forced.message();
        assert!(message.contains("PodDisruptionBudgets data/{a,b}"), "{message}");
        assert!(message.contains("(refused by a PodDisruptionBudget)"), "{message}");
        assert!(message.contains("at 2026-12-03T18:00:00Z it is powered off anyway"), "{message}");
    }

    fn drained(status: &str, reason: &str, since: &str) -> Condition {
        Condition {
            type_: CONDITION.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                since.parse().expect("time"),
            ),
            observed_generation: None,
        }
    }

    /// The hold's start outlives the pass that found it: `--drain-timeout` runs from it, with or
    /// without a claim, and a hold read back ends at the time it was published with.
    #[test]
    fn a_hold_runs_from_when_it_began() {
        let ts = |s: &str| s.parse::<Timestamp>().expect("time");
        let now = ts("2026-12-03T18:00:07.25Z");
        let held = drained("False", HELD_BY_BUDGET, "2026-12-03T17:59:00Z");
        let other = drained("True", "Drained", "2026-12-03T17:00:00Z");
        let remembered = Some(ts("2026-12-03T17:59:30Z"));
        // (case, conditions, this term's record, the hold's start)
        let table = [
            (
                "the slot's status keeps it",
                vec![other.clone(), held.clone()],
                None,
                held.last_transition_time.0,
            ),
            (
                "the status before this term's record",
                vec![held.clone()],
                remembered,
                held.last_transition_time.0,
            ),
            (
                "a status the cache has not caught up with",
                vec![],
                remembered,
                ts("2026-12-03T17:59:30Z"),
            ),
            (
                "a hold that starts now, to the second",
                vec![other],
                None,
                ts("2026-12-03T18:00:07Z"),
            ),
        ];
        for (case, conditions, remembered, want) in table {
            assert_eq!(hold_since(&conditions, remembered, now), want, "{case}");
        }
        let since = ts("2026-12-03T17:59:00Z");
        assert_eq!(force_at(since, None), None, "without --drain-timeout a hold never ends");
        assert_eq!(
            force_at(since, Some(Duration::from_secs(600))),
            Some(ts("2026-12-03T18:09:00Z"))
        );
    }

    #[test]
    fn a_refusal_holds_a_missing_pod_is_skipped_and_any_other_failure_fails_the_pass() {
        let status = |code: u16| {
            kube::Error::Api(Box::new(kube::core::Status { code, ..kube::core::Status::default() }))
        };
        assert_eq!(answer(Ok(())).ok(), Some(Answer::Allowed));
        assert_eq!(answer::<()>(Err(status(429))).ok(), Some(Answer::Refused));
        assert_eq!(answer::<()>(Err(status(404))).ok(), Some(Answer::Gone));
        assert!(answer::<()>(Err(status(500))).is_err(), "a pod under two budgets (500)");
        assert!(answer::<()>(Err(status(403))).is_err());
    }
}
