//! A machine that is off has no Kubernetes node. A real machine keeps its node when it powers
//! off (its kubelet just stops, and the node lifecycle marks it Unknown), but
//! cluster-autoscaler reads such a node as an unready instance of its group, never as
//! upcoming capacity once it is older than CA's startup time, and stops autoscaling the whole
//! cluster once enough nodes are unready. So, as a cloud controller manager does for a
//! terminated instance, the operator removes the node once the machine is confirmed off; the
//! kubelet registers it again at boot, with its registration taints.
//!
//! Never under a running kubelet: a kubelet registers its node once, when it starts, and never
//! again if the node is deleted while it runs. A machine cut off from the API server (a switch
//! reboot, a Wi-Fi drop) is as silent as one that is off, so silence alone confirms nothing.
//! Confirmed off means the slot's own shutdown Job succeeded after the node registered and the
//! kubelet is silent (Ready `Unknown`), its silence having begun no later than a settle after the
//! Job ended (a later silence is a blip of a machine the shutdown left on). A silence that began
//! before the Job was made (the confirm-off path, a forced shutdown after `MachineGone`) was not
//! the Job's doing, so there the Job's success counts only if it reads the machine off
//! ([`ANNOTATION_CONFIRMS_OFF`]: a typed driver, or a pod spec that says so). A node silent for
//! longer than the grace with nothing wanting its machine is not removed: the shutdown path
//! powers the machine off ([`Removal::ConfirmOff`]), and that shutdown's success is the
//! confirmation. Where nothing reaches the machine the node stays, and the slot says what to do.
//! A Ready node is never removed, nor one whose kubelet still reports (`False`), and the delete
//! is guarded by the node's uid and resourceVersion, so a node that has just registered again
//! is never the one deleted.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node as CoreNode;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::events::EventType;

use super::undeclared;
use crate::api::{ANNOTATION_CONFIRMS_OFF, ANNOTATION_SUSPENDS, LABEL_NODECLAIM, Node, NodeClaim};
use crate::controller::Context;
use crate::controller::claim::release::awaits_forced_shutdown;
use crate::controller::error::{KubeContext, Result, is_not_found, is_stale_write};
use crate::controller::jobs::Lifecycle;
use crate::job_outcome::{JobOutcome, outcome};
use crate::{machine, phase};

/// Why a node is removed. Both mean the slot's shutdown Job succeeded after the node
/// registered and the kubelet went silent since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffBecause {
    /// Nothing wants the machine.
    ShutDown,
    /// A claim is booting the machine again: its kubelet registers a fresh node, which
    /// cluster-autoscaler counts as upcoming.
    Rebooting,
}

/// What to do with the node of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    Keep,
    /// Not yet: look again at this time.
    RecheckAt(Timestamp),
    Remove(OffBecause),
    /// The kubelet has been silent since `since`, past the grace, and nothing wants the
    /// machine, but nothing confirms it is off: keep the node and power the machine off.
    ConfirmOff {
        since: Timestamp,
    },
    /// The machine has slept since `since`, past the slot's `powerOffAfterMinutes`, and nothing
    /// wants it: keep the node and power the machine off (waking it first where the off path
    /// needs its OS).
    PowerOffAsleep {
        since: Timestamp,
    },
}

/// A shutdown Job of the slot, as the node removal and the shutdown plan read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownJob {
    pub outcome: JobOutcome,
    /// When the Job was made.
    pub created: Option<Timestamp>,
    /// Its success reads the machine off ([`ANNOTATION_CONFIRMS_OFF`]).
    pub confirms_off: bool,
    /// It serves a claim (no claim: the slot's status counts it).
    pub serves_claim: bool,
    /// It suspends the machine to RAM ([`ANNOTATION_SUSPENDS`]): its success never means off.
    pub suspends: bool,
}

impl ShutdownJob {
    pub fn of(job: &Job) -> Self {
        let meta = &job.metadata;
        // What the Job was made to prove, written on it as `"true"`.
        let says = |key: &str| {
            meta.annotations.as_ref().and_then(|a| a.get(key)).is_some_and(|v| v == "true")
        };
        Self {
            outcome: outcome(job),
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            confirms_off: says(ANNOTATION_CONFIRMS_OFF),
            serves_claim: meta.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_NODECLAIM)),
            suspends: says(ANNOTATION_SUSPENDS),
        }
    }

    /// The slot's shutdown Jobs in the cache.
    pub fn of_slot(ctx: &Context, slot_name: &str) -> Vec<Self> {
        ctx.lifecycle_jobs_of_slot(slot_name, Lifecycle::Shutdown)
            .iter()
            .map(|j| Self::of(j))
            .collect()
    }
}

/// What the decision reads.
pub struct Facts<'a> {
    pub claims: &'a [&'a NodeClaim],
    pub node: &'a CoreNode,
    /// The slot's shutdown Jobs.
    pub shutdowns: &'a [ShutdownJob],
    pub now: Timestamp,
    /// How long a silent kubelet is given before the machine is powered off to confirm it.
    pub grace: SignedDuration,
    /// How long after a shutdown Job ends its machine's node may take to turn silent: the
    /// machine going down (the registration timeout) and kube-controller-manager's grace.
    pub settle: SignedDuration,
    /// How long the machine may sleep before it is powered off (`powerOffAfterMinutes`).
    pub asleep_limit: Option<SignedDuration>,
}

/// Decides whether the node's machine is confirmed off. Pure.
pub fn decide(facts: &Facts) -> Removal {
    let Facts { claims, node, shutdowns, now, grace, settle, asleep_limit } = *facts;
    if node.metadata.deletion_timestamp.is_some() {
        return Removal::Keep;
    }
    let Some((ready, since)) = machine::ready_condition(node) else {
        // Never reported: a kubelet in the middle of registering.
        return Removal::Keep;
    };
    // `True` and `False` both come from a kubelet that reports in: the machine is up.
    if ready != "Unknown" || shutdowns.iter().any(|s| s.outcome == JobOutcome::Running) {
        return Removal::Keep;
    }
    let registered = node.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let silent_from = since.unwrap_or(now);
    let booting = claims.iter().any(|c| phase::in_boot_window(Some(phase::of(c))));
    let wanted_or_moving =
        claims.iter().any(|c| phase::is_live(Some(phase::of(c))) || awaits_forced_shutdown(c));
    // A machine asleep keeps its node: its kubelet resumes on it, and the node's `Suspended`
    // condition keeps both scalers from counting it (docs/decisions.md, D44). Asleep: so marked,
    // or silent since a suspend that succeeded (the mark follows on this pass). Past the slot's
    // limit, with nothing wanting it, it is powered off.
    if asleep(node, shutdowns, silent_from, settle, now) {
        let since = machine::suspended_since(node).unwrap_or(silent_from);
        let Some(limit) = asleep_limit.filter(|_| !wanted_or_moving) else {
            return Removal::Keep;
        };
        return match since.checked_add(limit) {
            Ok(due) if due > now => Removal::RecheckAt(due),
            _ => Removal::PowerOffAsleep { since },
        };
    }
    // A silence that began later than a settle after the shutdown ended is not the shutdown's
    // doing: the machine stayed on (or came back), and this is a blip of its link. One that
    // began before the Job was made is not its doing either: only a Job that reads the machine
    // off tells an off machine from one cut off from the API server.
    let shut_down_since_registration =
        shutdowns.iter().filter(|s| !s.suspends).any(|s| match s.outcome {
            JobOutcome::Succeeded { at } => {
                let ended = at.unwrap_or(now);
                let silent_before_it = s.created.is_some_and(|made| silent_from < made);
                registered.is_none_or(|r| ended >= r)
                    && ended.checked_add(settle).is_ok_and(|settled| silent_from <= settled)
                    && (s.confirms_off || !silent_before_it)
            }
            JobOutcome::Running | JobOutcome::Failed => false,
        });
    if shut_down_since_registration {
        // A machine on its way up whose old node is silent after its shutdown: the kubelet
        // registers afresh, with its registration taints. (A kubelet that has already found
        // the old node has written to it, which the guarded delete sees.)
        if booting {
            return Removal::Remove(OffBecause::Rebooting);
        }
        if !wanted_or_moving {
            return Removal::Remove(OffBecause::ShutDown);
        }
        return Removal::Keep;
    }
    // Wanted: the kubelet takes its node over when it reports again.
    if wanted_or_moving {
        return Removal::Keep;
    }
    let since = since.unwrap_or(now);
    match since.checked_add(grace) {
        Ok(due) if due > now => Removal::RecheckAt(due),
        _ => Removal::ConfirmOff { since },
    }
}

/// The machine sleeps: its node says so, or its kubelet has been silent since `silent_from`,
/// which began after a suspend Job was made and no later than its success. Pure.
pub fn asleep(
    node: &CoreNode,
    shutdowns: &[ShutdownJob],
    silent_from: Timestamp,
    settle: SignedDuration,
    now: Timestamp,
) -> bool {
    match machine::suspended_since(node) {
        // Marked, unless a shutdown made since the mark succeeded (the sleep's limit powered
        // it off; its node goes as any machine's that is off).
        Some(marked) => !shutdowns.iter().filter(|s| !s.suspends).any(|s| {
            matches!(s.outcome, JobOutcome::Succeeded { .. })
                && s.created.is_some_and(|made| made >= marked)
        }),
        None => silent_since_suspend(shutdowns, silent_from, settle, now),
    }
}

/// A suspend Job made before the node turned silent succeeded, and the silence began no later
/// than a settle after it (kube-controller-manager marks a silent kubelet `Unknown` only after
/// its grace): the silence is the machine's sleep. Pure.
pub fn silent_since_suspend(
    shutdowns: &[ShutdownJob],
    silent_from: Timestamp,
    settle: SignedDuration,
    now: Timestamp,
) -> bool {
    shutdowns.iter().filter(|s| s.suspends).any(|s| match s.outcome {
        JobOutcome::Succeeded { at } => {
            let settled = at.unwrap_or(now).checked_add(settle).unwrap_or(Timestamp::MAX);
            s.created.is_some_and(|made| made <= silent_from) && silent_from <= settled
        }
        JobOutcome::Running | JobOutcome::Failed => false,
    })
}

/// The decision on the slot's node, with the slot's claims and shutdown Jobs as the pass read
/// them and the rest from the context.
pub fn decide_for(
    ctx: &Context,
    slot: &Node,
    claims: &[&NodeClaim],
    shutdowns: &[ShutdownJob],
    node: &CoreNode,
) -> Removal {
    decide(&Facts {
        claims,
        node,
        shutdowns,
        now: ctx.now(),
        grace: ctx.off_node_grace_span(),
        settle: ctx.shutdown_settle(),
        asleep_limit: asleep_limit(slot),
    })
}

/// How long the slot's machine may sleep (`spec.power.suspend.powerOffAfterMinutes`).
pub fn asleep_limit(slot: &Node) -> Option<SignedDuration> {
    let suspend = slot.spec.power.as_ref()?.suspend.as_ref()?;
    suspend.power_off_after_minutes.map(|m| SignedDuration::from_mins(i64::from(m)))
}

/// Removes the node of a machine that is off, after naming on the slot what is lost with it.
/// Returns false when the node changed or went meanwhile (the next event decides again).
pub async fn remove(ctx: &Context, slot: &Node, node: &CoreNode, why: OffBecause) -> Result<bool> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let gate = ctx.group_of(slot).map(|g| g.spec.node_readiness_taints.clone()).unwrap_or_default();
    let lost = undeclared::of(slot, node, &gate);
    if !lost.is_empty() {
        ctx.publish(slot, EventType::Warning, "UndeclaredNodeLabels", lost.message(&node_name))
            .await;
    }
    let preconditions = Preconditions {
        uid: node.metadata.uid.clone(),
        resource_version: node.metadata.resource_version.clone(),
    };
    let params = DeleteParams { preconditions: Some(preconditions), ..DeleteParams::default() };
    match Api::<CoreNode>::all(ctx.client.clone()).delete(&node_name, &params).await {
        Ok(_) => {}
        Err(error) if is_stale_write(&error) || is_not_found(&error) => return Ok(false),
        Err(error) => {
            return Err(error)
                .during(|| format!("removing node {node_name} of a machine that is off"));
        }
    }
    let because = match why {
        OffBecause::ShutDown => "its shutdown Job succeeded and its kubelet stopped",
        OffBecause::Rebooting => {
            "its shutdown Job succeeded, its kubelet stopped, and a claim is booting it: it registers afresh"
        }
    };
    tracing::info!(node = %node_name, ?why, "removed the node of a machine that is off");
    ctx.publish(
        slot,
        EventType::Normal,
        "NodeRemoved",
        format!(
            "machine is off ({because}): removed node {node_name}; its kubelet registers it again at boot"
        ),
    )
    .await;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeClaimPhase::*;
    use crate::api::NodeClaimStatus;
    use crate::fixtures::{at, claim_in};
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn ts(s: &str) -> Timestamp {
        at(s).0
    }

    fn node(ready: Option<(&str, &str)>) -> CoreNode {
        CoreNode {
            metadata: ObjectMeta {
                name: Some("m1".into()),
                creation_timestamp: Some(Time(ts("2026-03-04T09:00:00Z"))),
                ..ObjectMeta::default()
            },
            spec: None,
            status: ready.map(|(status, since)| NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: status.into(),
                    last_transition_time: Some(Time(ts(since))),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
        }
    }

    /// A node silent since `since`, marked asleep then.
    fn marked_asleep(since: &str) -> CoreNode {
        let mut n = node(Some(("Unknown", since)));
        let conditions = n.status.as_mut().and_then(|s| s.conditions.as_mut()).unwrap();
        conditions.push(NodeCondition {
            type_: crate::api::CONDITION_SUSPENDED.into(),
            status: "True".into(),
            last_transition_time: Some(Time(ts(since))),
            ..NodeCondition::default()
        });
        n
    }

    #[test]
    fn a_machine_asleep_past_its_limit_is_powered_off_and_then_goes_as_any() {
        let now = ts("2026-03-04T10:00:00Z");
        let asleep_at = marked_asleep;
        let booting = claim_in("booting", "m1", Some(Booting), "2026-03-04T09:59:00Z");
        // The limit's power-off: made at 09:59:30, done at 09:59:50.
        let powered_off = ShutdownJob {
            outcome: JobOutcome::Succeeded { at: Some(ts("2026-03-04T09:59:50Z")) },
            created: Some(ts("2026-03-04T09:59:30Z")),
            confirms_off: true,
            serves_claim: false,
            suspends: false,
        };
        let hour = Some(SignedDuration::from_hours(1));
        type Row<'a> = (
            &'a str,
            Vec<&'a NodeClaim>,
            CoreNode,
            Vec<ShutdownJob>,
            Option<SignedDuration>,
            Removal,
        );
        let rows: Vec<Row> = vec![
            (
                "asleep for 30 min of 60: look again at the limit",
                vec![],
                asleep_at("2026-03-04T09:30:00Z"),
                vec![],
                hour,
                Removal::RecheckAt(ts("2026-03-04T10:30:00Z")),
            ),
            (
                "asleep past the limit: power it off",
                vec![],
                asleep_at("2026-03-04T08:30:00Z"),
                vec![],
                hour,
                Removal::PowerOffAsleep { since: ts("2026-03-04T08:30:00Z") },
            ),
            (
                "past the limit, but a claim wakes it",
                vec![&booting],
                asleep_at("2026-03-04T08:30:00Z"),
                vec![],
                hour,
                Removal::Keep,
            ),
            (
                "no limit: it sleeps on",
                vec![],
                asleep_at("2026-03-04T08:30:00Z"),
                vec![],
                None,
                Removal::Keep,
            ),
            (
                "powered off since the mark: its node goes",
                vec![],
                asleep_at("2026-03-04T08:30:00Z"),
                vec![powered_off],
                hour,
                Removal::Remove(OffBecause::ShutDown),
            ),
        ];
        for (name, claims, node, shutdowns, asleep_limit, want) in rows {
            let facts = Facts {
                claims: &claims,
                node: &node,
                shutdowns: &shutdowns,
                now,
                grace: SignedDuration::from_mins(5),
                settle: SignedDuration::from_mins(2),
                asleep_limit,
            };
            assert_eq!(decide(&facts), want, "{name}");
        }
    }

    #[test]
    fn removal_table() {
        let now = ts("2026-03-04T10:00:00Z");
        let grace = SignedDuration::from_mins(5);
        let long_ago = "2026-03-04T09:30:00Z";
        let just_now = "2026-03-04T09:59:00Z";
        let ready = claim_in("ready", "m1", Some(Ready), "2026-03-04T09:00:00Z");
        let booting = claim_in("booting", "m1", Some(Booting), "2026-03-04T09:00:00Z");
        let completed = claim_in("done", "m1", Some(Completed), "2026-03-04T09:00:00Z");
        let mut owed = claim_in("owed", "m1", Some(Failed), "2026-03-04T09:00:00Z");
        owed.status.get_or_insert_with(NodeClaimStatus::default).boot_committed_at =
            Some(at("2026-03-04T09:01:00Z"));
        let shut_down = JobOutcome::Succeeded { at: Some(ts("2026-03-04T09:58:00Z")) };
        let shut_down_before_registration =
            JobOutcome::Succeeded { at: Some(ts("2026-03-04T08:00:00Z")) };
        let shut_down_before_a_blip =
            JobOutcome::Succeeded { at: Some(ts("2026-03-04T09:50:00Z")) };
        let mut deleting = node(Some(("Unknown", long_ago)));
        deleting.metadata.deletion_timestamp = Some(Time(now));

        // A pod spec that does not read the machine off, made at 09:55 (after the long silence
        // began, before the recent one), done at 09:58.
        let unconfirmed = ShutdownJob {
            outcome: shut_down,
            created: Some(ts("2026-03-04T09:55:00Z")),
            confirms_off: false,
            serves_claim: false,
            suspends: false,
        };
        let confirming = ShutdownJob { confirms_off: true, ..unconfirmed };
        type Row<'a> = (&'a str, Vec<&'a NodeClaim>, CoreNode, Vec<ShutdownJob>, Removal);
        let confirm = Removal::ConfirmOff { since: ts(long_ago) };
        // Typed drivers' Jobs, which read the machine off, with no creation time.
        let typed = |outcome| ShutdownJob {
            outcome,
            created: None,
            confirms_off: true,
            serves_claim: false,
            suspends: false,
        };
        type OutcomeRow<'a> = (&'a str, Vec<&'a NodeClaim>, CoreNode, Vec<JobOutcome>, Removal);
        let rows: Vec<OutcomeRow> = vec![
            (
                "Ready is never removed",
                vec![],
                node(Some(("True", long_ago))),
                vec![],
                Removal::Keep,
            ),
            (
                "Ready after a shutdown",
                vec![],
                node(Some(("True", just_now))),
                vec![shut_down],
                Removal::Keep,
            ),
            (
                "silence alone confirms nothing: power it off first",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![],
                confirm,
            ),
            (
                "silent, a finished claim",
                vec![&completed],
                node(Some(("Unknown", long_ago))),
                vec![],
                confirm,
            ),
            (
                "a shutdown that failed confirms nothing",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![JobOutcome::Failed],
                confirm,
            ),
            (
                "silent within the grace",
                vec![],
                node(Some(("Unknown", just_now))),
                vec![],
                Removal::RecheckAt(ts("2026-03-04T10:04:00Z")),
            ),
            (
                "NotReady from a live kubelet",
                vec![],
                node(Some(("False", long_ago))),
                vec![],
                Removal::Keep,
            ),
            (
                "shut down but the kubelet still reports",
                vec![],
                node(Some(("False", just_now))),
                vec![shut_down],
                Removal::Keep,
            ),
            (
                "shut down and silent at once",
                vec![],
                node(Some(("Unknown", just_now))),
                vec![JobOutcome::Failed, shut_down],
                Removal::Remove(OffBecause::ShutDown),
            ),
            (
                "a shutdown older than the node counts for nothing",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![shut_down_before_registration],
                confirm,
            ),
            (
                "a ready claim wants it",
                vec![&ready],
                node(Some(("Unknown", long_ago))),
                vec![],
                Removal::Keep,
            ),
            (
                "a boot in flight over a node silent since its shutdown",
                vec![&booting],
                node(Some(("Unknown", just_now))),
                vec![shut_down],
                Removal::Remove(OffBecause::Rebooting),
            ),
            (
                "a boot in flight over a node nobody shut down: the kubelet takes it over",
                vec![&booting],
                node(Some(("Unknown", long_ago))),
                vec![],
                Removal::Keep,
            ),
            (
                "a boot in flight, kubelet back",
                vec![&booting],
                node(Some(("False", long_ago))),
                vec![shut_down],
                Removal::Keep,
            ),
            (
                "a forced shutdown still owed",
                vec![&owed],
                node(Some(("Unknown", long_ago))),
                vec![],
                Removal::Keep,
            ),
            (
                "a shutdown Job still running",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![JobOutcome::Running, shut_down],
                Removal::Keep,
            ),
            (
                "a shutdown that left the machine on, then a blip: the blip is no shutdown",
                vec![],
                node(Some(("Unknown", just_now))),
                vec![shut_down_before_a_blip],
                Removal::RecheckAt(ts("2026-03-04T10:04:00Z")),
            ),
            (
                "a shutdown that left the machine on, a blip past the grace: confirm it off again",
                vec![],
                node(Some(("Unknown", "2026-03-04T09:54:00Z"))),
                vec![shut_down_before_a_blip],
                Removal::ConfirmOff { since: ts("2026-03-04T09:54:00Z") },
            ),
            (
                "a boot over a node that went silent after its shutdown had settled",
                vec![&booting],
                node(Some(("Unknown", just_now))),
                vec![shut_down_before_a_blip],
                Removal::Keep,
            ),
            (
                "silent within the settle after the shutdown: the shutdown's doing",
                vec![],
                node(Some(("Unknown", "2026-03-04T09:51:30Z"))),
                vec![shut_down_before_a_blip],
                Removal::Remove(OffBecause::ShutDown),
            ),
            ("never reported", vec![], node(None), vec![], Removal::Keep),
            ("already being deleted", vec![], deleting, vec![shut_down], Removal::Keep),
        ];
        let mut table: Vec<Row> = rows
            .into_iter()
            .map(|(name, claims, node, outcomes, want)| {
                (name, claims, node, outcomes.into_iter().map(typed).collect(), want)
            })
            .collect();
        table.extend([
            (
                "silent before a shutdown pod that cannot read the machine off: nothing confirmed",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![unconfirmed],
                confirm,
            ),
            (
                "silent before a shutdown that reads the machine off",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![confirming],
                Removal::Remove(OffBecause::ShutDown),
            ),
            (
                "silent after that pod began: its shutdown's doing",
                vec![],
                node(Some(("Unknown", just_now))),
                vec![unconfirmed],
                Removal::Remove(OffBecause::ShutDown),
            ),
            (
                "a boot over a node silent before an unconfirmed shutdown: the kubelet takes it over",
                vec![&booting],
                node(Some(("Unknown", long_ago))),
                vec![unconfirmed],
                Removal::Keep,
            ),
            (
                "a boot over a node silent before a confirmed shutdown",
                vec![&booting],
                node(Some(("Unknown", long_ago))),
                vec![confirming],
                Removal::Remove(OffBecause::Rebooting),
            ),
        ]);
        // A suspend Job made at 09:55, done at 09:58: its success means asleep, never off.
        let suspended = ShutdownJob { suspends: true, ..unconfirmed };
        let suspend_failed = ShutdownJob { outcome: JobOutcome::Failed, ..suspended };
        table.extend([
            (
                "silent since a suspend that succeeded: asleep, the node kept",
                vec![],
                node(Some(("Unknown", just_now))),
                vec![suspended],
                Removal::Keep,
            ),
            (
                "a boot over a node asleep: its kubelet resumes on it",
                vec![&booting],
                node(Some(("Unknown", just_now))),
                vec![suspended],
                Removal::Keep,
            ),
            (
                "marked asleep long past the grace, nothing wants it: kept",
                vec![],
                marked_asleep(long_ago),
                vec![],
                Removal::Keep,
            ),
            (
                "silent before the suspend was made: not its doing",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![suspended],
                confirm,
            ),
            (
                "a suspend that did not take confirms nothing",
                vec![],
                node(Some(("Unknown", long_ago))),
                vec![suspend_failed],
                confirm,
            ),
        ]);
        let settle = SignedDuration::from_mins(2);
        let asleep_limit = None;
        for (name, claims, node, shutdowns, want) in table {
            let facts = Facts {
                claims: &claims,
                node: &node,
                shutdowns: &shutdowns,
                now,
                grace,
                settle,
                asleep_limit,
            };
            assert_eq!(decide(&facts), want, "{name}");
        }
    }
}
