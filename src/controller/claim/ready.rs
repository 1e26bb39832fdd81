//! A ready claim owns its machine. Its deadline is gone; what bounds it now is the machine
//! itself, judged by `claim::ready_bound`: silent or gone for a whole boot window (the clock on
//! the object, so a restart does not restart it) fails the claim `MachineGone`; a kubelet that
//! reports NotReady has a longer bound of its own, and none under a pin. A machine that comes
//! back clears the mark. A pin is woken at its `spec.until`, so it expires on time without
//! polling (`expiry`).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::chokepoint::{self, PhaseMove};
use super::expiry;
use crate::api::{NodeClaim, NodeClaimPhase};
use crate::claim::ready_bound::{self, OffMark, PowerReading, ReadyMachine, Verdict};
use crate::controller::Context;
use crate::controller::error::{KubeContext, Result};
use crate::field_manager::FieldManager;
use crate::machine::Kubelet;
use crate::phase::Writer;

pub async fn reconcile_ready(ctx: &Arc<Context>, claim: &NodeClaim) -> Result<Action> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    if claim.spec.deadline_at.is_some() {
        // A crash between the ready write and this one left an inert deadline; finish the move.
        clear_deadline(ctx, &name).await?;
    }
    let Some(slot) = ctx.slot(&claim.spec.slot_ref.name) else {
        return Ok(Action::requeue(std::time::Duration::from_secs(2)));
    };
    let node = ctx.core_node(&slot.spec.kubernetes_node_name);
    let kubelet = Kubelet::of(node.as_deref());
    let now = ctx.now();
    let machine = ReadyMachine {
        node_name: &slot.spec.kubernetes_node_name,
        kubelet: &kubelet,
        observed_off: claim
            .status
            .as_ref()
            .and_then(|s| s.machine_observed_off.as_ref())
            .map(|t| t.0),
        pin: claim.spec.request.call.is_pin(),
        now,
        off_grace: ctx.timeouts.budget(),
        not_ready_grace: ctx.not_ready_grace,
        reading: PowerReading::of(&slot),
        reading_max_age: ctx.meter_reading_max_age(),
    };
    match ready_bound::judge(&machine) {
        Verdict::Keep { mark, wake_at } => {
            let mark = match mark {
                OffMark::Keep => None,
                OffMark::Clear => Some(serde_json::Value::Null),
                OffMark::Set => Some(json!(Time(now))),
            };
            if let Some(mark) = mark {
                chokepoint::patch_status(
                    ctx,
                    claim,
                    FieldManager::ClaimController,
                    json!({ "machineObservedOff": mark }),
                )
                .await?;
            }
            Ok(expiry::wake(ctx, claim, wake_at))
        }
        Verdict::CutOff { mark, message, wake_at } => {
            if mark == OffMark::Clear {
                chokepoint::patch_status(
                    ctx,
                    claim,
                    FieldManager::ClaimController,
                    json!({ "machineObservedOff": serde_json::Value::Null }),
                )
                .await?;
            }
            ctx.publish(claim, EventType::Warning, ready_bound::MACHINE_CUT_OFF, message).await;
            Ok(expiry::wake(ctx, claim, Some(wake_at)))
        }
        Verdict::Fail { reason, message } => {
            let fail = PhaseMove::new(NodeClaimPhase::Failed, Writer::ClaimController)
                .because(reason, message);
            chokepoint::move_phase(ctx, claim, fail).await?;
            Ok(Action::await_change())
        }
    }
}

/// Clears `spec.deadlineAt`: the boot is over. Only the operator may do this (admission).
pub async fn clear_deadline(ctx: &Context, name: &str) -> Result<()> {
    Api::<NodeClaim>::namespaced(ctx.client.clone(), &ctx.namespace)
        .patch(
            name,
            &FieldManager::ClaimController.patch(),
            &Patch::Merge(&json!({ "spec": { "deadlineAt": null } })),
        )
        .await
        .during(|| format!("clearing the deadline of claim {name}"))?;
    Ok(())
}
