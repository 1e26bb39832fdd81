//! From one pass's listings to one pool's [`PoolView`]. Pure (no client): the lists are taken
//! by `observe`, the pool's slots and claims come from the provider's snapshot.
//!
//! A pod is *work* as [`crate::placement::pods`] says. Work is this pool's when:
//!
//! - it is bound to one of the pool's nodes (it holds that machine), or
//! - it is unbound, a machine of the pool would admit it (selectors, affinity, taints), it is
//!   not being placed elsewhere by preemption, and either the scheduler has found no node for it
//!   (`PodScheduled=False`, reason `Unschedulable`) or no usable node outside the pool would
//!   admit it. A pod the scheduler has not judged yet but that fits elsewhere creates no demand:
//!   it is about to be placed there. "Admit" counts the node affinity of the pod's bound
//!   volumes, and a pod only some machines can run, which [`super::bound_pods`] wakes a machine
//!   for, is not counted at all.
//!
//! Workloads (Deployments, StatefulSets, bare ReplicaSets) whose template needs the pool add
//! the replicas that have no pod yet; their pods are resolved through owner references
//! (pod -> ReplicaSet -> Deployment) and counted once, as pods.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Node as CoreNode, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::pool_view::{Machine, PoolView, Workload};
use crate::api::NodeClaimPhase;
use crate::phase;
use crate::placement::pods::{PodKey, controller_of, is_work, pod_key};
use crate::placement::shape::{NodeShape, Template, admits, fits, shape_of, takes_pods};
use crate::placement::volumes::VolumeIndex;
use crate::provider::{GroupSnapshot, SlotState, provider_id_of};

/// Everything one pass read of the cluster, shared by every pool the pass decides for.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub pods: Vec<Pod>,
    pub nodes: Vec<CoreNode>,
    pub deployments: Vec<Deployment>,
    pub stateful_sets: Vec<StatefulSet>,
    pub replica_sets: Vec<ReplicaSet>,
    pub claims: Vec<PersistentVolumeClaim>,
    pub volumes: Vec<PersistentVolume>,
}

impl ClusterView {
    /// The pass's claims and volumes, indexed.
    pub fn volume_index(&self) -> VolumeIndex<'_> {
        VolumeIndex::new(&self.claims, &self.volumes)
    }
}

/// A workload, by kind, namespace and name.
type WorkloadKey = (&'static str, String, String);

/// One pool's observation. The pods in `bound` are another planner's ([`super::bound_pods`]).
pub fn observe_group(
    view: &ClusterView,
    snapshot: &GroupSnapshot,
    bound: &HashSet<PodKey>,
) -> PoolView {
    let group = snapshot.name();
    let templates: Vec<Template> =
        snapshot.slots.iter().map(|s| Template::of_slot(&s.slot, group)).collect();
    let pool_nodes: HashSet<&str> =
        snapshot.slots.iter().map(|s| s.slot.spec.kubernetes_node_name.as_str()).collect();
    let no_labels = BTreeMap::new();
    let elsewhere: Vec<NodeShape<'_>> = view
        .nodes
        .iter()
        .filter(|n| takes_pods(n))
        .filter(|n| !pool_nodes.contains(n.metadata.name.as_deref().unwrap_or_default()))
        .map(|n| shape_of(n, &no_labels))
        .collect();
    let needs_pool = |spec: &PodSpec| templates.iter().any(|t| admits(spec, t.shape()));
    let fits_elsewhere = |spec: &PodSpec| elsewhere.iter().any(|n| admits(spec, *n));
    let volume_index = view.volume_index();

    let owners = deployment_of_replica_set(&view.replica_sets);
    let mut observed: HashMap<WorkloadKey, i32> = HashMap::new();
    let mut held: HashMap<&str, i32> = HashMap::new();
    let mut pending = 0;
    for pod in view.pods.iter().filter(|p| is_work(p)) {
        if let Some(key) = workload_of(&pod.metadata, &owners) {
            *observed.entry(key).or_default() += 1;
        }
        let Some(spec) = pod.spec.as_ref() else { continue };
        match spec.node_name.as_deref().filter(|n| !n.is_empty()) {
            Some(node) => {
                if let Some(pool_node) = pool_nodes.get(node) {
                    *held.entry(pool_node).or_default() += 1;
                }
            }
            None => {
                let nominated = pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref());
                let preempting_elsewhere =
                    nominated.is_some_and(|n| !n.is_empty() && !pool_nodes.contains(n));
                let key = pod_key(pod);
                let volumes = volume_index.bound_volumes(pod);
                let fits_pool = templates.iter().any(|t| fits(spec, &volumes, t.shape()));
                let fits_outside = elsewhere.iter().any(|n| fits(spec, &volumes, *n));
                if fits_pool
                    && !bound.contains(&key)
                    && !preempting_elsewhere
                    && (judged_unschedulable(pod) || !fits_outside)
                {
                    pending += 1;
                }
            }
        }
    }

    // A template only some slots admit is the bound-pod planner's once its pod exists (it
    // wakes one of those slots); counted here, its podless replica would boot the cheapest.
    let every_slot_admits = |spec: &PodSpec| templates.iter().all(|t| admits(spec, t.shape()));
    let workloads = workloads(view, &owners, &observed, |spec| {
        needs_pool(spec) && every_slot_admits(spec) && !fits_elsewhere(spec)
    });
    let machines: Vec<Machine> = snapshot.slots.iter().filter_map(|s| machine(s, &held)).collect();
    let machine_nodes: HashSet<&str> = machines.iter().map(|m| m.node.as_str()).collect();
    let draining_pods =
        held.iter().filter(|(node, _)| !machine_nodes.contains(**node)).map(|(_, n)| *n).sum();
    PoolView {
        pending_pods: pending,
        draining_pods,
        workloads,
        machines,
        free_slots: snapshot.slot_count() - snapshot.live_count(),
    }
}

/// The scheduler tried and found no node: `PodScheduled=False` with reason `Unschedulable`.
pub fn judged_unschedulable(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
    })
}

/// ReplicaSets owned by a Deployment, as `(namespace, name) -> deployment name`.
fn deployment_of_replica_set(sets: &[ReplicaSet]) -> HashMap<(String, String), String> {
    sets.iter()
        .filter_map(|rs| {
            let owner = controller_of(&rs.metadata).filter(|o| o.kind == "Deployment")?;
            let key = (rs.metadata.namespace.clone()?, rs.metadata.name.clone()?);
            Some((key, owner.name.clone()))
        })
        .collect()
}

/// The workload a pod belongs to, through its controller owner reference.
fn workload_of(
    meta: &ObjectMeta,
    deployments: &HashMap<(String, String), String>,
) -> Option<WorkloadKey> {
    let owner = controller_of(meta)?;
    let namespace = meta.namespace.clone().unwrap_or_default();
    match owner.kind.as_str() {
        "ReplicaSet" => match deployments.get(&(namespace.clone(), owner.name.clone())) {
            Some(deployment) => Some(("Deployment", namespace, deployment.clone())),
            None => Some(("ReplicaSet", namespace, owner.name.clone())),
        },
        "StatefulSet" => Some(("StatefulSet", namespace, owner.name.clone())),
        _ => None,
    }
}

/// The workloads whose template `needs` this pool, with the pods of theirs seen anywhere.
fn workloads(
    view: &ClusterView,
    deployments_of: &HashMap<(String, String), String>,
    observed: &HashMap<WorkloadKey, i32>,
    needs: impl Fn(&PodSpec) -> bool,
) -> Vec<Workload> {
    let mut found: Vec<(WorkloadKey, i32, Option<&PodSpec>)> = Vec::new();
    let key = |kind: &'static str, meta: &ObjectMeta| {
        (kind, meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
    };
    for d in view.deployments.iter().filter(|d| d.metadata.deletion_timestamp.is_none()) {
        let spec = &d.spec;
        found.push((
            key("Deployment", &d.metadata),
            spec.replicas.unwrap_or(1),
            spec.template.spec.as_ref(),
        ));
    }
    for s in view.stateful_sets.iter().filter(|s| s.metadata.deletion_timestamp.is_none()) {
        let spec = &s.spec;
        found.push((
            key("StatefulSet", &s.metadata),
            spec.replicas.unwrap_or(1),
            spec.template.spec.as_ref(),
        ));
    }
    for rs in view.replica_sets.iter().filter(|r| r.metadata.deletion_timestamp.is_none()) {
        let owned = controller_of(&rs.metadata).is_some();
        let named = (
            rs.metadata.namespace.clone().unwrap_or_default(),
            rs.metadata.name.clone().unwrap_or_default(),
        );
        if owned || deployments_of.contains_key(&named) {
            continue;
        }
        let spec = &rs.spec;
        let template = spec.template.as_ref().and_then(|t| t.spec.as_ref());
        found.push((key("ReplicaSet", &rs.metadata), spec.replicas.unwrap_or(1), template));
    }
    found
        .into_iter()
        .filter(|(_, desired, template)| *desired > 0 && template.is_some_and(&needs))
        .map(|(key, desired, _)| Workload {
            observed: observed.get(&key).copied().unwrap_or(0),
            name: format!("{} {}/{}", key.0, key.1, key.2),
            desired,
        })
        .collect()
}

/// The slot as a machine of the pool, when a wanted claim holds it.
fn machine(state: &SlotState, held: &HashMap<&str, i32>) -> Option<Machine> {
    let claim = state.claims.iter().find(|c| {
        phase::wants_machine(c.status.as_ref().and_then(|s| s.phase), phase::is_marked(c))
    })?;
    let node = state.slot.spec.kubernetes_node_name.clone();
    Some(Machine {
        slot: state.name().to_owned(),
        held: held.get(node.as_str()).copied().unwrap_or(0),
        provider_id: provider_id_of(&state.slot),
        ready: phase::of(claim) == NodeClaimPhase::Ready,
        claimed_at: claim
            .spec
            .requested_at
            .as_ref()
            .or(claim.metadata.creation_timestamp.as_ref())
            .map(|t| t.0),
        pinned: claim.spec.request.call.is_pin(),
        node,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::{Value, json};

    use super::super::demand::demand;
    use super::*;
    use crate::api::{LABEL_GROUP, LABEL_LIFECYCLE, LABEL_MANAGED_BY, NodeClaim};
    use crate::placement::pods::MIRROR_ANNOTATION;
    use crate::provider::groups::tests::{claim, group, marked, slot};

    fn pod(name: &str, spec: Value, status: Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{ "name": "app", "image": "app" }]);
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "apps" },
            "spec": spec,
            "status": status,
        }))
        .unwrap()
    }

    fn with_meta(mut p: Pod, meta: Value) -> Pod {
        let mut merged = serde_json::to_value(&p.metadata).unwrap();
        for (k, v) in meta.as_object().unwrap() {
            merged[k] = v.clone();
        }
        p.metadata = serde_json::from_value(merged).unwrap();
        p
    }

    fn unschedulable() -> Value {
        json!({ "phase": "Pending", "conditions": [{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable" }] })
    }

    fn unjudged() -> Value {
        json!({ "phase": "Pending" })
    }

    fn for_pool() -> Value {
        json!({ "nodeSelector": { LABEL_GROUP: "pool" } })
    }

    fn node(name: &str, labels: Value, ready: bool, cordoned: bool) -> CoreNode {
        serde_json::from_value(json!({
            "metadata": { "name": name, "labels": labels },
            "spec": { "unschedulable": cordoned },
            "status": { "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }] },
        }))
        .unwrap()
    }

    fn owned_by(kind: &str, name: &str) -> Value {
        json!({ "ownerReferences": [{ "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true }] })
    }

    /// Slots a, b, c, d, e of `pool`: a ready, b booting, c ready but marked (being released),
    /// d free, e pinned by a person (ready).
    fn snapshot() -> GroupSnapshot {
        use NodeClaimPhase::*;
        let slots = vec![
            slot("a", "pool"),
            slot("b", "pool"),
            slot("c", "pool"),
            slot("d", "pool"),
            slot("e", "pool"),
        ];
        let mut pin = claim("e-1", "e", Some(Ready), "2026-03-04T09:10:00Z");
        pin.spec.request.call = crate::api::ClaimCall::Manual;
        let claims: Vec<Arc<NodeClaim>> = vec![
            claim("a-1", "a", Some(Ready), "2026-03-04T09:00:00Z"),
            claim("b-1", "b", Some(Booting), "2026-03-04T09:30:00Z"),
            marked(claim("c-1", "c", Some(Ready), "2026-03-04T08:00:00Z")),
            pin,
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        GroupSnapshot::build(group("pool", 0), &slots, &claims, &HashSet::new())
    }

    fn lab() -> CoreNode {
        node("lab", json!({ "kubernetes.io/hostname": "lab" }), true, false)
    }

    /// A claim `claim` of namespace `apps` bound to a local PersistentVolume on `host`.
    fn local_volume_on(claim: &str, host: &str) -> (PersistentVolumeClaim, PersistentVolume) {
        let volume = format!("pv-{claim}");
        (
            serde_json::from_value(json!({
                "metadata": { "name": claim, "namespace": "apps" },
                "spec": { "volumeName": volume },
            }))
            .unwrap(),
            serde_json::from_value(json!({
                "metadata": { "name": volume },
                "spec": { "nodeAffinity": { "required": { "nodeSelectorTerms": [{
                    "matchExpressions": [{ "key": "kubernetes.io/hostname",
                                           "operator": "In", "values": [host] }] }] } } },
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_bound_volume_narrows_where_a_pending_pod_is_demand() {
        let (claims, volumes): (Vec<_>, Vec<_>) =
            [("on-d", "d"), ("on-lab", "lab")].iter().map(|(c, h)| local_volume_on(c, h)).unzip();
        let using = |name: &str, claim: &str| {
            pod(
                name,
                json!({ "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }] }),
                unschedulable(),
            )
        };
        let view = ClusterView {
            pods: vec![using("db", "on-d"), using("cache", "on-lab")],
            claims,
            volumes,
            ..ClusterView::default()
        };
        let pending =
            |bound: &HashSet<PodKey>| observe_group(&view, &snapshot(), bound).pending_pods;
        assert_eq!(
            pending(&HashSet::new()),
            1,
            "the pod whose volume is on slot d is the pool's; the one on lab is not"
        );
        let bound = HashSet::from([("apps".to_owned(), "db".to_owned())]);
        assert_eq!(pending(&bound), 0, "a bound pod is the bound-pod planner's, not the count's");
    }

    #[test]
    fn the_bound_pod_planner_and_the_count_take_each_pending_pod_once_judged_or_not() {
        // A pod whose volume is on free slot d, just created (the scheduler has not looked at
        // it) or judged unschedulable: the planner wakes d for it and the count leaves it out,
        // so the pool does not boot its cheapest free slot for a pod that cannot run there.
        for status in [unjudged(), unschedulable()] {
            let (claim, volume) = local_volume_on("on-d", "d");
            let db = pod(
                "db",
                json!({ "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "on-d" } }] }),
                status.clone(),
            );
            let view = ClusterView {
                pods: vec![db],
                nodes: vec![lab()],
                claims: vec![claim],
                volumes: vec![volume],
                ..ClusterView::default()
            };
            let pool = snapshot();
            let plan = crate::scaler::bound_pods::plan(
                &view.pods,
                &view.nodes,
                &view.volume_index(),
                &[&pool],
                &mut crate::scaler::refusals::Refusals::default(),
            );
            let woken: Vec<&[String]> = plan.wakes.iter().map(|w| w.slots.as_slice()).collect();
            assert_eq!(woken, [["d".to_owned()].as_slice()], "{status}");
            assert_eq!(observe_group(&view, &pool, &plan.handled).pending_pods, 0, "{status}");
        }
    }

    fn pending_of(pods: Vec<Pod>, nodes: Vec<CoreNode>) -> i32 {
        let view = ClusterView { pods, nodes, ..ClusterView::default() };
        observe_group(&view, &snapshot(), &HashSet::new()).pending_pods
    }

    #[test]
    fn which_unbound_pods_need_the_pool() {
        let tolerating_pool = json!({ "nodeSelector": { LABEL_GROUP: "pool" }, "tolerations": [{ "operator": "Exists" }] });
        let table: Vec<(&str, Pod, Vec<CoreNode>, i32)> = vec![
            (
                "selects the pool, judged unschedulable",
                pod("p", for_pool(), unschedulable()),
                vec![lab()],
                1,
            ),
            (
                "selects the pool, not judged yet, nothing else has the label",
                pod("p", for_pool(), unjudged()),
                vec![lab()],
                1,
            ),
            (
                "selects nothing, not judged yet, fits the lab node",
                pod("p", json!({}), unjudged()),
                vec![lab()],
                0,
            ),
            (
                "selects nothing, the only other node is cordoned",
                pod("p", json!({}), unjudged()),
                vec![node("lab", json!({}), true, true)],
                1,
            ),
            (
                "selects nothing, the only other node is not Ready",
                pod("p", json!({}), unjudged()),
                vec![node("lab", json!({}), false, false)],
                1,
            ),
            (
                "selects nothing, judged unschedulable: the scheduler's verdict stands",
                pod("p", json!({}), unschedulable()),
                vec![lab()],
                1,
            ),
            (
                "selects another pool",
                pod("p", json!({ "nodeSelector": { LABEL_GROUP: "other" } }), unschedulable()),
                vec![],
                0,
            ),
            (
                "tolerations do not matter without taints",
                pod("p", tolerating_pool, unschedulable()),
                vec![],
                1,
            ),
            (
                "preempting its way onto another node",
                pod("p", for_pool(), json!({ "phase": "Pending", "nominatedNodeName": "lab" })),
                vec![lab()],
                0,
            ),
            (
                "preempting its way onto a machine of the pool",
                pod("p", for_pool(), json!({ "phase": "Pending", "nominatedNodeName": "a" })),
                vec![lab()],
                1,
            ),
            (
                "a lifecycle pod of the operator",
                with_meta(
                    pod("p", for_pool(), unschedulable()),
                    json!({ "labels": { LABEL_MANAGED_BY.0: LABEL_MANAGED_BY.1, LABEL_LIFECYCLE: "startup" } }),
                ),
                vec![],
                0,
            ),
            (
                "a pod being deleted",
                with_meta(
                    pod("p", for_pool(), unschedulable()),
                    json!({ "deletionTimestamp": "2026-03-04T10:00:00Z" }),
                ),
                vec![],
                0,
            ),
            ("a finished pod", pod("p", for_pool(), json!({ "phase": "Failed" })), vec![], 0),
        ];
        for (name, p, nodes, want) in table {
            assert_eq!(pending_of(vec![p], nodes), want, "{name}");
        }
    }

    #[test]
    fn a_tainted_pool_needs_a_toleration() {
        let mut tainted = (*slot("t", "pool")).clone();
        tainted.spec.node_taints = vec![k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            value: Some("ci".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }];
        let snap =
            GroupSnapshot::build(group("pool", 0), &[Arc::new(tainted)], &[], &HashSet::new());
        let plain = pod("p", for_pool(), unschedulable());
        let tolerant = pod(
            "q",
            json!({ "nodeSelector": { LABEL_GROUP: "pool" }, "tolerations": [{ "key": "dedicated", "operator": "Exists" }] }),
            unschedulable(),
        );
        let view = ClusterView { pods: vec![plain, tolerant], ..ClusterView::default() };
        assert_eq!(observe_group(&view, &snap, &HashSet::new()).pending_pods, 1);
    }

    #[test]
    fn machines_are_the_wanted_claims_with_what_their_nodes_hold() {
        let on = |name: &str, node: &str| {
            pod(name, json!({ "nodeName": node }), json!({ "phase": "Running" }))
        };
        let pods = vec![
            on("web-1", "a"),
            on("web-2", "a"),
            with_meta(on("agent", "a"), owned_by("DaemonSet", "agent")),
            with_meta(on("static", "a"), json!({ "annotations": { MIRROR_ANNOTATION: "x" } })),
            with_meta(on("leaving", "a"), json!({ "deletionTimestamp": "2026-03-04T10:00:00Z" })),
            pod("done", json!({ "nodeName": "a" }), json!({ "phase": "Succeeded" })),
            on("evictee", "c"),
            on("elsewhere", "lab"),
        ];
        let view = ClusterView { pods, nodes: vec![lab()], ..ClusterView::default() };
        let o = observe_group(&view, &snapshot(), &HashSet::new());
        let summary: Vec<(&str, bool, i32, bool)> =
            o.machines.iter().map(|m| (m.slot.as_str(), m.ready, m.held, m.pinned)).collect();
        assert_eq!(
            summary,
            [("a", true, 2, false), ("b", false, 0, false), ("e", true, 0, true)],
            "c is marked, d is free, e is pinned: a machine, never released"
        );
        assert_eq!(o.machines[0].provider_id, "homelab://a");
        assert_eq!(o.machines[1].claimed_at, Some("2026-03-04T09:30:00Z".parse().unwrap()));
        assert_eq!(o.draining_pods, 1, "the pod on the machine being released");
        assert_eq!(o.free_slots, 1, "only d has no live claim");
        assert_eq!(demand(&o), 3);
    }

    fn deployment(name: &str, replicas: i32, spec: Value) -> Deployment {
        let mut spec = spec;
        spec["containers"] = json!([{ "name": "app", "image": "app" }]);
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "apps" },
            "spec": { "replicas": replicas, "selector": {}, "template": { "spec": spec } },
        }))
        .unwrap()
    }

    fn replica_set(name: &str, deployment: Option<&str>) -> ReplicaSet {
        let mut meta = json!({ "name": name, "namespace": "apps" });
        if let Some(d) = deployment {
            meta["ownerReferences"] = owned_by("Deployment", d)["ownerReferences"].clone();
        }
        serde_json::from_value(json!({ "metadata": meta, "spec": { "selector": {} } })).unwrap()
    }

    #[test]
    fn a_deployment_of_two_with_two_pending_pods_counts_two_not_four() {
        let pods = (1..=2)
            .map(|i| {
                with_meta(
                    pod(&format!("web-x-{i}"), for_pool(), unschedulable()),
                    owned_by("ReplicaSet", "web-x"),
                )
            })
            .collect();
        let view = ClusterView {
            pods,
            nodes: vec![lab()],
            deployments: vec![deployment("web", 2, for_pool())],
            replica_sets: vec![replica_set("web-x", Some("web"))],
            ..ClusterView::default()
        };
        let o = observe_group(&view, &snapshot(), &HashSet::new());
        assert_eq!(o.pending_pods, 2);
        assert_eq!(
            o.workloads,
            vec![Workload { name: "Deployment apps/web".into(), desired: 2, observed: 2 }]
        );
        assert_eq!(demand(&o), 2);
    }

    #[test]
    fn workloads_add_only_their_podless_replicas_and_only_when_they_need_the_pool() {
        let view = ClusterView {
            pods: vec![with_meta(
                pod("web-x-1", for_pool(), unschedulable()),
                owned_by("ReplicaSet", "web-x"),
            )],
            nodes: vec![lab()],
            deployments: vec![
                deployment("web", 3, for_pool()),
                deployment("generic", 5, json!({})),
                deployment("other", 2, json!({ "nodeSelector": { LABEL_GROUP: "other" } })),
                deployment("off", 0, for_pool()),
            ],
            replica_sets: vec![replica_set("web-x", Some("web")), replica_set("bare", None)],
            ..ClusterView::default()
        };
        let o = observe_group(&view, &snapshot(), &HashSet::new());
        let names: Vec<&str> = o.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(
            names,
            ["Deployment apps/web"],
            "a template that fits the lab node, another pool, zero replicas, a bare RS without template: none"
        );
        assert_eq!(demand(&o), 3, "one pending pod and two replicas without a pod");
    }

    /// A Deployment whose pods ask for a device only one slot declares adds no replicas to the
    /// pool's count before its pod exists: the pod, once made, is the bound-pod planner's, which
    /// wakes that slot. Counted, its podless replica booted the cheapest slot, which lacks the
    /// device (seen under load, when the ReplicaSet had not made the pod by the scaler's pass).
    #[test]
    fn a_workload_only_some_slots_can_run_adds_no_podless_replicas() {
        let mut gpu = (*slot("d", "pool")).clone();
        gpu.spec.node_capacity = [("example.com/gpu".to_owned(), Quantity("1".to_owned()))].into();
        let slots = vec![slot("a", "pool"), Arc::new(gpu)];
        let snapshot = GroupSnapshot::build(group("pool", 0), &slots, &[], &HashSet::new());
        let mut gpu_work = for_pool();
        gpu_work["containers"] = json!([{ "name": "app", "image": "app",
            "resources": { "limits": { "example.com/gpu": "1" } } }]);
        let mut with_devices = deployment("train", 1, json!({}));
        with_devices.spec.template.spec = Some(serde_json::from_value(gpu_work).unwrap());
        let view = ClusterView {
            nodes: vec![lab()],
            deployments: vec![with_devices, deployment("web", 2, for_pool())],
            ..ClusterView::default()
        };
        let o = observe_group(&view, &snapshot, &HashSet::new());
        let names: Vec<&str> = o.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["Deployment apps/web"], "only the workload every slot can run");
    }
}
