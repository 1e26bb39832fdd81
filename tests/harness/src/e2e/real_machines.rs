//! Scenarios with the real cluster-autoscaler on machines that behave as real homelab machines
//! do, not as cloud VMs: each joined the cluster once, and its kubelet (the simulator's) keeps
//! its Node when the machine is off and finds it again at boot. cluster-autoscaler reads a Node
//! that outlives its machine as an unready instance, never as upcoming once it is older than
//! its startup time, and stops scaling the whole cluster past a few unready nodes; these
//! scenarios fail if it double-boots, stalls or deletes a serving machine. The pool is
//! tests/harness/manifests/pool-real-machines.yaml (group `homes`, slots home-1..4).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::{Node as Slot, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::simulator::kubelet::DISTRIBUTION_ANNOTATION;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use super::autoscaler::sum_samples;
use super::autoscaler_scenarios::{describe, released_by_autoscaler};
use super::{Autoscaler, NAMESPACE, Workload, World};
use crate::eventually;

/// The slots of the pool, cheapest-first order being name order (they cost the same).
pub const REAL_MACHINE_SLOTS: [&str; 4] = ["home-1", "home-2", "home-3", "home-4"];
const POOL: &str = "tests/harness/manifests/pool-real-machines.yaml";
const GROUP: &str = "homes";
/// Long enough for cluster-autoscaler's loop (2 s), a simulated boot and the gate.
const ACT: Duration = Duration::from_secs(150);
/// Down to zero: CA's unneeded time, the drain, the shutdown Job, the kubelet going silent
/// (kube-controller-manager's 20 s) and the operator removing the Node.
const BACK_TO_ZERO: Duration = Duration::from_secs(240);
/// What cluster-autoscaler logs when it sees what these scenarios guard against.
const TRAPS: [&str; 3] =
    ["unregistered node", "Cluster is not ready for autoscaling", "based on unready"];

fn phase(claim: &NodeClaim) -> NodeClaimPhase {
    homelab_autoscaler::phase::of(claim)
}

impl World {
    /// Applies the pool of four machines.
    pub async fn apply_real_machine_pool(&self) -> Result<()> {
        let path = crate::repo_path(POOL);
        self.kubectl(&["apply", "-n", NAMESPACE, "-f", &path.to_string_lossy()]).await?;
        Ok(())
    }

    /// The Nodes of the pool's machines that exist now, Ready or not.
    async fn pool_nodes(&self) -> Result<Vec<CoreNode>> {
        let nodes: Api<CoreNode> = Api::all(self.client.clone());
        Ok(nodes
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|n| {
                n.metadata.name.as_deref().is_some_and(|name| REAL_MACHINE_SLOTS.contains(&name))
            })
            .collect())
    }

    /// Waits until no machine of the pool has a Node.
    async fn no_pool_nodes(&self, within: Duration) -> Result<()> {
        eventually("no Node left for the pool's machines", within, || async {
            let left: Vec<String> =
                self.pool_nodes().await?.into_iter().filter_map(|n| n.metadata.name).collect();
            ensure!(left.is_empty(), "Nodes still there: {left:?}");
            Ok(())
        })
        .await
    }

    /// cluster-autoscaler's status says the cluster is healthy, and its log has none of the
    /// lines of the traps (from byte `since` of the log on).
    async fn autoscaler_unharmed(&self, ca: &Autoscaler, since: usize) -> Result<()> {
        let status = Autoscaler::status(&self.client).await?;
        let health = &status.cluster_wide.health;
        ensure!(
            health.status != "Unhealthy",
            "CA's status says the cluster is unhealthy: {:?}",
            health.node_counts
        );
        let log = ca.log();
        let tail = log.get(since..).unwrap_or_default();
        for trap in TRAPS {
            let hit = tail.lines().find(|l| l.contains(trap));
            ensure!(hit.is_none(), "CA logged {trap:?}: {}", hit.unwrap_or_default());
        }
        Ok(())
    }

    /// How many DeleteNodes calls the provider has answered (its own metric).
    async fn delete_nodes_calls(&self) -> Result<f64> {
        let body = self.admin_get(0, "/metrics").await?;
        Ok(sum_samples(
            &body,
            "homelab_autoscaler_grpc_requests_total",
            "rpc=\"NodeGroupDeleteNodes\"",
        ))
    }

    /// The one slot every claim of the group named (the scenario boots the same machine).
    fn only_slot(claims: &[NodeClaim]) -> Result<String> {
        let mut slots: Vec<&str> = claims.iter().map(|c| c.spec.slot_ref.name.as_str()).collect();
        slots.dedup();
        ensure!(slots.len() == 1, "claims on several slots:\n{}", describe(claims));
        Ok(slots[0].to_string())
    }

    /// Scenario: the operator is installed over four machines that joined the cluster long ago
    /// and are off now (their Nodes Unknown), beside a Ready node outside the pool. Their
    /// Nodes are removed, and cluster-autoscaler, started then, is never unhealthy and boots
    /// exactly one machine for each of two pods.
    pub async fn autoscaler_over_machines_already_off(
        &mut self,
        ca: &mut Option<Autoscaler>,
        settings: &super::AutoscalerSettings,
    ) -> Result<()> {
        let t = Instant::now();
        let before = self.pool_nodes().await?;
        ensure!(before.len() == REAL_MACHINE_SLOTS.len(), "the off machines' Nodes exist first");
        self.apply_real_machine_pool().await?;
        self.no_pool_nodes(ACT).await?;
        self.note("pool applied over 4 Unknown Nodes: the operator removed every one", t);

        let t = Instant::now();
        let started = ca.insert(self.autoscaler(settings).await?);
        self.deploy(&Workload::on_group("web", GROUP, 2, "3")).await?;
        let nodes = self.pods_running("web", 2, ACT).await?;
        self.settled_without_double_boot(started, GROUP, 2).await?;
        self.autoscaler_unharmed(started, 0).await?;
        self.note(format!("2 pods Running on {nodes:?} with exactly 2 claims; CA healthy"), t);
        Ok(())
    }

    /// Scenario: the same machine boots, goes off and boots again, its kubelet NotReady for a
    /// while after registering. cluster-autoscaler (its startup time cut to 45 s, shorter than
    /// a round) counts the rebooting node as not started both times, and each round takes
    /// exactly one claim.
    pub async fn autoscaler_second_boot_of_the_same_machine(
        &mut self,
        ca: &Autoscaler,
        startup_time: Duration,
    ) -> Result<()> {
        self.apply_real_machine_pool().await?;
        self.slow_kubelets(&REAL_MACHINE_SLOTS, "15s").await?;
        self.deploy(&Workload::on_group("web", GROUP, 0, "3")).await?;
        let mut first_registered: Option<Instant> = None;
        for round in 1..=2usize {
            let t = Instant::now();
            if let Some(at) = first_registered {
                ensure!(
                    at.elapsed() > startup_time,
                    "round 2 began {:?} after the first registration, within CA's startup time {startup_time:?}: a kept Node would still count as starting",
                    at.elapsed()
                );
            }
            self.scale("web", 1).await?;
            let client = self.client.clone();
            eventually("CA counts the booting machine as not started", ACT, || async {
                let status = Autoscaler::status(&client).await?;
                let group = status.group(GROUP).context("homes not in CA's status yet")?;
                let counts = &group.health.node_counts.registered;
                ensure!(
                    counts.not_started == 1 && counts.unready.total == 0,
                    "CA's status: {counts:?}"
                );
                Ok(())
            })
            .await?;
            first_registered.get_or_insert_with(Instant::now);
            let nodes = self.pods_running("web", 1, ACT).await?;
            self.quiet_loops(ca, 5).await?;
            let claims = self.claims_made_by_increase_size(GROUP, round)?;
            let slot = Self::only_slot(&claims)?;
            let live: Vec<&NodeClaim> =
                claims.iter().filter(|c| phase(c) != NodeClaimPhase::Completed).collect();
            ensure!(
                live.len() == 1 && phase(live[0]) == NodeClaimPhase::Ready,
                "round {round}: one ready claim:\n{}",
                describe(&claims)
            );
            self.autoscaler_unharmed(ca, 0).await?;
            self.note(
                format!("round {round}: {slot} booted once, not started to CA, pod on {nodes:?}"),
                t,
            );
            if round == 1 {
                let t = Instant::now();
                self.scale("web", 0).await?;
                self.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
                self.no_pool_nodes(ACT).await?;
                self.note("scaled to 0: the machine is off and has no Node", t);
            }
        }
        Ok(())
    }

    /// Scenario: k3s machines write `k3s://<name>` on their Nodes and the slots declare nothing.
    /// Instances follow the Nodes' providerIDs, so cluster-autoscaler (its provision time cut
    /// to `provision_time`) never takes a serving machine for an unregistered one.
    pub async fn autoscaler_on_k3s_provider_ids(
        &mut self,
        ca: &Autoscaler,
        provision_time: Duration,
    ) -> Result<()> {
        let t = Instant::now();
        self.apply_real_machine_pool().await?;
        for slot in REAL_MACHINE_SLOTS {
            self.annotate_slot(slot, DISTRIBUTION_ANNOTATION, "k3s").await?;
        }
        self.deploy(&Workload::on_group("web", GROUP, 2, "3")).await?;
        let nodes = self.pods_running("web", 2, ACT).await?;
        self.settled_without_double_boot(ca, GROUP, 2).await?;
        let slots: Api<Slot> = Api::namespaced(self.client.clone(), NAMESPACE);
        for node in &nodes {
            let slot = slots.get(node).await?;
            let recorded = slot.status.and_then(|s| s.provider_id);
            ensure!(
                recorded.as_deref() == Some(format!("k3s://{node}").as_str()),
                "slot {node} records providerID {recorded:?}"
            );
        }
        self.note(format!("2 k3s machines up ({nodes:?}), providerIDs followed"), t);

        let t = Instant::now();
        let busy = Instant::now();
        while busy.elapsed() <= provision_time + Duration::from_secs(10) {
            self.quiet_loops(ca, 5).await?;
        }
        let claims = self.claims_made_by_increase_size(GROUP, 2)?;
        ensure!(
            claims.iter().all(|c| phase(c) == NodeClaimPhase::Ready),
            "both machines still serve after CA's provision time:\n{}",
            describe(&claims)
        );
        self.pods_running("web", 2, Duration::from_secs(5)).await?;
        let status = Autoscaler::status(&self.client).await?;
        let group = status.group(GROUP).context("homes in CA's status")?;
        ensure!(
            group.health.node_counts.unregistered == 0
                && group.health.node_counts.registered.ready == 2,
            "CA's counts: {:?}",
            group.health.node_counts
        );
        self.autoscaler_unharmed(ca, 0).await?;
        self.note(format!("busy past CA's {provision_time:?} provision time: nothing deleted"), t);

        let t = Instant::now();
        self.scale("web", 0).await?;
        self.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
        self.note("scaled to 0", t);
        Ok(())
    }

    /// Scenario: cluster-autoscaler restarts (as after a certificate renewal) while the pool's
    /// machines are off. It calls no DeleteNodes for them, logs nothing about unregistered or
    /// unready nodes, and the next scale-up is exact.
    pub async fn autoscaler_restarted_while_machines_are_off(
        &mut self,
        ca: &mut Autoscaler,
    ) -> Result<()> {
        let t = Instant::now();
        self.apply_real_machine_pool().await?;
        self.deploy(&Workload::on_group("web", GROUP, 2, "3")).await?;
        self.pods_running("web", 2, ACT).await?;
        self.settled_without_double_boot(ca, GROUP, 2).await?;
        self.scale("web", 0).await?;
        self.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
        self.no_pool_nodes(ACT).await?;
        self.note("2 machines up and off again: no Node left", t);

        let t = Instant::now();
        let deletes = self.delete_nodes_calls().await?;
        let since = ca.log().len();
        ca.restart().await?;
        self.quiet_loops(ca, 10).await?;
        let after = self.delete_nodes_calls().await?;
        ensure!(
            after == deletes,
            "CA called DeleteNodes {} times after its restart",
            after - deletes
        );
        self.autoscaler_unharmed(ca, since).await?;
        self.note("CA restarted: 10 loops, no DeleteNodes, nothing unready or unregistered", t);

        let t = Instant::now();
        self.scale("web", 1).await?;
        let nodes = self.pods_running("web", 1, ACT).await?;
        self.quiet_loops(ca, 5).await?;
        let claims = self.claims_made_by_increase_size(GROUP, 3)?;
        let live = claims.iter().filter(|c| phase(c) == NodeClaimPhase::Ready).count();
        ensure!(live == 1, "one ready claim after the restart:\n{}", describe(&claims));
        self.note(format!("the next scale-up took exactly one claim: pod on {nodes:?}"), t);
        Ok(())
    }

    /// Scenario: the machine a StatefulSet's pod runs on crashes (its kubelet stops). The claim
    /// fails MachineGone, the machine's Node is removed, and the pod is recreated on another
    /// machine (a pod bound to a Node that exists is never replaced).
    pub async fn autoscaler_replaces_a_statefulset_pod_of_a_machine_gone(
        &mut self,
        ca: &Autoscaler,
    ) -> Result<()> {
        let t = Instant::now();
        self.apply_real_machine_pool().await?;
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": { "name": "db", "namespace": "default" },
            "spec": {
                "replicas": 1,
                "serviceName": "db",
                "selector": { "matchLabels": { "app": "db" } },
                "template": {
                    "metadata": { "labels": { "app": "db" } },
                    "spec": {
                        "nodeSelector": { homelab_autoscaler::api::LABEL_GROUP: GROUP },
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{ "name": "db", "image": "postgres:17", "resources": { "requests": { "cpu": "3" } } }],
                    },
                },
            },
        }))?;
        Api::<StatefulSet>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &set)
            .await?;
        let first = self.pods_running("db", 1, ACT).await?.remove(0);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        let old_uid = pods.get("db-0").await?.metadata.uid;
        self.note(format!("StatefulSet db: pod db-0 Running on {first}"), t);

        let t = Instant::now();
        self.plane.stop_kubelet(&first).await?;
        let nodes: Api<CoreNode> = Api::all(self.client.clone());
        eventually(
            &format!("the Node of the crashed machine {first} to be removed"),
            Duration::from_secs(420),
            || async {
                ensure!(nodes.get_opt(&first).await?.is_none(), "Node {first} still there");
                Ok(())
            },
        )
        .await
        .with_context(|| ca.log_tail(30))?;
        self.note(format!("{first} crashed: its claim failed, its Node was removed"), t);

        let t = Instant::now();
        let placed = eventually("db-0 recreated and Running elsewhere", ACT, || async {
            let pod = pods.get("db-0").await?;
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            ensure!(pod.metadata.uid != old_uid, "still the old pod, on {node}");
            ensure!(running && node != first, "the new pod is on {node:?}, running: {running}");
            Ok(node)
        })
        .await
        .with_context(|| ca.log_tail(30))?;
        let claims = self.claims_seen(GROUP);
        let gone = claims.iter().find(|c| c.spec.slot_ref.name == first);
        ensure!(
            gone.and_then(|c| c.status.as_ref()).and_then(|s| s.reason.as_deref())
                == Some("MachineGone")
                || gone.is_some_and(released_by_autoscaler),
            "the crashed machine's claim ended MachineGone or by CA:\n{}",
            describe(&claims)
        );
        self.note(format!("db-0 recreated on {placed}"), t);
        Ok(())
    }

    /// Scenario: a pod selects a label that only the slots declare (no kubelet registers it).
    /// It runs on the machine after its first and after its second boot, one claim each: the
    /// operator writes the label onto every fresh Node.
    pub async fn autoscaler_declared_labels_come_back(&mut self, ca: &Autoscaler) -> Result<()> {
        self.apply_real_machine_pool().await?;
        let workload = Workload {
            node_selector: BTreeMap::from([
                (homelab_autoscaler::api::LABEL_GROUP.to_string(), GROUP.to_string()),
                ("homelab.test/accelerator".to_string(), "coral".to_string()),
            ]),
            ..Workload::on_group("inference", GROUP, 1, "3")
        };
        self.deploy(&workload).await?;
        for round in 1..=2usize {
            let t = Instant::now();
            let nodes = self.pods_running("inference", 1, ACT).await?;
            self.quiet_loops(ca, 5).await?;
            let claims = self.claims_made_by_increase_size(GROUP, round)?;
            let slot = Self::only_slot(&claims)?;
            self.note(format!("boot {round} of {slot}: the pod runs on {nodes:?}"), t);
            if round == 1 {
                let t = Instant::now();
                self.scale("inference", 0).await?;
                self.pool_at_zero(GROUP, BACK_TO_ZERO).await?;
                self.no_pool_nodes(ACT).await?;
                self.scale("inference", 1).await?;
                self.note("off (Node removed, label gone with it), then asked for again", t);
            }
        }
        Ok(())
    }
}
