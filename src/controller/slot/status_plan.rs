//! The slot's status as a pure function of what one pass saw ([`StatusFacts`]): observed
//! power, the derived report, the digest of the newest claim, the plug meter's and the BMC's
//! last readings, the conditions (capacity, providerID, declared labels, whether the kubelet
//! reports, the meter, the BMC, a drain held by a budget), and the events a change calls for.
//! `observe::write_status` gathers the facts and carries the plan out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::events::EventType;

use super::meter::{self, Reading};
use super::power_off_gates::{self, GateHold};
use super::undeclared;
use super::{bmc, drain};
use crate::api::{
    GROUP, HOSTNAME_LABEL, Node, NodeClaim, NodeStatus, ObservedPower, SlotClaimDigest,
    TaintSelector,
};
use crate::claim::ready_bound::PowerReading;
use crate::controller::PublishedHold;
use crate::machine;
use crate::phase::{self, MachineObservation, SlotReportInput};
use crate::quantity;

/// The conditions this plan owns; the others on the status are kept as they are.
const OWN: [&str; 8] = [
    "CapacityMatches",
    "ProviderIDMatches",
    "NodeLabelsDeclared",
    "MeterRead",
    "BmcRead",
    "NodeReporting",
    "Drained",
    power_off_gates::CONDITION,
];

/// What this pass of the slot's reconcile saw besides the objects: the plug meter's and the
/// BMC's readings (when one was due) and a drain that disruption budgets hold back.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen<'a> {
    pub reading: Option<&'a Reading>,
    pub bmc_reading: Option<&'a bmc::Reading>,
    pub hold: Option<&'a drain::DrainHold>,
    /// A power-off the pool's gates hold back.
    pub gate_hold: Option<&'a GateHold>,
    /// The shutdown pass's new count of attempts no claim counts; `None` keeps the stored one.
    pub streak: Option<&'a crate::api::ShutdownStreak>,
    /// The machine has no node, and its plug reads it drawing power.
    pub on_without_node: bool,
}

/// What one pass knows of a slot.
#[derive(Clone, Copy, Debug)]
pub struct StatusFacts<'a> {
    pub slot: &'a Node,
    pub node: Option<&'a CoreNode>,
    /// The slot's live claim.
    pub live: Option<&'a NodeClaim>,
    /// The newest of the slot's claims, live or not.
    pub newest_claim: Option<&'a NodeClaim>,
    /// The Group's readiness taints.
    pub gate: &'a [TaintSelector],
    pub shutdown_in_flight: bool,
    pub seen: Seen<'a>,
    /// How long a plug reading counts (three meter intervals).
    pub meter_reading_max_age: Duration,
    /// The drain hold this leadership term last published for the slot.
    pub published_hold: Option<&'a PublishedHold>,
    /// The gate hold this leadership term last published for the slot.
    pub published_gate_hold: Option<&'a PublishedHold>,
    pub now: jiff::Timestamp,
}

/// An event the plan publishes on the slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventType,
    pub reason: &'static str,
    pub message: String,
}

/// What the pass writes.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPlan {
    /// The status to apply, `None` when it is the slot's already (nothing to write).
    pub status: Option<NodeStatus>,
    pub events: Vec<Event>,
    /// The drain hold to record as published, when it changed.
    pub publish_hold: Option<Option<PublishedHold>>,
    /// The gate hold to record as published, when it changed.
    pub publish_gate_hold: Option<Option<PublishedHold>>,
}

/// The labels of `node` that describe its machine: all but its hostname (placement names the
/// node after the slot) and the operator's own (it mirrors them onto the node).
fn registered_labels(node: &CoreNode) -> BTreeMap<String, String> {
    node.metadata
        .labels
        .iter()
        .flatten()
        .filter(|(key, _)| {
            let own = key.strip_prefix(GROUP).is_some_and(|rest| rest.starts_with('/'));
            key.as_str() != HOSTNAME_LABEL && !own
        })
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// The slot's status and the events due, from `facts` alone.
pub fn plan(facts: &StatusFacts<'_>) -> StatusPlan {
    let StatusFacts { slot, node, live, seen, .. } = *facts;
    let reading = seen.reading;
    let observed = MachineObservation {
        powered_on: machine::powered_on(node) || seen.on_without_node,
        usable: machine::usable(node, facts.gate),
        shutdown_job_in_flight: facts.shutdown_in_flight,
    };
    let report = phase::derive_report(SlotReportInput {
        live_claim: live.map(|c| Some(phase::of(c))),
        marked: live.is_some_and(phase::is_marked),
        observed,
    });
    let previous = slot.status.clone().unwrap_or_default();
    let last_claim = facts.newest_claim.map(digest).or(previous.last_claim.clone());
    let mut conditions: Vec<Condition> =
        previous.conditions.iter().filter(|c| !OWN.contains(&c.type_.as_str())).cloned().collect();
    let kept = |type_: &str| previous.conditions.iter().find(|c| c.type_ == type_).cloned();
    let set = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(type_, ok, reason, message, &previous.conditions, facts.now)
    };
    if let Some(node) = node.filter(|_| !slot.spec.node_capacity.is_empty()) {
        let drift = capacity_drift(slot, node);
        let (ok, reason, message) = if drift.is_empty() {
            (true, "Matches", "declared capacity matches the node's allocatable".to_string())
        } else {
            (
                false,
                "Drift",
                format!("declared nodeCapacity differs from the node: {}", drift.join(", ")),
            )
        };
        conditions.push(set("CapacityMatches", ok, reason, message));
    } else if let Some(kept) = kept("CapacityMatches") {
        conditions.push(kept);
    }
    // What is known of the node outlives it: the machine is off most of the time.
    let registered_id = node.and_then(machine::node_provider_id);
    let mismatch = registered_id.and_then(|id| provider_id_mismatch(slot, id));
    match (registered_id, &mismatch) {
        (Some(_), Some(message)) => {
            conditions.push(set("ProviderIDMatches", false, "Mismatch", message.clone()));
        }
        (Some(id), None) => {
            let message = format!("the node registered with providerID {id}");
            conditions.push(set("ProviderIDMatches", true, "Matches", message));
        }
        (None, _) => conditions.extend(kept("ProviderIDMatches")),
    }
    let lost = node.map(|n| undeclared::of(slot, n, facts.gate));
    match &lost {
        Some(lost) if !lost.is_empty() => {
            let message = lost.message(&slot.spec.kubernetes_node_name);
            conditions.push(set("NodeLabelsDeclared", false, "Undeclared", message));
        }
        Some(_) => {
            let message =
                "every label and taint on the node is declared or comes back at registration"
                    .to_string();
            conditions.push(set("NodeLabelsDeclared", true, "Declared", message));
        }
        None => conditions.extend(kept("NodeLabelsDeclared")),
    }
    let pod_confirms = slot.spec.shutdown_pod_spec.as_ref().map(|p| p.confirms_power_state);
    let power_reading = PowerReading::of(slot).map(|p| (p, facts.meter_reading_max_age));
    let (ok, reason, message) = node_reporting(
        &slot.spec.kubernetes_node_name,
        node,
        seen.on_without_node,
        power_reading,
        pod_confirms,
        facts.now,
    );
    conditions.push(set("NodeReporting", ok, reason, message));
    match reading {
        Some(Reading::Watts { .. }) => conditions.push(set(
            "MeterRead",
            true,
            "Read",
            "the plug's meter answered; status.draw holds its reading".into(),
        )),
        Some(Reading::Failed(message)) => {
            conditions.push(set("MeterRead", false, "ReadFailed", message.clone()))
        }
        // Not read this time; a meter that is gone takes its condition with it.
        None if meter::metered(slot).is_some() => conditions.extend(kept("MeterRead")),
        None => {}
    }
    match seen.bmc_reading {
        Some(bmc::Reading::Read(read)) => conditions.push(set(
            "BmcRead",
            true,
            "Read",
            format!(
                "the BMC answered while the kubelet was silent: it reports the machine {}; status.bmcReading holds its reading",
                if read.power == ObservedPower::On { "on" } else { "off" }
            ),
        )),
        Some(bmc::Reading::Failed(message)) => {
            conditions.push(set("BmcRead", false, "ReadFailed", message.clone()))
        }
        None if bmc::readable(slot).is_some() => conditions.extend(kept("BmcRead")),
        None => {}
    }
    // Only while a budget holds the drain: the condition says which, since when the hold began
    // (its `--drain-timeout` runs from then), and goes with the hold.
    let held = seen.hold.map(|h| PublishedHold { since: h.since, message: h.message() });
    if let Some(hold) = &held {
        conditions.push(Condition {
            type_: drain::CONDITION.into(),
            status: "False".into(),
            reason: drain::HELD_BY_BUDGET.into(),
            message: hold.message.clone(),
            last_transition_time: Time(hold.since),
            observed_generation: None,
        });
    }
    // Only while a gate holds the power-off: which, what it read, and since when.
    let gate_held =
        seen.gate_hold.map(|h| PublishedHold { since: h.since, message: h.message.clone() });
    if let Some(hold) = seen.gate_hold {
        conditions.push(Condition {
            type_: power_off_gates::CONDITION.into(),
            status: "False".into(),
            reason: hold.reason.into(),
            message: hold.message.clone(),
            last_transition_time: Time(hold.since),
            observed_generation: None,
        });
    }
    let status = NodeStatus {
        observed_generation: slot.metadata.generation,
        power_off_held_by: seen.gate_hold.map(|h| h.held_by.clone()),
        power_state: Some(match (observed.powered_on, node.is_some_and(machine::is_suspended)) {
            (true, _) => ObservedPower::On,
            (false, true) => ObservedPower::Suspended,
            (false, false) => ObservedPower::Off,
        }),
        phase: Some(report),
        provider_id: registered_id.map(str::to_owned).or(previous.provider_id.clone()),
        last_claim,
        conditions,
        draw: if meter::metered(slot).is_some() {
            meter::next_draw(previous.draw.as_ref(), reading, report)
        } else {
            None
        },
        bmc_reading: match seen.bmc_reading {
            _ if bmc::readable(slot).is_none() => None,
            Some(bmc::Reading::Read(read)) => Some(read.clone()),
            _ => previous.bmc_reading.clone(),
        },
        node_labels: node.map(registered_labels).unwrap_or_else(|| previous.node_labels.clone()),
        // The scaler's fields (its own apply): neither compared, sent nor cleared here.
        local_volumes: Vec::new(),
        waiting_pods: Vec::new(),
        unclaimed_shutdowns: seen.streak.cloned().or(previous.unclaimed_shutdowns.clone()),
    };
    let mut events = Vec::new();
    let was_mismatched =
        previous.conditions.iter().any(|c| c.type_ == "ProviderIDMatches" && c.status == "False");
    if let (Some(message), false) = (&mismatch, was_mismatched) {
        events.push(Event {
            kind: EventType::Warning,
            reason: "ProviderIDMismatch",
            message: message.clone(),
        });
    }
    // Published when the hold starts or changes, not every pass: against the slot's status and
    // this term's own record (the cache may not have the status the last pass wrote yet).
    let was_held =
        previous.conditions.iter().find(|c| c.type_ == drain::CONDITION).map(|c| &c.message);
    let published = facts.published_hold;
    if let Some(hold) = &held {
        let known =
            was_held == Some(&hold.message) || published.is_some_and(|p| p.message == hold.message);
        if !known {
            events.push(Event {
                kind: EventType::Warning,
                reason: "DrainBlocked",
                message: hold.message.clone(),
            });
        }
    }
    let publish_hold = (published != held.as_ref()).then(|| held.clone());
    let was_gate_held = previous
        .conditions
        .iter()
        .find(|c| c.type_ == power_off_gates::CONDITION)
        .map(|c| &c.message);
    let published_gate = facts.published_gate_hold;
    match &gate_held {
        Some(hold) => {
            let known = was_gate_held == Some(&hold.message)
                || published_gate.is_some_and(|p| p.message == hold.message);
            if !known {
                events.push(Event {
                    kind: EventType::Warning,
                    reason: "PowerOffHeld",
                    message: hold.message.clone(),
                });
            }
        }
        None if was_gate_held.is_some() || published_gate.is_some() => events.push(Event {
            kind: EventType::Normal,
            reason: "PowerOffHoldEnded",
            message: "no power-off gate holds the machine any more".into(),
        }),
        None => {}
    }
    let publish_gate_hold = (published_gate != gate_held.as_ref()).then(|| gate_held.clone());
    // The scaler's fields (its own apply) are not this plan's to compare.
    let mine = slot.status.clone().map(|s| NodeStatus {
        local_volumes: Vec::new(),
        waiting_pods: Vec::new(),
        ..s
    });
    let status = (mine.as_ref() != Some(&status)).then_some(status);
    StatusPlan { status, events, publish_hold, publish_gate_hold }
}

fn digest(claim: &NodeClaim) -> SlotClaimDigest {
    let status = claim.status.as_ref();
    SlotClaimDigest {
        name: claim.metadata.name.clone().unwrap_or_default(),
        phase: Some(phase::of(claim)),
        attempt: claim.spec.attempt.unwrap_or(1),
        boot_committed: status.is_some_and(|s| s.boot_committed_at.is_some()),
        reached_ready: status.is_some_and(|s| s.ready_at.is_some()),
        call: claim.spec.request.call,
        group: claim.spec.request.group.clone(),
        reason: status.and_then(|s| s.reason.clone()),
        deadline_at: claim.spec.deadline_at.clone(),
        finished_at: status.and_then(|s| s.finished_at.clone()),
    }
}

/// Declared capacity that the node's allocatable contradicts, as `name: declared vs seen`.
/// Amounts compare as quantities (`16Gi` is `16777216Ki`); one that is not a quantity is drift,
/// said with why.
fn capacity_drift(slot: &Node, node: &CoreNode) -> Vec<String> {
    let allocatable: BTreeMap<String, _> =
        node.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
    slot.spec
        .node_capacity
        .iter()
        .filter_map(|(name, declared)| {
            let seen = allocatable.get(name)?;
            match quantity::same(&declared.0, &seen.0) {
                Ok(true) => None,
                Ok(false) => {
                    Some(format!("{name}: declared {} vs allocatable {}", declared.0, seen.0))
                }
                Err(error) => Some(format!(
                    "{name}: declared {} vs allocatable {} cannot be compared ({error})",
                    declared.0, seen.0
                )),
            }
        })
        .collect()
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    previous: &[Condition],
    now: jiff::Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: None,
    }
}

/// Whether the node's kubelet reports in, and what a person does about a silent one: the
/// operator never removes a node only because its kubelet went silent (`node_removal`).
/// `on_without_node`: the machine has no node and its plug reads it drawing power.
/// `reading`: the newest reading of the slot's plug meter or BMC, and how long it counts.
/// `pod_confirms`: whether the slot's shutdown pod, if it has one, reads the machine off.
fn node_reporting(
    node_name: &str,
    node: Option<&CoreNode>,
    on_without_node: bool,
    reading: Option<(PowerReading, std::time::Duration)>,
    pod_confirms: Option<bool>,
    now: jiff::Timestamp,
) -> (bool, &'static str, String) {
    if node.is_none() && on_without_node {
        return (
            false,
            "OnWithoutNode",
            format!(
                "node {node_name} is gone, but the slot's plug reads the machine drawing power: it is on, and a kubelet whose node was deleted while it ran never registers it again, so neither scaler sees it. The slot's shutdown powers it off; at its next boot the kubelet registers afresh. If the shutdown cannot reach it: systemctl restart kubelet on the machine"
            ),
        );
    }
    match machine::Kubelet::of(node) {
        machine::Kubelet::NoNode => (true, "NoNode", "the machine is off and has no node".into()),
        machine::Kubelet::NotReady { since, says } => {
            let since = since.map_or_else(|| "its registration".to_string(), |t| t.to_string());
            (
                true,
                "NotReady",
                format!(
                    "the kubelet of node {node_name} reports, and the node has not been Ready since {since} (kubelet says: {says}). The machine is on: a ready claim is kept for --not-ready-grace, a pin for as long as it holds"
                ),
            )
        }
        machine::Kubelet::Silent { since: Some(since) }
            if reading.is_some_and(|(r, max_age)| r.reads_on(since, now, max_age)) =>
        {
            let shows = reading.map(|(r, _)| r.shows()).unwrap_or_default();
            (
                false,
                "CutOff",
                format!(
                    "the kubelet of node {node_name} has been silent since {since}, but {shows}: it is on and cut off from the API server, not off. A ready claim keeps it, and the node is kept. Restore its network, and its kubelet takes the node back"
                ),
            )
        }
        machine::Kubelet::Silent { since } => {
            let since = since.map_or_else(|| "its registration".to_string(), |t| t.to_string());
            let pod = if pod_confirms == Some(false) {
                ". The slot's shutdown pod does not read the machine off, so its success confirms nothing here: if it exits 0 only once the machine is off, set spec.shutdownPodSpec.confirmsPowerState: true"
            } else {
                ""
            };
            (
                false,
                "Silent",
                format!(
                    "the kubelet of node {node_name} has been silent since {since}. The node is kept until a shutdown Job of the slot confirms the machine off, because a kubelet that is running but cut off from the API server never registers a deleted node again. If no shutdown reaches the machine and it is off: kubectl delete node {node_name}. If it is on: restore its network, and its kubelet takes the node back{pod}"
                ),
            )
        }
        _ => (true, "Reporting", format!("the kubelet of node {node_name} reports")),
    }
}

/// The slot declares a providerID that its registered node does not carry: say which value to
/// use. The operator follows the node either way; the declaration only misleads a reader.
fn provider_id_mismatch(slot: &Node, registered: &str) -> Option<String> {
    let declared = slot.spec.provider_id.as_deref().filter(|id| !id.is_empty())?;
    (declared != registered).then(|| {
        format!(
            "spec.providerID is {declared} but node {} registered with {registered}: set spec.providerID to {registered} or remove it (cluster-autoscaler is told the node's own value)",
            slot.spec.kubernetes_node_name
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_declared_provider_id_that_the_node_contradicts_says_what_to_use() {
        let mut slot: Node = serde_json::from_value(json!({
            "metadata": { "name": "m1" },
            "spec": { "kubernetesNodeName": "m1" },
        }))
        .unwrap();
        assert_eq!(provider_id_mismatch(&slot, "k3s://m1"), None, "nothing declared");
        slot.spec.provider_id = Some("k3s://m1".into());
        assert_eq!(provider_id_mismatch(&slot, "k3s://m1"), None);
        let message = provider_id_mismatch(&slot, "homelab://m1").expect("mismatch");
        assert!(message.contains("set spec.providerID to homelab://m1"), "{message}");
    }

    #[test]
    fn a_silent_node_says_why_it_is_kept_and_what_to_do() {
        let now: jiff::Timestamp = "2026-03-04T09:10:00Z".parse().unwrap();
        let node = |ready: Option<&str>| -> CoreNode {
            let conditions = ready.map(|status| {
                json!([{ "type": "Ready", "status": status, "lastTransitionTime": "2026-03-04T09:00:00Z" }])
            });
            serde_json::from_value(json!({
                "metadata": { "name": "m1" }, "status": { "conditions": conditions },
            }))
            .unwrap()
        };
        let table = [
            ("no node: off", None, true, "NoNode"),
            ("Ready", Some(node(Some("True"))), true, "Reporting"),
            ("NotReady still reports", Some(node(Some("False"))), true, "NotReady"),
            ("registering", Some(node(None)), true, "Reporting"),
            ("silent", Some(node(Some("Unknown"))), false, "Silent"),
        ];
        for (name, node, ok, reason) in table {
            let (got_ok, got_reason, message) =
                node_reporting("m1", node.as_ref(), false, None, None, now);
            assert_eq!((got_ok, got_reason), (ok, reason), "{name}: {message}");
        }
        let (_, _, message) =
            node_reporting("m1", Some(&node(Some("Unknown"))), false, None, Some(true), now);
        assert!(message.contains("since 2026-03-04T09:00:00Z"), "{message}");
        assert!(!message.contains("confirmsPowerState"), "{message}");
        assert!(message.contains("kubectl delete node m1"), "{message}");
        assert!(message.contains("restore its network"), "{message}");
        let (_, _, message) =
            node_reporting("m1", Some(&node(Some("Unknown"))), false, None, Some(false), now);
        assert!(message.contains("set spec.shutdownPodSpec.confirmsPowerState: true"), "{message}");
        let (_, _, message) =
            node_reporting("m1", Some(&node(Some("False"))), false, None, None, now);
        assert!(message.contains("not been Ready since 2026-03-04T09:00:00Z"), "{message}");
        assert!(message.contains("The machine is on"), "{message}");
        let (ok, reason, message) = node_reporting("m1", None, true, None, None, now);
        assert_eq!((ok, reason), (false, "OnWithoutNode"), "{message}");
        assert!(message.contains("plug reads the machine drawing power"), "{message}");
        // A silent kubelet whose plug read the machine on since: cut off, not off.
        let reading = |watts: f64, at: &str| PowerReading {
            by: crate::claim::ready_bound::ReadBy::Meter { watts, on_above: 16.7 },
            read_at: at.parse().unwrap(),
        };
        let fresh = std::time::Duration::from_secs(180);
        let silent = node(Some("Unknown"));
        let with =
            |plug| node_reporting("m1", Some(&silent), false, Some((plug, fresh)), None, now);
        let (ok, reason, said) = with(reading(32.0, "2026-03-04T09:09:00Z"));
        assert_eq!((ok, reason), (false, "CutOff"), "{said}");
        assert!(said.contains("cut off from the API server, not off"), "{said}");
        assert_eq!(with(reading(1.4, "2026-03-04T09:09:00Z")).1, "Silent", "at standby");
        assert_eq!(with(reading(32.0, "2026-03-04T08:59:00Z")).1, "Silent", "read before");
        assert_eq!(with(reading(32.0, "2026-03-04T09:01:00Z")).1, "Silent", "stale");
        // The same from a BMC that reports the machine on, and the message names the BMC.
        let bmc = |on: bool| PowerReading {
            by: crate::claim::ready_bound::ReadBy::Bmc { on },
            read_at: "2026-03-04T09:09:00Z".parse().unwrap(),
        };
        let (ok, reason, said) = with(bmc(true));
        assert_eq!((ok, reason), (false, "CutOff"), "{said}");
        assert!(said.contains("BMC reports the machine powered on"), "{said}");
        assert_eq!(with(bmc(false)).1, "Silent", "the BMC reports it off");
        assert!(message.contains("systemctl restart kubelet"), "{message}");
    }

    /// The facts of a pass over `slot` at `now` that saw nothing but `node`.
    fn facts_of(
        slot: &'static Node,
        node: Option<&'static CoreNode>,
        now: jiff::Timestamp,
    ) -> StatusFacts<'static> {
        StatusFacts {
            slot,
            node,
            live: None,
            newest_claim: None,
            gate: &[],
            shutdown_in_flight: false,
            seen: Seen::default(),
            meter_reading_max_age: Duration::from_secs(180),
            published_hold: None,
            published_gate_hold: None,
            now,
        }
    }

    /// The labels a node carries are recorded while it exists, less its hostname and the
    /// operator's own, and kept while the machine is off and has no node.
    #[test]
    fn the_labels_of_the_node_outlive_it() {
        let slot = crate::fixtures::slot("m1", "workers");
        let node: CoreNode = serde_json::from_value(json!({
            "metadata": { "name": "m1", "labels": {
                "kubernetes.io/hostname": "m1",
                "kubernetes.io/arch": "arm64",
                "topology.topolvm.io/node": "m1",
                "infra.homecluster.dev/group": "workers",
            } },
            "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
        }))
        .unwrap();
        let now: jiff::Timestamp = "2026-03-04T09:10:00Z".parse().unwrap();
        let facts = |slot, node| facts_of(slot, node, now);
        let leak = |slot: Node| -> &'static Node { Box::leak(Box::new(slot)) };
        let up = plan(&facts(leak(slot.clone()), Some(Box::leak(Box::new(node)))));
        let recorded = up.status.expect("a status").node_labels;
        let want: BTreeMap<String, String> = [
            ("kubernetes.io/arch".to_string(), "arm64".to_string()),
            ("topology.topolvm.io/node".to_string(), "m1".to_string()),
        ]
        .into();
        assert_eq!(recorded, want);
        let mut off = slot;
        off.status = Some(NodeStatus { node_labels: want.clone(), ..NodeStatus::default() });
        let kept = plan(&facts(leak(off), None)).status.expect("a status").node_labels;
        assert_eq!(kept, want, "kept while the machine has no node");
    }

    /// A power-off the gates hold: the condition and `powerOffHeldBy` say which gate and what
    /// it read, the event goes out when the hold starts or changes (not again on a pass that
    /// sees the same), and the hold's end is said once.
    #[test]
    fn a_gate_hold_is_shown_while_it_lasts_and_its_end_said_once() {
        use crate::controller::slot::power_off_gates::{GateHold, HELD_BY_GATE};
        let now: jiff::Timestamp = "2026-03-04T09:10:00Z".parse().unwrap();
        let leak = |slot: Node| -> &'static Node { Box::leak(Box::new(slot)) };
        let hold = GateHold {
            since: "2026-03-04T09:05:00Z".parse().unwrap(),
            held_by: "ceph".into(),
            reason: HELD_BY_GATE,
            message: "held on, serving: gate ceph is closed: the query returned no sample".into(),
            retry: Duration::from_secs(10),
        };
        let slot = crate::fixtures::slot("m1", "workers");
        let held = |slot: &'static Node, published: Option<&'static PublishedHold>| {
            let mut facts = facts_of(slot, None, now);
            facts.seen.gate_hold = Some(Box::leak(Box::new(hold.clone())));
            facts.published_gate_hold = published;
            plan(&facts)
        };
        let first = held(leak(slot.clone()), None);
        let status = first.status.clone().expect("a status");
        let condition =
            status.conditions.iter().find(|c| c.type_ == "PowerOffAllowed").expect("condition");
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "GateHolds"));
        assert_eq!(condition.message, hold.message);
        assert_eq!(condition.last_transition_time.0, hold.since);
        assert_eq!(status.power_off_held_by.as_deref(), Some("ceph"));
        let reasons = |p: &StatusPlan| p.events.iter().map(|e| e.reason).collect::<Vec<_>>();
        assert_eq!(reasons(&first), ["PowerOffHeld"]);
        let published = first.publish_gate_hold.clone().expect("recorded").expect("a hold");
        // The status not yet in the cache, but the hold recorded: no second event.
        let again = held(leak(slot.clone()), Some(Box::leak(Box::new(published))));
        assert!(reasons(&again).is_empty(), "{:?}", again.events);
        // Released: the condition and the name go, and the end is said once.
        let mut was_held = slot.clone();
        was_held.status = Some(status);
        let ended = plan(&facts_of(leak(was_held), None, now));
        let status = ended.status.clone().expect("a status");
        assert!(status.conditions.iter().all(|c| c.type_ != "PowerOffAllowed"));
        assert_eq!(status.power_off_held_by, None);
        assert_eq!(reasons(&ended), ["PowerOffHoldEnded"]);
        assert_eq!(ended.publish_gate_hold, None, "nothing was recorded by this term");
    }

    /// One pass's plan: what it writes, which events it publishes, and the hold it records.
    #[test]
    fn status_plan_table() {
        use crate::api::ShutdownStreak;
        use crate::controller::slot::drain::{DrainHold, HeldPod};
        let now: jiff::Timestamp = "2026-03-04T09:10:00Z".parse().unwrap();
        let with_status = |mut slot: Node, status: NodeStatus| {
            slot.status = Some(status);
            slot
        };
        let plain = crate::fixtures::slot("m1", "workers");
        let mut declared = plain.clone();
        declared.spec.provider_id = Some("homelab://m1".into());
        let node: CoreNode = serde_json::from_value(json!({
            "metadata": { "name": "m1" },
            "spec": { "providerID": "k3s://m1" },
            "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
        }))
        .unwrap();
        let hold = DrainHold {
            pods: vec![HeldPod {
                namespace: "db".into(),
                name: "pg-0".into(),
                budgets: vec!["pg".into()],
            }],
            since: "2026-03-04T09:05:00Z".parse().unwrap(),
            force_at: None,
        };
        let published = PublishedHold { since: hold.since, message: hold.message() };
        let streak = ShutdownStreak { attempts: 2, last_attempt_at: Time(now) };
        let facts = |slot: &'static Node| facts_of(slot, None, now);
        let leak = |slot: Node| -> &'static Node { Box::leak(Box::new(slot)) };
        let reasons = |plan: &StatusPlan| plan.events.iter().map(|e| e.reason).collect::<Vec<_>>();
        let reporting = |plan: &StatusPlan| {
            let status = plan.status.as_ref().expect("a status to write");
            let c = status
                .conditions
                .iter()
                .find(|c| c.type_ == "NodeReporting")
                .expect("NodeReporting");
            (status.power_state, c.reason.clone())
        };

        // An off slot: its first status says so; the same status again writes nothing.
        let first = plan(&facts(leak(plain.clone())));
        assert_eq!(reporting(&first), (Some(ObservedPower::Off), "NoNode".to_string()));
        assert_eq!((reasons(&first), &first.publish_hold), (vec![], &None));
        let again = plan(&facts(leak(with_status(plain.clone(), first.status.clone().unwrap()))));
        assert_eq!(
            again,
            StatusPlan {
                status: None,
                events: vec![],
                publish_hold: None,
                publish_gate_hold: None
            }
        );

        // No node, the plug reading the machine on: on, and the condition says so.
        let seen = Seen { on_without_node: true, ..Seen::default() };
        let on = plan(&StatusFacts { seen, ..facts(leak(plain.clone())) });
        assert_eq!(reporting(&on), (Some(ObservedPower::On), "OnWithoutNode".to_string()));

        // A declared providerID the node contradicts: the event once, when the condition turns.
        let slot = leak(declared.clone());
        let mismatch = plan(&StatusFacts { node: Some(&node), ..facts(slot) });
        assert_eq!(reasons(&mismatch), ["ProviderIDMismatch"]);
        let slot = leak(with_status(declared.clone(), mismatch.status.clone().unwrap()));
        assert_eq!(
            reasons(&plan(&StatusFacts { node: Some(&node), ..facts(slot) })),
            Vec::<&str>::new()
        );

        // A drain held by a budget: its event and record when it starts, neither again while it
        // holds (by this term's record or the status's condition), the record cleared after.
        let seen = Seen { hold: Some(&hold), ..Seen::default() };
        let starts = plan(&StatusFacts { seen, ..facts(leak(plain.clone())) });
        assert_eq!(reasons(&starts), ["DrainBlocked"]);
        assert_eq!(starts.publish_hold, Some(Some(published.clone())));
        let drained = starts.status.clone().unwrap();
        let c = drained.conditions.iter().find(|c| c.type_ == drain::CONDITION).unwrap();
        assert_eq!((c.status.as_str(), c.last_transition_time.0), ("False", hold.since));
        let recorded =
            StatusFacts { seen, published_hold: Some(&published), ..facts(leak(plain.clone())) };
        let holds = plan(&recorded);
        assert_eq!((reasons(&holds), &holds.publish_hold), (vec![], &None));
        let in_status = leak(with_status(plain.clone(), drained));
        assert_eq!(reasons(&plan(&StatusFacts { seen, ..facts(in_status) })), Vec::<&str>::new());
        let over = plan(&StatusFacts { published_hold: Some(&published), ..facts(in_status) });
        assert_eq!(over.publish_hold, Some(None));
        let kept = over.status.unwrap();
        assert!(kept.conditions.iter().all(|c| c.type_ != drain::CONDITION), "{kept:?}");

        // The count of unclaimed shutdowns: set by the shutdown pass, else kept as stored.
        let seen = Seen { streak: Some(&streak), ..Seen::default() };
        let counted = plan(&StatusFacts { seen, ..facts(leak(plain.clone())) }).status.unwrap();
        assert_eq!(counted.unclaimed_shutdowns.as_ref(), Some(&streak));
        let stored = leak(with_status(plain.clone(), counted.clone()));
        assert_eq!(plan(&facts(stored)).status, None, "kept, so nothing to write");

        // A silent node behind a BMC: its reading is stored with a condition, and the node is
        // reported cut off while the reading shows the machine on; a failed read keeps the last
        // reading and says why; a slot that no longer has a BMC drops both.
        let mut behind_bmc = plain.clone();
        behind_bmc.spec.power = Some(
            serde_json::from_value(json!({ "redfish": {
                "endpoint": "https://10.0.0.5", "credentials": { "secretName": "bmc" } } }))
            .unwrap(),
        );
        let silent: CoreNode = serde_json::from_value(json!({
            "metadata": { "name": "m1" },
            "status": { "conditions": [{ "type": "Ready", "status": "Unknown",
                                         "lastTransitionTime": "2026-03-04T09:00:00Z" }] },
        }))
        .unwrap();
        let bmc_condition = |status: &NodeStatus| {
            let c = status.conditions.iter().find(|c| c.type_ == "BmcRead").cloned();
            c.map(|c| (c.status, c.message))
        };
        let on = bmc::Reading::Read(crate::api::BmcReading {
            power: ObservedPower::On,
            read_at: Time(now),
        });
        let seen = Seen { bmc_reading: Some(&on), ..Seen::default() };
        let slot = leak(behind_bmc.clone());
        let read = plan(&StatusFacts { seen, node: Some(&silent), ..facts(slot) });
        let status = read.status.clone().unwrap();
        assert_eq!(status.bmc_reading.as_ref().map(|r| r.power), Some(ObservedPower::On));
        let (ok, message) = bmc_condition(&status).expect("BmcRead");
        assert_eq!(ok, "True", "{message}");
        assert!(message.contains("reports the machine on"), "{message}");
        let stored = leak(with_status(behind_bmc.clone(), status.clone()));
        let reported = plan(&StatusFacts { node: Some(&silent), ..facts(stored) });
        assert_eq!(reported.status.map(|s| s.power_state), Some(Some(ObservedPower::Off)));
        let cut_off = node_reporting(
            "m1",
            Some(&silent),
            false,
            PowerReading::of(stored).map(|r| (r, Duration::from_secs(180))),
            None,
            now,
        );
        assert_eq!(cut_off.1, "CutOff", "{}", cut_off.2);
        let failed = bmc::Reading::Failed("reading Secret bmc: forbidden".into());
        let seen = Seen { bmc_reading: Some(&failed), ..Seen::default() };
        let after =
            plan(&StatusFacts { seen, node: Some(&silent), ..facts(stored) }).status.unwrap();
        assert_eq!(after.bmc_reading, status.bmc_reading, "the last reading kept");
        assert_eq!(bmc_condition(&after).map(|(ok, _)| ok).as_deref(), Some("False"));
        let gone = leak(with_status(plain.clone(), status));
        let dropped = plan(&facts(gone)).status.unwrap();
        assert_eq!((dropped.bmc_reading.clone(), bmc_condition(&dropped)), (None, None));
    }

    #[test]
    fn capacity_drifts_by_amount_not_by_spelling() {
        let slot: Node = serde_json::from_value(json!({
            "metadata": { "name": "m1" },
            "spec": { "kubernetesNodeName": "m1", "nodeCapacity": {
                "memory": "16Gi", "cpu": "4", "pods": "110", "ephemeral-storage": "100G",
                "example.com/gpu": "one",
            } },
        }))
        .unwrap();
        let node = |allocatable: serde_json::Value| -> CoreNode {
            serde_json::from_value(json!({
                "metadata": { "name": "m1" }, "status": { "allocatable": allocatable },
            }))
            .unwrap()
        };
        let same = node(json!({
            "memory": "16777216Ki", "cpu": "4000m", "pods": "110", "ephemeral-storage": "1e11",
        }));
        assert_eq!(capacity_drift(&slot, &same), Vec::<String>::new());
        let drifted = node(json!({
            "memory": "16G", "cpu": "3500m", "pods": "110", "example.com/gpu": "1",
        }));
        assert_eq!(
            capacity_drift(&slot, &drifted),
            [
                "cpu: declared 4 vs allocatable 3500m",
                "example.com/gpu: declared one vs allocatable 1 cannot be compared \
                 (\"one\" is not a quantity: no digits)",
                "memory: declared 16Gi vs allocatable 16G",
            ]
        );
    }
}
