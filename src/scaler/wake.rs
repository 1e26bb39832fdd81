//! Carrying out a [`Plan`] of [`super::bound_pods`]: each wake is one claim through the provider
//! (`claim_one_of`, an IncreaseSize of +1 among the slots the pod fits), attributed to the pod;
//! each slot's `status.localVolumes` says which running pods' data it holds. A failure is logged
//! and left to the next pass, which plans again from what it then sees.

use kube::Client;
use kube::api::Api;
use serde_json::json;

use super::bound_pods::Plan;
use crate::api::Node as Slot;
use crate::field_manager::{FieldManager, apply_status_of};
use crate::provider::{Caller, GroupSnapshot, Provider};

/// Creates the plan's claims; returns their names.
pub async fn wake(provider: &Provider, plan: &Plan) -> Vec<String> {
    for (pod, why) in &plan.blocked {
        tracing::info!(%pod, %why, "a pending pod only some machines can run waits: none may boot now");
    }
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
