//! What a slot's machine's Kubernetes node carries from its slot, computed as the node the slot
//! wants. The slot controller writes it as one merge patch of the difference ([`patch`]); the
//! node admission webhook puts what a kubelet may carry onto the node as it is created
//! ([`registration`]), so a fresh node is never without its marks:
//!
//! - identity: the group and slot labels, and a providerID when the node registered without one;
//! - what the slot declares (`nodeLabels`, `nodeTaints`): written when the node registers, while
//!   the machine boots (the claim's readiness gate waits for it), and when the declaration
//!   changes. The operator removes the node of a machine that is off, so a
//!   node is new at every boot and the template's promise ("the pool's machines carry these")
//!   holds only if the operator writes them. What it last wrote is recorded on the node
//!   ([`DECLARED_ANNOTATION`]), so a label or taint the slot no longer declares is taken off,
//!   and every label and taint that someone else put on is left alone;
//! - cluster-autoscaler's marks ([`marks`]).
//!
//! The taint list is replaced whole by a merge patch, so every patch carries the
//! resourceVersion it was computed from: a concurrent write makes it conflict, and the writer
//! computes it again at once on a fresh read of the node, rather than dropping what the other
//! writer added. A fresh node changes several times a second while it registers, and the
//! readiness gate waits for this write (docs/decisions.md, D13).

pub mod marks;
pub mod registration;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node as CoreNode, Taint};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use self::marks::Marks;
use crate::api::{LABEL_GROUP, LABEL_SLOT, Node};
use crate::machine;

/// The labels and taints the operator last wrote onto the node from the slot's declaration.
pub const DECLARED_ANNOTATION: &str = "infra.homecluster.dev/declared";

/// A slot's declaration of what its node carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declared {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<DeclaredTaint>,
}

/// A taint as the slot declares it (no `timeAdded`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredTaint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

impl DeclaredTaint {
    fn of(taint: &Taint) -> Self {
        Self { key: taint.key.clone(), value: taint.value.clone(), effect: taint.effect.clone() }
    }

    /// A node holds one taint per key and effect.
    fn same_slot(&self, taint: &Taint) -> bool {
        self.key == taint.key && self.effect == taint.effect
    }

    fn to_taint(&self) -> Taint {
        Taint {
            key: self.key.clone(),
            value: self.value.clone(),
            effect: self.effect.clone(),
            time_added: None,
        }
    }
}

impl Declared {
    pub fn of(slot: &Node) -> Self {
        Self {
            labels: slot.spec.node_labels.clone(),
            taints: slot.spec.node_taints.iter().map(DeclaredTaint::of).collect(),
        }
    }

    /// What the operator last wrote onto `node`; nothing when it never did (a new node) or the
    /// record cannot be read.
    pub fn recorded_on(node: &CoreNode) -> Self {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DECLARED_ANNOTATION))
            .and_then(|raw| serde_json::from_str(raw).ok())
            .unwrap_or_default()
    }

    fn record(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The node as the slot side wants it: only the fields it writes.
#[derive(Clone, Debug, PartialEq)]
struct Wanted {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    taints: Vec<Taint>,
    provider_id: Option<String>,
}

impl Wanted {
    fn of(node: &CoreNode) -> Self {
        Self {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            annotations: node.metadata.annotations.clone().unwrap_or_default(),
            taints: node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default(),
            provider_id: node.spec.as_ref().and_then(|s| s.provider_id.clone()),
        }
    }

    fn identity(&mut self, slot: &Node) {
        let slot_name = slot.metadata.name.clone().unwrap_or_default();
        let group = slot.group().unwrap_or_default().to_owned();
        self.labels.insert(LABEL_GROUP.into(), group);
        self.labels.insert(LABEL_SLOT.into(), slot_name);
        if self.provider_id.as_deref().is_none_or(str::is_empty) {
            self.provider_id = Some(machine::declared_provider_id(slot));
        }
    }

    /// Brings the node from what was last declared to what is declared now. While the machine
    /// boots the whole declaration is written, since the readiness gate waits for it (a node
    /// the kubelet took over may have lost part of it by hand). Otherwise, unchanged, nothing
    /// is written: a declared taint a person took off by hand stays off until the next boot
    /// or the next change of the declaration.
    fn declared(&mut self, previous: &Declared, now: &Declared, booting: bool) {
        if previous == now && !booting {
            return;
        }
        for (key, value) in &previous.labels {
            if !now.labels.contains_key(key) && self.labels.get(key) == Some(value) {
                self.labels.remove(key);
            }
        }
        self.labels.extend(now.labels.clone());
        // A declared taint already in place keeps its place: reordering the list would be a
        // write of its own.
        self.taints.retain(|t| match now.taints.iter().find(|d| d.same_slot(t)) {
            Some(declared) => declared.value == t.value,
            None => !previous.taints.iter().any(|d| d.same_slot(t)),
        });
        let missing: Vec<Taint> = now
            .taints
            .iter()
            .filter(|d| !self.taints.iter().any(|t| d.same_slot(t)))
            .map(DeclaredTaint::to_taint)
            .collect();
        self.taints.extend(missing);
        self.annotations.insert(DECLARED_ANNOTATION.into(), now.record());
    }

    fn marks(&mut self, want: &Marks) {
        marks::apply(&mut self.taints, &mut self.annotations, want);
    }

    /// Puts these fields onto `node`.
    fn write_into(self, node: &mut CoreNode) {
        node.metadata.labels = Some(self.labels);
        node.metadata.annotations = Some(self.annotations);
        let spec = node.spec.get_or_insert_with(Default::default);
        spec.taints = Some(self.taints);
        spec.provider_id = self.provider_id;
    }
}

/// A merge patch of one string map: the keys that differ, `null` for a removed key.
fn map_patch(
    have: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
) -> Map<String, Value> {
    let mut patch = Map::new();
    for (key, value) in want {
        if have.get(key) != Some(value) {
            patch.insert(key.clone(), json!(value));
        }
    }
    for key in have.keys().filter(|k| !want.contains_key(*k)) {
        patch.insert(key.clone(), Value::Null);
    }
    patch
}

/// Everything the slot side wants of `node`, as one merge patch guarded by the node's
/// resourceVersion, or `None` when the node already carries it all. `booting`: the slot's
/// claim is in its boot window, and the readiness gate waits for the whole declaration.
pub fn patch(slot: &Node, node: &CoreNode, marks: &Marks, booting: bool) -> Option<Value> {
    let have = Wanted::of(node);
    let mut want = have.clone();
    want.identity(slot);
    want.declared(&Declared::recorded_on(node), &Declared::of(slot), booting);
    want.marks(marks);
    if want == have {
        return None;
    }
    let mut metadata = Map::new();
    let labels = map_patch(&have.labels, &want.labels);
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    let annotations = map_patch(&have.annotations, &want.annotations);
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    metadata.insert("resourceVersion".into(), json!(node.metadata.resource_version));
    let mut spec = Map::new();
    if want.taints != have.taints {
        spec.insert("taints".into(), json!(want.taints));
    }
    if want.provider_id != have.provider_id {
        spec.insert("providerID".into(), json!(want.provider_id));
    }
    let mut patch = Map::new();
    patch.insert("metadata".into(), Value::Object(metadata));
    if !spec.is_empty() {
        patch.insert("spec".into(), Value::Object(spec));
    }
    Some(Value::Object(patch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeSpec as SlotSpec;
    use crate::api::POOL_MEMBERSHIP_LABEL;
    use crate::fixtures::taint;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slot(labels: &[(&str, &str)], taints: Vec<Taint>, provider_id: Option<&str>) -> Node {
        let mut slot = Node::new(
            "m1",
            SlotSpec {
                kubernetes_node_name: "m1".into(),
                node_labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                node_taints: taints,
                provider_id: provider_id.map(Into::into),
                ..serde_json::from_value(json!({ "kubernetesNodeName": "m1" })).unwrap()
            },
        );
        slot.metadata.labels =
            Some([(POOL_MEMBERSHIP_LABEL.to_string(), "pool".to_string())].into());
        slot
    }

    fn node(
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        taints: Vec<Taint>,
        provider_id: Option<&str>,
    ) -> CoreNode {
        let map = |pairs: &[(&str, &str)]| {
            Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        CoreNode {
            metadata: ObjectMeta {
                name: Some("m1".into()),
                resource_version: Some("7".into()),
                labels: map(labels),
                annotations: map(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                provider_id: provider_id.map(Into::into),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    /// The node after the patch, as the apiserver would merge it.
    fn merged(node: &CoreNode, patch: &Value) -> CoreNode {
        let mut doc = serde_json::to_value(node).unwrap();
        json_patch::merge(&mut doc, patch);
        serde_json::from_value(doc).unwrap()
    }

    fn converge(slot: &Node, node: &CoreNode, marks: &Marks) -> CoreNode {
        let booting = marks.startup_taint;
        let patch = patch(slot, node, marks, booting).expect("something to write");
        assert_eq!(patch["metadata"]["resourceVersion"], "7", "guarded: {patch}");
        let after = merged(node, &patch);
        assert_eq!(super::patch(slot, &after, marks, booting), None, "one write converges");
        after
    }

    fn keys(node: &CoreNode) -> Vec<String> {
        node.spec.as_ref().unwrap().taints.iter().flatten().map(|t| t.key.clone()).collect()
    }

    #[test]
    fn a_new_node_gets_identity_and_the_declaration_in_one_write() {
        let slot = slot(
            &[("homelab/size", "big")],
            vec![taint("dedicated", Some("gpu"), "NoSchedule")],
            None,
        );
        // As a kubelet registers it: its own labels and its --register-with-taints.
        let fresh = node(
            &[("kubernetes.io/hostname", "m1")],
            &[],
            vec![taint(marks::STARTUP_TAINT, Some("true"), "NoSchedule")],
            None,
        );
        let booting = Marks { startup_taint: true, protected_for: None };
        let after = converge(&slot, &fresh, &booting);
        let labels = after.metadata.labels.clone().unwrap();
        assert_eq!(labels["homelab/size"], "big");
        assert_eq!(labels[LABEL_GROUP], "pool");
        assert_eq!(labels[LABEL_SLOT], "m1");
        assert_eq!(labels["kubernetes.io/hostname"], "m1", "the kubelet's own label stays");
        assert_eq!(keys(&after), [marks::STARTUP_TAINT, "dedicated"]);
        assert_eq!(after.spec.unwrap().provider_id.as_deref(), Some("homelab://m1"));
    }

    #[test]
    fn a_distributions_provider_id_is_kept() {
        let slot = slot(&[], vec![], None);
        let k3s = node(&[], &[], vec![], Some("k3s://m1"));
        let after = converge(&slot, &k3s, &Marks::default());
        assert_eq!(after.spec.unwrap().provider_id.as_deref(), Some("k3s://m1"));
    }

    #[test]
    fn a_changed_declaration_replaces_what_was_declared_and_leaves_the_rest() {
        let before = slot(
            &[("a", "1"), ("gone", "x")],
            vec![taint("old", None, "NoSchedule"), taint("kept", Some("v1"), "NoExecute")],
            None,
        );
        let registered = node(
            &[("by-hand", "yes")],
            &[],
            vec![taint("someone-elses", None, "NoSchedule")],
            None,
        );
        let synced = converge(&before, &registered, &Marks::default());
        let after = slot(&[("a", "2")], vec![taint("kept", Some("v2"), "NoExecute")], None);
        let resynced = converge(&after, &synced, &Marks::default());
        let labels = resynced.metadata.labels.clone().unwrap();
        assert_eq!(labels.get("a").map(String::as_str), Some("2"));
        assert!(!labels.contains_key("gone"), "no longer declared");
        assert_eq!(labels["by-hand"], "yes", "not ours to remove");
        let taints = resynced.spec.unwrap().taints.unwrap();
        assert_eq!(
            taints.iter().map(|t| (t.key.as_str(), t.value.as_deref())).collect::<Vec<_>>(),
            [("someone-elses", None), ("kept", Some("v2"))]
        );
    }

    #[test]
    fn an_unchanged_declaration_leaves_a_hand_removal_alone() {
        let declared = slot(&[], vec![taint("dedicated", None, "NoSchedule")], None);
        let synced = converge(&declared, &node(&[], &[], vec![], None), &Marks::default());
        let mut by_hand = synced.clone();
        by_hand.spec.as_mut().unwrap().taints = Some(vec![]);
        assert_eq!(patch(&declared, &by_hand, &Marks::default(), false), None);
    }

    #[test]
    fn a_boot_writes_the_whole_declaration_back_without_reordering() {
        let declared = slot(&[("a", "1")], vec![taint("dedicated", None, "NoSchedule")], None);
        let synced = converge(&declared, &node(&[], &[], vec![], None), &Marks::default());
        // Taken off by hand, then the machine boots again and its kubelet takes the node over.
        let mut resumed = synced.clone();
        resumed.metadata.labels.as_mut().unwrap().remove("a");
        resumed.spec.as_mut().unwrap().taints = Some(vec![taint("other", None, "NoSchedule")]);
        let booting = Marks { startup_taint: true, protected_for: None };
        let after = converge(&declared, &resumed, &booting);
        assert_eq!(after.metadata.labels.as_ref().unwrap()["a"], "1");
        assert_eq!(keys(&after), ["other", "dedicated", marks::STARTUP_TAINT]);
        // A declared taint in place stays in place: nothing to write.
        let mut in_place = after.clone();
        let taints = in_place.spec.as_mut().unwrap().taints.as_mut().unwrap();
        taints.rotate_left(1);
        assert_eq!(patch(&declared, &in_place, &booting, true), None);
    }

    #[test]
    fn the_startup_taint_and_the_declaration_share_one_taint_list() {
        let declared = slot(&[], vec![taint("dedicated", None, "NoSchedule")], None);
        let booting = Marks { startup_taint: true, protected_for: None };
        let synced = converge(&declared, &node(&[], &[], vec![], None), &booting);
        assert_eq!(keys(&synced), ["dedicated", marks::STARTUP_TAINT]);
        let gate_passed = converge(&declared, &synced, &Marks::default());
        assert_eq!(keys(&gate_passed), ["dedicated"]);
    }
}
