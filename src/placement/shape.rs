//! Whether a pod could go on a node, judged by what the scheduler judges first and what a
//! machine that is not up yet can already answer: labels (`nodeSelector` and required node
//! affinity), the node's name (`matchFields`), taints (tolerations), and the extended resources
//! the pod asks for (`nvidia.com/gpu`, any `vendor/resource`): a machine that has none of a
//! device can never run a pod that needs one. CPU, memory and the pods already on a machine are
//! left to the scheduler: it marks a pod that fits nowhere `Unschedulable`, and the scaler
//! believes it.
//!
//! A pool's machines are judged by their template: the labels, taints and capacity the slot says
//! its node carries, plus the labels the operator mirrors onto it. [`fits`] adds the node affinity of the
//! pod's bound volumes ([`super::volumes`]), as the scheduler's VolumeBinding filter does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node as CoreNode, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
    Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::volumes::BoundVolume;
use crate::api::{HOSTNAME_LABEL, LABEL_GROUP, LABEL_SLOT, Node as Slot, OS_LABEL};
use crate::machine;
use crate::quantity;

/// A node that offers nothing beyond what every node has.
static NO_RESOURCES: BTreeMap<String, Quantity> = BTreeMap::new();

/// A node as placement sees it.
#[derive(Clone, Copy, Debug)]
pub struct NodeShape<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub taints: &'a [Taint],
    /// What it offers: a real node's allocatable, a slot's declared capacity.
    pub resources: &'a BTreeMap<String, Quantity>,
}

/// The node a slot's machine registers as, described from the slot.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub resources: BTreeMap<String, Quantity>,
}

impl Template {
    /// The labels its node carried when last seen (`status.nodeLabels`) under the slot's
    /// declared `nodeLabels`, its `nodeTaints`, its hostname, the OS every pool runs, and the
    /// group and slot labels the operator mirrors onto the node.
    pub fn of_slot(slot: &Slot, group: &str) -> Self {
        let name = slot.spec.kubernetes_node_name.clone();
        let mut labels = slot.status.as_ref().map(|s| s.node_labels.clone()).unwrap_or_default();
        labels.extend(slot.spec.node_labels.clone());
        labels.entry(OS_LABEL.to_owned()).or_insert_with(|| "linux".to_owned());
        labels.insert(HOSTNAME_LABEL.to_owned(), name.clone());
        labels.insert(LABEL_GROUP.to_owned(), group.to_owned());
        labels.insert(
            LABEL_SLOT.to_owned(),
            slot.metadata.name.clone().unwrap_or_else(|| name.clone()),
        );
        Self {
            name,
            labels,
            taints: slot.spec.node_taints.clone(),
            resources: slot.spec.node_capacity.clone(),
        }
    }

    /// The node cluster-autoscaler simulates for the group when `slot` is the next to boot:
    /// the slot's declared labels and taints without any that name one machine (its hostname,
    /// the slot label), as the provider's NodeGroupTemplateNodeInfo describes it, under the
    /// name that template carries. A pod only one machine can run never fits it.
    pub fn for_autoscaler(slot: &Slot, group: &str) -> Self {
        let name = format!("template-node-for-{group}");
        let mut template = Self::of_slot(slot, group);
        template.labels.remove(LABEL_SLOT);
        template.labels.insert(HOSTNAME_LABEL.to_owned(), name.clone());
        template.name = name;
        template
    }

    pub fn shape(&self) -> NodeShape<'_> {
        NodeShape {
            name: &self.name,
            labels: &self.labels,
            taints: &self.taints,
            resources: &self.resources,
        }
    }
}

/// Whether the scheduler would consider `node` for `pod` at all: its selectors match, it
/// tolerates every taint that keeps pods off (NoSchedule, NoExecute), and the node offers every
/// extended resource the pod asks for.
pub fn admits(pod: &PodSpec, node: NodeShape<'_>) -> bool {
    selects(pod, node)
        && tolerates(pod.tolerations.as_deref().unwrap_or_default(), node.taints)
        && offers(node, &extended_requests(pod))
}

/// Whether `name` is an extended resource: one a device plugin or the cluster's owner adds
/// (`nvidia.com/gpu`, `example.com/dongle`), not a native one (`cpu`, `memory`,
/// `hugepages-2Mi`, anything under `kubernetes.io/`), as the API server tells them apart.
pub fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// The extended resources `pod` asks for, in thousandths (see [`requests`]).
pub fn extended_requests(pod: &PodSpec) -> BTreeMap<String, i128> {
    requests(pod, is_extended)
}

/// The resources `pod` asks for among those `wanted` names, in thousandths: its containers'
/// together, or its largest init container's if more, as the scheduler sums a pod's requests.
/// A limit without a request is the request (the API defaults it so).
pub fn requests(pod: &PodSpec, wanted: impl Fn(&str) -> bool) -> BTreeMap<String, i128> {
    let mut total: BTreeMap<String, i128> = BTreeMap::new();
    for (name, amount) in pod.containers.iter().flat_map(|c| container_requests(c, &wanted)) {
        // Saturating: a pod read off the wire may carry any quantity.
        let entry = total.entry(name).or_default();
        *entry = entry.saturating_add(amount);
    }
    let init = pod.init_containers.iter().flatten();
    for (name, amount) in init.flat_map(|c| container_requests(c, &wanted)) {
        let entry = total.entry(name).or_default();
        *entry = (*entry).max(amount);
    }
    total.retain(|_, amount| *amount > 0);
    total
}

fn container_requests(container: &Container, wanted: impl Fn(&str) -> bool) -> Vec<(String, i128)> {
    let Some(resources) = container.resources.as_ref() else { return Vec::new() };
    let requests = resources.requests.iter().flatten();
    let limits = resources.limits.iter().flatten();
    let mut asked: BTreeMap<&str, &Quantity> = BTreeMap::new();
    for (name, amount) in limits.chain(requests) {
        // Requests come last: they override a limit of the same name.
        asked.insert(name, amount);
    }
    asked
        .into_iter()
        .filter(|(name, _)| wanted(name))
        .map(|(name, amount)| (name.to_owned(), quantity::parse(&amount.0).map_or(0, |q| q.0)))
        .collect()
}

/// Whether `node` offers every amount in `wanted`.
fn offers(node: NodeShape<'_>, wanted: &BTreeMap<String, i128>) -> bool {
    wanted.iter().all(|(name, amount)| {
        node.resources
            .get(name)
            .and_then(|have| quantity::parse(&have.0).ok())
            .is_some_and(|have| have.0 >= *amount)
    })
}

/// [`admits`], and every volume in `volumes` can be used on `node`.
pub fn fits(pod: &PodSpec, volumes: &[BoundVolume], node: NodeShape<'_>) -> bool {
    admits(pod, node) && volumes.iter().all(|v| selector_matches(&v.nodes, node))
}

/// A node selector's terms are ORed, as in a PersistentVolume's node affinity.
pub fn selector_matches(selector: &NodeSelector, node: NodeShape<'_>) -> bool {
    selector.node_selector_terms.iter().any(|t| term_matches(t, node))
}

/// A real node that takes new pods: Ready, not cordoned, not being deleted.
pub fn takes_pods(node: &CoreNode) -> bool {
    machine::is_ready(node)
        && !machine::is_cordoned(node)
        && node.metadata.deletion_timestamp.is_none()
}

/// The shape of a real node.
pub fn shape_of<'a>(node: &'a CoreNode, empty: &'a BTreeMap<String, String>) -> NodeShape<'a> {
    NodeShape {
        name: node.metadata.name.as_deref().unwrap_or_default(),
        labels: node.metadata.labels.as_ref().unwrap_or(empty),
        taints: node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default(),
        resources: node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .unwrap_or(&NO_RESOURCES),
    }
}

fn selects(pod: &PodSpec, node: NodeShape<'_>) -> bool {
    let selector_ok =
        pod.node_selector.iter().flatten().all(|(key, value)| node.labels.get(key) == Some(value));
    let required = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    // Terms are ORed; a pod without required terms is not constrained by affinity.
    let affinity_ok = required.is_none_or(|r| {
        r.node_selector_terms.is_empty()
            || r.node_selector_terms.iter().any(|t| term_matches(t, node))
    });
    selector_ok && affinity_ok
}

/// A term's expressions and fields are ANDed; a term that says nothing matches nothing, as in
/// the scheduler.
fn term_matches(term: &NodeSelectorTerm, node: NodeShape<'_>) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions.iter().all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name)))
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|w| w != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) =
                (value.and_then(number), values.first().and_then(|b| number(b)))
            else {
                return false;
            };
            if req.operator == "Gt" { have > bound } else { have < bound }
        }
        _ => false,
    }
}

/// Every taint that keeps pods off is tolerated. PreferNoSchedule only steers the scheduler.
fn tolerates(tolerations: &[Toleration], taints: &[Taint]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| tolerations.iter().any(|t| tolerates_one(t, taint)))
}

fn tolerates_one(toleration: &Toleration, taint: &Taint) -> bool {
    if toleration.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref() {
        Some("Exists") => key.is_empty() || key == taint.key,
        None | Some("") | Some("Equal") => {
            !key.is_empty()
                && key == taint.key
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::taint;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> PodSpec {
        let mut spec = spec;
        spec["containers"] = json!([{ "name": "app", "image": "app" }]);
        serde_json::from_value(spec).unwrap()
    }

    fn slot(labels: serde_json::Value, taints: serde_json::Value) -> Slot {
        serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
            "metadata": { "name": "nuc-1", "labels": { "group": "pool" } },
            "spec": {
                "kubernetesNodeName": "nuc-1",
                "startupPodSpec": { "image": "power" }, "shutdownPodSpec": { "image": "power" },
                "nodeLabels": labels, "nodeTaints": taints,
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_template_carries_the_slots_labels_taints_and_the_mirrored_ones() {
        let t = Template::of_slot(&slot(json!({ "gpu": "yes" }), json!([])), "pool");
        assert_eq!(t.labels["gpu"], "yes");
        assert_eq!(t.labels[LABEL_GROUP], "pool");
        assert_eq!(t.labels[LABEL_SLOT], "nuc-1");
        assert_eq!(t.labels[HOSTNAME_LABEL], "nuc-1");
        assert_eq!(t.labels[OS_LABEL], "linux");
    }

    #[test]
    fn a_template_counts_the_labels_its_node_carried_under_the_declared_ones() {
        let mut s = slot(json!({ "disk": "ssd" }), json!([]));
        s.status = Some(crate::api::NodeStatus {
            node_labels: [
                ("topology.topolvm.io/node".to_string(), "nuc-1".to_string()),
                ("disk".to_string(), "hdd".to_string()),
            ]
            .into(),
            ..Default::default()
        });
        let t = Template::of_slot(&s, "pool");
        assert_eq!(t.labels["topology.topolvm.io/node"], "nuc-1");
        assert_eq!(t.labels["disk"], "ssd", "the declared label wins");
    }

    #[test]
    fn selectors_and_affinity_against_a_template() {
        let t = Template::of_slot(&slot(json!({ "disk": "ssd", "cores": "8" }), json!([])), "pool");
        let affinity = |terms: serde_json::Value| {
            pod(json!({ "affinity": { "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": terms } } } }))
        };
        let table = [
            ("no constraint", pod(json!({})), true),
            ("the group label", pod(json!({ "nodeSelector": { LABEL_GROUP: "pool" } })), true),
            ("another group", pod(json!({ "nodeSelector": { LABEL_GROUP: "other" } })), false),
            ("a label the slot declares", pod(json!({ "nodeSelector": { "disk": "ssd" } })), true),
            ("linux", pod(json!({ "nodeSelector": { OS_LABEL: "linux" } })), true),
            (
                "In",
                affinity(
                    json!([{ "matchExpressions": [{ "key": "disk", "operator": "In", "values": ["nvme", "ssd"] }] }]),
                ),
                true,
            ),
            (
                "NotIn",
                affinity(
                    json!([{ "matchExpressions": [{ "key": "disk", "operator": "NotIn", "values": ["ssd"] }] }]),
                ),
                false,
            ),
            (
                "DoesNotExist",
                affinity(
                    json!([{ "matchExpressions": [{ "key": "gpu", "operator": "DoesNotExist" }] }]),
                ),
                true,
            ),
            (
                "Gt",
                affinity(
                    json!([{ "matchExpressions": [{ "key": "cores", "operator": "Gt", "values": ["4"] }] }]),
                ),
                true,
            ),
            (
                "Lt",
                affinity(
                    json!([{ "matchExpressions": [{ "key": "cores", "operator": "Lt", "values": ["4"] }] }]),
                ),
                false,
            ),
            (
                "terms are ORed",
                affinity(json!([
                    { "matchExpressions": [{ "key": "gpu", "operator": "Exists" }] },
                    { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["nuc-1"] }] },
                ])),
                true,
            ),
            ("an empty term matches nothing", affinity(json!([{}])), false),
        ];
        for (name, p, want) in table {
            assert_eq!(admits(&p, t.shape()), want, "{name}");
        }
    }

    #[test]
    fn taints_must_be_tolerated_unless_they_only_prefer() {
        let t = Template::of_slot(
            &slot(
                json!({}),
                json!([
                    { "key": "dedicated", "value": "ci", "effect": "NoSchedule" },
                    { "key": "soft", "effect": "PreferNoSchedule" },
                ]),
            ),
            "pool",
        );
        let table = [
            ("no toleration", pod(json!({})), false),
            (
                "Equal with the value",
                pod(
                    json!({ "tolerations": [{ "key": "dedicated", "value": "ci", "effect": "NoSchedule" }] }),
                ),
                true,
            ),
            (
                "Equal with another value",
                pod(json!({ "tolerations": [{ "key": "dedicated", "value": "gpu" }] })),
                false,
            ),
            (
                "Exists by key",
                pod(json!({ "tolerations": [{ "key": "dedicated", "operator": "Exists" }] })),
                true,
            ),
            (
                "Exists for everything",
                pod(json!({ "tolerations": [{ "operator": "Exists" }] })),
                true,
            ),
            (
                "the wrong effect",
                pod(
                    json!({ "tolerations": [{ "key": "dedicated", "operator": "Exists", "effect": "NoExecute" }] }),
                ),
                false,
            ),
        ];
        for (name, p, want) in table {
            assert_eq!(admits(&p, t.shape()), want, "{name}");
        }
        let plain = taint("x", None, "NoExecute");
        assert!(!tolerates(&[], std::slice::from_ref(&plain)));
    }

    /// A pod with these containers' `resources`.
    fn asking(containers: serde_json::Value, init: serde_json::Value) -> PodSpec {
        serde_json::from_value(json!({ "containers": containers, "initContainers": init })).unwrap()
    }

    #[test]
    fn extended_resources_a_pod_asks_for_must_be_offered() {
        let gpu = |amount: &str| json!([{ "name": "app", "resources": { "limits": { "nvidia.com/gpu": amount } } }]);
        let plain = json!([{ "name": "app", "resources": { "requests": { "cpu": "8", "memory": "64Gi" } } }]);
        let two_containers = json!([
            { "name": "a", "resources": { "requests": { "nvidia.com/gpu": "1" }, "limits": { "nvidia.com/gpu": "1" } } },
            { "name": "b", "resources": { "limits": { "nvidia.com/gpu": "1" } } },
        ]);
        let init_asks_more =
            json!([{ "name": "warm", "resources": { "limits": { "example.com/dongle": "2" } } }]);
        let capacity = |offer: serde_json::Value| {
            let mut s = slot(json!({}), json!([]));
            s.spec.node_capacity = serde_json::from_value(offer).unwrap();
            Template::of_slot(&s, "pool")
        };
        let gpu_box = capacity(json!({ "cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1" }));
        let two_gpus = capacity(json!({ "nvidia.com/gpu": "2", "example.com/dongle": "2" }));
        let no_gpu = capacity(json!({ "cpu": "16", "memory": "64Gi" }));
        let undeclared = capacity(json!({}));
        let table = [
            ("a GPU pod on the GPU box", gpu("1"), json!([]), &gpu_box, true),
            ("a GPU pod on a machine without one", gpu("1"), json!([]), &no_gpu, false),
            ("a GPU pod on a slot that declares nothing", gpu("1"), json!([]), &undeclared, false),
            ("two GPUs on a box with one", gpu("2"), json!([]), &gpu_box, false),
            ("two containers with one each", two_containers.clone(), json!([]), &gpu_box, false),
            ("two containers on two GPUs", two_containers, json!([]), &two_gpus, true),
            ("cpu and memory are the scheduler's", plain.clone(), json!([]), &undeclared, true),
            ("an init container's dongles", plain.clone(), init_asks_more.clone(), &gpu_box, false),
            ("an init container's dongles offered", plain, init_asks_more, &two_gpus, true),
            ("zero GPUs asks for none", gpu("0"), json!([]), &no_gpu, true),
        ];
        for (name, containers, init, template, want) in table {
            assert_eq!(admits(&asking(containers, init), template.shape()), want, "{name}");
        }
    }

    #[test]
    fn extended_names_are_the_api_servers() {
        for name in ["nvidia.com/gpu", "amd.com/gpu", "example.com/dongle", "squat.ai/serial"] {
            assert!(is_extended(name), "{name}");
        }
        for name in [
            "cpu",
            "memory",
            "hugepages-2Mi",
            "ephemeral-storage",
            "kubernetes.io/x",
            "requests.nvidia.com/gpu",
        ] {
            assert!(!is_extended(name), "{name}");
        }
    }

    #[test]
    fn a_real_node_offers_its_allocatable() {
        let node: CoreNode = serde_json::from_value(json!({
            "metadata": { "name": "gpu-1" },
            "status": { "allocatable": { "nvidia.com/gpu": "1" } },
        }))
        .unwrap();
        let empty = BTreeMap::new();
        let gpu = json!([{ "name": "app", "resources": { "limits": { "nvidia.com/gpu": "1" } } }]);
        assert!(admits(&asking(gpu.clone(), json!([])), shape_of(&node, &empty)));
        let before_the_plugin: CoreNode =
            serde_json::from_value(json!({ "metadata": { "name": "gpu-1" } })).unwrap();
        assert!(!admits(&asking(gpu, json!([])), shape_of(&before_the_plugin, &empty)));
    }

    #[test]
    fn a_node_takes_pods_when_ready_and_not_cordoned() {
        let node = |ready: &str, cordoned: bool| -> CoreNode {
            serde_json::from_value(json!({
                "metadata": { "name": "n" },
                "spec": { "unschedulable": cordoned },
                "status": { "conditions": [{ "type": "Ready", "status": ready }] },
            }))
            .unwrap()
        };
        assert!(takes_pods(&node("True", false)));
        assert!(!takes_pods(&node("False", false)));
        assert!(!takes_pods(&node("True", true)));
    }
}
