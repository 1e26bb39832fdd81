//! The steps a World takes with the real cluster-autoscaler driving the pool: apply a pool,
//! deploy a workload and wait for its pods, count the claims cluster-autoscaler made (from the
//! World's ledger), wait for its loops. The suites' scenarios are built from them, in the test
//! files; what cluster-autoscaler did is read from its metrics, its status ConfigMap and the
//! requests on the claims it caused, not only from our side.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{ClaimCall, NodeClaim, NodeClaimPhase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Autoscaler, NAMESPACE, World};
use crate::claims::phase;
use crate::eventually;
use crate::machine::PAUSE_IMAGE;

/// The annotation that keeps cluster-autoscaler from scaling a node down.
const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

/// A workload: `replicas` pods that only `group` can run, each asking `cpu`.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub replicas: i32,
    pub cpu: String,
    pub node_selector: BTreeMap<String, String>,
}

impl Workload {
    pub fn on_group(name: &str, group: &str, replicas: i32, cpu: &str) -> Self {
        Self {
            name: name.into(),
            replicas,
            cpu: cpu.into(),
            node_selector: BTreeMap::from([(
                homelab_autoscaler::api::LABEL_GROUP.to_string(),
                group.to_string(),
            )]),
        }
    }
}

fn is_live(claim: &NodeClaim) -> bool {
    matches!(
        phase(claim),
        NodeClaimPhase::Pending | NodeClaimPhase::Booting | NodeClaimPhase::Ready
    )
}

impl World {
    /// Applies a manifest of examples/ into the operator's namespace.
    pub async fn apply_example(&self, file: &str) -> Result<()> {
        let path = crate::repo_path(&format!("examples/{file}"));
        self.kubectl(&["apply", "-n", NAMESPACE, "-f", &path.to_string_lossy()]).await?;
        Ok(())
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// Every claim of the namespace, finished ones included (they live for their TTL).
    pub async fn all_claims(&self) -> Result<Vec<NodeClaim>> {
        Ok(self.claims().list(&ListParams::default()).await?.items)
    }

    /// Creates the workload's Deployment.
    pub async fn deploy(&self, w: &Workload) -> Result<()> {
        let mut pod = json!({
            "nodeSelector": w.node_selector,
            "terminationGracePeriodSeconds": 0,
            "containers": [{ "name": "app", "image": "nginx:1.27", "resources": { "requests": { "cpu": w.cpu } } }],
        });
        if self.real_pool().is_some() {
            // A real kubelet reports its host's CPUs, not the slot's declared capacity: a pod
            // asks little and keeps to a machine of its own by anti-affinity instead. No
            // registry serves an image; every machine holds the pause image.
            pod["containers"] = json!([{
                "name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never",
                "resources": { "requests": { "cpu": "100m" } },
            }]);
            pod["affinity"] = json!({ "podAntiAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": [
                { "labelSelector": { "matchLabels": { "app": w.name } }, "topologyKey": "kubernetes.io/hostname" },
            ] } });
        }
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": { "name": w.name, "namespace": "default" },
            "spec": {
                "replicas": w.replicas,
                "selector": { "matchLabels": { "app": w.name } },
                "template": { "metadata": { "labels": { "app": w.name } }, "spec": pod },
            },
        }))?;
        self.deployments().create(&PostParams::default(), &deployment).await?;
        Ok(())
    }

    /// Scales the workload's Deployment.
    pub async fn scale(&self, name: &str, replicas: i32) -> Result<()> {
        let patch = json!({ "spec": { "replicas": replicas } });
        self.deployments().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }

    /// Waits until `want` pods of the workload run; returns the nodes they run on.
    pub async fn pods_running(
        &self,
        name: &str,
        want: usize,
        within: Duration,
    ) -> Result<Vec<String>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        eventually(&format!("{want} pods of {name} Running"), within, || async {
            let list =
                pods.list(&ListParams::default().labels(&format!("app={name}"))).await?.items;
            let running: Vec<String> = list
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
                .collect();
            ensure!(running.len() == want, "{} of {want} running", running.len());
            Ok(running)
        })
        .await
    }

    /// Waits until no claim of `group` is live and none of its machines has a Node (the
    /// operator deletes the Node of a machine it powered off).
    pub async fn pool_at_zero(&self, group: &str, within: Duration) -> Result<()> {
        eventually(&format!("group {group} back at zero"), within, || async {
            let live = self
                .all_claims()
                .await?
                .into_iter()
                .filter(|c| c.spec.request.group == group && is_live(c))
                .count();
            let nodes = self.nodes_of_group(group).await?;
            ensure!(live == 0 && nodes.is_empty(), "{live} live claims, Nodes left: {nodes:?}");
            Ok(())
        })
        .await
    }

    /// Every claim of `group` this World has seen, released and deleted ones included.
    pub fn claims_seen(&self, group: &str) -> Vec<NodeClaim> {
        let ledger = self.ledger.lock().map(|l| l.clone()).unwrap_or_default();
        ledger.into_values().filter(|c| c.spec.request.group == group).collect()
    }

    /// Checks that exactly `want` claims were ever made for `group`, all by cluster-autoscaler's
    /// IncreaseSize; a double boot shows as one more.
    pub fn claims_made_by_increase_size(&self, group: &str, want: usize) -> Result<Vec<NodeClaim>> {
        let claims = self.claims_seen(group);
        let summary = describe(&claims);
        ensure!(
            claims.len() == want,
            "{} claims for {group}, want {want}:\n{summary}",
            claims.len()
        );
        ensure!(
            claims.iter().all(|c| c.spec.request.call == ClaimCall::IncreaseSize),
            "every claim comes from IncreaseSize:\n{summary}"
        );
        Ok(claims)
    }

    /// After five more of cluster-autoscaler's loops (a double boot would show by then), the
    /// group has exactly `want` claims, all from IncreaseSize and all ready: none doubled, none
    /// lost.
    pub async fn settled_without_double_boot(
        &self,
        ca: &Autoscaler,
        group: &str,
        want: usize,
    ) -> Result<()> {
        self.quiet_loops(ca, 5).await?;
        let claims = self.claims_made_by_increase_size(group, want)?;
        ensure!(
            claims.iter().all(|c| phase(c) == NodeClaimPhase::Ready),
            "every claim ready:\n{}",
            describe(&claims)
        );
        Ok(())
    }

    /// Annotates a slot (for example with the simulator's behaviour).
    pub async fn annotate_slot(&self, slot: &str, key: &str, value: &str) -> Result<()> {
        self.kubectl(&[
            "annotate",
            "-n",
            NAMESPACE,
            "node.infra.homecluster.dev",
            slot,
            &format!("{key}={value}"),
            "--overwrite",
        ])
        .await?;
        Ok(())
    }

    /// Makes the slots' simulated kubelets report NotReady for `duration` after registering.
    pub async fn slow_kubelets(&self, slots: &[&str], duration: &str) -> Result<()> {
        use homelab_autoscaler::simulator::{BEHAVIOUR_ANNOTATION, NOT_READY_FOR_ANNOTATION};
        for slot in slots {
            self.annotate_slot(slot, BEHAVIOUR_ANNOTATION, "registers-not-ready").await?;
            self.annotate_slot(slot, NOT_READY_FOR_ANNOTATION, duration).await?;
        }
        Ok(())
    }

    /// Splits the time from the first pod's creation to the last pod Running into
    /// cluster-autoscaler's decision (until its first claim), the simulated machine (startup Job
    /// done → node registered, plus the simulator's gate delay, on the slowest claim) and the
    /// rest, which is this operator and Kubernetes. Object times have 1 s resolution.
    pub async fn scale_up_breakdown(&self, app: &str, group: &str) -> Result<ScaleUpBreakdown> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?.items;
        let created =
            list.iter().filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0)).min();
        let running = list
            .iter()
            .filter_map(|p| {
                let conditions = p.status.as_ref()?.conditions.as_ref()?;
                conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")?
                    .last_transition_time
                    .as_ref()
                    .map(|t| t.0)
            })
            .max();
        let claims = self.claims_seen(group);
        let requested =
            claims.iter().filter_map(|c| c.spec.requested_at.as_ref().map(|t| t.0)).min();
        let (Some(created), Some(running), Some(requested)) = (created, running, requested) else {
            anyhow::bail!(
                "for {app} in {group}: first pod created {created:?}, last Ready {running:?}, first claim requested {requested:?}"
            );
        };
        let jobs: Api<k8s_openapi::api::batch::v1::Job> =
            Api::namespaced(self.client.clone(), NAMESPACE);
        let nodes: Api<CoreNode> = Api::all(self.client.clone());
        let mut boot = Duration::ZERO;
        for claim in &claims {
            let Some(job) = claim.status.as_ref().and_then(|s| s.startup_job.clone()) else {
                continue;
            };
            let done =
                jobs.get_opt(&job).await?.and_then(|j| j.status?.completion_time).map(|t| t.0);
            let registered = nodes
                .get_opt(&claim.spec.slot_ref.name)
                .await?
                .and_then(|n| n.metadata.creation_timestamp)
                .map(|t| t.0);
            if let (Some(done), Some(registered)) = (done, registered) {
                // A simulated machine's gate is a fixed delay; a real one's is in the rest.
                let gate = if self.real_pool().is_some() {
                    Duration::ZERO
                } else {
                    super::SIMULATED_GATE_DELAY
                };
                boot = boot.max(span(done, registered) + gate);
            }
        }
        let total = span(created, running);
        let decision = span(created, requested);
        Ok(ScaleUpBreakdown {
            total,
            decision,
            boot,
            overhead: total.saturating_sub(decision + boot),
        })
    }

    /// cluster-autoscaler leaves `node` on: the operator marked it `scale-down-disabled` (a
    /// machine a person or a schedule wants), and cluster-autoscaler has scaled no node down.
    /// Called once a test has waited past cluster-autoscaler's unneeded time.
    pub async fn autoscaler_left_on(&self, ca: &Autoscaler, node: &str) -> Result<()> {
        let nodes: Api<CoreNode> = Api::all(self.client.clone());
        let found = nodes.get(node).await.with_context(|| format!("{node} is still up"))?;
        let annotations = found.metadata.annotations.unwrap_or_default();
        ensure!(
            annotations.get(SCALE_DOWN_DISABLED).map(String::as_str) == Some("true"),
            "{node} carries {SCALE_DOWN_DISABLED}: {annotations:?}"
        );
        let scaled_down = ca.metric("cluster_autoscaler_scaled_down_nodes_total").await?;
        ensure!(scaled_down == 0.0, "cluster-autoscaler scaled {scaled_down} node(s) down");
        Ok(())
    }

    /// Waits until cluster-autoscaler has run `loops` more loops (its last-activity metric
    /// moves every loop), so a decision it would take has been taken.
    pub async fn quiet_loops(&self, ca: &Autoscaler, loops: u32) -> Result<()> {
        let start = main_loops(ca).await?;
        eventually(
            &format!("{loops} more cluster-autoscaler loops"),
            Duration::from_secs(60),
            || async {
                let now = main_loops(ca).await?;
                ensure!(now >= start + f64::from(loops), "{now} after {start}");
                Ok(())
            },
        )
        .await
    }
}

/// How many loops cluster-autoscaler has run (its `main` function's duration count).
async fn main_loops(ca: &Autoscaler) -> Result<f64> {
    ca.metric_where("cluster_autoscaler_function_duration_seconds_count", "function=\"main\"").await
}

/// One line per claim: what it asked for and how it ended.
pub fn describe(claims: &[NodeClaim]) -> String {
    claims
        .iter()
        .map(|c| {
            let status = c.status.clone().unwrap_or_default();
            format!(
                "{} slot={} call={:?} delta={:?} phase={:?} reason={:?} released_by={:?}",
                c.metadata.name.as_deref().unwrap_or_default(),
                c.spec.slot_ref.name,
                c.spec.request.call,
                c.spec.request.delta,
                phase(c),
                status.reason,
                status.scale_down_requested_by,
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether cluster-autoscaler's DeleteNodes released the claim.
pub fn released_by_autoscaler(claim: &NodeClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.scale_down_requested_by.as_deref())
        .is_some_and(|by| by.starts_with("cluster-autoscaler"))
}

/// Where the time from "pod pending" to "pod Running" went.
#[derive(Clone, Copy, Debug)]
pub struct ScaleUpBreakdown {
    pub total: Duration,
    pub decision: Duration,
    pub boot: Duration,
    pub overhead: Duration,
}

fn span(from: jiff::Timestamp, to: jiff::Timestamp) -> Duration {
    Duration::try_from(to.duration_since(from)).unwrap_or_default()
}
