//! NodeGroupIncreaseSize: `delta` new claims on `delta` free slots, in one call. A free slot
//! has no live claim; the provider picks among them (see [`super::slot_choice`]) and refuses,
//! before writing anything, a request the pool cannot meet: more machines than slots, or not
//! enough free slots that may boot now. Provisioning continues after the call returns. A call
//! from a new cluster-autoscaler connection first takes over boots an earlier one started
//! ([`super::adoption`]).

use jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch};
use kube::runtime::reflector::ObjectRef;

use crate::api::NodeClaim;
use crate::field_manager::FieldManager;
use crate::ups::boots::Limit;

use super::adoption::{SESSION_ANNOTATION, to_adopt};
use super::claim_object::{ClaimIntent, new_claim};
use super::error::ProviderError;
use super::groups::GroupSnapshot;
use super::slot_choice::{ChosenSlot, SlotCandidate, candidate, choose};
use super::{Caller, Provider};

/// A claim IncreaseSize created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedClaim {
    pub name: String,
    pub slot: String,
    pub attempt: i32,
}

/// A slot to claim and the sentence that explains the choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedClaim {
    pub slot: ChosenSlot,
    pub choice: String,
}

/// How much more per hour a machine asleep may cost and still be woken first (the Group's
/// `asleepPriceMargin`).
pub fn asleep_margin(snapshot: &GroupSnapshot) -> f64 {
    snapshot.group.spec.asleep_price_margin.unwrap_or(0.0)
}

/// Decides which slots an IncreaseSize claims, or why it cannot.
pub fn plan_increase(
    snapshot: &GroupSnapshot,
    delta: i32,
    now: Timestamp,
) -> Result<Vec<PlannedClaim>, ProviderError> {
    plan_increase_among(snapshot, delta, now, None)
}

/// [`plan_increase`], choosing only among the slots named in `among` when given (a pod only
/// those machines can run, see `scaler::bound_pods`).
pub fn plan_increase_among(
    snapshot: &GroupSnapshot,
    delta: i32,
    now: Timestamp,
    among: Option<&[String]>,
) -> Result<Vec<PlannedClaim>, ProviderError> {
    if delta <= 0 {
        return Err(ProviderError::InvalidDelta {
            call: "IncreaseSize",
            delta,
            expected: "positive",
        });
    }
    if let Some(held) = crate::ups::boots::boot_room(&snapshot.group, snapshot.booting_count(), now)
        && delta > held.room
    {
        let group = snapshot.name().to_owned();
        return Err(match held.limit {
            Limit::OnBattery(why) => ProviderError::OnBattery { group, why },
            Limit::Staggered(stagger) => ProviderError::StaggeredReturn {
                group,
                delta,
                room: stagger.room,
                at_once: stagger.at_once,
                until: stagger.until,
            },
        });
    }
    let (slots, live) = (snapshot.slot_count(), snapshot.live_count());
    if live.saturating_add(delta) > slots {
        return Err(ProviderError::OverCapacity {
            group: snapshot.name().to_owned(),
            slots,
            live,
            delta,
        });
    }
    let candidates: Vec<SlotCandidate> = snapshot
        .slots
        .iter()
        .filter(|s| s.is_free())
        .filter(|s| among.is_none_or(|names| names.iter().any(|n| n == s.name())))
        .map(|s| candidate(s, &snapshot.group.spec, now))
        .collect();
    let wanted = usize::try_from(delta).unwrap_or(usize::MAX);
    let chosen = choose(&candidates, wanted, asleep_margin(snapshot)).map_err(|shortfall| {
        ProviderError::NotEnoughFreeSlots {
            group: snapshot.name().to_owned(),
            wanted: delta,
            bootable: shortfall.bootable,
            exhausted: shortfall.exhausted,
        }
    })?;
    let free = candidates.len();
    Ok(chosen
        .into_iter()
        .enumerate()
        .map(|(rank, slot)| {
            let chosen = candidates.iter().find(|c| c.name == slot.name);
            let rate = chosen
                .and_then(|c| c.hourly_rate)
                .map_or_else(|| "unpriced".to_owned(), |r| format!("hourlyRate {r}"));
            let waited = if chosen.is_some_and(|c| c.awaited) {
                "pending pods wait for this machine, "
            } else {
                ""
            };
            let choice = format!(
                "slot {} picked as choice {} of {free} free slots (not exhausted, waited for by \
                 pending pods first, cheapest first, then fewest recent failures, then name): \
                 {waited}{rate}, {} recent failed boots",
                slot.name,
                rank + 1,
                slot.attempt - 1,
            );
            PlannedClaim { slot, choice }
        })
        .collect())
}

impl Provider {
    /// Claims `delta` free slots of the group. All or nothing: if a create fails, the claims
    /// this call already created are deleted again (they are pending, so nothing is in flight).
    #[tracing::instrument(skip(self, caller), fields(caller = %caller.requested_by))]
    pub async fn increase_size(
        &self,
        caller: &Caller,
        group: &str,
        delta: i32,
    ) -> Result<Vec<CreatedClaim>, ProviderError> {
        self.increase(caller, group, delta, None).await
    }

    /// Claims one of the free slots named in `among`, picked as IncreaseSize picks: for a pod
    /// only those machines can run. The claim is an IncreaseSize of +1 like any other.
    #[tracing::instrument(skip(self, caller), fields(caller = %caller.requested_by))]
    pub async fn claim_one_of(
        &self,
        caller: &Caller,
        group: &str,
        among: &[String],
    ) -> Result<CreatedClaim, ProviderError> {
        let created = self.increase(caller, group, 1, Some(among)).await?;
        created.into_iter().next().ok_or_else(|| ProviderError::NotEnoughFreeSlots {
            group: group.to_owned(),
            wanted: 1,
            bootable: 0,
            exhausted: Vec::new(),
        })
    }

    async fn increase(
        &self,
        caller: &Caller,
        group: &str,
        delta: i32,
        among: Option<&[String]>,
    ) -> Result<Vec<CreatedClaim>, ProviderError> {
        if delta <= 0 {
            return Err(ProviderError::InvalidDelta {
                call: "IncreaseSize",
                delta,
                expected: "positive",
            });
        }
        let _writes = self.lock_writes().await;
        let snapshot = self.snapshot_for_write(caller, group).await?;
        // Times are stored with second precision; deciding with the stored value keeps
        // requestedAt and deadlineAt exactly the budget apart.
        let now = Timestamp::from_second(Timestamp::now().as_second())
            .unwrap_or_else(|_| Timestamp::now());
        let adopt = match &caller.session {
            Some(session) => to_adopt(&snapshot, &caller.requested_by, session, delta),
            None => Vec::new(),
        };
        let remaining = delta.saturating_sub(super::groups::saturating_i32(adopt.len()));
        // Decided in full before anything is written: a request the pool cannot meet changes
        // nothing.
        let plan = if remaining > 0 {
            plan_increase_among(&snapshot, remaining, now, among)?
        } else {
            Vec::new()
        };

        let api: Api<NodeClaim> = Api::namespaced(self.client().clone(), &self.config().namespace);
        if let Some(session) = &caller.session {
            self.adopt(&api, &adopt, session).await?;
            if !adopt.is_empty() {
                tracing::info!(
                    group,
                    delta,
                    adopted = adopt.len(),
                    creating = plan.len(),
                    "IncreaseSize from a new cluster-autoscaler connection took over boots an earlier one started"
                );
            }
        }
        let mut created: Vec<CreatedClaim> = Vec::with_capacity(plan.len());
        for planned in &plan {
            let Some(state) = snapshot.slot(&planned.slot.name) else { continue };
            let claim = new_claim(&ClaimIntent {
                slot: &state.slot,
                group: &snapshot.group,
                delta,
                caller,
                attempt: planned.slot.attempt,
                requested_at: now,
                timeouts: self.config().timeouts,
                choice: &planned.choice,
            });
            match api.create(&FieldManager::Provider.post(), &claim).await {
                Ok(made) => {
                    let name = made.metadata.name.unwrap_or_default();
                    tracing::info!(claim = %name, choice = %planned.choice, "claim created");
                    created.push(CreatedClaim {
                        name,
                        slot: planned.slot.name.clone(),
                        attempt: planned.slot.attempt,
                    });
                }
                Err(source) => {
                    self.roll_back(&api, &created).await;
                    return Err(ProviderError::kube(
                        format!(
                            "creating a claim for slot {} of group {group} (IncreaseSize +{delta}; \
                             {} created and rolled back)",
                            planned.slot.name,
                            created.len()
                        ),
                        source,
                    ));
                }
            }
        }

        let namespace = &self.config().namespace;
        self.stores()
            .settle(self.config().settle_timeout, "claims created", |stores| {
                created.iter().all(|c| {
                    stores.claims.get(&ObjectRef::new(&c.name).within(namespace)).is_some()
                })
            })
            .await;
        Ok(created)
    }

    /// Records `session` on claims an earlier cluster-autoscaler connection started.
    async fn adopt(
        &self,
        api: &Api<NodeClaim>,
        claims: &[std::sync::Arc<NodeClaim>],
        session: &str,
    ) -> Result<(), ProviderError> {
        for claim in claims {
            let name = claim.metadata.name.clone().unwrap_or_default();
            let patch = serde_json::json!({ "metadata": { "annotations": { SESSION_ANNOTATION: session } } });
            api.patch(&name, &FieldManager::Provider.patch(), &Patch::Merge(&patch))
                .await
                .map_err(|source| {
                    ProviderError::kube(
                        format!("taking over claim {name} for session {session}"),
                        source,
                    )
                })?;
        }
        Ok(())
    }

    async fn roll_back(&self, api: &Api<NodeClaim>, created: &[CreatedClaim]) {
        for claim in created {
            if let Err(error) = api.delete(&claim.name, &DeleteParams::default()).await {
                tracing::warn!(claim = %claim.name, %error, "could not roll back a created claim");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::super::groups::tests::{claim, group, slot};
    use super::*;
    use crate::api::{NodeClaimPhase, Pricing};

    fn priced(name: &str, rate: f64) -> Arc<super::super::Slot> {
        let mut s = (*slot(name, "pool")).clone();
        s.spec.pricing = Some(Pricing { hourly_rate: rate, pod_rate: 0.0 });
        Arc::new(s)
    }

    fn now() -> Timestamp {
        "2026-03-04T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn two_of_three_slots_go_to_the_two_cheapest() {
        let slots = vec![priced("server", 0.9), priced("nuc", 0.05), priced("pi", 0.01)];
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &[], &HashSet::new());
        let plan = plan_increase(&snap, 2, now()).unwrap();
        let names: Vec<&str> = plan.iter().map(|p| p.slot.name.as_str()).collect();
        assert_eq!(names, ["pi", "nuc"]);
        assert!(plan[0].choice.contains("choice 1 of 3"), "{}", plan[0].choice);
    }

    #[test]
    fn the_power_refuses_boots_on_battery_and_beyond_a_staggered_return() {
        use crate::api::{GroupPowerStatus, GroupStatus, PowerSource};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let pool = |source: PowerSource, returned: Option<Timestamp>| {
            let mut g = (*group("pool", 0)).clone();
            g.spec.ups = serde_json::from_value(
                serde_json::json!({ "name": "ups@nut", "onMains": { "bootsAtOnce": 2 } }),
            )
            .expect("a UPS policy");
            g.status = Some(GroupStatus {
                power: Some(GroupPowerStatus {
                    ups: "ups@nut".into(),
                    source,
                    read_at: Some(Time(now())),
                    mains_returned_at: returned.map(Time),
                    ..GroupPowerStatus::default()
                }),
                ..GroupStatus::default()
            });
            Arc::new(g)
        };
        let slots = vec![priced("a", 1.0), priced("b", 1.0), priced("c", 1.0)];
        let plan = |group, delta| {
            let snap = GroupSnapshot::build(group, &slots, &[], &HashSet::new());
            plan_increase(&snap, delta, now())
        };
        let refused = plan(pool(PowerSource::Battery, None), 1).unwrap_err();
        assert!(matches!(refused, ProviderError::OnBattery { .. }), "{refused}");
        assert_eq!(refused.kind(), super::super::error::ErrorKind::Unavailable);
        assert!(refused.to_string().contains("runs on battery"), "{refused}");
        let returning = Some(now());
        assert_eq!(plan(pool(PowerSource::Mains, returning), 2).map(|p| p.len()).ok(), Some(2));
        let over = plan(pool(PowerSource::Mains, returning), 3).unwrap_err();
        assert!(over.to_string().contains("at most 2 of its machines boot at once"), "{over}");
        assert_eq!(over.kind(), super::super::error::ErrorKind::Unavailable);
        assert_eq!(plan(pool(PowerSource::Mains, None), 3).map(|p| p.len()).ok(), Some(3));
    }

    #[test]
    fn refusals() {
        let slots = vec![priced("a", 1.0), priced("b", 1.0)];
        let busy = vec![Arc::new(claim(
            "a-1",
            "a",
            Some(NodeClaimPhase::Booting),
            "2026-03-04T09:00:00Z",
        ))];
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &busy, &HashSet::new());
        assert!(matches!(
            plan_increase(&snap, 0, now()),
            Err(ProviderError::InvalidDelta { delta: 0, .. })
        ));
        assert!(matches!(
            plan_increase(&snap, 2, now()),
            Err(ProviderError::OverCapacity { slots: 2, live: 1, delta: 2, .. })
        ));
        let plan = plan_increase(&snap, 1, now()).unwrap();
        assert_eq!(plan[0].slot.name, "b", "the busy slot is not free");
    }

    #[test]
    fn a_slot_pending_pods_wait_for_boots_before_a_cheaper_one() {
        let mut nas = (*priced("nas", 0.08)).clone();
        nas.status = Some(crate::api::NodeStatus {
            waiting_pods: vec!["default/db-0".into()],
            ..Default::default()
        });
        let slots = vec![priced("pi", 0.01), Arc::new(nas), priced("nuc", 0.05)];
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &[], &HashSet::new());
        let plan = plan_increase(&snap, 2, now()).unwrap();
        let names: Vec<&str> = plan.iter().map(|p| p.slot.name.as_str()).collect();
        assert_eq!(names, ["nas", "pi"]);
        assert!(
            plan[0].choice.contains("pending pods wait for this machine"),
            "{}",
            plan[0].choice
        );
        assert!(
            !plan[1].choice.contains("pending pods wait for this machine"),
            "{}",
            plan[1].choice
        );
    }

    #[test]
    fn among_limits_the_choice_and_keeps_its_order() {
        let slots = vec![priced("server", 0.9), priced("nuc", 0.05), priced("pi", 0.01)];
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &[], &HashSet::new());
        let among = ["server".to_owned(), "nuc".to_owned()];
        let plan = plan_increase_among(&snap, 1, now(), Some(&among)).unwrap();
        assert_eq!(plan[0].slot.name, "nuc", "the cheaper of the two named");
        assert!(matches!(
            plan_increase_among(&snap, 1, now(), Some(&[])),
            Err(ProviderError::NotEnoughFreeSlots { bootable: 0, .. })
        ));
    }
}
