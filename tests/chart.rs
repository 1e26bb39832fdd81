//! The Helm chart: `helm lint` passes in every TLS mode; what `helm template` renders in each
//! mode is accepted by the real kube-apiserver in a server-side dry run (cert-manager's CRDs
//! installed, so its Issuers and Certificates are checked against their schemas too); and the
//! chart's RBAC is least privilege: no wildcard verb, resource or API group, and Secrets only in
//! the release namespace, by name where the verb allows it.

use homelab_harness::install::{documents, helm, kind, render};
use homelab_harness::{Components, ControlPlane, cert_manager};
use serde_yaml::Value;

/// Every TLS mode, with what it needs set, and the options that add objects switched on.
const MODES: &[(&str, &[&str])] = &[
    ("certManager", &["tls.mode=certManager", "clusterAutoscaler.enabled=true"]),
    (
        "certManager with an issuer of the user's",
        &[
            "tls.mode=certManager",
            "tls.certManager.issuerRef.name=home-ca",
            "tls.certManager.issuerRef.kind=ClusterIssuer",
        ],
    ),
    ("selfManaged", &["tls.mode=selfManaged"]),
    (
        "selfManaged with cluster-autoscaler",
        &["tls.mode=selfManaged", "clusterAutoscaler.enabled=true"],
    ),
    (
        "secrets",
        &[
            "tls.mode=secrets",
            "tls.secrets.webhook=my-webhook-tls",
            "tls.secrets.grpc=my-grpc-tls",
            "tls.secrets.grpcClient=my-ca-client-tls",
            "clusterAutoscaler.enabled=true",
            "clusterAutoscaler.startupTaints={node.cilium.io/agent-not-ready:NoExecute}",
        ],
    ),
];

#[tokio::test]
async fn the_chart_lints_in_every_mode() {
    let chart = homelab_harness::install::chart_dir().display().to_string();
    for (mode, sets) in MODES {
        let mut args = vec!["lint", chart.as_str(), "--strict"];
        for set in *sets {
            args.extend(["--set", set]);
        }
        let lint = helm(&args).await.unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        assert!(lint.contains("0 chart(s) failed"), "{mode}: {lint}");
    }
    let refused = helm(&["template", "x", chart.as_str(), "--set", "tls.mode=none"]).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("certManager")),
        "the schema refuses an unknown mode: {refused:?}"
    );
    let refused = helm(&["template", "x", chart.as_str(), "--set", "tls.mode=secrets"]).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("tls.secrets.webhook is required")),
        "the secrets mode names its Secret: {refused:?}"
    );
}

#[tokio::test]
async fn every_mode_renders_objects_the_apiserver_accepts() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    cert_manager::install_crds(plane).await.expect("cert-manager CRDs");
    for (mode, sets) in MODES {
        let ns = plane.fresh_namespace("chart").await.expect("namespace");
        let rendered = render(&ns, sets).await.unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        let file = tempfile::NamedTempFile::new().expect("file");
        std::fs::write(file.path(), &rendered).expect("write rendered chart");
        let path = file.path().to_string_lossy().into_owned();
        // Server-side, so the CRDs the chart carries are checked as the objects they are.
        let out = plane
            .kubectl([
                "apply",
                "--server-side",
                "--dry-run=server",
                "-n",
                ns.as_str(),
                "-f",
                path.as_str(),
            ])
            .await
            .expect("kubectl");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: the apiserver refused the chart: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("deployment.apps/homelab-autoscaler serverside-applied"),
            "{mode}: {stdout}"
        );
    }
}

#[tokio::test]
async fn each_mode_wires_its_certificates() {
    let ns = "hla";
    let docs = |yaml: &str| documents(yaml).expect("documents");
    let find = |docs: &[Value], k: &str, name: &str| {
        docs.iter()
            .find(|d| kind(d) == k && d["metadata"]["name"].as_str() == Some(name))
            .cloned()
            .unwrap_or_else(|| panic!("{k} {name} missing"))
    };
    let args = |docs: &[Value]| -> Vec<String> {
        let deployment = find(docs, "Deployment", "homelab-autoscaler");
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .map(|a| a.as_str().unwrap_or_default().to_string())
            .collect()
    };
    let has = |args: &[String], flag: &str| args.iter().any(|a| a.starts_with(flag));
    let annotated = |docs: &[Value]| {
        docs.iter().filter(|d| kind(d).ends_with("WebhookConfiguration")).all(|d| {
            d["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str()
                == Some("hla/homelab-autoscaler-webhook")
        })
    };

    let cm = docs(
        &render(
            ns,
            &[
                "tls.mode=certManager",
                "clusterAutoscaler.enabled=true",
                "serviceMonitor.enabled=true",
            ],
        )
        .await
        .expect("render"),
    );
    assert!(annotated(&cm), "cainjector fills both configurations");
    let a = args(&cm);
    assert!(has(&a, "--webhook-cert-dir=") && has(&a, "--grpc-cert-dir="), "{a:?}");
    for name in [
        "homelab-autoscaler-root-ca",
        "homelab-autoscaler-webhook",
        "homelab-autoscaler-grpc",
        "homelab-autoscaler-grpc-client",
    ] {
        find(&cm, "Certificate", name);
    }
    find(&cm, "Issuer", "homelab-autoscaler-ca");
    let ca = find(&cm, "Deployment", "homelab-autoscaler-cluster-autoscaler");
    let ca_args = format!("{:?}", ca["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(ca_args.contains("--cloud-provider=externalgrpc"), "{ca_args}");
    assert!(
        ca_args.contains(
            "--startup-taint=startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting"
        ),
        "{ca_args}"
    );
    let cloud_config = find(&cm, "ConfigMap", "homelab-autoscaler-cluster-autoscaler");
    let cloud_config = cloud_config["data"]["cloud-config.yaml"].as_str().expect("cloud-config");
    assert!(
        cloud_config.contains("address: \"homelab-autoscaler-grpc.hla.svc:8086\""),
        "{cloud_config}"
    );
    assert!(cloud_config.contains("cert:") && cloud_config.contains("cacert:"), "{cloud_config}");
    let monitor = find(&cm, "ServiceMonitor", "homelab-autoscaler");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"].as_str(), Some("/metrics"));
    assert_eq!(monitor["spec"]["endpoints"][0]["port"].as_str(), Some("admin"));
    find(&cm, "PodDisruptionBudget", "homelab-autoscaler");
    for crd in cm.iter().filter(|d| kind(d) == "CustomResourceDefinition") {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"].as_str(),
            Some("keep")
        );
    }
    assert_eq!(cm.iter().filter(|d| kind(d) == "CustomResourceDefinition").count(), 3);

    let own = docs(
        &render(
            ns,
            &[
                "tls.mode=certManager",
                "tls.certManager.issuerRef.name=home-ca",
                "tls.certManager.issuerRef.kind=ClusterIssuer",
            ],
        )
        .await
        .expect("render"),
    );
    assert!(own.iter().all(|d| kind(d) != "Issuer"), "no issuer of the chart's own");
    let webhook = find(&own, "Certificate", "homelab-autoscaler-webhook");
    assert_eq!(webhook["spec"]["issuerRef"]["name"].as_str(), Some("home-ca"));
    assert_eq!(webhook["spec"]["issuerRef"]["kind"].as_str(), Some("ClusterIssuer"));

    let managed = docs(&render(ns, &["tls.mode=selfManaged"]).await.expect("render"));
    assert!(managed.iter().all(|d| kind(d) != "Certificate"), "no cert-manager objects");
    assert!(
        !annotated(&managed)
            && managed
                .iter()
                .filter(|d| kind(d).ends_with("WebhookConfiguration"))
                .all(|d| d["metadata"]["annotations"].is_null())
    );
    let a = args(&managed);
    assert!(
        has(&a, "--webhook-dns-names=homelab-autoscaler-webhook.hla.svc")
            && !has(&a, "--webhook-cert-dir=")
            && has(&a, "--grpc-self-managed-tls")
            && has(&a, "--grpc-dns-names=homelab-autoscaler-grpc.hla.svc")
            && !has(&a, "--grpc-cert-dir=")
            && !has(&a, "--cluster-autoscaler-deployment="),
        "gRPC is served from the self-managed CA: {a:?}"
    );
    let with_autoscaler = docs(
        &render(ns, &["tls.mode=selfManaged", "clusterAutoscaler.enabled=true"])
            .await
            .expect("render"),
    );
    let a = args(&with_autoscaler);
    assert!(
        has(&a, "--grpc-client-secret=homelab-autoscaler-grpc-client")
            && has(&a, "--cluster-autoscaler-deployment=homelab-autoscaler-cluster-autoscaler"),
        "the operator keeps cluster-autoscaler on its current certificate: {a:?}"
    );
    let mounted = format!(
        "{:?}",
        find(&with_autoscaler, "Deployment", "homelab-autoscaler-cluster-autoscaler")["spec"]["template"]
            ["spec"]["volumes"]
    );
    assert!(mounted.contains("homelab-autoscaler-grpc-client"), "{mounted}");

    let secrets = docs(
        &render(ns, &["tls.mode=secrets", "tls.secrets.webhook=w", "tls.secrets.grpc=g"])
            .await
            .expect("render"),
    );
    let a = args(&secrets);
    assert!(
        has(&a, "--webhook-cert-dir=")
            && has(&a, "--webhook-patch-ca-bundle")
            && has(&a, "--grpc-cert-dir="),
        "{a:?}"
    );
    let volumes = format!(
        "{:?}",
        find(&secrets, "Deployment", "homelab-autoscaler")["spec"]["template"]["spec"]["volumes"]
    );
    assert!(volumes.contains("\"w\"") && volumes.contains("\"g\""), "{volumes}");
}

/// What is wrong with one RBAC rule of `role_kind`: a wildcard anywhere, or Secrets reachable
/// cluster-wide, or Secrets readable or writable without naming them.
fn rule_violations(role_kind: &str, rule: &Value) -> Vec<String> {
    let list = |key: &str| -> Vec<String> {
        rule[key]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect()
    };
    let mut wrong = Vec::new();
    for key in ["verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"] {
        if list(key).iter().any(|v| v.contains('*')) {
            wrong.push(format!("a wildcard in {key}"));
        }
    }
    let secrets = list("resources").iter().any(|r| r == "secrets" || r.starts_with("secrets/"))
        && list("apiGroups").iter().any(String::is_empty);
    if secrets && role_kind == "ClusterRole" {
        wrong.push("Secrets in a ClusterRole (cluster-wide)".into());
    }
    if secrets && list("resourceNames").is_empty() && list("verbs").iter().any(|v| v != "create") {
        wrong.push("Secrets without resourceNames beyond create".into());
    }
    wrong
}

#[test]
fn the_rule_check_catches_what_it_must() {
    let rule = |yaml: &str| serde_yaml::from_str::<Value>(yaml).expect("rule");
    let cases = [
        ("ClusterRole", "{apiGroups: [''], resources: [nodes], verbs: [get]}", 0),
        ("ClusterRole", "{apiGroups: ['*'], resources: [nodes], verbs: [get]}", 1),
        ("Role", "{apiGroups: [''], resources: ['*'], verbs: [get]}", 1),
        ("Role", "{apiGroups: [''], resources: [pods], verbs: ['*']}", 1),
        ("ClusterRole", "{nonResourceURLs: ['*'], verbs: [get]}", 1),
        (
            "ClusterRole",
            "{apiGroups: [''], resources: [secrets], resourceNames: [a], verbs: [get]}",
            1,
        ),
        ("Role", "{apiGroups: [''], resources: [secrets], verbs: [get, list]}", 1),
        ("Role", "{apiGroups: [''], resources: [secrets], verbs: [create]}", 0),
        (
            "Role",
            "{apiGroups: [''], resources: [secrets], resourceNames: [ca], verbs: [get, update]}",
            0,
        ),
    ];
    for (role_kind, text, want) in cases {
        assert_eq!(rule_violations(role_kind, &rule(text)).len(), want, "{role_kind} {text}");
    }
}

#[tokio::test]
async fn the_chart_rbac_has_no_wildcards_and_no_cluster_wide_secrets() {
    let mut checked = 0;
    for (mode, sets) in MODES {
        let rendered = render("hla", sets).await.unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        for doc in documents(&rendered).expect("documents") {
            let role_kind = kind(&doc);
            if role_kind != "ClusterRole" && role_kind != "Role" {
                continue;
            }
            for rule in doc["rules"].as_sequence().into_iter().flatten() {
                let wrong = rule_violations(role_kind, rule);
                assert!(
                    wrong.is_empty(),
                    "{mode}: {role_kind} {}: {wrong:?} in {rule:?}",
                    doc["metadata"]["name"].as_str().unwrap_or_default()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "the check saw the chart's rules ({checked})");
}
