//! NodeGroupTemplateNodeInfo: the node a group's next machine would register as, for
//! cluster-autoscaler's scale-from-zero simulation. It is synthesized from the slot's spec only
//! (nodeCapacity, nodeLabels, nodeTaints): the config object is the description of the machine,
//! and a template read from a live node would change with whatever that node runs.
//!
//! The slot described is the one IncreaseSize would claim next, so the simulation plans with
//! the machine that would actually boot; when none is free, the first slot by name.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::api::{HOSTNAME_LABEL, LABEL_GROUP, OS_LABEL};

use super::error::ProviderError;
use super::groups::{GroupSnapshot, SlotState};
use super::slot_choice::{candidate, choose};
use super::{Caller, Provider};

/// The kubelet's default pod capacity, used when a slot does not declare `pods`: without it the
/// scheduler's simulation would fit no pod at all on the template.
const DEFAULT_PODS: &str = "110";

/// The slot a template of the group describes.
pub fn representative(snapshot: &GroupSnapshot) -> Option<&SlotState> {
    let now = Timestamp::now();
    let candidates: Vec<_> = snapshot
        .slots
        .iter()
        .filter(|s| s.is_free())
        .map(|s| candidate(s, &snapshot.group.spec, now))
        .collect();
    let next = choose(&candidates, 1, super::increase::asleep_margin(snapshot))
        .ok()
        .and_then(|c| c.into_iter().next());
    match next {
        Some(chosen) => snapshot.slot(&chosen.name),
        None => snapshot.slots.first(),
    }
}

/// The template node of a group, described from one of its slots.
pub fn template_node(group: &str, slot: &SlotState, now: Timestamp) -> pb::Node {
    let spec = &slot.slot.spec;
    // What its node carried when last seen, under what the slot declares (as placement reads it).
    let mut labels: BTreeMap<String, String> =
        slot.slot.status.as_ref().map(|s| s.node_labels.clone()).unwrap_or_default();
    labels.extend(spec.node_labels.clone());
    labels.remove(HOSTNAME_LABEL);
    labels.entry(OS_LABEL.to_owned()).or_insert_with(|| "linux".to_owned());
    labels.insert(LABEL_GROUP.to_owned(), group.to_owned());

    let mut capacity: BTreeMap<String, Quantity> = spec
        .node_capacity
        .iter()
        .map(|(name, q)| (name.clone(), Quantity { string: Some(q.0.clone()) }))
        .collect();
    capacity
        .entry("pods".to_owned())
        .or_insert_with(|| Quantity { string: Some(DEFAULT_PODS.to_owned()) });

    let taints = spec
        .node_taints
        .iter()
        .map(|t| pb::Taint {
            key: Some(t.key.clone()),
            value: t.value.clone(),
            effect: Some(t.effect.clone()),
            time_added: None,
        })
        .collect();

    pb::Node {
        metadata: Some(ObjectMeta {
            name: Some(format!("template-node-for-{group}")),
            labels,
            ..ObjectMeta::default()
        }),
        spec: Some(pb::NodeSpec { taints, unschedulable: Some(false), ..pb::NodeSpec::default() }),
        status: Some(pb::NodeStatus {
            allocatable: capacity.clone(),
            capacity,
            conditions: ready_conditions(now),
            phase: Some("Running".to_owned()),
            ..pb::NodeStatus::default()
        }),
    }
}

/// A healthy node's conditions: Ready, and no pressure or network trouble.
fn ready_conditions(now: Timestamp) -> Vec<pb::NodeCondition> {
    let at = Time { seconds: Some(now.as_second()), nanos: Some(0) };
    [
        ("Ready", "True", "KubeletReady"),
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("NetworkUnavailable", "False", "RouteCreated"),
    ]
    .into_iter()
    .map(|(kind, status, reason)| pb::NodeCondition {
        r#type: Some(kind.to_owned()),
        status: Some(status.to_owned()),
        last_heartbeat_time: Some(at),
        last_transition_time: Some(at),
        reason: Some(reason.to_owned()),
        message: None,
    })
    .collect()
}

impl Provider {
    /// The group's template node. A group with no slot has none.
    #[tracing::instrument(skip(self, caller))]
    pub fn template_node(&self, caller: &Caller, group: &str) -> Result<pb::Node, ProviderError> {
        let snapshot = self.snapshot(caller, group)?;
        let slot = representative(&snapshot)
            .ok_or_else(|| ProviderError::NoTemplate { group: group.to_owned() })?;
        Ok(template_node(group, slot, Timestamp::now()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Taint;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
    use prost::Message;

    use super::super::groups::tests::{claim, group, slot};
    use super::*;
    use crate::api::{NodeClaimPhase, Pricing};

    fn described(name: &str, rate: f64) -> Arc<super::super::Slot> {
        let mut s = (*slot(name, "pool")).clone();
        s.spec.pricing = Some(Pricing { hourly_rate: rate, pod_rate: 0.0 });
        s.spec.node_capacity = [
            ("cpu".to_string(), ApiQuantity("8".into())),
            ("memory".to_string(), ApiQuantity("32Gi".into())),
        ]
        .into();
        s.spec.node_labels = [
            ("kubernetes.io/hostname".to_string(), name.to_string()),
            ("kubernetes.io/arch".to_string(), "arm64".to_string()),
        ]
        .into();
        s.spec.node_taints = vec![Taint {
            key: "homelab/slow".into(),
            value: Some("yes".into()),
            effect: "PreferNoSchedule".into(),
            time_added: None,
        }];
        Arc::new(s)
    }

    #[test]
    fn the_template_is_the_slots_spec_as_a_ready_node() {
        let slots = vec![described("dear", 1.0), described("cheap", 0.1)];
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &[], &HashSet::new());
        let rep = representative(&snap).unwrap();
        assert_eq!(rep.name(), "cheap", "the slot IncreaseSize would claim next");

        let node = template_node("pool", rep, Timestamp::UNIX_EPOCH);
        let bytes = node.encode_to_vec();
        let node = pb::Node::decode(bytes.as_slice()).unwrap();

        let meta = node.metadata.unwrap();
        assert!(!meta.labels.contains_key("kubernetes.io/hostname"));
        assert_eq!(meta.labels["kubernetes.io/arch"], "arm64");
        assert_eq!(meta.labels["kubernetes.io/os"], "linux");
        assert_eq!(meta.labels[LABEL_GROUP], "pool");

        let status = node.status.unwrap();
        let q = |m: &BTreeMap<String, Quantity>, k: &str| m[k].string.clone().unwrap();
        assert_eq!(q(&status.capacity, "cpu"), "8");
        assert_eq!(q(&status.allocatable, "memory"), "32Gi");
        assert_eq!(q(&status.allocatable, "pods"), "110");
        let ready =
            status.conditions.iter().find(|c| c.r#type.as_deref() == Some("Ready")).unwrap();
        assert_eq!(ready.status.as_deref(), Some("True"));

        let spec = node.spec.unwrap();
        assert_eq!(spec.taints.len(), 1);
        assert_eq!(spec.taints[0].key.as_deref(), Some("homelab/slow"));
        assert_eq!(spec.taints[0].effect.as_deref(), Some("PreferNoSchedule"));
    }

    #[test]
    fn with_every_slot_busy_the_first_slot_describes_the_group() {
        let slots = vec![described("b", 1.0), described("a", 2.0)];
        let busy: Vec<Arc<crate::api::NodeClaim>> = ["a", "b"]
            .iter()
            .map(|s| {
                Arc::new(claim(
                    &format!("{s}-1"),
                    s,
                    Some(NodeClaimPhase::Ready),
                    "2026-03-04T09:00:00Z",
                ))
            })
            .collect();
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &busy, &HashSet::new());
        assert_eq!(representative(&snap).unwrap().name(), "a");
        let empty = GroupSnapshot::build(group("pool", 0), &[], &[], &HashSet::new());
        assert!(representative(&empty).is_none());
    }
}
