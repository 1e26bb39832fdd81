//! The ground the suites of pods with node-local volumes stand on: rancher's real
//! local-path-provisioner on the harness's machines. A claim of StorageClass `local-path` whose
//! pod is pinned to the second of two kwok machines gets a PersistentVolume the provisioner
//! made for that machine (its helper pod completed by kwok), bound to the claim, and the pod
//! runs there.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use homelab_harness::local_path::{self, start_local_path_provisioner};
use homelab_harness::{Components, ControlPlane, eventually};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use serde_json::json;

/// How long the cluster may take for each step: a scheduling pass, the helper pod, a binding.
const ACT: Duration = Duration::from_secs(120);
const MACHINES: [&str; 2] = ["shelf-1", "shelf-2"];
const CLAIM: &str = "data";
const POD: &str = "keeper";

/// The claim and its only consumer, as a user writes them: the pod is pinned to `machine`.
fn claim_and_pod(machine: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {CLAIM}
spec:
  storageClassName: {class}
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: Pod
metadata:
  name: {POD}
spec:
  nodeSelector:
    kubernetes.io/hostname: {machine}
  containers:
  - name: keeper
    image: busybox:1.36
    command: ["sleep", "infinity"]
    volumeMounts:
    - name: data
      mountPath: /data
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: {CLAIM}
"#,
        class = local_path::STORAGE_CLASS,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_gets_a_volume_on_the_machine_of_its_pod() {
    let plane = ControlPlane::start(Components::CLUSTER).await.expect("an owned control plane");
    let _logs = plane.logs_on_failure();
    for machine in MACHINES {
        plane.add_machine(machine, vec![], BTreeMap::new()).await.expect("a kwok machine");
    }
    let machine = MACHINES[1];
    let provisioner = start_local_path_provisioner(&plane, &plane.dir().join("logs"))
        .await
        .expect("local-path-provisioner running");
    let ns = plane.fresh_namespace("local-volumes").await.expect("a namespace");
    let applied = plane.kubectl_apply(&ns, &claim_and_pod(machine)).await.expect("kubectl");
    assert!(
        applied.status.success(),
        "kubectl apply of the claim and pod: {}",
        String::from_utf8_lossy(&applied.stderr)
    );

    let client = plane.client().expect("client");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let volume_name = eventually("the claim bound to a provisioned volume", ACT, || async {
        let claim = claims.get(CLAIM).await?;
        let phase = claim.status.as_ref().and_then(|s| s.phase.clone());
        ensure!(phase.as_deref() == Some("Bound"), "claim phase {phase:?}");
        claim.spec.and_then(|s| s.volume_name).context("a bound claim names no volume")
    })
    .await
    .with_context(|| format!("local-path-provisioner's log:\n{}", provisioner.log_tail(40)))
    .expect("a bound claim");

    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let volume = volumes.get(&volume_name).await.expect("the claim's volume");
    let annotations = volume.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("pv.kubernetes.io/provisioned-by").map(String::as_str),
        Some(local_path::PROVISIONER_NAME),
        "{volume_name} was not made by the provisioner: {annotations:?}"
    );
    let spec = volume.spec.expect("a volume spec");
    let bound_to = spec.claim_ref.as_ref().map(|r| (r.namespace.clone(), r.name.clone()));
    assert_eq!(bound_to, Some((Some(ns.clone()), Some(CLAIM.to_owned()))), "claimRef");
    assert_eq!(spec.storage_class_name.as_deref(), Some(local_path::STORAGE_CLASS));
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    // The volume can only ever be used on the machine its directory is on.
    assert_eq!(
        serde_json::to_value(&spec.node_affinity).expect("node affinity as JSON"),
        json!({ "required": { "nodeSelectorTerms": [{ "matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": [machine]
        }] }] } }),
        "the node affinity of {volume_name}"
    );
    let path = spec.host_path.as_ref().map(|h| h.path.clone()).unwrap_or_default();
    assert!(
        path.starts_with("/var/lib/homelab-local-path/") && path.contains(&volume_name),
        "{volume_name}'s directory {path:?} is not under the configured path"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    eventually(&format!("pod {POD} Running on {machine}"), ACT, || async {
        let pod = pods.get(POD).await?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        ensure!(node.as_deref() == Some(machine), "on {node:?}");
        ensure!(phase.as_deref() == Some("Running"), "phase {phase:?}");
        Ok(())
    })
    .await
    .expect("the pod runs on the volume's machine");

    // The provisioner deletes its helper pod once it succeeded, and kwok lets it go.
    let helpers: Api<Pod> = Api::namespaced(client, local_path::NAMESPACE);
    eventually("no helper pod left", ACT, || async {
        let left: Vec<String> = helpers
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|pod| pod.metadata.name)
            .collect();
        ensure!(left.is_empty(), "helper pods {left:?}");
        Ok(())
    })
    .await
    .expect("the helper pod cleaned up");
    provisioner.ensure_running().expect("the provisioner still runs");
}
