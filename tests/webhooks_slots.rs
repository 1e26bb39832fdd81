//! A slot's admission through the real kube-apiserver and the product's webhook server in the
//! test process: a pool label, an existing pool, each direction powered by exactly one of a
//! driver and a pod spec, a providerID frozen under a live claim, node labels and taints the API
//! server would accept on a Node.

use homelab_harness::admission::{AdmissionLab, refused, slot};

use kube::api::{DeleteParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_rules_are_enforced() {
    let w = AdmissionLab::start("wh-slots", &[]).await;
    let post = PostParams::default();

    let (code, message) = refused(w.slots.create(&post, &slot("machine-2", None)).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("metadata.labels.group: a slot joins a pool by this label"),
        "{message}"
    );

    // spec.power: each direction powered by exactly one of a driver and a pod spec.
    let mut wol_only = slot("machine-2", Some("pool"));
    wol_only.spec.shutdown_pod_spec = None;
    wol_only.spec.startup_pod_spec = None;
    wol_only.spec.power = Some(
        serde_json::from_value(json!({ "wakeOnLan": { "mac": "52:54:00:ab:cd:ef" } }))
            .expect("power"),
    );
    let (code, message) = refused(w.slots.create(&post, &wol_only).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("nothing powers the machine off: set spec.power.ssh, .redfish, .ipmi or .http.offRequest or spec.shutdownPodSpec"),
        "{message}"
    );
    let mut both = wol_only.clone();
    both.spec.startup_pod_spec = slot("x", None).spec.startup_pod_spec;
    both.spec.shutdown_pod_spec = slot("x", None).spec.shutdown_pod_spec;
    let (code, message) = refused(w.slots.create(&post, &both).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("both spec.startupPodSpec and spec.power.wakeOnLan power the machine on: keep one of them"),
        "{message}"
    );
    let mut wol_and_pod = wol_only.clone();
    wol_and_pod.spec.shutdown_pod_spec = slot("x", None).spec.shutdown_pod_spec;
    let created = w.slots.create(&post, &wol_and_pod).await.expect("wake by WoL, a pod shuts down");
    w.slots.delete("machine-2", &DeleteParams::default()).await.expect("delete");
    assert!(created.spec.power.is_some(), "spec.power is kept by the schema");

    let (code, message) = refused(w.slots.create(&post, &slot("machine-2", Some("nowhere"))).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("there is no group \"nowhere\""), "{message}");
    assert!(message.contains("create the Group first"), "{message}");

    // The providerID is frozen while a claim is live. The edit goes through the crate's type, so
    // it names the field exactly as the schema spells it.
    w.create_claim("live", "machine-1", "pool").await.expect("claim");
    let edit = |provider_id: &'static str, image: &'static str| {
        let slots = w.slots.clone();
        async move {
            let mut slot = slots.get("machine-1").await.expect("get slot");
            slot.spec.provider_id = Some(provider_id.into());
            slot.spec.startup_pod_spec.get_or_insert_default().image = image.into();
            slots.replace("machine-1", &PostParams::default(), &slot).await
        }
    };
    let (code, message) = refused(edit("k3s://machine-1", "registry.invalid/wake:1").await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("cannot change while claim \"live\" is live"), "{message}");
    assert!(message.contains("cluster-autoscaler tracks the machine by it"), "{message}");
    // Other edits of the slot still pass while the claim is live.
    let edited = w.slots.get("machine-1").await.expect("get slot");
    let kept = edited.spec.provider_id.clone();
    let mut image = edited;
    image.spec.startup_pod_spec.get_or_insert_default().image = "registry.invalid/wake:2".into();
    let image = w.slots.replace("machine-1", &post, &image).await.expect("edit the image");
    assert_eq!(image.spec.provider_id, kept);

    w.set_claim_status("live", json!({ "phase": "completed" })).await;
    let changed = edit("k3s://machine-1", "registry.invalid/wake:2")
        .await
        .expect("the providerID may change once no claim is live");
    assert_eq!(changed.spec.provider_id.as_deref(), Some("k3s://machine-1"));
    w.finish().await;
}

/// A declared label or taint the API server would refuse on the machine's node is refused on the
/// slot, or the registration webhook's patch would make every registration of the machine fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_labels_and_taints_are_judged_as_on_a_node() {
    let w = AdmissionLab::start("wh-marks", &[]).await;
    let manifest = |labels: &str, taints: &str| {
        format!(
            r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: machine-2
  labels: {{ group: pool }}
spec:
  kubernetesNodeName: machine-2
  startupPodSpec: {{ image: registry.invalid/wake:1 }}
  shutdownPodSpec: {{ image: registry.invalid/sleep:1 }}
  nodeLabels:
{labels}
  nodeTaints:
{taints}
"#
        )
    };
    let bad = w.manifest(
        "bad-marks.yaml",
        &manifest(
            "    example.com/role: big gpu",
            "    - { key: dedicated, value: gpu, effect: Noschedule }",
        ),
    );
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &bad, "-n", &w.ns]).await;
    assert!(!ok, "a slot whose marks no node accepts is refused");
    for needle in [
        "spec.nodeLabels.example.com/role: the value \"big gpu\" contains ' '",
        "spec.nodeTaints[0].effect: \"Noschedule\" is not a taint effect; write exactly one of \
         NoSchedule, PreferNoSchedule, NoExecute",
        "registration would fail",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing from {stderr}");
    }

    let good = w.manifest(
        "good-marks.yaml",
        &manifest(
            "    example.com/role: big-gpu\n    empty: \"\"",
            "    - { key: dedicated, value: gpu, effect: NoSchedule }\n    - { key: dedicated, effect: NoExecute }",
        ),
    );
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &good, "-n", &w.ns]).await;
    assert!(ok, "marks a node accepts pass: {stderr}");
    w.finish().await;
}
