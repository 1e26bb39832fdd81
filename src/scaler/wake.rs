//! Carrying out a [`Plan`] of [`super::bound_pods`]: each wake is one claim through the provider
//! (`claim_one_of`, an IncreaseSize of +1 among the slots the pod fits), attributed to the pod;
//! each slot's `status.localVolumes` says which running pods' data it holds, and its
//! `status.waitingPods` which pending pods wait for it while the pool's power holds their wake
//! back (the pool's next boot, cluster-autoscaler's too, picks that slot first); a slot newly
//! refused for a pod gets a Warning, as does the pod. A failure is logged and left to the next
//! pass, which plans again from what it then sees.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::json;

use super::bound_pods::Plan;
use super::refusals::REASON;
use crate::api::Node as Slot;
use crate::field_manager::{FieldManager, apply_status_of};
use crate::provider::{Caller, GroupSnapshot, Provider, ProviderError};

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

/// What [`wake`] did.
#[derive(Debug, Default)]
pub struct Woken {
    /// The claims created.
    pub created: Vec<String>,
    /// By slot: the pending pods whose wake the pool's power held back (on battery, or a
    /// staggered return), for the slot's `status.waitingPods`.
    pub held_back: BTreeMap<String, Vec<String>>,
}

/// Creates the plan's claims.
pub async fn wake(provider: &Provider, plan: &Plan) -> Woken {
    let mut woken = Woken::default();
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
                woken.created.push(claim.name);
            }
            // The power's refusal is the slot's to show (status.waitingPods); the pool's next
            // boot picks the slot first.
            Err(
                error @ (ProviderError::OnBattery { .. } | ProviderError::StaggeredReturn { .. }),
            ) => {
                tracing::debug!(%error, group = %wake.group, pod = %wake.pod,
                    "the pool's power holds back the wake of a machine a pending pod needs");
                for slot in &wake.slots {
                    woken.held_back.entry(slot.clone()).or_default().push(wake.pod.clone());
                }
            }
            Err(error) => tracing::warn!(
                %error,
                group = %wake.group,
                pod = %wake.pod,
                "could not wake the machine a pending pod needs; the next pass retries"
            ),
        }
    }
    woken
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

/// Brings every slot's `status.localVolumes` to what the plan found and its
/// `status.waitingPods` to the pods whose wake the power held back, in one apply of the
/// scaler's two fields, writing only the slots where either changed.
pub async fn report_slots(
    client: &Client,
    namespace: &str,
    pools: &[&GroupSnapshot],
    plan: &Plan,
    held_back: &BTreeMap<String, Vec<String>>,
) {
    let api: Api<Slot> = Api::namespaced(client.clone(), namespace);
    for state in pools.iter().flat_map(|p| p.slots.iter()) {
        let name = state.name();
        let holding = plan.holding.get(name).cloned().unwrap_or_default();
        let mut waiting = held_back.get(name).cloned().unwrap_or_default();
        waiting.sort();
        waiting.dedup();
        let status = state.slot.status.as_ref();
        let current_holding = status.map(|s| s.local_volumes.clone()).unwrap_or_default();
        let current_waiting = status.map(|s| s.waiting_pods.clone()).unwrap_or_default();
        if holding == current_holding && waiting == current_waiting {
            continue;
        }
        let previous = json!({ "localVolumes": current_holding, "waitingPods": current_waiting });
        let or_null = |value: serde_json::Value, empty: bool| {
            if empty { serde_json::Value::Null } else { value }
        };
        let status = json!({
            "localVolumes": or_null(json!(holding), holding.is_empty()),
            "waitingPods": or_null(json!(waiting), waiting.is_empty()),
        });
        match apply_status_of(&api, name, FieldManager::Scaler, Some(&previous), status).await {
            Ok(_) => tracing::info!(
                slot = name,
                holding = holding.len(),
                waiting = waiting.len(),
                "status.localVolumes and status.waitingPods written"
            ),
            Err(error) => tracing::warn!(%error, slot = name,
                "writing status.localVolumes and status.waitingPods; the next pass retries"),
        }
    }
}
