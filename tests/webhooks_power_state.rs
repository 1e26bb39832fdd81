//! A slot that still declares `spec.powerState` (a v1alpha1 habit), as `kubectl apply` shows
//! it through the real kube-apiserver and the product's webhook server in the test process:
//! refused, with why and what to write instead.

use homelab_harness::admission::AdmissionLab;

/// A slot manifest as kubectl applies it, with `powerState_line` (say `powerState: "on"`) in
/// its spec when given.
fn slot_manifest(name: &str, power_state_line: Option<&str>) -> String {
    format!(
        r#"apiVersion: infra.homecluster.dev/v2alpha1
kind: Node
metadata:
  name: {name}
  labels: {{ group: pool }}
spec:
  kubernetesNodeName: {name}
  startupPodSpec: {{ image: registry.invalid/wake:1 }}
  shutdownPodSpec: {{ image: registry.invalid/sleep:1 }}
{}"#,
        power_state_line.map(|line| format!("  {line}\n")).unwrap_or_default()
    )
}

/// What kubectl must show for a slot that still declares powerState: that it is gone, why,
/// and what to do instead.
#[track_caller]
fn assert_power_state_explained(output: &str) {
    for needle in [
        "spec.powerState was removed",
        "a machine now runs exactly while a NodeClaim for its slot is live",
        "Delete spec.powerState",
        "create a NodeClaim with spec.slotRef.name",
    ] {
        assert!(output.contains(needle), "{needle:?} missing from kubectl's output:\n{output}");
    }
}

/// Applies `powerState_line` to a new slot and to the existing `machine-1`; both must be
/// refused with the explanation, and neither stored.
async fn assert_power_state_refused(w: &AdmissionLab, power_state_line: &str) {
    let file = w.manifest("new.yaml", &slot_manifest("machine-2", Some(power_state_line)));
    let (ok, stdout, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(!ok, "kubectl apply accepted {power_state_line}: {stdout}");
    assert_power_state_explained(&stderr);
    assert!(w.slots.get_opt("machine-2").await.expect("get").is_none(), "the slot was stored");

    // An existing slot edited to declare it (a v1alpha1 habit).
    let file = w.manifest("old.yaml", &slot_manifest("machine-1", Some(power_state_line)));
    let (ok, stdout, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(!ok, "kubectl apply accepted {power_state_line}: {stdout}");
    assert_power_state_explained(&stderr);
    assert_eq!(w.slots.get("machine-1").await.expect("get").spec.power_state, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_slot_with_power_state_explains_the_way_forward() {
    let w = AdmissionLab::start("wh-power", &[]).await;
    assert_power_state_refused(&w, r#"powerState: "on""#).await;
    assert_power_state_refused(&w, "powerState: off-please").await;

    // The same manifest without the field applies.
    let file = w.manifest("fixed.yaml", &slot_manifest("machine-2", None));
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply of a valid slot failed: {stderr}");
    w.finish().await;
}

/// The v1alpha1 manifests wrote `powerState: on` unquoted, which YAML reads as the boolean
/// true. The v2alpha1 schema types the tombstone as a string, so the apiserver refuses it with
/// `spec.powerState in body must be of type string: "boolean"` and skips the CEL rule that
/// carries the explanation; the webhook never sees it. Fails until the tombstone accepts any
/// JSON value (src/api/slot.rs, then `make manifests`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_v1alpha1_slot_with_bare_power_state_on_explains_the_way_forward() {
    let w = AdmissionLab::start("wh-power-bare", &[]).await;
    assert_power_state_refused(&w, "powerState: on").await;
    w.finish().await;
}
