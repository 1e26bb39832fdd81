//! The Helm chart: `helm lint` passes, and what `helm template` renders (without cert-manager,
//! whose CRDs the control plane does not have) is accepted by the real kube-apiserver in a
//! server-side dry run, so every object is valid against the served schemas, including the
//! admission configurations generated from the code.

use std::path::{Path, PathBuf};
use std::process::Command;

use homelab_harness::{Components, ControlPlane};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// helm, built (once) from its pinned module by the harness script.
fn helm() -> PathBuf {
    let out = Command::new(repo().join("tests/harness/build-binaries.sh"))
        .arg("e2e")
        .output()
        .expect("run build-binaries.sh e2e");
    assert!(out.status.success(), "building helm: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.lines().last().expect("the script prints its bin dir");
    Path::new(dir.trim()).join("helm")
}

fn run_helm(helm: &Path, args: &[&str]) -> String {
    let home = tempfile::tempdir().expect("helm home");
    let out = Command::new(helm)
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("run helm");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn the_chart_lints_and_renders_objects_the_apiserver_accepts() {
    let helm = helm();
    let chart = repo().join("charts/homelab-autoscaler");
    let chart = chart.to_string_lossy();
    let lint = run_helm(&helm, &["lint", &chart, "--set", "webhook.certManager=false"]);
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("CRDs");
    let ns = plane.fresh_namespace("chart").await.expect("namespace");
    let rendered = run_helm(
        &helm,
        &[
            "template",
            "homelab-autoscaler",
            &chart,
            "--namespace",
            &ns,
            "--set",
            "webhook.certManager=false",
            "--set",
            "replicaCount=1",
            "--set",
            "grpc.tlsSecret=ca-mtls",
        ],
    );
    for kind in [
        "kind: Deployment",
        "kind: ClusterRole",
        "kind: MutatingWebhookConfiguration",
        "kind: ValidatingWebhookConfiguration",
        "--grpc-cert-dir=",
    ] {
        assert!(rendered.contains(kind), "{kind} missing from the rendered chart");
    }
    assert!(rendered.contains(&format!("- '{ns}'")), "the webhooks select the release namespace");
    let file = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(file.path(), &rendered).expect("write rendered chart");
    let path = file.path().to_string_lossy().into_owned();
    let out = plane
        .kubectl(["apply", "--dry-run=server", "-n", ns.as_str(), "-f", path.as_str()])
        .await
        .expect("kubectl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the apiserver refused the chart: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("deployment.apps/homelab-autoscaler created (server dry run)"),
        "{stdout}"
    );
}
