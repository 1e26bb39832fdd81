//! What a core Node says about its machine. Pure: the readiness gate, the machine-gone bound,
//! the slot's report and the built-in scaler's view of usable nodes all read it through these
//! functions, so it sits below both the controllers and the scaler.

use k8s_openapi::api::core::v1::Node as CoreNode;

use crate::api::{Node as Slot, TaintSelector};

/// The taint cluster-autoscaler puts on a node it is removing.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Whether the node's Ready condition is True (its kubelet reports in).
pub fn is_ready(node: &CoreNode) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The node's Ready condition: its status (`True`, `False`, `Unknown`) and when it last changed.
/// A node that never reported has none.
pub fn ready_condition(node: &CoreNode) -> Option<(&str, Option<jiff::Timestamp>)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.as_str(), c.last_transition_time.as_ref().map(|t| t.0)))
}

/// The `spec.providerID` the node carries, if any.
pub fn node_provider_id(node: &CoreNode) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|id| !id.is_empty())
}

/// The providerID a slot declares, else `homelab://<slot>`: what the operator writes onto a
/// node that registered without one.
pub fn declared_provider_id(slot: &Slot) -> String {
    match slot.spec.provider_id.as_deref() {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => format!(
            "homelab://{}",
            slot.metadata.name.as_deref().unwrap_or(&slot.spec.kubernetes_node_name)
        ),
    }
}

/// The id cluster-autoscaler knows the slot's machine by: the providerID its node carried
/// when it last registered (a distribution may write its own, as k3s writes `k3s://<name>`),
/// else the declared one. CA matches instances to nodes by exactly this string, so a machine
/// that boots again is reported under the id it will register with.
pub fn instance_id(slot: &Slot) -> String {
    slot.status
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| declared_provider_id(slot))
}

/// Whether the node is cordoned.
pub fn is_cordoned(node: &CoreNode) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

/// The readiness taints the node still carries.
pub fn pending_readiness_taints<'a>(node: &'a CoreNode, gate: &[TaintSelector]) -> Vec<&'a str> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|taints| {
            taints
                .iter()
                .filter(|t| gate.iter().any(|g| g.matches(t)))
                .map(|t| t.key.as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// The gate is open: Ready and free of every readiness taint (the cordon is the gate's to lift).
pub fn gate_open(node: &CoreNode, gate: &[TaintSelector]) -> bool {
    is_ready(node) && pending_readiness_taints(node, gate).is_empty()
}

/// The machine is up: its node exists and is Ready.
pub fn powered_on(node: Option<&CoreNode>) -> bool {
    node.is_some_and(is_ready)
}

/// The machine can take the pool's work: up, gate open, not cordoned.
pub fn usable(node: Option<&CoreNode>, gate: &[TaintSelector]) -> bool {
    node.is_some_and(|n| gate_open(n, gate) && !is_cordoned(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint};

    fn node(ready: bool, cordoned: bool, taints: &[&str]) -> CoreNode {
        CoreNode {
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned),
                taints: Some(
                    taints
                        .iter()
                        .map(|k| Taint {
                            key: k.to_string(),
                            effect: "NoExecute".into(),
                            ..Taint::default()
                        })
                        .collect(),
                ),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..CoreNode::default()
        }
    }

    #[test]
    fn observation_table() {
        let gate = crate::api::default_readiness_taints();
        // ready, cordoned, taints, powered on, gate open, usable
        type Row<'a> = (bool, bool, &'a [&'a str], bool, bool, bool);
        let table: &[Row] = &[
            (true, false, &[], true, true, true),
            (true, true, &[], true, true, false),
            (true, false, &["node.cilium.io/agent-not-ready"], true, false, false),
            (true, false, &["other"], true, true, true),
            (false, false, &[], false, false, false),
        ];
        for &(ready, cordoned, taints, on, open, use_) in table {
            let n = node(ready, cordoned, taints);
            assert_eq!(powered_on(Some(&n)), on, "{ready} {cordoned} {taints:?}");
            assert_eq!(gate_open(&n, &gate), open, "{ready} {cordoned} {taints:?}");
            assert_eq!(usable(Some(&n), &gate), use_, "{ready} {cordoned} {taints:?}");
        }
        assert!(!powered_on(None));
    }
}
