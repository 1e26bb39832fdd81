//! What the kubelet of a simulated machine does to its Node: register it (only when no Node of
//! that name exists), stop (the machine is off or crashed: no more heartbeats) and start again
//! (the machine booted and finds its old Node).
//!
//! kwok renders the kubelet's status by the stages in tests/harness/kwok/stages.yaml. Those
//! stages refresh the Ready condition's heartbeat of every node whose kubelet runs and leave a
//! node carrying [`KUBELET_ANNOTATION`] alone, so kube-controller-manager, not the simulator,
//! turns a stopped node Ready=Unknown and taints it unreachable, as it does for a machine that
//! lost power. Pods bound to a stopped node carry the same annotation: kwok's pod stages skip
//! them, so an evicted pod stays Terminating (no kubelet confirms that its containers stopped)
//! until its Node is deleted and kube-controller-manager's pod GC removes it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node as CoreNode, NodeCondition, NodeSpec as CoreNodeSpec, NodeStatus as CoreNodeStatus, Pod,
    Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, ListParams, Patch};
use serde_json::json;

use super::{SimulatorError, kube_err};
use crate::field_manager::FieldManager;

/// On a Node: its kubelet is stopped (the machine is off). On a Pod: the kubelet of its node is
/// stopped, so nothing runs, completes or confirms the deletion of the pod.
pub const KUBELET_ANNOTATION: &str = "simulator.infra.homecluster.dev/kubelet";
/// The value of [`KUBELET_ANNOTATION`] while the kubelet is stopped.
pub const KUBELET_STOPPED: &str = "stopped";
/// While a node carries this annotation, kwok's stages leave it NotReady (a kubelet whose
/// network is not up yet).
pub const KUBELET_NETWORK_ANNOTATION: &str = "simulator.infra.homecluster.dev/kubelet-network";
/// kwok plays nodes carrying this annotation.
pub const KWOK_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");
/// On a slot: the machine's kubelet `--node-labels`, comma-separated `key=value` pairs.
pub const NODE_LABELS_ANNOTATION: &str = "simulator.infra.homecluster.dev/node-labels";
/// On a slot: the machine's Kubernetes distribution. `k3s` writes `spec.providerID:
/// k3s://<node name>` on the Node it registers; anything else (kubeadm, Talos) writes none.
pub const DISTRIBUTION_ANNOTATION: &str = "simulator.infra.homecluster.dev/distribution";
/// On a slot: `false` plays a kubelet registered without cluster-autoscaler's startup taint in
/// its `--register-with-taints` (a machine set up before, or without, the operations guide).
pub const REGISTERS_STARTUP_TAINT_ANNOTATION: &str =
    "simulator.infra.homecluster.dev/registers-startup-taint";
/// The taint users are told to register their machines with (`--register-with-taints`), which
/// cluster-autoscaler reads as "still starting". The operator removes it, never the simulator.
pub const STARTUP_TAINT: &str = "startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting";

/// Parses a kubelet's `--node-labels` value: `k=v` pairs separated by commas. Blank entries are
/// skipped; an entry without `=` is refused, as the kubelet refuses to start with it.
pub fn parse_node_labels(value: &str) -> Result<BTreeMap<String, String>, SimulatorError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| match entry.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(SimulatorError::NodeLabels { entry: entry.to_owned() }),
        })
        .collect()
}

/// The labels a kubelet puts on the Node it creates: its own well-known ones, then its
/// `--node-labels`.
pub fn kubelet_labels(
    node_name: &str,
    node_labels: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", node_name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    labels.extend(node_labels);
    labels
}

/// The `spec.providerID` the kubelet of `distribution` writes on a Node it creates.
pub fn provider_id(distribution: Option<&str>, node_name: &str) -> Option<String> {
    (distribution == Some("k3s")).then(|| format!("k3s://{node_name}"))
}

/// The Node a kubelet creates when it finds none: what it is told on its command line, nothing
/// of the slot's declared `spec.nodeLabels`, `spec.nodeTaints` or `spec.providerID`.
pub struct Registration {
    pub node_name: String,
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub taints: Vec<Taint>,
    pub provider_id: Option<String>,
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// The kubelet's CNI is not up yet: the Node registers NotReady.
    pub network_down: bool,
}

impl Registration {
    fn node(self) -> CoreNode {
        let mut annotations =
            BTreeMap::from([(KWOK_ANNOTATION.0.to_owned(), KWOK_ANNOTATION.1.to_owned())]);
        if self.network_down {
            annotations.insert(KUBELET_NETWORK_ANNOTATION.into(), "down".into());
        }
        CoreNode {
            metadata: ObjectMeta {
                name: Some(self.node_name),
                labels: Some(self.labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(CoreNodeSpec {
                taints: (!self.taints.is_empty()).then_some(self.taints),
                provider_id: self.provider_id,
                ..CoreNodeSpec::default()
            }),
            status: Some(CoreNodeStatus {
                capacity: self.capacity.clone(),
                allocatable: self.capacity,
                conditions: self.network_down.then(not_ready_status),
                ..CoreNodeStatus::default()
            }),
        }
    }
}

/// A kubelet's first status before its network is up.
fn not_ready_status() -> Vec<NodeCondition> {
    vec![NodeCondition {
        type_: "Ready".into(),
        status: "False".into(),
        reason: Some("KubeletNotReady".into()),
        message: Some(
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:cni plugin not initialized"
                .into(),
        ),
        ..NodeCondition::default()
    }]
}

/// What the kubelet found when it started.
#[derive(Debug, PartialEq, Eq)]
pub enum Boot {
    /// No Node of its name: it registered one.
    Registered,
    /// Its old Node was there: it took it over as it is, taints and all.
    Resumed,
}

/// The kubelet starts: it takes over its Node if one exists (no taints added, only the stopped
/// mark goes), else registers `registration`.
pub async fn boot(client: &Client, registration: Registration) -> Result<Boot, SimulatorError> {
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let name = registration.node_name.clone();
    let existing = nodes.get_opt(&name).await.map_err(kube_err(format!("reading node {name}")))?;
    // The operator may delete the silent Node of a machine it boots between the read and the
    // resume; then there is none to take over, and the kubelet registers a fresh one.
    if existing.is_some() && resume(client, &name, registration.network_down).await? {
        return Ok(Boot::Resumed);
    }
    match nodes.create(&FieldManager::Simulator.post(), &registration.node()).await {
        Ok(_) => Ok(Boot::Registered),
        // Created between the read and the create (a second startup Job): take it over.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Boot::Resumed),
        Err(error) => Err(kube_err(format!("registering node {name}"))(error)),
    }
}

/// The kubelet reports `resources` in its Node's capacity and allocatable, as it does when a
/// device plugin registers them (or, at `0`, before a plugin it knew has registered again).
pub async fn report_extended(
    client: &Client,
    node_name: &str,
    resources: &BTreeMap<String, Quantity>,
) -> Result<(), SimulatorError> {
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let patch = json!({ "status": { "capacity": resources, "allocatable": resources } });
    nodes
        .patch_status(node_name, &FieldManager::Simulator.patch(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!("reporting the device plugin's resources on {node_name}")))?;
    Ok(())
}

/// The kubelet of an existing Node runs again: kwok's stages turn the node Ready (after its
/// network, if `network_down`), and kube-controller-manager takes its unreachable taints off.
/// Returns whether the Node existed.
pub async fn resume(
    client: &Client,
    node_name: &str,
    network_down: bool,
) -> Result<bool, SimulatorError> {
    let network = network_down.then_some("down");
    let patch = json!({ "metadata": { "annotations": {
        KUBELET_ANNOTATION: null,
        KUBELET_NETWORK_ANNOTATION: network,
    } } });
    mark_node_and_pods(client, node_name, &patch, None, "starting").await
}

/// The kubelet stops (the machine powered off or crashed): its Node stays, its heartbeats
/// stop, and its pods are left as they are. Returns whether the Node existed.
pub async fn stop(client: &Client, node_name: &str) -> Result<bool, SimulatorError> {
    let patch = json!({ "metadata": { "annotations": { KUBELET_ANNOTATION: KUBELET_STOPPED } } });
    mark_node_and_pods(client, node_name, &patch, Some(KUBELET_STOPPED), "stopping").await
}

/// Patches the Node's annotations, then marks (or unmarks) the pods bound to it. Returns
/// whether the Node existed; `doing` names the step in an error ("stopping the kubelet of ...").
async fn mark_node_and_pods(
    client: &Client,
    node_name: &str,
    node_patch: &serde_json::Value,
    pod_mark: Option<&str>,
    doing: &str,
) -> Result<bool, SimulatorError> {
    match Api::<CoreNode>::all(client.clone())
        .patch(node_name, &FieldManager::Simulator.patch(), &Patch::Merge(node_patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
        Err(error) => return Err(kube_err(format!("{doing} the kubelet of {node_name}"))(error)),
    }
    mark_pods(client, node_name, pod_mark).await?;
    Ok(true)
}

/// Sets (or with `None` removes) [`KUBELET_ANNOTATION`] on every pod bound to `node_name`.
async fn mark_pods(
    client: &Client,
    node_name: &str,
    mark: Option<&str>,
) -> Result<(), SimulatorError> {
    let pods: Api<Pod> = Api::all(client.clone());
    let bound = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
    let list =
        pods.list(&bound).await.map_err(kube_err(format!("listing the pods of {node_name}")))?;
    let patch = json!({ "metadata": { "annotations": { KUBELET_ANNOTATION: mark } } });
    for pod in list.items {
        let current =
            pod.metadata.annotations.as_ref().and_then(|a| a.get(KUBELET_ANNOTATION)).cloned();
        let (Some(name), Some(namespace)) = (pod.metadata.name, pod.metadata.namespace) else {
            continue;
        };
        if current.as_deref() == mark {
            continue;
        }
        match Api::<Pod>::namespaced(client.clone(), &namespace)
            .patch(&name, &FieldManager::Simulator.patch(), &Patch::Merge(&patch))
            .await
        {
            // The pod went meanwhile (kube-controller-manager's pod GC, a finished Job).
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(error) => {
                return Err(kube_err(format!("marking pod {namespace}/{name}"))(error));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_are_comma_separated_pairs() {
        let labels = parse_node_labels("homelab.demo/size=big, zone=attic,,").expect("parses");
        assert_eq!(
            labels,
            BTreeMap::from([
                ("homelab.demo/size".to_owned(), "big".to_owned()),
                ("zone".to_owned(), "attic".to_owned()),
            ])
        );
        assert!(parse_node_labels("").expect("empty parses").is_empty());
        assert!(parse_node_labels("size").is_err());
        assert!(parse_node_labels("=big").is_err());
    }

    #[test]
    fn a_kubelet_labels_its_node_then_adds_its_node_labels() {
        let labels = kubelet_labels("mini-1", BTreeMap::from([("zone".into(), "attic".into())]));
        assert_eq!(labels["kubernetes.io/hostname"], "mini-1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(labels["beta.kubernetes.io/os"], "linux");
        assert_eq!(labels["beta.kubernetes.io/arch"], "amd64");
        assert_eq!(labels["zone"], "attic");
        assert_eq!(labels.len(), 6);
    }

    #[test]
    fn only_k3s_writes_a_provider_id() {
        assert_eq!(provider_id(Some("k3s"), "mini-1").as_deref(), Some("k3s://mini-1"));
        assert_eq!(provider_id(None, "mini-1"), None);
        assert_eq!(provider_id(Some("talos"), "mini-1"), None);
    }

    #[test]
    fn a_registration_carries_only_what_the_kubelet_was_told() {
        let node = Registration {
            node_name: "mini-1".into(),
            labels: kubelet_labels("mini-1", BTreeMap::new()),
            taints: vec![Taint {
                key: STARTUP_TAINT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }],
            provider_id: None,
            capacity: None,
            network_down: true,
        }
        .node();
        let annotations = node.metadata.annotations.unwrap_or_default();
        assert_eq!(annotations[KWOK_ANNOTATION.0], KWOK_ANNOTATION.1);
        assert_eq!(annotations[KUBELET_NETWORK_ANNOTATION], "down");
        assert!(!annotations.contains_key(KUBELET_ANNOTATION));
        let spec = node.spec.unwrap_or_default();
        assert_eq!(spec.provider_id, None);
        assert_eq!(spec.taints.unwrap_or_default()[0].key, STARTUP_TAINT);
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        assert_eq!(conditions[0].status, "False");
    }
}
