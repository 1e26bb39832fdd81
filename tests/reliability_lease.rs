//! The Lease taken away mid-drain: two operator replicas (the real binary), a machine started
//! by hand, a pod on it held by a PodDisruptionBudget so its drain lasts (the operator's drain
//! timeout is 10 s here); while it drains, the Lease is handed to the standby. The new leader
//! finishes the drain and powers the machine off, with one shutdown Job in all.

use std::time::Duration;

use anyhow::ensure;
use homelab_harness::e2e::{self, NAMESPACE, World};
use homelab_harness::eventually;
use homelab_harness::invariants::Ledger;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node as CoreNode, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const ACT: Duration = Duration::from_secs(90);
const LEASE: &str = "homelab-autoscaler";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_leader_finishes_a_drain_without_a_second_shutdown_job() {
    homelab_autoscaler::tls::install_crypto_provider();
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("bin");
    let mut world = World::start_with_shared_certificate(&bin).await.expect("start the world");
    let _logs = world.plane.logs_on_failure();
    let first = world.replicas[0].identity();
    eventually("the first replica to lead", ACT, || async {
        ensure!(world.lease_holder().await? == first, "not yet");
        Ok(())
    })
    .await
    .expect("leader");
    world.start_replica().await.expect("second replica");
    let second = world.replicas[1].identity();
    let ledger = Ledger::start(&world.client, NAMESPACE).await.expect("ledger");

    // A machine by hand, ready.
    world.apply_example("pool.yaml").await.expect("apply examples/pool.yaml");
    let claim = world.create_manual_claim().await.expect("claim");
    let claims: Api<homelab_autoscaler::api::NodeClaim> =
        Api::namespaced(world.client.clone(), NAMESPACE);
    eventually("the claim ready", ACT, || async {
        let c = claims.get(&claim).await?;
        let phase = c.status.as_ref().and_then(|s| s.phase);
        ensure!(phase == Some(homelab_autoscaler::api::NodeClaimPhase::Ready), "{phase:?}");
        Ok(())
    })
    .await
    .expect("ready");

    // A pod on the machine that a PodDisruptionBudget keeps from being evicted.
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "held", "labels": { "app": "held" } },
        "spec": { "nodeName": "mini-1", "containers": [{ "name": "c", "image": "registry.invalid/app:1" }],
                  "tolerations": [{ "operator": "Exists" }] },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("pod");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(world.client.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": { "name": "held" },
        "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "held" } } },
    }))
    .expect("pdb");
    pdbs.create(&PostParams::default(), &pdb).await.expect("pdb");
    eventually("the held pod running", ACT, || async {
        let p = pods.get("held").await?;
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        ensure!(phase == "Running", "{phase}");
        Ok(())
    })
    .await
    .expect("running");

    // Release the machine; once it is cordoned (the drain has begun), hand the Lease over.
    claims.delete(&claim, &Default::default()).await.expect("delete the claim");
    let nodes: Api<CoreNode> = Api::all(world.client.clone());
    eventually("the drain to begin", ACT, || async {
        let node = nodes.get("mini-1").await?;
        let cordoned = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
        ensure!(cordoned, "not cordoned yet");
        Ok(())
    })
    .await
    .expect("draining");
    // Still draining: no shutdown Job yet (the budget holds the pod for the 10 s drain timeout).
    let jobs: Api<k8s_openapi::api::batch::v1::Job> =
        Api::namespaced(world.client.clone(), NAMESPACE);
    let shutdowns = jobs
        .list(&kube::api::ListParams::default().labels("infra.homecluster.dev/lifecycle=shutdown"))
        .await
        .expect("jobs");
    assert!(shutdowns.items.is_empty(), "the drain was over before the handover");
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    let leases: Api<Lease> = Api::namespaced(world.client.clone(), NAMESPACE);
    let handover =
        json!({ "spec": { "holderIdentity": second, "acquireTime": now, "renewTime": now } });
    leases.patch(LEASE, &PatchParams::default(), &Patch::Merge(&handover)).await.expect("handover");

    eventually("the machine off and the claim gone", Duration::from_secs(120), || async {
        let gone = claims.get_opt(&claim).await?.is_none();
        let up = nodes.get_opt("mini-1").await?.is_some();
        ensure!(gone && !up, "claim gone: {gone}, machine up: {up}");
        Ok(())
    })
    .await
    .expect("the new leader finished the drain");
    assert_eq!(world.lease_holder().await.expect("lease"), second, "the standby leads now");
    // The standby took over while the machine drained (its log says so after the handover).
    let log = world.operator_log_tail(1, 10_000);
    assert!(log.contains("elected leader"), "the standby never led:\n{log}");
    let violations = ledger.violations();
    assert!(violations.is_empty(), "{}", violations.join("; "));
    eprintln!("{}", world.summary());
}
