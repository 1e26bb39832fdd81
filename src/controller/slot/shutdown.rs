//! The shutdown path: a machine that no claim wants is cordoned, drained and powered off by a
//! shutdown Job. It runs for a claim marked for scale-down once its machine is ready, for a
//! failed boot (forced, whatever is observed: an overdue boot must not join later), for a
//! machine observed up with no claim at all, for one whose kubelet has been silent past the
//! grace with no claim (it may be off, or on and cut off: the shutdown's success is what
//! confirms it off, see `node_removal`), and for one with no node whose plug reads it drawing
//! power (a node deleted under a running kubelet: powering the machine off is the heal).
//! Shutdown Jobs are counted on the claim they serve, or, with no claim, in the slot's status
//! (`unclaimedShutdowns`), bounded by three, with a 30-minute pause before the count restarts.
//!
//! A pass gathers its [`Facts`], decides with the pure [`plan`], and carries the plan out.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node as CoreNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use serde_json::json;

use super::drain::{self, DrainHold, Drained};
use super::maintenance;
use super::node_removal::ShutdownJob;
use super::power_off_gates::{self, GateHold};
use crate::api::{LABEL_LIFECYCLE, Node, NodeClaim, NodeClaimPhase, ShutdownStreak};
use crate::claim::pin_end;
use crate::claim::ready_bound::MACHINE_GONE;
use crate::claim::{MAX_CONSECUTIVE_ATTEMPTS, SHUTDOWN_ATTEMPT_RESET_GRACE};
use crate::controller::Context;
use crate::controller::claim::chokepoint;
use crate::controller::claim::release::awaits_forced_shutdown;
use crate::controller::error::{Error, Result};
use crate::controller::jobs::{self, JobContext, Lifecycle};
use crate::field_manager::FieldManager;
use crate::job_outcome::JobOutcome;
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
    /// A power-off the pool's gates hold back, before any cordon (D40).
    pub gate_hold: Option<GateHold>,
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

/// Until when a machine back from a partition is left to be claimed again: its newest claim
/// failed `MachineGone` (silent for a boot window), and its kubelet has reported Ready since.
/// The machine was cut off, not off; a scaler that still wants it claims it again in that time,
/// and only a machine nothing claims is powered off (docs/decisions.md, D28). Pure.
fn claimable_until(
    claims: &[&NodeClaim],
    ready_since: Option<Timestamp>,
    grace: SignedDuration,
) -> Option<Timestamp> {
    let newest = phase::newest(claims.iter().copied())?;
    let status = newest.status.as_ref()?;
    if phase::of(newest) != NodeClaimPhase::Failed || status.reason.as_deref() != Some(MACHINE_GONE)
    {
        return None;
    }
    let gone_at = status.finished_at.as_ref()?.0;
    let back = ready_since.filter(|since| *since > gone_at)?;
    back.checked_add(grace).ok()
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

/// A machine whose node does not show it up, though it may be on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unseen {
    /// The node's kubelet has been silent past the grace, and nothing has confirmed the
    /// machine off yet.
    Silent { since: Timestamp },
    /// The machine has no node, and its plug read it drawing power at `read_at`: it runs
    /// without its node (one deleted under a running kubelet is never registered again).
    /// Powering it off heals it: at its next boot the kubelet starts afresh and registers.
    OnWithoutNode { read_at: Timestamp },
    /// The machine has slept (suspended to RAM) since `since`, past the slot's
    /// `powerOffAfterMinutes`: it is powered off, woken first where the off path needs its OS.
    Asleep { since: Timestamp },
}

/// What a shutdown pass reads of one slot, gathered once by [`facts`].
pub struct Facts<'a> {
    pub slot_name: &'a str,
    pub node_name: &'a str,
    pub namespace: &'a str,
    pub claims: &'a [&'a NodeClaim],
    /// The node shows the machine up (its kubelet reports, Ready or NotReady).
    pub powered_on: bool,
    pub unseen: Option<Unseen>,
    /// The slot's shutdown Jobs.
    pub jobs: &'a [ShutdownJob],
    /// The run of attempts no claim counts, as the slot's status keeps it.
    pub stored_streak: Option<&'a ShutdownStreak>,
    pub now: Timestamp,
    /// How long a run of attempts counts (the pause after the last of three).
    pub reset_grace: SignedDuration,
    /// How long after a shutdown ends its machine may take to look off
    /// ([`Context::shutdown_settle`]).
    pub settle: SignedDuration,
    /// Since when the node's kubelet reports it Ready, when it does.
    pub ready_since: Option<Timestamp>,
    /// How long a machine back from the silence that failed its claim `MachineGone` is left to
    /// be claimed again before its forced shutdown (`--off-node-grace`), and how long one whose
    /// pin ended is left to the scaler while it holds a running pod's data.
    pub heal_grace: SignedDuration,
    /// The slot's `status.localVolumes` names running pods whose data only this machine has.
    pub holds_data: bool,
    /// The slot's machine may be suspended to RAM instead (`spec.power.suspend`).
    pub can_suspend: bool,
}

/// What a shutdown pass does, decided by [`plan`].
#[derive(Debug, PartialEq)]
pub enum Plan<'a> {
    /// Nothing: the machine is wanted, off, or its shutdown is under way or landed.
    Idle,
    /// A shutdown is owed, but not yet: the last one may still be landing, or the machine is
    /// back from a partition and may be claimed again. Look again then.
    SettleUntil(Timestamp),
    /// Three attempts did not power the machine off: say so (on the claim, else the slot)
    /// and pause until `until`.
    Paused { claim: Option<&'a NodeClaim>, note: String, until: Timestamp },
    /// Drain the node, then make a shutdown Job.
    PowerOff(PowerOff<'a>),
}

/// A shutdown attempt to make.
#[derive(Debug, PartialEq)]
pub struct PowerOff<'a> {
    /// The claim the attempt is counted on (none: the slot's status counts it).
    pub claim: Option<&'a NodeClaim>,
    pub attempt: i32,
    /// Who the Job is numbered for (the claim, else the slot and the time) and its number.
    pub owner: String,
    pub sequence: i32,
    /// The previous attempt finished and the machine still looks on: warned about first.
    pub not_observed: Option<String>,
    /// Suspend the machine to RAM instead of powering it off: a routine scale-down of a machine
    /// that can, never a forced shutdown after a failed boot, nor the shutdown that confirms a
    /// silent machine off (a failed boot must not join later; a silent one may be cut off).
    pub suspend: bool,
}

impl PowerOff<'_> {
    pub fn job_name(&self) -> String {
        jobs::shutdown_job_name(&self.owner, self.sequence)
    }

    /// The event that announces the Job: a routine scale-down, or a warning that says why a
    /// machine the node does not show up is powered off.
    pub fn announcement(
        &self,
        unseen: Option<Unseen>,
        node_name: &str,
    ) -> (EventType, &'static str, String) {
        let (about, job_name, attempt) = (counted_on(self.claim), self.job_name(), self.attempt);
        match unseen {
            Some(Unseen::Silent { since }) => (
                EventType::Warning,
                "ConfirmingOff",
                format!(
                    "{about}, and the kubelet of node {node_name} has been silent since {since}: shutdown Job {job_name} (attempt {attempt}) powers the machine off, and the node is removed once it succeeds"
                ),
            ),
            Some(Unseen::OnWithoutNode { read_at }) => (
                EventType::Warning,
                "OnWithoutNode",
                format!(
                    "{about}, and the machine of node {node_name} has no node but its plug read it drawing power at {read_at}: a kubelet whose node was deleted while it ran never registers it again, so the machine is invisible to both scalers. Shutdown Job {job_name} (attempt {attempt}) powers it off; at its next boot the kubelet registers afresh"
                ),
            ),
            Some(Unseen::Asleep { since }) => (
                EventType::Normal,
                "PowerOffAfterSleep",
                format!(
                    "{about}, and the machine of node {node_name} has slept since {since}, past spec.power.suspend.powerOffAfterMinutes: shutdown Job {job_name} (attempt {attempt}) wakes it and powers it off, and the node is removed once it succeeds"
                ),
            ),
            None if self.suspend => (
                EventType::Normal,
                "ScaleDownRequested",
                format!(
                    "{about}: shutdown Job {job_name} (attempt {attempt}) suspends the machine to RAM"
                ),
            ),
            None => (
                EventType::Normal,
                "ScaleDownRequested",
                format!("{about}: shutdown Job {job_name} (attempt {attempt})"),
            ),
        }
    }
}

/// Who a shutdown attempt is counted on, as the events say it.
fn counted_on(claim: Option<&NodeClaim>) -> String {
    claim
        .and_then(|c| c.metadata.name.clone())
        .map_or_else(|| "no claim wants it".to_string(), |c| format!("claim {c}"))
}

/// What [`plan`] reads: the slot's claims and shutdown Jobs as the pass read them, the rest
/// from the slot and the context.
pub fn facts<'a>(
    ctx: &'a Context,
    slot: &'a Node,
    claims: &'a [&'a NodeClaim],
    jobs: &'a [ShutdownJob],
    node: Option<&CoreNode>,
    unseen: Option<Unseen>,
) -> Facts<'a> {
    Facts {
        slot_name: slot.metadata.name.as_deref().unwrap_or_default(),
        node_name: &slot.spec.kubernetes_node_name,
        namespace: &ctx.namespace,
        claims,
        powered_on: machine::powered_on(node),
        unseen,
        jobs,
        stored_streak: slot.status.as_ref().and_then(|s| s.unclaimed_shutdowns.as_ref()),
        now: ctx.now(),
        reset_grace: SignedDuration::try_from(SHUTDOWN_ATTEMPT_RESET_GRACE)
            .unwrap_or(SignedDuration::MAX),
        settle: ctx.shutdown_settle(),
        ready_since: machine::ready_since(node),
        heal_grace: ctx.off_node_grace_span(),
        holds_data: slot.status.as_ref().is_some_and(|s| !s.local_volumes.is_empty()),
        can_suspend: slot
            .spec
            .power
            .as_ref()
            .is_some_and(|p| p.suspend.is_some() && p.ssh.is_some()),
    }
}

/// Decides the shutdown pass: whether the machine is powered off, on which claim it is
/// counted, and whether the count pauses it. Pure.
pub fn plan<'a>(facts: &Facts<'a>) -> Plan<'a> {
    let Facts { slot_name, node_name, namespace, claims, powered_on, unseen, jobs, now, .. } =
        *facts;
    let on = powered_on || unseen.is_some();
    let MachineFate::PowerOff { claim } = decide(claims, on) else {
        return Plan::Idle;
    };
    if jobs.iter().any(|j| j.outcome == JobOutcome::Running) {
        return Plan::Idle;
    }
    if let Some(until) = claimable_until(claims, facts.ready_since, facts.heal_grace)
        && now < until
    {
        return Plan::SettleUntil(until);
    }
    // A pin that ended on a machine a running pod's data is on: the scaler claims it for the
    // pod (D39); powering it off would evict the pod only to wake the machine for it again.
    let newest = phase::newest(claims.iter().copied());
    if let Some(until) = pin_end::handed_over_until(newest, facts.holds_data, facts.heal_grace)
        && on
        && now < until
    {
        return Plan::SettleUntil(until);
    }
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
            let unclaimed: Vec<Timestamp> =
                jobs.iter().filter(|j| !j.serves_claim).filter_map(|j| j.created).collect();
            unclaimed_streak(facts.stored_streak, &unclaimed, now, facts.reset_grace)
        }
    };
    if attempts > 0 && !on && claim.is_some_and(|c| !awaits_forced_shutdown(c)) {
        // The last shutdown landed; the claim's release path takes it from here.
        return Plan::Idle;
    }
    if attempts >= MAX_CONSECUTIVE_ATTEMPTS {
        let until = last_at.and_then(|t| t.checked_add(facts.reset_grace).ok()).unwrap_or(now);
        if now < until {
            let note = pause_note(claim, unseen, attempts, until, slot_name, node_name, namespace);
            return Plan::Paused { claim, note, until };
        }
        attempts = 0;
    }
    let mut not_observed = None;
    if attempts > 0 && on {
        // A machine takes a while to go down after its script returns (as long as a machine is
        // given to come up), and its node a while longer to say so: a powered-off kubelet just
        // goes silent, and its node stays Ready until kube-controller-manager's grace period
        // has passed. Only then does the attempt count as not landed.
        if let Some(finished) = last_attempt_ended(jobs.iter().map(|j| j.outcome), last_at, now) {
            let settled = finished.checked_add(facts.settle).unwrap_or(Timestamp::MAX);
            if now < settled {
                return Plan::SettleUntil(settled);
            }
        }
        let who = counted_on(claim);
        not_observed = Some(match unseen {
            Some(Unseen::Silent { since }) => format!(
                "{who}: shutdown Job {attempts} did not confirm node {node_name} off; its kubelet has been silent since {since}"
            ),
            Some(Unseen::OnWithoutNode { read_at }) => format!(
                "{who}: shutdown Job {attempts} finished, but the plug of node {node_name}'s machine still read it drawing power at {read_at}"
            ),
            Some(Unseen::Asleep { since }) => format!(
                "{who}: shutdown Job {attempts} did not power off node {node_name}'s machine, asleep since {since}"
            ),
            None => {
                format!("{who}: shutdown Job {attempts} finished but node {node_name} is still up")
            }
        });
    }
    // Shutdown Jobs are numbered per claim, never reset: a pass that created the Job and then
    // lost the status write to a conflict finds the same Job again and records the same
    // numbers, and a reset streak starts a Job of its own.
    let (owner, sequence) = match claim {
        Some(c) => (
            c.metadata.name.clone().unwrap_or_default(),
            c.status.as_ref().and_then(|s| s.shutdown_jobs).unwrap_or(0) + 1,
        ),
        None => (format!("{slot_name}-{}", now.as_second()), attempts + 1),
    };
    // Shed on battery: powered off, since a machine asleep loses its memory when the UPS does.
    let shed = claim.is_some_and(|c| {
        crate::ups::shed::shed_by(
            c.status.as_ref().and_then(|s| s.scale_down_requested_by.as_deref()),
        )
    });
    let suspend = facts.can_suspend
        && unseen.is_none()
        && !shed
        && claim.is_none_or(|c| !awaits_forced_shutdown(c));
    Plan::PowerOff(PowerOff {
        claim,
        attempt: attempts + 1,
        owner,
        sequence,
        not_observed,
        suspend,
    })
}

/// What the pause after three attempts says, with the command that retries now.
fn pause_note(
    claim: Option<&NodeClaim>,
    unseen: Option<Unseen>,
    attempts: i32,
    until: Timestamp,
    slot_name: &str,
    node_name: &str,
    namespace: &str,
) -> String {
    let reset = match claim {
        Some(c) => format!(
            "kubectl patch nodeclaim {} -n {namespace} --subresource=status --type=merge -p '{{\"status\":{{\"shutdownAttempts\":0,\"lastShutdownAttemptAt\":null}}}}'",
            c.metadata.name.as_deref().unwrap_or_default(),
        ),
        // No claim carries the count: the slot's status does, and the Jobs still in the cache
        // count too.
        None => format!(
            "kubectl delete jobs -n {namespace} -l {}={slot_name},{LABEL_LIFECYCLE}=shutdown && kubectl patch node.infra.homecluster.dev {slot_name} -n {namespace} --subresource=status --type=merge -p '{{\"status\":{{\"unclaimedShutdowns\":null}}}}'",
            crate::api::LABEL_SLOT,
        ),
    };
    match unseen {
        Some(Unseen::Silent { since }) => format!(
            "{attempts} shutdown Jobs could not confirm node {node_name} off (its kubelet silent since {since}); the node is kept, because a kubelet that is running but cut off never registers a deleted node again. Pausing until {until}. If the machine is off: kubectl delete node {node_name}. If it is on: restore its network, and its kubelet takes the node back. To retry now: {reset}"
        ),
        Some(Unseen::OnWithoutNode { read_at }) => format!(
            "{attempts} shutdown Jobs did not power off the machine of node {node_name}, which runs without its node (its plug read it drawing power at {read_at}); pausing until {until}. Restart its kubelet (systemctl restart kubelet on the machine) or power it off by hand. To retry now: {reset}"
        ),
        Some(Unseen::Asleep { since }) => format!(
            "{attempts} shutdown Jobs did not wake and power off the machine of node {node_name}, asleep since {since}; pausing until {until}. Check that a Wake-on-LAN packet wakes it from suspend (`ethtool <interface>` on the machine says `Wake-on: g`) and that it answers on SSH once awake. To retry now: {reset}"
        ),
        None => format!(
            "{attempts} shutdown Jobs did not power off node {node_name}; pausing until {until}. To retry now: {reset}"
        ),
    }
}

/// Powers the machine off when no claim wants it: gathers the facts, plans, and carries the plan
/// out. `claims` and `jobs`: the slot's, as the pass read them. `unseen`: a machine that may be
/// on though its node does not say so.
pub async fn reconcile(
    ctx: &Context,
    slot: &Node,
    claims: &[&NodeClaim],
    jobs: &[ShutdownJob],
    node: Option<&CoreNode>,
    unseen: Option<Unseen>,
) -> Result<Pass> {
    let facts = facts(ctx, slot, claims, jobs, node, unseen);
    let now = facts.now;
    match plan(&facts) {
        Plan::Idle => Ok(Pass::default()),
        Plan::SettleUntil(at) => Ok(Pass::retry_in(until(at, now))),
        Plan::Paused { claim, note, until: end } => {
            let reason = "ShutdownAttemptLimitReached";
            match claim {
                Some(c) => ctx.publish(c, EventType::Warning, reason, note).await,
                None => ctx.publish(slot, EventType::Warning, reason, note).await,
            }
            Ok(Pass::retry_in(until(end, now)))
        }
        Plan::PowerOff(power_off) => carry_out(ctx, slot, node, unseen, power_off).await,
    }
}

/// How long from `now` until `at`, at least a second.
fn until(at: Timestamp, now: Timestamp) -> std::time::Duration {
    std::time::Duration::from_secs_f64(at.duration_since(now).as_secs_f64().max(1.0))
}

/// Carries out a planned power-off: the warning about the attempt before, the drain (which a
/// disruption budget may hold), the Job, and the count.
async fn carry_out(
    ctx: &Context,
    slot: &Node,
    node: Option<&CoreNode>,
    unseen: Option<Unseen>,
    power_off: PowerOff<'_>,
) -> Result<Pass> {
    let slot_name = slot.metadata.name.clone().unwrap_or_default();
    let now = ctx.now();
    if let Some(message) = power_off.not_observed.clone() {
        ctx.publish(slot, EventType::Warning, "ShutdownNotObserved", message).await;
    }
    // A machine that may be serving (its kubelet reports, or its plug reads it on) goes only
    // when the pool's gates let it; a silent one is already gone from its storage's view.
    let serving = machine::powered_on(node) || matches!(unseen, Some(Unseen::OnWithoutNode { .. }));
    let committed = maintenance::under_way(ctx, slot, node);
    if serving
        && !committed
        && let Some(hold) = power_off_gates::check(ctx, slot).await
    {
        return Ok(Pass { retry: Some(hold.retry), gate_hold: Some(hold), ..Pass::default() });
    }
    if serving && let Some(hold) = maintenance::before_power_off(ctx, slot, node).await? {
        return Ok(Pass { retry: Some(hold.retry), gate_hold: Some(hold), ..Pass::default() });
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
                    ..Pass::default()
                });
            }
            tracing::warn!(
                pods = pods.len(),
                %since,
                "drain timed out on PodDisruptionBudgets; powering off anyway"
            );
        }
    }

    let claim = power_off.claim;
    let job_name = power_off.job_name();
    let group = slot.group().unwrap_or_default().to_owned();
    let job = jobs::build(&JobContext {
        slot,
        group: &group,
        claim,
        lifecycle: Lifecycle::Shutdown,
        name: job_name,
        max_run_time: ctx.timeouts.job_timeout,
        power_image: &ctx.power_image,
        priority_class: ctx.power_priority_class.as_deref(),
        step: None,
        suspend: power_off.suspend,
        // A machine asleep, past its limit or owed a forced shutdown after a wake that failed,
        // is woken first where the off path needs its OS.
        wake_first: matches!(unseen, Some(Unseen::Asleep { .. }))
            || node.is_some_and(machine::is_suspended),
    })
    .map_err(|e| Error::Lifecycle(e.to_string()))?;
    let created = ctx.create_job(&job, FieldManager::SlotController).await?;
    let attempt = power_off.attempt;
    if let Some(claim) = claim {
        chokepoint::patch_status(
            ctx,
            claim,
            FieldManager::SlotController,
            json!({ "shutdownAttempts": attempt, "shutdownJobs": power_off.sequence, "lastShutdownAttemptAt": Time(now) }),
        )
        .await?;
    }
    // With no claim the slot's status keeps the count (written with its status, see `observe`).
    let streak =
        claim.is_none().then_some(ShutdownStreak { attempts: attempt, last_attempt_at: Time(now) });
    if created {
        let (type_, reason, message) =
            power_off.announcement(unseen, &slot.spec.kubernetes_node_name);
        ctx.publish(slot, type_, reason, message).await;
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

    /// A pin that ended while a running pod's data is on the machine: the shutdown waits the
    /// grace for the scaler to claim the machine for the pod; without such data, or past the
    /// grace, the machine is powered off as any unwanted one.
    #[test]
    fn a_pins_end_on_a_machine_holding_data_waits_for_the_scaler() {
        let mut expired = committed_failure("pin");
        {
            let status = expired.status.as_mut().unwrap();
            status.phase = Some(Completed);
            status.reason = Some(pin_end::EXPIRED.into());
            status.finished_at = Some(at("2026-03-04T09:58:00Z"));
        }
        expired.metadata.finalizers = Some(vec![crate::claim::FINALIZER.into()]);
        let claims = [&expired];
        let facts = |holds_data: bool, now: &str| Facts {
            slot_name: "m1",
            node_name: "m1",
            namespace: "homelab",
            claims: &claims,
            powered_on: true,
            unseen: None,
            jobs: &[],
            stored_streak: None,
            now: at(now).0,
            reset_grace: SignedDuration::from_mins(30),
            settle: SignedDuration::from_secs(38),
            ready_since: None,
            heal_grace: SignedDuration::from_mins(5),
            holds_data,
            can_suspend: false,
        };
        assert_eq!(
            plan(&facts(true, "2026-03-04T10:00:00Z")),
            Plan::SettleUntil(at("2026-03-04T10:03:00Z").0)
        );
        let powers_off = |p: Plan<'_>| matches!(p, Plan::PowerOff(_));
        assert!(powers_off(plan(&facts(false, "2026-03-04T10:00:00Z"))), "no data held");
        assert!(powers_off(plan(&facts(true, "2026-03-04T10:03:00Z"))), "past the grace");
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

    /// The shutdown plan, one row per way a pass can go: the Job's number and count, the
    /// settle before a second attempt, the pause after three, and what is said about a machine
    /// the node does not show up.
    #[test]
    fn shutdown_plan_table() {
        let ts = |s: &str| at(s).0;
        let now = ts("2026-03-04T10:00:00Z");
        let ready = claim_in("ready", "m1", Some(Ready), "2026-03-04T09:00:00Z");
        let mut released = marked(ready.clone());
        {
            let status = released.status.as_mut().unwrap();
            status.shutdown_attempts = Some(1);
            status.shutdown_jobs = Some(2);
            status.last_shutdown_attempt_at = Some(at("2026-03-04T09:59:00Z"));
        }
        let failed = committed_failure("failed");
        let streak = |attempts, last: &str| ShutdownStreak { attempts, last_attempt_at: at(last) };
        let three_recent = streak(3, "2026-03-04T09:50:00Z");
        let three_stale = streak(3, "2026-03-04T09:20:00Z");
        let one = streak(1, "2026-03-04T09:59:50Z");
        let one_older = streak(1, "2026-03-04T09:58:00Z");
        let job = |outcome, created: &str, serves_claim| ShutdownJob {
            outcome,
            created: Some(ts(created)),
            confirms_off: true,
            serves_claim,
            suspends: false,
        };
        let running = [job(JobOutcome::Running, "2026-03-04T09:59:58Z", false)];
        let ended_5s_ago = [job(
            JobOutcome::Succeeded { at: Some(ts("2026-03-04T09:59:55Z")) },
            "2026-03-04T09:59:50Z",
            false,
        )];
        let ended_a_minute_ago = [job(
            JobOutcome::Succeeded { at: Some(ts("2026-03-04T09:59:00Z")) },
            "2026-03-04T09:58:00Z",
            false,
        )];
        let gone_at = |name: &str, reason: &str, finished: &str| {
            let mut c = committed_failure(name);
            let status = c.status.as_mut().unwrap();
            status.reason = Some(reason.into());
            status.finished_at = Some(at(finished));
            c
        };
        let gone = gone_at("gone", "MachineGone", "2026-03-04T09:55:00Z");
        let gone_long_ago = gone_at("gone", "MachineGone", "2026-03-04T09:50:00Z");
        let overdue = gone_at("overdue", "DeadlineExceeded", "2026-03-04T09:55:00Z");
        let forced_on = |claim| {
            Plan::PowerOff(PowerOff {
                claim: Some(claim),
                attempt: 1,
                owner: claim.metadata.name.clone().unwrap(),
                sequence: 1,
                not_observed: None,
                suspend: false,
            })
        };
        let silent = Some(Unseen::Silent { since: ts("2026-03-04T09:40:00Z") });
        let nodeless = Some(Unseen::OnWithoutNode { read_at: ts("2026-03-04T09:59:55Z") });
        fn facts<'a>(claims: &'a [&'a NodeClaim], now: Timestamp) -> Facts<'a> {
            Facts {
                slot_name: "m1",
                node_name: "m1",
                namespace: "homelab",
                claims,
                powered_on: true,
                unseen: None,
                jobs: &[],
                stored_streak: None,
                now,
                reset_grace: SignedDuration::from_mins(30),
                settle: SignedDuration::from_secs(38),
                ready_since: None,
                heal_grace: SignedDuration::from_mins(5),
                holds_data: false,
                can_suspend: false,
            }
        }
        let (no_claim, wanted, releasing, forced): ([&NodeClaim; 0], _, _, _) =
            ([], [&ready], [&released], [&failed]);
        let mut gone_tried = gone.clone();
        {
            let status = gone_tried.status.as_mut().unwrap();
            status.shutdown_attempts = Some(1);
            status.last_shutdown_attempt_at = Some(at("2026-03-04T09:56:00Z"));
        }
        let (gone_now, gone_before, deadline) = ([&gone], [&gone_long_ago], [&overdue]);
        let tried = [&gone_tried];
        let back_at = |t: &str| Some(ts(t));
        let first_unclaimed = |not_observed: Option<&str>, attempt: i32| {
            Plan::PowerOff(PowerOff {
                claim: None,
                attempt,
                owner: format!("m1-{}", now.as_second()),
                sequence: attempt,
                not_observed: not_observed.map(str::to_owned),
                suspend: false,
            })
        };
        let rows: Vec<(&str, Facts<'_>, Plan<'_>)> = vec![
            ("wanted: a ready claim", Facts { ..facts(&wanted, now) }, Plan::Idle),
            ("up, nothing asked for it", facts(&no_claim, now), first_unclaimed(None, 1)),
            ("a shutdown under way", Facts { jobs: &running, ..facts(&no_claim, now) }, Plan::Idle),
            ("off and unclaimed", Facts { powered_on: false, ..facts(&no_claim, now) }, Plan::Idle),
            (
                "the released claim's shutdown landed",
                Facts { powered_on: false, ..facts(&releasing, now) },
                Plan::Idle,
            ),
            (
                "the released claim's machine still up past the settle: Job 3, attempt 2",
                facts(&releasing, now),
                Plan::PowerOff(PowerOff {
                    claim: Some(&released),
                    attempt: 2,
                    owner: "ready".into(),
                    sequence: 3,
                    not_observed: Some(
                        "claim ready: shutdown Job 1 finished but node m1 is still up".into(),
                    ),
                    suspend: false,
                }),
            ),
            (
                "a forced shutdown owed, whatever is observed",
                Facts { powered_on: false, ..facts(&forced, now) },
                Plan::PowerOff(PowerOff {
                    claim: Some(&failed),
                    attempt: 1,
                    owner: "failed".into(),
                    sequence: 1,
                    not_observed: None,
                    suspend: false,
                }),
            ),
            (
                "the last attempt ended 5 s ago: settle",
                Facts { jobs: &ended_5s_ago, stored_streak: Some(&one), ..facts(&no_claim, now) },
                Plan::SettleUntil(ts("2026-03-04T10:00:33Z")),
            ),
            (
                "settled and still up: attempt 2, warned first",
                Facts {
                    jobs: &ended_a_minute_ago,
                    stored_streak: Some(&one_older),
                    ..facts(&no_claim, now)
                },
                first_unclaimed(
                    Some("no claim wants it: shutdown Job 1 finished but node m1 is still up"),
                    2,
                ),
            ),
            (
                "three attempts within the pause: paused",
                Facts { stored_streak: Some(&three_recent), ..facts(&no_claim, now) },
                Plan::Paused {
                    claim: None,
                    note: pause_note(
                        None,
                        None,
                        3,
                        ts("2026-03-04T10:20:00Z"),
                        "m1",
                        "m1",
                        "homelab",
                    ),
                    until: ts("2026-03-04T10:20:00Z"),
                },
            ),
            (
                "three attempts, the pause over: the count starts again",
                Facts { stored_streak: Some(&three_stale), ..facts(&no_claim, now) },
                first_unclaimed(None, 1),
            ),
            (
                "silent past the grace, nothing confirms it off",
                Facts { powered_on: false, unseen: silent, ..facts(&no_claim, now) },
                first_unclaimed(None, 1),
            ),
            (
                "no node, its plug reading it on",
                Facts { powered_on: false, unseen: nodeless, ..facts(&no_claim, now) },
                first_unclaimed(None, 1),
            ),
            (
                "gone during a partition, back a minute ago: left to be claimed again",
                Facts { ready_since: back_at("2026-03-04T09:59:00Z"), ..facts(&gone_now, now) },
                Plan::SettleUntil(ts("2026-03-04T10:04:00Z")),
            ),
            (
                "gone, its forced shutdown tried behind the partition, back: left to be claimed",
                Facts { ready_since: back_at("2026-03-04T09:59:00Z"), ..facts(&tried, now) },
                Plan::SettleUntil(ts("2026-03-04T10:04:00Z")),
            ),
            (
                "gone during a partition, back past the grace: its forced shutdown",
                Facts { ready_since: back_at("2026-03-04T09:52:00Z"), ..facts(&gone_before, now) },
                forced_on(&gone_long_ago),
            ),
            (
                "gone, and not back: its forced shutdown",
                Facts { powered_on: false, ..facts(&gone_now, now) },
                forced_on(&gone),
            ),
            (
                "Ready since before it was judged gone: no heal, its forced shutdown",
                Facts { ready_since: back_at("2026-03-04T09:30:00Z"), ..facts(&gone_now, now) },
                forced_on(&gone),
            ),
            (
                "a boot past its deadline, up now: no grace, its forced shutdown",
                Facts { ready_since: back_at("2026-03-04T09:59:00Z"), ..facts(&deadline, now) },
                forced_on(&overdue),
            ),
            (
                "no node, its plug reading it on, a claim wants the machine",
                Facts { powered_on: false, unseen: nodeless, ..facts(&wanted, now) },
                Plan::Idle,
            ),
        ];
        for (name, facts, want) in rows {
            assert_eq!(plan(&facts), want, "{name}");
        }

        // Where the slot can suspend: a routine power-off suspends; a forced shutdown after a
        // failed boot and the shutdown that confirms a silent machine off power it off.
        let suspends = |facts: Facts<'_>| match plan(&facts) {
            Plan::PowerOff(p) => Some(p.suspend),
            _ => None,
        };
        let mut shed_claim = released.clone();
        shed_claim.status.get_or_insert_with(Default::default).scale_down_requested_by =
            Some(format!("{} (ups@nut:3493: on battery for 5m)", crate::ups::shed::SHED_BY));
        let shed = [&shed_claim];
        fn can(facts: Facts<'_>) -> Facts<'_> {
            Facts { can_suspend: true, ..facts }
        }
        let suspend_rows: Vec<(&str, Facts<'_>, Option<bool>)> = vec![
            ("up, nothing asked for it", can(facts(&no_claim, now)), Some(true)),
            ("the released claim's machine still up", can(facts(&releasing, now)), Some(true)),
            (
                "a forced shutdown owed",
                can(Facts { powered_on: false, ..facts(&forced, now) }),
                Some(false),
            ),
            (
                "silent past the grace: the shutdown confirms it off",
                can(Facts { powered_on: false, unseen: silent, ..facts(&no_claim, now) }),
                Some(false),
            ),
            ("the slot cannot suspend", facts(&no_claim, now), Some(false)),
            ("shed on battery: powered off", can(facts(&shed, now)), Some(false)),
        ];
        for (name, facts, want) in suspend_rows {
            assert_eq!(suspends(facts), want, "{name}");
        }

        // What each kind of power-off says.
        let power_off = PowerOff {
            claim: None,
            attempt: 1,
            owner: "m1-1".into(),
            sequence: 1,
            not_observed: None,
            suspend: false,
        };
        let said = |unseen| power_off.announcement(unseen, "m1");
        assert_eq!(said(None).1, "ScaleDownRequested");
        assert_eq!(said(None).0, EventType::Normal);
        let (kind, reason, message) = said(silent);
        assert_eq!((kind, reason), (EventType::Warning, "ConfirmingOff"), "{message}");
        let (kind, reason, message) = said(nodeless);
        assert_eq!((kind, reason), (EventType::Warning, "OnWithoutNode"), "{message}");
        assert!(message.contains("registers afresh"), "{message}");
        let note = pause_note(None, nodeless, 3, now, "m1", "m1", "homelab");
        assert!(note.contains("systemctl restart kubelet"), "{note}");
        let note = pause_note(None, silent, 3, now, "m1", "m1", "homelab");
        assert!(note.contains("kubectl delete node m1"), "{note}");
        let note = pause_note(Some(&ready), None, 3, now, "m1", "m1", "homelab");
        assert!(note.contains("kubectl patch nodeclaim ready -n homelab"), "{note}");
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
