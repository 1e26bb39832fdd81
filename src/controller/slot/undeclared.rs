//! What a machine's node carries that its slot does not declare and nothing puts back at the
//! next registration: labels and taints put on by hand. The operator removes the node of a
//! machine that is off, so these are lost; the slot names them (a condition, and an event
//! before the node goes) with where to declare them instead.

use k8s_openapi::api::core::v1::Node as CoreNode;

use crate::api::{Node, TaintSelector};
use crate::node_declaration::registration::KUBELET_LABELS;

/// Label prefixes whose labels come back by themselves: the operator's own, k3s's, and node
/// feature discovery's.
const SELF_HEALING_LABEL_PREFIXES: &[&str] =
    &["infra.homecluster.dev/", "k3s.io/", "node.k3s.io/", "feature.node.kubernetes.io/"];

/// Taint prefixes that the node lifecycle, cluster-autoscaler or the operator manage.
const MANAGED_TAINT_PREFIXES: &[&str] = &[
    "node.kubernetes.io/",
    "node.cloudprovider.kubernetes.io/",
    "startup-taint.cluster-autoscaler.kubernetes.io/",
    "ignore-taint.cluster-autoscaler.kubernetes.io/",
    "status-taint.cluster-autoscaler.kubernetes.io/",
    "ToBeDeletedByClusterAutoscaler",
    "DeletionCandidateOfClusterAutoscaler",
];

/// Labels and taints on a node that would be lost with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Undeclared {
    /// `key=value`.
    pub labels: Vec<String>,
    /// `key=value:Effect` (or `key:Effect`).
    pub taints: Vec<String>,
}

impl Undeclared {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.taints.is_empty()
    }

    /// One sentence that names them and says where to declare them.
    pub fn message(&self, node: &str) -> String {
        let mut parts = Vec::new();
        if !self.labels.is_empty() {
            parts.push(format!("labels {}", self.labels.join(", ")));
        }
        if !self.taints.is_empty() {
            parts.push(format!("taints {}", self.taints.join(", ")));
        }
        format!(
            "node {node} carries {} that the slot does not declare; the operator removes the node while the machine is off, so they are lost at the next power-off: declare them in the slot's spec.nodeLabels and spec.nodeTaints (or register them with the kubelet's --node-labels and --register-with-taints)",
            parts.join(" and ")
        )
    }
}

/// What `node` carries beyond what `slot` declares, the kubelet registers and the operator,
/// cluster-autoscaler and the node lifecycle manage. `gate` is the group's readiness taints
/// (the machine registers with them).
pub fn of(slot: &Node, node: &CoreNode, gate: &[TaintSelector]) -> Undeclared {
    let labels = node
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(key, value)| slot.spec.node_labels.get(*key) != Some(*value))
        .filter(|(key, _)| !KUBELET_LABELS.contains(&key.as_str()))
        .filter(|(key, _)| !SELF_HEALING_LABEL_PREFIXES.iter().any(|p| key.starts_with(p)))
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| !slot.spec.node_taints.iter().any(|d| d.key == t.key && d.effect == t.effect))
        .filter(|t| !MANAGED_TAINT_PREFIXES.iter().any(|p| t.key.starts_with(p)))
        .filter(|t| !gate.iter().any(|g| g.matches(t)))
        .map(|t| match t.value.as_deref().filter(|v| !v.is_empty()) {
            Some(value) => format!("{}={value}:{}", t.key, t.effect),
            None => format!("{}:{}", t.key, t.effect),
        })
        .collect();
    Undeclared { labels, taints }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};

    fn taint(key: &str, effect: &str) -> Taint {
        Taint { key: key.into(), effect: effect.into(), ..Taint::default() }
    }

    #[test]
    fn only_what_nothing_puts_back_is_named() {
        let mut slot: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "m1" },
            "spec": {
                "kubernetesNodeName": "m1",
                "nodeLabels": { "homelab/size": "big" },
                "nodeTaints": [{ "key": "dedicated", "value": "gpu", "effect": "NoSchedule" }],
            },
        }))
        .unwrap();
        slot.metadata.name = Some("m1".into());
        let labels = [
            ("kubernetes.io/hostname", "m1"),
            ("kubernetes.io/arch", "amd64"),
            ("infra.homecluster.dev/group", "pool"),
            ("homelab/size", "big"),
            ("k3s.io/internal-ip", "10.0.0.5"),
            ("disk", "ssd"),
            ("node-role.kubernetes.io/worker", ""),
        ];
        let node = CoreNode {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![
                    taint("dedicated", "NoSchedule"),
                    taint("node.kubernetes.io/unreachable", "NoExecute"),
                    taint("node.cilium.io/agent-not-ready", "NoExecute"),
                    taint(
                        "startup-taint.cluster-autoscaler.kubernetes.io/homelab-booting",
                        "NoSchedule",
                    ),
                    Taint { value: Some("debug".into()), ..taint("maintenance", "NoSchedule") },
                ]),
                ..NodeSpec::default()
            }),
            status: None,
        };
        let gate = crate::api::default_readiness_taints();
        let found = of(&slot, &node, &gate);
        assert_eq!(found.labels, ["disk=ssd", "node-role.kubernetes.io/worker="]);
        assert_eq!(found.taints, ["maintenance=debug:NoSchedule"]);
        let message = found.message("m1");
        assert!(message.contains("disk=ssd") && message.contains("spec.nodeLabels"), "{message}");

        let mut changed = slot.clone();
        changed.spec.node_labels.insert("homelab/size".into(), "small".into());
        assert!(of(&changed, &node, &gate).labels.contains(&"homelab/size=big".to_string()));
    }
}
