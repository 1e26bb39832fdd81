//! The node's `Suspended` condition: what says, on the Kubernetes node itself, that its machine
//! sleeps (suspended to RAM) rather than being off, cut off or broken. A sleeping machine's
//! kubelet is as silent as a partitioned one, so the node lifecycle marks it `Unknown`; the
//! condition tells the rest of the cluster why. cluster-autoscaler counts a node with
//! `Suspended=True` as suspended, neither ready nor unready, so a pool with machines asleep is
//! not an unhealthy cluster; the provider leaves it out of its group until it is back (D44).
//!
//! Set once the node has turned silent after a suspend Job that succeeded, and with it
//! cluster-autoscaler's deletion taint is taken off (left from the DeleteNodes that released
//! the machine: with it, CA counts the node as deleted rather than suspended); cleared once the
//! kubelet reports again after it was set (a resume, by a claim's wake or by hand). The kubelet
//! keeps conditions it does not own, and so does the node lifecycle.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use serde_json::json;

use super::node_removal::{ShutdownJob, silent_since_suspend};
use crate::api::CONDITION_SUSPENDED;
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result};
use crate::field_manager::FieldManager;
use crate::machine::{self, Kubelet};

/// What the condition should become.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Leave,
    /// The machine sleeps: `Suspended=True`.
    Asleep,
    /// The kubelet reports again: `Suspended=False`.
    Awake,
}

/// Decides the node's `Suspended` condition. Pure.
pub fn decide(
    node: &CoreNode,
    shutdowns: &[ShutdownJob],
    settle: SignedDuration,
    now: Timestamp,
) -> Mark {
    match (machine::suspended_since(node), Kubelet::of(Some(node))) {
        // Back after the mark: Ready or NotReady, it reports.
        (Some(marked), Kubelet::Ready | Kubelet::NotReady { .. }) => {
            let since = machine::ready_condition(node).and_then(|(_, since)| since);
            if since.is_none_or(|since| since >= marked) { Mark::Awake } else { Mark::Leave }
        }
        (None, Kubelet::Silent { since }) => {
            let silent_from = since.unwrap_or(now);
            if silent_since_suspend(shutdowns, silent_from, settle, now) {
                Mark::Asleep
            } else {
                Mark::Leave
            }
        }
        _ => Mark::Leave,
    }
}

/// Writes the condition when [`decide`] says so, and keeps a node asleep free of
/// cluster-autoscaler's deletion taint. Returns the decision.
pub async fn reconcile(
    ctx: &Context,
    node: &CoreNode,
    shutdowns: &[ShutdownJob],
    slot_name: &str,
) -> Result<Mark> {
    let now = ctx.now();
    let mark = decide(node, shutdowns, ctx.shutdown_settle(), now);
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let asleep = mark == Mark::Asleep || (mark == Mark::Leave && machine::is_suspended(node));
    if asleep {
        // cluster-autoscaler's scale-down of the machine is done; asleep, it is counted as
        // suspended only without its deletion taint. First, so that a conflict on the node's
        // version retries it with the mark.
        ctx.clear_to_be_deleted_taint(&node_name, FieldManager::SlotController).await?;
    }
    let (status, reason, message) = match mark {
        Mark::Leave => return Ok(mark),
        Mark::Asleep => (
            "True",
            "SuspendedToRAM",
            format!(
                "slot {slot_name}'s machine sleeps (suspended to RAM): its kubelet resumes on this \
                 node when a claim wakes the machine"
            ),
        ),
        Mark::Awake => ("False", "Resumed", "the kubelet reports again".to_owned()),
    };
    // A strategic merge patch merges conditions by type: the kubelet's stay as they are.
    let patch = json!({ "status": { "conditions": [{
        "type": CONDITION_SUSPENDED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": Time(now),
        "lastHeartbeatTime": Time(now),
    }]}});
    Api::<CoreNode>::all(ctx.client.clone())
        .patch_status(&node_name, &FieldManager::SlotController.patch(), &Patch::Strategic(patch))
        .await
        .during(|| format!("marking node {node_name} {reason}"))?;
    tracing::info!(node = %node_name, ?mark, "node's Suspended condition written");
    Ok(mark)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::at;
    use crate::job_outcome::JobOutcome;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn ts(s: &str) -> Timestamp {
        at(s).0
    }

    fn node(ready: (&str, &str), suspended: Option<&str>) -> CoreNode {
        let condition = |type_: &str, status: &str, since: &str| NodeCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(Time(ts(since))),
            ..NodeCondition::default()
        };
        let mut conditions = vec![condition("Ready", ready.0, ready.1)];
        conditions.extend(suspended.map(|since| condition(CONDITION_SUSPENDED, "True", since)));
        CoreNode {
            status: Some(NodeStatus { conditions: Some(conditions), ..NodeStatus::default() }),
            ..CoreNode::default()
        }
    }

    #[test]
    fn suspended_condition_table() {
        let now = ts("2026-03-04T10:00:00Z");
        let settle = SignedDuration::from_mins(2);
        let job = |outcome, suspends: bool| ShutdownJob {
            outcome,
            created: Some(ts("2026-03-04T09:55:00Z")),
            confirms_off: !suspends,
            serves_claim: true,
            suspends,
        };
        let done = JobOutcome::Succeeded { at: Some(ts("2026-03-04T09:55:20Z")) };
        let suspended = [job(done, true)];
        let powered_off = [job(done, false)];
        let failed = [job(JobOutcome::Failed, true)];
        let rows: Vec<(&str, CoreNode, &[ShutdownJob], Mark)> = vec![
            (
                "silent after a suspend that succeeded",
                node(("Unknown", "2026-03-04T09:56:00Z"), None),
                &suspended,
                Mark::Asleep,
            ),
            (
                "silent after a power-off: off, not asleep",
                node(("Unknown", "2026-03-04T09:56:00Z"), None),
                &powered_off,
                Mark::Leave,
            ),
            (
                "silent after a suspend that did not take",
                node(("Unknown", "2026-03-04T09:56:00Z"), None),
                &failed,
                Mark::Leave,
            ),
            (
                "silent before the suspend was made",
                node(("Unknown", "2026-03-04T09:50:00Z"), None),
                &suspended,
                Mark::Leave,
            ),
            (
                "silent long after the suspend: a later silence",
                node(("Unknown", "2026-03-04T09:59:00Z"), None),
                &suspended,
                Mark::Leave,
            ),
            (
                "Ready, not yet marked Unknown: wait",
                node(("True", "2026-03-04T09:00:00Z"), None),
                &suspended,
                Mark::Leave,
            ),
            (
                "marked, still silent",
                node(("Unknown", "2026-03-04T09:56:00Z"), Some("2026-03-04T09:56:05Z")),
                &[],
                Mark::Leave,
            ),
            (
                "marked, Ready since: resumed",
                node(("True", "2026-03-04T09:59:30Z"), Some("2026-03-04T09:56:05Z")),
                &[],
                Mark::Awake,
            ),
            (
                "marked, NotReady since: the kubelet reports, resumed",
                node(("False", "2026-03-04T09:59:30Z"), Some("2026-03-04T09:56:05Z")),
                &[],
                Mark::Awake,
            ),
        ];
        for (name, node, shutdowns, want) in rows {
            assert_eq!(decide(&node, shutdowns, settle, now), want, "{name}");
        }
    }
}
