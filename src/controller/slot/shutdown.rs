//! The shutdown path: a machine that no claim wants is cordoned, drained and powered off by a
//! shutdown Job. It runs for a claim marked for scale-down once its machine is ready, for a
//! failed boot (forced, whatever is observed: an overdue boot must not join later), for a
//! machine observed up with no claim at all, and for one whose kubelet has been silent past the
//! grace with no claim (it may be off, or on and cut off: the shutdown's success is what
//! confirms it off, see `node_removal`). Shutdown Jobs are counted on the claim they serve, or,
//! with no claim, in the slot's status (`unclaimedShutdowns`), bounded by three, with a
//! 30-minute pause before the count restarts.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use serde_json::json;

use super::drain::{self, DrainHold, Drained};
use crate::api::{
    LABEL_LIFECYCLE, LABEL_NODECLAIM, Node, NodeClaim, NodeClaimPhase, ShutdownStreak,
};
use crate::claim::{MAX_CONSECUTIVE_ATTEMPTS, SHUTDOWN_ATTEMPT_RESET_GRACE};
use crate::controller::Context;
use crate::controller::claim::chokepoint;
use crate::controller::claim::release::awaits_forced_shutdown;
use crate::controller::error::{Error, Result};
use crate::controller::jobs::{self, JobContext, Lifecycle};
use crate::field_manager::FieldManager;
use crate::job_outcome::{JobOutcome, outcome};
use crate::machine;
use crate::phase;

const DRAIN_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// What a shutdown pass leaves for the slot's reconcile: when to look again (`None`: on the next
/// change) and a drain that disruption budgets hold back.
#[derive(Debug, Default)]
pub struct Pass {
    pub retry: Option<std::time::Duration>,
    pub hold: Option<DrainHold>,
    /// The run of attempts no claim counts, when this pass added one (the slot's status keeps it).
    pub streak: Option<ShutdownStreak>,
}

impl Pass {
    fn retry_in(after: std::time::Duration) -> Self {
        Self { retry: Some(after), ..Self::default() }
    }
}

/// Why the machine is being powered off, and the claim (if any) the shutdown is counted on.
#[derive(Debug, PartialEq)]
pub enum MachineFate<'a> {
    /// Keep the machine: a claim wants it, or a committed boot is still running.
    Keep,
    /// Power it off, counting on this claim (None: nothing asked for it).
    PowerOff { claim: Option<&'a NodeClaim> },
}

/// Decides whether the slot's machine should be powered off; `maybe_on` is a machine observed
/// up, or one whose silence nothing has confirmed as off. Pure.
pub fn decide<'a>(claims: &[&'a NodeClaim], maybe_on: bool) -> MachineFate<'a> {
    let live = |c: &&&NodeClaim| phase::is_live(Some(phase::of(c)));
    if claims.iter().filter(live).any(|c| !phase::is_marked(c)) {
        return MachineFate::Keep;
    }
    // A marked booting claim runs to ready or failed before its machine is reversed.
    if claims.iter().filter(live).any(|c| phase::of(c) == NodeClaimPhase::Booting) {
        return MachineFate::Keep;
    }
    let marked_ready =
        phase::newest(claims.iter().copied().filter(|c| phase::of(c) == NodeClaimPhase::Ready));
    let owed = phase::newest(claims.iter().copied().filter(|c| awaits_forced_shutdown(c)));
    if let Some(claim) = marked_ready.or(owed) {
        return MachineFate::PowerOff { claim: Some(claim) };
    }
    if !maybe_on {
        return MachineFate::Keep;
    }
    // Up and unwanted: count on the newest terminal claim that still holds its finalizer.
    let holding = phase::newest(
        claims
            .iter()
            .copied()
            .filter(|c| phase::is_terminal(Some(phase::of(c))) && c.metadata.finalizers.is_some()),
    );
    MachineFate::PowerOff { claim: holding }
}

/// When the last shutdown attempt ended, for the settle wait before another one: the newest of
/// the claim's last attempt (`lastShutdownAttemptAt`) and every succeeded shutdown Job's end. A
/// Job whose success is decided but not yet stamped (`SuccessCriteriaMet` before
/// `completionTime`) ended just now: an older Job's time must not stand in for it, nor may a Job
/// the cache has not caught up with, or the wait is measured from an earlier claim's shutdown
/// and a machine on its way down is powered off twice. Pure.
pub fn last_attempt_ended(
    outcomes: impl IntoIterator<Item = JobOutcome>,
    last_at: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    outcomes
        .into_iter()
        .filter_map(|o| match o {
            JobOutcome::Succeeded { at } => Some(at.unwrap_or(now)),
            JobOutcome::Running | JobOutcome::Failed => None,
        })
        .chain(last_at)
        .max()
}

/// The run of shutdown attempts no claim counts: its length and when the last one started.
/// The slot's status keeps it (`stored`), because the Jobs are collected after their TTL, well
/// within the pause. `unclaimed_jobs` (the creation times of the slot's shutdown Jobs that
/// serve no claim, still in the cache) count too, for a status the cache has not caught up
/// with yet. A run whose last attempt is older than `grace` counts no more. Pure.
pub fn unclaimed_streak(
    stored: Option<&ShutdownStreak>,
    unclaimed_jobs: &[Timestamp],
    now: Timestamp,
    grace: SignedDuration,
) -> (i32, Option<Timestamp>) {
    let fresh = |t: &Timestamp| t.checked_add(grace).is_ok_and(|end| end > now);
    let recent: Vec<Timestamp> = unclaimed_jobs.iter().copied().filter(fresh).collect();
    let from_jobs = (i32::try_from(recent.len()).unwrap_or(i32::MAX), recent.into_iter().max());
    let from_status = stored
        .map(|s| (s.attempts, s.last_attempt_at.0))
        .filter(|(_, last)| fresh(last))
        .map_or((0, None), |(attempts, last)| (attempts, Some(last)));
    (from_jobs.0.max(from_status.0), from_jobs.1.max(from_status.1))
}

/// Powers the machine off when no claim wants it. `silent_since`: the node's kubelet has been
/// silent past the grace and nothing has confirmed the machine off yet.
pub async fn reconcile(
    ctx: &Context,
    slot: &Node,
    node: Option<&CoreNode>,
    silent_since: Option<Timestamp>,
) -> Result<Pass> {
    let slot_name = slot.metadata.name.clone().unwrap_or_default();
    let owned = ctx.claims_of_slot(&slot_name);
    let claims: Vec<&NodeClaim> = owned.iter().map(AsRef::as_ref).collect();
    let on = machine::powered_on(node) || silent_since.is_some();
    let MachineFate::PowerOff { claim } = decide(&claims, on) else {
        return Ok(Pass::default());
    };

    let shutdown_jobs = ctx.lifecycle_jobs_of_slot(&slot_name, Lifecycle::Shutdown);
    if shutdown_jobs.iter().any(|j| outcome(j) == JobOutcome::Running) {
        return Ok(Pass::default());
    }
    let now = ctx.now();
    let grace =
        SignedDuration::try_from(SHUTDOWN_ATTEMPT_RESET_GRACE).unwrap_or(SignedDuration::MAX);
    let (mut attempts, last_at) = match claim {
        Some(c) => {
            let s = c.status.as_ref();
            (
                s.and_then(|s| s.shutdown_attempts).unwrap_or(0),
                s.and_then(|s| s.last_shutdown_attempt_at.as_ref()).map(|t| t.0),
            )
        }
        None => {
            // Nothing asked for this machine: the slot keeps the count.
            let unclaimed: Vec<Timestamp> = shutdown_jobs
                .iter()
                .filter(|j| {
                    j.metadata.labels.as_ref().is_none_or(|l| !l.contains_key(LABEL_NODECLAIM))
                })
                .filter_map(|j| j.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .collect();
            let stored = slot.status.as_ref().and_then(|s| s.unclaimed_shutdowns.as_ref());
            unclaimed_streak(stored, &unclaimed, now, grace)
        }
    };
    if attempts > 0 && !on && claim.is_some_and(|c| !awaits_forced_shutdown(c)) {
        // The last shutdown landed; the claim's release path takes it from here.
        return Ok(Pass::default());
    }
    if attempts >= MAX_CONSECUTIVE_ATTEMPTS {
        let pause_end = last_at.and_then(|t| t.checked_add(grace).ok()).unwrap_or(now);
        if now < pause_end {
            let reset = match claim {
                Some(c) => format!(
                    "kubectl patch nodeclaim {} -n {} --subresource=status --type=merge -p '{{\"status\":{{\"shutdownAttempts\":0,\"lastShutdownAttemptAt\":null}}}}'",
                    c.metadata.name.as_deref().unwrap_or_default(),
                    ctx.namespace
                ),
                // No claim carries the count: the slot's status does, and the Jobs still
                // in the cache count too.
                None => format!(
                    "kubectl delete jobs -n {ns} -l {}={slot_name},{LABEL_LIFECYCLE}=shutdown && kubectl patch node.infra.homecluster.dev {slot_name} -n {ns} --subresource=status --type=merge -p '{{\"status\":{{\"unclaimedShutdowns\":null}}}}'",
                    crate::api::LABEL_SLOT,
                    ns = ctx.namespace,
                ),
            };
            let node_name = &slot.spec.kubernetes_node_name;
            let note = match silent_since {
                Some(since) => format!(
                    "{attempts} shutdown Jobs could not confirm node {node_name} off (its kubelet silent since {since}); the node is kept, because a kubelet that is running but cut off never registers a deleted node again. Pausing until {pause_end}. If the machine is off: kubectl delete node {node_name}. If it is on: restore its network, and its kubelet takes the node back. To retry now: {reset}"
                ),
                None => format!(
                    "{attempts} shutdown Jobs did not power off node {node_name}; pausing until {pause_end}. To retry now: {reset}"
                ),
            };
            match claim {
                Some(c) => {
                    ctx.publish(c, EventType::Warning, "ShutdownAttemptLimitReached", note).await
                }
                None => {
                    ctx.publish(slot, EventType::Warning, "ShutdownAttemptLimitReached", note).await
                }
            }
            let wait = pause_end.duration_since(now).as_secs().max(1);
            return Ok(Pass::retry_in(std::time::Duration::from_secs(
                u64::try_from(wait).unwrap_or(u64::MAX),
            )));
        }
        attempts = 0;
    }
    if attempts > 0 && on {
        // A machine takes a while to go down after its script returns (as long as a machine is
        // given to come up), and its node a while longer to say so: a powered-off kubelet just
        // goes silent, and its node stays Ready until kube-controller-manager's grace period
        // has passed. Only then does the attempt count as not landed.
        let outcomes = shutdown_jobs.iter().map(|j| outcome(j));
        if let Some(finished) = last_attempt_ended(outcomes, last_at, now) {
            let settle =
                SignedDuration::try_from(ctx.timeouts.registration + ctx.node_monitor_grace)
                    .unwrap_or(SignedDuration::MAX);
            let settled = finished.checked_add(settle).unwrap_or(Timestamp::MAX);
            if now < settled {
                let wait = settled.duration_since(now).as_secs_f64().max(1.0);
                return Ok(Pass::retry_in(std::time::Duration::from_secs_f64(wait)));
            }
        }
        let who = claim
            .and_then(|c| c.metadata.name.clone())
            .map_or_else(|| "no claim wants it".to_string(), |c| format!("claim {c}"));
        let node_name = &slot.spec.kubernetes_node_name;
        let message = match silent_since {
            Some(since) => format!(
                "{who}: shutdown Job {attempts} did not confirm node {node_name} off; its kubelet has been silent since {since}"
            ),
            None => {
                format!("{who}: shutdown Job {attempts} finished but node {node_name} is still up")
            }
        };
        ctx.publish(slot, EventType::Warning, "ShutdownNotObserved", message).await;
    }

    if let Some(node) = node {
        drain::cordon(ctx, node).await?;
        // The hold runs from when it began, kept in the slot's status, with or without a claim;
        // without --drain-timeout a budget holds the machine on for as long as it refuses.
        let conditions = slot.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let remembered = ctx.published_hold(&slot_name).map(|h| h.since);
        let since = drain::hold_since(conditions, remembered, now);
        let force_at = drain::force_at(since, ctx.drain_timeout);
        let overdue = force_at.is_some_and(|end| end <= now);
        let mode = if overdue { drain::Mode::EvictWhatMoves } else { drain::Mode::AskFirst };
        if let Drained::Blocked(pods) = drain::drain(ctx, node, mode).await? {
            if !overdue {
                tracing::info!(
                    pods = pods.len(),
                    %since,
                    "eviction refused by a PodDisruptionBudget; holding the machine on"
                );
                return Ok(Pass {
                    retry: Some(DRAIN_RETRY),
                    hold: Some(DrainHold { pods, since, force_at }),
                    streak: None,
                });
            }
            tracing::warn!(
                pods = pods.len(),
                %since,
                "drain timed out on PodDisruptionBudgets; powering off anyway"
            );
        }
    }

    let attempt = attempts + 1;
    // Shutdown Jobs are numbered per claim, never reset: a pass that created the Job and then
    // lost the status write below to a conflict finds the same Job again and records the same
    // numbers, and a reset streak starts a Job of its own.
    let (owner, sequence) = match claim {
        Some(c) => (
            c.metadata.name.clone().unwrap_or_default(),
            c.status.as_ref().and_then(|s| s.shutdown_jobs).unwrap_or(0) + 1,
        ),
        None => (format!("{slot_name}-{}", now.as_second()), attempt),
    };
    let job_name = jobs::shutdown_job_name(&owner, sequence);
    let group = slot.group().unwrap_or_default().to_owned();
    let job = jobs::build(&JobContext {
        slot,
        group: &group,
        claim,
        lifecycle: Lifecycle::Shutdown,
        name: job_name.clone(),
        max_run_time: ctx.timeouts.job_timeout,
        power_image: &ctx.power_image,
        priority_class: ctx.power_priority_class.as_deref(),
    })
    .map_err(|e| Error::Lifecycle(e.to_string()))?;
    let created = ctx.create_job(&job, FieldManager::SlotController).await?;
    if let Some(claim) = claim {
        chokepoint::patch_status(
            ctx,
            claim,
            FieldManager::SlotController,
            json!({ "shutdownAttempts": attempt, "shutdownJobs": sequence, "lastShutdownAttemptAt": Time(now) }),
        )
        .await?;
    }
    // With no claim the slot's status keeps the count (written with its status, see `observe`).
    let streak =
        claim.is_none().then_some(ShutdownStreak { attempts: attempt, last_attempt_at: Time(now) });
    let about = claim
        .and_then(|c| c.metadata.name.clone())
        .map_or_else(|| "no claim wants it".to_string(), |c| format!("claim {c}"));
    if !created {
        return Ok(Pass { streak, ..Pass::default() });
    }
    match silent_since {
        Some(since) => {
            let message = format!(
                "{about}, and the kubelet of node {} has been silent since {since}: shutdown Job {job_name} (attempt {attempt}) powers the machine off, and the node is removed once it succeeds",
                slot.spec.kubernetes_node_name
            );
            ctx.publish(slot, EventType::Warning, "ConfirmingOff", message).await;
        }
        None => {
            let message = format!("{about}: shutdown Job {job_name} (attempt {attempt})");
            ctx.publish(slot, EventType::Normal, "ScaleDownRequested", message).await;
        }
    }
    Ok(Pass { streak, ..Pass::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{NodeClaimPhase::*, NodeClaimStatus};
    use crate::fixtures::{at, claim_in};

    fn marked(mut c: NodeClaim) -> NodeClaim {
        c.status.get_or_insert_with(NodeClaimStatus::default).scale_down_requested_at =
            Some(at("2026-03-04T10:00:00Z"));
        c
    }

    fn committed_failure(name: &str) -> NodeClaim {
        let mut c = claim_in(name, "m1", Some(Failed), "2026-03-04T09:00:00Z");
        c.status.get_or_insert_with(NodeClaimStatus::default).boot_committed_at =
            Some(at("2026-03-04T09:01:00Z"));
        c
    }

    #[test]
    fn shutdown_decision_table() {
        let ready = claim_in("ready", "m1", Some(Ready), "2026-03-04T09:00:00Z");
        let booting = claim_in("booting", "m1", Some(Booting), "2026-03-04T09:00:00Z");
        let ready_marked = marked(ready.clone());
        let booting_marked = marked(booting.clone());
        let failed = committed_failure("failed");
        let mut failed_shut = failed.clone();
        failed_shut.status.as_mut().unwrap().shutdown_attempts = Some(1);

        assert_eq!(decide(&[], false), MachineFate::Keep, "nothing asked, nothing up");
        assert_eq!(decide(&[], true), MachineFate::PowerOff { claim: None }, "up with no claim");
        assert_eq!(decide(&[&ready], true), MachineFate::Keep, "wanted");
        assert_eq!(decide(&[&booting], false), MachineFate::Keep, "a boot in flight");
        assert_eq!(
            decide(&[&booting_marked], true),
            MachineFate::Keep,
            "a marked boot runs to its end first"
        );
        assert_eq!(
            decide(&[&ready_marked], true),
            MachineFate::PowerOff { claim: Some(&ready_marked) }
        );
        assert_eq!(
            decide(&[&failed], false),
            MachineFate::PowerOff { claim: Some(&failed) },
            "forced, whatever is observed"
        );
        assert_eq!(
            decide(&[&failed_shut], false),
            MachineFate::Keep,
            "forced shutdown already fired"
        );
        assert_eq!(
            decide(&[&failed_shut, &ready], true),
            MachineFate::Keep,
            "a newer claim wants it"
        );
    }

    /// The race behind a claim that got two shutdown Jobs for one power-off: the slot's previous
    /// claim was shut down 9 s ago (its Job still around with its completion time), this claim's
    /// Job 1 has just met its success criteria (no completion time yet), and the node cache still
    /// shows the machine up. The settle wait must run from this attempt, not the older Job.
    #[test]
    fn the_settle_wait_runs_from_the_last_attempt() {
        let ts = |s: &str| at(s).0;
        let now = ts("2026-03-04T10:00:09Z");
        let earlier_claims_job = JobOutcome::Succeeded { at: Some(ts("2026-03-04T10:00:00Z")) };
        let this_attempt = Some(ts("2026-03-04T10:00:07Z"));
        let table = [
            (
                "success decided, not stamped: it ended now",
                vec![earlier_claims_job, JobOutcome::Succeeded { at: None }],
                this_attempt,
                Some(now),
            ),
            (
                "the new Job not in the cache yet: the attempt's start",
                vec![earlier_claims_job],
                this_attempt,
                this_attempt,
            ),
            (
                "stamped success",
                vec![
                    earlier_claims_job,
                    JobOutcome::Succeeded { at: Some(ts("2026-03-04T10:00:08Z")) },
                ],
                this_attempt,
                Some(ts("2026-03-04T10:00:08Z")),
            ),
            (
                "no claim: the slot's own Jobs",
                vec![earlier_claims_job, JobOutcome::Failed, JobOutcome::Running],
                None,
                Some(ts("2026-03-04T10:00:00Z")),
            ),
            ("nothing known", vec![JobOutcome::Failed], None, None),
        ];
        for (name, outcomes, last_at, want) in table {
            assert_eq!(last_attempt_ended(outcomes, last_at, now), want, "{name}");
        }
        // With the 8 s settle of the test lab, the first case must still be waiting.
        let settle = SignedDuration::from_secs(8);
        let ended = last_attempt_ended(
            [earlier_claims_job, JobOutcome::Succeeded { at: None }],
            this_attempt,
            now,
        );
        assert!(ended.is_some_and(|t| now < t.checked_add(settle).unwrap()), "settling");
    }

    /// With no claim the slot's status holds the count: the shutdown Jobs it was once counted
    /// from are collected after their TTL (600 s), long before the 30-minute pause ends.
    #[test]
    fn the_unclaimed_streak_outlives_its_jobs() {
        let ts = |s: &str| at(s).0;
        let now = ts("2026-03-04T10:00:00Z");
        let grace = SignedDuration::from_mins(30);
        let streak = |attempts, last: &str| ShutdownStreak { attempts, last_attempt_at: at(last) };
        let three = streak(3, "2026-03-04T09:50:00Z");
        let stale = streak(3, "2026-03-04T09:20:00Z");
        let one = streak(1, "2026-03-04T09:45:00Z");
        let jobs =
            [ts("2026-03-04T09:40:00Z"), ts("2026-03-04T09:45:00Z"), ts("2026-03-04T09:50:00Z")];
        type Row<'a> =
            (&'a str, Option<&'a ShutdownStreak>, &'a [Timestamp], (i32, Option<Timestamp>));
        let table: [Row<'_>; 6] = [
            ("no history", None, &[], (0, None)),
            (
                "three Jobs still in the cache, from an operator that kept no count",
                None,
                &jobs,
                (3, Some(ts("2026-03-04T09:50:00Z"))),
            ),
            (
                "three stored, their Jobs collected by the TTL",
                Some(&three),
                &[],
                (3, Some(ts("2026-03-04T09:50:00Z"))),
            ),
            (
                "the status behind the Jobs in the cache",
                Some(&one),
                &jobs,
                (3, Some(ts("2026-03-04T09:50:00Z"))),
            ),
            ("a run older than the pause counts no more", Some(&stale), &[], (0, None)),
            (
                "a stale run, a fresh Job",
                Some(&stale),
                &[ts("2026-03-04T09:59:00Z")],
                (1, Some(ts("2026-03-04T09:59:00Z"))),
            ),
        ];
        for (name, stored, jobs, want) in table {
            assert_eq!(unclaimed_streak(stored, jobs, now, grace), want, "{name}");
        }
    }
}
