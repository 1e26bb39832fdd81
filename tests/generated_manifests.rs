//! The manifests in crds/ (and webhooks/) are generated from the code. This fails when a
//! change to the types was not followed by `make manifests`.

use std::path::Path;

#[test]
fn generated_manifests_are_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let stale = homelab_autoscaler::manifests::stale(root).expect("render manifests");
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
        let crd: serde_yaml::Value = serde_yaml::from_str(&file.content).expect("crd yaml");
        assert_eq!(crd["spec"]["scope"], "Namespaced", "{:?}", file.path);
        let categories = &crd["spec"]["names"]["categories"];
        assert!(
            categories.as_sequence().is_some_and(|c| c.iter().any(|v| v == "homelab")),
            "{:?} lacks the homelab category",
            file.path
        );
        let versions = crd["spec"]["versions"].as_sequence().expect("versions");
        assert_eq!(versions.len(), 1, "only v2alpha1 is served");
        assert_eq!(versions[0]["name"], "v2alpha1");
        assert_eq!(
            versions[0]["subresources"]["status"],
            serde_yaml::Value::Mapping(Default::default())
        );
    }
}
