//! Builders of API objects for unit tests.
#![cfg(test)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::*;

pub fn pod_spec() -> LifecyclePodSpec {
    LifecyclePodSpec { image: "busybox".into(), ..LifecyclePodSpec::default() }
}

pub fn slot(name: &str, group: &str) -> Node {
    let mut slot = Node::new(
        name,
        NodeSpec {
            power: None,
            startup_pod_spec: Some(pod_spec()),
            shutdown_pod_spec: Some(pod_spec()),
            kubernetes_node_name: name.into(),
            provider_id: None,
            node_taints: vec![],
            node_labels: BTreeMap::new(),
            node_capacity: BTreeMap::new(),
            pricing: None,
            power_off_gates: None,
            power_state: None,
        },
    );
    slot.metadata.namespace = Some("ns".into());
    slot.metadata.labels = Some(BTreeMap::from([(POOL_MEMBERSHIP_LABEL.into(), group.into())]));
    slot
}

pub fn group(name: &str) -> Group {
    let mut group = Group::new(
        name,
        GroupSpec {
            driver: ScalingDriver::ClusterAutoscaler,
            min_size: 0,
            max_node_provision_time: None,
            node_readiness_taints: vec![],
            scale_down: ScaleDownOptions::default(),
            builtin: BuiltinScaler::default(),
            pricing: None,
            asleep_price_margin: None,
            energy: None,
            schedules: vec![],
            power_off_gates: vec![],
            power_off_gate_settle: None,
            maintenance: None,
            ups: None,
        },
    );
    group.metadata.namespace = Some("ns".into());
    group
}

pub fn claim(name: &str, slot: &str, group: &str) -> NodeClaim {
    let mut claim = NodeClaim::new(
        name,
        NodeClaimSpec {
            slot_ref: SlotRef { name: slot.into() },
            request: ClaimRequest {
                call: ClaimCall::IncreaseSize,
                delta: Some(1),
                group: group.into(),
                nodes: vec![],
                reason: None,
            },
            requested_at: None,
            requested_by: None,
            attempt: None,
            deadline_at: None,
            max_node_provision_time: None,
            until: None,
            boot_on_battery: None,
            ttl_seconds_after_finished: None,
        },
    );
    claim.metadata.namespace = Some("ns".into());
    claim
}

pub fn at(s: &str) -> Time {
    Time(s.parse().expect("timestamp"))
}

/// A claim in `phase`, created at `created`.
pub fn claim_in(name: &str, slot: &str, phase: Option<NodeClaimPhase>, created: &str) -> NodeClaim {
    let mut c = claim(name, slot, "pool");
    c.metadata.creation_timestamp = Some(at(created));
    c.status = Some(NodeClaimStatus { phase, ..NodeClaimStatus::default() });
    c
}

/// A taint of `key`, with `value` if any, and `effect`.
pub fn taint(key: &str, value: Option<&str>, effect: &str) -> k8s_openapi::api::core::v1::Taint {
    k8s_openapi::api::core::v1::Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: effect.into(),
        time_added: None,
    }
}

/// A schedule window as a person writes it, pinning `slots` (none: any of the pool's).
pub fn window(
    days: &str,
    from: &str,
    to: &str,
    zone: &str,
    min: i32,
    slots: &[&str],
) -> ScheduleWindow {
    ScheduleWindow {
        days: days.into(),
        from: from.into(),
        to: to.into(),
        time_zone: zone.into(),
        min_machines: min,
        slots: slots.iter().map(|s| s.to_string()).collect(),
    }
}
