//! The marks cluster-autoscaler reads on a machine's node (docs/decisions.md, D13 and D14):
//!
//! - while the slot's claim is in its boot window, the node carries CA's startup taint
//!   [`STARTUP_TAINT`], so CA counts a registered-but-not-ready machine as upcoming capacity
//!   instead of booting a second one for the same pods;
//! - while a person's `Manual` claim holds the slot, the node carries CA's
//!   [`SCALE_DOWN_DISABLED`] annotation, so CA does not power off a machine someone started by
//!   hand once its unneeded time runs out.
//!
//! [`wanted`] decides, [`patch`] says only what differs (the slot controller writes it with the
//! rest of its node patch). The annotation is removed only where
//! the operator put it (it leaves [`PROTECTED_FOR`] beside it), so a person's own
//! `scale-down-disabled` survives.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node as CoreNode, Taint};
use serde_json::json;

use crate::api::{ClaimCall, NodeClaim};
use crate::phase;

/// cluster-autoscaler treats any taint under this prefix as a startup taint: the node counts as
/// not started (upcoming) while it carries one, and the taint is left out of its simulations.
pub const STARTUP_TAINT: &str = "startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting";
/// cluster-autoscaler never scales down a node with this annotation set to "true".
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// Names the manual claim the operator set [`SCALE_DOWN_DISABLED`] for.
pub const PROTECTED_FOR: &str = "infra.homecluster.dev/scale-down-disabled-for";

/// What the node should carry, from the slot's live claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub startup_taint: bool,
    /// The manual claim whose machine CA must leave alone.
    pub protected_for: Option<String>,
}

/// The marks a node should carry while `live` (the slot's live claim, if any) holds its slot.
pub fn wanted(live: Option<&NodeClaim>) -> Marks {
    let Some(claim) = live else { return Marks::default() };
    let phase = phase::of(claim);
    Marks {
        startup_taint: phase::in_boot_window(Some(phase)) && !phase::is_marked(claim),
        protected_for: (claim.spec.request.call == ClaimCall::Manual
            && phase::is_live(Some(phase)))
        .then(|| claim.metadata.name.clone().unwrap_or_default()),
    }
}

/// The marks the node carries now.
pub fn current(node: &CoreNode) -> Marks {
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let operator_set = annotations.get(SCALE_DOWN_DISABLED).is_some_and(|v| v == "true");
    Marks {
        startup_taint: taints(node).iter().any(|t| t.key == STARTUP_TAINT),
        protected_for: annotations.get(PROTECTED_FOR).filter(|_| operator_set).cloned(),
    }
}

fn taints(node: &CoreNode) -> Vec<Taint> {
    node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default()
}

/// The merge patch that takes `node` from its marks to `want`, or None when they agree. The
/// taint list is replaced whole, so the patch carries the resourceVersion it was computed from:
/// a taint someone else added meanwhile makes it conflict instead of being dropped.
pub fn patch(node: &CoreNode, want: &Marks) -> Option<serde_json::Value> {
    let have = current(node);
    let mut patch = serde_json::Map::new();
    if have.startup_taint != want.startup_taint {
        let mut list: Vec<Taint> =
            taints(node).into_iter().filter(|t| t.key != STARTUP_TAINT).collect();
        if want.startup_taint {
            list.push(Taint {
                key: STARTUP_TAINT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
        }
        patch.insert("spec".into(), json!({ "taints": list }));
    }
    if have.protected_for != want.protected_for {
        let mut annotations = BTreeMap::new();
        match &want.protected_for {
            Some(claim) => {
                annotations.insert(SCALE_DOWN_DISABLED, json!("true"));
                annotations.insert(PROTECTED_FOR, json!(claim));
            }
            None => {
                // Only ours is taken off: a person's own annotation has no PROTECTED_FOR.
                annotations.insert(SCALE_DOWN_DISABLED, serde_json::Value::Null);
                annotations.insert(PROTECTED_FOR, serde_json::Value::Null);
            }
        }
        patch.insert("metadata".into(), json!({ "annotations": annotations }));
    }
    if patch.is_empty() {
        return None;
    }
    let version = node.metadata.resource_version.clone();
    let metadata = patch.entry("metadata").or_insert_with(|| json!({}));
    if let Some(metadata) = metadata.as_object_mut() {
        metadata.insert("resourceVersion".into(), json!(version));
    }
    Some(serde_json::Value::Object(patch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeClaimPhase;
    use crate::fixtures;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn claim(call: ClaimCall, phase: Option<NodeClaimPhase>, marked: bool) -> NodeClaim {
        let mut c = fixtures::claim("c1", "slot-a", "g");
        c.spec.request.call = call;
        let status = c.status.get_or_insert_with(Default::default);
        status.phase = phase;
        if marked {
            status.scale_down_requested_at =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
        }
        c
    }

    fn node(taints: &[&str], annotations: &[(&str, &str)]) -> CoreNode {
        CoreNode {
            metadata: ObjectMeta {
                name: Some("slot-a".into()),
                resource_version: Some("42".into()),
                annotations: Some(
                    annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|k| Taint {
                            key: k.to_string(),
                            effect: "NoSchedule".into(),
                            ..Taint::default()
                        })
                        .collect(),
                ),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn wanted_table() {
        use ClaimCall::*;
        use NodeClaimPhase::*;
        // call, phase, marked for scale-down, startup taint, protected
        type Row = (ClaimCall, Option<NodeClaimPhase>, bool, bool, bool);
        let table: &[Row] = &[
            (IncreaseSize, None, false, true, false),
            (IncreaseSize, Some(Pending), false, true, false),
            (IncreaseSize, Some(Booting), false, true, false),
            (IncreaseSize, Some(Booting), true, false, false),
            (IncreaseSize, Some(Ready), false, false, false),
            (IncreaseSize, Some(Failed), false, false, false),
            (Manual, Some(Booting), false, true, true),
            (Manual, Some(Ready), false, false, true),
            (Manual, Some(Ready), true, false, true),
            (Manual, Some(Completed), false, false, false),
            (Manual, Some(Failed), false, false, false),
        ];
        for &(call, phase, marked, taint, protected) in table {
            let c = claim(call, phase, marked);
            let m = wanted(Some(&c));
            assert_eq!(m.startup_taint, taint, "{call:?} {phase:?} marked={marked}");
            assert_eq!(m.protected_for.is_some(), protected, "{call:?} {phase:?} marked={marked}");
        }
        assert_eq!(wanted(None), Marks::default());
    }

    #[test]
    fn patch_adds_and_removes_only_what_differs() {
        let booting = Marks { startup_taint: true, protected_for: None };
        // Adding the taint keeps the node's other taints and guards with the resourceVersion.
        let p = patch(&node(&["node.cilium.io/agent-not-ready"], &[]), &booting).expect("patch");
        let keys: Vec<&str> = p["spec"]["taints"]
            .as_array()
            .expect("taints")
            .iter()
            .filter_map(|t| t["key"].as_str())
            .collect();
        assert_eq!(keys, ["node.cilium.io/agent-not-ready", STARTUP_TAINT]);
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        // Already there: nothing to write.
        assert_eq!(patch(&node(&[STARTUP_TAINT], &[]), &booting), None);
        // Gate passed: the taint leaves, the others stay.
        let p = patch(&node(&["other", STARTUP_TAINT], &[]), &Marks::default()).expect("patch");
        assert_eq!(p["spec"]["taints"].as_array().map(Vec::len), Some(1));
        assert!(p.get("metadata").and_then(|m| m.get("annotations")).is_none());
    }

    #[test]
    fn only_the_operators_scale_down_disabled_is_removed() {
        let manual = Marks { startup_taint: false, protected_for: Some("c1".into()) };
        let p = patch(&node(&[], &[]), &manual).expect("patch");
        assert_eq!(p["metadata"]["annotations"][SCALE_DOWN_DISABLED], "true");
        assert_eq!(p["metadata"]["annotations"][PROTECTED_FOR], "c1");
        assert!(p.get("spec").is_none());
        // The operator's mark, claim gone: both annotations leave.
        let ours = node(&[], &[(SCALE_DOWN_DISABLED, "true"), (PROTECTED_FOR, "c1")]);
        let p = patch(&ours, &Marks::default()).expect("patch");
        assert!(p["metadata"]["annotations"][SCALE_DOWN_DISABLED].is_null());
        // A person's own annotation is theirs: nothing to write.
        let theirs = node(&[], &[(SCALE_DOWN_DISABLED, "true")]);
        assert_eq!(patch(&theirs, &Marks::default()), None);
    }
}
