//! A registering Kubernetes Node, as the node webhook answers it: the JSON patch that gives the
//! kubelet's create what its slot declares (`crate::node_declaration::registration`). This
//! webhook never refuses: a node it cannot judge registers as the kubelet sent it.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation};
use k8s_openapi::api::core::v1::Node as CoreNode;
use serde_json::{Value, json};

use crate::api::{Node, NodeClaim};
use crate::node_declaration::{marks, registration};
use crate::phase;

/// The patch for `raw`, the node under admission (`node` as read), registering for `slot`
/// whose claims are `claims`. Empty when the node already carries it all.
pub fn patch(
    raw: &Value,
    node: &CoreNode,
    slot: &Node,
    claims: &[NodeClaim],
) -> Vec<PatchOperation> {
    let want = marks::wanted(phase::newest_live(claims));
    let Some(created) = registration::at_registration(slot, node, &want) else {
        return Vec::new();
    };
    let mut ops = Vec::new();
    let mut set = |path: &[&str], value: Value| {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(path.iter().copied()),
            value,
        }));
    };
    let (have, want) = (&node.metadata, &created.metadata);
    if have.labels != want.labels {
        set(&["metadata", "labels"], json!(want.labels));
    }
    if have.annotations != want.annotations {
        set(&["metadata", "annotations"], json!(want.annotations));
    }
    let spec = created.spec.unwrap_or_default();
    if raw.get("spec").is_none_or(|s| !s.is_object()) {
        set(&["spec"], json!(spec));
        return ops;
    }
    let had = node.spec.clone().unwrap_or_default();
    if had.taints != spec.taints {
        set(&["spec", "taints"], json!(spec.taints));
    }
    if had.provider_id != spec.provider_id {
        set(&["spec", "providerID"], json!(spec.provider_id));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LABEL_SLOT, NodeClaimPhase, POOL_MEMBERSHIP_LABEL};
    use crate::fixtures;
    use crate::node_declaration::marks::STARTUP_TAINT;

    fn slot() -> Node {
        let mut slot: Node = serde_json::from_value(json!({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
            "metadata": { "name": "slot-a", "labels": { POOL_MEMBERSHIP_LABEL: "g" } },
            "spec": { "kubernetesNodeName": "m1", "nodeLabels": { "pool": "g" } },
        }))
        .unwrap();
        slot.metadata.namespace = Some("ns".into());
        slot
    }

    fn claim(phase: NodeClaimPhase) -> NodeClaim {
        let mut c = fixtures::claim("c1", "slot-a", "g");
        c.status.get_or_insert_with(Default::default).phase = Some(phase);
        c
    }

    /// `raw` after the webhook's patch, as the API server applies it.
    fn admitted(raw: Value, claims: &[NodeClaim]) -> CoreNode {
        let node: CoreNode = serde_json::from_value(raw.clone()).unwrap();
        let ops = patch(&raw, &node, &slot(), claims);
        let mut doc = raw;
        json_patch::patch(&mut doc, &json_patch::Patch(ops)).expect("the patch applies");
        serde_json::from_value(doc).unwrap()
    }

    fn taints(node: &CoreNode) -> Vec<String> {
        node.spec.iter().flat_map(|s| s.taints.iter().flatten()).map(|t| t.key.clone()).collect()
    }

    #[test]
    fn a_kubelets_create_gets_the_declaration_and_the_startup_taint_while_its_claim_boots() {
        let raw = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "m1", "labels": { "kubernetes.io/hostname": "m1" } },
            "spec": {},
            "status": { "capacity": { "cpu": "4" } },
        });
        let node = admitted(raw.clone(), &[claim(NodeClaimPhase::Booting)]);
        let labels = node.metadata.labels.clone().unwrap();
        assert_eq!((labels["pool"].as_str(), labels[LABEL_SLOT].as_str()), ("g", "slot-a"));
        assert_eq!(taints(&node), [STARTUP_TAINT]);
        assert_eq!(node.status.unwrap().capacity.unwrap()["cpu"].0, "4", "the rest is kept");
        // Ready, completed or no claim: no startup taint.
        for claims in [vec![claim(NodeClaimPhase::Ready)], vec![claim(NodeClaimPhase::Completed)]] {
            assert!(taints(&admitted(raw.clone(), &claims)).is_empty());
        }
    }

    #[test]
    fn a_create_without_a_spec_gets_one_and_a_patched_create_is_left_alone() {
        let raw = json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "m1" } });
        let booting = [claim(NodeClaimPhase::Pending)];
        let node = admitted(raw, &booting);
        assert_eq!(taints(&node), [STARTUP_TAINT]);
        let again = serde_json::to_value(&node).unwrap();
        assert!(patch(&again, &node, &slot(), &booting).is_empty(), "idempotent");
    }
}
