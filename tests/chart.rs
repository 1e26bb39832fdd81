//! The Helm chart: `helm lint` passes in every TLS mode; what `helm template` renders in each
//! mode is accepted by the real kube-apiserver in a server-side dry run (cert-manager's CRDs
//! installed, so its Issuers and Certificates are checked against their schemas too); and the
//! chart's RBAC is least privilege: no wildcard verb, resource or API group, and Secrets only in
//! Roles (the release namespace, and cluster-autoscaler's for the copy of its client Secret), by
//! name where the verb allows it.

use homelab_harness::install::{documents, helm, kind, render};
use homelab_harness::{Components, ControlPlane, cert_manager};
use serde_json::Value;

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
            "clusterAutoscaler.startupTaints={node.cilium.io/agent-not-ready}",
        ],
    ),
    (
        "a cluster-autoscaler of the user's in kube-system, power Jobs with a PriorityClass",
        &[
            "tls.mode=certManager",
            "clusterAutoscaler.external.deployment=cluster-autoscaler",
            "clusterAutoscaler.external.namespace=kube-system",
            "powerJobs.priorityClassName=homelab-autoscaler-power",
            "powerJobs.createPriorityClass=true",
            "nodeSelector.kubernetes\\.io/os=linux",
            "tolerations[0].key=node-role.kubernetes.io/control-plane",
            "tolerations[0].operator=Exists",
            "tolerations[0].effect=NoSchedule",
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
        // Server-side, so the CRDs the chart carries are checked as the objects they are. No
        // `-n`: every namespaced object names its namespace (the restart Role may be elsewhere).
        let out = plane
            .kubectl(["apply", "--server-side", "--dry-run=server", "-f", path.as_str()])
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
    // The Priority admission plugin lets any namespace's pod name a system PriorityClass (the
    // chart may leave powerJobs.priorityClassName to the user); only a ResourceQuota the
    // cluster is configured with could limit it.
    let ns = plane.fresh_namespace("chart").await.expect("namespace");
    // This control plane runs no controller that makes the default ServiceAccount.
    let out = plane.kubectl(["create", "serviceaccount", "default", "-n", ns.as_str()]).await;
    assert!(out.expect("kubectl").status.success(), "a ServiceAccount for the pod");
    let out = plane
        .kubectl([
            "run",
            "boot",
            "--image=registry.invalid/x",
            "--dry-run=server",
            "-n",
            ns.as_str(),
            "--overrides={\"spec\":{\"priorityClassName\":\"system-cluster-critical\"}}",
            "-o",
            "json",
        ])
        .await
        .expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pod: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the pod as JSON");
    assert_eq!(pod["spec"]["priority"].as_i64(), Some(2_000_000_000), "{pod}");
}

#[tokio::test]
async fn values_the_chart_does_not_know_are_refused_by_name() {
    let chart = homelab_harness::install::chart_dir().display().to_string();
    let template = |set: &'static str| {
        let chart = chart.clone();
        async move { helm(&["template", "x", chart.as_str(), "--set", set]).await }
    };
    // Keys people have been told to set, and a typo one level down.
    for (set, named) in [
        ("webhook.certManager=true", "'certManager' not allowed"),
        ("grpc.tlsSecret=my-grpc-tls", "'tlsSecret' not allowed"),
        ("tls.certManager.issuerRef.nmae=home-ca", "'nmae' not allowed"),
        ("clusterAutoscaler.external.namespce=kube-system", "'namespce' not allowed"),
        ("powerJobs.priorityClass=high", "'priorityClass' not allowed"),
        ("certManager=true", "'certManager' not allowed"),
    ] {
        let refused = template(set).await;
        assert!(
            refused.as_ref().is_err_and(|e| e.to_string().contains(named)),
            "{set}: the schema refuses it naming the key: {refused:?}"
        );
    }
    // cluster-autoscaler's --startup-taint takes a taint key, never key:Effect or key=value.
    for taint in ["node.cilium.io/agent-not-ready:NoExecute", "dedicated=gpu", "-x"] {
        let set = format!("clusterAutoscaler.startupTaints={{{taint}}}");
        let refused = helm(&["template", "x", chart.as_str(), "--set", set.as_str()]).await;
        assert!(
            refused.as_ref().is_err_and(|e| e.to_string().contains("startupTaints/0")),
            "{taint}: refused as a taint key: {refused:?}"
        );
    }
    let both = helm(&[
        "template",
        "x",
        chart.as_str(),
        "--set",
        "clusterAutoscaler.enabled=true",
        "--set",
        "clusterAutoscaler.external.deployment=cluster-autoscaler",
    ])
    .await;
    assert!(
        both.as_ref().is_err_and(|e| e.to_string().contains("set one")),
        "two cluster-autoscalers: {both:?}"
    );
}

#[tokio::test]
async fn each_mode_wires_its_certificates() {
    let ns = "hla";
    let find = |docs: &[Value], k: &str, name: &str| {
        docs.iter()
            .find(|d| kind(d) == k && d["metadata"]["name"].as_str() == Some(name))
            .cloned()
            .unwrap_or_else(|| panic!("{k} {name} missing"))
    };
    let args = |docs: &[Value]| -> Vec<String> {
        let deployment = find(docs, "Deployment", "homelab-autoscaler");
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
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

    let cm = documents(
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
    )
    .await
    .expect("documents");
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
    assert!(ca["spec"]["template"]["spec"]["nodeSelector"].is_null(), "no default placement");
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

    let own = documents(
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
    )
    .await
    .expect("documents");
    assert!(own.iter().all(|d| kind(d) != "Issuer"), "no issuer of the chart's own");
    let webhook = find(&own, "Certificate", "homelab-autoscaler-webhook");
    assert_eq!(webhook["spec"]["issuerRef"]["name"].as_str(), Some("home-ca"));
    assert_eq!(webhook["spec"]["issuerRef"]["kind"].as_str(), Some("ClusterIssuer"));

    let managed = documents(&render(ns, &["tls.mode=selfManaged"]).await.expect("render"))
        .await
        .expect("documents");
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
    let with_autoscaler = documents(
        &render(ns, &["tls.mode=selfManaged", "clusterAutoscaler.enabled=true"])
            .await
            .expect("render"),
    )
    .await
    .expect("documents");
    let a = args(&with_autoscaler);
    assert!(
        has(&a, "--grpc-client-secret=homelab-autoscaler-grpc-client")
            && has(&a, "--cluster-autoscaler-deployment=homelab-autoscaler-cluster-autoscaler")
            && has(&a, "--cluster-autoscaler-namespace=hla")
            && has(&a, "--cluster-autoscaler-client-secret=homelab-autoscaler-grpc-client")
            && !has(&a, "--power-job-priority-class"),
        "the operator keeps cluster-autoscaler on its current certificate: {a:?}"
    );
    let restart = find(&with_autoscaler, "Role", "homelab-autoscaler-restart");
    assert_eq!(restart["metadata"]["namespace"].as_str(), Some("hla"));
    assert_eq!(
        restart["rules"].as_array().map(Vec::len),
        Some(1),
        "the same Secret in the same namespace: no copy, no Secret rule: {restart:?}"
    );
    let mounted = format!(
        "{:?}",
        find(&with_autoscaler, "Deployment", "homelab-autoscaler-cluster-autoscaler")["spec"]["template"]
            ["spec"]["volumes"]
    );
    assert!(mounted.contains("homelab-autoscaler-grpc-client"), "{mounted}");

    let secrets = documents(
        &render(ns, &["tls.mode=secrets", "tls.secrets.webhook=w", "tls.secrets.grpc=g"])
            .await
            .expect("render"),
    )
    .await
    .expect("documents");
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

#[tokio::test]
async fn a_cluster_autoscaler_elsewhere_is_restarted_and_mounts_a_copy() {
    let docs = documents(
        &render(
            "hla",
            &[
                "tls.mode=certManager",
                "clusterAutoscaler.external.deployment=cluster-autoscaler",
                "clusterAutoscaler.external.namespace=kube-system",
                "powerJobs.priorityClassName=homelab-autoscaler-power",
                "powerJobs.createPriorityClass=true",
            ],
        )
        .await
        .expect("render"),
    )
    .await
    .expect("documents");
    let find = |k: &str, name: &str| {
        docs.iter()
            .find(|d| kind(d) == k && d["metadata"]["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("{k} {name} missing"))
    };
    let args = format!(
        "{:?}",
        find("Deployment", "homelab-autoscaler")["spec"]["template"]["spec"]["containers"][0]["args"]
    );
    for flag in [
        "--grpc-client-secret=homelab-autoscaler-grpc-client-tls",
        "--cluster-autoscaler-deployment=cluster-autoscaler",
        "--cluster-autoscaler-namespace=kube-system",
        "--cluster-autoscaler-client-secret=homelab-autoscaler-grpc-client-tls",
        "--power-job-priority-class=homelab-autoscaler-power",
    ] {
        assert!(args.contains(flag), "{flag} in {args}");
    }
    assert!(
        docs.iter().all(
            |d| d["metadata"]["name"].as_str() != Some("homelab-autoscaler-cluster-autoscaler")
        ),
        "no bundled cluster-autoscaler"
    );
    let role = find("Role", "homelab-autoscaler-restart");
    assert_eq!(role["metadata"]["namespace"].as_str(), Some("kube-system"));
    let rules = serde_json::to_value(&role["rules"]).expect("rules");
    assert_eq!(
        rules,
        serde_json::json!([
            { "apiGroups": ["apps"], "resources": ["deployments"],
              "resourceNames": ["cluster-autoscaler"], "verbs": ["get", "patch"] },
            { "apiGroups": [""], "resources": ["secrets"], "verbs": ["create"] },
            { "apiGroups": [""], "resources": ["secrets"],
              "resourceNames": ["homelab-autoscaler-grpc-client-tls"], "verbs": ["get", "update"] },
        ]),
        "that one Deployment, and that one copy"
    );
    let binding = find("RoleBinding", "homelab-autoscaler-restart");
    assert_eq!(binding["metadata"]["namespace"].as_str(), Some("kube-system"));
    assert_eq!(binding["subjects"][0]["namespace"].as_str(), Some("hla"));
    let own = find("Role", "homelab-autoscaler");
    let own = format!("{:?}", own["rules"]);
    assert!(
        own.contains("homelab-autoscaler-grpc-client-tls") && !own.contains("deployments"),
        "the operator reads the client Secret at home: {own}"
    );
    let class = find("PriorityClass", "homelab-autoscaler-power");
    assert_eq!(class["value"].as_i64(), Some(1_000_000));

    // Placement of both Deployments.
    let placed = documents(
        &render(
            "hla",
            &[
                "tls.mode=selfManaged",
                "clusterAutoscaler.enabled=true",
                "nodeSelector.role=infra",
                "clusterAutoscaler.nodeSelector.role=infra",
                "clusterAutoscaler.tolerations[0].key=dedicated",
                "clusterAutoscaler.tolerations[0].operator=Exists",
                "clusterAutoscaler.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=role",
                "clusterAutoscaler.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
                "clusterAutoscaler.resources.requests.cpu=200m",
            ],
        )
        .await
        .expect("render"),
    )
    .await
    .expect("documents");
    for name in ["homelab-autoscaler", "homelab-autoscaler-cluster-autoscaler"] {
        let pod = &placed
            .iter()
            .find(|d| kind(d) == "Deployment" && d["metadata"]["name"].as_str() == Some(name))
            .expect("deployment")["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"]["role"].as_str(), Some("infra"), "{name}");
    }
    let ca = &placed
        .iter()
        .find(|d| {
            d["metadata"]["name"].as_str() == Some("homelab-autoscaler-cluster-autoscaler")
                && kind(d) == "Deployment"
        })
        .expect("cluster-autoscaler")["spec"]["template"]["spec"];
    assert_eq!(ca["tolerations"][0]["key"].as_str(), Some("dedicated"));
    assert!(ca["affinity"]["nodeAffinity"].is_object(), "{:?}", ca["affinity"]);
    assert_eq!(ca["containers"][0]["resources"]["requests"]["cpu"].as_str(), Some("200m"));
}

/// What is wrong with one RBAC rule of `role_kind`: a wildcard anywhere, or Secrets reachable
/// cluster-wide, or Secrets readable or writable without naming them.
fn rule_violations(role_kind: &str, rule: &Value) -> Vec<String> {
    let list = |key: &str| -> Vec<String> {
        rule[key]
            .as_array()
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
    let rule =
        |yaml: &str| homelab_harness::yaml_readers::read_as_yaml_1_2(yaml).expect("rule").remove(0);
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
        for doc in documents(&rendered).await.expect("documents") {
            let role_kind = kind(&doc);
            if role_kind != "ClusterRole" && role_kind != "Role" {
                continue;
            }
            for rule in doc["rules"].as_array().into_iter().flatten() {
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

/// The values of `values_file` as Helm reads them (Go's YAML reader, as the upstream chart's
/// Helm would), through a throwaway chart that renders its values as JSON.
async fn values_as_helm_reads_them(values_file: &std::path::Path) -> serde_json::Value {
    let chart = tempfile::tempdir().expect("tempdir");
    std::fs::write(chart.path().join("Chart.yaml"), "apiVersion: v2\nname: read\nversion: 0.0.0\n")
        .expect("Chart.yaml");
    std::fs::create_dir(chart.path().join("templates")).expect("templates");
    std::fs::write(chart.path().join("templates/values.json"), "{{ .Values | toJson }}\n")
        .expect("template");
    let dir = chart.path().display().to_string();
    let file = values_file.display().to_string();
    let out = helm(&["template", "read", dir.as_str(), "-f", file.as_str()]).await.expect("helm");
    let json: String =
        out.lines().filter(|l| !l.starts_with("---") && !l.starts_with('#')).collect();
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The recipe for the upstream cluster-autoscaler chart: every flag it passes is one the real
/// cluster-autoscaler parses with that value, its volumes hold what its cloud-config names, and
/// it mounts the Secret and is the Deployment that this chart's values say.
#[tokio::test]
async fn the_upstream_chart_recipe_is_what_cluster_autoscaler_and_this_chart_expect() {
    let values = values_as_helm_reads_them(&homelab_harness::repo_path(
        "examples/upstream-cluster-autoscaler-values.yaml",
    ))
    .await;
    assert_eq!(values["cloudProvider"], "externalgrpc");

    // The flags the upstream chart renders: `--key=value`, the key up to its first `_`.
    let extra = values["extraArgs"].as_object().expect("extraArgs");
    let mut flags: Vec<String> = extra
        .iter()
        .map(|(key, value)| {
            let flag = key.split('_').next().unwrap_or_default();
            match value {
                serde_json::Value::String(s) => format!("--{flag}={s}"),
                serde_json::Value::Null => format!("--{flag}"),
                other => format!("--{flag}={other}"),
            }
        })
        .collect();
    assert!(
        flags.contains(
            &"--startup-taint=startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting"
                .to_string()
        ),
        "the operator's startup taint: {flags:?}"
    );
    // The real binary parses every flag and value, then stops at a kubeconfig that is not there.
    let binary = homelab_harness::e2e::autoscaler::binary().await.expect("cluster-autoscaler");
    flags.extend([
        format!("--cloud-provider={}", values["cloudProvider"].as_str().unwrap_or_default()),
        "--kubeconfig=/nonexistent/kubeconfig".to_string(),
    ]);
    let out = tokio::process::Command::new(&binary)
        .args(&flags)
        .output()
        .await
        .expect("run cluster-autoscaler");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        said.contains("Failed to build config") && !said.contains("invalid argument"),
        "cluster-autoscaler takes {flags:?}:\n{}",
        said.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );

    // The cloud-config file is where the ConfigMap is mounted.
    let cloud_config_path = extra["cloud-config"].as_str().expect("cloud-config flag");
    let mounts = values["extraVolumeMounts"].as_array().expect("extraVolumeMounts");
    let volumes = values["extraVolumes"].as_array().expect("extraVolumes");
    let mount = mounts
        .iter()
        .find(|m| cloud_config_path.starts_with(m["mountPath"].as_str().unwrap_or("-")))
        .expect("a mount holding the cloud-config");
    let volume = volumes.iter().find(|v| v["name"] == mount["name"]).expect("its volume");
    let file_name = cloud_config_path.rsplit('/').next().unwrap_or_default();

    // The ConfigMap as the API server stores it.
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let ns = plane.fresh_namespace("recipe").await.expect("namespace");
    let path = homelab_harness::repo_path("examples/upstream-cluster-autoscaler-cloud-config.yaml")
        .display()
        .to_string();
    let out = plane
        .kubectl([
            "apply",
            "--dry-run=server",
            "-n",
            ns.as_str(),
            "-f",
            path.as_str(),
            "-o",
            "json",
        ])
        .await
        .expect("kubectl");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let config_map: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(config_map["metadata"]["name"], volume["configMap"]["name"]);
    let cloud_config = config_map["data"][file_name].as_str().expect("the cloud-config key");

    // Its certificate paths are files of the mounted client Secret, the one this chart's
    // operator copies into cluster-autoscaler's namespace.
    let secret = &values["extraVolumeSecrets"]["grpc-client"];
    let secret_dir = secret["mountPath"].as_str().expect("mountPath");
    let mut keys = Vec::new();
    for line in cloud_config.lines() {
        let (key, value) = line.split_once(':').expect("key: value");
        keys.push(key.trim().to_string());
        if ["cert", "key", "cacert"].contains(&key.trim()) {
            let file = value.trim().strip_prefix(secret_dir).expect("inside the Secret's mount");
            assert!(["/tls.crt", "/tls.key", "/ca.crt"].contains(&file), "{line}");
        }
    }
    // The keys the harness's cluster-autoscaler runs with against the real provider.
    assert_eq!(keys, ["address", "cert", "key", "cacert", "grpc_timeout"]);
    assert!(
        cloud_config
            .contains("address: \"homelab-autoscaler-grpc.homelab-autoscaler-system.svc:8086\""),
        "{cloud_config}"
    );

    let ours = documents(
        &render(
            "homelab-autoscaler-system",
            &[
                "clusterAutoscaler.external.deployment=cluster-autoscaler",
                "clusterAutoscaler.external.namespace=kube-system",
            ],
        )
        .await
        .expect("render"),
    )
    .await
    .expect("documents");
    let operator = ours
        .iter()
        .find(|d| {
            kind(d) == "Deployment" && d["metadata"]["name"].as_str() == Some("homelab-autoscaler")
        })
        .expect("the operator");
    let args = format!("{:?}", operator["spec"]["template"]["spec"]["containers"][0]["args"]);
    let copy = format!(
        "--cluster-autoscaler-client-secret={}",
        secret["name"].as_str().unwrap_or_default()
    );
    let deployment = format!(
        "--cluster-autoscaler-deployment={}",
        values["fullnameOverride"].as_str().unwrap_or_default()
    );
    assert!(args.contains(&copy) && args.contains(&deployment), "{copy}, {deployment} in {args}");
}
