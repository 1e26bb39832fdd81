//! What a node carries from its slot the moment it is created. The node admission webhook puts
//! it on the kubelet's own create, so a fresh node has no moment without cluster-autoscaler's
//! startup taint while its claim boots, and is in its group from birth (docs/decisions.md, D13).
//!
//! Only what the kubelet may carry itself goes on at creation: the API server's NodeRestriction
//! plugin judges the node as mutated against the kubelet's identity, and refuses labels under
//! `kubernetes.io` and `k8s.io` that a kubelet may not set, which would refuse the registration
//! itself. Those labels follow in the slot controller's first write, and the readiness gate
//! waits for them as for the rest of the declaration.

use k8s_openapi::api::core::v1::Node as CoreNode;

use super::marks::Marks;
use super::{Declared, Wanted};
use crate::api::Node;

/// The label namespaces a kubelet may set labels under, as NodeRestriction allows
/// (`[*.]kubelet.kubernetes.io`, `[*.]node.kubernetes.io`).
const KUBELET_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The well-known `kubernetes.io` labels a kubelet writes on its own node at every
/// registration, which NodeRestriction lets it set.
pub const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// `namespace` is `suffix` or a subdomain of it.
fn within(namespace: &str, suffix: &str) -> bool {
    namespace == suffix || namespace.strip_suffix(suffix).is_some_and(|rest| rest.ends_with('.'))
}

/// Whether a kubelet may put the label `key` on its own node when NodeRestriction is on: not
/// under `node-restriction.kubernetes.io`, and under `kubernetes.io` or `k8s.io` only the
/// kubelet's own labels and namespaces.
pub fn kubelet_may_set(key: &str) -> bool {
    let Some((namespace, _)) = key.split_once('/') else { return true };
    if within(namespace, "node-restriction.kubernetes.io") {
        return false;
    }
    let reserved = within(namespace, "kubernetes.io") || within(namespace, "k8s.io");
    !reserved
        || KUBELET_LABELS.contains(&key)
        || KUBELET_NAMESPACES.iter().any(|allowed| within(namespace, allowed))
}

/// `node` as it should be created for `slot`, whose live claim wants `marks`: its identity,
/// the part of the declaration a kubelet may carry (recorded as what the operator declared,
/// so the slot controller's first write adds the rest), and the marks. `None` when the node
/// already carries all of it.
pub fn at_registration(slot: &Node, node: &CoreNode, marks: &Marks) -> Option<CoreNode> {
    let have = Wanted::of(node);
    let mut want = have.clone();
    want.identity(slot);
    let mut declared = Declared::of(slot);
    declared.labels.retain(|key, _| kubelet_may_set(key));
    want.declared(&Declared::recorded_on(node), &declared, true);
    want.marks(marks);
    if want == have {
        return None;
    }
    let mut created = node.clone();
    want.write_into(&mut created);
    Some(created)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeSpec as SlotSpec;
    use crate::api::{LABEL_GROUP, LABEL_SLOT, POOL_MEMBERSHIP_LABEL};
    use crate::fixtures::taint;
    use crate::node_declaration::{DECLARED_ANNOTATION, marks::STARTUP_TAINT, patch};
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    #[test]
    fn kubelet_label_table() {
        let table: &[(&str, bool)] = &[
            ("homelab/size", true),
            ("size", true),
            ("infra.homecluster.dev/group", true),
            ("kubernetes.io/hostname", true),
            ("topology.kubernetes.io/zone", true),
            ("node.kubernetes.io/instance-type", true),
            ("node.kubernetes.io/exclude-from-external-load-balancers", true),
            ("example.node.kubernetes.io/disk", true),
            ("kubelet.kubernetes.io/anything", true),
            ("node-role.kubernetes.io/worker", false),
            ("kubernetes.io/role", false),
            ("example.k8s.io/x", false),
            ("k8s.io/x", false),
            ("node-restriction.kubernetes.io/pool", false),
            ("team.node-restriction.kubernetes.io/pool", false),
            // Not a subdomain of kubernetes.io: anyone's.
            ("notkubernetes.io/x", true),
        ];
        for &(key, may) in table {
            assert_eq!(kubelet_may_set(key), may, "{key}");
        }
    }

    fn slot() -> Node {
        let mut slot = Node::new(
            "m1",
            SlotSpec {
                node_labels: [
                    ("homelab/size".to_string(), "big".to_string()),
                    ("node-role.kubernetes.io/worker".to_string(), String::new()),
                ]
                .into(),
                node_taints: vec![taint("dedicated", Some("gpu"), "NoSchedule")],
                ..serde_json::from_value(json!({ "kubernetesNodeName": "m1" })).unwrap()
            },
        );
        slot.metadata.labels =
            Some([(POOL_MEMBERSHIP_LABEL.to_string(), "pool".to_string())].into());
        slot
    }

    /// As a kubelet sends it: its own labels, no taints, no providerID.
    fn fresh() -> CoreNode {
        CoreNode {
            metadata: ObjectMeta {
                name: Some("m1".into()),
                labels: Some([("kubernetes.io/hostname".to_string(), "m1".to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec::default()),
            status: None,
        }
    }

    fn taint_keys(node: &CoreNode) -> Vec<String> {
        node.spec.as_ref().unwrap().taints.iter().flatten().map(|t| t.key.clone()).collect()
    }

    #[test]
    fn a_booting_slots_node_is_created_with_the_startup_taint_and_what_a_kubelet_may_carry() {
        let booting = Marks { startup_taint: true, protected_for: None };
        let created = at_registration(&slot(), &fresh(), &booting).expect("something to add");
        let labels = created.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_GROUP], "pool");
        assert_eq!(labels[LABEL_SLOT], "m1");
        assert_eq!(labels["homelab/size"], "big");
        assert_eq!(labels["kubernetes.io/hostname"], "m1", "the kubelet's own label stays");
        assert!(
            !labels.contains_key("node-role.kubernetes.io/worker"),
            "NodeRestriction would refuse the kubelet's create"
        );
        assert_eq!(taint_keys(&created), ["dedicated", STARTUP_TAINT]);
        assert_eq!(created.spec.as_ref().unwrap().provider_id.as_deref(), Some("homelab://m1"));
        // The record names only what went on, so the slot controller's first write adds the
        // rest, and after it the node carries the whole declaration.
        let record = &created.metadata.annotations.as_ref().unwrap()[DECLARED_ANNOTATION];
        assert!(!record.contains("node-role"), "{record}");
        let mut stored = created.clone();
        stored.metadata.resource_version = Some("1".into());
        let rest = patch(&slot(), &stored, &booting, true).expect("the rest to write");
        assert_eq!(rest["metadata"]["labels"], json!({ "node-role.kubernetes.io/worker": "" }));
        assert!(rest.get("spec").is_none(), "the taints are already in place: {rest}");
    }

    #[test]
    fn without_a_booting_claim_there_is_no_startup_taint() {
        let created = at_registration(&slot(), &fresh(), &Marks::default()).expect("identity");
        assert_eq!(taint_keys(&created), ["dedicated"]);
    }

    #[test]
    fn a_node_that_carries_it_all_is_left_as_it_is() {
        let booting = Marks { startup_taint: true, protected_for: None };
        let created = at_registration(&slot(), &fresh(), &booting).unwrap();
        assert_eq!(at_registration(&slot(), &created, &booting), None);
    }
}
