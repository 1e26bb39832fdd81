//! The kubelet a test machine plays (kwok's stages, tests/harness/kwok/stages.yaml, and the
//! harness's `stop_kubelet`/`start_kubelet`): a stopped kubelet's Node is turned Ready=Unknown
//! and tainted unreachable by kube-controller-manager, its pods are left alone, and it comes
//! back Ready when the kubelet starts. And the kwok behaviour that made the stopped kubelet an
//! annotation of its own: kwok keeps playing a node whose `kwok.x-k8s.io/node` annotation goes.

use std::collections::BTreeMap;
use std::time::Duration;

use homelab_harness::{Components, ControlPlane, KWOK_NODE_ANNOTATION, eventually, ready_status};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Longer than kube-controller-manager's grace period plus a few heartbeats.
const ACT: Duration = Duration::from_secs(90);

fn taint_keys(node: &Node) -> Vec<String> {
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.into_iter().map(|t| t.key).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_kubelet_goes_unknown_keeps_its_pods_and_comes_back() {
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    plane.add_machine("kubelet-1", vec![], BTreeMap::new()).await.expect("machine");

    let ns = plane.fresh_namespace("kubelet").await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "nodeName": "kubelet-1",
            "containers": [{ "name": "web", "image": "registry.invalid/web:1" }],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("create pod");
    eventually("the pod Running", ACT, || async {
        let phase = pods.get("web").await?.status.and_then(|s| s.phase);
        anyhow::ensure!(phase.as_deref() == Some("Running"), "phase {phase:?}");
        Ok(())
    })
    .await
    .expect("pod runs");

    plane.stop_kubelet("kubelet-1").await.expect("stop the kubelet");
    // No kubelet confirms the deletion: the pod stays Terminating for as long as it is off.
    pods.delete("web", &DeleteParams::default()).await.expect("delete pod");
    let off = plane.until_unknown("kubelet-1").await.expect("Unknown");
    let terminating = pods.get_opt("web").await.expect("read pod");
    assert!(
        terminating.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "the pod of a stopped machine went without its kubelet"
    );
    eventually("kube-controller-manager to taint the node unreachable", ACT, || async {
        let node = nodes.get("kubelet-1").await?;
        let keys = taint_keys(&node);
        anyhow::ensure!(keys.iter().any(|k| k == "node.kubernetes.io/unreachable"), "{keys:?}");
        Ok(())
    })
    .await
    .expect("unreachable taint");
    assert_eq!(ready_status(&off), Some("Unknown"));

    plane.start_kubelet("kubelet-1").await.expect("start the kubelet");
    eventually("the node Ready and reachable again, its deleted pod gone", ACT, || async {
        let node = nodes.get("kubelet-1").await?;
        let keys = taint_keys(&node);
        let ready = ready_status(&node);
        let pod = pods.get_opt("web").await?;
        anyhow::ensure!(
            ready == Some("True")
                && !keys.iter().any(|k| k.starts_with("node.kubernetes.io/"))
                && pod.is_none(),
            "Ready={ready:?}, taints {keys:?}, pod still there: {}",
            pod.is_some()
        );
        Ok(())
    })
    .await
    .expect("back");
    plane.remove_machine("kubelet-1").await.expect("remove machine");
}

/// kwok 0.8 filters its node informer by the annotation selector on the client side and sends
/// no Deleted event when a node stops matching, so it never lets go of a node whose annotation
/// is removed: it still plays the pods bound to it. A stopped kubelet therefore is a stage
/// selector on both the node and its pods, not the loss of kwok's annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kwok_keeps_playing_a_node_whose_annotation_goes() {
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let client = plane.client().expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    plane.add_machine("unannotated-1", vec![], BTreeMap::new()).await.expect("machine");

    let drop_annotation = json!({ "metadata": { "annotations": { KWOK_NODE_ANNOTATION: null } } });
    let released = nodes
        .patch("unannotated-1", &PatchParams::default(), &Patch::Merge(&drop_annotation))
        .await
        .expect("remove the kwok annotation");
    let annotations = released.metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(KWOK_NODE_ANNOTATION), "{annotations:?}");

    let ns = plane.fresh_namespace("unannotated").await.expect("namespace");
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "nodeName": "unannotated-1",
            "containers": [{ "name": "web", "image": "registry.invalid/web:1" }],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod).await.expect("create pod");
    eventually("kwok to run a pod on the node it no longer selects", ACT, || async {
        let phase = pods.get("web").await?.status.and_then(|s| s.phase);
        anyhow::ensure!(phase.as_deref() == Some("Running"), "phase {phase:?}");
        Ok(())
    })
    .await
    .expect("kwok still plays the node");
    pods.delete("web", &DeleteParams::default()).await.expect("delete pod");
    plane.remove_machine("unannotated-1").await.expect("remove machine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_joined_long_ago_is_off_with_a_kubelets_labels() {
    let plane = ControlPlane::shared(Components::CLUSTER).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let labels = BTreeMap::from([("homelab.test/zone".to_owned(), "attic".to_owned())]);
    let node = plane.add_stopped_machine("long-ago-1", labels).await.expect("stopped machine");
    assert_eq!(ready_status(&node), Some("Unknown"));
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (key, value) in [
        ("kubernetes.io/hostname", "long-ago-1"),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("homelab.test/zone", "attic"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{labels:?}");
    }
    let annotations = node.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get(KWOK_NODE_ANNOTATION).map(String::as_str), Some("fake"));
    plane.remove_machine("long-ago-1").await.expect("remove machine");
}
