//! Demand and intent (docs/decisions.md, D8). `demand` is a pod-work count, not a node count:
//! the ratio is applied only in `target`. `intent` is `demand > 0`, so there is one definition
//! of "is there work" and the two cannot drift.
//!
//! A workload's replicas and its pods are not counted twice (a Deployment's replicas plus its
//! pods): owner references link them. The observation carries, per workload, the pods of it the
//! pass saw, and a workload adds only its replicas that have no pod yet. A Deployment of N
//! replicas with N pods counts N.

use super::pool_view::PoolView;

/// The pod work that needs this pool: pending pods, pods on its machines (and on machines being
/// released), and workload replicas that have no pod yet. Never negative.
pub fn demand(o: &PoolView) -> i32 {
    let held: i32 = o.machines.iter().map(|m| m.held.max(0)).fold(0, i32::saturating_add);
    let missing: i32 = o.workloads.iter().map(|w| w.missing()).fold(0, i32::saturating_add);
    o.pending_pods
        .max(0)
        .saturating_add(o.draining_pods.max(0))
        .saturating_add(held)
        .saturating_add(missing)
}

/// Whether any work needs the pool.
pub fn intent(o: &PoolView) -> bool {
    demand(o) > 0
}

#[cfg(test)]
mod tests {
    use super::super::pool_view::{Machine, Workload};
    use super::*;

    fn machine(slot: &str, held: i32) -> Machine {
        Machine {
            slot: slot.into(),
            node: slot.into(),
            provider_id: format!("homelab://{slot}"),
            ready: true,
            held,
            claimed_at: None,
            pinned: false,
        }
    }

    fn workload(desired: i32, observed: i32) -> Workload {
        Workload { name: "Deployment default/web".into(), desired, observed }
    }

    /// Every fixture: its name, the observation, the demand it must report, and whether there is
    /// work by a reading independent of `demand` (any pod, held pod or podless replica).
    fn fixtures() -> Vec<(&'static str, PoolView, i32, bool)> {
        vec![
            ("an empty pool", PoolView::default(), 0, false),
            ("one pending pod", PoolView { pending_pods: 1, ..Default::default() }, 1, true),
            (
                "idle machines are no work",
                PoolView { machines: vec![machine("a", 0), machine("b", 0)], ..Default::default() },
                0,
                false,
            ),
            (
                "pods on the machines are work",
                PoolView { machines: vec![machine("a", 2), machine("b", 1)], ..Default::default() },
                3,
                true,
            ),
            (
                "pods on a machine being released are work",
                PoolView { draining_pods: 2, ..Default::default() },
                2,
                true,
            ),
            (
                "a Deployment of 2 whose 2 pods are pending counts 2, not 4 (not counted twice)",
                PoolView { pending_pods: 2, workloads: vec![workload(2, 2)], ..Default::default() },
                2,
                true,
            ),
            (
                "a Deployment of 3 with one pod so far counts its podless replicas",
                PoolView { pending_pods: 1, workloads: vec![workload(3, 1)], ..Default::default() },
                3,
                true,
            ),
            (
                "a Deployment whose pods all run elsewhere adds nothing",
                PoolView { workloads: vec![workload(2, 2)], ..Default::default() },
                0,
                false,
            ),
            (
                "a rollout's surge (more pods than replicas) never counts negative",
                PoolView { pending_pods: 1, workloads: vec![workload(2, 3)], ..Default::default() },
                1,
                true,
            ),
            (
                "a Deployment scaled to zero",
                PoolView { workloads: vec![workload(0, 0)], ..Default::default() },
                0,
                false,
            ),
            (
                "everything at once",
                PoolView {
                    pending_pods: 4,
                    draining_pods: 1,
                    workloads: vec![workload(5, 2)],
                    machines: vec![machine("a", 8), machine("b", 0)],
                    free_slots: 1,
                },
                16,
                true,
            ),
        ]
    }

    #[test]
    fn demand_counts_pod_work_without_the_deployment_double_count() {
        for (name, o, want, _) in fixtures() {
            assert_eq!(demand(&o), want, "{name}");
        }
    }

    #[test]
    fn intent_is_demand_above_zero_and_agrees_on_every_fixture() {
        for (name, o, want, work) in fixtures() {
            assert_eq!(intent(&o), demand(&o) > 0, "{name}");
            assert_eq!(intent(&o), work, "{name}: intent disagrees with the independent reading");
            assert_eq!(want > 0, work, "{name}: the fixture itself is inconsistent");
        }
    }

    #[test]
    fn nonsense_counts_read_as_zero_never_negative() {
        let o = PoolView {
            pending_pods: -3,
            draining_pods: -1,
            machines: vec![machine("a", -2)],
            workloads: vec![workload(-1, 0)],
            free_slots: 0,
        };
        assert_eq!(demand(&o), 0);
        assert!(!intent(&o));
    }
}
