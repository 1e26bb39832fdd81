//! The steps a World takes with the real cluster-autoscaler driving the pool: apply a pool,
//! deploy a workload and wait for its pods, count the claims cluster-autoscaler made (from the
//! World's ledger), wait for its loops. The suites' scenarios are built from them, in the test
//! files; what cluster-autoscaler did is read from its metrics, its status ConfigMap and the
//! requests on the claims it caused, not only from our side.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{ClaimCall, Node as Slot, NodeClaim, NodeClaimPhase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::autoscaler::{LOOP_ON_LOAD, SCAN_INTERVAL};
use super::{Autoscaler, NAMESPACE, World};
use crate::claims::phase;
use crate::eventually;
use crate::machine::PAUSE_IMAGE;
use crate::timeline::{Seen, between};

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

    /// `kubectl patch group <group> --type merge` in the operator's namespace, as a person edits
    /// a pool.
    pub async fn patch_group(&self, group: &str, patch: &serde_json::Value) -> Result<()> {
        let patch = patch.to_string();
        let args =
            ["patch", "group", group, "-n", super::NAMESPACE, "--type", "merge", "-p", &patch];
        self.kubectl(&args).await?;
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

    /// Waits until no claim of `group` is live; a machine asleep keeps its Node.
    pub async fn no_live_claims(&self, group: &str, within: Duration) -> Result<()> {
        eventually(&format!("no live claim of group {group}"), within, || async {
            let claims = self.all_claims().await?;
            let live = claims.iter().filter(|c| c.spec.request.group == group && is_live(c));
            let live: Vec<String> = live.map(|c| c.name_any()).collect();
            ensure!(live.is_empty(), "live claims: {live:?}");
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

    /// Where the time from "pod pending" to "pod Running" went in the last scale-up of
    /// `group` for the pods of `app`, machine by machine, from the World's timeline
    /// (millisecond resolution): the claims made since the first pod appeared, each through
    /// its startup Job, its Node and the readiness gate.
    pub async fn scale_up_breakdown(&self, app: &str, group: &str) -> Result<ScaleUpBreakdown> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let selector = format!("app={app}");
        let names: Vec<String> = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        let t = &self.timeline;
        let created = names.iter().filter_map(|n| t.at(Seen::PodCreated, n)).min();
        let running = names.iter().filter_map(|n| t.at(Seen::PodRunning, n)).max();
        let (Some(created), Some(running)) = (created, running) else {
            anyhow::bail!(
                "the timeline has no pod of {app} created ({created:?}) or Running ({running:?})"
            );
        };
        let slots: Api<Slot> = Api::namespaced(self.client.clone(), NAMESPACE);
        let mut machines = Vec::new();
        for claim in self.claims_seen(group) {
            let name = claim.name_any();
            let Some(claimed) = t.at(Seen::ClaimCreated, &name).filter(|at| *at >= created) else {
                continue;
            };
            let node = slots.get(&claim.spec.slot_ref.name).await?.spec.kubernetes_node_name;
            let at = |seen: Seen| t.at(seen, &name);
            let (Some(job), Some(job_done), Some(ready)) = (
                at(Seen::StartupJobCreated),
                at(Seen::StartupJobComplete),
                at(Seen::ClaimPhase(NodeClaimPhase::Ready)),
            ) else {
                continue;
            };
            // A machine woken from sleep does not register: its kubelet reports Ready again.
            let registered = t
                .at_since(Seen::NodeRegistered, &node, claimed)
                .or_else(|| t.at_since(Seen::NodeReady, &node, claimed));
            let (Some(registered), Some(usable)) =
                (registered, t.at_since(Seen::NodeUsable, &node, claimed))
            else {
                continue;
            };
            let called = t.last_between(Seen::IncreaseSizeCalled, group, created, claimed);
            // A machine quicker than its Job registers, even turns usable, before the Job is
            // seen complete, and the gate cannot pass before the Job has: each step after the
            // Job starts when the Job ended, so the steps add up to pod created → claim ready.
            let after_job = |at: Instant| at.max(job_done);
            machines.push(MachineSteps {
                slot: claim.spec.slot_ref.name.clone(),
                decided: between(created, called.unwrap_or(claimed)),
                provider: called.map(|at| between(at, claimed)),
                claim_to_job: between(claimed, job),
                job: between(job, job_done),
                boot: between(job_done, registered),
                registered_to_usable: between(after_job(registered), usable),
                gate: between(after_job(usable), ready),
                ready,
            });
        }
        ensure!(
            !machines.is_empty(),
            "no claim of {group} was seen from creation to ready after the first pod of {app}"
        );
        let last_ready = machines.iter().map(|m| m.ready).max().unwrap_or(running);
        Ok(ScaleUpBreakdown {
            total: between(created, running),
            ready_to_running: between(last_ready, running),
            machines,
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
    /// moves every loop), so a decision it would take has been taken. The wait counts loops, not
    /// seconds: each may take its interval and what a loaded machine adds.
    pub async fn quiet_loops(&self, ca: &Autoscaler, loops: u32) -> Result<()> {
        let start = main_loops(ca).await?;
        eventually(
            &format!("{loops} more cluster-autoscaler loops"),
            (SCAN_INTERVAL + LOOP_ON_LOAD) * loops,
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

/// Reads one step of a machine (none: the step did not happen, as IncreaseSize under the
/// built-in scaler).
type StepOf = fn(&MachineSteps) -> Option<Duration>;

/// One machine's steps from "pod pending" to its claim ready.
#[derive(Clone, Debug)]
pub struct MachineSteps {
    pub slot: String,
    /// The first pod created → the IncreaseSize that made the claim (cluster-autoscaler's
    /// decision) or, with no IncreaseSize, → the claim created (the built-in scaler's).
    pub decided: Duration,
    /// IncreaseSize logged → the claim seen: the operator's provider.
    pub provider: Option<Duration>,
    /// The claim seen → its startup Job seen: the operator's claim controller.
    pub claim_to_job: Duration,
    /// The startup Job seen → complete: the power Job's pod, scheduled and run (and whatever
    /// part of the machine's boot happened meanwhile).
    pub job: Duration,
    /// The Job complete → the machine's Node registered: the machine's boot (for a machine woken
    /// from sleep, its kubelet's Node Ready again: the resume); zero if it registered first.
    pub boot: Duration,
    /// Registered (or the Job complete, if later) → Ready and free of the pool's readiness
    /// taints: the kubelet and the network.
    pub registered_to_usable: Duration,
    /// Usable (or the Job complete, if later) → the claim ready: the operator's readiness gate
    /// (its checks, the uncordon, the status write).
    pub gate: Duration,
    ready: Instant,
}

impl MachineSteps {
    /// The operator's own share: the provider, the claim controller and the gate.
    pub fn operator(&self) -> Duration {
        self.provider.unwrap_or_default() + self.claim_to_job + self.gate
    }
}

/// Where the time from "pod pending" to "pod Running" went, machine by machine.
#[derive(Clone, Debug)]
pub struct ScaleUpBreakdown {
    /// The first pod created → the last pod Running.
    pub total: Duration,
    pub machines: Vec<MachineSteps>,
    /// The last claim ready → the last pod Running: the scheduler and the kubelet.
    pub ready_to_running: Duration,
}

impl ScaleUpBreakdown {
    /// The largest operator share of any machine.
    pub fn operator_max(&self) -> Duration {
        self.machines.iter().map(MachineSteps::operator).max().unwrap_or_default()
    }

    /// A table: one row per step, one column per machine, in milliseconds.
    pub fn table(&self) -> String {
        let ms = |d: Duration| format!("{:>9}", d.as_millis());
        let mut out = format!("{:<56}", "step (ms), per machine");
        for m in &self.machines {
            out.push_str(&format!("{:>9}", m.slot));
        }
        let rows: [(&str, StepOf); 8] = [
            ("pods created → IncreaseSize / claim (the scaler)", |m| Some(m.decided)),
            ("IncreaseSize → claim seen (operator: provider)", |m| m.provider),
            ("claim → startup Job seen (operator: claim controller)", |m| Some(m.claim_to_job)),
            ("startup Job → complete (its pod scheduled and run)", |m| Some(m.job)),
            ("Job complete → Node registered (boot) or Ready (resume)", |m| Some(m.boot)),
            ("registered → Ready, untainted (kubelet, network)", |m| {
                Some(m.registered_to_usable)
            }),
            ("usable → claim ready (operator: readiness gate)", |m| Some(m.gate)),
            ("operator's own share", |m| Some(m.operator())),
        ];
        for (name, value) in rows {
            out.push_str(&format!("\n{name:<56}"));
            for m in &self.machines {
                out.push_str(&value(m).map_or_else(|| format!("{:>9}", "-"), ms));
            }
        }
        out.push_str(&format!(
            "\n{:<56}{}",
            "last claim ready → last pod Running (scheduler, kubelet)",
            ms(self.ready_to_running)
        ));
        out
    }
}
