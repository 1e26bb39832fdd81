//! `homelab-autoscaler simulate`: plays every slot's machine on a cluster whose nodes are kwok's,
//! for the demo and the end-to-end tests. A machine is played as a kubelet, not as a cloud: its
//! Kubernetes Node outlives a power-off, as a real homelab machine's does.
//!
//! - **Boot** (a startup Job of the slot succeeded, then `--boot-delay`): the kubelet starts. If
//!   the machine's Node exists, it takes it over as it is (no taints added); kwok turns it Ready
//!   and kube-controller-manager takes its unreachable taints off. If no Node exists, it
//!   registers one as a kubelet does: the kubelet's well-known labels plus its `--node-labels`
//!   (the slot annotation `simulator.infra.homecluster.dev/node-labels`, comma-separated
//!   `key=value`), its `--register-with-taints` (the Group's readiness taints and
//!   cluster-autoscaler's startup taint, left out for the slot annotation
//!   `simulator.infra.homecluster.dev/registers-startup-taint: "false"`), and, for the slot annotation
//!   `simulator.infra.homecluster.dev/distribution: k3s`, `spec.providerID: k3s://<node>`.
//!   The slot's declared `spec.nodeLabels`, `spec.nodeTaints` and `spec.providerID` are the
//!   operator's to write, never the kubelet's. After `--gate-delay` the Group's readiness taints
//!   go (the startup taint is the operator's to remove).
//! - **Power-off** (a shutdown Job of the slot succeeded): the kubelet stops (see [`kubelet`]).
//!   The Node stays; kube-controller-manager marks it Ready=Unknown and taints it unreachable.
//!
//! A slot can play a broken machine with the annotation `simulator.infra.homecluster.dev/behaviour`:
//! `never-boots` (the kubelet never starts), `never-clears-gate` (the readiness taints stay),
//! `ignores-shutdown` (the kubelet keeps running after a shutdown Job), `registers-not-ready`
//! (the node is NotReady, as a kubelet's is before its CNI is up, and turns Ready after
//! `simulator.infra.homecluster.dev/not-ready-for`, default 30s).
//!
//! A slot's extended resources (`nvidia.com/gpu` and any other `vendor/name` in its
//! `nodeCapacity`) are on the Node from its registration, unless the slot has the annotation
//! `simulator.infra.homecluster.dev/device-plugin-after` (a duration): then they come from a
//! device plugin, as on a real machine. The kubelet registers its Node without them (one that
//! takes its Node over reports them as 0, a registered plugin's resources having no devices
//! until it registers again), and the plugin registers that long after the kubelet started.

pub mod kubelet;

use std::collections::{BTreeMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node as CoreNode, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, Patch};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::api::{Group, LABEL_LIFECYCLE, LABEL_MANAGED_BY, LABEL_SLOT, Node};
use crate::field_manager::FieldManager;
use crate::job_outcome::{JobOutcome, outcome};
use crate::placement::shape::is_extended;

pub use kubelet::{
    DISTRIBUTION_ANNOTATION, KUBELET_ANNOTATION, KUBELET_NETWORK_ANNOTATION, KUBELET_STOPPED,
    KWOK_ANNOTATION, NODE_LABELS_ANNOTATION, REGISTERS_STARTUP_TAINT_ANNOTATION, STARTUP_TAINT,
};

/// The annotation that makes a slot play a broken machine.
pub const BEHAVIOUR_ANNOTATION: &str = "simulator.infra.homecluster.dev/behaviour";
/// How long a `registers-not-ready` machine stays NotReady (a duration such as `30s`).
pub const NOT_READY_FOR_ANNOTATION: &str = "simulator.infra.homecluster.dev/not-ready-for";
const DEFAULT_NOT_READY_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// How long after the kubelet a device plugin registers the slot's extended resources.
pub const DEVICE_PLUGIN_AFTER_ANNOTATION: &str =
    "simulator.infra.homecluster.dev/device-plugin-after";

/// Settings of the simulator.
#[derive(Clone, Debug, clap::Args)]
pub struct SimulateArgs {
    /// The namespace of the slots.
    #[arg(long, env = "HOMELAB_AUTOSCALER_NAMESPACE", default_value = crate::api::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// How long a machine takes to start its kubelet after its startup Job.
    #[arg(long, default_value = "3s", value_parser = crate::api::duration::parse_go_duration)]
    pub boot_delay: kube::core::Duration,
    /// How long a registered node carries the Group's readiness taints.
    #[arg(long, default_value = "2s", value_parser = crate::api::duration::parse_go_duration)]
    pub gate_delay: kube::core::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    #[error("{action}: {source}")]
    Kube { action: String, source: kube::Error },
    #[error(
        "annotation {NODE_LABELS_ANNOTATION}: entry {entry:?} is not key=value (the kubelet would refuse to start)"
    )]
    NodeLabels { entry: String },
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> SimulatorError {
    let action = action.into();
    move |source| SimulatorError::Kube { action, source }
}

/// Plays machines until `shutdown`.
pub async fn run(client: Client, args: SimulateArgs, shutdown: CancellationToken) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), &args.namespace);
    let config = watcher::Config::default()
        .labels(&format!("{}={}", LABEL_MANAGED_BY.0, LABEL_MANAGED_BY.1));
    let mut handled: HashSet<String> = HashSet::new();
    let mut events = watcher(jobs, config).default_backoff().applied_objects().boxed();
    loop {
        let job = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = events.next() => match next {
                Some(Ok(job)) => job,
                Some(Err(error)) => { tracing::warn!(%error, "watching Jobs"); continue; }
                None => return,
            },
        };
        if !matches!(outcome(&job), JobOutcome::Succeeded { .. }) {
            continue;
        }
        let Some(uid) = job.metadata.uid.clone() else { continue };
        if !handled.insert(uid) {
            continue;
        }
        let labels = job.metadata.labels.clone().unwrap_or_default();
        let (Some(slot), Some(lifecycle)) =
            (labels.get(LABEL_SLOT).cloned(), labels.get(LABEL_LIFECYCLE).cloned())
        else {
            continue;
        };
        let (client, args) = (client.clone(), args.clone());
        tokio::spawn(async move {
            let result = match lifecycle.as_str() {
                "startup" => power_on(&client, &args, &slot).await,
                "shutdown" => power_off(&client, &args, &slot).await,
                _ => Ok(()),
            };
            if let Err(error) = result {
                tracing::warn!(%error, slot, lifecycle, "simulated machine failed");
            }
        });
    }
}

fn behaviour(slot: &Node) -> Option<&str> {
    annotation(slot, BEHAVIOUR_ANNOTATION)
}

fn annotation<'a>(slot: &'a Node, key: &str) -> Option<&'a str> {
    slot.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// How long the machine's kubelet reports NotReady after it starts, if it plays a slow one.
fn not_ready_for(slot: &Node) -> Option<std::time::Duration> {
    if behaviour(slot) != Some("registers-not-ready") {
        return None;
    }
    Some(duration_annotation(slot, NOT_READY_FOR_ANNOTATION).unwrap_or(DEFAULT_NOT_READY_FOR))
}

/// A slot annotation that holds a duration (`30s`); none if absent, unreadable or negative.
fn duration_annotation(slot: &Node, key: &str) -> Option<std::time::Duration> {
    annotation(slot, key)
        .and_then(|d| crate::api::duration::parse_go_duration(d).ok())
        .filter(|d| !d.is_negative())
        .map(Into::into)
}

/// When the machine's device plugin registers after its kubelet, if one plays it.
fn device_plugin_after(slot: &Node) -> Option<std::time::Duration> {
    duration_annotation(slot, DEVICE_PLUGIN_AFTER_ANNOTATION)
}

/// The slot's declared capacity split into what the kubelet reports itself and the extended
/// resources a device plugin adds.
fn split_capacity(
    capacity: &BTreeMap<String, Quantity>,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    capacity.clone().into_iter().partition(|(name, _)| !is_extended(name))
}

/// The kubelet's `--register-with-taints`: the Group's readiness taints, then
/// cluster-autoscaler's startup taint unless the slot plays a kubelet registered without it.
fn registration_taints(slot: &Node, readiness: &[Taint]) -> Vec<Taint> {
    let mut taints = readiness.to_vec();
    if annotation(slot, REGISTERS_STARTUP_TAINT_ANNOTATION) == Some("false") {
        return taints;
    }
    taints.push(Taint {
        key: STARTUP_TAINT.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    taints
}

async fn power_on(
    client: &Client,
    args: &SimulateArgs,
    slot_name: &str,
) -> Result<(), SimulatorError> {
    let slots: Api<Node> = Api::namespaced(client.clone(), &args.namespace);
    let slot = slots.get(slot_name).await.map_err(kube_err(format!("reading slot {slot_name}")))?;
    if behaviour(&slot) == Some("never-boots") {
        tracing::info!(slot = slot_name, "playing a machine that never boots");
        return Ok(());
    }
    let group = match slot.group() {
        Some(g) => Api::<Group>::namespaced(client.clone(), &args.namespace)
            .get_opt(g)
            .await
            .map_err(kube_err(format!("reading group {g}")))?,
        None => None,
    };
    let readiness: Vec<Taint> = group
        .map(|g| g.spec.node_readiness_taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| Taint {
            key: t.key,
            value: t.value,
            effect: t.effect.unwrap_or_else(|| "NoSchedule".into()),
            time_added: None,
        })
        .collect();
    let node_labels =
        kubelet::parse_node_labels(annotation(&slot, NODE_LABELS_ANNOTATION).unwrap_or_default())?;
    tokio::time::sleep(args.boot_delay.into()).await;

    let node_name = slot.spec.kubernetes_node_name.clone();
    let plugin_after = device_plugin_after(&slot);
    let (own, from_plugin) = match plugin_after {
        Some(_) => split_capacity(&slot.spec.node_capacity),
        None => (slot.spec.node_capacity.clone(), BTreeMap::new()),
    };
    let capacity = (!own.is_empty()).then_some(own);
    // A slow kubelet's node says its network is down; kwok's stages leave it NotReady until
    // the annotation goes (tests/harness/kwok/stages.yaml).
    let slow = not_ready_for(&slot);
    let registration = kubelet::Registration {
        node_name: node_name.clone(),
        labels: kubelet::kubelet_labels(&node_name, node_labels),
        taints: registration_taints(&slot, &readiness),
        provider_id: kubelet::provider_id(annotation(&slot, DISTRIBUTION_ANNOTATION), &node_name),
        capacity,
        network_down: slow.is_some(),
    };
    let booted = kubelet::boot(client, registration).await?;
    match booted {
        kubelet::Boot::Registered => tracing::info!(
            node = node_name,
            "machine booted; its kubelet registered the node with its registration taints"
        ),
        kubelet::Boot::Resumed => {
            tracing::info!(node = node_name, "machine booted; its kubelet took over its node")
        }
    }
    let nodes: Api<CoreNode> = Api::all(client.clone());
    if let Some(after) = plugin_after.filter(|_| !from_plugin.is_empty()) {
        if booted == kubelet::Boot::Resumed {
            let none =
                from_plugin.keys().map(|name| (name.clone(), Quantity("0".into()))).collect();
            kubelet::report_extended(client, &node_name, &none).await?;
        }
        let (client, node_name) = (client.clone(), node_name.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            match kubelet::report_extended(&client, &node_name, &from_plugin).await {
                Ok(()) => tracing::info!(node = node_name, "device plugin registered"),
                Err(error) => tracing::warn!(%error, node = node_name, "device plugin"),
            }
        });
    }
    if let Some(delay) = slow {
        tokio::time::sleep(delay).await;
        let network_up =
            json!({ "metadata": { "annotations": { KUBELET_NETWORK_ANNOTATION: null } } });
        nodes
            .patch(&node_name, &FieldManager::Simulator.patch(), &Patch::Merge(&network_up))
            .await
            .map_err(kube_err(format!("bringing the kubelet of {node_name} up")))?;
        tracing::info!(node = node_name, "kubelet network up; node turns Ready");
    }
    if behaviour(&slot) == Some("never-clears-gate") || readiness.is_empty() {
        return Ok(());
    }
    tokio::time::sleep(args.gate_delay.into()).await;
    let current =
        nodes.get(&node_name).await.map_err(kube_err(format!("reading node {node_name}")))?;
    let taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
    if !taints.iter().any(|t| readiness.iter().any(|r| r.key == t.key)) {
        return Ok(());
    }
    let kept: Vec<Taint> =
        taints.into_iter().filter(|t| !readiness.iter().any(|r| r.key == t.key)).collect();
    nodes
        .patch(
            &node_name,
            &FieldManager::Simulator.patch(),
            &Patch::Merge(&json!({ "spec": { "taints": kept } })),
        )
        .await
        .map_err(kube_err(format!("clearing the readiness taints of {node_name}")))?;
    tracing::info!(node = node_name, "readiness taints cleared");
    Ok(())
}

async fn power_off(
    client: &Client,
    args: &SimulateArgs,
    slot_name: &str,
) -> Result<(), SimulatorError> {
    let slot = Api::<Node>::namespaced(client.clone(), &args.namespace)
        .get(slot_name)
        .await
        .map_err(kube_err(format!("reading slot {slot_name}")))?;
    if behaviour(&slot) == Some("ignores-shutdown") {
        tracing::info!(slot = slot_name, "playing a machine that ignores its shutdown");
        return Ok(());
    }
    let node_name = slot.spec.kubernetes_node_name;
    if kubelet::stop(client, &node_name).await? {
        tracing::info!(node = node_name, "machine powered off; its kubelet stopped");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_plugin_adds_the_extended_resources_and_the_kubelet_reports_the_rest() {
        let declared: BTreeMap<String, Quantity> = [
            ("cpu", "16"),
            ("memory", "64Gi"),
            ("hugepages-2Mi", "1Gi"),
            ("nvidia.com/gpu", "1"),
            ("example.com/resource", "2"),
        ]
        .into_iter()
        .map(|(name, amount)| (name.to_owned(), Quantity(amount.into())))
        .collect();
        let (own, from_plugin) = split_capacity(&declared);
        assert_eq!(own.keys().collect::<Vec<_>>(), ["cpu", "hugepages-2Mi", "memory"]);
        assert_eq!(
            from_plugin.keys().collect::<Vec<_>>(),
            ["example.com/resource", "nvidia.com/gpu"]
        );
    }

    #[test]
    fn only_a_slot_with_the_annotation_has_a_device_plugin_that_registers_late() {
        let slot = |after: Option<&str>| {
            let mut slot = crate::fixtures::slot("gpu-1", "gpus");
            if let Some(after) = after {
                slot.metadata.annotations =
                    Some([(DEVICE_PLUGIN_AFTER_ANNOTATION.to_owned(), after.to_owned())].into());
            }
            slot
        };
        assert_eq!(device_plugin_after(&slot(None)), None);
        assert_eq!(
            device_plugin_after(&slot(Some("40s"))),
            Some(std::time::Duration::from_secs(40))
        );
        assert_eq!(device_plugin_after(&slot(Some("soon"))), None);
    }
}
