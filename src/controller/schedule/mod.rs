//! The schedule controller: keeps each open window of a Group's `spec.schedules` held by pins
//! (docs/decisions.md, D22). It counts the pins (Manual or Schedule claims) on the window's
//! eligible slots and fills the deficit with `Schedule` claims on free slots whose `spec.until`
//! is the end of the opening; the claim controller ends them there (`Expired`). It never ends
//! or touches a claim it did not make, and only ever extends its own claims' `until`. It looks
//! again at the next window boundary, and whenever the pool's slots or claims change.

mod plan;

pub use plan::{LiveClaim, NewClaim, Plan, SlotView, plan, requested_by};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::{KubeContext, Result, is_already_exists};
use super::{Context, GroupInputs};
use crate::api::{
    ClaimCall, ClaimRequest, Group, GroupScheduleStatus, GroupSpec, LABEL_GROUP, LABEL_SLOT, Node,
    NodeClaim, NodeClaimSpec, SlotRef,
};
use crate::field_manager::{FieldManager, apply_status_of};
use crate::provider::slot_pricing::pricing_of;
use crate::{phase, telemetry};

pub async fn controller(ctx: Arc<Context>, inputs: GroupInputs, shutdown: CancellationToken) {
    let controller = super::group::of_pools(&ctx, inputs, shutdown);
    let reconcile = |group, ctx| telemetry::reconcile("schedule", reconcile(group, ctx));
    super::drive("schedule", controller.run(reconcile, super::error_policy, ctx)).await;
}

async fn reconcile(group: Arc<Group>, ctx: Arc<Context>) -> Result<Action> {
    let name = group.metadata.name.clone().unwrap_or_default();
    let span = tracing::info_span!("reconcile_schedule", group = %name);
    reconcile_schedule(group, ctx, name).instrument(span).await
}

async fn reconcile_schedule(group: Arc<Group>, ctx: Arc<Context>, name: String) -> Result<Action> {
    let previous = group.status.as_ref().and_then(|s| s.schedule.clone());
    if group.spec.schedules.is_empty() {
        if previous.is_some() {
            write_status(&ctx, &name, previous.as_ref(), None).await?;
        }
        return Ok(Action::await_change());
    }
    let pool_slots = ctx.stores.slots_of_group(&name);
    let pool: BTreeMap<&str, &Node> = pool_slots
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| s.metadata.name.as_deref().map(|n| (n, s.as_ref())))
        .collect();
    let slots: Vec<SlotView> =
        pool.iter().map(|(slot_name, slot)| slot_view(slot_name, slot, &group.spec)).collect();
    let claims: Vec<Arc<NodeClaim>> =
        pool.keys().flat_map(|slot| ctx.stores.claims_of_slot(slot)).collect();
    // A new claim's name must be free in the whole namespace, not only among the pool's.
    let taken: BTreeSet<String> =
        ctx.stores.claims.state().iter().filter_map(|c| c.metadata.name.clone()).collect();
    let live: Vec<LiveClaim> = claims
        .iter()
        .filter(|c| phase::is_live(Some(phase::of(c))))
        .map(|c| LiveClaim {
            name: c.metadata.name.clone().unwrap_or_default(),
            slot: c.spec.slot_ref.name.clone(),
            pin: c.spec.request.call.is_pin(),
            requested_by: c.spec.requested_by.clone(),
            until: c.spec.until.as_ref().map(|t| t.0),
        })
        .collect();
    let plan = plan::plan(&plan::Inputs {
        group: &name,
        windows: &group.spec.schedules,
        slots: &slots,
        live: &live,
        taken_names: &taken,
        now: ctx.now(),
    });
    let claims_api = Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace);
    for (claim, until) in &plan.extend {
        let patch = json!({ "spec": { "until": Time(*until) } });
        claims_api
            .patch(claim, &FieldManager::ScheduleController.patch(), &Patch::Merge(&patch))
            .await
            .during(|| format!("extending schedule claim {claim} to {until}"))?;
        tracing::info!(claim, %until, "schedule claim extended to the end of its opening");
    }
    let mut refused = Vec::new();
    for fill in &plan.fills {
        let mut made = 0;
        for candidate in &fill.candidates {
            if made == fill.wanted {
                break;
            }
            let Some(slot) = pool.get(candidate.slot.as_str()) else { continue };
            match create(&claims_api, &name, slot, candidate).await {
                Ok(()) => {
                    made += 1;
                    ctx.publish(
                        group.as_ref(),
                        EventType::Normal,
                        "ScheduleClaimCreated",
                        format!(
                            "claim {} holds slot {}: {}",
                            candidate.name, candidate.slot, candidate.reason
                        ),
                    )
                    .await;
                }
                // Admission said no (an exhausted slot, a claim the cache had not seen yet):
                // the next candidate is tried, and the status says why.
                Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
                    tracing::info!(
                        slot = candidate.slot,
                        message = status.message,
                        "a schedule claim was refused"
                    );
                    refused.push(format!("slot {}: {}", candidate.slot, status.message));
                }
                Err(error) => {
                    return Err(error)
                        .during(|| format!("creating schedule claim {}", candidate.name));
                }
            }
        }
    }
    let mut status = plan.status;
    if !refused.is_empty() {
        let refused = format!("refused: {}", refused.join("; "));
        status.message = Some(match status.message {
            Some(message) => format!("{message}; {refused}"),
            None => refused,
        });
    }
    if previous.as_ref() != Some(&status) {
        write_status(&ctx, &name, previous.as_ref(), Some(&status)).await?;
    }
    Ok(Action::requeue(plan.requeue))
}

/// Creates one schedule claim; AlreadyExists is success (a pass on a cache that had not seen
/// the last create makes the same name).
async fn create(
    api: &Api<NodeClaim>,
    group: &str,
    slot: &Node,
    new: &NewClaim,
) -> std::result::Result<(), kube::Error> {
    let claim = NodeClaim {
        metadata: ObjectMeta {
            name: Some(new.name.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_GROUP.to_owned(), group.to_owned()),
                (LABEL_SLOT.to_owned(), new.slot.clone()),
            ])),
            owner_references: slot.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: NodeClaimSpec {
            slot_ref: SlotRef { name: new.slot.clone() },
            request: ClaimRequest {
                call: ClaimCall::Schedule,
                delta: None,
                group: group.to_owned(),
                nodes: Vec::new(),
                reason: Some(new.reason.clone()),
            },
            requested_at: None,
            requested_by: Some(new.requested_by.clone()),
            attempt: None,
            deadline_at: None,
            max_node_provision_time: None,
            until: Some(Time(new.until)),
            boot_on_battery: None,
            ttl_seconds_after_finished: None,
        },
        status: None,
    };
    match api.create(&FieldManager::ScheduleController.post(), &claim).await {
        Ok(_) => {
            tracing::info!(claim = new.name, slot = new.slot, until = %new.until, "schedule claim created");
            Ok(())
        }
        Err(error) if is_already_exists(&error) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Applies `status.schedule` (None: clears it, and the SCHEDULE column empties). The schedule
/// controller owns only this field, so the group controller's and the scaler's stay; a member
/// the new status lacks (a window closed: `active`, `until`) is cleared.
async fn write_status(
    ctx: &Context,
    name: &str,
    previous: Option<&GroupScheduleStatus>,
    schedule: Option<&GroupScheduleStatus>,
) -> Result<()> {
    let serialize = |value: Option<&GroupScheduleStatus>| {
        serde_json::to_value(value)
            .map_err(|source| super::Error::Serialize { what: "the schedule status", source })
    };
    let previous = json!({ "schedule": serialize(previous)? });
    let status = json!({ "schedule": serialize(schedule)? });
    let groups = Api::<Group>::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_status_of(&groups, name, FieldManager::ScheduleController, Some(&previous), status)
        .await
        .during(|| format!("writing the schedule status of group {name}"))?;
    Ok(())
}

/// A slot as the schedule's plan reads it. Its price follows one rule with the provider's slot
/// choice and the energy report: its own, else its declared draw at the pool's tariff, else
/// the pool's.
fn slot_view(name: &str, slot: &Node, group: &GroupSpec) -> SlotView {
    SlotView {
        name: name.to_string(),
        hourly_rate: pricing_of(&slot.spec, group).map(|p| p.hourly_rate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_priced_as_the_provider_prices_it() {
        let mut group: crate::api::Group = crate::fixtures::group("home");
        group.spec.pricing = Some(crate::api::Pricing { hourly_rate: 0.5, pod_rate: 0.0 });
        group.spec.energy = serde_json::from_value(serde_json::json!({ "pricePerKWh": 0.30 })).ok();
        let mut frugal = crate::fixtures::slot("nuc", "home");
        frugal.spec.power =
            serde_json::from_value(serde_json::json!({ "watts": { "whenOn": 20 } })).ok();
        let rate = slot_view("nuc", &frugal, &group.spec).hourly_rate.unwrap();
        assert!((rate - 0.006).abs() < 1e-9, "20 W at 0.30 per kWh, not the pool's 0.5: {rate}");
        let plain = crate::fixtures::slot("big", "home");
        assert_eq!(slot_view("big", &plain, &group.spec).hourly_rate, Some(0.5));
    }
}
