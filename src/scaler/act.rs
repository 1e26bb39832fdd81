//! Carrying a decision out, only through the provider core: Provision is IncreaseSize, a
//! scale-in or teardown is DeleteNodes, so the scaler's claims look like cluster-autoscaler's
//! except for `requestedBy: homelab-autoscaler/scaler` and the decision's reason in
//! `spec.request.reason`. The scaler never writes a claim itself.

use super::decide::{Action, Decision};
use super::error::ScalerError;
use super::pool_view::Machine;
use crate::provider::{Caller, NodeRef, Provider, ProviderError};

/// What a decision did, for the pass's log line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acted {
    /// Claims created.
    pub created: Vec<String>,
    /// Claims marked and deleted.
    pub released: Vec<String>,
}

/// Carries out `decision` for `group`.
pub async fn act(
    provider: &Provider,
    group: &str,
    decision: &Decision,
) -> Result<Acted, ScalerError> {
    let caller = Caller::builtin_scaler(decision.reason.clone());
    let failed = |action: &'static str| {
        move |source| ScalerError::Act { group: group.to_owned(), action, source }
    };
    match &decision.action {
        Action::None => Ok(Acted::default()),
        Action::Provision { add } => {
            // Coming back from an outage, the pool boots a few at a time: the decision stands,
            // and the next passes add the rest as boots finish.
            let (add, caller) = match provider.stagger_room(group) {
                Some(stagger) if stagger.room < *add => {
                    if stagger.room == 0 {
                        return Ok(Acted::default());
                    }
                    let fewer = Caller::builtin_scaler(format!(
                        "{}; {} of {add} now: the pool boots at most {} at once until {} after \
                         a power outage",
                        decision.reason, stagger.room, stagger.at_once, stagger.until
                    ));
                    (stagger.room, fewer)
                }
                _ => (*add, caller),
            };
            let add = &add;
            let created = match provider.increase_size(&caller, group, *add).await {
                // IncreaseSize is all or nothing; slots exhausted by failed boots must not keep
                // the pool from the machines that can boot.
                Err(ProviderError::NotEnoughFreeSlots { bootable, .. })
                    if bootable > 0 && bootable < *add =>
                {
                    let fewer = Caller::builtin_scaler(format!(
                        "{}; {bootable} of {add} can boot now, the other slots are exhausted",
                        decision.reason
                    ));
                    provider.increase_size(&fewer, group, bootable).await
                }
                other => other,
            }
            .map_err(failed("IncreaseSize"))?;
            Ok(Acted { created: created.into_iter().map(|c| c.name).collect(), ..Acted::default() })
        }
        Action::ScaleIn { machine } => {
            release(provider, &caller, group, std::slice::from_ref(machine)).await
        }
        Action::Teardown { machines } => release(provider, &caller, group, machines).await,
    }
}

async fn release(
    provider: &Provider,
    caller: &Caller,
    group: &str,
    machines: &[Machine],
) -> Result<Acted, ScalerError> {
    if machines.is_empty() {
        return Ok(Acted::default());
    }
    let nodes: Vec<NodeRef> = machines.iter().map(node_ref).collect();
    let outcome = provider.delete_nodes(caller, group, &nodes).await.map_err(|source| {
        ScalerError::Act { group: group.to_owned(), action: "DeleteNodes", source }
    })?;
    Ok(Acted { released: outcome.released, ..Acted::default() })
}

/// The node of a machine as DeleteNodes identifies it: by providerID, else by name, which also
/// finds a machine that has not registered yet.
pub fn node_ref(machine: &Machine) -> NodeRef {
    NodeRef {
        provider_id: machine.provider_id.clone(),
        name: machine.node.clone(),
        ..NodeRef::default()
    }
}
