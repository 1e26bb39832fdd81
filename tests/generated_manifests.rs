//! The manifests in crds/ and webhooks/ (and the chart's copies) are generated from the code.
//! This fails when a change to the types was not followed by `make manifests`, and when any
//! manifest we ship, generated or written by hand, means something else to kubectl and Helm
//! (which read YAML as Go does) than to a YAML 1.2 reader.

use std::path::{Path, PathBuf};

use homelab_harness::install::render;
use homelab_harness::yaml_readers::{
    differences, read_as_go, read_as_yaml_1_2, read_values_as_helm,
};
use homelab_harness::{Components, ControlPlane};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn generated_manifests_are_up_to_date() {
    let stale = homelab_autoscaler::manifests::stale(root()).expect("render manifests");
    assert!(
        stale.is_empty(),
        "stale generated manifests (run `make manifests` and commit): {stale:?}"
    );
}

#[test]
fn every_kind_is_in_the_homelab_category_and_namespaced() {
    for file in homelab_autoscaler::manifests::generated().expect("render manifests") {
        if !file.path.starts_with("crds") {
            continue;
        }
        let crd = read_as_yaml_1_2(&file.content).expect("crd yaml").remove(0);
        assert_eq!(crd["spec"]["scope"], "Namespaced", "{:?}", file.path);
        let categories = &crd["spec"]["names"]["categories"];
        assert!(
            categories.as_array().is_some_and(|c| c.iter().any(|v| v == "homelab")),
            "{:?} lacks the homelab category",
            file.path
        );
        let versions = crd["spec"]["versions"].as_array().expect("versions");
        assert_eq!(versions.len(), 1, "only v2alpha1 is served");
        assert_eq!(versions[0]["name"], "v2alpha1");
        assert_eq!(versions[0]["subresources"]["status"], json!({}));
    }
}

/// Every YAML file of `dir` (relative to the repository root), sorted.
fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("listing {dir}: {e}"))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML files in {dir}");
    files
}

/// The objects of `path` as kubectl reads them (Helm, for a values file: documents without a
/// `kind`), and where a YAML 1.2 reader disagrees.
async fn disagreements(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("read the file");
    let yaml_1_2 = read_as_yaml_1_2(&text).expect("a YAML 1.2 reader reads it");
    let go = if yaml_1_2.iter().all(|document| document.get("kind").is_some()) {
        read_as_go(path).await
    } else {
        read_values_as_helm(path).await.map(|values| vec![values])
    }
    .unwrap_or_else(|e| panic!("{e:#}"));
    if go.len() != yaml_1_2.len() {
        return vec![format!("kubectl reads {} objects, YAML 1.2 {}", go.len(), yaml_1_2.len())];
    }
    go.iter()
        .zip(&yaml_1_2)
        .enumerate()
        .flat_map(|(i, (go, yaml_1_2))| {
            differences(go, yaml_1_2).into_iter().map(move |d| format!("object {i}{d}"))
        })
        .collect()
}

#[tokio::test]
async fn every_shipped_manifest_means_the_same_to_kubectl_and_to_yaml_1_2() {
    let mut files = Vec::new();
    for dir in ["crds", "webhooks", "examples", "charts/homelab-autoscaler/templates/crds"] {
        files.extend(yaml_files(dir));
    }
    files.push(root().join("charts/homelab-autoscaler/values.yaml"));
    // The chart as Helm renders it, in each TLS mode.
    let rendered = tempfile::tempdir().expect("tempdir");
    for mode in ["selfManaged", "certManager"] {
        let text = render("homelab-autoscaler-system", &[&format!("tls.mode={mode}")])
            .await
            .expect("helm template");
        let path = rendered.path().join(format!("chart-{mode}.yaml"));
        std::fs::write(&path, text).expect("write the rendered chart");
        files.push(path);
    }
    let mut problems = Vec::new();
    for path in &files {
        for difference in disagreements(path).await {
            problems.push(format!("{}: {difference}", path.display()));
        }
    }
    assert!(problems.is_empty(), "read differently by kubectl:\n{}", problems.join("\n"));
}

/// The check above catches a manifest that YAML 1.1 reads as something else.
#[tokio::test]
async fn the_check_catches_unquoted_yaml_1_1_booleans() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("slot.yaml");
    std::fs::write(
        &path,
        "apiVersion: infra.homecluster.dev/v2alpha1\nkind: Node\nmetadata: {name: m1}\n\
         spec:\n  power:\n    offWith: ssh\n    http:\n      onRequest: {url: 'http://plug'}\n\
         status: {powerState: off, phase: on}\n",
    )
    .expect("write");
    let found = disagreements(&path).await;
    assert_eq!(
        found,
        [
            "object 0.status.phase: Go reads true, YAML 1.2 reads \"on\"",
            "object 0.status.powerState: Go reads false, YAML 1.2 reads \"off\"",
        ],
    );
}

/// docs/keeping-machines-on.md asks for quoted times because YAML 1.1 reads an unquoted `18:00`
/// as the base-60 number 1080. kubectl and Helm do not: both keep it the string `"18:00"`, as a
/// schedule window's field wants (tools that read YAML 1.1, such as PyYAML, do not).
#[tokio::test]
async fn kubectl_and_helm_read_an_unquoted_clock_time_as_a_string() {
    let dir = tempfile::tempdir().expect("tempdir");
    let group = dir.path().join("group.yaml");
    std::fs::write(
        &group,
        "apiVersion: infra.homecluster.dev/v2alpha1\nkind: Group\nmetadata: {name: home}\n\
         spec:\n  schedules:\n  - days: Mon-Fri\n    from: 08:00\n    to: 18:00\n",
    )
    .expect("write");
    let by_kubectl = read_as_go(&group).await.expect("kubectl reads it");
    let window = &by_kubectl[0]["spec"]["schedules"][0];
    assert_eq!((&window["from"], &window["to"]), (&json!("08:00"), &json!("18:00")));
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "window:\n  from: 08:00\n  to: 18:00\n").expect("write");
    let by_helm = read_values_as_helm(&values).await.expect("helm reads it");
    assert_eq!(by_helm["window"], json!({ "from": "08:00", "to": "18:00" }));
}

/// Installed with kubectl as a user installs it, the slot CRD takes every power state and phase
/// the operator writes (an enum read as `[true, false]` refuses them all).
#[tokio::test]
async fn a_kubectl_installed_slot_crd_takes_every_status_the_operator_writes() {
    let plane = ControlPlane::shared(Components::API).await.expect("control plane");
    let _logs = plane.logs_on_failure();
    plane.install_crds().await.expect("kubectl apply -f crds/");
    let client = plane.client().expect("client");
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("nodes.infra.homecluster.dev")
        .await
        .expect("the slot CRD");
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("schema as JSON");
    let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(
        status["powerState"]["enum"],
        json!(["on", "off", "suspended", null]),
        "{}",
        status["powerState"]
    );

    let ns = plane.fresh_namespace("kubectl-crd").await.expect("namespace");
    let slots: Api<homelab_autoscaler::api::Node> = Api::namespaced(client, &ns);
    let slot: homelab_autoscaler::api::Node = serde_json::from_value(json!({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
        "metadata": { "name": "m1", "labels": { "group": "pool" } },
        "spec": { "kubernetesNodeName": "m1" },
    }))
    .expect("a slot");
    slots.create(&PostParams::default(), &slot).await.expect("create the slot");
    let enums = |field: &str| -> Vec<String> {
        status[field]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("status.{field} has an enum"))
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| v.as_str().expect("a string enum value").to_owned())
            .collect()
    };
    for (field, values) in [("powerState", enums("powerState")), ("phase", enums("phase"))] {
        for value in values {
            let patch = json!({ "status": { field: value } });
            slots
                .patch_status("m1", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap_or_else(|e| panic!("status.{field}={value} refused: {e}"));
            let back: Value =
                serde_json::to_value(slots.get_status("m1").await.expect("get")).expect("json");
            assert_eq!(back["status"][field], json!(value));
        }
    }
}
