//! End to end on the simulated cluster: a claim on a slot that wakes by Wake-on-LAN and shuts
//! down over SSH (examples/power-wake-on-lan.yaml) boots and is released like any other. The
//! operator turns `spec.power` into its startup and shutdown Jobs (the operator's image running
//! `power on|off`); kwok plays their pods and the simulator the machine behind them.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use homelab_autoscaler::api::{NodeClaim, NodeClaimPhase};
use homelab_harness::e2e::{self, NAMESPACE};
use homelab_harness::eventually;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

const ACT: Duration = Duration::from_secs(120);

/// The power Job of `lifecycle`, once the operator has made one.
async fn power_job(jobs: &Api<Job>, lifecycle: &str) -> Result<Job> {
    let list = jobs
        .list(&ListParams::default().labels(&format!(
            "infra.homecluster.dev/node=nas-1,infra.homecluster.dev/lifecycle={lifecycle}"
        )))
        .await?;
    list.items.into_iter().next().with_context(|| format!("no {lifecycle} Job yet"))
}

fn args_of(job: &Job) -> Vec<String> {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_wake_on_lan_slot_boots_and_is_released() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler")))
        .expect("operator binary");
    let world = e2e::World::start(&bin, false).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let example = homelab_harness::repo_path("examples/power-wake-on-lan.yaml");
    let applied = world
        .plane
        .kubectl(["apply", "-n", NAMESPACE, "-f", &example.to_string_lossy()])
        .await
        .expect("kubectl");
    assert!(applied.status.success(), "{}", String::from_utf8_lossy(&applied.stderr));

    let claims: Api<NodeClaim> = Api::namespaced(world.client.clone(), NAMESPACE);
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "NodeClaim",
        "metadata": { "generateName": "nas-1-" },
        "spec": { "slotRef": { "name": "nas-1" }, "request": { "call": "Manual", "group": "lan" } },
    }))
    .expect("claim");
    let name = claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("claim")
        .metadata
        .name
        .expect("name");
    eventually("the claim on the WoL slot ready", ACT, || async {
        let phase = claims.get(&name).await?.status.and_then(|s| s.phase);
        ensure!(phase == Some(NodeClaimPhase::Ready), "phase {phase:?}");
        Ok(())
    })
    .await
    .expect("ready");
    let jobs: Api<Job> = Api::namespaced(world.client.clone(), NAMESPACE);
    let startup = power_job(&jobs, "startup").await.expect("startup Job");
    assert_eq!(args_of(&startup), ["power", "on"]);

    claims.delete(&name, &DeleteParams::default()).await.expect("delete the claim");
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    eventually("the machine off and the claim released", ACT, || async {
        let gone = claims.get_opt(&name).await?.is_none();
        let up = nodes.get_opt("nas-1").await?.is_some();
        ensure!(gone && !up, "claim gone: {gone}, machine up: {up}");
        Ok(())
    })
    .await
    .expect("released");
    let shutdown = power_job(&jobs, "shutdown").await.expect("shutdown Job");
    assert_eq!(args_of(&shutdown), ["power", "off"]);
}
