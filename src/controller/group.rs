//! The group controller: counts a pool's slots and live claims into its status, says when a pool
//! has no slot, and keeps the pool's savings report (see [`crate::savings`]).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::{KubeContext, Result};
use super::{Context, GroupInputs, METER_READINGS_FRESH};
use crate::api::{
    Group, GroupClaimCounts, Node, NodeClaim, NodeClaimPhase, ObservedPower, SlotPhase,
};
use crate::field_manager::{FieldManager, apply_status_of};
use crate::provider::slot_pricing::pricing_of;
use crate::savings::{self, SlotSample, Watts};
use crate::{machine, phase, telemetry};

pub async fn controller(ctx: Arc<Context>, inputs: GroupInputs, shutdown: CancellationToken) {
    let controller = of_pools(&ctx, inputs, shutdown);
    let reconcile = |group, ctx| telemetry::reconcile("group", reconcile(group, ctx));
    super::drive("group", controller.run(reconcile, super::error_policy, ctx)).await;
}

/// A controller of Groups, woken by their slots (the `group` label) and their claims
/// (`spec.request.group`). The group and schedule controllers both read a pool this way.
pub(super) fn of_pools(
    ctx: &Context,
    inputs: GroupInputs,
    shutdown: CancellationToken,
) -> Controller<Group> {
    let ns_slots = ctx.namespace.clone();
    let ns_claims = ctx.namespace.clone();
    Controller::for_shared_stream(inputs.groups, ctx.stores.groups.clone())
        .watches_shared_stream(inputs.slots, move |slot| {
            slot.group().map(|g| ObjectRef::new(g).within(&ns_slots))
        })
        .watches_shared_stream(inputs.claims, move |claim| {
            Some(ObjectRef::new(&claim.spec.request.group).within(&ns_claims))
        })
        .with_config(super::config())
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
}

/// Live claims by phase.
pub fn count<'a>(claims: impl IntoIterator<Item = &'a NodeClaim>) -> GroupClaimCounts {
    let mut counts = GroupClaimCounts::default();
    for claim in claims {
        match phase::of(claim) {
            NodeClaimPhase::Pending => counts.pending += 1,
            NodeClaimPhase::Booting => counts.booting += 1,
            NodeClaimPhase::Ready => counts.ready += 1,
            NodeClaimPhase::Completed | NodeClaimPhase::Failed => {}
        }
    }
    counts
}

/// How often a pool's savings report is brought up to date while its power does not change.
pub const SAVINGS_STEP: Duration = Duration::from_secs(60);

/// The condition that says whether a pool has slots at all.
pub const CONDITION_HAS_SLOTS: &str = "HasSlots";

/// What the slot contributes to its pool's savings report. Its on-draw is what its meter read
/// while it was ready, else its declared `whenOn`; its idle draw is `spec.power.suspend.watts`
/// while it sleeps (`asleep`), else `whenOff`; its draw now is a fresh reading, if any.
fn savings_sample(
    slot: &Node,
    group: &Group,
    now: Timestamp,
    meter_interval: Duration,
    asleep: bool,
) -> SlotSample {
    let status = slot.status.as_ref();
    let powered = status.and_then(|s| s.power_state) == Some(ObservedPower::On)
        || matches!(
            status.and_then(|s| s.phase),
            Some(SlotPhase::Booting | SlotPhase::Ready | SlotPhase::Draining)
        );
    let draw = status.and_then(|s| s.draw.as_ref());
    let fresh_for = (meter_interval * METER_READINGS_FRESH).as_secs_f64();
    let on = slot.running_watts();
    SlotSample {
        name: slot.metadata.name.clone().unwrap_or_default(),
        powered,
        hourly_rate: pricing_of(&slot.spec, &group.spec).map_or(0.0, |p| p.hourly_rate),
        watts: on.map(|on| Watts { on, off: slot.idle_watts(asleep).unwrap_or(0.0) }),
        measured_watts: draw
            .filter(|d| now.duration_since(d.read_at.0).as_secs_f64() <= fresh_for)
            .map(|d| d.watts),
    }
}

/// Slots by reported phase, every phase named (an absent report reads as off).
fn slot_phases(slots: &[&Node]) -> [(&'static str, i64); 5] {
    let mut counts = [("off", 0), ("pending", 0), ("booting", 0), ("ready", 0), ("draining", 0)];
    for slot in slots {
        let index = match slot.status.as_ref().and_then(|s| s.phase) {
            None | Some(SlotPhase::Off) => 0,
            Some(SlotPhase::Pending) => 1,
            Some(SlotPhase::Booting) => 2,
            Some(SlotPhase::Ready) => 3,
            Some(SlotPhase::Draining) => 4,
        };
        counts[index].1 += 1;
    }
    counts
}

/// The HasSlots condition for a pool of `slots` slots, keeping the transition time of
/// `previous` when the status is unchanged.
pub fn has_slots_condition(
    group: &str,
    slots: usize,
    generation: Option<i64>,
    previous: Option<&Condition>,
    now: Time,
) -> Condition {
    let (status, reason, message) = if slots == 0 {
        (
            "False",
            "NoSlots",
            format!(
                "No slot carries the label group={group}, so this pool cannot power any machine; \
                 label a slot (nodes.infra.homecluster.dev) with group: {group}."
            ),
        )
    } else {
        let noun = if slots == 1 { "slot carries" } else { "slots carry" };
        ("True", "SlotsFound", format!("{slots} {noun} the label group={group}."))
    };
    let last_transition_time =
        previous.filter(|c| c.status == status).map_or(now, |c| c.last_transition_time.clone());
    Condition {
        type_: CONDITION_HAS_SLOTS.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

async fn reconcile(group: Arc<Group>, ctx: Arc<Context>) -> Result<Action> {
    let name = group.metadata.name.clone().unwrap_or_default();
    let span = tracing::info_span!("reconcile_group", group = %name);
    reconcile_group(group, ctx, name).instrument(span).await
}

async fn reconcile_group(group: Arc<Group>, ctx: Arc<Context>, name: String) -> Result<Action> {
    let pool = ctx.stores.slots_of_group(&name);
    let slots: Vec<&Node> = pool.iter().map(AsRef::as_ref).collect();
    let claims = ctx.stores.claims_of_group(&name);
    let counts = count(claims.iter().map(AsRef::as_ref));
    let status = group.status.clone().unwrap_or_default();
    let now = ctx.now();

    let asleep = |slot: &Node| {
        ctx.core_node(&slot.spec.kubernetes_node_name).is_some_and(|n| machine::is_suspended(&n))
    };
    let samples: Vec<SlotSample> = slots
        .iter()
        .map(|s| savings_sample(s, &group, now, ctx.meter_interval, asleep(s)))
        .collect();
    let tariff = group.spec.energy.as_ref().map_or(0.0, |e| e.price_per_kwh);
    let savings_due = savings::due(status.savings.as_ref(), &samples, now, SAVINGS_STEP);
    let report = if savings_due {
        savings::accrue(status.savings.as_ref(), &samples, tariff, now)
    } else {
        status.savings.clone().unwrap_or_else(|| savings::accrue(None, &samples, tariff, now))
    };
    telemetry::group_observed(
        &name,
        [
            ("pending", i64::from(counts.pending)),
            ("booting", i64::from(counts.booting)),
            ("ready", i64::from(counts.ready)),
        ],
        slot_phases(&slots),
    );
    telemetry::savings_reported(
        &name,
        &telemetry::SavingsSample {
            seconds_on: report.machine_hours_on * 3600.0,
            seconds_off: report.machine_hours_off * 3600.0,
            cost: report.cost,
            always_on_cost: report.always_on_cost,
            saved: report.saved,
            energy_used_kwh: report.energy_used_kwh,
            energy_saved_kwh: report.energy_saved_kwh,
            energy_cost: report.energy_cost,
            energy_saved_cost: report.energy_saved_cost,
        },
    );

    let previous = status.conditions.iter().find(|c| c.type_ == CONDITION_HAS_SLOTS);
    let condition =
        has_slots_condition(&name, slots.len(), group.metadata.generation, previous, Time(now));
    let slots = i32::try_from(slots.len()).unwrap_or(i32::MAX);
    let requeue = Action::requeue(SAVINGS_STEP);
    if status.slots == slots
        && status.claims == counts
        && status.observed_generation == group.metadata.generation
        && previous == Some(&condition)
        && !savings_due
    {
        return Ok(requeue);
    }
    let mut conditions: Vec<Condition> =
        status.conditions.into_iter().filter(|c| c.type_ != CONDITION_HAS_SLOTS).collect();
    conditions.push(condition);
    let previous = serde_json::to_value(group.status.as_ref())
        .map_err(|source| super::Error::Serialize { what: "the group status", source })?;
    let status = json!({
        "slots": slots,
        "claims": counts,
        "observedGeneration": group.metadata.generation,
        "savings": report,
        "conditions": conditions,
    });
    let groups = Api::<Group>::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_status_of(&groups, &name, FieldManager::GroupController, Some(&previous), status)
        .await
        .during(|| format!("writing the status of group {name}"))?;
    Ok(requeue)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap())
    }

    #[test]
    fn the_has_slots_condition_says_what_the_pool_lacks() {
        let empty = has_slots_condition("idle", 0, Some(1), None, at(0));
        assert_eq!((empty.status.as_str(), empty.reason.as_str()), ("False", "NoSlots"));
        assert!(empty.message.contains("label a slot"), "{}", empty.message);
        // Unchanged status keeps its transition time; a change moves it.
        let still = has_slots_condition("idle", 0, Some(2), Some(&empty), at(60));
        assert_eq!(still.last_transition_time, at(0));
        let found = has_slots_condition("idle", 1, Some(2), Some(&still), at(120));
        assert_eq!((found.status.as_str(), found.reason.as_str()), ("True", "SlotsFound"));
        assert_eq!(found.message, "1 slot carries the label group=idle.");
        assert_eq!(found.last_transition_time, at(120));
        let more = has_slots_condition("idle", 3, Some(2), Some(&found), at(180));
        assert_eq!(more.message, "3 slots carry the label group=idle.");
        assert_eq!(more.last_transition_time, at(120));
    }

    #[test]
    fn a_slot_is_priced_by_its_own_pricing_else_its_pools() {
        use crate::api::{NodeStatus, ObservedPower, Pricing};
        let mut group = crate::fixtures::group("pool");
        group.spec.pricing = Some(Pricing { hourly_rate: 0.05, pod_rate: 0.0 });
        let mut own = crate::fixtures::slot("own", "pool");
        own.spec.pricing = Some(Pricing { hourly_rate: 0.3, pod_rate: 0.0 });
        own.status = Some(NodeStatus { phase: Some(SlotPhase::Draining), ..Default::default() });
        let mut inherits = crate::fixtures::slot("inherits", "pool");
        inherits.spec.pricing = None;
        inherits.status =
            Some(NodeStatus { power_state: Some(ObservedPower::On), ..Default::default() });
        let mut off = crate::fixtures::slot("off", "pool");
        off.spec.pricing = None;
        off.status = Some(NodeStatus { phase: Some(SlotPhase::Pending), ..Default::default() });
        let table = [(&own, true, 0.3), (&inherits, true, 0.05), (&off, false, 0.05)];
        for (slot, powered, rate) in table {
            let sample = savings_sample(slot, &group, at(0).0, MINUTE, false);
            assert_eq!((sample.powered, sample.hourly_rate), (powered, rate), "{}", sample.name);
        }
        group.spec.pricing = None;
        assert_eq!(savings_sample(&off, &group, at(0).0, MINUTE, false).hourly_rate, 0.0);
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_slot_is_counted_from_its_meter_while_the_reading_is_fresh() {
        use crate::api::{MeasuredDraw, NodeStatus, PowerSpec, PowerWatts};
        let group = crate::fixtures::group("pool");
        let slot = |declared: Option<(f64, f64)>, draw: Option<(f64, i64, Option<f64>)>| {
            let mut slot = crate::fixtures::slot("m1", "pool");
            slot.spec.power = declared.map(|(on, off)| PowerSpec {
                watts: Some(PowerWatts { when_on: on, when_off: Some(off) }),
                ..Default::default()
            });
            slot.status = Some(NodeStatus {
                draw: draw.map(|(watts, read, when_on_watts)| MeasuredDraw {
                    watts,
                    read_at: at(read),
                    when_on_watts,
                }),
                ..Default::default()
            });
            slot
        };
        // Now is 600 s; with a 60 s interval a reading is fresh for 180 s.
        let table = [
            ("declared only", slot(Some((95.0, 4.0)), None), Some((95.0, 4.0)), None),
            (
                "a fresh reading, and the on-draw it measured",
                slot(Some((95.0, 4.0)), Some((3.0, 500, Some(88.0)))),
                Some((88.0, 4.0)),
                Some(3.0),
            ),
            (
                "a stale reading is not counted; its on-draw is",
                slot(Some((95.0, 4.0)), Some((3.0, 400, Some(88.0)))),
                Some((88.0, 4.0)),
                None,
            ),
            (
                "nothing declared, never read ready: the draw is not known",
                slot(None, Some((3.0, 590, None))),
                None,
                Some(3.0),
            ),
            ("nothing declared or read", slot(None, None), None, None),
        ];
        for (case, slot, watts, measured) in table {
            let sample = savings_sample(&slot, &group, at(600).0, MINUTE, false);
            assert_eq!(sample.watts.map(|w| (w.on, w.off)), watts, "{case}");
            assert_eq!(sample.measured_watts, measured, "{case}");
        }
    }

    #[test]
    fn slots_count_by_reported_phase() {
        let slot = |phase: Option<SlotPhase>| {
            let mut node = crate::fixtures::slot("s", "pool");
            node.status = Some(crate::api::NodeStatus { phase, ..Default::default() });
            node
        };
        let nodes = [slot(None), slot(Some(SlotPhase::Off)), slot(Some(SlotPhase::Ready))];
        let refs: Vec<&Node> = nodes.iter().collect();
        let counts = slot_phases(&refs);
        assert_eq!(counts[0], ("off", 2));
        assert_eq!(counts[3], ("ready", 1));
        assert_eq!(counts.iter().map(|c| c.1).sum::<i64>(), 3);
    }
}
