//! The chart's RBAC is enough, and nothing more is needed: the chart's ServiceAccount and roles
//! applied, the operator run with a TokenRequest token of that ServiceAccount (never admin), and
//! the built-in scaler's full scale-up and scale-down scenario passes against a real control
//! plane, with the self-managed CA (which needs the Secret and caBundle rules).

use homelab_harness::e2e::{self, NAMESPACE, WebhookTls};
use homelab_harness::install::{apply, documents, kind, render, service_account_kubeconfig};
use homelab_harness::{Components, ControlPlane};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_a_scale_up_and_down_as_the_charts_service_account() {
    let bin = e2e::operator_binary(Some(env!("CARGO_BIN_EXE_homelab-autoscaler"))).expect("binary");
    let plane = ControlPlane::start(Components::CLUSTER).await.expect("control plane");
    let out = plane.kubectl(["create", "namespace", NAMESPACE]).await.expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let rendered = render(NAMESPACE, &["tls.mode=selfManaged"]).await.expect("helm template");
    let rbac: Vec<_> = documents(&rendered)
        .expect("documents")
        .into_iter()
        .filter(|d| {
            ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
                .contains(&kind(d))
        })
        .collect();
    assert_eq!(rbac.len(), 5, "the chart's ServiceAccount and its four RBAC objects");
    apply(&plane, &rbac).await.expect("apply the chart's RBAC");

    // A TokenRequest token of the ServiceAccount, in a kubeconfig of its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("service-account.kubeconfig");
    service_account_kubeconfig(&plane, NAMESPACE, "homelab-autoscaler", &kubeconfig)
        .await
        .expect("a kubeconfig of the ServiceAccount");
    // The token is the ServiceAccount, not admin: it may not list Secrets cluster-wide.
    let out = plane
        .kubectl([
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .await
        .expect("kubectl auth whoami");
    let who = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(who, format!("system:serviceaccount:{NAMESPACE}:homelab-autoscaler"));

    let mut world = e2e::World::start_on_as(plane, &bin, WebhookTls::SelfMade, &kubeconfig)
        .await
        .expect("start the world with the operator as the ServiceAccount");
    let _logs = world.plane.logs_on_failure();
    let outcome = world.builtin_scale_up_and_down(3).await;
    eprintln!("{}", world.summary());
    let log = world.operator_log_tail(0, 400);
    outcome.unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", world.operator_log_tail(0, 60)));
    assert!(!log.contains("forbidden"), "the operator was refused something:\n{log}");
}
