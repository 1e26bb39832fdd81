//! Scenarios with the real cluster-autoscaler driving the pool, shared by the test suite
//! (tests/e2e_cluster_autoscaler.rs asserts them) and `make demo` (which narrates the first).
//! Each checks what cluster-autoscaler did (its metrics, its status ConfigMap, the requests on
//! the claims it caused), not only our side.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{ClaimCall, NodeClaim, NodeClaimPhase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Autoscaler, NAMESPACE, World};
use crate::eventually;

/// Long enough for cluster-autoscaler's loop (2 s), a simulated boot and the gate.
const ACT: Duration = Duration::from_secs(150);

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

fn phase(claim: &NodeClaim) -> NodeClaimPhase {
    homelab_autoscaler::phase::of(claim)
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
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": { "name": w.name, "namespace": "default" },
            "spec": {
                "replicas": w.replicas,
                "selector": { "matchLabels": { "app": w.name } },
                "template": {
                    "metadata": { "labels": { "app": w.name } },
                    "spec": {
                        "nodeSelector": w.node_selector,
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{ "name": "app", "image": "nginx:1.27", "resources": { "requests": { "cpu": w.cpu } } }],
                    },
                },
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

    /// Waits until no claim of `group` is live and none of its machines is up.
    pub async fn pool_at_zero(&self, group: &str, within: Duration) -> Result<()> {
        let nodes: Api<CoreNode> = Api::all(self.client.clone());
        eventually(&format!("group {group} back at zero"), within, || async {
            let live = self
                .all_claims()
                .await?
                .into_iter()
                .filter(|c| c.spec.request.group == group && is_live(c))
                .count();
            let up = nodes
                .list(
                    &ListParams::default().labels(&format!("infra.homecluster.dev/group={group}")),
                )
                .await?
                .items
                .len();
            ensure!(live == 0 && up == 0, "{live} live claims, {up} machines up");
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

    /// Scenario 1: `replicas` pods that need one machine each scale the pool 0 → N through
    /// cluster-autoscaler, exactly N claims, and back to 0 through its scale-down.
    pub async fn autoscaler_scale_up_and_down(
        &mut self,
        ca: &Autoscaler,
        replicas: i32,
    ) -> Result<()> {
        let t = Instant::now();
        self.apply_example("pool-cluster-autoscaler.yaml").await?;
        self.note(
            "applied examples/pool-cluster-autoscaler.yaml: group `workers`, slots mini-1..3",
            t,
        );

        let t = Instant::now();
        let want = usize::try_from(replicas)?;
        self.deploy(&Workload::on_group("web", "workers", replicas, "3")).await?;
        self.note(format!("created Deployment web: {replicas} pods of 3 CPUs, one per machine"), t);

        let t = Instant::now();
        let nodes = self.pods_running("web", want, ACT).await.with_context(|| ca.log_tail(40))?;
        self.note(
            format!("cluster-autoscaler scaled the pool up; {want} pods Running on {nodes:?}"),
            t,
        );

        // A few more of cluster-autoscaler's loops: a double boot would show now.
        let t = Instant::now();
        self.quiet_loops(ca, 5).await?;
        let claims = self.claims_made_by_increase_size("workers", want)?;
        ensure!(
            claims.iter().all(|c| phase(c) == NodeClaimPhase::Ready),
            "every claim ready: {:?}",
            claims.iter().map(phase).collect::<Vec<_>>()
        );
        let scaled_up = ca.metric("cluster_autoscaler_scaled_up_nodes_total").await?;
        ensure!(
            scaled_up == f64::from(replicas),
            "CA counts {scaled_up} nodes scaled up, want {replicas}"
        );
        self.note(
            format!(
                "exactly {want} claims, all from IncreaseSize; CA counted {scaled_up} nodes up"
            ),
            t,
        );

        let t = Instant::now();
        self.scale("web", 0).await?;
        self.pool_at_zero("workers", Duration::from_secs(240))
            .await
            .with_context(|| ca.log_tail(40))?;
        let claims = self.claims_made_by_increase_size("workers", want)?;
        ensure!(
            claims.iter().all(|c| phase(c) == NodeClaimPhase::Completed
                && c.status.as_ref().and_then(|s| s.scale_down_requested_by.as_deref())
                    == Some("cluster-autoscaler")),
            "every claim completed by cluster-autoscaler's DeleteNodes: {:?}",
            claims
                .iter()
                .map(|c| (
                    phase(c),
                    c.status.as_ref().and_then(|s| s.scale_down_requested_by.clone())
                ))
                .collect::<Vec<_>>()
        );
        let scaled_down = ca.metric("cluster_autoscaler_scaled_down_nodes_total").await?;
        ensure!(
            scaled_down == f64::from(replicas),
            "CA counts {scaled_down} nodes scaled down, want {replicas}"
        );
        self.note(
            "scaled web to 0: CA's scale-down → DeleteNodes → drained, powered off, pool at 0",
            t,
        );
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
