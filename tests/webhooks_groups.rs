//! A Group's admission through the real kube-apiserver and kubectl with the product's webhook
//! server in the test process: no driver switch under live claims, warnings for a floor above
//! the slots, an empty pool and cluster-autoscaler overrides, nonsense durations refused.

use homelab_harness::admission::{AdmissionLab, group, refused};

use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_rules_are_enforced() {
    let w = AdmissionLab::start("wh-groups", &[]).await;

    w.create_claim("live", "machine-1", "pool").await.expect("claim");
    let switch = Patch::Merge(json!({ "spec": { "driver": "builtin" } }));
    let (code, message) = refused(w.groups.patch("pool", &PatchParams::default(), &switch).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("spec.driver cannot change while the group has 1 live claim(s)"),
        "{message}"
    );
    w.set_claim_status("live", json!({ "phase": "completed" })).await;
    let switched = w
        .groups
        .patch("pool", &PatchParams::default(), &switch)
        .await
        .expect("the driver may change once no claim is live");
    assert_eq!(serde_json::to_value(switched.spec.driver).unwrap(), json!("builtin"));

    let manifest = |name: &str, min: u32| {
        format!(
            "apiVersion: infra.homecluster.dev/v2alpha1\nkind: Group\nmetadata:\n  name: {name}\n\
             spec:\n  minSize: {min}\n"
        )
    };
    // A floor the pool cannot reach is allowed, with a warning kubectl shows.
    let file = w.manifest("big.yaml", &manifest("big", 2));
    let (ok, stdout, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply failed: {stderr}");
    assert!(stdout.contains("group.infra.homecluster.dev/big created"), "{stdout}");
    assert!(
        stderr.contains("Warning: spec.minSize is 2 but the group has 0 slot(s)"),
        "no warning in kubectl's output:\n{stderr}"
    );
    assert_eq!(w.groups.get("big").await.expect("stored").spec.min_size, 2);

    // A floor the pool reaches draws no warning.
    let file = w.manifest("small.yaml", &manifest("small", 0));
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply failed: {stderr}");
    assert!(!stderr.contains("spec.minSize"), "an unexpected warning:\n{stderr}");
    // A pool without slots is accepted, with a word about it.
    assert!(
        stderr.contains("Warning: group small has no slots"),
        "no empty-group warning in kubectl's output:\n{stderr}"
    );
    assert!(!stderr.contains("MaxNodeStartupTime"), "an unexpected warning:\n{stderr}");

    // Overriding a cluster-autoscaler option is allowed, with a warning that it costs the pool
    // its startup time and which flag to set instead.
    let tuned = format!("{}  scaleDown:\n    unneededTime: 5m\n", manifest("tuned", 0));
    let file = w.manifest("tuned.yaml", &tuned);
    let (ok, _, stderr) = w.kubectl(&["apply", "-f", &file, "-n", &w.ns]).await;
    assert!(ok, "kubectl apply failed: {stderr}");
    assert!(
        stderr.contains(
            "Warning: this group overrides cluster-autoscaler options (spec.scaleDown.unneededTime)"
        ) && stderr.contains("MaxNodeStartupTime")
            && stderr.contains("--scale-down-unneeded-time"),
        "no startup-time warning in kubectl's output:\n{stderr}"
    );

    // Nonsense durations are refused with the field named.
    let (code, message) = refused(
        w.groups
            .create(
                &PostParams::default(),
                &group("eternal", json!({ "maxNodeProvisionTime": "48h" })),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec.maxNodeProvisionTime: "), "{message}");
    assert!(message.contains("48h is longer than 24h"), "{message}");
    w.finish().await;
}
