//! What the operator observes of a slot's machine, and the slot's status: observed power, the
//! derived report, the digest of the newest claim, the plug meter's last reading, and a
//! capacity-drift condition. Written only when it changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;

use super::drain::{self, DrainHold};
use super::meter::{self, Reading};
use super::undeclared;
use crate::api::{Node, NodeClaim, NodeStatus, ObservedPower, SlotClaimDigest};
use crate::claim::ready_bound::PlugReading;
use crate::controller::error::{KubeContext, Result, is_stale_write};
use crate::controller::{Context, PublishedHold};
use crate::field_manager::{FieldManager, apply_status_of};
use crate::machine;
use crate::phase::{self, MachineObservation, SlotReportInput};
use crate::quantity;

/// How many times one pass computes and sends the node write before it leaves the rest to the
/// controller's error backoff.
const NODE_WRITE_ATTEMPTS: u32 = 5;

/// Writes what the slot side wants of its node (`want` computes the guarded merge patch from a
/// node, see `crate::node_declaration`). A fresh node changes several times a second while it registers (the
/// kubelet's status, kube-controller-manager, a CNI), and the claim's readiness gate waits for
/// this write, so a write that lost to one of them is computed again at once on the node read
/// from the API server (the cache may not have seen the change yet), up to
/// [`NODE_WRITE_ATTEMPTS`] times. Returns whether anything was written.
pub async fn write_node(
    ctx: &Context,
    node: &CoreNode,
    want: impl Fn(&CoreNode) -> Option<serde_json::Value>,
) -> Result<bool> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let nodes = Api::<CoreNode>::all(ctx.client.clone());
    let mut current = std::borrow::Cow::Borrowed(node);
    let mut attempt = 1;
    loop {
        let Some(patch) = want(&current) else { return Ok(attempt > 1) };
        let written = nodes
            .patch(&node_name, &FieldManager::SlotController.patch(), &Patch::Merge(&patch))
            .await;
        match written {
            Ok(_) => return Ok(true),
            Err(error) if is_stale_write(&error) && attempt < NODE_WRITE_ATTEMPTS => {
                tracing::info!(
                    node = node_name,
                    attempt,
                    "node changed under its write; writing again on a fresh read"
                );
                let fresh = nodes.get(&node_name).await;
                current = std::borrow::Cow::Owned(
                    fresh.during(|| format!("reading node {node_name} again for its slot"))?,
                );
                attempt += 1;
            }
            Err(error) => {
                return Err(error).during(|| format!("updating node {node_name} for its slot"));
            }
        }
    }
}

/// The slot's live claim (the newest, should a race have left two).
pub fn live_claim(ctx: &Context, slot_name: &str) -> Option<std::sync::Arc<NodeClaim>> {
    phase::newest_live(ctx.claims_of_slot(slot_name))
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

/// Writes the slot's status when it changed; `live` is the slot's live claim.
/// What this pass of the slot's reconcile saw besides the objects: the plug meter's reading (when
/// one was due) and a drain that disruption budgets hold back.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen<'a> {
    pub reading: Option<&'a Reading>,
    pub hold: Option<&'a DrainHold>,
    /// The shutdown pass's new count of attempts no claim counts; `None` keeps the stored one.
    pub streak: Option<&'a crate::api::ShutdownStreak>,
    /// The machine has no node, and its plug reads it drawing power.
    pub on_without_node: bool,
}

pub async fn write_status(
    ctx: &Context,
    slot: &Node,
    node: Option<&CoreNode>,
    live: Option<&NodeClaim>,
    seen: Seen<'_>,
) -> Result<()> {
    let reading = seen.reading;
    let slot_name = slot.metadata.name.clone().unwrap_or_default();
    let claims = ctx.claims_of_slot(&slot_name);
    let gate = ctx.group_of(slot).map(|g| g.spec.node_readiness_taints.clone()).unwrap_or_default();
    let shutdown_in_flight = ctx.shutdown_in_flight(&slot_name);
    let observed = MachineObservation {
        powered_on: machine::powered_on(node) || seen.on_without_node,
        usable: machine::usable(node, &gate),
        shutdown_job_in_flight: shutdown_in_flight,
    };
    let report = phase::derive_report(SlotReportInput {
        live_claim: live.map(|c| Some(phase::of(c))),
        marked: live.is_some_and(phase::is_marked),
        observed,
    });
    let previous = slot.status.clone().unwrap_or_default();
    let last_claim =
        phase::newest(claims.iter().map(AsRef::as_ref)).map(digest).or(previous.last_claim.clone());
    const OWN: [&str; 6] = [
        "CapacityMatches",
        "ProviderIDMatches",
        "NodeLabelsDeclared",
        "MeterRead",
        "NodeReporting",
        "Drained",
    ];
    let mut conditions: Vec<Condition> =
        previous.conditions.iter().filter(|c| !OWN.contains(&c.type_.as_str())).cloned().collect();
    let kept = |type_: &str| previous.conditions.iter().find(|c| c.type_ == type_).cloned();
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
        conditions.push(condition(
            "CapacityMatches",
            ok,
            reason,
            message,
            &previous.conditions,
            ctx.now(),
        ));
    } else if let Some(kept) = kept("CapacityMatches") {
        conditions.push(kept);
    }
    // What is known of the node outlives it: the machine is off most of the time.
    let registered_id = node.and_then(machine::node_provider_id);
    let mismatch = registered_id.and_then(|id| provider_id_mismatch(slot, id));
    match (registered_id, &mismatch) {
        (Some(_), Some(message)) => {
            conditions.push(condition(
                "ProviderIDMatches",
                false,
                "Mismatch",
                message.clone(),
                &previous.conditions,
                ctx.now(),
            ));
        }
        (Some(id), None) => {
            let message = format!("the node registered with providerID {id}");
            conditions.push(condition(
                "ProviderIDMatches",
                true,
                "Matches",
                message,
                &previous.conditions,
                ctx.now(),
            ));
        }
        (None, _) => conditions.extend(kept("ProviderIDMatches")),
    }
    let lost = node.map(|n| undeclared::of(slot, n, &gate));
    match &lost {
        Some(lost) if !lost.is_empty() => {
            let message = lost.message(&slot.spec.kubernetes_node_name);
            conditions.push(condition(
                "NodeLabelsDeclared",
                false,
                "Undeclared",
                message,
                &previous.conditions,
                ctx.now(),
            ));
        }
        Some(_) => {
            let message =
                "every label and taint on the node is declared or comes back at registration"
                    .to_string();
            conditions.push(condition(
                "NodeLabelsDeclared",
                true,
                "Declared",
                message,
                &previous.conditions,
                ctx.now(),
            ));
        }
        None => conditions.extend(kept("NodeLabelsDeclared")),
    }
    let pod_confirms = slot.spec.shutdown_pod_spec.as_ref().map(|p| p.confirms_power_state);
    let plug = PlugReading::of(slot).map(|p| (p, ctx.meter_reading_max_age()));
    let (ok, reason, message) = node_reporting(
        &slot.spec.kubernetes_node_name,
        node,
        seen.on_without_node,
        plug,
        pod_confirms,
        ctx.now(),
    );
    conditions.push(condition(
        "NodeReporting",
        ok,
        reason,
        message,
        &previous.conditions,
        ctx.now(),
    ));
    match reading {
        Some(Reading::Watts { .. }) => conditions.push(condition(
            "MeterRead",
            true,
            "Read",
            "the plug's meter answered; status.draw holds its reading".into(),
            &previous.conditions,
            ctx.now(),
        )),
        Some(Reading::Failed(message)) => conditions.push(condition(
            "MeterRead",
            false,
            "ReadFailed",
            message.clone(),
            &previous.conditions,
            ctx.now(),
        )),
        // Not read this time; a meter that is gone takes its condition with it.
        None if meter::metered(slot).is_some() => conditions.extend(kept("MeterRead")),
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
    let status = NodeStatus {
        observed_generation: slot.metadata.generation,
        power_state: Some(if observed.powered_on { ObservedPower::On } else { ObservedPower::Off }),
        phase: Some(report),
        provider_id: registered_id.map(str::to_owned).or(previous.provider_id.clone()),
        last_claim,
        conditions,
        draw: if meter::metered(slot).is_some() {
            meter::next_draw(previous.draw.as_ref(), reading, report)
        } else {
            None
        },
        // The scaler's field (its own apply): neither compared, sent nor cleared here.
        local_volumes: Vec::new(),
        unclaimed_shutdowns: seen.streak.cloned().or(previous.unclaimed_shutdowns.clone()),
    };
    let was_mismatched =
        previous.conditions.iter().any(|c| c.type_ == "ProviderIDMatches" && c.status == "False");
    if let (Some(message), false) = (&mismatch, was_mismatched) {
        ctx.publish(slot, EventType::Warning, "ProviderIDMismatch", message.clone()).await;
    }
    // Published when the hold starts or changes, not every pass: against the slot's status and
    // this term's own record (the cache may not have the status the last pass wrote yet).
    let was_held =
        previous.conditions.iter().find(|c| c.type_ == drain::CONDITION).map(|c| &c.message);
    let published = ctx.published_hold(&slot_name);
    if let Some(hold) = &held {
        let known = was_held == Some(&hold.message)
            || published.as_ref().is_some_and(|p| p.message == hold.message);
        if !known {
            ctx.publish(slot, EventType::Warning, "DrainBlocked", hold.message.clone()).await;
        }
    }
    if published != held {
        ctx.set_published_hold(&slot_name, held);
    }
    let mine = slot.status.clone().map(|s| NodeStatus { local_volumes: Vec::new(), ..s });
    if mine.as_ref() == Some(&status) {
        return Ok(());
    }
    let serialize = |status: Option<&NodeStatus>| {
        serde_json::to_value(status)
            .map_err(|source| crate::controller::Error::Serialize { what: "a slot status", source })
    };
    let (previous, status) = (serialize(mine.as_ref())?, serialize(Some(&status))?);
    let slots = Api::<Node>::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_status_of(&slots, &slot_name, FieldManager::SlotController, Some(&previous), status)
        .await
        .during(|| format!("writing the status of slot {slot_name}"))?;
    Ok(())
}

/// Whether the node's kubelet reports in, and what a person does about a silent one: the
/// operator never removes a node only because its kubelet went silent (`node_removal`).
/// `on_without_node`: the machine has no node and its plug reads it drawing power.
/// `plug`: the slot's plug meter's last reading and how long it counts.
/// `pod_confirms`: whether the slot's shutdown pod, if it has one, reads the machine off.
fn node_reporting(
    node_name: &str,
    node: Option<&CoreNode>,
    on_without_node: bool,
    plug: Option<(PlugReading, std::time::Duration)>,
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
            if plug.is_some_and(|(p, max_age)| p.reads_on(since, now, max_age)) =>
        {
            (
                false,
                "CutOff",
                format!(
                    "the kubelet of node {node_name} has been silent since {since}, but the slot's plug reads the machine drawing power: it is on and cut off from the API server, not off. A ready claim keeps it, and the node is kept. Restore its network, and its kubelet takes the node back"
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
        let reading = |watts: f64, at: &str| PlugReading {
            watts,
            read_at: at.parse().unwrap(),
            on_above: 16.7,
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
        assert!(message.contains("systemctl restart kubelet"), "{message}");
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
