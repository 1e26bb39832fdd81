//! A kubelet registering its Kubernetes Node, through the real kube-apiserver (with the Node
//! authorizer and NodeRestriction on, as kubeadm and k3s run it) and the product's webhook
//! server in the test process. The kubelet is played by kubectl acting as the node's own
//! identity (`system:node:<name>`), which is what NodeRestriction judges.
//!
//! While the slot's claim boots, the node is created already carrying cluster-autoscaler's
//! startup taint and what its slot declares, so no moment exists in which cluster-autoscaler
//! sees it ready and undeclared. A label a kubelet may not set is left to the slot controller:
//! the webhook must not make NodeRestriction refuse the registration.

use std::time::Duration;

use anyhow::ensure;
use homelab_autoscaler::api::{LABEL_GROUP, LABEL_SLOT};
use homelab_harness::admission::{self, AdmissionLab};
use homelab_harness::eventually;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::PostParams;
use serde_json::json;

const STARTUP_TAINT: &str = "startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting";
const DECLARED: &str = "infra.homecluster.dev/declared";

/// The Node a kubelet sends when it registers: its own labels, nothing else of ours.
fn kubelet_node(name: &str, extra_labels: &[(&str, &str)]) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    labels.insert("kubernetes.io/hostname".into(), json!(name));
    labels.insert("kubernetes.io/os".into(), json!("linux"));
    for (key, value) in extra_labels {
        labels.insert((*key).into(), json!(value));
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": labels },
        "spec": {},
    })
}

/// kubectl as the kubelet of `node`: creates `manifest` (with `--dry-run=server` when `dry`).
async fn register_as_kubelet(
    w: &AdmissionLab,
    node: &str,
    manifest: &serde_json::Value,
    dry: bool,
) -> (bool, String, String) {
    let file = w.manifest(&format!("{node}-{dry}.json"), &manifest.to_string());
    let user = format!("--as=system:node:{node}");
    let mut args = vec!["create", "-f", &file, &user, "--as-group=system:nodes", "-o", "json"];
    if dry {
        args.push("--dry-run=server");
    }
    w.kubectl(&args).await
}

fn taint_keys(node: &CoreNode) -> Vec<String> {
    node.spec.iter().flat_map(|s| s.taints.iter().flatten()).map(|t| t.key.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registering_node_carries_its_slots_declaration_and_the_startup_taint_from_birth() {
    let w = AdmissionLab::start("wh-register", &[]).await;
    let node_name = format!("{}-m", w.ns);

    // The premise: NodeRestriction refuses a kubelet that sets a label it may not set.
    let forbidden = kubelet_node(&node_name, &[("node-role.kubernetes.io/worker", "")]);
    let (ok, _, stderr) = register_as_kubelet(&w, &node_name, &forbidden, true).await;
    assert!(!ok && stderr.contains("node-role.kubernetes.io/worker"), "{stderr}");

    let mut slot = admission::slot(&node_name, Some("pool"));
    slot.spec.node_labels = serde_json::from_value(
        json!({ "homelab.test/disk": "ssd", "node-role.kubernetes.io/worker": "" }),
    )
    .expect("labels");
    slot.spec.node_taints = serde_json::from_value(
        json!([{ "key": "homelab.test/dedicated", "value": "db", "effect": "NoSchedule" }]),
    )
    .expect("taints");
    w.slots.create(&PostParams::default(), &slot).await.expect("slot");
    w.create_claim("boot", &node_name, "pool").await.expect("a booting claim");

    // The webhook reads its caches, a moment behind the slot and the claim: the dry run shows
    // when it sees both.
    let plain = kubelet_node(&node_name, &[]);
    eventually("the webhook to see the slot's booting claim", Duration::from_secs(30), || {
        let (w, plain, node_name) = (&w, &plain, &node_name);
        async move {
            let (ok, stdout, stderr) = register_as_kubelet(w, node_name, plain, true).await;
            ensure!(ok, "the dry-run registration was refused: {stderr}");
            let node: CoreNode = serde_json::from_str(&stdout)?;
            ensure!(taint_keys(&node).iter().any(|k| k == STARTUP_TAINT), "not yet: {stdout}");
            Ok::<_, anyhow::Error>(())
        }
    })
    .await
    .expect("the webhook never marked the registration");

    let (ok, stdout, stderr) = register_as_kubelet(&w, &node_name, &plain, false).await;
    assert!(ok, "the kubelet's registration was refused: {stderr}");
    let node: CoreNode = serde_json::from_str(&stdout).expect("kubectl -o json");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_GROUP).map(String::as_str), Some("pool"), "{labels:?}");
    assert_eq!(labels.get(LABEL_SLOT), Some(&node_name), "{labels:?}");
    assert_eq!(labels.get("homelab.test/disk").map(String::as_str), Some("ssd"), "{labels:?}");
    assert_eq!(labels.get("kubernetes.io/hostname"), Some(&node_name), "the kubelet's own");
    assert!(
        !labels.contains_key("node-role.kubernetes.io/worker"),
        "left to the slot controller's first write: {labels:?}"
    );
    // Beside the API server's own `node.kubernetes.io/not-ready` (TaintNodesByCondition).
    let taints = taint_keys(&node);
    for ours in ["homelab.test/dedicated", STARTUP_TAINT] {
        assert!(taints.iter().any(|t| t == ours), "{ours} missing: {taints:?}");
    }
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(format!("homelab://{node_name}").as_str())
    );
    let record = node.metadata.annotations.clone().unwrap_or_default();
    assert!(
        record
            .get(DECLARED)
            .is_some_and(|r| r.contains("homelab.test/disk") && !r.contains("node-role")),
        "what the operator declared is recorded: {record:?}"
    );

    // A node that is no slot's registers as its kubelet sent it.
    let stranger = format!("{}-stranger", w.ns);
    let (ok, stdout, stderr) =
        register_as_kubelet(&w, &stranger, &kubelet_node(&stranger, &[]), false).await;
    assert!(ok, "{stderr}");
    let node: CoreNode = serde_json::from_str(&stdout).expect("kubectl -o json");
    assert_eq!(
        node.metadata.labels.as_ref().map(|l| l.len()),
        Some(2),
        "only the kubelet's labels"
    );
    assert_eq!(taint_keys(&node), ["node.kubernetes.io/not-ready"], "the API server's alone");
    assert!(node.metadata.annotations.is_none());

    let nodes: kube::Api<CoreNode> = kube::Api::all(w.client.clone());
    for name in [&node_name, &stranger] {
        nodes.delete(name, &Default::default()).await.expect("delete the node");
    }
    w.finish().await;
}
