//! The scenarios several suites and `make demo` play, each a sequence of timed, narrated steps:
//! the built-in scaler's scale-up and scale-down (tests/e2e_builtin.rs, tests/install_rbac.rs,
//! the demo), a claim by hand (tests/e2e_manual.rs, tests/e2e_failover.rs,
//! tests/reliability_logs.rs) and cluster-autoscaler's scale-up and scale-down
//! (tests/e2e_cluster_autoscaler.rs, tests/e2e_metrics.rs, the demo), and a machine that sleeps
//! and wakes (the demo on real machines). A scenario one suite
//! plays lives in that suite's file.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use homelab_autoscaler::api::NodeClaimPhase;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::autoscaler_steps::{ScaleUpBreakdown, Workload, describe, released_by_autoscaler};
use super::{ACT, Autoscaler, NAMESPACE, World};
use crate::claims::phase;

/// Long enough for cluster-autoscaler's loop (2 s), a simulated boot and the gate.
const CA_ACT: Duration = Duration::from_secs(150);

/// How long a settled scale-up must stay as it is: two passes of the built-in scaler (10 s).
const SETTLED: Duration = Duration::from_secs(25);

/// Down to zero: the pool's hold or cluster-autoscaler's unneeded time, the drain, the shutdown
/// Job, the kubelet going silent (kube-controller-manager's 20 s) and the Node removed, on a
/// loaded machine.
const BACK_TO_ZERO: Duration = Duration::from_secs(240);
use crate::{eventually, stays};

/// One machine's scale-up, pod pending → Running, booted cold and woken from sleep in the same
/// run ([`World::cold_boot_sleep_and_wake`]).
#[derive(Clone, Debug)]
pub struct SideBySide {
    /// The machine's Node (the same in both).
    pub machine: String,
    pub cold: ScaleUpBreakdown,
    pub resumed: ScaleUpBreakdown,
}

/// The `spec.power.suspend` of the sleeping pool's slots: the machines' sshd puts a machine to
/// sleep on `systemctl suspend`, silent for 3 s to count.
fn idle_suspend() -> serde_json::Value {
    json!({ "command": "systemctl suspend", "quietSeconds": 3 })
}

impl World {
    /// Scenario: a Deployment of `replicas` pods that fit only the pool scales it up, and scaling
    /// the Deployment to zero brings the pool back to zero.
    pub async fn builtin_scale_up_and_down(&mut self, replicas: i32) -> Result<()> {
        let t = Instant::now();
        self.apply_pool("pool.yaml").await?;
        self.note("applied examples/pool.yaml: group `workers`, slots mini-1, mini-2, big-1", t);

        let t = Instant::now();
        self.deploy(&Workload::on_group("web", "workers", replicas, "1")).await?;
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), "default");
        self.note(
            format!("created Deployment web with {replicas} pods that only the pool can run"),
            t,
        );

        let t = Instant::now();
        let claims = self.claims();
        let want = usize::try_from(replicas)?;
        // The ledger holds every claim ever made (a released one is deleted from the API).
        let ledger = self.ledger.clone();
        let made = || {
            let ledger = ledger.lock().map(|l| l.clone()).unwrap_or_default();
            ledger.values().filter(|c| c.spec.request.group == "workers").count()
        };
        eventually("a claim for every pending pod", ACT, || async {
            ensure!(made() >= want, "{} claims, want {want}", made());
            Ok(())
        })
        .await?;
        self.note(format!("the built-in scaler created {} claims", made()), t);

        let t = Instant::now();
        eventually("every claim ready", ACT, || async {
            let list = claims.list(&ListParams::default()).await?.items;
            let ready = list
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase) == Some(NodeClaimPhase::Ready))
                .count();
            ensure!(ready >= want, "{ready} of {want} ready");
            Ok(())
        })
        .await?;
        self.note(format!("{want} machines booted, passed the readiness gate, claims ready"), t);

        let t = Instant::now();
        // Every pod has its machine: exactly one claim each, and no later pass of the scaler
        // adds one.
        ensure!(made() == want, "{} claims were made for {want} pods", made());
        stays(&format!("exactly {want} claims"), SETTLED, || async {
            ensure!(made() == want, "{} claims were made for {want} pods", made());
            Ok(())
        })
        .await?;
        self.note(format!("exactly {want} claims, and still {want} {SETTLED:?} later"), t);

        let t = Instant::now();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        eventually("every pod running", ACT, || async {
            let list = pods.list(&ListParams::default().labels("app=web")).await?.items;
            let running = list
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            ensure!(running == want, "{running} of {want} running");
            Ok(())
        })
        .await?;
        self.note(format!("{want} pods Running on the pool"), t);
        self.record_scale_up("web", "workers").await?;

        let t = Instant::now();
        deployments
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": { "replicas": 0 } })),
            )
            .await?;
        eventually("the pool back at zero", BACK_TO_ZERO, || async {
            let live = claims.list(&ListParams::default()).await?.items.into_iter().filter(|c| {
                matches!(
                    c.status.as_ref().and_then(|s| s.phase),
                    None | Some(
                        NodeClaimPhase::Pending | NodeClaimPhase::Booting | NodeClaimPhase::Ready
                    )
                )
            });
            let live = live.count();
            let nodes = self.nodes_of_group("workers").await?;
            ensure!(live == 0 && nodes.is_empty(), "{live} live claims, Nodes left: {nodes:?}");
            Ok(())
        })
        .await?;
        self.note(
            "scaled web to 0: after the hold, machines drained and powered off, pool at 0",
            t,
        );
        Ok(())
    }

    /// Scenario (real machines only): a machine that sleeps instead of powering off, its cold
    /// boot and its resume timed side by side ([`World::sleeping_pool`], then
    /// [`World::cold_boot_sleep_and_wake`]).
    pub async fn builtin_sleep_and_wake(&mut self) -> Result<SideBySide> {
        self.sleeping_pool().await?;
        self.cold_boot_sleep_and_wake().await
    }

    /// The demo's pool on real machines whose slots sleep when idle (`spec.power.suspend`), and
    /// Deployment `web`, with no pod yet, whose pods only the pool can run.
    pub async fn sleeping_pool(&mut self) -> Result<()> {
        let real = self.real_pool_mut().context("the sleep scenario needs real machines")?;
        real.sleep_when_idle(Some(idle_suspend()));
        let t = Instant::now();
        self.apply_pool("pool.yaml").await?;
        self.note("applied examples/pool.yaml, each slot with spec.power.suspend", t);
        self.deploy(&Workload::on_group("web", "workers", 0, "1")).await?;
        Ok(())
    }

    /// One pod of `web` boots a machine of the sleeping pool cold (every machine off, no Node);
    /// scaled away, the built-in scaler releases the machine and it sleeps, its Node kept and
    /// marked `Suspended`; the next pod wakes it by a magic packet. Each scale-up is split
    /// step by step. Leaves the woken machine running `web`'s pod.
    pub async fn cold_boot_sleep_and_wake(&mut self) -> Result<SideBySide> {
        let present = self.nodes_of_group("workers").await?;
        ensure!(present.is_empty(), "a cold boot needs every machine off; Nodes: {present:?}");
        let real = self.real_pool().context("the sleep scenario needs real machines")?;
        let booted_before: Vec<(String, u32)> =
            real.machines().map(|m| (m.name().to_owned(), m.boots())).collect();
        let t = Instant::now();
        self.scale("web", 1).await?;
        let node = self.one_pod_running("web").await?;
        let (boots, resumes) = self.real_machine_counts(&node)?;
        let before = booted_before.iter().find(|(name, _)| *name == node).map(|(_, n)| *n);
        ensure!(
            before.is_some_and(|n| boots == n + 1),
            "{node} booted once for the pod: boots {before:?} → {boots}"
        );
        self.note(format!("scaled web to 1: its pod Running on {node}, a cold boot"), t);
        let cold = self.record_scale_up("web", "workers").await?;

        let t = Instant::now();
        self.scale("web", 0).await?;
        self.no_live_claims("workers", BACK_TO_ZERO).await?;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        eventually(&format!("{node} asleep, its Node marked Suspended"), BACK_TO_ZERO, || async {
            let found = nodes.get(&node).await?;
            ensure!(homelab_autoscaler::machine::is_suspended(&found), "not marked yet");
            Ok(())
        })
        .await?;
        self.note(format!("scaled web to 0: {node} drained and asleep, its Node kept"), t);

        let t = Instant::now();
        self.scale("web", 1).await?;
        let woken = self.one_pod_running("web").await?;
        ensure!(woken == node, "the pod runs on {woken}, not on {node}, the machine asleep");
        let (boots_after, resumes_after) = self.real_machine_counts(&node)?;
        ensure!(
            boots_after == boots && resumes_after == resumes + 1,
            "{node} resumed once and did not boot again: boots {boots} → {boots_after}, \
             resumes {resumes} → {resumes_after}"
        );
        self.note(format!("scaled web to 1: {node} woken by a magic packet"), t);
        let resumed = self.record_scale_up("web", "workers").await?;
        Ok(SideBySide { machine: node, cold, resumed })
    }

    /// From a sleeping pool running `web`'s pod to every machine off: the slots stop sleeping
    /// (a person removes `spec.power.suspend`), `web` goes to zero, the machine is powered off
    /// and its Node goes; then the slots sleep when idle again. Leaves the pool ready for the
    /// next [`World::cold_boot_sleep_and_wake`].
    pub async fn power_off_sleeping_pool(&mut self) -> Result<()> {
        let t = Instant::now();
        let real = self.real_pool_mut().context("the sleep scenario needs real machines")?;
        real.sleep_when_idle(None);
        self.apply_pool("pool.yaml").await?;
        self.scale("web", 0).await?;
        self.no_live_claims("workers", BACK_TO_ZERO).await?;
        eventually("every machine off, its Node gone", BACK_TO_ZERO, || async {
            let nodes = self.nodes_of_group("workers").await?;
            ensure!(nodes.is_empty(), "Nodes left: {nodes:?}");
            Ok(())
        })
        .await?;
        let real = self.real_pool_mut().context("the sleep scenario needs real machines")?;
        real.sleep_when_idle(Some(idle_suspend()));
        self.apply_pool("pool.yaml").await?;
        self.note("suspend off, web scaled to 0: the machine powered off, its Node gone", t);
        Ok(())
    }

    /// How many times the real machine `node` has booted and resumed.
    fn real_machine_counts(&self, node: &str) -> Result<(u32, u32)> {
        let real = self.real_pool().context("real machines")?;
        let machine = real.machine(node).with_context(|| format!("no real machine {node}"))?;
        Ok((machine.boots(), machine.resumes()))
    }

    /// Waits until one pod of `app` is Running; returns its node.
    async fn one_pod_running(&self, app: &str) -> Result<String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), "default");
        eventually(&format!("a pod of {app} Running"), ACT, || async {
            let list = pods.list(&ListParams::default().labels(&format!("app={app}"))).await?;
            let running = list.items.into_iter().find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            let running = running.context("none yet")?;
            running.spec.and_then(|s| s.node_name).context("no node")
        })
        .await
    }

    /// Records the scale-up of `group` for `app` split step by step (the World's timeline, in
    /// milliseconds): one summary step with the operator's largest share, and the table.
    async fn record_scale_up(&mut self, app: &str, group: &str) -> Result<ScaleUpBreakdown> {
        let split = self.scale_up_breakdown(app, group).await?;
        self.record(
            format!(
                "pod pending → Running {:.1}s; the operator's own share at most {} ms a machine",
                split.total.as_secs_f64(),
                split.operator_max().as_millis()
            ),
            split.total,
        );
        self.table(split.table());
        Ok(split)
    }

    /// Scenario: a person starts a machine by hand with a bare NodeClaim (admission stamps it),
    /// and powers it off again by deleting the claim.
    pub async fn manual_claim(&mut self) -> Result<()> {
        let t = Instant::now();
        self.apply_pool("pool.yaml").await?;
        self.note("applied examples/pool.yaml", t);

        let t = Instant::now();
        let name = self.create_manual_claim().await?;
        let manifest = crate::repo_path("examples/manual-claim.yaml");
        let claims = self.claims();
        let claim = claims.get(&name).await?;
        ensure!(
            claim.spec.requested_by.as_deref() == Some("admin"),
            "admission stamps the requester: {:?}",
            claim.spec.requested_by
        );
        ensure!(
            claim.spec.attempt == Some(1) && claim.spec.deadline_at.is_some(),
            "admission stamps attempt and deadline: {:?}",
            claim.spec
        );
        self.note(
            format!(
                "created {name} by hand; admission stamped requestedBy, attempt 1 and the deadline"
            ),
            t,
        );

        let t = Instant::now();
        let second = self
            .plane
            .kubectl(["create", "-n", NAMESPACE, "-f", &manifest.to_string_lossy()])
            .await?;
        let refusal = String::from_utf8_lossy(&second.stderr).into_owned();
        ensure!(
            !second.status.success() && refusal.contains("already has live claim"),
            "a second live claim is refused: {refusal}"
        );
        self.note("a second claim for the same slot was refused at admission", t);

        let t = Instant::now();
        eventually("the manual claim ready", ACT, || async {
            let claim = claims.get(&name).await?;
            let phase = claim.status.as_ref().and_then(|s| s.phase);
            ensure!(
                phase == Some(NodeClaimPhase::Ready) && claim.spec.deadline_at.is_none(),
                "phase {phase:?}"
            );
            Ok(())
        })
        .await?;
        self.note("the machine booted and the claim is ready (its deadline cleared)", t);

        let t = Instant::now();
        self.kubectl(&["delete", "nodeclaim", "-n", NAMESPACE, &name, "--wait=false"]).await?;
        eventually("the machine off, its Node deleted and the claim released", ACT, || async {
            let gone = claims.get_opt(&name).await?.is_none();
            let nodes = self.nodes_of_group("workers").await?;
            ensure!(gone && nodes.is_empty(), "claim gone: {gone}, Nodes left: {nodes:?}");
            Ok(())
        })
        .await?;
        self.note(
            "deleted the claim: the machine was drained and powered off, the claim released",
            t,
        );
        Ok(())
    }

    /// Scenario: `replicas` pods that need one machine each scale the pool 0 → N through
    /// cluster-autoscaler, exactly N claims, and back to 0 through its scale-down.
    pub async fn autoscaler_scale_up_and_down(
        &mut self,
        ca: &Autoscaler,
        replicas: i32,
    ) -> Result<()> {
        let t = Instant::now();
        self.apply_pool("pool-cluster-autoscaler.yaml").await?;
        self.note(
            "applied examples/pool-cluster-autoscaler.yaml: group `workers`, slots mini-1..3",
            t,
        );

        let t = Instant::now();
        let want = usize::try_from(replicas)?;
        self.deploy(&Workload::on_group("web", "workers", replicas, "3")).await?;
        let apart =
            if self.real_pool().is_some() { "kept apart by anti-affinity" } else { "of 3 CPUs" };
        self.note(format!("created Deployment web: {replicas} pods {apart}, one per machine"), t);

        let t = Instant::now();
        let nodes =
            self.pods_running("web", want, CA_ACT).await.with_context(|| ca.log_tail(40))?;
        self.note(
            format!("cluster-autoscaler scaled the pool up; {want} pods Running on {nodes:?}"),
            t,
        );
        self.record_scale_up("web", "workers").await?;

        let t = Instant::now();
        self.settled_without_double_boot(ca, "workers", want).await?;
        let status = Autoscaler::status(&self.client).await?;
        let workers = status.group("workers").context("workers in CA's status")?;
        ensure!(
            workers.health.cloud_provider_target == i64::from(replicas)
                && workers.health.node_counts.registered.ready == i64::from(replicas),
            "CA's status ConfigMap: target {} and {} ready, want {replicas}",
            workers.health.cloud_provider_target,
            workers.health.node_counts.registered.ready
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
        self.pool_at_zero("workers", BACK_TO_ZERO).await.with_context(|| ca.log_tail(40))?;
        let claims = self.claims_made_by_increase_size("workers", want)?;
        ensure!(
            claims
                .iter()
                .all(|c| phase(c) == NodeClaimPhase::Completed && released_by_autoscaler(c)),
            "every claim completed by cluster-autoscaler's DeleteNodes:\n{}",
            describe(&claims)
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
}
