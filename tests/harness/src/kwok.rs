//! kwok, which plays kubelet for fake nodes, and the machine helpers built on it: a "machine"
//! in a test is a core Node that kwok keeps Ready and whose pods it runs (and, for Job pods,
//! completes) by the stages in tests/harness/kwok/stages.yaml.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, ResourceExt};

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
                    // kwok renews each node's Lease, which keeps kube-controller-manager from
                    // marking the node NotReady.
                    "--node-lease-duration-seconds=40".into(),
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

/// Whether the node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status.as_ref().and_then(|status| status.conditions.as_ref()).is_some_and(|conditions| {
        conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
    })
}
