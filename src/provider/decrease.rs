//! NodeGroupDecreaseTargetSize: lower the target by cancelling claims that have not started a
//! boot. Cancelling a pending claim is deleting it, newest first: nothing of it is in flight,
//! since its startup Job is created only after its booting write, and the delete names the
//! resourceVersion it saw pending, so of the delete and the booting write exactly one lands
//! (docs/decisions.md, D35). A boot that has started is never interrupted, so a group whose
//! wanted claims are all booting or ready answers Unavailable, naming them: an error is what
//! cluster-autoscaler expects from a group that cannot lower its target without removing a
//! machine (it logs it and reads the target again), and the response carries no size. A pending
//! pin is not cancelled either: no scaler ends a pin (docs/decisions.md, D17), and it still
//! counts in the target.

use std::sync::Arc;

use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::ObjectRef;

use crate::api::{NodeClaim, NodeClaimPhase};
use crate::phase;

use super::error::ProviderError;
use super::groups::{GroupSnapshot, newest_first, phase_of};
use super::{Caller, Provider};

/// What a decrease did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecreaseOutcome {
    /// The claims deleted, newest first.
    pub cancelled: Vec<String>,
}

/// Which claims a decrease cancels.
#[derive(Clone, Debug, Default)]
pub struct DecreasePlan {
    /// How far the target is lowered.
    pub by: i32,
    /// Pending wanted claims to delete, newest first (at most `by`).
    pub cancel: Vec<Arc<NodeClaim>>,
}

/// Wanted claims by phase.
#[derive(Clone, Debug, Default)]
pub struct WantedByPhase {
    /// Pending claims a scaler may cancel (pins aside), newest first.
    pub cancelable: Vec<Arc<NodeClaim>>,
    /// Pending pins: wanted, never cancelled by a scaler.
    pub pinned: i32,
    pub booting: i32,
    pub ready: i32,
}

/// Sorts the group's wanted claims by phase.
pub fn wanted_by_phase(snapshot: &GroupSnapshot) -> WantedByPhase {
    let mut pending = Vec::new();
    let (mut pinned, mut booting, mut ready) = (0, 0, 0);
    for claim in snapshot.slots.iter().flat_map(|s| s.claims.iter()) {
        if !phase::wants_machine(phase_of(claim), phase::is_marked(claim)) {
            continue;
        }
        match phase::effective(phase_of(claim)) {
            NodeClaimPhase::Pending if claim.spec.request.call.is_pin() => pinned += 1,
            NodeClaimPhase::Pending => pending.push(claim.clone()),
            NodeClaimPhase::Booting => booting += 1,
            NodeClaimPhase::Ready => ready += 1,
            NodeClaimPhase::Completed | NodeClaimPhase::Failed => {}
        }
    }
    pending.sort_by(|a, b| newest_first(a, b));
    WantedByPhase { cancelable: pending, pinned, booting, ready }
}

/// Decides what a decrease cancels, or refuses it.
pub fn plan_decrease(snapshot: &GroupSnapshot, delta: i32) -> Result<DecreasePlan, ProviderError> {
    if delta >= 0 {
        return Err(ProviderError::InvalidDelta {
            call: "DecreaseTargetSize",
            delta,
            expected: "negative",
        });
    }
    let target = snapshot.wanted_count();
    if target == 0 {
        // Nothing is wanted: the group is already at any size it can be lowered to.
        return Ok(DecreasePlan::default());
    }
    let by = delta.saturating_neg();
    let min_size = snapshot.group.spec.min_size;
    if target.saturating_sub(by) < min_size {
        return Err(ProviderError::BelowMinSize {
            group: snapshot.name().to_owned(),
            target,
            by,
            min_size,
        });
    }
    let mut pending = wanted_by_phase(snapshot).cancelable;
    pending.truncate(usize::try_from(by).unwrap_or(usize::MAX));
    Ok(DecreasePlan { by, cancel: pending })
}

impl Provider {
    /// Cancels up to `-delta` pending claims of the group, newest first.
    #[tracing::instrument(skip(self, caller), fields(caller = %caller.requested_by))]
    pub async fn decrease_target_size(
        &self,
        caller: &Caller,
        group: &str,
        delta: i32,
    ) -> Result<DecreaseOutcome, ProviderError> {
        if delta >= 0 {
            return Err(ProviderError::InvalidDelta {
                call: "DecreaseTargetSize",
                delta,
                expected: "negative",
            });
        }
        let _writes = self.lock_writes().await;
        let snapshot = self.snapshot_for_write(caller, group).await?;
        let plan = plan_decrease(&snapshot, delta)?;
        let api: Api<NodeClaim> = Api::namespaced(self.client().clone(), &self.config().namespace);
        let mut cancelled = Vec::new();
        for claim in &plan.cancel {
            if let Some(name) = self.cancel_pending(&api, claim).await? {
                tracing::info!(claim = %name, "pending claim cancelled");
                cancelled.push(name);
            }
        }
        let namespace = &self.config().namespace;
        self.stores()
            .settle(self.config().settle_timeout, "claims cancelled", |stores| {
                cancelled.iter().all(|name| {
                    stores.claims.get(&ObjectRef::new(name).within(namespace)).is_none()
                })
            })
            .await;

        let done = super::groups::saturating_i32(cancelled.len());
        if done < plan.by {
            let left = wanted_by_phase(&self.snapshot_for_write(caller, group).await?);
            return Err(ProviderError::NothingCancelable {
                group: group.to_owned(),
                requested: plan.by,
                cancelled: done,
                booting: left.booting,
                ready: left.ready,
                pinned: left.pinned,
            });
        }
        Ok(DecreaseOutcome { cancelled })
    }

    /// Deletes a claim only while it is still the pending claim the plan saw: the delete carries
    /// its uid and resourceVersion, so a claim whose booting write landed first is left alone,
    /// and a booting write after the delete loses (docs/decisions.md, D35).
    async fn cancel_pending(
        &self,
        api: &Api<NodeClaim>,
        seen: &NodeClaim,
    ) -> Result<Option<String>, ProviderError> {
        let Some(name) = seen.metadata.name.clone() else { return Ok(None) };
        let mut current = seen.clone();
        // One retry: the cache may be a write behind the API server.
        for _ in 0..2 {
            if !phase::is_pending(phase_of(&current)) || phase::is_marked(&current) {
                return Ok(None);
            }
            let params = DeleteParams::default().preconditions(Preconditions {
                uid: current.metadata.uid.clone(),
                resource_version: current.metadata.resource_version.clone(),
            });
            match api.delete(&name, &params).await {
                Ok(_) => return Ok(Some(name)),
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Some(name)),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    match api.get_opt(&name).await {
                        Ok(Some(fresh)) => current = fresh,
                        Ok(None) => return Ok(Some(name)),
                        Err(source) => {
                            return Err(ProviderError::kube(
                                format!("re-reading claim {name}"),
                                source,
                            ));
                        }
                    }
                }
                Err(source) => {
                    return Err(ProviderError::kube(
                        format!("cancelling pending claim {name}"),
                        source,
                    ));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::groups::tests::{claim, group, marked, slot};
    use super::*;
    use NodeClaimPhase::*;

    fn snap(min_size: i32, claims: Vec<NodeClaim>) -> GroupSnapshot {
        let slots = vec![slot("a", "pool"), slot("b", "pool"), slot("c", "pool")];
        let claims: Vec<Arc<NodeClaim>> = claims.into_iter().map(Arc::new).collect();
        GroupSnapshot::build(group("pool", min_size), &slots, &claims, &HashSet::new())
    }

    fn names(plan: &DecreasePlan) -> Vec<&str> {
        plan.cancel.iter().filter_map(|c| c.metadata.name.as_deref()).collect()
    }

    #[test]
    fn the_newest_pending_claims_are_cancelled_first() {
        let s = snap(
            0,
            vec![
                claim("a-1", "a", None, "2026-03-04T09:00:00Z"),
                claim("b-1", "b", Some(Pending), "2026-03-04T09:05:00Z"),
                claim("c-1", "c", Some(Booting), "2026-03-04T09:10:00Z"),
            ],
        );
        assert_eq!(names(&plan_decrease(&s, -1).unwrap()), ["b-1"]);
        assert_eq!(names(&plan_decrease(&s, -3).unwrap()), ["b-1", "a-1"]);
    }

    #[test]
    fn a_pending_pin_is_never_cancelled() {
        use crate::api::ClaimCall;
        let pin = |name: &str, slot: &str, call: ClaimCall, created: &str| {
            let mut c = claim(name, slot, Some(Pending), created);
            c.spec.request.call = call;
            c.spec.request.delta = None;
            c
        };
        // (claims, delta, cancelled, pinned counted)
        let table = [
            (
                vec![
                    pin("a-1", "a", ClaimCall::Manual, "2026-03-04T09:10:00Z"),
                    claim("b-1", "b", Some(Pending), "2026-03-04T09:00:00Z"),
                ],
                -1,
                vec!["b-1"],
                1,
            ),
            (
                vec![
                    pin("a-1", "a", ClaimCall::Schedule, "2026-03-04T09:10:00Z"),
                    pin("b-1", "b", ClaimCall::Manual, "2026-03-04T09:00:00Z"),
                ],
                -2,
                vec![],
                2,
            ),
        ];
        for (claims, delta, cancelled, pinned) in table {
            let s = snap(0, claims);
            assert_eq!(names(&plan_decrease(&s, delta).unwrap()), cancelled, "delta {delta}");
            assert_eq!(wanted_by_phase(&s).pinned, pinned, "delta {delta}");
        }
    }

    #[test]
    fn refusals_and_no_ops() {
        let all_committed = snap(
            0,
            vec![
                claim("a-1", "a", Some(Booting), "2026-03-04T09:00:00Z"),
                claim("b-1", "b", Some(Ready), "2026-03-04T09:00:00Z"),
                marked(claim("c-1", "c", Some(Pending), "2026-03-04T09:00:00Z")),
            ],
        );
        let plan = plan_decrease(&all_committed, -1).unwrap();
        assert!(plan.cancel.is_empty(), "a marked pending claim is not wanted, so not cancelled");
        assert_eq!(wanted_by_phase(&all_committed).booting, 1);
        assert_eq!(wanted_by_phase(&all_committed).ready, 1);

        assert!(matches!(
            plan_decrease(&all_committed, 0),
            Err(ProviderError::InvalidDelta { .. })
        ));
        assert!(matches!(
            plan_decrease(&all_committed, 2),
            Err(ProviderError::InvalidDelta { .. })
        ));

        let floored = snap(1, vec![claim("a-1", "a", Some(Pending), "2026-03-04T09:00:00Z")]);
        assert!(matches!(
            plan_decrease(&floored, -1),
            Err(ProviderError::BelowMinSize { target: 1, by: 1, min_size: 1, .. })
        ));

        let empty = snap(2, vec![claim("a-1", "a", Some(Failed), "2026-03-04T09:00:00Z")]);
        let plan = plan_decrease(&empty, -1).unwrap();
        assert!(plan.cancel.is_empty() && plan.by == 0, "no live claim: already at size");
    }
}
