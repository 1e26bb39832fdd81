//! kwok, which plays kubelet for fake nodes, and the machine helpers built on it: a "machine"
//! in a test is a core Node that kwok keeps Ready (its heartbeats) and whose pods it runs (and,
//! for Job pods, completes) by the stages in tests/harness/kwok/stages.yaml, until the test
//! stops its kubelet ([`ControlPlane::stop_kubelet`]) as a machine that crashed or lost power.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, ResourceExt};

use homelab_autoscaler::simulator;

use crate::control_plane::{Components, ControlPlane};
use crate::process::Process;
use crate::{progress, wait};

/// The annotation that hands a node to kwok (the selector kwok is started with).
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
const KWOK_NODE_VALUE: &str = "fake";

impl ControlPlane {
    pub(crate) async fn start_kwok(&self) -> Result<Process> {
        let stages = crate::repo_path("tests/harness/kwok/stages.yaml");
        let process = self
            .spawn(
                "kwok",
                vec![
                    self.kubeconfig_arg(),
                    format!("--config={}", stages.display()),
                    // Only nodes a test hands over; a node the product registers itself stays
                    // the product's.
                    "--manage-all-nodes=false".into(),
                    format!(
                        "--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}"
                    ),
                    "--manage-nodes-with-label-selector=".into(),
                    "--manage-single-node=".into(),
                    // Fake pod and node addresses, outside the Service range (10.96.0.0/16).
                    "--cidr=10.244.0.0/16".into(),
                    "--node-ip=10.243.0.1".into(),
                    // No node Leases: kwok 0.8 keeps renewing the Lease of a node it once
                    // managed for as long as it runs, whatever the node's annotations say, so a
                    // Lease would keep a stopped machine alive. The heartbeat stages in
                    // stages.yaml stand in for the kubelet's status updates, and skip a node
                    // whose kubelet the simulator (or a test) stopped.
                    "--node-lease-duration-seconds=0".into(),
                ],
            )
            .await?;
        // Its effect shows when a node is added; add_machine waits for that.
        process.ensure_running()?;
        progress("kwok started");
        Ok(process)
    }

    /// Creates a core Node named `name` that kwok manages, with `taints` and `labels` (plus
    /// `kubernetes.io/hostname`), and waits until it is Ready. kwok never touches the taints,
    /// so a bootstrap taint stays until the test (or the product) removes it.
    pub async fn add_machine(
        &self,
        name: &str,
        taints: Vec<Taint>,
        labels: BTreeMap<String, String>,
    ) -> Result<Node> {
        self.ensure(Components { kwok: true, ..Components::API }).await?;
        let kwok = self.kwok.get().context("kwok did not start")?;
        let started = Instant::now();
        let mut all_labels = BTreeMap::from([("kubernetes.io/hostname".into(), name.to_owned())]);
        all_labels.extend(labels);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(all_labels),
                annotations: Some(BTreeMap::from([(
                    KWOK_NODE_ANNOTATION.to_owned(),
                    KWOK_NODE_VALUE.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: (!taints.is_empty()).then_some(taints),
                ..NodeSpec::default()
            }),
            ..Node::default()
        };
        let nodes: Api<Node> = Api::all(self.client()?);
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating machine (Node) {name}"))?;
        let ready = wait::until(
            &format!("kwok to make Node {name} Ready"),
            wait::start_timeout(),
            || kwok.ensure_running(),
            || async {
                let node = nodes.get(name).await?;
                anyhow::ensure!(is_ready(&node), "Node {name} is not Ready yet");
                Ok(node)
            },
        )
        .await?;
        progress(&format!("machine {name} Ready in {:.1?}", started.elapsed()));
        Ok(ready)
    }

    /// Creates a machine that joined the cluster long ago and is off now: a kwok Node carrying a
    /// kubelet's labels plus `labels`, that went Ready, whose kubelet then stopped; returns it
    /// once kube-controller-manager has marked it Ready=Unknown.
    pub async fn add_stopped_machine(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Node> {
        self.ensure(Components::CLUSTER).await?;
        self.add_machine(name, vec![], simulator::kubelet::kubelet_labels(name, labels)).await?;
        self.stop_kubelet(name).await?;
        self.until_unknown(name).await
    }

    /// Stops the kubelet of Node `name`, as when its machine crashes or loses power: its
    /// heartbeats stop (kube-controller-manager marks it Ready=Unknown after its grace period)
    /// and kwok leaves the pods bound to it alone. Fails if the Node does not exist.
    pub async fn stop_kubelet(&self, name: &str) -> Result<()> {
        let existed = simulator::kubelet::stop(&self.client()?, name)
            .await
            .with_context(|| format!("stopping the kubelet of {name}"))?;
        anyhow::ensure!(existed, "no Node {name} whose kubelet could stop");
        Ok(())
    }

    /// Starts the kubelet of Node `name` again (its machine booted): kwok turns it Ready.
    pub async fn start_kubelet(&self, name: &str) -> Result<()> {
        let existed = simulator::kubelet::resume(&self.client()?, name, false)
            .await
            .with_context(|| format!("starting the kubelet of {name}"))?;
        anyhow::ensure!(existed, "no Node {name} whose kubelet could start");
        Ok(())
    }

    /// Waits until kube-controller-manager has marked Node `name` Ready=Unknown.
    pub async fn until_unknown(&self, name: &str) -> Result<Node> {
        let nodes: Api<Node> = Api::all(self.client()?);
        let started = Instant::now();
        let node = wait::until(
            &format!("kube-controller-manager to mark Node {name} Ready=Unknown"),
            wait::start_timeout(),
            || self.controller_manager.get().map_or(Ok(()), Process::ensure_running),
            || async {
                let node = nodes.get(name).await?;
                let ready = ready_status(&node);
                anyhow::ensure!(ready == Some("Unknown"), "Node {name} is Ready={ready:?}");
                Ok(node)
            },
        )
        .await?;
        progress(&format!("machine {name} Unknown in {:.1?}", started.elapsed()));
        Ok(node)
    }

    /// Deletes the Node `name` and waits until it is gone.
    pub async fn remove_machine(&self, name: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client()?);
        let Some(node) =
            nodes.get_opt(name).await.with_context(|| format!("reading Node {name}"))?
        else {
            return Ok(());
        };
        let uid = node.uid().unwrap_or_default();
        nodes
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting Node {name}"))?;
        tokio::time::timeout(
            wait::start_timeout(),
            await_condition(nodes, name, conditions::is_deleted(&uid)),
        )
        .await
        .with_context(|| format!("Node {name} still exists after {:?}", wait::start_timeout()))?
        .with_context(|| format!("watching Node {name}"))?;
        Ok(())
    }
}

/// The status of the node's Ready condition (`True`, `False`, `Unknown`), if it has one.
pub fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str())
}

/// Whether the node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status.as_ref().and_then(|status| status.conditions.as_ref()).is_some_and(|conditions| {
        conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
    })
}
