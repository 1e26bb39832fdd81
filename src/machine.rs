//! What a core Node says about its machine. Pure: the readiness gate, the machine-gone bound,
//! the slot's report and the built-in scaler's view of usable nodes all read it through these
//! functions, so it sits below both the controllers and the scaler.

use k8s_openapi::api::core::v1::Node as CoreNode;

use crate::api::{CONDITION_SUSPENDED, LABEL_GROUP, LABEL_SLOT, Node as Slot, TaintSelector};
use crate::phase::GateReading;

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

/// What the slot declares that its node does not carry yet, one entry each: the identity (the
/// group and slot labels, a providerID), the declared `nodeLabels` and `nodeTaints`. Empty once
/// the slot controller's write landed.
pub fn undeclared(node: &CoreNode, slot: &Slot) -> Vec<String> {
    let labels = node.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let slot_name = slot.metadata.name.as_deref().unwrap_or_default();
    let identity = [(LABEL_GROUP, slot.group().unwrap_or_default()), (LABEL_SLOT, slot_name)];
    let declared = slot.spec.node_labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let mut missing: Vec<String> = identity
        .into_iter()
        .chain(declared)
        .filter(|(key, value)| label(key) != Some(*value))
        .map(|(key, value)| format!("label {key}={value}"))
        .collect();
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    missing.extend(
        slot.spec
            .node_taints
            .iter()
            .filter(|d| {
                !taints.iter().any(|t| t.key == d.key && t.effect == d.effect && t.value == d.value)
            })
            .map(|d| format!("taint {}:{}", d.key, d.effect)),
    );
    if node_provider_id(node).is_none() {
        missing.push("a providerID".into());
    }
    missing
}

/// What the readiness gate reads of a booting claim's node.
pub fn gate_reading(node: &CoreNode, slot: &Slot, gate: &[TaintSelector]) -> GateReading {
    GateReading {
        // A node still marked asleep has not seen its kubelet back since the suspend.
        ready: is_ready(node) && !is_suspended(node),
        readiness_taints_left: !pending_readiness_taints(node, gate).is_empty(),
        undeclared: !undeclared(node, slot).is_empty(),
    }
}

/// Since when the node's `Suspended` condition (written by the operator) has said the machine
/// sleeps, when it says so.
pub fn suspended_since(node: &CoreNode) -> Option<jiff::Timestamp> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    let condition = conditions.iter().find(|c| c.type_ == CONDITION_SUSPENDED)?;
    (condition.status == "True")
        .then(|| condition.last_transition_time.as_ref().map(|t| t.0))
        .map(|since| since.unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// The machine sleeps (suspended to RAM), by the node's `Suspended` condition: its kubelet is
/// silent but resumes on this node, and both scalers count the machine as off.
pub fn is_suspended(node: &CoreNode) -> bool {
    suspended_since(node).is_some()
}

/// What a machine's Node says of its kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kubelet {
    /// No Node: the machine is off, or its kubelet has not registered yet.
    NoNode,
    /// The Node has no Ready condition yet: a registration under way.
    Registering,
    /// Ready is True.
    Ready,
    /// Ready is False: the kubelet runs and reports, and says why the node is not Ready (a
    /// container runtime that is down, a CNI that is not up, a graceful shutdown under way).
    NotReady { since: Option<jiff::Timestamp>, says: String },
    /// Ready is Unknown: the kubelet stopped reporting. Off, crashed or cut off: the Node alone
    /// cannot tell which.
    Silent { since: Option<jiff::Timestamp> },
}

/// Since when the node has been Ready, when it is: its Ready condition's last transition.
pub fn ready_since(node: Option<&CoreNode>) -> Option<jiff::Timestamp> {
    let conditions = node?.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    ready.last_transition_time.as_ref().map(|t| t.0)
}

impl Kubelet {
    /// Reads the node's Ready condition.
    pub fn of(node: Option<&CoreNode>) -> Self {
        let Some(node) = node else { return Self::NoNode };
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let Some(ready) = ready else { return Self::Registering };
        let since = ready.last_transition_time.as_ref().map(|t| t.0);
        match ready.status.as_str() {
            "True" => Self::Ready,
            "False" => {
                let reason = ready.reason.as_deref().unwrap_or_default();
                let message = ready.message.as_deref().unwrap_or_default();
                let says = match (reason, message) {
                    ("", "") => "nothing more".to_owned(),
                    (reason, "") => reason.to_owned(),
                    ("", message) => message.to_owned(),
                    (reason, message) => format!("{reason}: {message}"),
                };
                Self::NotReady { since, says }
            }
            _ => Self::Silent { since },
        }
    }

    /// The kubelet runs and talks to the API server, Ready or not.
    pub fn reports(&self) -> bool {
        matches!(self, Self::Ready | Self::NotReady { .. })
    }
}

/// The machine is up: its kubelet reports, Ready or NotReady. A NotReady kubelet runs on a
/// machine that is on (a containerd upgrade, a CNI outage): it is neither off nor released.
pub fn powered_on(node: Option<&CoreNode>) -> bool {
    Kubelet::of(node).reports()
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
            // NotReady: on (its kubelet reports), not usable.
            (false, false, &[], true, false, false),
        ];
        for &(ready, cordoned, taints, on, open, use_) in table {
            let n = node(ready, cordoned, taints);
            assert_eq!(powered_on(Some(&n)), on, "{ready} {cordoned} {taints:?}");
            assert_eq!(gate_open(&n, &gate), open, "{ready} {cordoned} {taints:?}");
            assert_eq!(usable(Some(&n), &gate), use_, "{ready} {cordoned} {taints:?}");
        }
        assert!(!powered_on(None));
    }

    #[test]
    fn the_kubelet_is_read_from_ready() {
        let with_ready = |ready: serde_json::Value| -> CoreNode {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "m1" }, "status": { "conditions": [ready] },
            }))
            .unwrap()
        };
        let at: jiff::Timestamp = "2026-03-04T09:00:00Z".parse().unwrap();
        let not_ready = with_ready(serde_json::json!({
            "type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": "container runtime is down", "lastTransitionTime": "2026-03-04T09:00:00Z",
        }));
        let silent = with_ready(serde_json::json!({
            "type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-03-04T09:00:00Z",
        }));
        let bare = with_ready(serde_json::json!({ "type": "Ready", "status": "False" }));
        let registering: CoreNode =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": "m1" } })).unwrap();
        let table = [
            ("no node", None, Kubelet::NoNode, false),
            ("registering", Some(&registering), Kubelet::Registering, false),
            ("ready", Some(&declared()), Kubelet::Ready, true),
            (
                "not ready",
                Some(&not_ready),
                Kubelet::NotReady {
                    since: Some(at),
                    says: "KubeletNotReady: container runtime is down".into(),
                },
                true,
            ),
            (
                "not ready, said nothing",
                Some(&bare),
                Kubelet::NotReady { since: None, says: "nothing more".into() },
                true,
            ),
            ("silent", Some(&silent), Kubelet::Silent { since: Some(at) }, false),
        ];
        for (name, node, want, on) in table {
            let got = Kubelet::of(node);
            assert_eq!(got, want, "{name}");
            assert_eq!(got.reports(), on, "{name}");
            assert_eq!(powered_on(node), on, "{name}");
        }
    }

    fn slot() -> Slot {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "m1", "labels": { "group": "pool" } },
            "spec": {
                "kubernetesNodeName": "m1",
                "nodeLabels": { "homelab/accelerator": "coral" },
                "nodeTaints": [{ "key": "dedicated", "value": "gpu", "effect": "NoSchedule" }],
            },
        }))
        .unwrap()
    }

    /// A Ready node free of readiness taints, carrying the slot's whole declaration.
    fn declared() -> CoreNode {
        let mut n = node(true, false, &[]);
        n.metadata.labels = Some(
            [(LABEL_GROUP, "pool"), (LABEL_SLOT, "m1"), ("homelab/accelerator", "coral")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let spec = n.spec.as_mut().unwrap();
        spec.provider_id = Some("k3s://m1".into());
        spec.taints = Some(vec![Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
        n
    }

    #[test]
    fn the_gate_waits_for_what_the_slot_declares() {
        let gate = crate::api::default_readiness_taints();
        let slot = slot();
        assert_eq!(undeclared(&declared(), &slot), Vec::<String>::new());
        assert!(gate_reading(&declared(), &slot, &gate).passes());
        // As the kubelet registers it: Ready, its own labels only, no providerID.
        let fresh = node(true, false, &[]);
        assert!(gate_open(&fresh, &gate), "Ready and free of readiness taints");
        assert_eq!(
            undeclared(&fresh, &slot),
            [
                "label infra.homecluster.dev/group=pool",
                "label infra.homecluster.dev/node=m1",
                "label homelab/accelerator=coral",
                "taint dedicated:NoSchedule",
                "a providerID",
            ]
        );
        assert!(!gate_reading(&fresh, &slot, &gate).passes());
        // Each part of the declaration missing alone keeps the gate closed.
        let without: [fn(&mut CoreNode); 4] = [
            |n| drop(n.metadata.labels.as_mut().unwrap().remove("homelab/accelerator")),
            |n| drop(n.metadata.labels.as_mut().unwrap().insert(LABEL_GROUP.into(), "x".into())),
            |n| n.spec.as_mut().unwrap().taints.as_mut().unwrap()[0].value = Some("tpu".into()),
            |n| n.spec.as_mut().unwrap().provider_id = None,
        ];
        for (i, strip) in without.iter().enumerate() {
            let mut n = declared();
            strip(&mut n);
            let reading = gate_reading(&n, &slot, &gate);
            assert!(reading.ready && !reading.readiness_taints_left, "row {i}");
            assert!(
                reading.undeclared && !reading.passes(),
                "row {i}: {:?}",
                undeclared(&n, &slot)
            );
        }
    }
}
