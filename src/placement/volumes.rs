//! Where a pod's volumes let it run. A PersistentVolume on one machine's disk (`local-path`,
//! OpenEBS LocalPV, a `local` volume) carries a required node affinity naming that machine; once
//! a pod's claim is bound to it, the pod can run there and nowhere else. The scheduler checks it
//! (its VolumeBinding filter); so must anything that decides which machine to power on.
//!
//! Two shapes bind a pod to nodes:
//!
//! - a claim bound to a PersistentVolume with `spec.nodeAffinity.required`: that selector;
//! - a claim not bound yet on which the scheduler already picked a node for a
//!   `WaitForFirstConsumer` class (`volume.kubernetes.io/selected-node`): its provisioner is
//!   creating the volume on that node, so the pod will need exactly that node.
//!
//! A claim that is not bound and has no selected node binds the pod to nothing yet: the
//! scheduler picks the node and the volume follows it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    PersistentVolumeClaim, Pod,
};

use crate::api::HOSTNAME_LABEL;

/// The annotation the scheduler sets on a `WaitForFirstConsumer` claim once it picked a node.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";

/// A volume of a pod that only some nodes can reach.
#[derive(Clone, Debug, PartialEq)]
pub struct BoundVolume {
    /// The PersistentVolumeClaim's name (in the pod's namespace).
    pub claim: String,
    /// The PersistentVolume it is bound to; `None` while it is being provisioned.
    pub volume: Option<String>,
    /// The nodes the volume can be used on.
    pub nodes: NodeSelector,
}

impl BoundVolume {
    /// `claim data-db-0 (PersistentVolume pvc-1)`, for reasons people read.
    pub fn describe(&self) -> String {
        match &self.volume {
            Some(volume) => format!("claim {} (PersistentVolume {volume})", self.claim),
            None => format!("claim {} (being provisioned)", self.claim),
        }
    }
}

/// The cluster's claims and volumes, by name, as one pass listed them.
#[derive(Debug, Default)]
pub struct VolumeIndex<'a> {
    claims: HashMap<(&'a str, &'a str), &'a PersistentVolumeClaim>,
    volumes: HashMap<&'a str, &'a PersistentVolume>,
}

impl<'a> VolumeIndex<'a> {
    pub fn new(claims: &'a [PersistentVolumeClaim], volumes: &'a [PersistentVolume]) -> Self {
        let claims = claims
            .iter()
            .filter_map(|c| {
                Some(((c.metadata.namespace.as_deref()?, c.metadata.name.as_deref()?), c))
            })
            .collect();
        let volumes =
            volumes.iter().filter_map(|v| Some((v.metadata.name.as_deref()?, v))).collect();
        Self { claims, volumes }
    }

    /// The volumes of `pod` that bind it to some nodes. A claim or volume the pass did not see
    /// binds nothing: the scheduler will say so, and the scaler does not guess.
    pub fn bound_volumes(&self, pod: &Pod) -> Vec<BoundVolume> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
        volumes
            .iter()
            .filter_map(|v| {
                // A generic ephemeral volume's claim is named after the pod and the volume.
                let claim_name = match (&v.persistent_volume_claim, &v.ephemeral) {
                    (Some(source), _) => source.claim_name.clone(),
                    (None, Some(_)) => format!("{pod_name}-{}", v.name),
                    (None, None) => return None,
                };
                let claim = self.claims.get(&(namespace, claim_name.as_str()))?;
                self.binding_of(claim, claim_name)
            })
            .collect()
    }

    fn binding_of(&self, claim: &PersistentVolumeClaim, name: String) -> Option<BoundVolume> {
        let bound_to = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
        match bound_to.filter(|v| !v.is_empty()) {
            Some(volume_name) => {
                let volume = self.volumes.get(volume_name)?;
                let nodes = volume
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_affinity.as_ref())
                    .and_then(|a| a.required.clone())?;
                Some(BoundVolume { claim: name, volume: Some(volume_name.to_owned()), nodes })
            }
            None => {
                let annotations = claim.metadata.annotations.as_ref()?;
                let node = annotations.get(SELECTED_NODE_ANNOTATION).filter(|n| !n.is_empty())?;
                Some(BoundVolume { claim: name, volume: None, nodes: hostname_is(node) })
            }
        }
    }
}

/// A selector for the node labelled with hostname `node`.
fn hostname_is(node: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: HOSTNAME_LABEL.to_owned(),
                operator: "In".to_owned(),
                values: Some(vec![node.to_owned()]),
            }]),
            match_fields: None,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "db-0", "namespace": "apps" },
            "spec": { "containers": [{ "name": "db", "image": "db" }], "volumes": volumes },
        }))
        .unwrap()
    }

    fn claim(name: &str, volume: Option<&str>, selected: Option<&str>) -> PersistentVolumeClaim {
        let annotations = selected.map(|n| json!({ SELECTED_NODE_ANNOTATION: n }));
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "apps", "annotations": annotations },
            "spec": { "volumeName": volume },
        }))
        .unwrap()
    }

    fn local_volume(name: &str, node: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "nodeAffinity": { "required": { "nodeSelectorTerms": [
                { "matchExpressions": [
                    { "key": HOSTNAME_LABEL, "operator": "In", "values": [node] }
                ] }
            ] } } },
        }))
        .unwrap()
    }

    fn network_volume(name: &str) -> PersistentVolume {
        serde_json::from_value(json!({ "metadata": { "name": name }, "spec": {} })).unwrap()
    }

    fn nodes_of(found: &[BoundVolume]) -> Vec<String> {
        found
            .iter()
            .flat_map(|b| &b.nodes.node_selector_terms)
            .flat_map(|t| t.match_expressions.iter().flatten())
            .flat_map(|r| r.values.iter().flatten().cloned())
            .collect()
    }

    #[test]
    fn which_volumes_bind_a_pod_to_nodes() {
        let claims = vec![
            claim("data-db-0", Some("pvc-local"), None),
            claim("shared", Some("pvc-nfs"), None),
            claim("fresh", None, None),
            claim("provisioning", None, Some("mini-3")),
            claim("db-0-scratch", Some("pvc-scratch"), None),
            claim("lost", Some("pvc-gone"), None),
        ];
        let volumes = vec![
            local_volume("pvc-local", "mini-2"),
            network_volume("pvc-nfs"),
            local_volume("pvc-scratch", "mini-4"),
        ];
        let index = VolumeIndex::new(&claims, &volumes);
        let with =
            |name: &str| json!([{ "name": "v", "persistentVolumeClaim": { "claimName": name } }]);
        let table = [
            ("a claim bound to a local volume", with("data-db-0"), vec!["mini-2"]),
            ("a network volume has no node affinity", with("shared"), vec![]),
            ("an unbound claim without a node binds nothing yet", with("fresh"), vec![]),
            ("a claim being provisioned on a selected node", with("provisioning"), vec!["mini-3"]),
            ("a claim the pass did not see", with("missing"), vec![]),
            ("a volume the pass did not see", with("lost"), vec![]),
            (
                "a generic ephemeral volume's claim is named after the pod",
                json!([{ "name": "scratch", "ephemeral": { "volumeClaimTemplate": { "spec": {} } } }]),
                vec!["mini-4"],
            ),
            ("an emptyDir binds nothing", json!([{ "name": "tmp", "emptyDir": {} }]), vec![]),
        ];
        for (name, volumes, want) in table {
            assert_eq!(nodes_of(&index.bound_volumes(&pod(volumes))), want, "{name}");
        }
    }

    #[test]
    fn a_bound_volume_describes_itself_for_people() {
        let claims = vec![claim("data-db-0", Some("pvc-local"), None)];
        let volumes = vec![local_volume("pvc-local", "mini-2")];
        let index = VolumeIndex::new(&claims, &volumes);
        let found = index.bound_volumes(&pod(
            json!([{ "name": "data", "persistentVolumeClaim": { "claimName": "data-db-0" } }]),
        ));
        assert_eq!(found[0].describe(), "claim data-db-0 (PersistentVolume pvc-local)");
    }
}
