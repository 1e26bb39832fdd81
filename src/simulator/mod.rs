//! `homelab-autoscaler simulate`: plays every slot's machine on a cluster whose nodes are kwok's,
//! for the demo and the end-to-end tests. When a startup Job completes, the slot's node
//! registers after a boot delay carrying the pool's bootstrap (readiness) taints, which are
//! removed after a further delay; when a shutdown Job completes, the node goes away.
//!
//! A slot can play a broken machine with the annotation `simulator.infra.homecluster.dev/behaviour`:
//! `never-boots` (nothing registers), `never-clears-gate` (the bootstrap taints stay),
//! `ignores-shutdown` (the node stays up after a shutdown Job), `registers-not-ready` (the node
//! registers NotReady, as a kubelet does before its CNI is up, and turns Ready after
//! `simulator.infra.homecluster.dev/not-ready-for`, default 30s).

use std::collections::{BTreeMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Node as CoreNode, NodeCondition, NodeSpec as CoreNodeSpec, NodeStatus as CoreNodeStatus, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::api::{GROUP_LABEL, Group, LABEL_LIFECYCLE, LABEL_MANAGED_BY, LABEL_SLOT, Node};
use crate::job_outcome::{JobOutcome, outcome};

/// The annotation that makes a slot play a broken machine.
pub const BEHAVIOUR_ANNOTATION: &str = "simulator.infra.homecluster.dev/behaviour";
/// How long a `registers-not-ready` machine stays NotReady (a duration such as `30s`).
pub const NOT_READY_FOR_ANNOTATION: &str = "simulator.infra.homecluster.dev/not-ready-for";
const DEFAULT_NOT_READY_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// While a node carries this annotation, kwok's stages leave it NotReady (a kubelet whose
/// network is not up yet).
pub const KUBELET_NETWORK_ANNOTATION: &str = "simulator.infra.homecluster.dev/kubelet-network";
/// kwok plays nodes carrying this annotation.
pub const KWOK_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// Settings of the simulator.
#[derive(Clone, Debug, clap::Args)]
pub struct SimulateArgs {
    /// The namespace of the slots.
    #[arg(long, env = "HOMELAB_AUTOSCALER_NAMESPACE", default_value = crate::api::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// How long a machine takes to register its node after its startup Job.
    #[arg(long, default_value = "3s", value_parser = crate::api::duration::parse_go_duration)]
    pub boot_delay: kube::core::Duration,
    /// How long the node carries its bootstrap taints.
    #[arg(long, default_value = "2s", value_parser = crate::api::duration::parse_go_duration)]
    pub gate_delay: kube::core::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    #[error("{action}: {source}")]
    Kube { action: String, source: kube::Error },
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
    slot.metadata.annotations.as_ref()?.get(BEHAVIOUR_ANNOTATION).map(String::as_str)
}

/// How long the machine's kubelet reports NotReady after registering, if it plays a slow one.
fn not_ready_for(slot: &Node) -> Option<std::time::Duration> {
    if behaviour(slot) != Some("registers-not-ready") {
        return None;
    }
    let configured = slot
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NOT_READY_FOR_ANNOTATION))
        .and_then(|d| crate::api::duration::parse_go_duration(d).ok())
        .filter(|d| !d.is_negative());
    Some(configured.map_or(DEFAULT_NOT_READY_FOR, Into::into))
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
    let group = match slot.metadata.labels.as_ref().and_then(|l| l.get(GROUP_LABEL)) {
        Some(g) => Api::<Group>::namespaced(client.clone(), &args.namespace)
            .get_opt(g)
            .await
            .map_err(kube_err(format!("reading group {g}")))?,
        None => None,
    };
    let bootstrap: Vec<Taint> = group
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
    tokio::time::sleep(args.boot_delay.into()).await;

    let node_name = slot.spec.kubernetes_node_name.clone();
    let nodes: Api<CoreNode> = Api::all(client.clone());
    let mut taints = slot.spec.node_taints.clone();
    taints.extend(bootstrap.iter().cloned());
    let mut labels: BTreeMap<String, String> = slot.spec.node_labels.clone();
    labels.insert("kubernetes.io/hostname".into(), node_name.clone());
    labels.insert("type".into(), "kwok".into());
    let capacity = (!slot.spec.node_capacity.is_empty()).then(|| slot.spec.node_capacity.clone());
    // A slow kubelet's node says its network is down; kwok's stages leave it NotReady until
    // the annotation goes (tests/harness/kwok/stages.yaml).
    let slow = not_ready_for(&slot);
    let mut annotations = BTreeMap::from([(KWOK_ANNOTATION.0.into(), KWOK_ANNOTATION.1.into())]);
    if slow.is_some() {
        annotations.insert(KUBELET_NETWORK_ANNOTATION.into(), "down".into());
    }
    let node = CoreNode {
        metadata: ObjectMeta {
            name: Some(node_name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(CoreNodeSpec {
            taints: Some(taints),
            provider_id: slot.spec.provider_id.clone(),
            ..CoreNodeSpec::default()
        }),
        status: Some(CoreNodeStatus {
            capacity: capacity.clone(),
            allocatable: capacity,
            conditions: slow.map(|_| not_ready_status()),
            ..CoreNodeStatus::default()
        }),
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(
            node = node_name,
            "machine booted; node registered with its bootstrap taints"
        ),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            tracing::info!(node = node_name, "node already registered")
        }
        Err(error) => return Err(kube_err(format!("registering node {node_name}"))(error)),
    }
    if let Some(delay) = slow {
        tokio::time::sleep(delay).await;
        let network_up =
            json!({ "metadata": { "annotations": { KUBELET_NETWORK_ANNOTATION: null } } });
        nodes
            .patch(&node_name, &PatchParams::default(), &Patch::Merge(&network_up))
            .await
            .map_err(kube_err(format!("bringing the kubelet of {node_name} up")))?;
        tracing::info!(node = node_name, "kubelet network up; node turns Ready");
    }
    if behaviour(&slot) == Some("never-clears-gate") || bootstrap.is_empty() {
        return Ok(());
    }
    tokio::time::sleep(args.gate_delay.into()).await;
    let current =
        nodes.get(&node_name).await.map_err(kube_err(format!("reading node {node_name}")))?;
    let kept: Vec<Taint> = current
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !bootstrap.iter().any(|b| b.key == t.key))
        .collect();
    nodes
        .patch(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "taints": kept } })),
        )
        .await
        .map_err(kube_err(format!("clearing the bootstrap taints of {node_name}")))?;
    tracing::info!(node = node_name, "bootstrap taints cleared");
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
    match Api::<CoreNode>::all(client.clone()).delete(&node_name, &DeleteParams::default()).await {
        Ok(_) => tracing::info!(node = node_name, "machine powered off"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(error) => return Err(kube_err(format!("removing node {node_name}"))(error)),
    }
    Ok(())
}
