//! The control plane's own overhead in a scale-up and a scale-down, with a simulated machine
//! that boots in zero time (`homelab-autoscaler simulate --boot-delay=0s --gate-delay=0s`):
//!
//! - IncreaseSize → the claim exists (the provider) → its startup Job exists (the claim
//!   controller);
//! - the startup Job complete → the claim `ready` (split into the simulator registering the
//!   node, kwok making it Ready, and the operator passing the readiness gate);
//! - DeleteNodes → the shutdown Job exists.
//!
//! Every instant is when a watch in this process first saw the change (the harness's timeline),
//! so the watch's own delivery delay is on both ends of each interval.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use homelab_autoscaler::api::{Node as Slot, NodeClaimPhase};
use homelab_autoscaler::grpc::proto;
use homelab_harness::timeline::{Seen, Timeline, between};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::grpc;
use crate::stats::Samples;

const GROUP: &str = "workers";
/// The target for each of the operator's own steps, at p99.
const OPERATOR_STEP_TARGET: Duration = Duration::from_millis(100);

/// The measured intervals over every round.
#[derive(Default)]
pub struct Overheads {
    pub increase_to_claim: Samples,
    pub claim_to_startup_job: Samples,
    pub job_complete_to_ready: Samples,
    pub job_complete_to_node: Samples,
    pub node_to_usable: Samples,
    pub usable_to_ready: Samples,
    pub delete_to_shutdown_job: Samples,
}

/// A Group `workers` with one slot whose lifecycle pods run on the lab node `lab_node`.
pub async fn write_pool(client: &Client, ns: &str, slot: &str, lab: &str) -> Result<()> {
    let groups: Api<homelab_autoscaler::api::Group> = Api::namespaced(client.clone(), ns);
    let group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": GROUP },
        "spec": { "driver": "cluster-autoscaler", "maxNodeProvisionTime": "20m" },
    }))?;
    groups.create(&PostParams::default(), &group).await.context("creating the group")?;
    let slots: Api<Slot> = Api::namespaced(client.clone(), ns);
    let pod = json!({ "image": "busybox", "nodeSelector": { "bench.homecluster.dev/lab": lab } });
    let slot: Slot = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
        "metadata": { "name": slot, "labels": { "group": GROUP } },
        "spec": { "kubernetesNodeName": slot, "nodeCapacity": { "cpu": "4", "memory": "16Gi" },
                  "startupPodSpec": pod, "shutdownPodSpec": pod },
    }))?;
    slots.create(&PostParams::default(), &slot).await.context("creating the slot")?;
    Ok(())
}

/// `rounds` of up (IncreaseSize until the claim is ready) and down (DeleteNodes until the
/// claim is completed and the node gone) on the one slot.
pub async fn run(
    client: &Client,
    ns: &str,
    slot: &str,
    grpc: &mut grpc::Client,
    rounds: usize,
) -> Result<Overheads> {
    const STEP: Duration = Duration::from_secs(60);
    let timeline = Timeline::default();
    // The pool's gate is the Group's default readiness taint, which the simulator registers
    // the node with and lifts after its gate delay (zero here).
    let gate = homelab_autoscaler::api::default_readiness_taints();
    let _watches =
        timeline.watch_claims(client, ns).and(timeline.watch_jobs_and_nodes(client, ns, gate));
    let mut out = Overheads::default();
    for _ in 0..rounds {
        let asked = Instant::now();
        grpc.node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            delta: 1,
            id: GROUP.into(),
        })
        .await
        .context("IncreaseSize")?;
        let (claimed, claim) = timeline.wait_since(Seen::ClaimCreated, asked, STEP).await?;
        let job = timeline.wait_of(Seen::StartupJobCreated, &claim, asked, STEP).await?;
        out.increase_to_claim.push(between(asked, claimed));
        out.claim_to_startup_job.push(between(claimed, job));
        let complete = timeline.wait_of(Seen::StartupJobComplete, &claim, asked, STEP).await?;
        let ready = Seen::ClaimPhase(NodeClaimPhase::Ready);
        let ready = timeline.wait_of(ready, &claim, asked, STEP).await?;
        // With no boot delay the node may register before the Job is seen complete.
        let registered = timeline.wait_of(Seen::NodeRegistered, slot, job, STEP).await?;
        let usable = timeline.wait_of(Seen::NodeUsable, slot, job, STEP).await?;
        out.job_complete_to_ready.push(between(complete, ready));
        out.job_complete_to_node.push(between(complete, registered));
        // The gate cannot pass before the Job is complete: a step that began before it is
        // counted from the Job's end, so the three add up to Job complete → claim ready.
        out.node_to_usable.push(between(registered.max(complete), usable));
        out.usable_to_ready.push(between(usable.max(complete), ready));

        let asked = Instant::now();
        let node = proto::ExternalGrpcNode {
            name: slot.to_string(),
            provider_id: format!("homelab://{slot}"),
            ..Default::default()
        };
        grpc.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            nodes: vec![node],
            id: GROUP.into(),
        })
        .await
        .context("DeleteNodes")?;
        let shutdown = timeline.wait_of(Seen::ShutdownJobCreated, &claim, asked, STEP).await?;
        out.delete_to_shutdown_job.push(between(asked, shutdown));
        let completed = Seen::ClaimPhase(NodeClaimPhase::Completed);
        timeline.wait_of(completed, &claim, asked, STEP).await?;
        timeline.wait_of(Seen::NodeGone, slot, asked, STEP).await?;
    }
    Ok(out)
}

/// Counts, for the report.
pub fn lines(o: &Overheads) -> Vec<String> {
    let mut out = vec![
        o.increase_to_claim.line("IncreaseSize -> claim created (provider)"),
        o.claim_to_startup_job.line("claim -> startup Job created (claim controller)"),
        o.job_complete_to_ready.line("startup Job complete -> claim ready (all)"),
        o.job_complete_to_node.line("  Job complete -> node registered (simulator)"),
        o.node_to_usable.line("  registered -> Ready, no pool taints (kwok)"),
        o.usable_to_ready.line("  Ready and untainted -> claim ready (readiness gate)"),
        o.delete_to_shutdown_job.line("DeleteNodes -> shutdown Job created"),
    ];
    let operator_steps = [
        &o.increase_to_claim,
        &o.claim_to_startup_job,
        &o.usable_to_ready,
        &o.delete_to_shutdown_job,
    ];
    let worst = operator_steps.iter().map(|s| s.quantile(0.99)).max().unwrap_or_default();
    let verdict = if worst < OPERATOR_STEP_TARGET { "met" } else { "missed" };
    out.push(format!(
        "largest p99 of the operator's own steps {} (target under {}: {verdict})",
        crate::stats::ms(worst),
        crate::stats::ms(OPERATOR_STEP_TARGET),
    ));
    out
}
