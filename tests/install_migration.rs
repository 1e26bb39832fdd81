//! The migration runbook's CRD step (docs/migration.md, step 3) against the real apiserver: a
//! cluster whose `nodes` CRD still stores v1alpha1 refuses the v2alpha1-only CRD in place, which
//! is why the runbook deletes the v1alpha1 objects and CRDs first; after that, the chart's CRDs
//! go in and a v2alpha1 slot is served.

use homelab_harness::install::{chart_dir, helm};
use homelab_harness::{Components, ControlPlane};

const V1ALPHA1_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: { name: nodes.infra.homecluster.dev }
spec:
  group: infra.homecluster.dev
  scope: Namespaced
  names: { plural: nodes, singular: node, kind: Node, listKind: NodeList }
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema: { openAPIV3Schema: { type: object, x-kubernetes-preserve-unknown-fields: true } }
"#;

#[tokio::test]
async fn the_runbooks_crd_step_is_what_the_apiserver_requires() {
    let plane = ControlPlane::start(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    };
    let kubectl = |args: Vec<String>| {
        let plane = &plane;
        async move { plane.kubectl(&args).await.expect("kubectl") }
    };
    let ok = |out: &std::process::Output, what: &str| {
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    };

    // A 0.1.x cluster: the v1alpha1 CRD and a slot stored at v1alpha1.
    let old = write("v1alpha1.yaml", V1ALPHA1_CRD);
    ok(&kubectl(vec!["apply".into(), "-f".into(), old]).await, "the v1alpha1 CRD");
    ok(
        &kubectl(
            [
                "wait",
                "--for=condition=Established",
                "crd/nodes.infra.homecluster.dev",
                "--timeout=60s",
            ]
            .map(String::from)
            .to_vec(),
        )
        .await,
        "established",
    );
    ok(
        &kubectl(["create", "namespace", "homelab-autoscaler-system"].map(String::from).to_vec())
            .await,
        "ns",
    );
    let slot = write(
        "slot-v1.yaml",
        "apiVersion: infra.homecluster.dev/v1alpha1\nkind: Node\nmetadata: { name: worker-1, namespace: homelab-autoscaler-system }\nspec: { powerState: on }\n",
    );
    ok(&kubectl(vec!["apply".into(), "-f".into(), slot]).await, "a v1alpha1 slot");

    // The v2alpha1 CRD in place is refused: v1alpha1 is still a stored version.
    let new_crd =
        homelab_harness::repo_path("crds/nodes.infra.homecluster.dev.yaml").display().to_string();
    let refused = kubectl(vec![
        "apply".into(),
        "--server-side".into(),
        "--force-conflicts".into(),
        "-f".into(),
        new_crd.clone(),
    ])
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "the apiserver took the v2alpha1-only CRD over a stored v1alpha1"
    );
    assert!(stderr.contains("storedVersions"), "{stderr}");

    // The runbook: delete the v1alpha1 objects and CRD, then install the chart's CRDs.
    ok(
        &kubectl(
            ["delete", "nodes.infra.homecluster.dev", "--all", "-n", "homelab-autoscaler-system"]
                .map(String::from)
                .to_vec(),
        )
        .await,
        "delete slots",
    );
    ok(
        &kubectl(["delete", "crd", "nodes.infra.homecluster.dev"].map(String::from).to_vec()).await,
        "delete CRD",
    );
    let chart = chart_dir().display().to_string();
    let kubeconfig = plane.kubeconfig_path().display().to_string();
    helm(&[
        "upgrade",
        "--install",
        "homelab-autoscaler",
        &chart,
        "-n",
        "homelab-autoscaler-system",
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "tls.mode=selfManaged",
    ])
    .await
    .expect("the runbook's helm upgrade --install");
    let out = kubectl(
        ["get", "crd", "nodes.infra.homecluster.dev", "-o", "jsonpath={.status.storedVersions}"]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[\"v2alpha1\"]");
}
