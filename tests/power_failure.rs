//! What a failed power pod says reaches the claim: its termination message is appended to the
//! claim's failure message. The pod cannot run here (its node selector matches no node), so the
//! test writes the status a failed power pod would have, as its kubelet would, and the real job
//! controller fails the Job at its deadline.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use homelab_autoscaler::api::{Group, NodeClaim, NodeClaimPhase};
use homelab_autoscaler::controller::jobs::JOB_NAME_LABEL;
use homelab_harness::eventually;
use homelab_harness::lab::{Lab, With, timeouts};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const ACT: Duration = Duration::from_secs(60);
const REFUSAL: &str =
    "BMC at 10.0.0.6:623 refused the login (RMCP+ session refused): check Secret ipmi-creds";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_pods_error_becomes_the_claims_failure_message() {
    let lab = Lab::start("power-fail", With::Controllers).await;
    let group: Group = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
        "metadata": { "name": "pool" }, "spec": {},
    }))
    .expect("group");
    Api::<Group>::namespaced(lab.client.clone(), &lab.ns)
        .create(&PostParams::default(), &group)
        .await
        .expect("group");
    let name = format!("{}-m1", lab.ns);
    let slot = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
        "metadata": { "name": name, "labels": { "group": "pool" } },
        "spec": {
            "kubernetesNodeName": name,
            "power": {
                "ipmi": { "host": "10.0.0.6", "credentials": { "secretName": "ipmi-creds" } },
                "nodeSelector": { "homelab.test/lab": "nowhere" },
            },
        },
    }))
    .expect("slot");
    let slot = lab.slots().create(&PostParams::default(), &slot).await.expect("slot");

    let now = jiff::Timestamp::now();
    let claim: NodeClaim = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
        "metadata": {
            "name": "c1",
            "ownerReferences": [{
                "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node", "name": name,
                "uid": slot.metadata.uid, "controller": true,
            }],
        },
        "spec": {
            "slotRef": { "name": name },
            "request": { "call": "Manual", "group": "pool" },
            "requestedAt": Time(now), "requestedBy": "test", "attempt": 1,
            "deadlineAt": Time(timeouts().deadline_at(now, None)), "ttlSecondsAfterFinished": 3600,
        },
    }))
    .expect("claim");
    lab.claims().create(&PostParams::default(), &claim).await.expect("claim");

    // The power pod fails as the driver makes it fail: exit 1, its error as termination message.
    let pods = lab.pods();
    let pod = eventually("the startup Job's pod", ACT, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("{JOB_NAME_LABEL}=c1-startup")))
            .await?;
        list.items.into_iter().next().context("no pod yet")
    })
    .await
    .expect("pod");
    let pod_name = pod.metadata.name.clone().expect("name");
    let image = pod.spec.as_ref().and_then(|s| s.containers[0].image.clone()).expect("image");
    let failed = json!({ "status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": "startup", "image": image, "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": 1, "reason": "Error", "message": REFUSAL } },
        }],
    }});
    pods.patch_status(&pod_name, &PatchParams::default(), &Patch::Merge(&failed))
        .await
        .expect("fail the pod");

    let claims = lab.claims();
    let claim = eventually("the claim failed", ACT, || async {
        let claim = claims.get("c1").await?;
        let phase = claim.status.as_ref().and_then(|s| s.phase);
        ensure!(phase == Some(NodeClaimPhase::Failed), "phase {phase:?}");
        Ok(claim)
    })
    .await
    .expect("failed");
    let status = claim.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("StartupJobFailed"));
    assert_eq!(
        status.message.as_deref(),
        Some(format!("startup Job c1-startup failed or timed out: {REFUSAL}").as_str())
    );
}
