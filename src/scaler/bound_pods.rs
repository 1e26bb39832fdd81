//! Pods only some machines can run (docs/decisions.md, D33): a pod whose PersistentVolume lives
//! on one machine's disk, or whose own selectors name one machine. Pure: the pass's lists and
//! the provider's snapshots and the scaler's memory of refused slots in, a plan out.
//!
//! Neither scaler's count sees such a pod right. cluster-autoscaler simulates it on a group's
//! template node, which stands for no particular machine, so the volume's node affinity (or
//! the hostname selector) fails there and it scales nothing up. The built-in scaler's count
//! would boot the cheapest free slot, which the pod cannot use. So one planner, run by the
//! scaler's pass for every pool whatever its driver, handles these pods:
//!
//! - an unscheduled pod that no usable node outside the pools admits (judged by the scheduler
//!   or not yet: the pool's own count takes both) and that fits only some slots' templates —
//!   its selectors, affinity, tolerations and the node affinity of its bound volumes — is *bound*
//!   when no pool would serve it anyway: in a builtin pool, when not every slot fits it; in a
//!   cluster-autoscaler pool, when the group's template node does not fit it;
//! - a bound pod whose slots all have no live claim wakes one of them: one claim, on a slot
//!   of the first group (by name) that may boot one more machine, chosen among those slots by
//!   the provider's usual order; pods that share a slot share the claim;
//! - a bound pod one of whose slots is claimed but not serving yet (booting, or being released)
//!   waits for it, and a bound pod with a serving slot (ready, not being released) waits for
//!   the scheduler;
//! - a slot the scheduler refused the pod on once it was up is not woken for it again until
//!   the pod or the slot changes ([`super::refusals`], D37): the pod's other slots may be;
//! - the built-in scaler counts no bound pod, so it boots the one machine that can run the pod
//!   or none.
//!
//! The planner also reports, per slot, the running pods whose volumes no other machine can
//! serve: the machine holds their data. The built-in scaler never releases a machine that
//! holds a pod; the report says why that pod cannot move. When a pin or schedule window ends on
//! such a machine, the planner claims it for the pod on the spot, while the slot's shutdown
//! waits for that ([`crate::claim::pin_end`], D39): powering it off would evict the pod only to
//! wake the machine for it again.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node as CoreNode, ObjectReference, Pod};
use kube::Resource;

use super::refusals::{Judgment, Refusal, Refusals, SlotSeen};
use super::target::Limits;
use crate::api::{LocalVolume, NodeClaimPhase, ScalingDriver};
use crate::claim::pin_end;
use crate::phase;
use crate::placement::pods::{PodKey, is_work, pod_key};
use crate::placement::shape::{
    NodeShape, Template, extended_requests, fits, selector_matches, shape_of, takes_pods,
};
use crate::placement::volumes::{BoundVolume, VolumeIndex};
use crate::provider::GroupSnapshot;
use crate::provider::template::representative;

/// A slot to wake for a bound pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wake {
    pub group: String,
    pub driver: ScalingDriver,
    /// The group's free slots the pod fits, any of which serves it; the provider picks one.
    pub slots: Vec<String>,
    /// `namespace/name` of the first pending pod that needs it.
    pub pod: String,
    /// Why, in a sentence: the pod, and the volume or selector that binds it.
    pub reason: String,
}

/// What the planner found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub wakes: Vec<Wake>,
    /// Every bound pod: no builtin pool counts it as demand.
    pub handled: HashSet<PodKey>,
    /// Slots refused for a pod in this pass, to be reported on both.
    pub refused: Vec<Refused>,
    /// Bound pods no slot may boot for now, with why.
    pub blocked: Vec<Blocked>,
    /// By slot: the running pods whose volumes only that slot's machine can serve, as the
    /// slot's `status.localVolumes` lists them.
    pub holding: BTreeMap<String, Vec<LocalVolume>>,
}

/// A bound pod no slot may boot for now: every pool it fits is at its maxNodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Blocked {
    pub pod: ObjectReference,
    /// `namespace/name`.
    pub name: String,
    pub why: String,
}

/// A slot refused for a pod: what the Warnings on the pod and the slot say.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused {
    pub pod: ObjectReference,
    pub slot: ObjectReference,
    pub note: String,
}

/// A slot as the planner sees it.
struct SlotShape<'a> {
    group: usize,
    name: &'a str,
    node: &'a str,
    generation: i64,
    object: ObjectReference,
    template: Template,
    /// The phase of its live claim, if it has one.
    live: Option<NodeClaimPhase>,
    /// Its machine is up for pods: the live claim is ready and not being released.
    serving: bool,
    /// When its live claim became ready.
    ready_at: Option<Timestamp>,
    /// No live claim, and the newest one was a pin that ended.
    pin_ended: bool,
}

impl SlotShape<'_> {
    fn seen(&self) -> SlotSeen<'_> {
        SlotSeen {
            name: self.name,
            generation: self.generation,
            serving: self.serving,
            ready_at: self.ready_at,
        }
    }
}

/// A pending pod no pool serves on its own, with the slots it fits.
struct BoundPod<'p, 's> {
    pod: &'p Pod,
    volumes: Vec<BoundVolume>,
    fitting: Vec<&'s SlotShape<'s>>,
}

/// Plans for every pool in `pools`, learning and honouring in `refusals` the slots the scheduler
/// refused a pod on.
pub fn plan(
    pods: &[Pod],
    nodes: &[CoreNode],
    volumes: &VolumeIndex<'_>,
    pools: &[&GroupSnapshot],
    refusals: &mut Refusals,
) -> Plan {
    let slots: Vec<SlotShape<'_>> = pools
        .iter()
        .enumerate()
        .flat_map(|(group, pool)| {
            pool.slots.iter().map(move |s| {
                let live = s.live_claim();
                let ready = live.filter(|c| phase::of(c) == NodeClaimPhase::Ready);
                SlotShape {
                    group,
                    name: s.name(),
                    node: s.slot.spec.kubernetes_node_name.as_str(),
                    generation: s.slot.metadata.generation.unwrap_or_default(),
                    object: s.slot.object_ref(&()),
                    template: Template::of_slot(&s.slot, pool.name()),
                    live: live.map(|c| phase::of(c)),
                    serving: ready.is_some_and(|c| !phase::is_marked(c)),
                    ready_at: ready
                        .and_then(|c| c.status.as_ref())
                        .and_then(|s| s.ready_at.as_ref())
                        .map(|t| t.0),
                    pin_ended: live.is_none()
                        && s.claims.first().is_some_and(|c| pin_end::ended_at(c).is_some()),
                }
            })
        })
        .collect();
    let autoscaler_templates: Vec<Option<Template>> = pools
        .iter()
        .map(|pool| {
            (pool.group.spec.driver == ScalingDriver::ClusterAutoscaler)
                .then(|| representative(pool))
                .flatten()
                .map(|s| Template::for_autoscaler(&s.slot, pool.name()))
        })
        .collect();
    let no_labels = BTreeMap::new();
    let real_nodes: Vec<NodeShape<'_>> = nodes.iter().map(|n| shape_of(n, &no_labels)).collect();
    let usable_elsewhere: Vec<NodeShape<'_>> = nodes
        .iter()
        .filter(|n| takes_pods(n))
        .filter(|n| !slots.iter().any(|s| Some(s.node) == n.metadata.name.as_deref()))
        .map(|n| shape_of(n, &no_labels))
        .collect();

    let mut plan = Plan::default();
    let mut bound: Vec<BoundPod<'_, '_>> = Vec::new();
    for pod in pods.iter().filter(|p| is_work(p)) {
        let Some(spec) = pod.spec.as_ref() else { continue };
        let volumes = volumes.bound_volumes(pod);
        match spec.node_name.as_deref().filter(|n| !n.is_empty()) {
            Some(node) => {
                hold(&mut plan, pod, node, &volumes, &slots, &real_nodes);
                continue;
            }
            None if nominated(pod) => continue,
            None => {}
        }
        let fitting: Vec<&SlotShape<'_>> =
            slots.iter().filter(|s| fits(spec, &volumes, s.template.shape())).collect();
        // Whether or not the scheduler has judged it yet: a pod no usable node outside the
        // pools admits waits for a slot either way. The pool's own count takes the same
        // unjudged pods (`classify`), so leaving them out here would let it boot a machine
        // the pod cannot use.
        if fitting.is_empty() || usable_elsewhere.iter().any(|n| fits(spec, &volumes, *n)) {
            continue;
        }
        let groups: BTreeSet<usize> = fitting.iter().map(|s| s.group).collect();
        let served_by_a_pool = groups.iter().any(|&g| {
            let in_group = fitting.iter().filter(|s| s.group == g).count();
            match &autoscaler_templates[g] {
                Some(template) => fits(spec, &volumes, template.shape()),
                None if pools[g].group.spec.driver == ScalingDriver::ClusterAutoscaler => false,
                None => in_group == pools[g].slots.len(),
            }
        });
        if !served_by_a_pool {
            bound.push(BoundPod { pod, volumes, fitting });
        }
    }

    // The pods with the fewest slots first, so a slot that serves several is the one woken.
    bound.sort_by_key(|b| b.fitting.len());
    // Each wake's candidate slots: the provider claims one of them, so a later pod is served by
    // a wake only when it fits every candidate.
    let mut waking: Vec<(usize, Vec<&str>)> = Vec::new();
    // The wakes this pass plans, by pool: each is a machine on its way, so it counts against the
    // pool's maxNodes for the next pod as much as a claim that exists.
    let mut planned: BTreeMap<usize, i32> = BTreeMap::new();
    for held in plan.holding.values_mut() {
        held.sort();
        held.dedup();
    }
    hand_over_ended_pins(&mut plan, pools, &slots, &mut planned);
    refusals.begin_pass();
    for BoundPod { pod, volumes, fitting } in bound {
        let key = pod_key(pod);
        plan.handled.insert(key.clone());
        let judgment = Judgment::of(pod);
        let mut open = Vec::with_capacity(fitting.len());
        for slot in fitting {
            let (refused, newly) = refusals.judge(&key, &judgment, slot.seen());
            if let Some(refusal) = newly {
                plan.refused.push(refused_on(pod, slot, &refusal));
            }
            if !refused {
                open.push(slot);
            }
        }
        let fitting = open;
        let groups: BTreeSet<usize> = fitting.iter().map(|s| s.group).collect();
        if fitting.is_empty() || fitting.iter().any(|s| s.serving) {
            // Refused everywhere (its Warnings say so), or up on a machine: the scheduler's.
            continue;
        }
        let served_by_a_wake = waking.iter().any(|(g, candidates)| {
            candidates.iter().all(|c| fitting.iter().any(|s| s.group == *g && s.name == *c))
        });
        if served_by_a_wake || fitting.iter().any(|s| s.live.is_some()) {
            continue;
        }
        let who = format!("{}/{}", key.0, key.1);
        let mut at_max = Vec::new();
        let chosen = groups.iter().find_map(|&g| {
            let pool = pools[g];
            if let Some(full) = at_max_nodes(pool, planned.get(&g).copied().unwrap_or(0)) {
                at_max.push(full);
                return None;
            }
            let free: Vec<&str> = fitting
                .iter()
                .filter(|s| s.group == g && s.live.is_none())
                .map(|s| s.name)
                .collect();
            (!free.is_empty()).then_some((g, free))
        });
        let Some((g, free)) = chosen else {
            plan.blocked.push(Blocked {
                pod: pod.object_ref(&()),
                name: who,
                why: at_max.join("; "),
            });
            continue;
        };
        let names: Vec<&str> = fitting.iter().map(|s| s.name).collect();
        plan.wakes.push(Wake {
            group: pools[g].name().to_owned(),
            driver: pools[g].group.spec.driver,
            slots: free.iter().map(|s| (*s).to_owned()).collect(),
            reason: reason(&who, &names, &volumes, &devices_asked(pod)),
            pod: who,
        });
        *planned.entry(g).or_default() += 1;
        waking.push((g, free));
    }
    refusals.end_pass();
    plan
}

/// Claims, for a running pod whose data it holds, each machine whose pin ended and that no
/// claim wants now. The machine is on already, so maxNodes does not hold it back; it counts
/// against the limit for the pass's other wakes.
fn hand_over_ended_pins(
    plan: &mut Plan,
    pools: &[&GroupSnapshot],
    slots: &[SlotShape<'_>],
    planned: &mut BTreeMap<usize, i32>,
) {
    for slot in slots.iter().filter(|s| s.pin_ended) {
        let Some(first) = plan.holding.get(slot.name).and_then(|held| held.first()) else {
            continue;
        };
        let volume = first.volume.as_deref().unwrap_or("unbound");
        plan.wakes.push(Wake {
            group: pools[slot.group].name().to_owned(),
            driver: pools[slot.group].group.spec.driver,
            slots: vec![slot.name.to_owned()],
            pod: first.pod.clone(),
            reason: format!(
                "pod {} runs on slot {}, whose pin ended, and its volume claim {} \
                 (PersistentVolume {volume}) is on that machine's disk: it stays on for the pod",
                first.pod, slot.name, first.claim
            ),
        });
        *planned.entry(slot.group).or_default() += 1;
    }
}

/// The Warnings' words for a slot newly refused for `pod`.
fn refused_on(pod: &Pod, slot: &SlotShape<'_>, refusal: &Refusal) -> Refused {
    let (namespace, name) = &refusal.pod;
    let said = if refusal.message.is_empty() {
        "the scheduler gave no reason".to_owned()
    } else {
        format!("the scheduler says: \"{}\"", refusal.message)
    };
    Refused {
        pod: pod.object_ref(&()),
        slot: slot.object.clone(),
        note: format!(
            "pod {namespace}/{name} stayed pending while slot {} (node {}) was up for it; \
             {said} The operator wakes {} for this pod again only once the pod or the slot \
             changes.",
            refusal.slot, slot.node, refusal.slot
        ),
    }
}

/// Records the volumes of a running pod on a pool's machine that no other machine can serve.
fn hold(
    plan: &mut Plan,
    pod: &Pod,
    node: &str,
    bound_volumes: &[BoundVolume],
    slots: &[SlotShape<'_>],
    real_nodes: &[NodeShape<'_>],
) {
    let Some(slot) = slots.iter().find(|s| s.node == node) else { return };
    let (namespace, name) = pod_key(pod);
    for volume in bound_volumes {
        let elsewhere = slots
            .iter()
            .filter(|s| s.node != node)
            .map(|s| s.template.shape())
            .chain(real_nodes.iter().copied().filter(|n| n.name != node))
            .any(|n| selector_matches(&volume.nodes, n));
        if !elsewhere {
            plan.holding.entry(slot.name.to_owned()).or_default().push(LocalVolume {
                pod: format!("{namespace}/{name}"),
                claim: volume.claim.clone(),
                volume: volume.volume.clone(),
            });
        }
    }
}

/// Why a builtin pool may boot no more machines now, if so; `waking` is how many this pass has
/// already planned to wake in it.
fn at_max_nodes(pool: &GroupSnapshot, waking: i32) -> Option<String> {
    if pool.group.spec.driver != ScalingDriver::Builtin {
        return None;
    }
    let limits = Limits::of(&pool.group.spec.builtin, pool.slot_count());
    let wanted = pool.wanted_count() + waking;
    (wanted >= limits.max_nodes).then(|| {
        let now = if waking > 0 { format!(", {waking} of them woken now") } else { String::new() };
        format!(
            "group {} is at maxNodes ({wanted} of {} machines{now})",
            pool.name(),
            limits.max_nodes
        )
    })
}

/// The scheduler is preempting for it on some node: it is being placed.
fn nominated(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.nominated_node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// The extended resources the pod asks for, as a person writes them (`nvidia.com/gpu: 1`).
fn devices_asked(pod: &Pod) -> Vec<String> {
    let asked = pod.spec.as_ref().map(extended_requests).unwrap_or_default();
    asked
        .into_iter()
        .map(|(name, milli)| match milli % 1000 {
            0 => format!("{name}: {}", milli / 1000),
            _ => format!("{name}: {milli}m"),
        })
        .collect()
}

fn reason(pod: &str, slots: &[&str], volumes: &[BoundVolume], devices: &[String]) -> String {
    let only = match slots {
        [one] => format!("only slot {one} can run it"),
        many => format!("only slots {} can run it", many.join(", ")),
    };
    let because = if !volumes.is_empty() {
        let described: Vec<String> = volumes.iter().map(BoundVolume::describe).collect();
        format!("its volume {} is on that machine's disk", described.join(" and "))
    } else if !devices.is_empty() {
        format!(
            "its node selector, affinity and the {} it asks for admit no other machine",
            devices.join(" and ")
        )
    } else {
        "its node selector and affinity admit no other machine".to_owned()
    };
    format!("pod {pod} is pending and {only}: {because}")
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use serde_json::{Value, json};

    use super::*;
    use crate::api::{Group, Node as Slot, NodeClaim};
    use crate::provider::GroupSnapshot;

    fn slot(name: &str, group: &str) -> Arc<Slot> {
        Arc::new(crate::fixtures::slot(name, group))
    }

    fn group(name: &str, driver: &str, max_nodes: Option<i32>) -> Arc<Group> {
        let mut group = crate::fixtures::group(name);
        group.spec.driver = serde_json::from_value(json!(driver)).unwrap();
        group.spec.builtin.max_nodes = max_nodes;
        Arc::new(group)
    }

    /// A claim in `phase`; `ready-marked` is a ready claim being released.
    fn claim(slot: &str, group: &str, phase: &str) -> Arc<NodeClaim> {
        let marked = phase == "ready-marked";
        let phase = serde_json::from_value(json!(phase.trim_end_matches("-marked"))).unwrap();
        let mut claim = crate::fixtures::claim_in(
            &format!("{slot}-1"),
            slot,
            Some(phase),
            "2026-03-04T10:00:00Z",
        );
        claim.spec.request.group = group.to_owned();
        if let Some(status) = claim.status.as_mut() {
            status.ready_at = Some(crate::fixtures::at(READY_AT));
            if marked {
                status.scale_down_requested_at = Some(crate::fixtures::at(READY_AT));
            }
        }
        Arc::new(claim)
    }

    /// When every ready claim of these tests became ready.
    const READY_AT: &str = "2026-03-04T10:01:00Z";

    /// `pod`, judged unschedulable by the scheduler at `at` with `message`.
    fn judged(mut pod: Pod, at: &str, message: &str) -> Pod {
        pod.metadata.uid = Some("uid-1".into());
        pod.metadata.managed_fields = Some(vec![
            serde_json::from_value(json!({
                "manager": "kube-scheduler", "operation": "Update", "subresource": "status",
                "time": at, "fieldsType": "FieldsV1", "fieldsV1": {},
            }))
            .unwrap(),
        ]);
        if let Some(condition) =
            pod.status.as_mut().and_then(|s| s.conditions.as_mut()).and_then(|c| c.first_mut())
        {
            condition.message = Some(message.into());
        }
        pod
    }

    fn pool(name: &str, driver: &str, slots: &[&str], claims: &[(&str, &str)]) -> GroupSnapshot {
        let slots: Vec<Arc<Slot>> = slots.iter().map(|s| slot(s, name)).collect();
        let claims: Vec<Arc<NodeClaim>> =
            claims.iter().map(|(s, phase)| claim(s, name, phase)).collect();
        GroupSnapshot::build(group(name, driver, None), &slots, &claims, &HashSet::new())
    }

    /// A pod, pending and judged unschedulable unless `node` binds it.
    fn pod(name: &str, node: Option<&str>, spec: Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = json!([{ "name": "app", "image": "app" }]);
        spec["nodeName"] = json!(node);
        let conditions = if node.is_none() {
            json!([{ "type": "PodScheduled", "status": "False", "reason": "Unschedulable" }])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "metadata": { "name": name, "namespace": "apps" },
            "spec": spec,
            "status": { "phase": if node.is_some() { "Running" } else { "Pending" },
                        "conditions": conditions },
        }))
        .unwrap()
    }

    fn with_claim(claim: &str) -> Value {
        json!({ "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }] })
    }

    fn on_host(host: &str) -> Value {
        json!({ "nodeSelector": { "kubernetes.io/hostname": host } })
    }

    fn storage() -> (Vec<PersistentVolumeClaim>, Vec<PersistentVolume>) {
        let claim = |name: &str, volume: &str| {
            serde_json::from_value(json!({
                "metadata": { "name": name, "namespace": "apps" },
                "spec": { "volumeName": volume },
            }))
            .unwrap()
        };
        let local = |name: &str, host: &str| {
            serde_json::from_value(json!({
                "metadata": { "name": name },
                "spec": { "nodeAffinity": { "required": { "nodeSelectorTerms": [{
                    "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In",
                                           "values": [host] }] }] } } },
            }))
            .unwrap()
        };
        (
            vec![claim("data-db-0", "pvc-1"), claim("data-db-1", "pvc-2")],
            vec![local("pvc-1", "mini-3"), local("pvc-2", "mini-3")],
        )
    }

    fn run(pods: &[Pod], pools: &[&GroupSnapshot]) -> Plan {
        run_remembering(pods, pools, &mut Refusals::default())
    }

    fn run_remembering(pods: &[Pod], pools: &[&GroupSnapshot], memory: &mut Refusals) -> Plan {
        let (claims, volumes) = storage();
        let index = VolumeIndex::new(&claims, &volumes);
        plan(pods, &[], &index, pools, memory)
    }

    fn woken(plan: &Plan) -> Vec<(String, Vec<String>)> {
        plan.wakes.iter().map(|w| (w.group.clone(), w.slots.clone())).collect()
    }

    const FOUR: [&str; 4] = ["mini-1", "mini-2", "mini-3", "mini-4"];

    #[test]
    fn a_pending_pod_whose_volume_is_on_an_off_machine_wakes_that_slot_in_either_pool() {
        for driver in ["builtin", "cluster-autoscaler"] {
            let p = pool("workers", driver, &FOUR, &[("mini-1", "ready")]);
            let plan = run(&[pod("db-0", None, with_claim("data-db-0"))], &[&p]);
            assert_eq!(woken(&plan), [("workers".into(), vec!["mini-3".into()])], "{driver}");
            assert!(plan.handled.contains(&("apps".into(), "db-0".into())), "{driver}");
            let reason = &plan.wakes[0].reason;
            assert!(
                reason.contains("pod apps/db-0") && reason.contains("PersistentVolume pvc-1"),
                "{reason}"
            );
        }
    }

    #[test]
    fn many_pending_pods_on_one_machine_wake_it_once() {
        let p = pool("workers", "builtin", &FOUR, &[]);
        let pods = [
            pod("db-0", None, with_claim("data-db-0")),
            pod("db-1", None, with_claim("data-db-1")),
            pod("pinned", None, on_host("mini-3")),
        ];
        let plan = run(&pods, &[&p]);
        assert_eq!(woken(&plan), [("workers".into(), vec!["mini-3".into()])]);
        assert_eq!(plan.handled.len(), 3, "none of them is counted by the pool's own scaler");
    }

    #[test]
    fn the_most_constrained_pod_picks_the_slot_and_the_others_share_it() {
        let p = pool("workers", "builtin", &FOUR, &[]);
        let either = json!({ "affinity": { "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [{
                "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In",
                                       "values": ["mini-3", "mini-4"] }] }] } } } });
        let pods = [pod("either", None, either), pod("only-4", None, on_host("mini-4"))];
        for order in [[0, 1], [1, 0]] {
            let plan = run(&[pods[order[0]].clone(), pods[order[1]].clone()], &[&p]);
            assert_eq!(
                woken(&plan),
                [("workers".into(), vec!["mini-4".into()])],
                "mini-4 serves both, whichever pod comes first"
            );
        }
        // A pod only mini-3 can run picks mini-3, and the pod that fits either shares it.
        let third = pod("only-3", None, on_host("mini-3"));
        let plan = run(&[pods[0].clone(), third], &[&p]);
        assert_eq!(woken(&plan), [("workers".into(), vec!["mini-3".into()])]);
    }

    #[test]
    fn what_a_bound_pod_waits_for_and_what_is_left_to_the_pools() {
        /// The case, the pool's claims (slot, phase), the pod, whether it wakes a slot, and
        /// whether the pool's own count leaves it out.
        type Case = (&'static str, Vec<(&'static str, &'static str)>, Pod, bool, bool);
        let table: Vec<Case> = vec![
            (
                "its slot boots",
                vec![("mini-3", "booting")],
                pod("db-0", None, with_claim("data-db-0")),
                false,
                true,
            ),
            (
                "its slot is pending",
                vec![("mini-3", "pending")],
                pod("db-0", None, with_claim("data-db-0")),
                false,
                true,
            ),
            (
                "its slot serves: the scheduler's turn, and the pool still does not count it",
                vec![("mini-3", "ready")],
                pod("db-0", None, with_claim("data-db-0")),
                false,
                true,
            ),
            (
                "its slot is being released",
                vec![("mini-3", "ready-marked")],
                pod("db-0", None, with_claim("data-db-0")),
                false,
                true,
            ),
            (
                "a pod every slot fits is the pool's",
                vec![],
                pod("web", None, json!({})),
                false,
                false,
            ),
            ("no slot fits", vec![], pod("x", None, on_host("elsewhere")), false, false),
            ("a hostname selector", vec![], pod("x", None, on_host("mini-2")), true, true),
            (
                "a pod the scheduler has not judged yet",
                vec![],
                {
                    let mut p = pod("db-0", None, with_claim("data-db-0"));
                    p.status = None;
                    p
                },
                true,
                true,
            ),
        ];
        for (case, claims, pod, wakes, handled) in table {
            let p = pool("workers", "builtin", &FOUR, &claims);
            let plan = run(std::slice::from_ref(&pod), &[&p]);
            assert_eq!(!plan.wakes.is_empty(), wakes, "{case}: {plan:?}");
            assert_eq!(!plan.handled.is_empty(), handled, "{case}: {plan:?}");
        }
    }

    /// A pod pinned to mini-3 or mini-4 that mini-3's machine, once up, cannot run: refused
    /// there with the scheduler's words, said once, and mini-4 woken in the same pass; once
    /// mini-3 is off again, a pass wakes mini-4 (its first wake failed, say), never mini-3.
    #[test]
    fn a_slot_the_scheduler_refused_the_pod_on_is_not_woken_for_it_again() {
        let either = json!({ "affinity": { "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": [{
                "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In",
                                       "values": ["mini-3", "mini-4"] }] }] } } } });
        let pending = judged(
            pod("big", None, either),
            "2026-03-04T10:01:05Z",
            "0/4 nodes are available: 1 Insufficient memory.",
        );
        let mut memory = Refusals::default();

        let up = pool("workers", "builtin", &FOUR, &[("mini-3", "ready")]);
        let plan = run_remembering(std::slice::from_ref(&pending), &[&up], &mut memory);
        assert_eq!(woken(&plan), [("workers".into(), vec!["mini-4".into()])]);
        assert!(plan.handled.contains(&("apps".into(), "big".into())), "never the pool's count");
        let [refused] = plan.refused.as_slice() else { panic!("one refusal: {plan:?}") };
        assert_eq!(refused.pod.name.as_deref(), Some("big"));
        assert_eq!(refused.slot.name.as_deref(), Some("mini-3"));
        assert!(
            refused.note.contains("slot mini-3")
                && refused.note.contains("\"0/4 nodes are available: 1 Insufficient memory.\""),
            "{}",
            refused.note
        );

        let off = pool("workers", "builtin", &FOUR, &[]);
        let plan = run_remembering(std::slice::from_ref(&pending), &[&off], &mut memory);
        assert_eq!(woken(&plan), [("workers".into(), vec!["mini-4".into()])]);
        assert!(plan.refused.is_empty(), "said once: {:?}", plan.refused);

        // Judged before mini-3 came up: the scheduler has not seen the machine; nothing refused.
        let early = judged(pod("early", None, on_host("mini-3")), "2026-03-04T10:00:30Z", "taint");
        let plan = run_remembering(&[early], &[&up], &mut Refusals::default());
        assert!(plan.refused.is_empty() && plan.wakes.is_empty(), "{plan:?}");
    }

    #[test]
    fn a_selector_the_autoscaler_template_satisfies_is_left_to_cluster_autoscaler() {
        // Every slot of the pool runs Linux: cluster-autoscaler's template fits the pod and it
        // scales up on its own; the builtin pool counts it as ordinary demand.
        for driver in ["builtin", "cluster-autoscaler"] {
            let p = pool("workers", driver, &FOUR, &[]);
            let linux =
                pod("web", None, json!({ "nodeSelector": { "kubernetes.io/os": "linux" } }));
            let plan = run(&[linux], &[&p]);
            assert!(plan.wakes.is_empty() && plan.handled.is_empty(), "{driver}: {plan:?}");
        }
    }

    #[test]
    fn max_nodes_keeps_a_builtin_pool_from_waking_and_the_pod_is_not_counted_either() {
        let slots: Vec<Arc<Slot>> = FOUR.iter().map(|s| slot(s, "workers")).collect();
        let claims = vec![claim("mini-1", "workers", "ready")];
        let p = GroupSnapshot::build(
            group("workers", "builtin", Some(1)),
            &slots,
            &claims,
            &HashSet::new(),
        );
        let plan = run(&[pod("db-0", None, with_claim("data-db-0"))], &[&p]);
        assert!(plan.wakes.is_empty());
        assert!(plan.handled.contains(&("apps".into(), "db-0".into())));
        assert!(plan.blocked[0].why.contains("maxNodes"), "{:?}", plan.blocked);
    }

    /// Two pods, each of which only one machine can run, in a pool with maxNodes 1: one pass
    /// wakes one machine, and the second pod waits, told why. Counting only the claims that
    /// existed before the pass woke both.
    #[test]
    fn the_wakes_of_one_pass_count_against_max_nodes() {
        let slots: Vec<Arc<Slot>> = FOUR.iter().map(|s| slot(s, "workers")).collect();
        let p = GroupSnapshot::build(
            group("workers", "builtin", Some(1)),
            &slots,
            &[],
            &HashSet::new(),
        );
        let pods = [pod("a", None, on_host("mini-1")), pod("b", None, on_host("mini-2"))];
        let plan = run(&pods, &[&p]);
        assert_eq!(woken(&plan), [("workers".into(), vec!["mini-1".into()])]);
        assert_eq!(plan.blocked.len(), 1, "{:?}", plan.blocked);
        let Blocked { name: pod, why, .. } = &plan.blocked[0];
        assert_eq!(pod, "apps/b");
        assert!(why.contains("at maxNodes (1 of 1 machines, 1 of them woken now)"), "{why}");
    }

    /// mini-3's pin ended while db-0 runs there on its disk: the pass claims mini-3 for db-0.
    /// A pin's end without such a pod, or any other end, claims nothing.
    #[test]
    fn a_pins_end_hands_a_machine_holding_data_to_its_pod() {
        let ended = |reason: &str| {
            let mut c = (*claim("mini-3", "workers", "completed")).clone();
            if let Some(s) = c.status.as_mut() {
                s.reason = Some(reason.into());
                s.finished_at = Some(crate::fixtures::at(READY_AT));
            }
            Arc::new(c)
        };
        let slots: Vec<Arc<Slot>> = FOUR.iter().map(|s| slot(s, "workers")).collect();
        let pool_after = |c: Arc<NodeClaim>| {
            GroupSnapshot::build(
                group("workers", "builtin", Some(1)),
                &slots,
                &[c],
                &HashSet::new(),
            )
        };
        let running = pod("db-0", Some("mini-3"), with_claim("data-db-0"));

        let p = pool_after(ended(crate::claim::pin_end::EXPIRED));
        let plan = run(std::slice::from_ref(&running), &[&p]);
        assert_eq!(woken(&plan), [("workers".into(), vec!["mini-3".into()])], "even at maxNodes");
        assert_eq!(plan.wakes[0].pod, "apps/db-0");
        assert!(plan.wakes[0].reason.contains("whose pin ended"), "{}", plan.wakes[0].reason);

        let plan = run(&[pod("web", Some("mini-3"), json!({}))], &[&p]);
        assert!(plan.wakes.is_empty(), "no data on the machine: {plan:?}");
        let p = pool_after(ended("DeletedByHand"));
        let plan = run(std::slice::from_ref(&running), &[&p]);
        assert!(plan.wakes.is_empty(), "released by hand: {plan:?}");
    }

    #[test]
    fn a_running_pod_holds_the_machine_its_volume_is_on() {
        let p = pool("workers", "builtin", &FOUR, &[("mini-3", "ready")]);
        let pods = [
            pod("db-0", Some("mini-3"), with_claim("data-db-0")),
            pod("web", Some("mini-3"), json!({})),
        ];
        let plan = run(&pods, &[&p]);
        assert_eq!(
            plan.holding.get("mini-3").cloned().unwrap_or_default(),
            [LocalVolume {
                pod: "apps/db-0".into(),
                claim: "data-db-0".into(),
                volume: Some("pvc-1".into())
            }]
        );
        assert_eq!(plan.holding.len(), 1, "only the machine with the data: {:?}", plan.holding);
    }

    #[test]
    fn the_autoscaler_template_matches_the_providers() {
        let p = pool("workers", "cluster-autoscaler", &FOUR, &[]);
        let state = representative(&p).unwrap();
        let template = Template::for_autoscaler(&state.slot, "workers");
        let node =
            crate::provider::template::template_node("workers", state, jiff::Timestamp::now());
        let meta = node.metadata.unwrap();
        let mut provider_labels = meta.labels.clone();
        // cluster-autoscaler names the template node and sets its hostname label itself.
        provider_labels.insert("kubernetes.io/hostname".into(), meta.name.clone().unwrap());
        assert_eq!(template.labels, provider_labels);
        assert_eq!(Some(template.name), meta.name);
    }

    #[test]
    fn a_wakes_reason_names_what_only_that_machine_offers() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "train", "namespace": "ml" },
            "spec": { "containers": [{
                "name": "job",
                "resources": { "limits": { "nvidia.com/gpu": "2", "cpu": "1" } },
            }] },
        }))
        .unwrap();
        let devices = devices_asked(&pod);
        assert_eq!(devices, ["nvidia.com/gpu: 2"]);
        assert_eq!(
            reason("ml/train", &["gpu-1"], &[], &devices),
            "pod ml/train is pending and only slot gpu-1 can run it: its node selector, affinity \
             and the nvidia.com/gpu: 2 it asks for admit no other machine"
        );
        assert_eq!(
            reason("ml/web", &["a", "b"], &[], &[]),
            "pod ml/web is pending and only slots a, b can run it: its node selector and \
             affinity admit no other machine"
        );
    }
}
