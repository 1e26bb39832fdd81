//! Carrying out a [`Plan`] of [`super::bound_pods`]: each wake is one claim through the provider
//! (`claim_one_of`, an IncreaseSize of +1 among the slots the pod fits), attributed to the pod;
//! each slot's `status.localVolumes` says which running pods' data it holds; a slot newly
//! refused for a pod gets a Warning, as does the pod. A failure is logged and left to the next
//! pass, which plans again from what it then sees.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::json;

use super::bound_pods::Plan;
use super::refusals::REASON;
use crate::api::Node as Slot;
use crate::field_manager::{FieldManager, apply_status_of};
use crate::provider::{Caller, GroupSnapshot, Provider};

/// The event reason on a pending pod that no machine may be woken for now.
pub const AT_MAX_NODES: &str = "WaitingForMaxNodes";

/// Says on each pod the plan found blocked, once while it stays blocked, why no machine is
/// woken for it; `before` holds the pods blocked in the previous pass and is replaced.
pub async fn report_blocked(recorder: &Recorder, plan: &Plan, before: &mut HashSet<String>) {
    let now: HashSet<String> = plan.blocked.iter().map(|b| b.name.clone()).collect();
    for blocked in plan.blocked.iter().filter(|b| !before.contains(&b.name)) {
        tracing::info!(pod = %blocked.name, why = %blocked.why,
            "a pending pod only some machines can run waits: none may boot now");
        let note = format!(
            "no machine is woken for pod {}: {}. It waits until a machine of the pool is \
             released, or the Group's maxNodes is raised.",
            blocked.name, blocked.why
        );
        warn(recorder, &blocked.pod, AT_MAX_NODES, note).await;
    }
    *before = now;
}

/// Creates the plan's claims; returns their names.
pub async fn wake(provider: &Provider, plan: &Plan) -> Vec<String> {
    let mut created = Vec::new();
    for wake in &plan.wakes {
        let caller = Caller::for_bound_pod(wake.driver, &wake.pod, wake.reason.clone());
        match provider.claim_one_of(&caller, &wake.group, &wake.slots).await {
            Ok(claim) => {
                tracing::info!(
                    claim = %claim.name,
                    slot = %claim.slot,
                    group = %wake.group,
                    pod = %wake.pod,
                    reason = %wake.reason,
                    "woke the machine a pending pod needs"
                );
                created.push(claim.name);
            }
            Err(error) => tracing::warn!(
                %error,
                group = %wake.group,
                pod = %wake.pod,
                "could not wake the machine a pending pod needs; the next pass retries"
            ),
        }
    }
    created
}

/// Says on the pod and on the slot that a slot was refused for the pod; a failure to publish
/// is logged, never fatal (the refusal holds either way).
pub async fn report_refused(recorder: &Recorder, plan: &Plan) {
    for refused in &plan.refused {
        tracing::warn!(pod = ?refused.pod.name, slot = ?refused.slot.name, note = %refused.note,
            "a woken machine cannot run the pod it was woken for; not waking it for that pod again");
        for object in [&refused.pod, &refused.slot] {
            warn(recorder, object, REASON, refused.note.clone()).await;
        }
    }
}

/// Publishes a Warning of `reason` on `object`; a failure is logged, never fatal.
async fn warn(recorder: &Recorder, object: &ObjectReference, reason: &str, note: String) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: "Wake".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, object).await {
        tracing::warn!(%error, object = ?object.name, reason, "publishing an event failed");
    }
}

/// Brings every slot's `status.localVolumes` to what the plan found, writing only the slots whose
/// list changed.
pub async fn report_holding(
    client: &Client,
    namespace: &str,
    pools: &[&GroupSnapshot],
    plan: &Plan,
) {
    let api: Api<Slot> = Api::namespaced(client.clone(), namespace);
    for state in pools.iter().flat_map(|p| p.slots.iter()) {
        let name = state.name();
        let wanted = plan.holding.get(name).cloned().unwrap_or_default();
        let current =
            state.slot.status.as_ref().map(|s| s.local_volumes.clone()).unwrap_or_default();
        if wanted == current {
            continue;
        }
        let previous = json!({ "localVolumes": current });
        let status = if wanted.is_empty() {
            json!({ "localVolumes": null })
        } else {
            json!({ "localVolumes": wanted })
        };
        match apply_status_of(&api, name, FieldManager::Scaler, Some(&previous), status).await {
            Ok(_) => {
                tracing::info!(slot = name, holding = wanted.len(), "status.localVolumes written")
            }
            Err(error) => {
                tracing::warn!(%error, slot = name, "writing status.localVolumes; the next pass retries")
            }
        }
    }
}
