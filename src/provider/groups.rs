//! Which groups a caller scales and what each one holds: its slots (by the `group=<name>`
//! label), the claims that name each slot, and whether each slot's machine has registered a
//! Kubernetes node. Built from the reflector stores in one pass; everything else in the provider
//! reads this snapshot, so a call sees one consistent state.

use std::cmp::Ordering;
use std::collections::HashSet;

use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::api::{Group, NodeClaim, NodeClaimPhase, ScalingDriver};
use crate::{machine, phase};

use super::Slot;

/// A node group as an autoscaler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGroupInfo {
    /// The Group's name.
    pub id: String,
    /// The Group's minSize.
    pub min_size: i32,
    /// The number of slots in the Group: a pool cannot grow past its machines.
    pub max_size: i32,
    /// One line for the autoscaler's logs.
    pub debug: String,
}

/// The name a driver goes by in messages and in `spec.driver`.
pub fn driver_name(driver: ScalingDriver) -> &'static str {
    match driver {
        ScalingDriver::ClusterAutoscaler => "cluster-autoscaler",
        ScalingDriver::Builtin => "builtin",
    }
}

/// The id cluster-autoscaler knows the slot's machine by (see [`machine::instance_id`]).
pub fn provider_id_of(slot: &Slot) -> String {
    machine::instance_id(slot)
}

/// The slot's name (its metadata name, which equals `spec.kubernetesNodeName`).
pub fn slot_name(slot: &Slot) -> &str {
    slot.metadata.name.as_deref().unwrap_or(&slot.spec.kubernetes_node_name)
}

/// The group a slot joins by its label, if any.
pub fn group_of(slot: &Slot) -> Option<&str> {
    slot.group()
}

/// Orders claims newest first: by `spec.requestedAt`, then creation time, then name, so the
/// order is total and the same in every replica.
pub fn newest_first(a: &NodeClaim, b: &NodeClaim) -> Ordering {
    let requested = |c: &NodeClaim| c.spec.requested_at.as_ref().map(|t| t.0);
    let created = |c: &NodeClaim| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
    requested(b)
        .cmp(&requested(a))
        .then_with(|| created(b).cmp(&created(a)))
        .then_with(|| b.metadata.name.cmp(&a.metadata.name))
}

/// cluster-autoscaler has been told about this failure (DeleteNodes) and no longer needs to
/// see it.
pub fn is_acknowledged(claim: &NodeClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.failure_acknowledged_at.is_some())
}

/// One slot of a group with the claims that name it.
#[derive(Clone, Debug)]
pub struct SlotState {
    pub slot: Arc<Slot>,
    /// Every claim naming this slot, newest first.
    pub claims: Vec<Arc<NodeClaim>>,
    /// A Kubernetes node named after the slot exists: the machine has registered.
    pub registered: bool,
    /// That node says the machine sleeps (suspended to RAM): free, and quick to wake.
    pub asleep: bool,
}

/// What the caches hold of the Kubernetes node of a slot's machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSeen {
    Absent,
    Registered,
    /// Registered, and marked asleep (`Suspended=True`).
    Asleep,
}

impl NodeSeen {
    /// What the node says, read from a cached node.
    pub fn of(node: Option<&k8s_openapi::api::core::v1::Node>) -> Self {
        match node {
            None => Self::Absent,
            Some(node) if machine::is_suspended(node) => Self::Asleep,
            Some(_) => Self::Registered,
        }
    }
}

impl SlotState {
    pub fn name(&self) -> &str {
        slot_name(&self.slot)
    }

    /// The newest live claim: the one that holds the slot (marked or not).
    pub fn live_claim(&self) -> Option<&Arc<NodeClaim>> {
        self.claims.iter().find(|c| phase::is_live(phase_of(c)))
    }

    /// No live claim: the only shape IncreaseSize may claim.
    pub fn is_free(&self) -> bool {
        self.live_claim().is_none()
    }

    /// A live claim not marked for scale-down: the slot counts towards the target size.
    pub fn is_wanted(&self) -> bool {
        self.claims.iter().any(|c| phase::wants_machine(phase_of(c), phase::is_marked(c)))
    }

    /// The newest claim of any phase.
    pub fn newest_claim(&self) -> Option<&Arc<NodeClaim>> {
        self.claims.first()
    }

    /// A failed boot cluster-autoscaler has not acknowledged yet (DeleteNodes): with no live
    /// claim, the newest claim failed and is neither deleted nor acknowledged. It is listed as a
    /// creating instance with its error and counts in the target size, as a cloud's failed
    /// instance counts in its desired size until the autoscaler deletes it.
    pub fn unacknowledged_failure(&self) -> Option<&Arc<NodeClaim>> {
        if self.live_claim().is_some() {
            return None;
        }
        self.newest_claim().filter(|c| {
            phase_of(c) == Some(NodeClaimPhase::Failed)
                && c.metadata.deletion_timestamp.is_none()
                && !is_acknowledged(c)
        })
    }

    pub fn instance_id(&self) -> String {
        provider_id_of(&self.slot)
    }
}

/// The phase field of a claim (absent reads as pending in every predicate of `phase`).
pub fn phase_of(claim: &NodeClaim) -> Option<crate::api::NodeClaimPhase> {
    claim.status.as_ref().and_then(|s| s.phase)
}

/// A namespace's slots and claims, indexed once: slots by their group label, claims by the slot
/// they name. Every group's snapshot taken from it reads only its own slots and claims, so
/// NodeGroups costs one pass over the pool rather than one per group, and a slot's claims are
/// found by a lookup rather than by comparing every claim's slot name (1000 slots × 200 claims
/// per call at 1000 slots, see docs/performance.md).
///
/// The maps hash with FxHash: names are hashed on every call, and SipHash (std's default, which
/// resists hash flooding this index does not face: the names are the operator's own objects) was
/// the largest item in NodeGroups' CPU profile at 1000 slots.
pub struct PoolIndex<'a> {
    slots_by_group: FxHashMap<&'a str, Vec<&'a Arc<Slot>>>,
    claims_by_slot: FxHashMap<&'a str, Vec<&'a Arc<NodeClaim>>>,
}

impl<'a> PoolIndex<'a> {
    pub fn new(slots: &'a [Arc<Slot>], claims: &'a [Arc<NodeClaim>]) -> Self {
        let mut slots_by_group: FxHashMap<&str, Vec<&Arc<Slot>>> = FxHashMap::default();
        for slot in slots {
            if let Some(group) = group_of(slot) {
                slots_by_group.entry(group).or_default().push(slot);
            }
        }
        let mut claims_by_slot: FxHashMap<&str, Vec<&Arc<NodeClaim>>> = FxHashMap::default();
        for claim in claims {
            claims_by_slot.entry(claim.spec.slot_ref.name.as_str()).or_default().push(claim);
        }
        Self { slots_by_group, claims_by_slot }
    }

    /// The group's snapshot. `seen` says what the caches hold of a Kubernetes node of this name.
    pub fn snapshot(&self, group: Arc<Group>, seen: impl Fn(&str) -> NodeSeen) -> GroupSnapshot {
        let name = group.metadata.name.as_deref().unwrap_or_default();
        let mut members: Vec<SlotState> = self
            .slots_by_group
            .get(name)
            .into_iter()
            .flatten()
            .map(|slot| {
                let slot_name = slot_name(slot);
                let mut own: Vec<Arc<NodeClaim>> = self
                    .claims_by_slot
                    .get(slot_name)
                    .into_iter()
                    .flatten()
                    .map(|c| Arc::clone(c))
                    .collect();
                own.sort_by(|a, b| newest_first(a, b));
                let (by_node_name, by_slot_name) =
                    (seen(&slot.spec.kubernetes_node_name), seen(slot_name));
                SlotState {
                    registered: by_node_name != NodeSeen::Absent
                        || by_slot_name != NodeSeen::Absent,
                    asleep: by_node_name == NodeSeen::Asleep
                        || (by_node_name == NodeSeen::Absent && by_slot_name == NodeSeen::Asleep),
                    slot: Arc::clone(slot),
                    claims: own,
                }
            })
            .collect();
        members.sort_by(|a, b| a.name().cmp(b.name()));
        GroupSnapshot { group, slots: members }
    }
}

/// A group and everything in it, at one instant.
#[derive(Clone, Debug)]
pub struct GroupSnapshot {
    pub group: Arc<Group>,
    /// The group's slots, by name.
    pub slots: Vec<SlotState>,
}

impl GroupSnapshot {
    /// Assembles a group's snapshot from whole-namespace listings. To take several groups'
    /// snapshots from one listing, build a [`PoolIndex`] once instead.
    pub fn build(
        group: Arc<Group>,
        slots: &[Arc<Slot>],
        claims: &[Arc<NodeClaim>],
        registered_nodes: &HashSet<String>,
    ) -> Self {
        PoolIndex::new(slots, claims).snapshot(group, |node| {
            if registered_nodes.contains(node) { NodeSeen::Registered } else { NodeSeen::Absent }
        })
    }

    pub fn name(&self) -> &str {
        self.group.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn slot_count(&self) -> i32 {
        saturating_i32(self.slots.len())
    }

    /// Slots held by a live claim, marked or not: they are not free.
    pub fn live_count(&self) -> i32 {
        saturating_i32(self.slots.iter().filter(|s| !s.is_free()).count())
    }

    /// Slots whose live claim has not reached `ready` yet: machines on their way up.
    pub fn booting_count(&self) -> i32 {
        use crate::api::NodeClaimPhase::{Booting, Pending};
        let on_the_way = |s: &&SlotState| {
            s.live_claim().is_some_and(|c| matches!(phase_of(c), None | Some(Pending | Booting)))
        };
        saturating_i32(self.slots.iter().filter(on_the_way).count())
    }

    /// Slots whose machine is wanted: the capacity the minimum size is kept against.
    pub fn wanted_count(&self) -> i32 {
        saturating_i32(self.slots.iter().filter(|s| s.is_wanted()).count())
    }

    /// The target size cluster-autoscaler reads: wanted slots, plus failed boots it has not
    /// acknowledged. Without the failures, a failed scale-up would look finished to
    /// cluster-autoscaler in the same loop that reports its error, and it would not back the
    /// group off (its scale-up request ends before the error is read).
    pub fn target_size(&self) -> i32 {
        let failures = self.slots.iter().filter(|s| s.unacknowledged_failure().is_some()).count();
        self.wanted_count().saturating_add(saturating_i32(failures))
    }

    pub fn slot(&self, name: &str) -> Option<&SlotState> {
        self.slots.iter().find(|s| s.name() == name)
    }

    /// The group as an autoscaler sees it.
    pub fn info(&self) -> NodeGroupInfo {
        NodeGroupInfo::of(&self.group, self.slots.len())
    }
}

impl NodeGroupInfo {
    /// What cluster-autoscaler is told about `group`, which has `slots` slots. It needs no
    /// claim: the target size is TargetSize's to say, so NodeGroups reads only the groups and
    /// a count of the slots.
    pub fn of(group: &Group, slots: usize) -> Self {
        let name = group.metadata.name.as_deref().unwrap_or_default();
        let max_size = saturating_i32(slots);
        NodeGroupInfo {
            id: name.to_owned(),
            min_size: group.spec.min_size.max(0),
            max_size,
            debug: format!(
                "homelab group {name}: {max_size} slots, minSize {}",
                group.spec.min_size
            ),
        }
    }
}

impl NodeGroupInfo {
    /// The group's maximum lowered to what its UPS lets boot now: its target size on battery,
    /// and the target plus the room of a staggered return. cluster-autoscaler caps a scale-up at
    /// the maximum without backing the group off, so its asks fit and it asks again the moment
    /// the power allows; a refused IncreaseSize would back the group off for minutes.
    pub fn within_power(mut self, snapshot: &GroupSnapshot, now: jiff::Timestamp) -> Self {
        use crate::ups::boots::{Limit, boot_room};
        let ceiling = boot_room(&snapshot.group, snapshot.booting_count(), now).map(|held| {
            let why = match held.limit {
                Limit::OnBattery(_) => "on battery: no machine boots",
                Limit::Staggered(_) => "back from a power outage: boots staggered",
            };
            (snapshot.target_size().saturating_add(held.room), why)
        });
        if let Some((ceiling, why)) = ceiling {
            let floor = self.min_size.min(self.max_size);
            self.max_size = ceiling.clamp(floor, self.max_size);
            self.debug.push_str(&format!("; {why}, max {}", self.max_size));
        }
        self
    }
}

pub(crate) fn saturating_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{GroupSpec, NodeClaimPhase, NodeClaimStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    pub fn slot(name: &str, group: &str) -> Arc<Slot> {
        Arc::new(crate::fixtures::slot(name, group))
    }

    pub fn group(name: &str, min_size: i32) -> Arc<Group> {
        let spec: GroupSpec = serde_json::from_value(serde_json::json!({ "minSize": min_size }))
            .expect("a group spec from defaults");
        Arc::new(Group::new(name, spec))
    }

    pub fn claim(
        name: &str,
        slot: &str,
        phase: Option<NodeClaimPhase>,
        requested_at: &str,
    ) -> NodeClaim {
        let mut c = crate::fixtures::claim(name, slot, "pool");
        c.spec.requested_at = Some(crate::fixtures::at(requested_at));
        c.spec.attempt = Some(1);
        c.status = Some(NodeClaimStatus { phase, ..Default::default() });
        c
    }

    #[test]
    fn cluster_autoscaler_is_told_a_maximum_the_power_allows() {
        use crate::api::{GroupPowerStatus, GroupStatus, PowerSource};
        let now: jiff::Timestamp = "2026-03-04T10:05:00Z".parse().unwrap();
        let pool = |source: PowerSource, returned: Option<&str>| {
            let mut g = Group::new(
                "pool",
                serde_json::from_value(serde_json::json!({
                    "ups": { "name": "ups@nut", "onMains": { "bootsAtOnce": 1 } }
                }))
                .expect("a group spec"),
            );
            g.status = Some(GroupStatus {
                power: Some(GroupPowerStatus {
                    ups: "ups@nut".into(),
                    source,
                    read_at: Some(Time(now)),
                    mains_returned_at: returned.map(|r| Time(r.parse().unwrap())),
                    ..GroupPowerStatus::default()
                }),
                ..GroupStatus::default()
            });
            Arc::new(g)
        };
        let slots = [slot("a", "pool"), slot("b", "pool"), slot("c", "pool")];
        let ready =
            [Arc::new(claim("a-1", "a", Some(NodeClaimPhase::Ready), "2026-03-04T10:00:00Z"))];
        let booting = [
            ready[0].clone(),
            Arc::new(claim("b-1", "b", Some(NodeClaimPhase::Booting), "2026-03-04T10:04:00Z")),
        ];
        let max = |group: Arc<Group>, claims: &[Arc<NodeClaim>]| {
            let snapshot = GroupSnapshot::build(group, &slots, claims, &HashSet::new());
            snapshot.info().within_power(&snapshot, now).max_size
        };
        let returning = Some("2026-03-04T10:00:00Z");
        assert_eq!(max(pool(PowerSource::Mains, None), &ready), 3, "mains: every slot");
        assert_eq!(max(pool(PowerSource::Battery, None), &ready), 1, "battery: the target");
        assert_eq!(max(pool(PowerSource::Mains, returning), &ready), 2, "returning: one more");
        assert_eq!(max(pool(PowerSource::Mains, returning), &booting), 2, "none while one boots");
        assert_eq!(max(pool(PowerSource::Unread, None), &ready), 3, "unread: every slot");
        let on_battery = pool(PowerSource::Battery, None);
        let snapshot = GroupSnapshot::build(on_battery, &slots, &ready, &HashSet::new());
        assert!(snapshot.info().within_power(&snapshot, now).debug.contains("on battery"));
    }

    pub fn marked(mut c: NodeClaim) -> NodeClaim {
        if let Some(s) = c.status.as_mut() {
            s.scale_down_requested_at = Some(Time("2026-03-04T10:00:00Z".parse().unwrap()));
        }
        c
    }

    #[test]
    fn a_snapshot_holds_only_the_groups_slots_and_their_claims_newest_first() {
        use NodeClaimPhase::*;
        let slots = vec![slot("b", "pool"), slot("a", "pool"), slot("x", "other")];
        let claims: Vec<Arc<NodeClaim>> = vec![
            claim("a-1", "a", Some(Failed), "2026-03-04T09:00:00Z"),
            claim("a-2", "a", Some(Booting), "2026-03-04T09:30:00Z"),
            claim("b-1", "b", Some(Completed), "2026-03-04T09:00:00Z"),
            claim("x-1", "x", None, "2026-03-04T09:00:00Z"),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let registered: HashSet<String> = ["a".to_string()].into();
        let snap = GroupSnapshot::build(group("pool", 1), &slots, &claims, &registered);

        let names: Vec<&str> = snap.slots.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["a", "b"]);
        let a = snap.slot("a").unwrap();
        assert_eq!(a.claims[0].metadata.name.as_deref(), Some("a-2"));
        assert!(a.registered && !a.is_free() && a.is_wanted());
        let b = snap.slot("b").unwrap();
        assert!(!b.registered && b.is_free() && !b.is_wanted());
        assert_eq!((snap.slot_count(), snap.live_count(), snap.target_size()), (2, 1, 1));
        assert_eq!(snap.info().max_size, 2);
        assert_eq!(snap.info().min_size, 1);
    }

    #[test]
    fn a_marked_claim_holds_its_slot_but_is_not_wanted() {
        let slots = vec![slot("a", "pool")];
        let claims = vec![Arc::new(marked(claim(
            "a-1",
            "a",
            Some(NodeClaimPhase::Ready),
            "2026-03-04T09:00:00Z",
        )))];
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &claims, &HashSet::new());
        assert_eq!((snap.live_count(), snap.target_size()), (1, 0));
    }

    #[test]
    fn a_failed_boot_counts_in_the_target_until_cluster_autoscaler_acknowledges_it() {
        use NodeClaimPhase::*;
        let slots = vec![slot("a", "pool"), slot("b", "pool"), slot("c", "pool")];
        let mut acknowledged = claim("b-1", "b", Some(Failed), "2026-03-04T09:00:00Z");
        if let Some(status) = acknowledged.status.as_mut() {
            status.failure_acknowledged_at = Some(crate::fixtures::at("2026-03-04T09:05:00Z"));
        }
        let claims: Vec<Arc<NodeClaim>> = vec![
            claim("a-1", "a", Some(Failed), "2026-03-04T09:00:00Z"),
            acknowledged,
            // A failure followed by a new boot: the live claim is what counts.
            claim("c-1", "c", Some(Failed), "2026-03-04T09:00:00Z"),
            claim("c-2", "c", Some(Booting), "2026-03-04T09:10:00Z"),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let snap = GroupSnapshot::build(group("pool", 0), &slots, &claims, &HashSet::new());
        assert!(snap.slot("a").unwrap().unacknowledged_failure().is_some());
        assert!(snap.slot("b").unwrap().unacknowledged_failure().is_none());
        assert!(snap.slot("c").unwrap().unacknowledged_failure().is_none());
        assert_eq!((snap.wanted_count(), snap.target_size()), (1, 2));
    }

    /// What a snapshot holds, by name: each slot with its registration and its claims in order.
    fn shape(snap: &GroupSnapshot) -> Vec<(String, bool, Vec<String>)> {
        snap.slots
            .iter()
            .map(|s| {
                let claims = s.claims.iter().map(|c| c.metadata.name.clone().unwrap_or_default());
                (s.name().to_owned(), s.registered, claims.collect())
            })
            .collect()
    }

    #[test]
    fn one_index_gives_every_group_exactly_its_slots_and_their_claims() {
        use NodeClaimPhase::*;
        // Three groups, a slot without a group label, and claims spread across them, one of
        // them naming a slot that does not exist; in no particular order.
        let mut slots: Vec<Arc<Slot>> =
            (0..30).rev().map(|i| slot(&format!("s{i:02}"), ["a", "b", "c"][i % 3])).collect();
        let mut orphan = (*slot("loose", "a")).clone();
        orphan.metadata.labels = None;
        slots.push(Arc::new(orphan));
        let claims: Vec<Arc<NodeClaim>> = (0..40)
            .map(|i| {
                let phase = [Some(Completed), Some(Ready), None, Some(Failed)][i % 4];
                let minute = (i * 7) % 60;
                let slot = if i == 39 { "gone".to_owned() } else { format!("s{:02}", i % 13) };
                claim(&format!("c{i:02}"), &slot, phase, &format!("2026-03-04T09:{minute:02}:00Z"))
            })
            .map(Arc::new)
            .collect();
        let registered: HashSet<String> = ["s00", "s04", "s09", "loose"].map(String::from).into();
        let index = PoolIndex::new(&slots, &claims);
        for name in ["a", "b", "c", "none"] {
            let snap = index.snapshot(group(name, 0), |n| {
                if registered.contains(n) { NodeSeen::Registered } else { NodeSeen::Absent }
            });
            // The reference: every slot of the group by name, every claim naming it newest first.
            let mut want: Vec<(String, bool, Vec<String>)> = slots
                .iter()
                .filter(|s| group_of(s) == Some(name))
                .map(|s| {
                    let mut own: Vec<&Arc<NodeClaim>> =
                        claims.iter().filter(|c| c.spec.slot_ref.name == slot_name(s)).collect();
                    own.sort_by(|x, y| newest_first(x, y));
                    let own = own.iter().map(|c| c.metadata.name.clone().unwrap_or_default());
                    (slot_name(s).to_owned(), registered.contains(slot_name(s)), own.collect())
                })
                .collect();
            want.sort();
            assert_eq!(want.is_empty(), name == "none", "group {name}");
            assert_eq!(shape(&snap), want, "group {name}");
            let built = GroupSnapshot::build(group(name, 0), &slots, &claims, &registered);
            assert_eq!(shape(&built), want, "group {name}, built alone");
        }
    }

    #[test]
    fn a_slot_is_registered_by_its_kubernetes_node_name_or_its_own_name() {
        // (slot name, kubernetesNodeName, registered node names, registered?)
        let cases = [
            ("m1", "m1", &["m1"][..], true),
            ("m1", "host-1", &["host-1"][..], true),
            ("m1", "host-1", &["m1"][..], true),
            ("m1", "host-1", &["host-2", "m2"][..], false),
            ("m1", "m1", &[][..], false),
        ];
        for (name, node_name, nodes, want) in cases {
            let mut s = crate::fixtures::slot(name, "pool");
            s.spec.kubernetes_node_name = node_name.into();
            let nodes: HashSet<String> = nodes.iter().map(|n| n.to_string()).collect();
            let snap = GroupSnapshot::build(group("pool", 0), &[Arc::new(s)], &[], &nodes);
            assert_eq!(snap.slots[0].registered, want, "{name} as {node_name} with {nodes:?}");
        }
    }

    #[test]
    fn the_provider_id_is_the_registered_one_else_the_declared_one_else_homelab_scheme() {
        let plain = slot("worker-1", "pool");
        assert_eq!(provider_id_of(&plain), "homelab://worker-1");
        let mut declared = (*plain).clone();
        declared.spec.provider_id = Some("k3s://worker-1".into());
        assert_eq!(provider_id_of(&declared), "k3s://worker-1");
        // k3s wrote its own id on the node; the slot declares nothing (or something else).
        let mut registered = (*plain).clone();
        registered.status = Some(crate::api::NodeStatus {
            provider_id: Some("k3s://worker-1".into()),
            ..Default::default()
        });
        assert_eq!(provider_id_of(&registered), "k3s://worker-1");
        registered.spec.provider_id = Some("homelab://stale".into());
        assert_eq!(provider_id_of(&registered), "k3s://worker-1");
    }
}
