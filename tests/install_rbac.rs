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
    let rbac = rbac_of(&rendered).await;
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

/// Runs kubectl on `plane` (as admin, or with `kubeconfig`), returning its stdout, or its
/// stderr as the error.
async fn kubectl(
    plane: &ControlPlane,
    kubeconfig: Option<&std::path::Path>,
    args: &[&str],
) -> Result<String, String> {
    let mut all: Vec<String> = Vec::new();
    if let Some(path) = kubeconfig {
        all.extend(["--kubeconfig".to_string(), path.display().to_string()]);
    }
    all.extend(args.iter().map(|a| a.to_string()));
    let out = plane.kubectl(all).await.map_err(|e| format!("{e:#}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The `data` of Secret `name` in `namespace`, read as admin.
async fn secret_data(plane: &ControlPlane, namespace: &str, name: &str) -> serde_json::Value {
    let json = kubectl(plane, None, &["get", "secret", name, "-n", namespace, "-o", "json"])
        .await
        .unwrap_or_else(|e| panic!("secret {namespace}/{name}: {e}"));
    let secret: serde_json::Value = serde_json::from_str(&json).expect("a Secret as JSON");
    secret["data"].clone()
}

/// cluster-autoscaler of the user's (the upstream chart's, say) in another namespace: with only
/// the chart's RBAC, the operator's ServiceAccount copies the client Secret there, stamps that
/// one Deployment, follows a renewal, and can patch no other Deployment there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_service_account_restarts_cluster_autoscaler_in_another_namespace() {
    use homelab_autoscaler::operator::autoscaler_restart::{
        AutoscalerRestart, COPIED_FROM, Checked, Target,
    };
    use homelab_harness::install::certificate_stamp;

    let plane = ControlPlane::start(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    let home = plane.fresh_namespace("release").await.expect("namespace");
    let elsewhere = plane.fresh_namespace("kube-system-like").await.expect("namespace");
    let rendered = render(
        &home,
        &[
            "tls.mode=secrets",
            "tls.secrets.webhook=webhook-tls",
            "tls.secrets.grpc=grpc-tls",
            "tls.secrets.grpcClient=ca-client",
            "clusterAutoscaler.external.deployment=cluster-autoscaler",
            &format!("clusterAutoscaler.external.namespace={elsewhere}"),
        ],
    )
    .await
    .expect("helm template");
    let rbac = rbac_of(&rendered).await;
    assert_eq!(rbac.len(), 7, "the ServiceAccount, its four RBAC objects, the restart pair");
    apply(&plane, &rbac).await.expect("apply the chart's RBAC");

    for (name, ns) in [("cluster-autoscaler", elsewhere.as_str()), ("other", elsewhere.as_str())] {
        kubectl(
            &plane,
            None,
            &["create", "deployment", name, "--image=registry.invalid/x", "-n", ns],
        )
        .await
        .expect("a Deployment");
    }
    let issue = |serial: &'static str| {
        let home = home.clone();
        let plane = &plane;
        async move {
            let crt = format!("--from-literal=tls.crt=certificate {serial}");
            let key = format!("--from-literal=tls.key=key {serial}");
            let manifest = kubectl(
                plane,
                None,
                &[
                    "create",
                    "secret",
                    "generic",
                    "ca-client",
                    "-n",
                    &home,
                    &crt,
                    &key,
                    "--from-literal=ca.crt=ca",
                    "--from-literal=unrelated=x",
                    "--dry-run=client",
                    "-o",
                    "json",
                ],
            )
            .await
            .expect("a Secret manifest");
            let file = tempfile::NamedTempFile::new().expect("file");
            std::fs::write(file.path(), manifest).expect("write");
            kubectl(plane, None, &["apply", "-f", &file.path().display().to_string()])
                .await
                .expect("apply the client Secret");
        }
    };
    issue("1").await;

    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("service-account.kubeconfig");
    service_account_kubeconfig(&plane, &home, "homelab-autoscaler", &kubeconfig)
        .await
        .expect("a kubeconfig of the ServiceAccount");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let restart = AutoscalerRestart::new(
        &client,
        &home,
        "ca-client".into(),
        Target {
            namespace: elsewhere.clone(),
            deployment: "cluster-autoscaler".into(),
            secret: "ca-client".into(),
        },
    );

    let first = restart.check().await.expect("the chart's RBAC allows the restart");
    let Checked::Restarted { digest } = first else { panic!("restarted: {first:?}") };
    let deployments = kube::Api::namespaced(plane.client().expect("client"), &elsewhere);
    let stamp = certificate_stamp(&deployments, "cluster-autoscaler").await.expect("stamp");
    assert_eq!(stamp.as_deref(), Some(digest.as_str()));
    let copy = secret_data(&plane, &elsewhere, "ca-client").await;
    let source = secret_data(&plane, &home, "ca-client").await;
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert_eq!(copy[key], source[key], "{key} copied");
    }
    assert!(copy["unrelated"].is_null(), "only what cluster-autoscaler reads: {copy}");
    assert_eq!(restart.check().await.expect("check"), Checked::Current);

    // A renewal: the copy follows, then the Deployment is stamped again.
    issue("2").await;
    let renewed = restart.check().await.expect("check after renewal");
    let Checked::Restarted { digest: second } = renewed else { panic!("{renewed:?}") };
    assert_ne!(second, digest);
    let copy = secret_data(&plane, &elsewhere, "ca-client").await;
    assert_eq!(copy["tls.crt"], secret_data(&plane, &home, "ca-client").await["tls.crt"]);
    let stamp = certificate_stamp(&deployments, "cluster-autoscaler").await.expect("stamp");
    assert_eq!(stamp.as_deref(), Some(second.as_str()));

    // Nothing else there: another Deployment, another Secret.
    let sa = Some(kubeconfig.as_path());
    let patch = kubectl(
        &plane,
        sa,
        &[
            "patch",
            "deployment",
            "other",
            "-n",
            &elsewhere,
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"x":"y"}}}"#,
        ],
    )
    .await;
    assert!(
        patch.as_ref().is_err_and(|e| e.contains("forbidden")),
        "another Deployment in cluster-autoscaler's namespace: {patch:?}"
    );
    for (verb, what) in [
        ("patch", "deployment/other"),
        ("update", "deployment/other"),
        ("delete", "deployment/cluster-autoscaler"),
        ("get", "secret/another"),
        ("list", "secrets"),
    ] {
        let kubeconfig = kubeconfig.display().to_string();
        let out = plane
            .kubectl(["--kubeconfig", &kubeconfig, "auth", "can-i", verb, what, "-n", &elsewhere])
            .await
            .expect("kubectl auth can-i");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no", "{verb} {what}");
    }

    // A Secret of that name the operator did not make is left alone, and said so.
    kubectl(&plane, None, &["delete", "secret", "ca-client", "-n", &elsewhere])
        .await
        .expect("delete");
    kubectl(
        &plane,
        None,
        &["create", "secret", "generic", "ca-client", "-n", &elsewhere, "--from-literal=mine=1"],
    )
    .await
    .expect("a Secret of the user's");
    issue("3").await;
    let refused = restart.check().await;
    assert!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("not a copy the operator made")),
        "{refused:?}"
    );
    let theirs = secret_data(&plane, &elsewhere, "ca-client").await;
    assert!(theirs["tls.crt"].is_null() && !theirs["mine"].is_null(), "untouched: {theirs}");
    // The copy it made names its source.
    kubectl(&plane, None, &["delete", "secret", "ca-client", "-n", &elsewhere])
        .await
        .expect("delete");
    restart.check().await.expect("a fresh copy");
    let json =
        kubectl(&plane, None, &["get", "secret", "ca-client", "-n", &elsewhere, "-o", "json"])
            .await
            .expect("the copy");
    let copy: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(copy["metadata"]["annotations"][COPIED_FROM], format!("{home}/ca-client"));
}

/// The chart's ServiceAccount and RBAC objects among `rendered`, as kubectl reads them.
async fn rbac_of(rendered: &str) -> Vec<serde_json::Value> {
    documents(rendered)
        .await
        .expect("documents")
        .into_iter()
        .filter(|d| {
            ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
                .contains(&kind(d))
        })
        .collect()
}

/// The operator reads plug meters and the BMCs of silent machines itself: it may read exactly
/// the Secrets the chart's `energy.meterSecrets`, `bmcSecrets` and `upsSecrets` name, and none
/// without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_may_read_exactly_the_secrets_it_is_given() {
    let plane = ControlPlane::start(Components::CLUSTER).await.expect("control plane");
    let out = plane.kubectl(["create", "namespace", NAMESPACE]).await.expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("service-account.kubeconfig");
    let can_i = |verb: &'static str, what: &'static str| {
        let (plane, kubeconfig) = (&plane, kubeconfig.display().to_string());
        async move {
            let out = plane
                .kubectl([
                    "--kubeconfig",
                    &kubeconfig,
                    "auth",
                    "can-i",
                    verb,
                    what,
                    "-n",
                    NAMESPACE,
                ])
                .await
                .expect("kubectl auth can-i");
            String::from_utf8_lossy(&out.stdout).trim() == "yes"
        }
    };

    let plain = render(NAMESPACE, &["tls.mode=selfManaged"]).await.expect("helm template");
    apply(&plane, &rbac_of(&plain).await).await.expect("apply the chart's RBAC");
    service_account_kubeconfig(&plane, NAMESPACE, "homelab-autoscaler", &kubeconfig)
        .await
        .expect("a kubeconfig of the ServiceAccount");
    assert!(!can_i("get", "secret/plug-token").await, "no meter Secret without the value");

    let given = ["tls.mode=selfManaged", "energy.meterSecrets={plug-token,ha-token}"];
    let rendered = render(NAMESPACE, &given).await.expect("helm template");
    apply(&plane, &rbac_of(&rendered).await).await.expect("apply the chart's RBAC");
    assert!(can_i("get", "secret/plug-token").await, "a meter Secret it was given");
    assert!(can_i("get", "secret/ha-token").await, "a meter Secret it was given");
    assert!(!can_i("get", "secret/another").await, "a Secret it was not given");
    assert!(!can_i("list", "secrets").await, "listing Secrets");

    // BMC logins, for the BMCs of silent machines, beside a meter's (one named in both once).
    let given = [
        "tls.mode=selfManaged",
        "energy.meterSecrets={plug-token}",
        "bmcSecrets={bmc-login,plug-token}",
    ];
    let rendered = render(NAMESPACE, &given).await.expect("helm template");
    apply(&plane, &rbac_of(&rendered).await).await.expect("apply the chart's RBAC");
    assert!(can_i("get", "secret/bmc-login").await, "a BMC Secret it was given");
    assert!(can_i("get", "secret/plug-token").await, "a meter Secret it was given");
    assert!(!can_i("get", "secret/ha-token").await, "a Secret no longer given");

    // NUT logins, for the pools' UPSes.
    let given = ["tls.mode=selfManaged", "upsSecrets={nut-monitor}"];
    let rendered = render(NAMESPACE, &given).await.expect("helm template");
    apply(&plane, &rbac_of(&rendered).await).await.expect("apply the chart's RBAC");
    assert!(can_i("get", "secret/nut-monitor").await, "a NUT Secret it was given");
    assert!(!can_i("get", "secret/bmc-login").await, "a Secret no longer given");
}
